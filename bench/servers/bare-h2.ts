// A bare node:http2 server speaking gRPC's framing and nothing else (the benchmark's servers
// 'bare-h2' and 'bare-h2-2w'): every POST is answered with the same pre-encoded length-prefixed OK
// message and grpc-status 0 trailers once the request has ended; the request is never decoded. The
// floor of what any server on node:http2 can do, the reference for the agent's lean server.
//
// One server runs on the host process's main thread. With `options.workers` > 1 each server runs in
// a worker thread of its own (bare-h2-worker.ts), worker i > 0 on `<socket>.<i>` or TCP port + i,
// as the agent's serving workers do (bench/servers/agent.ts): how far a second thread can take any
// node:http2 server on this machine, the reference for agent-2w ÷ agent.
import http2 from 'node:http2';
import { once } from 'node:events';
import type { Worker } from 'node:worker_threads';
import { moduleWorker } from '../../shared/module-worker.js';
import type { RunningServer, ServerOptions } from '../../testkit/processes/server-module.js';

/** RateLimitResponse{overall_code: OK, statuses: [{code: OK}]} as one gRPC message. */
const FRAMED_OK = Buffer.from([0, 0, 0, 0, 6, 0x08, 0x01, 0x12, 0x02, 0x08, 0x01]);
const HEADERS = { ':status': 200, 'content-type': 'application/grpc' };
const TRAILERS = { 'grpc-status': '0' };
const OPTIONS = { waitForTrailers: true, sendDate: false };

/** Serves the constant answer on `target` (a Unix socket path or host:port) until closed. */
export async function serveBare(target: string): Promise<http2.Http2Server> {
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
  return server;
}

/** Worker i's address: the target itself for i = 0, then `<socket>.<i>` or TCP port + i. */
export function workerTarget(target: string, i: number): string {
  if (i === 0) return target;
  if (target.startsWith('/')) return `${target}.${i}`;
  const at = target.lastIndexOf(':');
  return `${target.slice(0, at)}:${Number(target.slice(at + 1)) + i}`;
}

const DESCRIPTION =
  'gRPC framing only, a pre-encoded {overall_code: OK, statuses: [{code: OK}]} after END_STREAM, request never decoded';

export async function start(target: string, options?: ServerOptions): Promise<RunningServer> {
  const workers = options?.workers ?? 1;
  if (!Number.isInteger(workers) || workers < 1)
    throw new Error(`bare-h2: workers must be a positive integer, got ${workers}`);
  if (workers === 1) {
    const server = await serveBare(target);
    return {
      stop: () => new Promise<void>((resolve) => server.close(() => resolve())),
      description: `bare node:http2 on the main thread: ${DESCRIPTION}`,
    };
  }
  const endpoints = Array.from({ length: workers }, (_, i) => workerTarget(target, i));
  const threads: Worker[] = [];
  const stop = async (): Promise<void> => {
    await Promise.all(threads.map((w) => w.terminate()));
  };
  try {
    for (const endpoint of endpoints) {
      const w = moduleWorker(import.meta.url, './bare-h2-worker', { workerData: { target: endpoint } });
      threads.push(w);
      const [msg] = (await once(w, 'message')) as [unknown]; // rejects on the worker's 'error'
      if (msg !== 'ready') throw new Error(`bare-h2 worker on ${endpoint}: unexpected first message ${String(msg)}`);
    }
  } catch (err) {
    await stop();
    throw err;
  }
  return {
    stop,
    endpoints,
    description: `bare node:http2 in ${workers} worker threads, one per socket (${endpoints.join(', ')}): ${DESCRIPTION}`,
  };
}
