// `cellquota gateway`: a reverse proxy in front of one upstream that decides every request like the
// agent's forward-auth, in process. It embeds a cell agent without RLS servers (`--workers 0`): the
// same rules, buckets, leases and throttling log; with --coordinators this replica is a cell of its
// own, so several replicas share one global allowance.
//
// The proxying is @fastify/http-proxy (@fastify/reply-from on undici, `ws` for WebSockets):
// request and response bodies stream both ways (never buffered), a keep-alive pool of
// --upstream-connections to the upstream, WebSocket upgrades decided like any request and then
// passed through. Every request, upgrades included, is decided in an onRequest hook before its body
// is read; a refusal is 429 with Retry-After and the RateLimit headers, an answer the upstream never
// sees. Allowed responses carry the RateLimit headers too.
//
// Per-client connection cap (--max-connections-per-client, the TCP peer grouped as in
// shared/client-address.ts; --connection-exempt CIDRs are not counted): a connection over the cap
// is answered `429` + `Retry-After: 1` + `Connection: close` and closed, before any request is read.
//
// Probes and metrics are on their own port (--health): /healthz answers for the gateway (its event
// loop and embedded agent), never by asking the app; /metrics is the agent's metrics plus
// cellquota_gateway_*.
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { Socket } from 'node:net';
import Fastify from 'fastify';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import httpProxy from '@fastify/http-proxy';
import { Counter, Gauge, Registry } from 'prom-client';
import { clientAddress, parseAddressList } from '../../shared/client-address.js';
import type { Logger } from '../../shared/logging.js';
import { componentLogger } from '../../shared/logging.js';
import { parseAgentConfig } from '../agent-config.js';
import type { AgentConfigInput } from '../agent-config.js';
import { startAgent } from '../agent-main.js';
import type { AgentHandle } from '../agent-main.js';
import { ThrottleCounts, ThrottleLog } from '../observe/throttle-log.js';
import { answerFor, forwardedRequest } from '../front-door/forward-auth.js';
import { DEFAULT_ROUTES, loadRoutes } from '../front-door/routes.js';
import type { Routes } from '../front-door/routes.js';
import type { GatewayConfig } from './gateway-config.js';

export interface GatewayHandle {
  /** http://host:port the gateway serves on. */
  readonly url: string;
  /** http://host:port of /healthz and /metrics. */
  readonly healthUrl: string;
  readonly cell: string;
  readonly agent: AgentHandle;
  stop(): Promise<void>;
}

const NO_PEERS = parseAddressList([]);
const RATE_LIMIT_HEADERS = 'cellquotaRateLimitHeaders';
type RequestWithHeaders = FastifyRequest & { [RATE_LIMIT_HEADERS]: readonly string[] | null };
const TOO_MANY_CONNECTIONS =
  'HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Type: text/plain\r\n' +
  'Content-Length: 21\r\nConnection: close\r\n\r\nToo many connections\n';

export async function startGateway(config: GatewayConfig, logger: Logger): Promise<GatewayHandle> {
  const log = componentLogger(logger, 'gateway');
  const routes: Routes = config.routes === undefined ? DEFAULT_ROUTES : await loadRoutes(config.routes);

  const agentInput: AgentConfigInput = {
    cell: config.cell,
    rules: config.rules,
    workers: 0,
    logLevel: config.logLevel,
    throttleLogIntervalMs: config.throttleLogIntervalMs,
    tableCapacity: config.tableCapacity,
    // The same overload policy as the agent's (decide/overload.ts): while the gateway's loop is
    // behind, each key passes at most its fail-open allowance and the rest gets a 429 at once — the
    // cheapest answer, which also spares the app behind a flood. (It had the guard off: with the
    // open policy, being late would only have skipped the limit.)
    lagThresholdMs: config.lagThresholdMs,
    overloadPolicy: config.overloadPolicy,
    overloadAllowance: config.overloadAllowance,
    ...(config.coordinators === undefined ? {} : { coordinators: config.coordinators }),
    ...(config.tenants === undefined ? {} : { tenants: config.tenants }),
    ...(config.unknownTenant === undefined ? {} : { unknownTenant: config.unknownTenant }),
    ...(config.staticShare === undefined ? {} : { staticShare: config.staticShare }),
  };
  const agent = await startAgent(parseAgentConfig(agentInput), logger);

  const registry = new Registry();
  const requests = new Counter({
    name: 'cellquota_gateway_requests_total',
    help:
      'requests decided by the gateway, by verdict (allowed, refused, ' +
      'unlimited: no route applied, invalid: refused as undecidable)',
    labelNames: ['verdict'],
    registers: [registry],
  });
  const upgrades = new Counter({
    name: 'cellquota_gateway_websocket_upgrades_total',
    help: 'WebSocket upgrade requests, by verdict',
    labelNames: ['verdict'],
    registers: [registry],
  });
  const openConnections = new Gauge({
    name: 'cellquota_gateway_connections_open',
    help: 'client connections open now',
    registers: [registry],
  });
  const capped = new Counter({
    name: 'cellquota_gateway_connections_refused_total',
    help: 'client connections closed at once for exceeding --max-connections-per-client',
    registers: [registry],
  });
  const upstreamErrors = new Counter({
    name: 'cellquota_gateway_upstream_errors_total',
    help: 'requests the upstream could not answer (502/503/504 given)',
    registers: [registry],
  });

  // Children bound once: a labelled inc() would hash its labels on every request.
  const verdicts = {
    allowed: requests.labels('allowed'),
    refused: requests.labels('refused'),
    unlimited: requests.labels('unlimited'),
    invalid: requests.labels('invalid'),
  };
  const upgradeVerdicts = { allowed: upgrades.labels('allowed'), refused: upgrades.labels('refused') };
  const app: FastifyInstance = Fastify({
    logger: false,
    return503OnClosing: true,
    requestTimeout: 0,
    keepAliveTimeout: 65_000,
  });
  const keyOptions = { trusted: config.trustedProxies };
  // An allowed request's RateLimit headers, for its response (rewriteHeaders below): a property
  // every request has from its creation (decorateRequest), so that setting it keeps the object's
  // shape — a WeakMap keyed by the request cost an ephemeron entry per request for the GC to trace.
  app.decorateRequest(RATE_LIMIT_HEADERS, null);

  app.addHook('onRequest', (request: FastifyRequest, reply: FastifyReply, done) => {
    const fwd = forwardedRequest(
      request.headers,
      request.socket.remoteAddress,
      request.method,
      request.url,
      keyOptions,
    );
    const upgrade = request.headers.upgrade !== undefined;
    const req = routes.requestFor(fwd);
    if (req.descriptors.length === 0) {
      verdicts.unlimited.inc();
      done();
      return;
    }
    const out = agent.check.check(req);
    if (out.kind === 'error') {
      verdicts.invalid.inc();
      void reply.code(429).header('Retry-After', '1').type('text/plain').send('Too Many Requests\n');
      return;
    }
    const answer = answerFor(out, 429);
    (answer.allowed ? verdicts.allowed : verdicts.refused).inc();
    if (upgrade) (answer.allowed ? upgradeVerdicts.allowed : upgradeVerdicts.refused).inc();
    if (answer.allowed) {
      // reply-from sets the upstream's headers itself; ours are added in rewriteHeaders below.
      if (answer.headers.length > 0) (request as RequestWithHeaders)[RATE_LIMIT_HEADERS] = answer.headers;
      done();
      return;
    }
    for (let i = 0; i < answer.headers.length; i += 2)
      void reply.header(answer.headers[i] as string, answer.headers[i + 1]);
    void reply.code(429).type('text/plain').send('Too Many Requests\n');
  });

  const base = config.upstream;
  await app.register(httpProxy, {
    upstream: base.origin,
    prefix: '/',
    rewritePrefix: base.pathname === '/' ? '' : base.pathname.replace(/\/$/, ''),
    websocket: true,
    // reply-from sets its own `tls.rejectUnauthorized: false`; undici reads `connect`: verification on.
    undici: {
      connections: config.upstreamConnections,
      pipelining: 1,
      keepAliveTimeout: 30_000,
      headersTimeout: config.upstreamTimeoutMs,
      bodyTimeout: 0,
      connect: { rejectUnauthorized: true },
    },
    replyOptions: {
      // `headers` is reply-from's own copy of this request's headers (`{ ...req.headers }`, made per
      // request): set in place, not spread into another object (a second copy per request).
      rewriteRequestHeaders: (request, headers) => {
        headers['x-forwarded-host'] = typeof headers.host === 'string' ? headers.host : '';
        headers['x-forwarded-for'] = appendForwardedFor(headers['x-forwarded-for'], request.socket.remoteAddress);
        headers['x-forwarded-proto'] = 'http';
        return headers;
      },
      rewriteHeaders: (headers, request) => {
        const ours = request === undefined ? null : (request as RequestWithHeaders)[RATE_LIMIT_HEADERS];
        if (ours === null) return headers;
        // The upstream's header object is this response's own (reply-from builds it per response):
        // ours are set on it in place, replacing any the upstream sent under the same names.
        for (let i = 0; i < ours.length; i += 2) headers[(ours[i] as string).toLowerCase()] = ours[i + 1];
        return headers;
      },
      onError: (reply, { error }) => {
        upstreamErrors.inc();
        log.warn({ err: error, url: reply.request.url }, 'upstream error');
        const code = (error as { statusCode?: number }).statusCode;
        void reply
          .code(code === 503 || code === 504 ? code : 502)
          .type('text/plain')
          .send('Bad Gateway\n');
      },
    },
  });

  // ---- per-client connection cap -----------------------------------------------------------------
  const perClient = new Map<string, number>();
  const capCounts = new ThrottleCounts();
  const capLog = new ThrottleLog(componentLogger(logger, 'connection-cap'), config.cell, config.throttleLogIntervalMs);
  capLog.start(capCounts);
  const onConnection = (socket: Socket): void => {
    openConnections.inc();
    socket.once('close', () => openConnections.dec());
    const peer = socket.remoteAddress;
    if (config.maxConnectionsPerClient === 0 || (peer !== undefined && config.connectionExempt.has(peer))) return;
    const key = clientAddress({ peer, trusted: NO_PEERS });
    const n = (perClient.get(key) ?? 0) + 1;
    if (n > config.maxConnectionsPerClient) {
      capped.inc();
      capCounts.add(`connections|${key}`, 1);
      socket.end(TOO_MANY_CONNECTIONS);
      socket.destroySoon();
      return;
    }
    perClient.set(key, n);
    socket.once('close', () => {
      const left = (perClient.get(key) ?? 1) - 1;
      if (left <= 0) perClient.delete(key);
      else perClient.set(key, left);
    });
  };
  // Before fastify's own listener, so a connection over the cap never reaches the HTTP parser.
  app.server.prependListener('connection', onConnection);

  // Warm the decision path and restart the overload count from here: the proxy's own start-up work
  // above must not make the first requests look late.
  await app.ready();
  agent.warmUp();
  await app.listen({ host: config.listen.host, port: config.listen.port });
  const url = urlOf(app.server, config.listen.host);

  // ---- probes and metrics -------------------------------------------------------------------------
  const health: Server = createServer((req, res) => {
    if (req.url === '/healthz' || req.url === '/readyz') {
      const ok = agent.healthy() && app.server.listening;
      res
        .writeHead(ok ? 200 : 503, { 'content-type': 'application/json' })
        .end(JSON.stringify({ status: ok ? 'ok' : 'unavailable', cell: config.cell, upstream: base.href }));
      return;
    }
    if (req.url === '/metrics') {
      void Promise.all([agent.metricsText(), registry.metrics()]).then(
        ([a, g]) => {
          res.writeHead(200, { 'content-type': registry.contentType }).end(`${a}\n${g}`);
        },
        (error: unknown) => {
          log.error({ err: error }, 'metrics failed');
          res.writeHead(500).end();
        },
      );
      return;
    }
    res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: /healthz, /metrics\n');
  });
  try {
    await new Promise<void>((resolve, reject) => {
      health.once('error', reject);
      health.listen(config.health.port, config.health.host, () => resolve());
    });
  } catch (error) {
    await app.close();
    capLog.stop(capCounts);
    await agent.stop();
    throw error;
  }
  const healthUrl = urlOf(health, config.health.host);
  log.info(
    {
      url,
      health: healthUrl,
      upstream: base.href,
      cell: config.cell,
      routes: config.routes ?? '(default: remote_address in domain edge)',
      trustedProxies: config.trustedProxies.entries,
      maxConnectionsPerClient: config.maxConnectionsPerClient,
    },
    'gateway started',
  );

  let stopping: Promise<void> | null = null;
  return {
    url,
    healthUrl,
    cell: config.cell,
    agent,
    stop: () => {
      stopping ??= (async () => {
        health.close();
        health.closeAllConnections();
        const closing = app.close();
        app.server.closeIdleConnections();
        await closing;
        capLog.stop(capCounts);
        await agent.stop();
        log.info({ cell: config.cell }, 'gateway stopped');
      })();
      return stopping;
    },
  };
}

/** X-Forwarded-For with the peer appended, as every proxy in the chain does. */
function appendForwardedFor(existing: string | string[] | undefined, peer: string | undefined): string {
  const prior = Array.isArray(existing) ? existing.join(', ') : existing;
  const me = peer ?? 'unknown';
  return prior === undefined || prior.trim() === '' ? me : `${prior}, ${me}`;
}

function urlOf(server: Server, host: string): string {
  const address = server.address();
  const port = typeof address === 'object' && address !== null ? address.port : 0;
  return `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
}
