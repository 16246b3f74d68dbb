// The processes of the front-door benchmark that are not cellquota itself. Run as
// `node --import tsx bench/frontdoor/frontdoor-servers.ts upstream PORT` (a keep-alive node:http app
// answering 200 with a small JSON body), `... bare-proxy PORT UPSTREAM_URL` (fastify +
// @fastify/http-proxy configured like `cellquota gateway`, without the limiter: the ceiling the
// gateway is compared with) or `... empty-auth SOCKET_PATH` (node:http on a Unix socket answering
// every request 200 with no body and no decision: the floor of a forward-auth service on node:http).
import { chmodSync } from 'node:fs';
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
} else if (role === 'empty-auth' && portText !== undefined) {
  const empty = ['content-length', '0'];
  const server = createServer((_req, res) => void res.writeHead(200, empty).end());
  server.keepAliveTimeout = 72_000; // as the agent's
  server.listen(portText, () => {
    chmodSync(portText, 0o666); // nginx's workers run as another user
    console.log(`empty auth on ${portText}`);
  });
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
      // in place, as the gateway does: `headers` is reply-from's own copy for this request
      rewriteRequestHeaders: (request, headers) => {
        headers['x-forwarded-for'] = request.socket.remoteAddress ?? 'unknown';
        return headers;
      },
    },
  });
  await app.listen({ host: '127.0.0.1', port });
  console.log(`bare proxy on ${port}`);
  // an orderly exit on a signal, so that `node --cpu-prof` writes its profile
  for (const signal of ['SIGINT', 'SIGTERM'] as const)
    process.once(signal, () => void app.close().then(() => process.exit(0)));
} else {
  console.error('usage: frontdoor-servers.ts upstream PORT | bare-proxy PORT UPSTREAM_URL | empty-auth SOCKET_PATH');
  process.exit(2);
}
