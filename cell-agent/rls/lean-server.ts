// The lean RLS server: gRPC's wire format (grpc-wire.ts) spoken directly on node:http2, serving
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit and grpc.health.v1.Health (Check,
// List, Watch) on a Unix socket and/or a TCP address. Why not grpc-js: measured side by side
// (issue 21, `npm run bench -- agent`), a grpc-js handler that does nothing answers ~0.75 × what a
// bare node:http2 server speaking the same framing answers, with a higher tail; grpc-js's call
// objects, metadata, filters and interceptors are the ceiling of an agent whose decision takes a
// microsecond. Envoy, grpc-js and grpcio clients need only what is here.
//
// Per call (the HTTP/2 stream): POST, content-type application/grpc (else HTTP 415), a known
// :path (else UNIMPLEMENTED), `grpc-timeout` bounds the wait for the request (DEADLINE_EXCEEDED;
// a malformed one is INTERNAL), exactly one length-prefixed message of at most maxMessageBytes
// (RESOURCE_EXHAUSTED as soon as the prefix says more; the rest of the stream is reset, not
// read), uncompressed (a set compressed flag: UNIMPLEMENTED, and every status answer says
// `grpc-accept-encoding: identity`). An undecodable RateLimitRequest: INVALID_ARGUMENT
// ("malformed RateLimitRequest: ..."). The answer: HEADERS, one DATA frame, trailers with
// grpc-status 0; errors are "Trailers-Only" with grpc-status and the percent-encoded
// grpc-message. Bytes that are not HTTP/2 close that connection only.
//
// Stop: the listeners close, Watch streams end (UNAVAILABLE), every connection gets GOAWAY and
// its calls in flight finish; after the grace period the rest are destroyed.
import http2 from 'node:http2';
import { performance } from 'node:perf_hooks';
import type { IncomingHttpHeaders, Http2Server, ServerHttp2Session, ServerHttp2Stream } from 'node:http2';
import type { Logger } from '../../shared/logging.js';
import type { CheckService } from '../decide/check-service.js';
import {
  SERVING_STATUS,
  decodeHealthCheckRequest,
  decodeRateLimitRequestReused,
  encodeHealthCheckResponse,
  encodeHealthListResponse,
  encodeRateLimitResponse,
} from './rls-codec.js';
import {
  GRPC_CODE,
  UnaryCollector,
  encodeGrpcMessage,
  frameMessage,
  isGrpcContentType,
  parseGrpcTimeout,
} from './grpc-wire.js';
import {
  HEALTH_SERVICE_NAME,
  HealthState,
  RLS_METHOD_PATH,
  bindUnix,
  listeningHandle,
  removeIfOurs,
  tcpEndpoint,
} from './rls-common.js';
import type { BoundUnix, RlsListenOptions, RlsServerHandle } from './rls-common.js';

/**
 * Streams one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS). Envoy opens another
 * connection when a pool's connection is full.
 */
export const MAX_CONCURRENT_STREAMS = 1024;
/** node:http2's bound on a connection's buffered memory, MB (past it the peer gets ENHANCE_YOUR_CALM). */
const MAX_SESSION_MEMORY_MB = 32;

const HEALTH_CHECK_PATH = `/${HEALTH_SERVICE_NAME}/Check`;
const HEALTH_LIST_PATH = `/${HEALTH_SERVICE_NAME}/List`;
const HEALTH_WATCH_PATH = `/${HEALTH_SERVICE_NAME}/Watch`;

const { HTTP2_HEADER_STATUS, HTTP2_HEADER_CONTENT_TYPE, HTTP2_HEADER_METHOD, HTTP2_HEADER_PATH, NGHTTP2_NO_ERROR } =
  http2.constants;

// An answer's headers: no `grpc-accept-encoding` (the statuses below say it, the compressed
// message's UNIMPLEMENTED among them, where the gRPC compression spec asks for it). On every answer
// it was one more header through node:http2's mapToHeaders: ~0.3 µs of the serving thread's ~25 µs
// a request in CPU profiles beside bare-h2 (bench/README.md, issue 21), and no client needs it to
// send uncompressed messages, which is what they do unless configured otherwise.
const RESPONSE_HEADERS = Object.freeze({
  [HTTP2_HEADER_STATUS]: 200,
  [HTTP2_HEADER_CONTENT_TYPE]: 'application/grpc',
});
const OK_TRAILERS = Object.freeze({ 'grpc-status': '0' });
// No `date` header: gRPC does not use it, and it would be a string built per answer.
const WAIT_FOR_TRAILERS = Object.freeze({ waitForTrailers: true, sendDate: false });
const END_STREAM = Object.freeze({ endStream: true, sendDate: false });

/** What a unary method answers: the response message bytes, or a status. */
type UnaryAnswer = Buffer | { readonly code: number; readonly message: string };
type UnaryMethod = (request: Buffer) => UnaryAnswer;

/** Per-stream state, kept on the stream object itself: listeners are shared functions, not closures. */
interface CallState {
  readonly collector: UnaryCollector;
  readonly method: UnaryMethod | null;
  /** Set for Watch: called with the request bytes once they are complete. */
  readonly streaming: ((stream: ServerHttp2Stream, request: Buffer) => void) | null;
  /** performance.now() past which the request is DEADLINE_EXCEEDED (grpc-timeout); Infinity without one. */
  readonly deadline: number;
  timer: NodeJS.Timeout | null;
  done: boolean;
}

const CALL = Symbol('cellquota.rls.call');
type CallStream = ServerHttp2Stream & { [CALL]?: CallState };

function ignore(): void {
  // A stream reset by the peer, a write after the connection went away: nothing to do.
}

function sendOkTrailers(this: ServerHttp2Stream): void {
  if (!this.destroyed) this.sendTrailers(OK_TRAILERS);
}

/**
 * The answer message: HEADERS, one DATA frame (prefix included), trailers grpc-status 0. 'wantTrailers'
 * comes once per stream: on(), not once(), which would wrap the listener in a new closure per answer.
 */
function answerMessage(stream: ServerHttp2Stream, message: Buffer): void {
  if (stream.destroyed || stream.headersSent) return;
  stream.respond(RESPONSE_HEADERS, WAIT_FOR_TRAILERS);
  stream.on('wantTrailers', sendOkTrailers);
  stream.end(message);
}

/** A status without a message: "Trailers-Only" (one HEADERS frame, END_STREAM). */
function answerStatus(stream: ServerHttp2Stream, code: number, message: string): void {
  if (stream.destroyed || stream.headersSent) return;
  stream.respond(
    {
      [HTTP2_HEADER_STATUS]: 200,
      [HTTP2_HEADER_CONTENT_TYPE]: 'application/grpc',
      'grpc-accept-encoding': 'identity',
      'grpc-status': String(code),
      'grpc-message': encodeGrpcMessage(message),
    },
    END_STREAM,
  );
}

/** Resets (RST_STREAM NO_ERROR) the rest of a request that was answered before it was all read. */
function resetUnread(stream: ServerHttp2Stream): void {
  if (!stream.destroyed && !stream.readableEnded) stream.close(NGHTTP2_NO_ERROR);
}

/**
 * Answers early (before END_STREAM from the client) and stops reading: the rest of the request is reset.
 * The reset waits for the next turn of the event loop: called from a 'data' handler (inside node's
 * processing of received frames), Node 22's close() queues the RST_STREAM ahead of the answer's HEADERS,
 * and nghttp2 then drops the HEADERS of the closed stream: the client sees a reset without a grpc-status
 * (grpc-js: DEADLINE_EXCEEDED or INTERNAL; grpcio: INTERNAL). Outside that processing, close() first
 * flushes what is pending, so the HEADERS go out before the reset on Node 20 and 22 alike.
 */
function refuse(stream: CallStream, state: CallState, code: number, message: string): void {
  finishCall(state);
  answerStatus(stream, code, message);
  if (!stream.destroyed && !stream.readableEnded) setImmediate(resetUnread, stream);
}

function finishCall(state: CallState): void {
  state.done = true;
  if (state.timer !== null) {
    clearTimeout(state.timer);
    state.timer = null;
  }
}

function onData(this: CallStream, chunk: Buffer): void {
  const state = this[CALL];
  if (state === undefined || state.done) return;
  const error = state.collector.push(chunk);
  if (error !== null && error.kind === 'error') refuse(this, state, error.code, error.message);
}

function onEnd(this: CallStream): void {
  const state = this[CALL];
  if (state === undefined || state.done) return;
  finishCall(state);
  const body = state.collector.finish();
  if (body.kind === 'error') {
    answerStatus(this, body.code, body.message);
    return;
  }
  if (state.streaming !== null) {
    state.streaming(this, body.bytes);
    return;
  }
  const answer = (state.method as UnaryMethod)(body.bytes);
  if (Buffer.isBuffer(answer)) answerMessage(this, answer);
  else answerStatus(this, answer.code, answer.message);
}

/**
 * grpc-timeout without a timer per call: a stream with a deadline waits here until the end of the
 * current turn of the event loop (setImmediate, one for all of them), and only a stream whose request
 * has not ended by then gets a timer, for what is left of its deadline. Envoy sends grpc-timeout
 * with every check, and its request (HEADERS and the one DATA frame) arrives in one read: 'end' is
 * emitted on the next tick, before the immediate, so the common call arms and clears no timer.
 */
const awaitingRequest: CallStream[] = [];
let armQueued = false;

function waitForRequest(stream: CallStream): void {
  awaitingRequest.push(stream);
  if (!armQueued) {
    armQueued = true;
    setImmediate(armDeadlines);
  }
}

function armDeadlines(): void {
  armQueued = false;
  const now = performance.now();
  for (const stream of awaitingRequest) {
    const state = stream[CALL];
    if (state === undefined || state.done || stream.destroyed) continue;
    const left = state.deadline - now;
    if (left <= 0) onDeadline(stream);
    else state.timer = setTimeout(onDeadline, Math.ceil(left), stream);
  }
  awaitingRequest.length = 0;
}

function onDeadline(stream: CallStream): void {
  const state = stream[CALL];
  if (state === undefined || state.done) return;
  state.timer = null;
  refuse(stream, state, GRPC_CODE.DEADLINE_EXCEEDED, 'deadline exceeded before the request arrived');
}

/**
 * What the lean server asks of the check service: CheckService's calls it makes, and nothing else
 * (bench/servers/lean-transport.ts serves a constant answer through the same server).
 */
export type LeanCheckService = Pick<CheckService, 'shed' | 'checkInPlace' | 'rejected'>;

/** Starts the lean server on the configured addresses. Rejects if any address cannot be bound. */
export async function startLeanRlsServer(
  service: LeanCheckService,
  opts: RlsListenOptions,
  logger: Logger,
): Promise<RlsServerHandle> {
  const health = new HealthState();
  const sessions = new Set<ServerHttp2Session>();
  const watches = new Set<ServerHttp2Stream>();
  const servers: Http2Server[] = [];
  let stopping = false;

  // Decoded into the codec's reused objects and decided into the service's (checkInPlace): the answer
  // is encoded before anything else runs on this thread, and nothing of the request or the decision
  // is kept, so the common check allocates only its answer's bytes here.
  const shouldRateLimit: UnaryMethod = (request) => {
    const decoded = decodeRateLimitRequestReused(request);
    if (!decoded.ok) {
      service.rejected('malformed');
      return { code: GRPC_CODE.INVALID_ARGUMENT, message: decoded.error };
    }
    const out = service.checkInPlace(decoded.value);
    if (out.kind === 'error') return { code: out.code, message: out.message };
    return out.encoded ?? encodeRateLimitResponse(out.response, true);
  };

  const healthCheck: UnaryMethod = (request) => {
    const decoded = decodeHealthCheckRequest(request);
    if (!decoded.ok) return { code: GRPC_CODE.INVALID_ARGUMENT, message: decoded.error };
    const status = health.statusOf(decoded.value.service);
    if (status === null) return { code: GRPC_CODE.NOT_FOUND, message: `unknown service '${decoded.value.service}'` };
    return frameMessage(encodeHealthCheckResponse({ status }));
  };

  const healthList: UnaryMethod = () => frameMessage(encodeHealthListResponse(health.all()));

  const healthWatch = (stream: ServerHttp2Stream, request: Buffer): void => {
    const decoded = decodeHealthCheckRequest(request);
    if (!decoded.ok) {
      answerStatus(stream, GRPC_CODE.INVALID_ARGUMENT, decoded.error);
      return;
    }
    if (stream.destroyed) return;
    const serviceName = decoded.value.service;
    stream.respond(RESPONSE_HEADERS, WAIT_FOR_TRAILERS);
    const write = (status: number): void => {
      if (!stream.destroyed && stream.writable) stream.write(frameMessage(encodeHealthCheckResponse({ status })));
    };
    write(health.statusOf(serviceName) ?? SERVING_STATUS.SERVICE_UNKNOWN);
    const unwatch = health.watch({ service: serviceName, write });
    watches.add(stream);
    stream.once('close', () => {
      unwatch();
      watches.delete(stream);
    });
  };

  const onStream = (raw: ServerHttp2Stream, headers: IncomingHttpHeaders): void => {
    const stream = raw as CallStream;
    stream.on('error', ignore);
    if (headers[HTTP2_HEADER_METHOD] !== 'POST') {
      if (!stream.destroyed) stream.respond({ [HTTP2_HEADER_STATUS]: 405, allow: 'POST' }, END_STREAM);
      stream.resume();
      return;
    }
    const contentType = headers[HTTP2_HEADER_CONTENT_TYPE];
    if (!isGrpcContentType(typeof contentType === 'string' ? contentType : undefined)) {
      if (!stream.destroyed)
        stream.respond(
          {
            [HTTP2_HEADER_STATUS]: 415,
            'grpc-status': String(GRPC_CODE.UNKNOWN),
            'grpc-message': 'content-type must be application/grpc',
          },
          END_STREAM,
        );
      stream.resume();
      return;
    }
    const path = headers[HTTP2_HEADER_PATH];
    let method: UnaryMethod | null = null;
    let streaming: CallState['streaming'] = null;
    if (path === RLS_METHOD_PATH) method = shouldRateLimit;
    else if (path === HEALTH_CHECK_PATH) method = healthCheck;
    else if (path === HEALTH_LIST_PATH) method = healthList;
    else if (path === HEALTH_WATCH_PATH) streaming = healthWatch;
    else {
      answerStatus(stream, GRPC_CODE.UNIMPLEMENTED, `the server does not implement the method ${String(path)}`);
      stream.resume();
      return;
    }
    if (method === shouldRateLimit) {
      // Overloaded with no fail-open allowance: refused before anything is read or decoded (the
      // request's bytes are discarded as they arrive).
      const shed = service.shed();
      if (shed?.encoded !== undefined) {
        stream.resume();
        answerMessage(stream, shed.encoded);
        return;
      }
    }
    const timeoutHeader = headers['grpc-timeout'];
    const timeoutMs = parseGrpcTimeout(typeof timeoutHeader === 'string' ? timeoutHeader : undefined);
    if (timeoutMs !== null && Number.isNaN(timeoutMs)) {
      answerStatus(stream, GRPC_CODE.INTERNAL, `malformed grpc-timeout header '${String(timeoutHeader)}'`);
      stream.resume();
      return;
    }
    const state: CallState = {
      collector: new UnaryCollector(opts.maxMessageBytes),
      method,
      streaming,
      deadline: timeoutMs === null ? Number.POSITIVE_INFINITY : performance.now() + Math.max(1, Math.ceil(timeoutMs)),
      timer: null,
      done: false,
    };
    stream[CALL] = state;
    stream.on('data', onData);
    stream.on('end', onEnd);
    if (timeoutMs !== null) waitForRequest(stream);
  };

  const onSession = (session: ServerHttp2Session): void => {
    if (stopping) {
      session.destroy();
      return;
    }
    sessions.add(session);
    session.once('close', () => sessions.delete(session));
  };

  const makeServer = (): Http2Server => {
    const server = http2.createServer({
      settings: { maxConcurrentStreams: MAX_CONCURRENT_STREAMS },
      maxSessionMemory: MAX_SESSION_MEMORY_MB,
    });
    server.on('stream', onStream);
    server.on('session', onSession);
    server.on('sessionError', (error: Error) => logger.debug({ err: error }, 'rls connection closed on an error'));
    servers.push(server);
    return server;
  };

  const listen = (server: Http2Server, target: string | { host: string; port: number }): Promise<void> =>
    new Promise((resolveListen, reject) => {
      const onError = (error: Error): void => reject(error);
      server.once('error', onError);
      const done = (): void => {
        server.off('error', onError);
        resolveListen();
      };
      if (typeof target === 'string') server.listen(target, done);
      else server.listen(target.port, target.host, done);
    });

  let unixBound: BoundUnix | null = null;
  let tcpBound: string | null = null;
  try {
    if (opts.unix !== undefined) {
      const server = makeServer();
      unixBound = await bindUnix(opts.unix, (tmp) => listen(server, tmp));
    }
    if (opts.tcp !== undefined) {
      const server = makeServer();
      await listen(server, opts.tcp);
      const address = server.address();
      if (address === null || typeof address === 'string') throw new Error('the TCP listener has no address');
      tcpBound = tcpEndpoint(opts.tcp.host, address.port);
    }
  } catch (error) {
    for (const s of servers) s.close();
    if (unixBound !== null) await removeIfOurs(unixBound);
    throw error;
  }
  logger.debug({ unix: unixBound?.path ?? null, tcp: tcpBound }, 'rls server listening (lean node:http2)');
  return listeningHandle({ unix: unixBound?.path ?? null, tcp: tcpBound }, health, async (graceMs) => {
    stopping = true;
    for (const stream of watches) {
      if (stream.destroyed) continue;
      stream.once('wantTrailers', () => {
        if (!stream.destroyed)
          stream.sendTrailers({
            'grpc-status': String(GRPC_CODE.UNAVAILABLE),
            'grpc-message': 'the server is shutting down',
          });
      });
      stream.end();
    }
    const closed = Promise.all(servers.map((s) => new Promise<void>((done) => s.close(() => done()))));
    for (const session of sessions) if (!session.destroyed) session.close();
    const allGone = new Promise<void>((done) => {
      const poll = (): void => {
        if (sessions.size === 0) done();
        else setTimeout(poll, 10).unref();
      };
      poll();
    });
    let timer: NodeJS.Timeout | null = null;
    await Promise.race([
      allGone,
      new Promise<void>((done) => {
        timer = setTimeout(done, graceMs);
      }),
    ]);
    if (timer !== null) clearTimeout(timer);
    for (const session of sessions) session.destroy();
    await closed;
    if (unixBound !== null) await removeIfOurs(unixBound);
  });
}
