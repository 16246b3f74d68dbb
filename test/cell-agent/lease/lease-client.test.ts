// The agent's lease client against fake coordinators (small real gRPC servers in the test): it follows
// the leader hint, applies grants and acknowledges them, reports velocity per second (quiet keys once
// with 0), drops to the floors when its lease (counted from the send time) expires, keeping its
// incarnation and its grants suspended, and resumes a grant only once an answer re-confirms it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { pino } from 'pino';
import { LEADER_ADDRESS_TRAILER, LEADER_ID_TRAILER, loadQuotaLeaseService } from '../../../shared/lease-proto.js';
import type { GrantMessage, ReportRequestMessage, ReportResponseMessage } from '../../../shared/lease-proto.js';
import { LeaseClient } from '../../../cell-agent/lease/lease-client.js';
import type { LeaseState, VelocityInput } from '../../../cell-agent/lease/lease-client.js';
import type { OverrideEntry } from '../../../cell-agent/lease/quota-overrides.js';
import { QuotaOverrides } from '../../../cell-agent/lease/quota-overrides.js';
import { waitFor } from '../../../testkit/wait.js';

const svc = loadQuotaLeaseService();
const logger = pino({ level: 'silent' });

type Behaviour = (
  req: ReportRequestMessage,
) => { res: ReportResponseMessage } | { code: grpc.status; leaderAddress?: string; leaderId?: string };

interface Fake {
  readonly address: string;
  readonly requests: ReportRequestMessage[];
  behaviour: Behaviour;
  stop(): void;
}

async function fakeCoordinator(behaviour: Behaviour): Promise<Fake> {
  const server = new grpc.Server();
  const requests: ReportRequestMessage[] = [];
  const fake: { behaviour: Behaviour } = { behaviour };
  server.addService(svc.definition, {
    Report: ((
      call: grpc.ServerUnaryCall<ReportRequestMessage, ReportResponseMessage>,
      cb: grpc.sendUnaryData<ReportResponseMessage>,
    ) => {
      requests.push(call.request);
      const out = fake.behaviour(call.request);
      if ('res' in out) {
        cb(null, out.res);
        return;
      }
      const md = new grpc.Metadata();
      md.set(LEADER_ID_TRAILER, out.leaderId ?? '');
      md.set(LEADER_ADDRESS_TRAILER, out.leaderAddress ?? '');
      cb({ code: out.code, details: 'fake refusal', metadata: md, name: 'Error', message: 'fake refusal' });
    }) as grpc.handleUnaryCall<ReportRequestMessage, ReportResponseMessage>,
  });
  const port = await new Promise<number>((ok, fail) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e !== null ? fail(e) : ok(p))),
  );
  return Object.assign(fake, { address: `127.0.0.1:${port}`, requests, stop: () => server.forceShutdown() });
}

const grant = (epoch: number, rate = 300, burst = 300): GrantMessage => ({
  key: 'tenant/acme',
  rate,
  burst,
  epoch,
  floorRate: 100,
  floorBurst: 100,
  version: 1,
  parent: '',
  deleted: false,
});
const ok = (grants: GrantMessage[], ttl = 3000): { res: ReportResponseMessage } => ({
  res: {
    leaderId: 'n2',
    leaseTtlMs: ttl,
    grants,
    ledgerIndex: 1,
    unknownTenant: 'deny',
    unknownKeys: [],
    capsIncluded: false,
    capsVersion: 0,
    cappedDomains: [],
    full: false,
  },
});

void test('lease client: follows the leader hint, applies and acknowledges grants, reports velocity', async () => {
  const leader = await fakeCoordinator(() => ok([]));
  const follower = await fakeCoordinator(() => ({
    code: grpc.status.FAILED_PRECONDITION,
    leaderId: 'n2',
    leaderAddress: leader.address,
  }));
  const overrides = new QuotaOverrides();
  const applied: OverrideEntry[][] = [];
  const states: LeaseState[] = [];
  let velocity: VelocityInput[] = [
    { key: 'tenant/acme', allowed: 50, refused: 25 },
    { key: 'not a quota key', allowed: 1, refused: 0 },
  ];
  let epoch = 0;
  leader.behaviour = (req) => {
    // Sends epoch 1 until acknowledged, then epoch 2 once.
    const acked = req.acks.find((a) => a.key === 'tenant/acme')?.epoch ?? 0;
    if (epoch === 0) epoch = 1;
    if (acked === 1 && epoch === 1) epoch = 2;
    return ok(acked >= epoch ? [] : [grant(epoch, epoch === 1 ? 300 : 50)]);
  };
  const client = new LeaseClient({
    cellId: 'eu',
    coordinators: [follower.address],
    logger,
    velocity: () => velocity,
    onOverrides: (e) => {
      applied.push(e);
      overrides.apply(e);
    },
    onStateChange: (s) => states.push(s),
    intervalMs: 100,
  });
  try {
    client.start();
    await waitFor('a report to the leader', () => leader.requests.length >= 1, { timeoutMs: 5000, everyMs: 20 });
    assert.equal(client.status().target, leader.address, 'follows the hint');
    assert.ok(follower.requests.length >= 1, 'asked the follower first');
    const first = leader.requests[0] as ReportRequestMessage;
    assert.equal(first.cellId, 'eu');
    assert.deepEqual(
      first.velocity,
      [{ key: 'tenant/acme', allowedPerS: 100, refusedPerS: 50 }],
      'per second, only quota keys',
    );

    // The grant is acknowledged at once, so the next one may follow within milliseconds: look at
    // what was applied, not only at what is in force now.
    const first300 = await waitFor(
      'the grant applied',
      () => applied.flat().find((e) => e.key === 'tenant/acme' && 'rate' in e && e.rate === 300),
      { timeoutMs: 5000, everyMs: 20 },
    );
    assert.equal('leased' in first300 && first300.leased, true, 'applied as a leased grant');
    assert.equal(states[0], 'leased');
    // Acknowledged in the next report, then the shrink (epoch 2, below the floor: max(grant, floor) = 100).
    await waitFor(
      'ack of epoch 1',
      () => leader.requests.some((r) => r.acks.some((a) => a.key === 'tenant/acme' && a.epoch === 1)),
      { timeoutMs: 5000, everyMs: 20 },
    );
    await waitFor('epoch 2 applied', () => overrides.get('tenant/acme')?.rate === 100, {
      timeoutMs: 5000,
      everyMs: 20,
    });
    await waitFor('ack of epoch 2', () => leader.requests.some((r) => r.acks.some((a) => a.epoch === 2)), {
      timeoutMs: 5000,
      everyMs: 20,
    });
    const n = leader.requests.length;
    await waitFor('two more reports', () => leader.requests.length >= n + 2, { timeoutMs: 5000, everyMs: 20 });
    assert.equal(leader.requests[leader.requests.length - 1]?.acks.length, 0, 'acknowledged once, not again');

    // A key that goes quiet is sent once with 0, then not at all.
    velocity = [];
    const m = leader.requests.length;
    await waitFor('three more reports', () => leader.requests.length >= m + 3, { timeoutMs: 5000, everyMs: 20 });
    const later = leader.requests.slice(m);
    assert.deepEqual(
      later[0]?.velocity,
      [{ key: 'tenant/acme', allowedPerS: 0, refusedPerS: 0 }],
      'quiet key once with 0',
    );
    assert.deepEqual(later[2]?.velocity, [], 'then nothing');
    assert.ok(applied.length >= 2, 'overrides were applied');
  } finally {
    client.stop();
    leader.stop();
    follower.stop();
  }
});

void test('lease client: with ID=HOST:PORT it follows the leader by id to its own address, not the address the replicas know', async () => {
  // The replicas know n2 at `elsewhere` (say, a pod address this cell cannot reach); this agent
  // reaches n2 at `leader` (its proxy, its load balancer).
  const leader = await fakeCoordinator(() => ok([]));
  const elsewhere = await fakeCoordinator(() => ok([]));
  const follower = await fakeCoordinator(() => ({
    code: grpc.status.FAILED_PRECONDITION,
    leaderId: 'n2',
    leaderAddress: elsewhere.address,
  }));
  const client = new LeaseClient({
    cellId: 'eu',
    coordinators: [follower.address, leader.address],
    coordinatorById: new Map([
      ['n1', follower.address],
      ['n2', leader.address],
    ]),
    logger,
    velocity: () => [],
    onOverrides: () => undefined,
    intervalMs: 100,
  });
  try {
    // Start at the follower whichever configured address the client picks first.
    client.start();
    await waitFor("reports reaching n2 at this agent's address", () => leader.requests.length >= 3, {
      timeoutMs: 5000,
      everyMs: 20,
    });
    assert.equal(client.status().target, leader.address, 'the target is the configured address of n2');
    assert.equal(elsewhere.requests.length, 0, 'never dialled the address the replicas know n2 by');
  } finally {
    client.stop();
    leader.stop();
    elsewhere.stop();
    follower.stop();
  }
});

void test('lease client: fail-static on expiry (counted from the send time), the same incarnation, recovery', async () => {
  let clockMs = 0;
  let down = false;
  let answer = (): { res: ReportResponseMessage } => ok([grant(1)], 1000);
  const coord = await fakeCoordinator(() => (down ? { code: grpc.status.UNAVAILABLE } : answer()));
  const overrides = new QuotaOverrides();
  const states: LeaseState[] = [];
  const client = new LeaseClient({
    cellId: 'eu',
    coordinators: [coord.address],
    logger,
    velocity: () => [],
    onOverrides: (e) => overrides.apply(e),
    onStateChange: (s) => states.push(s),
    intervalMs: 100,
    monotonicMs: () => clockMs,
  });
  try {
    // One report by hand, sent at t = 0 and answered at t = 400: the lease ends at 0 + 1000, not 1400.
    const sending = client.reportOnce();
    clockMs = 400;
    assert.equal(await sending, true);
    assert.equal(client.status().state, 'leased');
    assert.equal(client.status().leaseRemainingMs, 600, 'counted from the send time');
    assert.equal(overrides.get('tenant/acme')?.rate, 300);
    const firstIncarnation = client.status().incarnation;

    down = true;
    assert.equal(await client.reportOnce(), false, 'the coordinator is down');
    clockMs = 999;
    client.checkExpiry();
    assert.equal(client.status().state, 'leased', 'still leased just before the expiry');
    clockMs = 1000;
    client.checkExpiry();
    assert.equal(client.status().state, 'expired', 'expired at send time + TTL');
    assert.deepEqual(states, ['leased', 'expired']);
    const floor = overrides.get('tenant/acme');
    assert.equal(floor?.rate, 100, 'on the floor');
    assert.equal(floor?.leased, false, 'not leased: degraded');
    assert.equal(client.status().incarnation, firstIncarnation, 'the same incarnation after expiry');
    assert.equal(client.status().suspendedGrants, 1, 'the grant is held, suspended');

    // Contact returns, with an answer that does not carry the key (a page of the picture without it):
    // the lease is live again, the suspended grant is not — it stays on its floor.
    down = false;
    answer = () => ok([], 1000);
    assert.equal(await client.reportOnce(), true);
    assert.equal(client.status().state, 'leased', 'leased again');
    assert.equal(overrides.get('tenant/acme')?.rate, 100, 'a suspended grant is not resumed by itself');
    assert.equal(overrides.get('tenant/acme')?.leased, false);
    const last = coord.requests[coord.requests.length - 1];
    assert.equal(last?.incarnation, firstIncarnation, 'reported with the same incarnation');
    assert.equal(last?.wantFull, true, 'asks for a full picture to re-confirm its grants');
    // The answer re-confirms it at the same epoch: the grant is in force again.
    answer = () => ok([grant(1)], 1000);
    clockMs = 1100;
    assert.equal(await client.reportOnce(), true);
    assert.equal(overrides.get('tenant/acme')?.rate, 300, 'the leased grant is back');
    assert.equal(overrides.get('tenant/acme')?.leased, true);
    assert.deepEqual(states, ['leased', 'expired', 'leased']);

    // Cut off again, long enough for the coordinator to release the grant (the ledger zeroes it and keeps
    // its epoch): the answer that re-confirms epoch 1 carries 0, and the cell never goes back to 300.
    down = true;
    clockMs = 2200;
    client.checkExpiry();
    assert.equal(client.status().state, 'expired');
    down = false;
    answer = () => ok([grant(1, 0, 0)], 1000);
    assert.equal(await client.reportOnce(), true);
    assert.equal(client.status().state, 'leased');
    assert.equal(overrides.get('tenant/acme')?.rate, 100, 'the released grant: its floor, never the 300 held before');
    assert.equal(overrides.get('tenant/acme')?.leased, true, 'leased at what the ledger holds');
    answer = () => ok([grant(1)], 1000);

    // An answer arriving after the lease it renews is over applies the grants as floors only.
    down = true;
    clockMs = 5000;
    client.checkExpiry();
    assert.equal(client.status().state, 'expired');
    down = false;
    const late = client.reportOnce();
    clockMs = 7000;
    assert.equal(await late, true);
    assert.equal(client.status().state, 'expired', 'a late answer does not revive the lease');
    assert.equal(overrides.get('tenant/acme')?.leased, false, 'grants of a late answer only as floors');
  } finally {
    client.stop();
    coord.stop();
  }
});

void test('lease client: rotates over the configured coordinators when one is unreachable', async () => {
  const coord = await fakeCoordinator(() => ok([]));
  const client = new LeaseClient({
    cellId: 'eu',
    coordinators: ['127.0.0.1:1', '127.0.0.1:2', '127.0.0.1:3', coord.address],
    logger,
    velocity: () => [],
    onOverrides: () => undefined,
    intervalMs: 100,
  });
  try {
    client.start();
    await waitFor('a successful report', () => client.status().state === 'leased', { timeoutMs: 8000, everyMs: 20 });
    assert.equal(client.status().target, coord.address);
  } finally {
    client.stop();
    coord.stop();
  }
});

void test('lease client: a grant is acknowledged only once every serving thread applied it', async () => {
  const coord = await fakeCoordinator((req) => ok(req.acks.some((a) => a.epoch === 1) ? [] : [grant(1)]));
  let release: () => void = () => undefined;
  const client = new LeaseClient({
    cellId: 'eu',
    coordinators: [coord.address],
    logger,
    velocity: () => [],
    onOverrides: () =>
      new Promise<void>((r) => {
        release = r;
      }),
    intervalMs: 100,
  });
  try {
    assert.equal(await client.reportOnce(), true);
    assert.equal(await client.reportOnce(), true);
    assert.deepEqual(coord.requests[1]?.acks, [], 'not acknowledged while the workers have not confirmed');
    release();
    await new Promise((r) => setImmediate(r));
    assert.equal(await client.reportOnce(), true);
    assert.deepEqual(
      coord.requests[2]?.acks,
      [{ key: 'tenant/acme', epoch: 1 }],
      'acknowledged after the confirmation',
    );
  } finally {
    client.stop();
    coord.stop();
  }
});

void test('finding 4: a grant whose GCRA window the bucket table cannot hold is clamped and acknowledged; an answer that fails to apply leaves the key on its floor, and the client keeps reporting', async () => {
  // rate 1/s, burst 1e8: T·burst = 1e17 ns, beyond the table's 2^56 ns (an older coordinator accepted such tiers).
  const huge: GrantMessage = {
    key: 'tenant/acme',
    rate: 1,
    burst: 1e8,
    epoch: 1,
    floorRate: 0.5,
    floorBurst: 5e7,
    version: 1,
    parent: '',
    deleted: false,
  };
  const other: GrantMessage = { ...huge, key: 'tenant/other', rate: 10, burst: 10, floorRate: 2, floorBurst: 2 };
  const coordinator = await fakeCoordinator(() => ok([huge]));
  const overrides = new QuotaOverrides();
  let failNext = false;
  const client = new LeaseClient({
    cellId: 'eu',
    coordinators: [coordinator.address],
    logger,
    velocity: () => [],
    onOverrides: (e) => {
      if (failNext && e.some((x) => x.key === 'tenant/other' && 'leased' in x && x.leased)) {
        failNext = false;
        throw new Error('induced: the workers could not take the entries');
      }
      return overrides.apply(e);
    },
    intervalMs: 100,
  });
  try {
    client.start();
    await waitFor(
      'the huge grant acknowledged',
      () => coordinator.requests.some((r) => r.acks.some((a) => a.key === 'tenant/acme' && a.epoch === 1)),
      { timeoutMs: 5000, everyMs: 20 },
    );
    const inForce = overrides.get('tenant/acme');
    assert.ok(inForce !== undefined && inForce.leased && inForce.rate === 1, 'applied as a leased grant');
    assert.ok(
      inForce.burst < 1e8 && inForce.burst >= 7e7,
      `the burst clamped to the deepest bucket that fits (72,057,594 at 1/s): ${inForce.burst}`,
    );
    // An answer whose entries cannot be applied at all: logged, the key runs on its floor, not acknowledged, retried.
    failNext = true;
    coordinator.behaviour = () => ok([other]);
    await waitFor(
      'the failed grant re-applied from the next answer and acknowledged',
      () => coordinator.requests.some((r) => r.acks.some((a) => a.key === 'tenant/other')),
      { timeoutMs: 10_000, everyMs: 20 },
    );
    assert.equal(overrides.get('tenant/other')?.leased, true);
    assert.ok(client.status().reportsOk >= 3, 'the client kept reporting');
  } finally {
    client.stop();
    coordinator.stop();
  }
});

void test('lease client: releases a leader answers with releases_parked are kept and sent again after the first answer without it, then done', async () => {
  let parked = true;
  let seq = 0;
  let acked = false;
  const picture = (key: string): GrantMessage => ({ ...grant(4), key });
  const fake = await fakeCoordinator((req) => {
    seq++;
    acked ||= req.acks.some((a) => a.key === 'tenant/a');
    // Until the agent acknowledges it: a full picture carrying two keys the agent neither holds nor asks for.
    const full = !acked;
    return {
      res: {
        ...ok(full ? [picture('tenant/a'), picture('tenant/b')] : []).res,
        full,
        answerSeq: seq,
        releases: true,
        releasesParked: parked,
        more: false,
        fullPicture: 0,
        velocityResync: false,
      },
    };
  });
  const client = new LeaseClient({
    cellId: 'eu',
    coordinators: [fake.address],
    logger,
    velocity: () => [],
    onOverrides: () => undefined,
    intervalMs: 100,
    maxKeys: 10,
  });
  const releasedIn = (r: ReportRequestMessage): string[] => (r.released ?? []).map((x) => `${x.key}@${x.epoch}`).sort();
  try {
    client.start();
    // The picture's keys are released at once (acknowledged, not held) and sent with the next report.
    await waitFor('the release sent', () => fake.requests.some((r) => releasedIn(r).length > 0), {
      timeoutMs: 5000,
      everyMs: 10,
    });
    const firstAt = fake.requests.findIndex((r) => releasedIn(r).length > 0);
    assert.deepEqual(releasedIn(fake.requests[firstAt] as ReportRequestMessage), ['tenant/a@4', 'tenant/b@4']);
    // Answered with releases_parked: kept, not sent again while answers keep the flag.
    await waitFor('four more reports', () => fake.requests.length >= firstAt + 5, { timeoutMs: 5000, everyMs: 10 });
    assert.deepEqual(
      fake.requests.slice(firstAt + 1).flatMap(releasedIn),
      [],
      'parked: not sent while the session parks',
    );
    assert.equal(client.status().releasesParked, 2);
    assert.equal(client.status().releasesPending, 2);
    // The session trusts releases now: the first answer without the flag unparks them, the next report carries them.
    const before = fake.requests.length;
    parked = false;
    await waitFor('sent again', () => fake.requests.slice(before).some((r) => releasedIn(r).length > 0), {
      timeoutMs: 5000,
      everyMs: 10,
    });
    const againAt = before + fake.requests.slice(before).findIndex((r) => releasedIn(r).length > 0);
    assert.deepEqual(releasedIn(fake.requests[againAt] as ReportRequestMessage), ['tenant/a@4', 'tenant/b@4']);
    await waitFor('three more reports', () => fake.requests.length >= againAt + 4, { timeoutMs: 5000, everyMs: 10 });
    assert.deepEqual(fake.requests.slice(againAt + 1).flatMap(releasedIn), [], 'delivered: done');
    assert.equal(client.status().releasesPending, 0);
    assert.equal(client.status().releasesParked, 0);
    assert.equal(client.status().grants, 0, 'never held');
  } finally {
    client.stop();
    fake.stop();
  }
});
