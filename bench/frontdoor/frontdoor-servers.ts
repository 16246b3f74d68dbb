// The processes of the front-door benchmark that are not cellquota itself. Run as
// `node --import tsx bench/frontdoor/frontdoor-servers.ts upstream PORT` (a keep-alive node:http app
// answering 200 with a small JSON body) or `... bare-proxy PORT UPSTREAM_URL` (fastify +
// @fastify/http-proxy configured like `cellquota gateway`, without the limiter: the ceiling the
// gateway is compared with).
import { createServer } from 'node:http';
import Fastify from 'fastify';
import httpProxy from '@fastify/http-proxy';

const [role, portText, upstream] = process.argv.slice(2);
const port = Number(portText);
const body = JSON.stringify({ ok: true, service: 'bench-upstream' });

if (role === 'upstream') {
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body);
  });
  server.keepAliveTimeout = 60_000;
  server.listen(port, '127.0.0.1', () => console.log(`upstream on ${port}`));
} else if (role === 'bare-proxy' && upstream !== undefined) {
  const app = Fastify({ logger: false, requestTimeout: 0, keepAliveTimeout: 65_000 });
  await app.register(httpProxy, {
    upstream,
    prefix: '/',
    websocket: true,
    undici: {
      connections: 128,
      pipelining: 1,
      keepAliveTimeout: 30_000,
      headersTimeout: 30_000,
      bodyTimeout: 0,
      connect: { rejectUnauthorized: true },
    },
    replyOptions: {
      rewriteRequestHeaders: (request, headers) => ({
        ...headers,
        'x-forwarded-for': request.socket.remoteAddress ?? 'unknown',
      }),
    },
  });
  await app.listen({ host: '127.0.0.1', port });
  console.log(`bare proxy on ${port}`);
  // an orderly exit on a signal, so that `node --cpu-prof` writes its profile
  for (const signal of ['SIGINT', 'SIGTERM'] as const)
    process.once(signal, () => void app.close().then(() => process.exit(0)));
} else {
  console.error('usage: frontdoor-servers.ts upstream PORT | bare-proxy PORT UPSTREAM_URL');
  process.exit(2);
}
