// Free loopback ports for servers the tests, benchmarks and drills start themselves.
import type { ChildProcess } from 'node:child_process';
import { connect, createServer } from 'node:net';
import { waitFor } from './wait.js';

/** Ports handed out by this process (never twice). */
const handedOut = new Set<number>();

/**
 * A free port for a process that binds it later, taken BELOW Linux's ephemeral range (32768–60999):
 * a port found free in that range and released can be handed by the kernel to any other socket (a
 * server listening on port 0, an outgoing connection) before its owner binds it — the chaos drills
 * hit exactly that (a coordinator's EADDRINUSE).
 */
export async function freePort(): Promise<number> {
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = 20_000 + Math.floor(Math.random() * 12_000);
    if (handedOut.has(port)) continue;
    const free = await new Promise<boolean>((ok) => {
      const srv = createServer();
      srv.once('error', () => ok(false));
      srv.listen(port, '127.0.0.1', () => srv.close(() => ok(true)));
    });
    if (free) {
      handedOut.add(port);
      return port;
    }
  }
  throw new Error('no free port in 20000–31999 after 200 tries');
}

/** Waits until something accepts TCP connections on 127.0.0.1:`port`; gives up at once if `proc` exits. */
export async function waitListening(
  port: number,
  what: string,
  opts: { readonly proc?: ChildProcess; readonly timeoutMs?: number; readonly context?: () => string } = {},
): Promise<void> {
  const proc = opts.proc;
  await waitFor(
    `${what} listening on port ${port}`,
    () => {
      if (proc !== undefined && (proc.exitCode !== null || proc.signalCode !== null))
        throw new ProcessExited(`${what} exited (${proc.exitCode ?? proc.signalCode})`);
      return new Promise<boolean>((r) => {
        const s = connect(port, '127.0.0.1');
        s.once('connect', () => {
          s.destroy();
          r(true);
        });
        s.once('error', () => r(false));
      });
    },
    {
      timeoutMs: opts.timeoutMs ?? 15_000,
      fatal: (e) => e instanceof ProcessExited,
      ...(opts.context === undefined ? {} : { context: opts.context }),
    },
  );
}

class ProcessExited extends Error {}
