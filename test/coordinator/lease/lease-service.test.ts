// The lease service on three real coordinator processes: a follower answers FAILED_PRECONDITION with
// the leader's id and address; the leader registers a new cell, renews its lease, grants from the
// allocator (a busy cell grows above its floor), resends nothing already acknowledged, sends every
// grant again to a new incarnation; after kill -9 of the leader the new leader continues from the
// replicated slices.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { CoordinatorCluster } from '../../../testkit/coordinator-cluster.js';
import { LEADER_ADDRESS_TRAILER, LEADER_ID_TRAILER, loadQuotaLeaseService } from '../../../shared/lease-proto.js';
import type { ReportRequestMessage, ReportResponseMessage } from '../../../shared/lease-proto.js';

const ids = ['n1', 'n2', 'n3'];
const svc = loadQuotaLeaseService();
const Client = grpc.makeGenericClientConstructor(svc.definition, 'QuotaLease');

interface Answer {
  readonly ok: ReportResponseMessage | null;
  readonly code: number | null;
  readonly leaderId: string;
  readonly leaderAddress: string;
}

function report(address: string, req: Partial<ReportRequestMessage> & { cellId: string }): Promise<Answer> {
  const client = new Client(address, grpc.credentials.createInsecure());
  const full: ReportRequestMessage = {
    incarnation: 'inc-1',
    sentAtMs: Date.now(),
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
        if (err !== null) {
          const id = err.metadata?.get(LEADER_ID_TRAILER)[0];
          const addr = err.metadata?.get(LEADER_ADDRESS_TRAILER)[0];
          resolve({
            ok: null,
            code: err.code,
            leaderId: typeof id === 'string' ? id : '',
            leaderAddress: typeof addr === 'string' ? addr : '',
          });
        } else resolve({ ok: res ?? null, code: null, leaderId: '', leaderAddress: '' });
      },
    );
  });
}

void test('lease service: leader hint, registration, grants from demand, acks, new incarnation, failover', async () => {
  const c = await CoordinatorCluster.create(ids);
  try {
    c.startAll();
    const leader = await c.waitForLeader();
    const addr = (id: string): string => `127.0.0.1:${c.replica(id).peerPort}`;
    assert.equal((await c.write('PUT', '/v1/tiers/gold', { rate: 1000, burst: 1000, floorFraction: 0.3 })).status, 200);
    assert.equal((await c.write('PUT', '/v1/tenants/acme', { tier: 'gold' })).status, 200);

    // A follower points at the leader.
    const follower = ids.find((id) => id !== leader) ?? 'n1';
    const hint = await report(addr(follower), { cellId: 'eu' });
    assert.equal(hint.code, grpc.status.FAILED_PRECONDITION, 'a follower refuses');
    assert.equal(hint.leaderId, leader, 'leader id in the trailers');
    assert.equal(hint.leaderAddress, addr(leader), 'leader address in the trailers');

    // Invalid input.
    const bad = await report(addr(leader), { cellId: 'bad cell' });
    assert.equal(bad.code, grpc.status.INVALID_ARGUMENT, 'a bad cell id is refused');

    // The leader registers the cells and renews their leases; demand on one cell only.
    const first = await report(addr(leader), {
      cellId: 'eu',
      velocity: [{ key: 'tenant/acme', allowedPerS: 100, refusedPerS: 800 }],
    });
    assert.equal(first.code, null, `the leader answers: ${String(first.code)}`);
    assert.equal(first.ok?.leaseTtlMs, 3000);
    assert.equal(first.ok?.leaderId, leader);
    assert.equal((await report(addr(leader), { cellId: 'us' })).code, null, 'second cell');
    const cells = await c.http(leader, 'GET', '/v1/cells');
    const list = cells.body['cells'] as { id: string; leaseExpiresAtMs: number | null }[];
    assert.deepEqual(list.map((x) => x.id).sort(), ['eu', 'us'], 'both cells registered');

    // Reporting demand again: the busy cell's grant grows above its floor (100 = 0.3 × 1000 / 3).
    let grant: ReportResponseMessage['grants'][number] | undefined;
    const acked: { key: string; epoch: number }[] = [];
    for (let i = 0; i < 20 && (grant === undefined || grant.rate <= 100); i++) {
      const r = await report(addr(leader), {
        cellId: 'eu',
        acks: acked.splice(0),
        velocity: [{ key: 'tenant/acme', allowedPerS: 100, refusedPerS: 800 }],
      });
      assert.equal(r.code, null, 'report answered');
      const g = r.ok?.grants.find((x) => x.key === 'tenant/acme');
      if (g !== undefined) {
        grant = g;
        acked.push({ key: g.key, epoch: g.epoch });
      }
      await report(addr(leader), { cellId: 'us' });
    }
    assert.ok(grant !== undefined && grant.rate > 100, `eu's grant grew above its floor: ${JSON.stringify(grant)}`);
    assert.ok(Math.abs(grant.floorRate - 100) < 1e-9, `the floor travels with the grant: ${grant.floorRate}`);

    // Acknowledged: not sent again (while it does not change; demand is kept the same).
    const afterAck = await report(addr(leader), { cellId: 'eu', acks: acked.splice(0), velocity: [] });
    const again = await report(addr(leader), { cellId: 'eu' });
    const resent = [...(afterAck.ok?.grants ?? []), ...(again.ok?.grants ?? [])].filter(
      (g) => g.key === 'tenant/acme' && g.epoch <= grant.epoch,
    );
    assert.equal(resent.length, 0, 'an acknowledged grant is not sent again');

    // A new incarnation gets every grant again.
    const fresh = await report(addr(leader), { cellId: 'eu', incarnation: 'inc-2' });
    const g2 = fresh.ok?.grants.find((x) => x.key === 'tenant/acme');
    assert.ok(g2 !== undefined && g2.epoch >= grant.epoch, 'a new incarnation receives the current grant');

    const tenant = await c.http(leader, 'GET', '/v1/tenants/acme');
    const slices = tenant.body['slices'] as { cellId: string; rate: number; countedRate: number }[];
    const sum = slices.reduce((s, x) => s + x.countedRate, 0) + 100 * (3 - slices.length);
    assert.ok(sum <= 1000 + 1e-6, `the ledger's bound holds: ${sum}`);

    // kill -9 the leader: a new one answers, from the replicated slices, with the grant.
    await c.kill(leader);
    const rest = ids.filter((id) => id !== leader);
    const next = await c.waitForLeader(20_000, rest);
    let after: Answer | null = null;
    for (let i = 0; i < 50; i++) {
      const other = rest.find((id) => id !== next) ?? next;
      const h = await report(addr(other), { cellId: 'eu', incarnation: 'inc-2' });
      const target = h.code === null ? addr(other) : h.leaderAddress;
      if (target === '') {
        await new Promise((r) => setTimeout(r, 100));
        continue;
      }
      after = await report(target, { cellId: 'eu', incarnation: 'inc-2' });
      if (after.code === null) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(after?.code, null, 'the new leader answers');
    const g3 = after?.ok?.grants.find((x) => x.key === 'tenant/acme');
    assert.ok(
      g3 !== undefined && g3.epoch >= (g2?.epoch ?? 0),
      'the new leader (no memory of the session) sends the replicated grant',
    );
  } finally {
    await c.cleanup();
  }
});
