// Fail-open under induced overload: the serving thread's event loop is blocked (as by CPU starvation
// or a long GC pause) while checks queue up; once it runs again it answers them OK at once, marked
// `x-ratelimit-degraded: true` and counted, instead of deciding late. Then a crashed worker is
// restarted on its socket.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { parseAgentConfig } from '../../../cell-agent/agent-config.js';
import { startAgent } from '../../../cell-agent/agent-main.js';
import type { AgentHandle } from '../../../cell-agent/agent-main.js';
import { RlsClient, captureLogger, d, eventually, tempDir, unixTarget } from './agent-helpers.js';
import type { CapturedLogger, ResponseOut, TempDir } from './agent-helpers.js';

const RULES = `
domain: o
descriptors:
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
`;

let dir: TempDir;
let agent: AgentHandle;
let client: RlsClient;
let log: CapturedLogger;

before(async () => {
  dir = tempDir();
  log = captureLogger();
  agent = await startAgent(parseAgentConfig({
    cell: 'busy',
    rules: dir.file('rules.yaml', RULES),
    rlsSocket: join(dir.path, 'rls.sock'),
    workers: 1,
    tableCapacity: 1000,
    lagThresholdMs: 100,
  }), log.logger);
  client = new RlsClient(unixTarget(agent.endpoints.rlsUnix[0] ?? ''));
});

after(async () => {
  client.close();
  await agent.stop();
  dir.remove();
});

const degraded = (r: ResponseOut): boolean => r.response_headers_to_add.some((h) => h.key === 'x-ratelimit-degraded' && h.value === 'true');
const check = (): Promise<ResponseOut> => client.check({ domain: 'o', descriptors: [d(['blocked', 'x']), d(['other', 'y'])] }, 10_000);

void test('a blocked serving thread answers the queued checks fail-open, marked degraded, then decides again', async () => {
  // Normally the rule refuses everything (eventually: the lag guard may still be settling after start-up).
  await eventually(async () => ((await check()).overall_code === 'OVER_LIMIT' ? true : undefined));
  await agent.blockWorkerForTesting(0, 800); // the worker is now blocked; these checks wait in the socket
  const answers = await Promise.all(Array.from({ length: 6 }, () => check()));
  for (const r of answers) {
    assert.equal(r.overall_code, 'OK', 'fail-open');
    assert.equal(degraded(r), true, 'marked degraded');
    assert.equal(r.response_headers_to_add.some((h) => h.key === 'x-ratelimit-fail-open' && h.value === 'true'), true, 'marked fail-open: outside the bound');
    assert.deepEqual(r.statuses.map((s) => s.code), ['OK', 'OK'], 'one OK status per descriptor');
  }
  const text = await agent.metricsText();
  const failOpen = Number(/cellquota_agent_fail_open_total\{reason="overload"\} (\d+)/.exec(text)?.[1]);
  const degradedCount = Number(/cellquota_agent_decisions_total\{verdict="degraded",scope="local"\} (\d+)/.exec(text)?.[1]);
  assert.ok(failOpen >= 6, `fail_open overload ${failOpen}`);
  assert.ok(degradedCount >= 6, `degraded decisions ${degradedCount}`);
  // Caught up: decisions again (the hold is at most as long as the block).
  const normal = await eventually(async () => {
    const r = await check();
    return r.overall_code === 'OVER_LIMIT' ? r : undefined;
  }, 5000);
  assert.equal(degraded(normal), false);
  assert.equal(normal.response_headers_to_add.some((h) => h.key === 'x-ratelimit-fail-open'), false, 'a decision is not marked fail-open');
});

void test('a worker that dies is restarted on the same socket', async () => {
  agent.crashWorkerForTesting(0);
  await eventually(async () => (/cellquota_agent_worker_restarts_total 1/.test(await agent.metricsText()) ? true : undefined), 15_000);
  const r = await eventually(async () => {
    const res = await check();
    return res.overall_code === 'OVER_LIMIT' ? res : undefined;
  }, 15_000, 100);
  assert.equal(r.statuses[0]?.code, 'OVER_LIMIT');
  assert.ok(log.lines.some((l) => l['msg'] === 'rls worker exited unexpectedly; restarting it'), 'the crash is logged');
  assert.match(await agent.metricsText(), /cellquota_agent_workers_serving 1/);
});
