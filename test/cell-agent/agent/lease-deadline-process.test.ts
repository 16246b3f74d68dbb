// Issue 13, finding 1, through real processes: coordinators and an agent (a worker thread serving
// RLS over TCP). The agent's MAIN thread is frozen (test fixture blockable-agent.ts) while it holds
// a large leased grant: its lease client can neither renew nor run its expiry timer. Once the lease
// has ended the worker must decide on the floor at once — what the ledger still counts the cell at
// — so over the rest of the freeze it admits at most floorRate·W + floorBurst, and marks its answers
// degraded. Before the fix the worker kept the whole grant until the main thread woke up.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fork, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { CoordinatorCluster } from '../../../testkit/coordinator-cluster.js';
import { RlsClient, d } from '../../../testkit/rls-client.js';
import { freePort } from '../../../testkit/ports.js';
import { waitFor } from '../../../testkit/wait.js';

const fixture = resolve(import.meta.dirname, 'blockable-agent.ts');
const TTL_MS = 1_000;
// gold: 100/s burst 100, floor fraction 0.2 over 2 floor cells: the floor is 10/s, burst 10.
const FLOOR_RATE = 10;
const FLOOR_BURST = 10;

void test('an agent whose main thread is frozen decides on its floor once its lease ended (the worker reads the deadline)', async () => {
  const c = await CoordinatorCluster.create(
    ['n1', 'n2', 'n3'],
    ['--floor-cells', '2', '--lease-ttl-ms', String(TTL_MS)],
  );
  let agent: ChildProcess | null = null;
  let rls: RlsClient | null = null;
  let output = '';
  try {
    writeFileSync(join(c.root, 'rules.yaml'), 'domain: api\ndescriptors:\n  - key: tenant\n    global: true\n');
    c.startAll();
    await c.waitForLeader(60_000);
    assert.equal((await c.write('PUT', '/v1/tiers/gold', { rate: 100, burst: 100, floorFraction: 0.2 })).status, 200);
    assert.equal((await c.write('PUT', '/v1/tenants/acme', { tier: 'gold' })).status, 200);
    const [httpPort, rlsPort] = [await freePort(), await freePort()];
    const coordinators = ['n1', 'n2', 'n3'].map((id) => `127.0.0.1:${c.replica(id).peerPort}`).join(',');
    agent = fork(
      fixture,
      [
        '--cell',
        'cell-a',
        '--rules',
        join(c.root, 'rules.yaml'),
        '--http',
        `127.0.0.1:${httpPort}`,
        '--rls-listen',
        `127.0.0.1:${rlsPort}`,
        '--coordinators',
        coordinators,
        '--workers',
        '1',
        '--lag-threshold-ms',
        '0',
      ],
      { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'pipe', 'pipe', 'ipc'] },
    );
    const grab = (b: Buffer): void => {
      output = (output + b.toString()).slice(-20_000);
    };
    agent.stdout?.on('data', grab);
    agent.stderr?.on('data', grab);
    rls = new RlsClient(`127.0.0.1:${rlsPort}`);
    const client = rls;
    const check = async (): Promise<{ ok: boolean; degraded: boolean }> => {
      const r = await client.check({ domain: 'api', descriptors: [d(['tenant', 'acme'])] }, 2_000);
      const degraded = r.response_headers_to_add.some((h) => h.key === 'x-ratelimit-degraded' && h.value === 'true');
      return { ok: r.overall_code === 'OK', degraded };
    };

    // Demand well above the floor until the cell holds (nearly) the whole quota on a lease.
    const grant = async (): Promise<number> => {
      const t = await c.http(await c.waitForLeader(), 'GET', '/v1/tenants/acme');
      const s = ((t.body['slices'] ?? []) as { cellId: string; rate: number }[]).find((x) => x.cellId === 'cell-a');
      return s?.rate ?? 0;
    };
    await waitFor(
      'cell-a leased a grant of most of the quota',
      async () => {
        for (let i = 0; i < 20; i++) await check();
        return (await grant()) >= 80 && !(await check()).degraded;
      },
      { timeoutMs: 60_000, context: () => output },
    );

    // Freeze the main thread for long enough that the lease (≤ TTL after the freeze began) is over
    // with time to spare, and measure what the worker admits after that.
    const marker = join(c.root, 'blocked-at');
    agent.send({ block: TTL_MS + 4_000, marker });
    await waitFor(
      'the main thread to freeze',
      () => Promise.resolve(existsSync(marker) && readFileSync(marker, 'utf8') !== ''),
      { timeoutMs: 10_000, context: () => output },
    );
    const blockedAt = Number(readFileSync(marker, 'utf8'));
    await waitFor('the lease to have ended', () => Promise.resolve(Date.now() > blockedAt + TTL_MS + 100), {
      timeoutMs: 10_000,
      context: () => output,
    });
    const from = Date.now();
    let admitted = 0;
    let admittedLeased = 0;
    const until = blockedAt + TTL_MS + 2_600;
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        while (Date.now() < until) {
          const r = await check();
          if (r.ok) {
            admitted++;
            if (!r.degraded) admittedLeased++;
          }
        }
      }),
    );
    const windowS = (Date.now() - from) / 1000;
    const bound = FLOOR_RATE * windowS + FLOOR_BURST;
    assert.ok(
      admitted <= bound + 1,
      `admitted ${admitted} in ${windowS.toFixed(2)} s after the lease ended, over the floor's ${bound.toFixed(1)}`,
    );
    assert.equal(admittedLeased, 0, 'no answer after the lease ended was decided on the lease');
    assert.ok(admitted > 0, 'the floor still admits');

    // Once the main thread runs again the agent leases again.
    await waitFor('cell-a back on a lease', async () => !(await check()).degraded, {
      timeoutMs: 30_000,
      context: () => output,
    });
  } finally {
    rls?.close();
    agent?.kill('SIGKILL');
    await c.cleanup();
  }
});
