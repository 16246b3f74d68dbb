// `cellquota/express`: the embedded limiter as an express / connect middleware.
//
//   app.use('/v2', rateLimit({ rules: './rules.yaml', trustedProxies: ['10.0.0.0/8'] }))
//
// The middleware is returned at once; the limiter starts in the background (rules are read from a
// path asynchronously). Requests that arrive before it is ready wait for it; if it cannot start, they
// get the error through next(err). `await middleware.ready` to start serving only once it is up, and
// `await middleware.close()` on shutdown. It only uses Node's own request and response (no
// express-specific API), so it works with connect and plain `http` handlers too. One middleware is one
// limiter: mount the same middleware on several paths to share it, or pass `limiter` (from
// createLimiter) to several.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { pino } from 'pino';
import { HttpGate, limiterOf, refusalPayload } from './http-gate.js';
import type { GateOptions, LimitDecision, Limiter } from './http-gate.js';
import type { LimiterLogger } from './options.js';

export type { Descriptor, HeaderMode, LimitDecision, Limiter, PolicyStatus } from './http-gate.js';

export type CellquotaExpressOptions<
  Req extends IncomingMessage = IncomingMessage,
  Res extends ServerResponse = ServerResponse,
> = GateOptions<Req> & {
  /** Called for every refused request before the answer is sent (it may set headers on the response). */
  readonly onRefused?: (request: Req, response: Res, decision: LimitDecision | null) => void;
};

export interface RateLimitMiddleware<
  Req extends IncomingMessage = IncomingMessage,
  Res extends ServerResponse = ServerResponse,
> {
  (request: Req, response: Res, next: (error?: unknown) => void): void;
  /** Resolves with the limiter once it is ready; rejects if it cannot start. */
  readonly ready: Promise<Limiter>;
  /** Closes the limiter (unless it was passed in as `limiter`). */
  close(): Promise<void>;
}

/** The decision of a request the middleware checked (null: not checked, e.g. allow-listed). */
export function decisionOf(request: IncomingMessage): LimitDecision | null {
  return (request as Decided)[DECISION] ?? null;
}

// Kept on the request itself: a WeakMap entry per request costs a set and the collector's
// ephemeron work for every request; a symbol-keyed property gives every request object one shape.
const DECISION = Symbol('cellquota.decision');
type Decided = IncomingMessage & { [DECISION]?: LimitDecision };

export function rateLimit<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse>(
  options: CellquotaExpressOptions<Req, Res>,
): RateLimitMiddleware<Req, Res> {
  const logger: LimiterLogger = options.logger ?? pino({ name: 'cellquota', level: 'warn' });
  const own = !('limiter' in options);
  let gate: HttpGate<Req> | null = null;
  const ready: Promise<Limiter> = (async () => {
    const { limiter } = await limiterOf(options, logger);
    try {
      gate = new HttpGate<Req>(limiter, options, logger, 'express middleware', headersOf);
    } catch (error) {
      if (own) await limiter.close();
      throw error;
    }
    return limiter;
  })();
  // A start-up failure is reported to every request (next(err)) and through `ready`; never unhandled.
  ready.catch(() => undefined);
  const body = options.body;
  const onRefused = options.onRefused;

  const handle = (g: HttpGate<Req>, req: Req, res: Res, next: (error?: unknown) => void): void => {
    const r = g.decide(req, req.socket, res, setResponseHeader);
    if (r.decision !== null) (req as Decided)[DECISION] = r.decision;
    if (!r.refused) {
      next();
      return;
    }
    onRefused?.(req, res, r.decision);
    if (res.headersSent || res.writableEnded) return;
    const payload = refusalPayload(body, req, r.decision);
    const text = typeof payload === 'string' ? payload : JSON.stringify(payload);
    res.statusCode = g.statusCode;
    if (!res.hasHeader('content-type'))
      res.setHeader(
        'content-type',
        typeof payload === 'string' ? 'text/plain; charset=utf-8' : 'application/json; charset=utf-8',
      );
    res.setHeader('content-length', Buffer.byteLength(text));
    res.end(text);
  };

  const middleware = (req: Req, res: Res, next: (error?: unknown) => void): void => {
    if (gate !== null) {
      handle(gate, req, res, next);
      return;
    }
    ready.then(
      () => handle(gate as HttpGate<Req>, req, res, next),
      (error: unknown) => next(error),
    );
  };
  let closing: Promise<void> | null = null;
  return Object.assign(middleware, {
    ready,
    close: (): Promise<void> => {
      closing ??= own
        ? ready.then(
            (l) => l.close(),
            () => undefined,
          )
        : Promise.resolve();
      return closing;
    },
  });
}

function setResponseHeader(res: ServerResponse, name: string, value: string): void {
  res.setHeader(name, value);
}

function headersOf(request: IncomingMessage): IncomingMessage['headers'] {
  return request.headers;
}

export default rateLimit;
