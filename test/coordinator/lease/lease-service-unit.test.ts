// The lease service in-process, over a fake backend (a real Ledger applied at once) and a real gRPC
// server, with rounds driven by the test: lease expiry = receipt time + TTL, refused grants are
// retried without grants (leases still renewed), held reports fail with the leader hint when
// leadership is lost, expireLeases only when a lease surely expired.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { pino } from 'pino';
import { Ledger } from '../../../coordinator/ledger/ledger.js';
import type { LedgerResult } from '../../../coordinator/ledger/ledger.js';
import type { LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';
import { RELEASED_SLICES_FORMAT, TENANT_WIND_DOWN_FORMAT } from '../../../coordinator/ledger/ledger-commands.js';
import { LeaseService } from '../../../coordinator/lease/lease-service.js';
import type { LeaseBackend, LeaseServiceOptions } from '../../../coordinator/lease/lease-service.js';
import { createAllocatorPolicy } from '../../../coordinator/lease/incremental-policy.js';
import type { GrantPolicy } from '../../../coordinator/lease/grant-policy.js';
import { LEADER_ADDRESS_TRAILER, loadQuotaLeaseService } from '../../../shared/lease-proto.js';
import type { GrantMessage, ReportRequestMessage, ReportResponseMessage } from '../../../shared/lease-proto.js';

const svc = loadQuotaLeaseService();
const Client = grpc.makeGenericClientConstructor(svc.definition, 'QuotaLease');

class FakeBackend implements LeaseBackend {
  readonly id = 'n1';
  leader = true;
  currentTerm = 2;
  readonly ledgerInstance = new Ledger({ floorCells: 3, skewMarginMs: 1000, assertInvariants: true });
  readonly proposed: LedgerCommandInput[] = [];
  /** While set, proposals wait behind it, in log order (a commit that takes a while). */
  gate: Promise<void> | null = null;
  private index = 0;
  private tail: Promise<unknown> = Promise.resolve();
  term(): number {
    return this.currentTerm;
  }
  readBarrier(): Promise<void> {
    return Promise.resolve();
  }
  isLeader(): boolean {
    return this.leader;
  }
  leaderId(): string | null {
    return this.leader ? 'n1' : 'n2';
  }
  peerAddress(id: string): string | null {
    return id === 'n2' ? '127.0.0.1:7002' : null;
  }
  ledger(): Ledger {
    return this.ledgerInstance;
  }
  propose(cmd: LedgerCommandInput): Promise<LedgerResult> {
    this.proposed.push(cmd);
    const gate = this.gate;
    const applied = this.tail.then(() => gate).then(() => this.ledgerInstance.apply(cmd, ++this.index));
    this.tail = applied;
    return applied;
  }
}

async function setup(
  policy: GrantPolicy,
  now: () => number,
  options: Partial<LeaseServiceOptions> = {},
): Promise<{ backend: FakeBackend; service: LeaseService; address: string; stop: () => void }> {
  const backend = new FakeBackend();
  const service = new LeaseService({
    backend,
    logger: pino({ level: 'silent' }),
    roundMs: 1e9,
    expireEveryMs: 1e9,
    leaseTtlMs: 3000,
    policy,
    monoMs: now,
    wallMs: now,
    ...options,
  });
  const server = new grpc.Server();
  service.register(server);
  const port = await new Promise<number>((ok, fail) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e !== null ? fail(e) : ok(p))),
  );
  return {
    backend,
    service,
    address: `127.0.0.1:${port}`,
    stop: () => {
      service.stop();
      server.forceShutdown();
    },
  };
}

function report(
  address: string,
  req: Partial<ReportRequestMessage> & { cellId: string },
): Promise<{ res: ReportResponseMessage | null; err: grpc.ServiceError | null }> {
  const client = new Client(address, grpc.credentials.createInsecure());
  const full: ReportRequestMessage = {
    incarnation: 'i1',
    sentAtMs: 0,
    acks: [],
    velocity: [],
    capsVersion: 0,
    wantFull: false,
    ...req,
  };
  return new Promise((resolve) => {
    client.makeUnaryRequest(
      svc.report.path,
      svc.report.requestSerialize,
      svc.report.responseDeserialize,
      full,
      { deadline: Date.now() + 3000 },
      (err: grpc.ServiceError | null, res?: ReportResponseMessage) => {
        client.close();
        resolve({ res: res ?? null, err });
      },
    );
  });
}

async function arrived(service: LeaseService, n: number): Promise<void> {
  for (let i = 0; i < 200 && service.stats.reports < n; i++) await new Promise((r) => setTimeout(r, 10));
  assert.equal(service.stats.reports >= n, true, 'the report reached the service');
}

void test('lease service: lease expiry = receipt + TTL; refused grants retried without grants; leader loss fails held reports with the hint', async () => {
  let nowMs = 1_000_000;
  let greedy = false;
  const policy: GrantPolicy = (_ledger, demands, t) =>
    greedy
      ? [...demands.reported].map((cellId) => ({
          key: 'tenant/acme',
          cellId,
          rate: 1e6,
          burst: 1e6,
          epoch: 1,
          leaseExpiresAtMs: t + demands.leaseTtlMs,
        }))
      : [];
  const h = await setup(policy, () => nowMs);
  try {
    await h.backend.propose({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0.3 });
    await h.backend.propose({ type: 'putTenant', id: 'acme', tier: 'gold' });
    h.backend.proposed.length = 0;

    const first = report(h.address, { cellId: 'eu' });
    await arrived(h.service, 1);
    nowMs += 50; // the round runs 50 ms after the receipt
    await h.service.round();
    const r1 = await first;
    assert.equal(r1.err, null, 'answered after the round');
    assert.equal(r1.res?.leaseTtlMs, 3000);
    assert.equal(
      h.backend.ledgerInstance.getCell('eu')?.leaseExpiresAtMs,
      1_000_000 + 3000,
      'the lease runs from the receipt time',
    );
    assert.equal(h.backend.proposed[0]?.type, 'registerCell', 'registered first');

    // A policy whose grants break the bound: refused, retried without grants, the lease still renewed.
    greedy = true;
    const second = report(h.address, { cellId: 'eu' });
    await arrived(h.service, 2);
    await h.service.round();
    const r2 = await second;
    assert.equal(r2.err, null, 'answered although the grants were refused');
    assert.equal(h.service.stats.refusedRounds, 1);
    assert.equal(h.backend.ledgerInstance.getCell('eu')?.leaseExpiresAtMs, nowMs + 3000, 'renewed');
    assert.equal(h.backend.ledgerInstance.getSlice('tenant/acme', 'eu')?.epoch, 0, 'no grant applied');
    greedy = false;

    // No lease has surely expired: no expireLeases entry. Past expiry + skew: one.
    const before = h.backend.proposed.length;
    await h.service.expire();
    assert.equal(h.backend.proposed.length, before, 'nothing to expire');
    nowMs += 3000 + 1000;
    await h.service.expire();
    assert.equal(h.backend.proposed[h.backend.proposed.length - 1]?.type, 'expireLeases');
    assert.equal(h.backend.ledgerInstance.getCell('eu')?.leaseExpiresAtMs, null, 'released');

    // Leadership lost while a report is held: it fails with the hint.
    const third = report(h.address, { cellId: 'eu' });
    await arrived(h.service, 3);
    h.backend.leader = false;
    await h.service.round();
    const r3 = await third;
    assert.equal(r3.err?.code, grpc.status.FAILED_PRECONDITION);
    assert.equal(r3.err?.metadata.get(LEADER_ADDRESS_TRAILER)[0], '127.0.0.1:7002');
  } finally {
    h.stop();
  }
});

void test('lease service: delta reports keep demand between reports; a finished sweep drops what it did not restamp; a new incarnation starts from nothing', async () => {
  let nowMs = 1_000_000;
  let seen: Map<string, number> = new Map();
  const policy: GrantPolicy = (_ledger, demands) => {
    seen = new Map(
      [...demands.byKey].flatMap(([k, row]) =>
        [...row].filter(([c]) => c === 'eu').map(([, d]) => [k, d] as [string, number]),
      ),
    );
    return [];
  };
  const h = await setup(policy, () => nowMs);
  const v = (key: string, d: number): { key: string; allowedPerS: number; refusedPerS: number } => ({
    key,
    allowedPerS: d,
    refusedPerS: 0,
  });
  const send = async (req: Partial<ReportRequestMessage>, n: number): Promise<ReportResponseMessage | null> => {
    const p = report(h.address, { cellId: 'eu', ...req });
    await arrived(h.service, n);
    nowMs += 10;
    await h.service.round();
    const r = await p;
    assert.equal(r.err, null);
    return r.res;
  };
  try {
    await h.backend.propose({ type: 'putTier', name: 'gold', rate: 100, burst: 100 });
    // A sweep's first page (not done): the leader asks for a complete sweep of this session.
    let r = await send(
      { velocity: [v('tenant/a', 10), v('tenant/b', 20)], velocitySweep: 1, velocitySweepStart: true },
      1,
    );
    assert.equal(r?.velocityResync, true);
    r = await send({ velocity: [v('tenant/c', 30)], velocitySweep: 1, velocitySweepDone: true }, 2);
    assert.equal(r?.velocityResync, false, 'the session saw the whole sweep (from its first report)');
    assert.deepEqual(Object.fromEntries(seen), { 'tenant/a': 10, 'tenant/b': 20, 'tenant/c': 30 });
    // A delta report carrying only a move: the others keep their demand.
    await send({ velocity: [v('tenant/b', 25)], velocitySweep: 1 }, 3);
    assert.deepEqual(Object.fromEntries(seen), { 'tenant/a': 10, 'tenant/b': 25, 'tenant/c': 30 });
    // Sweep 2 restamps a and c only (b is no longer reported, its zero was lost): b is dropped.
    await send({ velocity: [v('tenant/a', 10)], velocitySweep: 2, velocitySweepStart: true }, 4);
    await send({ velocity: [v('tenant/c', 30)], velocitySweep: 2, velocitySweepDone: true }, 5);
    assert.deepEqual(Object.fromEntries(seen), { 'tenant/a': 10, 'tenant/c': 30 });
    // A new incarnation: the old one's demand is gone, only what it reports counts.
    r = await send(
      {
        incarnation: 'i2',
        velocity: [v('tenant/d', 5)],
        velocitySweep: 1,
        velocitySweepStart: true,
        velocitySweepDone: true,
      },
      6,
    );
    assert.deepEqual(Object.fromEntries(seen), { 'tenant/d': 5 });
    assert.equal(r?.velocityResync, false);
    // A new leader term: no demand held, and the first (late) sweep page it sees is not a whole sweep.
    h.backend.currentTerm++;
    r = await send({ incarnation: 'i2', velocity: [v('tenant/e', 5)], velocitySweep: 2, velocitySweepDone: true }, 7);
    assert.deepEqual(Object.fromEntries(seen), { 'tenant/e': 5 });
    assert.equal(r?.velocityResync, true, "the new leader saw only the sweep's last page: it asks for a whole one");
    r = await send(
      {
        incarnation: 'i2',
        velocity: [v('tenant/e', 5), v('tenant/d', 5)],
        velocitySweep: 3,
        velocitySweepStart: true,
        velocitySweepDone: true,
      },
      8,
    );
    assert.equal(r?.velocityResync, false, 'a one-page sweep seen whole');
  } finally {
    h.stop();
  }
});

void test('implicit tenants (tier:NAME) are bounded: beyond --max-implicit-tenants refused as under deny; idle ones wound down as a deletion, counted until their last slice is dropped', async () => {
  let nowMs = 1_000_000;
  const h = await setup(createAllocatorPolicy(), () => nowMs, { maxImplicitTenants: 2, implicitTenantIdleMs: 5000 });
  const ledger = h.backend.ledgerInstance;
  const demand = (key: string, perS: number): { key: string; allowedPerS: number; refusedPerS: number } => ({
    key,
    allowedPerS: 0,
    refusedPerS: perS,
  });
  const acked = new Map<string, number>();
  /** One report of cell a (acknowledging every grant it got) and the round after it; returns the answer. */
  const cycle = async (velocity: ReturnType<typeof demand>[]): Promise<ReportResponseMessage> => {
    const n = h.service.stats.reports;
    const pending = report(h.address, {
      cellId: 'a',
      velocity,
      acks: [...acked].map(([key, epoch]) => ({ key, epoch })),
    });
    await arrived(h.service, n + 1);
    nowMs += 50;
    await h.service.round();
    const r = await pending;
    assert.equal(r.err, null);
    for (const g of r.res?.grants ?? []) acked.set(g.key, g.epoch);
    return r.res as ReportResponseMessage;
  };
  const S1 = 'tenant/s1';
  const S2 = 'tenant/s2';
  const S3 = 'tenant/s3';
  try {
    await h.backend.propose({ type: 'putTier', name: 'gold', rate: 100, burst: 100 });
    await h.backend.propose({ type: 'putSettings', unknownTenant: 'tier:gold' });
    // Three unknown tenants asked for; the bound is 2: the third gets no grant (refused, counted).
    await cycle([demand(S1, 5), demand(S2, 5), demand(S3, 5)]);
    assert.ok(ledger.holdsSlices(S1) && ledger.holdsSlices(S2), 'two implicit tenants granted');
    assert.equal(ledger.holdsSlices(S3), false, 'the third is beyond the bound');
    assert.equal(ledger.implicitTenantCount, 2);
    assert.ok(h.service.stats.implicitTenantsRefused >= 1);
    // s1 stays busy, s2 goes quiet: after the idle time s2 is wound down; s3 is still refused meanwhile.
    for (let i = 0; i < 8; i++) {
      nowMs += 1000;
      await cycle(i === 0 ? [demand(S2, 0), demand(S3, 5)] : [demand(S1, 6 + (i % 2)), demand(S3, 5 + (i % 2))]);
      await h.service.expire();
      assert.ok(ledger.implicitTenantCount <= 2, 'the bound holds throughout');
      if (ledger.getQuota(S2) === undefined) break;
    }
    assert.equal(ledger.getQuota(S2), undefined, 'the idle implicit tenant is winding down: no quota');
    assert.notEqual(ledger.getQuota(S1), undefined, 'the busy one stays');
    assert.equal(h.backend.proposed.filter((c) => c.type === 'retireImplicitTenants').length, 1);
    assert.equal(ledger.implicitTenantCount, 2, 'counted until its last slice is dropped');
    assert.equal(ledger.holdsSlices(S3), false);
    // A snapshot taken now keeps the wind-down.
    const restored = Ledger.restore(ledger.snapshot(), { assertInvariants: true });
    assert.equal(restored.getQuota(S2), undefined);
    assert.equal(restored.implicitTenantCount, 2);
    // The next answer carries s2's zero grant marked deleted; once acknowledged the slice is dropped,
    // and then s3 fits under the bound and is granted.
    const wind = await cycle([demand(S1, 6), demand(S3, 5)]);
    const zero = wind.grants.find((g) => g.key === S2);
    assert.ok(zero !== undefined && zero.deleted && zero.rate === 0, `wind-down grant: ${JSON.stringify(zero)}`);
    await cycle([demand(S1, 6), demand(S3, 5)]);
    assert.equal(ledger.holdsSlices(S2), false, 'dropped from the ledger once acknowledged');
    assert.equal(ledger.getQuota(S2)?.rate, 100, 'no longer winding down: an implicit tenant again if asked for');
    for (let i = 0; i < 3 && !ledger.holdsSlices(S3); i++) await cycle([demand(S1, 6), demand(S3, 5 + i)]);
    assert.ok(ledger.holdsSlices(S3), 'the refused tenant is granted once there is room');
    assert.equal(ledger.implicitTenantCount, 2);
    assert.equal(Ledger.restore(ledger.snapshot(), { assertInvariants: true }).implicitTenantCount, 2);
  } finally {
    h.stop();
  }
});

/** An agent as the lease service meets it: it acknowledges every grant it gets and forgets a key told deleted. */
class TestAgent {
  readonly acked = new Map<string, number>();
  /** Every grant it was sent. */
  readonly grants: GrantMessage[] = [];
  constructor(readonly cellId: string) {}
  async report(address: string, velocity: ReportRequestMessage['velocity']): Promise<ReportResponseMessage> {
    const acks = [...this.acked].map(([key, epoch]) => ({ key, epoch }));
    const r = await report(address, { cellId: this.cellId, velocity, acks });
    assert.equal(r.err, null, `${this.cellId} answered`);
    const res = r.res as ReportResponseMessage;
    for (const g of res.grants) {
      this.grants.push(g);
      this.acked.set(g.key, g.epoch);
    }
    return res;
  }
  /** Whether it was ever told `key` is gone. */
  toldDeleted(key: string): boolean {
    return this.grants.some((g) => g.key === key && g.deleted);
  }
}

function asked(key: string, perS: number): { key: string; allowedPerS: number; refusedPerS: number } {
  return { key, allowedPerS: 0, refusedPerS: perS };
}

/** Reports from each agent, then one round 50 ms later (simulated time); the answers. */
async function cycle(
  h: Awaited<ReturnType<typeof setup>>,
  clock: { now: number },
  reports: [TestAgent, ReportRequestMessage['velocity']][],
): Promise<ReportResponseMessage[]> {
  const n = h.service.stats.reports;
  const answers = Promise.all(reports.map(([a, v]) => a.report(h.address, v)));
  await arrived(h.service, n + reports.length);
  clock.now += 50;
  await h.service.round();
  return answers;
}

void test('finding 1: an idle implicit tenant is not wound down while a cell holding its floor is cut off; one whose wind-down got stuck on a cut-off cell is taken back when a healthy cell asks for it', async () => {
  const clock = { now: 1_000_000 };
  const h = await setup(createAllocatorPolicy(), () => clock.now, {
    maxImplicitTenants: 5,
    implicitTenantIdleMs: 5000,
  });
  const ledger = h.backend.ledgerInstance;
  const S = 'tenant/s1';
  const a = new TestAgent('a');
  const b = new TestAgent('b');
  try {
    await h.backend.propose({ type: 'putTier', name: 'gold', rate: 90, burst: 90, floorFraction: 0.5 });
    await h.backend.propose({ type: 'putSettings', unknownTenant: 'tier:gold' });
    for (let i = 0; i < 3; i++)
      await cycle(h, clock, [
        [a, [asked(S, 10)]],
        [b, [asked(S, 10)]],
      ]);
    assert.ok(ledger.sliceEpoch(S, 'a') > 0 && ledger.sliceEpoch(S, 'b') > 0, 'both cells hold a slice');
    // Both go quiet; then b is cut off, holding the floor stamped on its slice (15/s). Well past the idle time
    // and b's lease, the tenant is not wound down: b's floor would keep it winding down, refused everywhere.
    await cycle(h, clock, [
      [a, [asked(S, 0)]],
      [b, [asked(S, 0)]],
    ]);
    for (let i = 0; i < 10; i++) {
      clock.now += 1000;
      await cycle(h, clock, [[a, []]]);
      await h.service.expire();
    }
    assert.equal(ledger.getCell('b')?.leaseLive, false, 'b is cut off');
    assert.notEqual(ledger.getQuota(S), undefined, 'still an implicit tenant');
    assert.equal(a.toldDeleted(S), false, 'a was never told the tenant is gone');
    // b comes back: now the wind-down can finish within a lease, and it starts. b is cut off again right after it
    // got its zero grant, before acknowledging it; a acknowledges its own.
    await cycle(h, clock, [
      [a, []],
      [b, []],
    ]);
    await h.service.expire();
    assert.equal(ledger.isWindingDown(S), true, 'idle and every holder live: wound down');
    await cycle(h, clock, [
      [a, []],
      [b, []],
    ]);
    assert.ok(a.toldDeleted(S) && b.toldDeleted(S));
    for (let i = 0; i < 6; i++) {
      clock.now += 1000;
      await cycle(h, clock, [[a, []]]);
      await h.service.expire();
    }
    assert.equal(ledger.holdsSlices(S), true, "stuck on b's floor");
    assert.equal(ledger.sliceEpoch(S, 'a'), 0, "a's slice is gone");
    // a asks for it again: taken back at once, a is granted within a round or two, b's floor still counted.
    const before = a.grants.length;
    for (let i = 0; i < 3 && !a.grants.slice(before).some((g) => g.key === S && g.rate > 0); i++)
      await cycle(h, clock, [[a, [asked(S, 20)]]]);
    const granted = a.grants.slice(before).filter((g) => g.key === S);
    assert.ok(
      granted.length > 0 && granted.every((g) => !g.deleted) && granted.some((g) => g.rate > 0),
      `a is granted again: ${JSON.stringify(granted)}`,
    );
    assert.equal(h.service.stats.implicitTenantsRevived, 1);
    const state = ledger.getQuotaState(S);
    assert.ok((state?.cells.find((c) => c.cellId === 'b')?.countedRate ?? 0) >= 15 - 1e-9, "b's floor is counted");
    assert.ok((state?.countedRate ?? Infinity) <= (state?.ceilingRate ?? 0) + 1e-9, 'the bound holds');
  } finally {
    h.stop();
  }
});

void test('findings 2 and 4: demand that comes back while a retirement commits cancels it before any cell is told, and the round computed meanwhile loses no grant', async () => {
  const clock = { now: 1_000_000 };
  const h = await setup(createAllocatorPolicy(), () => clock.now, {
    maxImplicitTenants: 5,
    implicitTenantIdleMs: 5000,
  });
  const ledger = h.backend.ledgerInstance;
  const S = 'tenant/s1';
  const a = new TestAgent('a');
  const b = new TestAgent('b');
  try {
    await h.backend.propose({ type: 'putTier', name: 'gold', rate: 100, burst: 100 });
    await h.backend.propose({ type: 'putSettings', unknownTenant: 'tier:gold' });
    for (let i = 0; i < 3; i++)
      await cycle(h, clock, [
        [a, [asked(S, 10)]],
        [b, []],
      ]);
    assert.ok(ledger.sliceEpoch(S, 'a') > 0);
    await cycle(h, clock, [
      [a, [asked(S, 0)]],
      [b, []],
    ]);
    for (let i = 0; i < 5; i++) {
      await h.service.expire();
      clock.now += 1000;
      await cycle(h, clock, [
        [a, []],
        [b, []],
      ]);
    }
    assert.notEqual(ledger.getQuota(S), undefined, 'not idle long enough yet');
    // The leader finds S idle and proposes its retirement; the commit takes a while. Meanwhile demand comes back
    // on a, and b asks for S for the first time, and a round is due.
    let release = (): void => {};
    h.backend.gate = new Promise<void>((r) => (release = r));
    const expiring = h.service.expire();
    const n = h.service.stats.reports;
    const answers = Promise.all([a.report(h.address, [asked(S, 30)]), b.report(h.address, [asked(S, 30)])]);
    await arrived(h.service, n + 2);
    clock.now += 50;
    const due = h.service.round();
    h.backend.gate = null;
    release();
    await expiring;
    await due;
    await h.service.round();
    await answers;
    for (let i = 0; i < 4; i++)
      await cycle(h, clock, [
        [a, [asked(S, 30)]],
        [b, [asked(S, 30)]],
      ]);
    assert.equal(h.service.stats.refusedRounds, 0, 'no round was refused');
    assert.equal(a.toldDeleted(S) || b.toldDeleted(S), false, 'no cell was told S is gone');
    assert.notEqual(ledger.getQuota(S), undefined, 'S is an implicit tenant');
    assert.ok(
      b.grants.some((g) => g.key === S && g.rate > 0),
      'b is granted what it asked for',
    );
  } finally {
    h.stop();
  }
});

void test('finding 3: a tenant deleted under tier:NAME while cells still ask for it becomes an implicit tenant only within --max-implicit-tenants', async () => {
  const clock = { now: 1_000_000 };
  const h = await setup(createAllocatorPolicy(), () => clock.now, {
    maxImplicitTenants: 1,
    implicitTenantIdleMs: 5000,
  });
  const ledger = h.backend.ledgerInstance;
  const S = 'tenant/s1';
  const ACME = 'tenant/acme';
  const a = new TestAgent('a');
  try {
    // A log at format 5, where a deleted tenant winds down (below it, it is at once an implicit tenant).
    await h.backend.propose({ type: 'raiseCommandFormat', format: TENANT_WIND_DOWN_FORMAT });
    await h.backend.propose({ type: 'putTier', name: 'gold', rate: 100, burst: 100 });
    await h.backend.propose({ type: 'putTenant', id: 'acme', tier: 'gold' });
    await h.backend.propose({ type: 'putSettings', unknownTenant: 'tier:gold' });
    for (let i = 0; i < 3; i++) await cycle(h, clock, [[a, [asked(S, 10), asked(ACME, 10)]]]);
    assert.equal(ledger.implicitTenantCount, 1, 's1 is the one implicit tenant');
    await h.backend.propose({ type: 'deleteTenant', id: 'acme' });
    for (let i = 0; i < 4; i++) {
      await cycle(h, clock, [[a, [asked(S, 10 + i), asked(ACME, 10 + i)]]]);
      assert.deepEqual([...ledger.implicitTenantKeys()], [S], 'acme is not taken: the bound is held by s1');
    }
    assert.equal(a.toldDeleted(ACME), true, 'wound down as a deleted tenant');
    const since = a.grants.findIndex((g) => g.key === ACME && g.deleted);
    assert.ok(!a.grants.slice(since).some((g) => g.key === ACME && !g.deleted), 'and never granted again');
    assert.equal(ledger.holdsSlices(ACME), false, 'dropped once acknowledged');
    assert.equal(ledger.implicitTenantCount, 1);
    assert.ok(h.service.stats.implicitTenantsRefused > 0, 'counted as refused');
    assert.equal(ledger.isImplicitTenant(S), true);
  } finally {
    h.stop();
  }
});

/** One report of cell eu (paged answers) answered by one round driven at once; `tick` moves the clock first. */
function sender(
  h: { address: string; service: LeaseService },
  tick: () => void,
): (req: Partial<ReportRequestMessage>) => Promise<ReportResponseMessage> {
  let n = 0;
  return async (req) => {
    const p = report(h.address, { cellId: 'eu', pagedAnswers: true, ...req });
    await arrived(h.service, ++n);
    tick();
    await h.service.round();
    const r = await p;
    assert.equal(r.err, null);
    assert.ok(r.res !== null);
    return r.res;
  };
}

/** Demand the agent reports for a key it holds nothing for (its refusals). */
const demand = (key: string): { key: string; allowedPerS: number; refusedPerS: number } => ({
  key,
  allowedPerS: 0,
  refusedPerS: 10,
});

void test("releases (an agent's evicted keys): a released key is not sent again, not even in a full picture, until the cell asks for it; then its current slice comes back; a release below the slice's epoch changes nothing", async () => {
  let nowMs = 1_000_000;
  const h = await setup(createAllocatorPolicy(), () => nowMs);
  const send = sender(h, () => (nowMs += 10));
  const keys = (r: ReportResponseMessage): string[] => r.grants.map((g) => g.key).sort();
  try {
    await h.backend.propose({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0.3 });
    await h.backend.propose({ type: 'putTenant', id: 'a', tier: 'gold' });
    await h.backend.propose({ type: 'putTenant', id: 'b', tier: 'gold' });
    let r = await send({ velocity: [demand('tenant/a'), demand('tenant/b')] });
    assert.equal(r.releases, true, 'the leader says it takes releases');
    const held = new Map(r.grants.map((g) => [g.key, g.epoch]));
    r = await send({});
    for (const g of r.grants) held.set(g.key, g.epoch);
    assert.deepEqual([...held.keys()].sort(), ['tenant/a', 'tenant/b'], 'both granted');
    const epochA = held.get('tenant/a') ?? 0;
    // Acknowledged; then a is released at its epoch, and b at an epoch below its slice's (a stale release).
    await send({ acks: [...held].map(([key, epoch]) => ({ key, epoch })) });
    await send({
      released: [
        { key: 'tenant/a', epoch: epochA },
        { key: 'tenant/b', epoch: 0 },
      ],
    });
    // A full picture (the agent's lease lapsed): b only; a was given back.
    r = await send({ wantFull: true });
    assert.equal(r.full, true);
    assert.deepEqual(
      keys(r),
      ['tenant/b'],
      'the released key is not in the picture; the stale release changed nothing',
    );
    r = await send({});
    assert.deepEqual(keys(r), [], 'nor resent');
    // The cell asks for a again (its checks are refused): its slice comes back with the same numbers one epoch above
    // the one released (never at it: a late copy of the release could otherwise name a grant the agent took back).
    const before = h.backend.ledger().getSlice('tenant/a', 'eu');
    r = await send({ velocity: [demand('tenant/a')] });
    const back = r.grants.find((g) => g.key === 'tenant/a');
    assert.ok(back !== undefined, 'a is sent again once asked for');
    assert.equal(back.epoch, epochA + 1, 'one epoch above the released one');
    assert.equal(back.epoch, h.backend.ledger().getSlice('tenant/a', 'eu')?.epoch, "the ledger's current slice");
    assert.deepEqual([back.rate, back.burst], [before?.rate, before?.burst], 'the same numbers');
    // Bad releases are refused with the reason, and change nothing.
    const bad = await report(h.address, { cellId: 'eu', pagedAnswers: true, released: [{ key: 'nope', epoch: 1 }] });
    assert.equal(bad.err?.code, grpc.status.INVALID_ARGUMENT);
    assert.match(bad.err?.details ?? '', /released key nope is not a quota key/);
  } finally {
    h.stop();
  }
});

void test('releases at command format 7: a release of the slice current epoch drops it from the ledger (the slices follow the keys held), a stale one drops nothing, a key asked for again gets a new slice above the old epoch; a replacing incarnation drops nothing for TTL + margin', async () => {
  let nowMs = 1_000_000;
  const h = await setup(createAllocatorPolicy(), () => nowMs);
  const send = sender(h, () => (nowMs += 10));
  const ledger = h.backend.ledger();
  try {
    await h.backend.propose({ type: 'raiseCommandFormat', format: RELEASED_SLICES_FORMAT });
    await h.backend.propose({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0.3 });
    for (const id of ['a', 'b', 'c']) await h.backend.propose({ type: 'putTenant', id, tier: 'gold' });
    const held = new Map<string, number>();
    let r = await send({ velocity: ['a', 'b', 'c'].map((id) => demand(`tenant/${id}`)) });
    for (const g of r.grants) held.set(g.key, g.epoch);
    r = await send({});
    for (const g of r.grants) held.set(g.key, g.epoch);
    await send({ acks: [...held].map(([key, epoch]) => ({ key, epoch })) });
    assert.equal(ledger.cellSliceCount('eu'), 3);
    const epochA = ledger.sliceEpoch('tenant/a', 'eu');
    // A session's releases drop slices from TTL + skew margin after it began (a copy of a report sent before it
    // could name a grant the agent took back since).
    nowMs += 4_100;
    // a released at its epoch (dropped), b at an epoch below its slice's (kept).
    await send({
      released: [
        { key: 'tenant/a', epoch: epochA },
        { key: 'tenant/b', epoch: ledger.sliceEpoch('tenant/b', 'eu') - 1 },
      ],
    });
    assert.equal(ledger.sliceEpoch('tenant/a', 'eu'), 0, 'the released slice is dropped');
    assert.ok(ledger.sliceEpoch('tenant/b', 'eu') > 0, 'a stale release drops nothing');
    assert.equal(ledger.cellSliceCount('eu'), 2);
    assert.equal(h.service.stats.releasedSlicesDropped, 1);
    const drops = h.backend.proposed.filter((c) => c.type === 'dropReleasedSlices');
    assert.equal(drops.length, 1, 'one entry for the report');
    // Asked for again: a first grant, a new slice above the dropped epoch.
    r = await send({ velocity: [demand('tenant/a')] });
    const back = r.grants.find((g) => g.key === 'tenant/a');
    assert.ok(back !== undefined, 'a is granted again once asked for');
    assert.ok(back.epoch > epochA, `epoch ${back.epoch} above the dropped ${epochA}`);
    assert.equal(back.epoch, ledger.sliceEpoch('tenant/a', 'eu'));
    // A new incarnation replaces the session: its releases drop nothing until TTL + margin later.
    const cEpoch = ledger.sliceEpoch('tenant/c', 'eu');
    await send({ incarnation: 'second' });
    await send({ incarnation: 'second', released: [{ key: 'tenant/c', epoch: cEpoch }] });
    assert.equal(ledger.sliceEpoch('tenant/c', 'eu'), cEpoch, 'not trusted yet: kept');
    nowMs += 4_100;
    await send({ incarnation: 'second', released: [{ key: 'tenant/c', epoch: cEpoch }] });
    assert.equal(ledger.sliceEpoch('tenant/c', 'eu'), 0, 'dropped once TTL + margin passed');
  } finally {
    h.stop();
  }
});

void test('a late copy of a release (a timed-out report overtaken by its retry, which asked for the key again) drops nothing: the key came back one epoch higher, which the old release cannot name', async () => {
  let nowMs = 1_000_000;
  const h = await setup(createAllocatorPolicy(), () => nowMs);
  const send = sender(h, () => (nowMs += 10));
  const ledger = h.backend.ledger();
  try {
    await h.backend.propose({ type: 'raiseCommandFormat', format: RELEASED_SLICES_FORMAT });
    await h.backend.propose({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0 });
    await h.backend.propose({ type: 'putTenant', id: 'a', tier: 'gold' });
    // The same demand throughout, so the policy has no reason to change the grant (a changed grant is a new epoch
    // anyway): only the release rule decides the epoch the key comes back at.
    await send({ velocity: [demand('tenant/a')] });
    await send({ velocity: [demand('tenant/a')] });
    const e = ledger.sliceEpoch('tenant/a', 'eu');
    assert.ok(e > 0, 'a granted');
    await send({ acks: [{ key: 'tenant/a', epoch: e }] });
    nowMs += 4_100; // past the session's TTL + margin: its releases drop slices
    // R0 = { released a@e } times out at the agent; its retry R1 carries the release and demand for a again.
    const r0 = { released: [{ key: 'tenant/a', epoch: e }] };
    const r = await send({ ...r0, velocity: [demand('tenant/a')] });
    const back = r.grants.find((g) => g.key === 'tenant/a');
    assert.ok(back !== undefined, 'a is sent again');
    // The agent takes it (its release was answered) and acknowledges it.
    await send({ acks: [{ key: 'tenant/a', epoch: back.epoch }], velocity: [demand('tenant/a')] });
    // R0 arrives last. (Before: a came back at e, and R0 dropped the slice the agent held under a live lease.)
    await send(r0);
    assert.equal(h.service.stats.releasedSlicesDropped, 0, 'the late release dropped nothing');
    assert.equal(ledger.sliceEpoch('tenant/a', 'eu'), back.epoch, 'the slice the agent holds is still counted');
    assert.equal(back.epoch, e + 1, 'a came back one epoch above the released one, never at it');
  } finally {
    h.stop();
  }
});

void test("releases in a session's first TTL + margin are parked: the answer says so and the slice stays; sent again after it, they drop the slice; an incarnation replaced this term (which never drops) parks nothing", async () => {
  let nowMs = 1_000_000;
  const h = await setup(createAllocatorPolicy(), () => nowMs);
  const send = sender(h, () => (nowMs += 10));
  const ledger = h.backend.ledger();
  try {
    await h.backend.propose({ type: 'raiseCommandFormat', format: RELEASED_SLICES_FORMAT });
    await h.backend.propose({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0 });
    for (const id of ['a', 'b']) await h.backend.propose({ type: 'putTenant', id, tier: 'gold' });
    const held = new Map<string, number>();
    let r = await send({ velocity: [demand('tenant/a'), demand('tenant/b')] });
    for (const g of r.grants) held.set(g.key, g.epoch);
    r = await send({});
    for (const g of r.grants) held.set(g.key, g.epoch);
    assert.equal(r.releasesParked, true, 'a new session: releases are parked');
    await send({ acks: [...held].map(([key, epoch]) => ({ key, epoch })) });
    // a goes idle (an agent evicts idle keys): its grant settles, acknowledged, so no round moves it again.
    const idle = { key: 'tenant/a', allowedPerS: 0, refusedPerS: 0 };
    for (let i = 0; i < 10; i++) {
      r = await send({ velocity: [idle] });
      const g = r.grants.find((x) => x.key === 'tenant/a');
      if (g === undefined) break;
      await send({ acks: [{ key: g.key, epoch: g.epoch }], velocity: [idle] });
    }
    const ea = ledger.sliceEpoch('tenant/a', 'eu');
    assert.ok(ea > 0);
    // Released in the window (an agent that evicts at once, or a new leader's full picture released at once).
    r = await send({ released: [{ key: 'tenant/a', epoch: ea }] });
    assert.equal(r.releasesParked, true, 'the answer tells the agent to send it again later');
    assert.equal(ledger.sliceEpoch('tenant/a', 'eu'), ea, 'not dropped in the window');
    assert.equal(h.service.stats.releasesParked, 1);
    // The cell keeps reporting (its lease lives) past TTL + margin; a stays released, never sent.
    for (let i = 0; i < 5; i++) {
      nowMs += 1_000;
      r = await send({});
      assert.ok(!r.grants.some((g) => g.key === 'tenant/a'), 'a is not sent again');
    }
    assert.equal(r.releasesParked, false, 'past the window: the agent unparks');
    assert.equal(ledger.sliceEpoch('tenant/a', 'eu'), ea, 'kept until the release comes again');
    // The agent sends the parked release again: now it drops the slice. (Before, nothing was sent again and the
    // slice stayed counted until the key was asked for.)
    r = await send({ released: [{ key: 'tenant/a', epoch: ea }] });
    assert.equal(r.releasesParked, false);
    assert.equal(ledger.sliceEpoch('tenant/a', 'eu'), 0, 'dropped');
    assert.equal(h.service.stats.releasedSlicesDropped, 1);
    // A new incarnation replaces the session; then the replaced one reports again: its session never drops (it may be
    // a late copy), so it parks nothing — the agent must not keep re-sending what can never be dropped.
    await send({ incarnation: 'second' });
    await send({ incarnation: 'i1' });
    const eb = ledger.sliceEpoch('tenant/b', 'eu');
    r = await send({ incarnation: 'i1', released: [{ key: 'tenant/b', epoch: eb }] });
    assert.equal(r.releasesParked, false);
    assert.equal(ledger.sliceEpoch('tenant/b', 'eu'), eb, 'kept: that session drops nothing this term');
    assert.equal(h.service.stats.releasesParked, 1, 'nothing more parked');
  } finally {
    h.stop();
  }
});
