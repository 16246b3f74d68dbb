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
import { LeaseService } from '../../../coordinator/lease/lease-service.js';
import type { LeaseBackend } from '../../../coordinator/lease/lease-service.js';
import type { GrantPolicy } from '../../../coordinator/lease/grant-policy.js';
import { LEADER_ADDRESS_TRAILER, loadQuotaLeaseService } from '../../../shared/lease-proto.js';
import type { ReportRequestMessage, ReportResponseMessage } from '../../../shared/lease-proto.js';

const svc = loadQuotaLeaseService();
const Client = grpc.makeGenericClientConstructor(svc.definition, 'QuotaLease');

class FakeBackend implements LeaseBackend {
  readonly id = 'n1';
  leader = true;
  currentTerm = 2;
  readonly ledgerInstance = new Ledger({ floorCells: 3, skewMarginMs: 1000, assertInvariants: true });
  readonly proposed: LedgerCommandInput[] = [];
  private index = 0;
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
    return Promise.resolve(this.ledgerInstance.apply(cmd, ++this.index));
  }
}

async function setup(policy: GrantPolicy, now: () => number): Promise<{ backend: FakeBackend; service: LeaseService; address: string; stop: () => void }> {
  const backend = new FakeBackend();
  const service = new LeaseService({ backend, logger: pino({ level: 'silent' }), roundMs: 1e9, expireEveryMs: 1e9, leaseTtlMs: 3000, policy, monoMs: now, wallMs: now });
  const server = new grpc.Server();
  service.register(server);
  const port = await new Promise<number>((ok, fail) => server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e !== null ? fail(e) : ok(p))));
  return { backend, service, address: `127.0.0.1:${port}`, stop: () => { service.stop(); server.forceShutdown(); } };
}

function report(address: string, req: Partial<ReportRequestMessage> & { cellId: string }): Promise<{ res: ReportResponseMessage | null; err: grpc.ServiceError | null }> {
  const client = new Client(address, grpc.credentials.createInsecure());
  const full: ReportRequestMessage = { incarnation: 'i1', sentAtMs: 0, acks: [], velocity: [], capsVersion: 0, wantFull: false, ...req };
  return new Promise((resolve) => {
    client.makeUnaryRequest(svc.report.path, svc.report.requestSerialize, svc.report.responseDeserialize, full, { deadline: Date.now() + 3000 },
      (err: grpc.ServiceError | null, res?: ReportResponseMessage) => {
        client.close();
        resolve({ res: res ?? null, err });
      });
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
    greedy ? [...demands.reported].map((cellId) => ({ key: 'tenant/acme', cellId, rate: 1e6, burst: 1e6, epoch: 1, leaseExpiresAtMs: t + demands.leaseTtlMs })) : [];
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
    assert.equal(h.backend.ledgerInstance.getCell('eu')?.leaseExpiresAtMs, 1_000_000 + 3000, 'the lease runs from the receipt time');
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
