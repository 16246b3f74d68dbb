// How the agent names a coordinator: for the lease client's dialing and the agent's start-up log.

/** host:port as gRPC dials it (IPv6 hosts in brackets). */
export function coordinatorAddress(c: { readonly host: string; readonly port: number }): string {
  return `${c.host.includes(':') ? `[${c.host}]` : c.host}:${c.port}`;
}
