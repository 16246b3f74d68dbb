// The lean RLS server's half of the warm-up (decide/warm-up.ts): before a worker binds its real
// sockets, it serves the warm-up's scratch check service on a socket of its own for a moment (a Unix
// socket in a fresh temporary folder when the worker is to serve one, else 127.0.0.1:0: the kind of
// socket its checks will come on) and sends itself the warm-up requests as raw HTTP/2 frames
// (warm-up-client.ts: not node:http2's client, whose streams share node's code with the server's),
// so the server's stream handling, framing and Node's HTTP/2 internals are compiled too. Nothing of
// the real service is touched; the socket is closed before the real listeners exist.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { Logger } from '../../shared/logging.js';
import type { CheckService } from '../decide/check-service.js';
import type { RlsRequest } from '../messages/rls-messages.js';
import { encodeRateLimitRequest } from './rls-codec.js';
import { frameMessage } from './grpc-wire.js';
import { startLeanRlsServer } from './lean-server.js';
import { RLS_METHOD_PATH } from './rls-common.js';
import { sendWarmUpCalls } from './warm-up-client.js';

/**
 * Sends `calls` RLS calls (`concurrency` at a time) through a lean server on a socket of `transport`'s
 * kind; resolves when done (or after budgetMs). Never rejects on the calls' failure (logged at debug).
 */
export async function warmUpTransport(
  service: CheckService,
  requests: readonly RlsRequest[],
  logger: Logger,
  opts: { calls?: number; concurrency?: number; budgetMs?: number; transport?: 'unix' | 'tcp' } = {},
): Promise<{ calls: number; ms: number }> {
  const started = performance.now();
  const calls = opts.calls ?? 800;
  const concurrency = opts.concurrency ?? 32;
  const budget = opts.budgetMs ?? 1500;
  if (requests.length === 0) return { calls: 0, ms: 0 };
  const bodies = requests.map((r) => frameMessage(encodeRateLimitRequest(r)));
  const dir = opts.transport === 'unix' ? mkdtempSync(join(tmpdir(), 'cellquota-warm-up-')) : null;
  try {
    const server = await startLeanRlsServer(
      service,
      {
        ...(dir === null
          ? { tcp: { host: '127.0.0.1', port: 0 } }
          : { unix: { path: join(dir, 'rls.sock'), mode: 0o600 } }),
        maxMessageBytes: 1 << 20,
      },
      logger,
    );
    try {
      const { unix, tcp } = server.endpoints;
      const target = unix ?? { host: '127.0.0.1', port: Number(tcp?.slice(tcp.lastIndexOf(':') + 1)) };
      const out = await sendWarmUpCalls({
        target,
        path: RLS_METHOD_PATH,
        bodies,
        calls,
        concurrency,
        budgetMs: budget,
      });
      if (out.error !== null) logger.debug({ err: out.error, calls: out.calls }, 'transport warm-up stopped early');
      return { calls: out.calls, ms: performance.now() - started };
    } finally {
      await server.stop(0);
    }
  } finally {
    if (dir !== null) rmSync(dir, { recursive: true, force: true });
  }
}
