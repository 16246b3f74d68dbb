// The lean RLS server's half of the warm-up (decide/warm-up.ts): before a worker binds its real
// sockets, it serves the warm-up's scratch check service on a socket of its own for a moment (a Unix
// socket beside the one it is to serve, whose folder it can write; else, or when that cannot be
// bound, 127.0.0.1:0: the kind of socket its checks will come on) and sends itself the warm-up
// requests as raw HTTP/2 frames (warm-up-client.ts: not node:http2's client, whose streams share
// node's code with the server's), so the server's stream handling, framing and Node's HTTP/2
// internals are compiled too. Nothing of the real service is touched; the socket is closed (and its
// file removed) before the real listeners exist.
import { basename, dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { threadId } from 'node:worker_threads';
import type { Logger } from '../../shared/logging.js';
import type { CheckService } from '../decide/check-service.js';
import type { RlsRequest } from '../messages/rls-messages.js';
import { encodeRateLimitRequest } from './rls-codec.js';
import { frameMessage } from './grpc-wire.js';
import { startLeanRlsServer } from './lean-server.js';
import { RLS_METHOD_PATH } from './rls-common.js';
import type { RlsServerHandle } from './rls-common.js';
import { sendWarmUpCalls } from './warm-up-client.js';

const WARM_UP_MAX_MESSAGE_BYTES = 1 << 20;

/** The warm-up's Unix socket beside `servedPath` (a dot-file of this process and thread). */
export function warmUpSocketBeside(servedPath: string): string {
  const path = resolve(servedPath);
  return join(
    dirname(path),
    `.cq-warm-up-${process.pid.toString(36)}-${threadId.toString(36)}-${basename(path).slice(0, 8)}`,
  );
}

async function startWarmUpServer(
  service: CheckService,
  unixBeside: string | null,
  logger: Logger,
): Promise<RlsServerHandle> {
  if (unixBeside !== null) {
    const path = warmUpSocketBeside(unixBeside);
    try {
      return await startLeanRlsServer(
        service,
        { unix: { path, mode: 0o600 }, maxMessageBytes: WARM_UP_MAX_MESSAGE_BYTES },
        logger,
      );
    } catch (error) {
      logger.debug({ err: error, path }, 'transport warm-up on 127.0.0.1: its Unix socket could not be bound');
    }
  }
  return startLeanRlsServer(
    service,
    { tcp: { host: '127.0.0.1', port: 0 }, maxMessageBytes: WARM_UP_MAX_MESSAGE_BYTES },
    logger,
  );
}

/**
 * Sends `calls` RLS calls (`concurrency` at a time) through a lean server on a Unix socket beside
 * `unixBeside` (the socket the worker is to serve) or on 127.0.0.1:0; resolves when done (or after
 * budgetMs). Never rejects on the calls' failure (logged at debug).
 */
export async function warmUpTransport(
  service: CheckService,
  requests: readonly RlsRequest[],
  logger: Logger,
  opts: { calls?: number; concurrency?: number; budgetMs?: number; unixBeside?: string } = {},
): Promise<{ calls: number; ms: number }> {
  const started = performance.now();
  const calls = opts.calls ?? 800;
  const concurrency = opts.concurrency ?? 32;
  const budget = opts.budgetMs ?? 1500;
  if (requests.length === 0) return { calls: 0, ms: 0 };
  const bodies = requests.map((r) => frameMessage(encodeRateLimitRequest(r)));
  const server = await startWarmUpServer(service, opts.unixBeside ?? null, logger);
  try {
    const { unix, tcp } = server.endpoints;
    const target = unix ?? { host: '127.0.0.1', port: Number(tcp?.slice(tcp.lastIndexOf(':') + 1)) };
    const out = await sendWarmUpCalls({ target, path: RLS_METHOD_PATH, bodies, calls, concurrency, budgetMs: budget });
    if (out.error !== null) logger.debug({ err: out.error, calls: out.calls }, 'transport warm-up stopped early');
    return { calls: out.calls, ms: performance.now() - started };
  } finally {
    await server.stop(0);
  }
}
