// The lean RLS server's half of the warm-up (decide/warm-up.ts): before a worker binds its real
// sockets, it serves the warm-up's scratch check service on a socket of its own for a moment (a Unix
// socket beside the one it is to serve, whose folder it can write; else, or when that cannot be
// bound, 127.0.0.1:0: the kind of socket its checks will come on) and sends itself the warm-up
// requests as raw HTTP/2 frames (shared/h2-raw.ts: not node:http2's client, whose streams share
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
import { RawH2Session, grpcRequestHeaderBlock, requestTemplate } from '../../shared/h2-raw.js';

const WARM_UP_MAX_MESSAGE_BYTES = 1 << 20;
/** The largest frame every HTTP/2 peer accepts: a request is one DATA frame, a longer one is left out. */
const MAX_FRAME_PAYLOAD = 16_384;

/** The warm-up's Unix socket beside `servedPath` (a dot-file of this process and thread). */
function warmUpSocketBeside(servedPath: string): string {
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
    const target = server.endpoints.unix ?? server.endpoints.tcp ?? '';
    const out = await sendWarmUpCalls({ target, bodies, calls, concurrency, budgetMs: budget });
    if (out.error !== null) logger.debug({ err: out.error, calls: out.calls }, 'transport warm-up stopped early');
    return { calls: out.calls, ms: performance.now() - started };
  } finally {
    await server.stop(0);
  }
}

export interface WarmUpCallsOptions {
  /** An absolute Unix socket path, or host:port. */
  readonly target: string;
  /** Length-prefixed RateLimitRequest messages, sent in turn. */
  readonly bodies: readonly Buffer[];
  readonly calls: number;
  readonly concurrency: number;
  readonly budgetMs: number;
}

/**
 * Sends ShouldRateLimit calls on one raw HTTP/2 connection, `concurrency` at a time, until `calls`
 * ended or the budget is spent; resolves with how many ended and the first error (never rejects).
 */
export function sendWarmUpCalls(opts: WarmUpCallsOptions): Promise<{ calls: number; error: Error | null }> {
  const started = performance.now();
  const headerBlock = grpcRequestHeaderBlock(RLS_METHOD_PATH, 'localhost');
  const templates = opts.bodies
    .filter((b) => b.length <= MAX_FRAME_PAYLOAD)
    .map((b) => requestTemplate(headerBlock, b));
  if (templates.length === 0)
    return Promise.resolve({ calls: 0, error: new Error('no warm-up request fits one frame') });
  return new Promise((resolve) => {
    let session: RawH2Session | null = null;
    let sent = 0;
    let done = 0;
    let finished = false;
    const end = (error: Error | null): void => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      session?.destroy('warm-up done');
      resolve({ calls: done, error });
    };
    // However the server behaves, the warm-up ends a second past its budget.
    const timer = setTimeout(() => end(new Error('the warm-up calls did not end in time')), opts.budgetMs + 1000);
    const next = (s: RawH2Session): void => {
      if (sent < opts.calls && performance.now() - started <= opts.budgetMs) {
        s.request(templates[sent % templates.length] as (typeof templates)[number], null);
        sent++;
      } else if (done >= sent) end(null);
    };
    const sink = {
      streamDone: (): void => {
        if (finished || session === null) return;
        done++;
        const closed = session.closedReason;
        if (closed !== null) end(new Error(closed));
        else next(session);
      },
    };
    RawH2Session.connect(opts.target, sink).then(
      (s) => {
        session = s;
        if (finished) {
          s.destroy('warm-up done');
          return;
        }
        for (let i = 0; i < opts.concurrency; i++) next(s);
      },
      (error: unknown) => end(error instanceof Error ? error : new Error(String(error))),
    );
  });
}
