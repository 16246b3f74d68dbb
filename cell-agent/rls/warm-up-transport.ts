// The lean RLS server's half of the warm-up (decide/warm-up.ts): before a worker binds its real
// sockets, it serves the warm-up's scratch check service on a loopback port of its own for a moment
// and sends itself the warm-up requests over node:http2, so the server's stream handling, framing
// and Node's HTTP/2 internals are compiled too. Nothing of the real service is touched; the port is
// closed before the real listeners exist.
import http2 from 'node:http2';
import { performance } from 'node:perf_hooks';
import type { Logger } from '../../shared/logging.js';
import type { CheckService } from '../decide/check-service.js';
import type { RlsRequest } from '../messages/rls-messages.js';
import { encodeRateLimitRequest } from './rls-codec.js';
import { frameMessage } from './grpc-wire.js';
import { startLeanRlsServer } from './lean-server.js';
import { RLS_METHOD_PATH } from './rls-common.js';

const HEADERS = Object.freeze({
  ':method': 'POST',
  ':path': RLS_METHOD_PATH,
  'content-type': 'application/grpc',
  te: 'trailers',
});

/**
 * Sends `calls` RLS calls (`concurrency` at a time) through a lean server on 127.0.0.1:0; resolves when done (or
 * after budgetMs).
 */
export async function warmUpTransport(
  service: CheckService,
  requests: readonly RlsRequest[],
  logger: Logger,
  opts: { calls?: number; concurrency?: number; budgetMs?: number } = {},
): Promise<{ calls: number; ms: number }> {
  const started = performance.now();
  const calls = opts.calls ?? 800;
  const concurrency = opts.concurrency ?? 32;
  const budget = opts.budgetMs ?? 1500;
  if (requests.length === 0) return { calls: 0, ms: 0 };
  const bodies = requests.map((r) => frameMessage(encodeRateLimitRequest(r)));
  const server = await startLeanRlsServer(
    service,
    { tcp: { host: '127.0.0.1', port: 0 }, maxMessageBytes: 1 << 20 },
    logger,
  );
  const client = http2.connect(`http://${server.endpoints.tcp ?? ''}`);
  client.on('error', (error) => logger.debug({ err: error }, 'warm-up client error'));
  let sent = 0;
  let done = 0;
  try {
    await new Promise<void>((resolve) => {
      const finish = (): void => {
        done++;
        if (done >= sent && (sent >= calls || performance.now() - started > budget)) resolve();
        else if (sent < calls && performance.now() - started <= budget) send();
      };
      const send = (): void => {
        const body = bodies[sent % bodies.length] as Buffer;
        sent++;
        const stream = client.request(HEADERS);
        stream.on('error', () => undefined);
        stream.resume();
        stream.once('close', finish);
        stream.end(body);
      };
      for (let i = 0; i < Math.min(concurrency, calls); i++) send();
    });
  } finally {
    client.destroy();
    await server.stop(0);
  }
  return { calls: done, ms: performance.now() - started };
}
