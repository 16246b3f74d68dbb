// A lease that ends by its deadline while nobody touches the key's bucket (issue 13): the time the
// cell then spends on its floor must refill the bucket at the FLOOR's rate, from the deadline on —
// whoever re-configures the bucket next (the main thread applying the expiry's floors, an answer
// whose lease was already over, a new lease's grant, or a worker's first check under the floor) and
// however late. Left to "now", the bucket refilled that time at the old grant's rate while the
// ledger counts the cell at its floor. Real LeaseClient, QuotaOverrides, BucketTable and Decider,
// wired the way agent-main.ts wires them, on a simulated clock with the lease client's timers run
// by hand (a stalled main thread is one whose timers run late).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import { Decider } from '../../../cell-agent/decide/decide.js';
import { CoordinatedQuotas } from '../../../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { LeaseClient } from '../../../cell-agent/lease/lease-client.js';
import type { LeaseCallResult } from '../../../cell-agent/lease/lease-client.js';
import { LeaseDeadline, deadlineWriter, monotonicMsOf } from '../../../cell-agent/lease/lease-deadline.js';
import { QuotaOverrides, applyLeaseEntries } from '../../../cell-agent/lease/quota-overrides.js';
import type { OverrideEntry } from '../../../cell-agent/lease/quota-overrides.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';
import type { GrantMessage, ReportRequestMessage, ReportResponseMessage } from '../../../shared/lease-proto.js';

const RULES = compileRules([
  parseRulesYaml('domain: api\ndescriptors:\n  - key: tenant\n    global: true\n', 'rules.yaml'),
]);
const TTL_MS = 1_000;
// The grant: 100/s, burst 100; its floor: 10/s, burst 20 (a 2 s window: far more than the gap).
const grant = (epoch: number): GrantMessage => ({
  key: 'tenant/acme',
  rate: 100,
  burst: 100,
  epoch,
  floorRate: 10,
  floorBurst: 20,
  version: 1,
  parent: '',
  deleted: false,
});
const answer = (grants: GrantMessage[]): ReportResponseMessage => ({
  leaderId: 'n1',
  leaseTtlMs: TTL_MS,
  grants,
  ledgerIndex: 1,
  unknownTenant: 'deny',
  unknownKeys: [],
  capsIncluded: false,
  capsVersion: 0,
  cappedDomains: [],
  full: true,
});

interface Call {
  readonly req: ReportRequestMessage;
  readonly resolve: (r: LeaseCallResult) => void;
}

/** `port: 'queued'`: the worker applies the entries only when deliver() is called (a worker reading its message port late, as agent-worker.ts applies them). */
function cell(opts: { port?: 'now' | 'queued' } = {}) {
  let nowMs = 0;
  const clock = (): bigint => BigInt(Math.round(nowMs * 1e6));
  const timers: { at: number; fn: () => void; cancelled: boolean }[] = [];
  const calls: Call[] = [];
  const deadline = LeaseDeadline.create();
  const table = new BucketTable({ capacity: 64, startNs: 0n });
  const thread = () => {
    const overrides = new QuotaOverrides(LeaseDeadline.attach(deadline.shared));
    const decider = new Decider(
      {
        table,
        quotas: new CoordinatedQuotas(overrides),
        clock,
        overrides,
        deadline: LeaseDeadline.attach(deadline.shared),
      },
      { bounds: DEFAULT_REQUEST_BOUNDS, responseHeaders: false, tableFull: 'closed', staticSlices: false },
    );
    decider.setRules(RULES);
    return { overrides, decider };
  };
  const main = thread();
  const worker = thread();
  const port: OverrideEntry[][] = [];
  const client = new LeaseClient({
    cellId: 'eu',
    coordinators: ['n1:7000'],
    logger: pino({ level: 'silent' }),
    velocity: () => [],
    // agent-main.ts: the main thread applies and re-configures, then the workers apply.
    onOverrides: (entries) => {
      const clamped = applyLeaseEntries(table, main.overrides, entries, clock());
      if (opts.port === 'queued') port.push(entries);
      else worker.overrides.apply(entries);
      return clamped;
    },
    intervalMs: 500,
    monotonicMs: monotonicMsOf(clock, 0n),
    deadline: deadlineWriter(deadline, 0n),
    transport: { report: (_a, req) => new Promise((resolve) => calls.push({ req, resolve })), close: () => undefined },
    timers: {
      setTimeout: (fn, ms) => {
        const t = { at: nowMs + ms, fn, cancelled: false };
        timers.push(t);
        return t;
      },
      clearTimeout: (h) => {
        (h as { cancelled: boolean }).cancelled = true;
      },
    },
    random: () => 0,
  });
  const flush = async (): Promise<void> => {
    for (let i = 0; i < 5; i++) await new Promise<void>((r) => setImmediate(r));
  };
  return {
    client,
    calls,
    worker,
    main,
    at: (ms: number): void => {
      nowMs = ms;
    },
    /** The worker reads its port: every queued message, in order, applied as agent-worker.ts does. */
    deliver(): void {
      for (const entries of port.splice(0)) applyLeaseEntries(table, worker.overrides, entries, clock());
    },
    /** The main thread runs the timers that are due (in order), late if it was stalled. */
    async runTimers(): Promise<void> {
      for (;;) {
        const due = timers.filter((t) => !t.cancelled && t.at <= nowMs).sort((a, b) => a.at - b.at)[0];
        if (due === undefined) break;
        due.cancelled = true;
        due.fn();
        await flush();
      }
    },
    async reply(call: Call, res: ReportResponseMessage): Promise<void> {
      call.resolve({ res });
      await flush();
    },
    /** Of n one-hit checks now on `on`'s thread, how many were admitted (hits 0: a check that only creates the bucket). */
    admit(on: { decider: Decider }, n: number, hits: number | null = null): number {
      let admitted = 0;
      for (let i = 0; i < n; i++) {
        const r = on.decider.decide({
          domain: 'api',
          descriptors: [{ entries: [{ key: 'tenant', value: 'acme' }], limit: null, hitsAddend: hits }],
          hitsAddend: 0,
        });
        if (!r.ok) throw new Error(r.failure.message);
        if (!r.decision.overLimit) admitted++;
      }
      return admitted;
    },
  };
}

/**
 * A cell leased at 0 ms until 1,000 ms (the acknowledging report at 10 ms gets no answer in time),
 * its bucket drained at 999 ms, then its main thread stalled: nothing runs and nothing checks the
 * key until 1,500 ms.
 */
async function drainedAtTheDeadline() {
  const c = cell();
  c.client.start();
  await c.runTimers();
  await c.reply(c.calls[0] as Call, answer([grant(1)]));
  assert.equal(c.client.status().state, 'leased');
  c.admit(c.main, 1, 0); // the bucket exists (empty) from 0 ms
  c.at(10);
  await c.runTimers(); // the acknowledgement's report, sent at 10 ms: its answer comes late
  assert.equal(c.calls.length, 2);
  c.at(999);
  assert.ok(c.admit(c.worker, 200) >= 99, 'the grant refilled ~100 tokens in 999 ms');
  assert.equal(c.admit(c.worker, 1), 0, 'drained');
  c.at(1_500);
  return c;
}

// What the cell may hold at 1,500 ms: the token the grant refilled in its last 1 ms (rounding: at most
// 1), then 500 ms on the floor at 10/s. Left to "now", the 500 ms refilled at 100/s: the floor's burst, 20.
const MOST_AT_1500 = 1 + 5 + 1;

void test('floor gap: the first check under the floor, 500 ms after the deadline, refills from the deadline at the floor rate', async () => {
  const c = await drainedAtTheDeadline();
  const admitted = c.admit(c.worker, 50);
  assert.ok(admitted <= MOST_AT_1500, `admitted ${admitted}, at most ${MOST_AT_1500}`);
  assert.ok(admitted >= 4, `admitted ${admitted}: the floor refilled since the deadline`);
});

void test("floor gap: the expiry applied late, then a new lease's grant, before any check", async () => {
  const c = await drainedAtTheDeadline();
  await c.runTimers(); // the stalled main thread catches up: the expiry's floors, the grants suspended
  assert.equal(c.client.status().state, 'expired');
  const report = c.client.reportOnce();
  const call = c.calls[c.calls.length - 1] as Call;
  assert.equal(call.req.wantFull, true, 'after the lapse it asks for every grant (a picture re-confirms them)');
  await c.reply(call, answer([grant(2)]));
  assert.equal(await report, true);
  assert.equal(c.client.status().state, 'leased');
  const admitted = c.admit(c.worker, 50);
  assert.ok(admitted <= MOST_AT_1500, `admitted ${admitted}, at most ${MOST_AT_1500}`);
});

void test('floor gap: a late answer whose lease is already over (its grants as floors), before the expiry and any check', async () => {
  const c = await drainedAtTheDeadline();
  // Sent at 10 ms with a 1,000 ms TTL: its lease ended at 1,010 ms; it arrives at 1,500 ms.
  await c.reply(c.calls[1] as Call, answer([grant(2)]));
  const admitted = c.admit(c.main, 50);
  assert.ok(admitted <= MOST_AT_1500, `admitted ${admitted}, at most ${MOST_AT_1500}`);
});

void test('floor gap: a worker that reads a grant of a lease already over (its port read late) leaves the drained bucket on the floor', async () => {
  const c = cell({ port: 'queued' });
  c.client.start();
  await c.runTimers();
  await c.reply(c.calls[0] as Call, answer([grant(1)]));
  c.deliver(); // the worker has the first grant
  c.admit(c.main, 1, 0); // the bucket exists (empty) from 0 ms
  c.at(10);
  await c.runTimers(); // the acknowledgement's report, sent at 10 ms
  assert.equal(c.calls.length, 2);
  // Its answer at 20 ms, a smaller grant: the main thread applies it; the worker's port has not
  // delivered it yet. The lease now ends at 1,010 ms.
  c.at(20);
  await c.reply(c.calls[1] as Call, answer([{ ...grant(2), rate: 90, burst: 90 }]));
  // Then the whole process stops until 3,500 ms (SIGSTOP): on SIGCONT the worker reads its sockets
  // first and decides on the floor (the deadline passed), draining the bucket.
  c.at(3_500);
  assert.ok(c.admit(c.worker, 50) >= 19, "the floor's burst");
  assert.equal(c.admit(c.worker, 1), 0, 'drained');
  // Then its port: the 90/s grant, of the lease that ended at 1,010 ms.
  c.at(3_501);
  c.deliver();
  // 200 ms later the cell may hold what the floor refilled since the drain: 2 tokens at 10/s, and
  // one of rounding. Put back under the grant, the bucket refilled 18 at 90/s.
  c.at(3_700);
  const admitted = c.admit(c.worker, 50);
  assert.ok(admitted <= 3, `admitted ${admitted} in the 200 ms after the drain, at most 3 (the floor's rate)`);
  assert.ok(admitted >= 1, `admitted ${admitted}: the floor refills`);
});
