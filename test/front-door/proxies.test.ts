// Forward-auth through real proxies: nginx (auth_request) and Caddy (forward_auth) from Debian's
// packages, configured with deploy/examples/front-door's files, in front of a real upstream, each asking one agent's /v1/forward-auth. Every visitor
// connects from its own loopback address; the agent trusts only 127.0.0.1 (where the proxies connect
// from), so the visitor is the address the proxy appended to X-Forwarded-For.
import { after, before, describe, test } from 'node:test';
import { chmodSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { parseAgentConfig } from '../../cell-agent/agent-config.js';
import { startAgent } from '../../cell-agent/agent-main.js';
import type { AgentHandle } from '../../cell-agent/agent-main.js';
import {
  PER_MINUTE,
  caddyExample,
  missing,
  nginxExample,
  perVisitorLimits,
  startCaddy,
  startNginx,
  startUpstream,
  visitors,
} from './front-door-helpers.js';
import type { ProxyProcess, Upstream } from './front-door-helpers.js';
import { captureLogger } from '../../testkit/logs.js';
import { type TempDir, tempDir } from '../../testkit/temp-dir.js';
import { freePort } from '../../testkit/ports.js';

const RULES = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: ${PER_MINUTE}}
`;

let dir: TempDir;
let upstream: Upstream;
const agents: AgentHandle[] = [];

before(async () => {
  dir = tempDir('cq-frontdoor-');
  upstream = await startUpstream();
});

after(async () => {
  await Promise.all(agents.map((a) => a.stop()));
  await upstream.close();
  dir.remove();
});

/** An agent beside the proxy (HTTP only), trusting 127.0.0.1; returns its HTTP port. */
async function startEdgeAgent(denyStatus: 403 | 429, forwardAuthSocket?: string): Promise<number> {
  const agent = await startAgent(
    parseAgentConfig({
      cell: `edge-${agents.length}`,
      rules: dir.file('rules.yaml', RULES),
      workers: 0,
      http: '127.0.0.1:0',
      trustedProxies: '127.0.0.1',
      forwardAuthDenyStatus: denyStatus,
      lagThresholdMs: 0,
      tableCapacity: 10_000,
      // nginx's workers run as another user: the socket open to every local user, as loopback TCP is
      ...(forwardAuthSocket === undefined ? {} : { forwardAuthSocket, socketMode: '0666' }),
    }),
    captureLogger().logger,
  );
  agents.push(agent);
  return Number(new URL(agent.endpoints.http ?? '').port);
}

const visitor = visitors(10);

void describe('nginx auth_request → /v1/forward-auth', { skip: missing('nginx') }, () => {
  let nginx: ProxyProcess;
  before(async () => {
    const port = await freePort();
    // nginx's auth_request passes only 2xx, 401 and 403 on: the agent refuses with 403, nginx turns
    // that back into 429 with the agent's Retry-After.
    const agentPort = await startEdgeAgent(403);
    nginx = await startNginx(join(dir.path, 'nginx'), port, nginxExample(port, upstream.port, agentPort));
  });
  after(() => nginx.stop());

  void test('per-visitor limits, a spoofed X-Forwarded-For chain, 429 with Retry-After at the client', async () => {
    await perVisitorLimits(nginx.url, visitor);
  });
});

void describe('nginx auth_request → /v1/forward-auth over --forward-auth-socket', { skip: missing('nginx') }, () => {
  let nginx: ProxyProcess;
  before(async () => {
    // nginx's workers must reach the socket: its folder searchable by them
    const sockets = join(dir.path, 'sockets');
    mkdirSync(sockets, { mode: 0o755 });
    chmodSync(dir.path, 0o755);
    const socket = join(sockets, 'forward-auth.sock');
    await startEdgeAgent(403, socket);
    const port = await freePort();
    nginx = await startNginx(join(dir.path, 'nginx-unix'), port, nginxExample(port, upstream.port, { unix: socket }));
  });
  after(() => nginx.stop());

  void test('the same per-visitor limits: the socket peer counts as 127.0.0.1, X-Forwarded-For read', async () => {
    await perVisitorLimits(nginx.url, visitor);
  });
});

void describe('Caddy forward_auth → /v1/forward-auth', { skip: missing('caddy') }, () => {
  let caddy: ProxyProcess;
  before(async () => {
    const agentPort = await startEdgeAgent(429);
    const port = await freePort();
    caddy = await startCaddy(join(dir.path, 'caddy'), port, caddyExample(port, upstream.port, agentPort));
  });
  after(() => caddy.stop());

  void test('per-visitor limits, a spoofed X-Forwarded-For chain, 429 with Retry-After at the client', async () => {
    await perVisitorLimits(caddy.url, visitor);
  });
});
