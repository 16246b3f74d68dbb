// Unknown-tenant policies on running agents (the default-tier policy is in agent-grpc.test.ts), and
// tier and domain caps on static slices over gRPC.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { parseAgentConfig } from '../../../cell-agent/agent-config.js';
import { startAgent } from '../../../cell-agent/agent-main.js';
import type { AgentHandle } from '../../../cell-agent/agent-main.js';
import { RlsClient, d, unixTarget } from '../../../testkit/rls-client.js';
import { captureLogger } from '../../../testkit/logs.js';
import { waitFor } from '../../../testkit/wait.js';
import { type TempDir, tempDir } from '../../../testkit/temp-dir.js';

const RULES = `
domain: api
descriptors:
  - key: tenant
    global: true
`;
const TENANTS = `
tiers:
  gold: {rate: 100, burst: 100, cap: {rate: 60, burst: 60}}
tenants:
  acme: gold
  globex: gold
domainCap: {rate: 90, burst: 90}
`;

let dir: TempDir;
const agents: Record<'deny' | 'allow', { agent: AgentHandle; client: RlsClient }> = {} as never;

before(async () => {
  dir = tempDir();
  const rules = dir.file('rules.yaml', RULES);
  const tenants = dir.file('tenants.yaml', TENANTS);
  await Promise.all(
    (['deny', 'allow'] as const).map(async (policy) => {
      const agent = await startAgent(
        parseAgentConfig({
          cell: `cell-${policy}`,
          rules,
          tenants,
          unknownTenant: policy,
          staticShare: 0.5,
          rlsSocket: join(dir.path, `${policy}.sock`),
          tableCapacity: 1000,
          lagThresholdMs: 0,
        }),
        captureLogger().logger,
      );
      agents[policy] = { agent, client: new RlsClient(unixTarget(agent.endpoints.rlsUnix[0] ?? '')) };
    }),
  );
});

after(async () => {
  await Promise.all(
    Object.values(agents).map(async ({ agent, client }) => {
      client.close();
      await agent.stop();
    }),
  );
  dir.remove();
});

const tenantCheck = (
  client: RlsClient,
  tenant: string,
  hits: number,
): Promise<{ overall_code: string; statuses: { current_limit: { name: string } | null }[] }> =>
  client.check({ domain: 'api', hits_addend: hits, descriptors: [d(['tenant', tenant])] });

void test('deny: an unknown tenant is always over the limit', async () => {
  const { client } = agents.deny;
  const r = await tenantCheck(client, 'stranger', 1);
  assert.equal(r.overall_code, 'OVER_LIMIT');
  assert.equal(r.statuses[0]?.current_limit?.name, 'unknown-tenant');
});

void test('allow: an unknown tenant passes its tenant level but still counts against the domain cap', async () => {
  const { client } = agents.allow;
  // Domain cap 90 × 0.5 = 45 at this cell; wait for the empty-started bucket to fill.
  await waitFor('the domain cap to leave 45 to a stranger', async () => {
    const r = await client.check({
      domain: 'api',
      descriptors: [{ entries: [{ key: 'tenant', value: 'stranger' }], hits_addend: { value: 0 } }],
    });
    return r.statuses[0]?.current_limit?.name === 'domain-cap' &&
      (r as unknown as { statuses: { limit_remaining: number }[] }).statuses[0]?.limit_remaining === 45
      ? true
      : undefined;
  });
  assert.equal((await tenantCheck(client, 'stranger', 40)).overall_code, 'OK');
  const over = await tenantCheck(client, 'stranger', 40);
  assert.equal(over.overall_code, 'OVER_LIMIT');
  assert.equal(over.statuses[0]?.current_limit?.name, 'domain-cap');
});

void test("tier cap: the tenants of a tier share the cap's slice; a refusal consumes nothing elsewhere", async () => {
  const { client } = agents.deny;
  // gold: tenant 100 × 0.5 = 50 each, gold cap 60 × 0.5 = 30 (refilling at 30/s), domain cap 45.
  // Global buckets start empty when created: ask about both tenants until every level has refilled.
  await waitFor('acme and globex to hold 30 each', async () => {
    const r = await client.check({
      domain: 'api',
      descriptors: ['acme', 'globex'].map((t) => ({
        entries: [{ key: 'tenant', value: t }],
        hits_addend: { value: 0 },
      })),
    });
    return (r as unknown as { statuses: { limit_remaining: number }[] }).statuses.every((s) => s.limit_remaining === 30)
      ? true
      : undefined;
  });
  assert.equal((await tenantCheck(client, 'acme', 25)).overall_code, 'OK');
  const capped = await tenantCheck(client, 'globex', 25);
  assert.equal(capped.overall_code, 'OVER_LIMIT');
  assert.equal(capped.statuses[0]?.current_limit?.name, 'tier-cap:gold');
  // globex's own bucket was not touched by the refused request: 5 more fit under the cap.
  assert.equal((await tenantCheck(client, 'globex', 5)).overall_code, 'OK');
});
