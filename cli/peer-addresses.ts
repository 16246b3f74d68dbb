// Where a replica's other addresses (admin API, lease service) are, when the operator did not list
// them (--admin-peers, --lease-peers): the replica's peer host with this replica's own port. That
// guess is only an address of *that* replica when no other replica shares its host; replicas on one
// host (loopback, one machine) listen on different ports, and the guess would name this replica's
// own port there — a follower would redirect writes, or point agents, at itself. Such a replica's
// address is unknown instead (the caller answers "set --admin-peers" rather than a loop).
import { parseHostPort } from '../shared/cli-config.js';

export interface PeerAddressGuess {
  /** host:port of the replica's service, or null when it cannot be derived. */
  readonly addressOf: (id: string) => string | null;
  /** The replicas whose address cannot be derived because their host is shared (sorted). */
  readonly ambiguous: readonly string[];
}

/**
 * peers: every replica's peer address (id → host:port); self: this replica; port: this replica's
 * port for the service (null: it has none, so nothing can be derived).
 */
export function guessPeerAddresses(
  peers: ReadonlyMap<string, string>,
  self: string,
  port: number | null,
): PeerAddressGuess {
  const hostOf = new Map<string, string>();
  const replicasOnHost = new Map<string, number>();
  for (const [id, address] of peers) {
    const hp = parseHostPort(address);
    if (hp === null) continue;
    const host = hp.host.toLowerCase();
    hostOf.set(id, host);
    replicasOnHost.set(host, (replicasOnHost.get(host) ?? 0) + 1);
  }
  const ambiguous = [...hostOf]
    .filter(([id, host]) => id !== self && (replicasOnHost.get(host) ?? 0) > 1)
    .map(([id]) => id)
    .sort();
  const unknown = new Set(ambiguous);
  return {
    ambiguous,
    addressOf: (id) => {
      const host = hostOf.get(id);
      if (host === undefined || port === null || unknown.has(id)) return null;
      return `${host.includes(':') ? `[${host}]` : host}:${port}`;
    },
  };
}
