// Several gRPC worker threads, one socket each, ONE shared bucket table: clients hammering the same
// keys through both sockets at once never get more admitted in total than the bucket allows; the
// statistics and the throttling log are aggregated across the workers.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { parseAgentConfig } from '../../../cell-agent/agent-config.js';
import { startAgent } from '../../../cell-agent/agent-main.js';
import type { AgentHandle } from '../../../cell-agent/agent-main.js';
import { RlsClient, d, unixTarget } from '../../../testkit/rls-client.js';
import { type CapturedLogger, captureLogger } from '../../../testkit/logs.js';
import { waitFor } from '../../../testkit/wait.js';
import { type TempDir, tempDir } from '../../../testkit/temp-dir.js';

const RULES = `
domain: shared
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: heavy
    rate_limit: {unit: day, requests_per_unit: 1000}
`;

let dir: TempDir;
let agent: AgentHandle;
let clients: RlsClient[];
let log: CapturedLogger;

before(async () => {
  dir = tempDir();
  log = captureLogger();
  agent = await startAgent(
    parseAgentConfig({
      cell: 'multi',
      rules: dir.file('rules.yaml', RULES),
      rlsSocket: join(dir.path, 'rls.sock'),
      rlsListen: '127.0.0.1:0',
      workers: 2,
      tableCapacity: 10_000,
      lagThresholdMs: 0,
      throttleLogIntervalMs: 300,
    }),
    log.logger,
  );
  clients = agent.endpoints.rlsUnix.map((p) => new RlsClient(unixTarget(p)));
});

after(async () => {
  for (const c of clients) c.close();
  await agent.stop();
  dir.remove();
});

void test('one socket and one TCP port per worker: <socket>, <socket>.1', () => {
  const sock = join(dir.path, 'rls.sock');
  assert.deepEqual(agent.endpoints.rlsUnix, [sock, `${sock}.1`]);
  assert.equal(agent.endpoints.rlsTcp.length, 2);
  assert.notEqual(agent.endpoints.rlsTcp[0], agent.endpoints.rlsTcp[1]);
});

void test('two workers on two sockets never admit more than the bucket allows in total', async () => {
  const perClient = 80;
  const rounds = await Promise.all(
    clients.map(async (client) => {
      const results: string[] = [];
      // 8 concurrent streams per socket, so both workers decide at the same time.
      await Promise.all(
        Array.from({ length: 8 }, async () => {
          for (let i = 0; i < perClient / 8; i++)
            results.push((await client.check({ domain: 'shared', descriptors: [d(['k', 'hot'])] })).overall_code);
        }),
      );
      return results;
    }),
  );
  const admitted = rounds.flat().filter((c) => c === 'OK').length;
  assert.equal(admitted, 50, 'exactly the bucket: 50 per hour, no refill within the test');
  for (const r of rounds) assert.equal(r.length, perClient, 'every request answered');
  // With hits: 1000 per day shared, requests of 7 hits each from both sockets.
  const heavy = await Promise.all(
    clients.map((client) =>
      Promise.all(
        Array.from({ length: 100 }, () =>
          client
            .check({ domain: 'shared', hits_addend: 7, descriptors: [d(['heavy', 'x'])] })
            .then((r): number => (r.overall_code === 'OK' ? 7 : 0)),
        ),
      ),
    ),
  );
  const hits = heavy.flat().reduce((s, n) => s + n, 0);
  assert.ok(hits <= 1000 && hits > 1000 - 7, `admitted ${hits} hits: the most that fits in 1000`);
});

void test('statistics and the throttling log are aggregated across workers', async () => {
  const text = await agent.metricsText();
  const value = (re: RegExp): number => Number(re.exec(text)?.[1] ?? NaN);
  const ok = value(/cellquota_agent_decisions_total\{verdict="ok",scope="local"\} (\d+)/);
  const over = value(/cellquota_agent_decisions_total\{verdict="over_limit",scope="local"\} (\d+)/);
  assert.equal(ok + over, 160 + 200, 'every decision of both workers counted once');
  assert.match(text, /cellquota_agent_workers_serving 2/);
  // Both workers report every 300 ms; the main thread writes one line per key per interval, so the
  // 110 refusals (160 − 50) appear in as many lines as the intervals their reports spanned (one or
  // two on a quiet machine; on a loaded one the workers' reports may reach the main thread over more
  // intervals), never one per refusal: lines at most one per half interval of the time they span.
  const lines = await waitFor('the throttled log lines of shared|k=hot summing to 110 refusals', () => {
    const found = log.lines.filter((l) => l['msg'] === 'throttled' && l['key'] === 'shared|k=hot');
    return found.reduce((sum, l) => sum + Number(l['refused']), 0) === 110 ? found : undefined;
  });
  const span = Number(lines[lines.length - 1]?.['time']) - Number(lines[0]?.['time']);
  assert.ok(lines.length <= 1 + Math.floor(span / 150), `${lines.length} lines over ${span} ms`);
  assert.ok(lines.length < 110, 'aggregated, not one line per refusal');
  for (const l of lines) assert.equal(l['intervalMs'], 300);
  assert.equal(lines[0]?.['cell'], 'multi');
});
