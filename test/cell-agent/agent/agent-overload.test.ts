// Induced overload: the serving thread's event loop is blocked (as by CPU starvation or a long GC
// pause) while more checks queue up than it decides after such a block (the lag guard's backlog). Under the default policy (bounded) it answers them at once without
// deciding: each key admits at most its fail-open allowance (a local rule's rate, one second deep),
// marked fail-open, and the rest is refused with a constant answer; then it decides again. Under
// `--overload-policy open` (the old behaviour, kept for comparison) every queued check is answered OK.
// Then a crashed worker is restarted on its socket.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { parseAgentConfig } from '../../../cell-agent/agent-config.js';
import { startAgent } from '../../../cell-agent/agent-main.js';
import type { AgentHandle } from '../../../cell-agent/agent-main.js';
import { DEFAULT_OVERLOAD_BACKLOG } from '../../../cell-agent/observe/lag-guard.js';
import { RlsClient, d, unixTarget } from '../../../testkit/rls-client.js';
import type { ResponseOut } from '../../../testkit/rls-client.js';
import { type CapturedLogger, captureLogger } from '../../../testkit/logs.js';
import { waitFor } from '../../../testkit/wait.js';
import { type TempDir, tempDir } from '../../../testkit/temp-dir.js';

const RULES = `
domain: o
descriptors:
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: five
    rate_limit: {unit: second, requests_per_unit: 5}
`;

let dir: TempDir;
let agent: AgentHandle;
let openAgent: AgentHandle;
let client: RlsClient;
let openClient: RlsClient;
let log: CapturedLogger;

before(async () => {
  dir = tempDir();
  log = captureLogger();
  const rules = dir.file('rules.yaml', RULES);
  const common = { rules, workers: 1, tableCapacity: 1000, lagThresholdMs: 100 };
  agent = await startAgent(
    parseAgentConfig({ ...common, cell: 'busy', rlsSocket: join(dir.path, 'rls.sock') }),
    log.logger,
  );
  openAgent = await startAgent(
    parseAgentConfig({ ...common, cell: 'busy-open', rlsSocket: join(dir.path, 'open.sock'), overloadPolicy: 'open' }),
    captureLogger().logger,
  );
  client = new RlsClient(unixTarget(agent.endpoints.rlsUnix[0] ?? ''));
  openClient = new RlsClient(unixTarget(openAgent.endpoints.rlsUnix[0] ?? ''));
});

after(async () => {
  client.close();
  openClient.close();
  await Promise.all([agent.stop(), openAgent.stop()]);
  dir.remove();
});

/** Checks a behind thread still decides before it counts as overloaded. */
const BACKLOG = DEFAULT_OVERLOAD_BACKLOG;
const header = (r: ResponseOut, key: string): string | undefined =>
  r.response_headers_to_add.find((h) => h.key === key)?.value;
const blocked = (c: RlsClient): Promise<ResponseOut> =>
  c.check({ domain: 'o', descriptors: [d(['blocked', 'x']), d(['other', 'y'])] }, 10_000);
const five = (c: RlsClient): Promise<ResponseOut> => c.check({ domain: 'o', descriptors: [d(['five', 'k'])] }, 10_000);
const metric = (text: string, re: RegExp): number => Number(re.exec(text)?.[1] ?? 'NaN');

void test("bounded (default): the queued checks of a blocked thread get at most each key's allowance fail-open, the rest refused at once; then decisions again", async () => {
  await waitFor('the worker to decide', async () =>
    (await blocked(client)).overall_code === 'OVER_LIMIT' ? true : undefined,
  );
  await agent.blockWorkerForTesting(0, 800); // the worker is now blocked; these checks wait in the socket
  // A backlog first: a thread that is behind decides its first BACKLOG checks after the block (a
  // busy machine's stall is no overload), the overload path takes the rest of the turn.
  const backlog = Array.from({ length: BACKLOG + 10 }, () => blocked(client));
  const answers = await Promise.all([
    ...Array.from({ length: 20 }, () => five(client)),
    ...Array.from({ length: 4 }, () => blocked(client)),
  ]);
  for (const r of await Promise.all(backlog)) assert.equal(r.overall_code, 'OVER_LIMIT');
  const fives = answers.slice(0, 20);
  const failOpen = fives.filter((r) => r.overall_code === 'OK' && header(r, 'x-ratelimit-fail-open') === 'true');
  const decidedOk = fives.filter((r) => r.overall_code === 'OK' && header(r, 'x-ratelimit-fail-open') === undefined);
  const overloadRefused = answers.filter(
    (r) => r.overall_code === 'OVER_LIMIT' && header(r, 'x-ratelimit-refused-by') === 'overload',
  );
  assert.ok(
    failOpen.length >= 1 && failOpen.length <= 6,
    `fail-open answers for 'five' within its allowance (5/s, 5 deep): ${failOpen.length}`,
  );
  assert.ok(
    decidedOk.length <= 5,
    `anything decided after catching up came from the bucket the overload did not touch: ${decidedOk.length}`,
  );
  assert.ok(
    overloadRefused.length >= 20 - failOpen.length - decidedOk.length - 5,
    `the rest refused on the overload path: ${overloadRefused.length}`,
  );
  for (const r of answers.slice(20))
    assert.equal(r.overall_code, 'OVER_LIMIT', 'a rule of 0/s has no allowance: never waved through');
  for (const r of failOpen) assert.equal(header(r, 'x-ratelimit-degraded'), 'true');
  for (const r of overloadRefused) assert.equal(header(r, 'x-ratelimit-cell'), 'busy');
  // Metrics: per reason and quota, the overload time (the episode ends at the first on-time tick).
  const text = await waitFor(
    'the overload fail-open count and seconds in the metrics',
    async () => {
      const t = await agent.metricsText();
      return metric(t, /cellquota_agent_quota_fail_open_total\{reason="overload",quota="o\|five=k"\} (\d+)/) ===
        failOpen.length && metric(t, /^cellquota_agent_overload_seconds_total (\S+)$/m) > 0
        ? t
        : undefined;
    },
    { timeoutMs: 10_000, everyMs: 100 },
  );
  assert.equal(metric(text, /cellquota_agent_fail_open_total\{reason="overload"\} (\d+)/), failOpen.length);
  assert.ok(
    metric(text, /cellquota_agent_overload_refused_total\{reason="allowance"\} (\d+)/) >= overloadRefused.length,
  );
  assert.ok(metric(text, /cellquota_agent_overload_episodes_total (\d+)/) >= 1);
  // Caught up: decisions again.
  const normal = await waitFor(
    'decisions by the local rule again',
    async () => {
      const r = await blocked(client);
      return r.overall_code === 'OVER_LIMIT' && header(r, 'x-ratelimit-refused-by') === 'local-rule' ? r : undefined;
    },
    { timeoutMs: 5000 },
  );
  assert.equal(header(normal, 'x-ratelimit-fail-open'), undefined, 'a decision is not marked fail-open');
});

void test('open policy (the old behaviour): every queued check of a blocked thread is answered OK fail-open', async () => {
  await waitFor('the worker to decide', async () =>
    (await blocked(openClient)).overall_code === 'OVER_LIMIT' ? true : undefined,
  );
  await openAgent.blockWorkerForTesting(0, 800);
  const backlog = Array.from({ length: BACKLOG + 10 }, () => five(openClient));
  const answers = await Promise.all(Array.from({ length: 6 }, () => blocked(openClient)));
  await Promise.all(backlog);
  for (const r of answers) {
    assert.equal(r.overall_code, 'OK', 'fail-open');
    assert.equal(header(r, 'x-ratelimit-degraded'), 'true', 'marked degraded');
    assert.equal(header(r, 'x-ratelimit-fail-open'), 'true', 'marked fail-open: outside the bound');
    assert.deepEqual(
      r.statuses.map((s) => s.code),
      ['OK', 'OK'],
      'one OK status per descriptor',
    );
  }
  const text = await openAgent.metricsText();
  assert.ok(metric(text, /cellquota_agent_fail_open_total\{reason="overload"\} (\d+)/) >= 6);
  await waitFor(
    'decisions again',
    async () => ((await blocked(openClient)).overall_code === 'OVER_LIMIT' ? true : undefined),
    { timeoutMs: 5000 },
  );
});

void test('a worker that dies is restarted on the same socket', async () => {
  agent.crashWorkerForTesting(0);
  await waitFor(
    'one worker restart in the metrics',
    async () => (/cellquota_agent_worker_restarts_total 1/.test(await agent.metricsText()) ? true : undefined),
    { timeoutMs: 15_000 },
  );
  const r = await waitFor(
    'the restarted worker to decide',
    async () => {
      const res = await blocked(client);
      return res.overall_code === 'OVER_LIMIT' ? res : undefined;
    },
    { timeoutMs: 15_000, everyMs: 100 },
  );
  assert.equal(r.statuses[0]?.code, 'OVER_LIMIT');
  assert.ok(
    log.lines.some((l) => l['msg'] === 'rls worker exited unexpectedly; restarting it'),
    'the crash is logged',
  );
  assert.match(await agent.metricsText(), /cellquota_agent_workers_serving 1/);
});
