// A leader kill must not let a healthy cell's lease lapse: the real LeaseClient, under simulated time,
// against three coordinators of which the leader dies and a new one is elected some time later (the
// followers answer "no leader known" until then, and hint the new leader after). Whatever the election
// takes up to half the lease TTL and whatever the jitter, the client's next answer comes from the new
// leader before its lease runs out, and soon after the election.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import fc from 'fast-check';
import { pino } from 'pino';
import { LeaseClient } from '../../../cell-agent/lease/lease-client.js';
import type {
  LeaseCallResult,
  LeaseState,
  LeaseTimers,
  LeaseTransport,
} from '../../../cell-agent/lease/lease-client.js';
import type { ReportResponseMessage } from '../../../shared/lease-proto.js';

const TTL_MS = 3000;
const INTERVAL_MS = 500;
const KILL_AT = 2000;
const ADDRESSES = ['n1:7001', 'n2:7001', 'n3:7001'];

/** Timers on a simulated clock: `run` fires them in time order, letting the client's promises settle. */
class SimTimers implements LeaseTimers {
  now = 0;
  private seq = 0;
  private readonly pending = new Map<number, { at: number; fn: () => void }>();
  setTimeout(fn: () => void, ms: number): unknown {
    const id = ++this.seq;
    this.pending.set(id, { at: this.now + Math.max(0, ms), fn });
    return id;
  }
  clearTimeout(handle: unknown): void {
    this.pending.delete(handle as number);
  }
  async run(until: number): Promise<void> {
    for (;;) {
      await new Promise((r) => setImmediate(r));
      let next: [number, { at: number; fn: () => void }] | null = null;
      for (const e of this.pending)
        if (next === null || e[1].at < next[1].at || (e[1].at === next[1].at && e[0] < next[0])) next = e;
      if (next === null || next[1].at > until) break;
      this.pending.delete(next[0]);
      this.now = next[1].at;
      next[1].fn();
    }
    this.now = until;
  }
}

const answer = (leaderId: string): ReportResponseMessage => ({
  leaderId,
  leaseTtlMs: TTL_MS,
  grants: [],
  ledgerIndex: 1,
  unknownTenant: 'deny',
  unknownKeys: [],
  capsIncluded: false,
  capsVersion: 0,
  cappedDomains: [],
  full: true,
});

/** A follower's answer naming `leaderId` (and its address) as the leader. */
const notLeader = (leaderId: string): LeaseCallResult => ({
  err: {
    code: grpc.status.FAILED_PRECONDITION,
    details: 'not the leader',
    leaderId,
    leaderAddress: `${leaderId}:7001`,
  },
});

/** The real LeaseClient of cell-a on simulated time, reporting to the three ADDRESSES through `transport`. */
function simClient(
  timers: SimTimers,
  transport: LeaseTransport,
  random: () => number,
  onStateChange: (s: LeaseState) => void = () => undefined,
): LeaseClient {
  return new LeaseClient({
    cellId: 'cell-a',
    coordinators: ADDRESSES,
    coordinatorById: new Map(ADDRESSES.map((a) => [a.slice(0, 2), a])),
    logger: pino({ level: 'silent' }),
    velocity: () => [],
    onOverrides: () => undefined,
    onStateChange,
    intervalMs: INTERVAL_MS,
    transport,
    timers,
    monotonicMs: () => timers.now,
    wallMs: () => timers.now,
    random,
    newIncarnation: () => 'inc',
  });
}

interface Outcome {
  readonly expired: boolean;
  readonly firstAnswerFromNewLeaderAt: number | null;
}

async function killLeader(electionMs: number, random: () => number, callMs: number): Promise<Outcome> {
  const timers = new SimTimers();
  const electedAt = KILL_AT + electionMs;
  let firstAnswerFromNewLeaderAt: number | null = null;
  // n1 leads until it is killed; n2 is elected `electionMs` later; n3 follows.
  const transport: LeaseTransport = {
    report: async (address): Promise<LeaseCallResult> => {
      const t = timers.now;
      // Each call takes `callMs` of simulated time.
      await new Promise<void>((r) => timers.setTimeout(r, callMs));
      if (address === 'n1:7001')
        return t < KILL_AT
          ? { res: answer('n1') }
          : { err: { code: grpc.status.UNAVAILABLE, details: 'connection refused' } };
      if (t < electedAt)
        return t < KILL_AT
          ? notLeader('n1')
          : { err: { code: grpc.status.FAILED_PRECONDITION, details: 'no leader known' } };
      if (address === 'n2:7001') {
        firstAnswerFromNewLeaderAt ??= timers.now;
        return { res: answer('n2') };
      }
      return notLeader('n2');
    },
    close: () => undefined,
  };
  const states: LeaseState[] = [];
  const client = simClient(timers, transport, random, (s) => states.push(s));
  client.start();
  await timers.run(KILL_AT + 8000);
  client.stop();
  assert.equal(states[0], 'leased', 'the client held a lease before the kill');
  return { expired: states.includes('expired'), firstAnswerFromNewLeaderAt };
}

void test('a leader kill: the next answer comes from the new leader before the lease runs out', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.integer({ min: 100, max: TTL_MS / 2 }),
      fc.double({ min: 0, max: 0.999, noNaN: true }),
      fc.integer({ min: 1, max: 30 }),
      async (electionMs, r, callMs) => {
        const o = await killLeader(electionMs, () => r, callMs);
        assert.equal(o.expired, false, `election ${electionMs} ms: the lease ran out before the new leader answered`);
        assert.notEqual(o.firstAnswerFromNewLeaderAt, null);
        // Soon after the election: within a third of what was left of the lease, plus one round of calls.
        const after = (o.firstAnswerFromNewLeaderAt as number) - (KILL_AT + electionMs);
        assert.ok(
          after <= TTL_MS / 3 + 4 * (callMs + 50),
          `election ${electionMs} ms: the new leader's first answer came ${after} ms after it was elected`,
        );
      },
    ),
    { numRuns: 150, seed: 20261201 },
  );
});

void test('the no-identity hint is given for authentication failures only, not for a leader that reset the connection', async () => {
  const failures: grpc.status[] = [grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.UNAUTHENTICATED];
  const details = ['read ECONNRESET', 'Deadline exceeded after 0.400s', 'no identity for cell cell-a'];
  const lines: Record<string, unknown>[] = [];
  const { captureLogger } = await import('../../../testkit/logs.js');
  const captured = captureLogger('debug');
  const timers = new SimTimers();
  let call = 0;
  const transport: LeaseTransport = {
    report: (): Promise<LeaseCallResult> => {
      const i = call++ % failures.length;
      return Promise.resolve({ err: { code: failures[i] as grpc.status, details: details[i] as string } });
    },
    close: () => undefined,
  };
  const client = new LeaseClient({
    cellId: 'cell-a',
    coordinators: ['n1:7001'],
    logger: captured.logger,
    velocity: () => [],
    onOverrides: () => undefined,
    intervalMs: INTERVAL_MS,
    transport,
    timers,
    monotonicMs: () => timers.now,
    wallMs: () => timers.now,
    random: () => 0.5,
    newIncarnation: () => 'inc',
    failureHint: 'this agent presents no identity',
  });
  client.start();
  await timers.run(20_000);
  client.stop();
  lines.push(...captured.lines.filter((l) => l['msg'] === 'lease report failed'));
  const byDetails = (d: string): Record<string, unknown>[] => lines.filter((l) => l['error'] === d);
  assert.ok(byDetails('read ECONNRESET').length > 0 && byDetails('no identity for cell cell-a').length > 0);
  for (const l of byDetails('read ECONNRESET')) assert.equal(l['hint'], undefined, 'a reset connection: no hint');
  for (const l of byDetails('Deadline exceeded after 0.400s'))
    assert.equal(l['hint'], undefined, 'a deadline: no hint');
  for (const l of byDetails('no identity for cell cell-a')) assert.equal(l['hint'], 'this agent presents no identity');
});

void test('a leader whose answers take longer than the configured deadline: the deadline grows, the cell is leased and stays so', async () => {
  // The leader answers after `serviceMs` (its round commits late: a busy machine, a report bringing
  // thousands of new keys); a call whose deadline is shorter ends DEADLINE_EXCEEDED at its deadline,
  // as gRPC ends it. The followers answer at once, naming the leader. With a fixed deadline of 80 % of
  // the interval (400 ms) no answer of a leader slower than that ever arrived: the cell stayed on its
  // floors for good.
  await fc.assert(
    fc.asyncProperty(
      fc.integer({ min: 50, max: TTL_MS / 4 }),
      fc.double({ min: 0, max: 0.999, noNaN: true }),
      async (serviceMs, r) => {
        const timers = new SimTimers();
        const transport: LeaseTransport = {
          report: async (address, _req, deadlineMs): Promise<LeaseCallResult> => {
            if (address !== 'n1:7001') return notLeader('n1');
            const late = serviceMs > deadlineMs;
            await new Promise<void>((done) => timers.setTimeout(done, late ? deadlineMs : serviceMs));
            return late
              ? { err: { code: grpc.status.DEADLINE_EXCEEDED, details: `Deadline exceeded after ${deadlineMs} ms` } }
              : { res: answer('n1') };
          },
          close: () => undefined,
        };
        const states: [number, LeaseState][] = [];
        const client = simClient(
          timers,
          transport,
          () => r,
          (s) => states.push([timers.now, s]),
        );
        client.start();
        await timers.run(20_000);
        const status = client.status();
        client.stop();
        const leasedAt = states.find(([, s]) => s === 'leased')?.[0];
        assert.ok(leasedAt !== undefined && leasedAt <= 6_000, `answers taking ${serviceMs} ms: leased at ${leasedAt}`);
        assert.deepEqual(
          states.filter(([, s]) => s === 'expired'),
          [],
          `answers taking ${serviceMs} ms: the lease ran out once held`,
        );
        assert.equal(status.state, 'leased');
      },
    ),
    { numRuns: 100, seed: 20261202 },
  );
});

void test('a leader gone silent (its calls hang to their deadline): the grown deadline does not hold the cell on it', async () => {
  // n1 answers slowly at first (600 ms: the deadline grows for it), then goes silent at KILL_AT; the
  // followers keep naming n1 for `detectMs`, then know no leader until n2 is elected. Calls to n1 hang
  // until their deadline. Once the followers know no leader, n1 gets only the configured deadline, so
  // the first answer from n2 comes soon after its election, as with a leader that resets connections,
  // whether or not the cell's lease ran out meanwhile.
  await fc.assert(
    fc.asyncProperty(
      fc.integer({ min: 100, max: 1000 }),
      fc.integer({ min: 100, max: 4000 }),
      fc.double({ min: 0, max: 0.999, noNaN: true }),
      async (detectMs, electionAfterDetectMs, r) => {
        const timers = new SimTimers();
        const electedAt = KILL_AT + detectMs + electionAfterDetectMs;
        let firstFromNew = null as number | null;
        const wait = (ms: number): Promise<void> => new Promise<void>((done) => timers.setTimeout(done, ms));
        const late = async (deadlineMs: number): Promise<LeaseCallResult> => {
          await wait(deadlineMs);
          return { err: { code: grpc.status.DEADLINE_EXCEEDED, details: `Deadline exceeded after ${deadlineMs} ms` } };
        };
        const transport: LeaseTransport = {
          report: async (address, _req, deadlineMs): Promise<LeaseCallResult> => {
            const t = timers.now;
            if (address === 'n1:7001') {
              if (t >= KILL_AT || 600 > deadlineMs) return late(deadlineMs);
              await wait(600);
              return { res: answer('n1') };
            }
            await wait(5);
            if (t < KILL_AT + detectMs) return notLeader('n1');
            if (t < electedAt) return { err: { code: grpc.status.FAILED_PRECONDITION, details: 'no leader known' } };
            if (address === 'n2:7001') {
              await wait(25);
              firstFromNew ??= timers.now;
              return { res: answer('n2') };
            }
            return notLeader('n2');
          },
          close: () => undefined,
        };
        const client = simClient(timers, transport, () => r);
        client.start();
        await timers.run(electedAt + 10_000);
        client.stop();
        assert.notEqual(firstFromNew, null, 'the new leader answered');
        const after = (firstFromNew as number) - electedAt;
        // At most: a call to the silent leader at the configured deadline, a round over the followers,
        // and the longest backoff (4 intervals, once the lease ran out).
        assert.ok(
          after <= 4 * INTERVAL_MS + 400 + 4 * 55,
          `detect ${detectMs}: n2 first answered ${after} ms after its election`,
        );
      },
    ),
    { numRuns: 150, seed: 20261203 },
  );
});
