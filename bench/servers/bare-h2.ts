// A bare node:http2 server speaking gRPC's framing and nothing else (the benchmark's server
// 'bare-h2'): every POST is answered with the same pre-encoded length-prefixed OK message and
// grpc-status 0 trailers once the request has ended; the request is never decoded. The floor of
// what any server on node:http2 can do, the reference for the agent's lean server.
import http2 from 'node:http2';
import type { RunningServer, ServerOptions } from '../../testkit/processes/server-module.js';

/** RateLimitResponse{overall_code: OK, statuses: [{code: OK}]} as one gRPC message. */
const FRAMED_OK = Buffer.from([0, 0, 0, 0, 6, 0x08, 0x01, 0x12, 0x02, 0x08, 0x01]);
const HEADERS = { ':status': 200, 'content-type': 'application/grpc' };
const TRAILERS = { 'grpc-status': '0' };
const OPTIONS = { waitForTrailers: true, sendDate: false };

export async function start(target: string, _options?: ServerOptions): Promise<RunningServer> {
  const server = http2.createServer();
  server.on('stream', (stream) => {
    stream.on('error', () => undefined);
    stream.on('data', () => undefined);
    stream.on('end', () => {
      if (stream.destroyed) return;
      stream.respond(HEADERS, OPTIONS);
      stream.once('wantTrailers', () => stream.sendTrailers(TRAILERS));
      stream.end(FRAMED_OK);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    if (target.startsWith('/')) server.listen(target, resolve);
    else {
      const at = target.lastIndexOf(':');
      server.listen(Number(target.slice(at + 1)), target.slice(0, at), resolve);
    }
  });
  return {
    stop: () => new Promise<void>((resolve) => server.close(() => resolve())),
    description:
      'bare node:http2: gRPC framing only, a pre-encoded {overall_code: OK, statuses: [{code: OK}]} after END_STREAM, request never decoded',
  };
}
