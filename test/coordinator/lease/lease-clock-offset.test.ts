// Failover between two real LeaseServices over one real Ledger, on simulated time: the new leader's
// wall clock is offset from the old one's by up to ±10 s and its clock rate is off by up to 10 %.
// Whatever the offset, no lease is released before the agent's own lease (sent + TTL) is over, a
// renewal by the new leader is never born expired, and silent cells are still released in the end.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import fc from 'fast-check';
import { pino } from 'pino';
import { Ledger, type LedgerResult } from '../../../coordinator/ledger/ledger.js';
import type { LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';
import { LeaseService, type LeaseBackend } from '../../../coordinator/lease/lease-service.js';
import { loadQuotaLeaseService, type ReportRequestMessage } from '../../../shared/lease-proto.js';

const svc = loadQuotaLeaseService();
const Client = grpc.makeGenericClientConstructor(svc.definition, 'QuotaLease');
const TTL = 3000;
const MARGIN = 1000;

/** The replicated state both replicas apply (applied at once: one shared Ledger) and who leads in which term. */
class Cluster {
  readonly ledger = new Ledger({ floorCells: 2, skewMarginMs: MARGIN, assertInvariants: true });
  leader = 'n1';
  term = 2;
  private index = 0;
  apply(cmd: LedgerCommandInput): LedgerResult {
    return this.ledger.apply(cmd, ++this.index);
  }
}

class Replica implements LeaseBackend {
  constructor(
    readonly id: string,
    private readonly c: Cluster,
  ) {}
  isLeader(): boolean {
    return this.c.leader === this.id;
  }
  leaderId(): string | null {
    return this.c.leader;
  }
  term(): number {
    return this.c.term;
  }
  readBarrier(): Promise<void> {
    return Promise.resolve();
  }
  peerAddress(): string | null {
    return null;
  }
  ledger(): Ledger {
    return this.c.ledger;
  }
  propose(cmd: LedgerCommandInput): Promise<LedgerResult> {
    if (!this.isLeader()) return Promise.reject(new Error('not the leader'));
    return Promise.resolve(this.c.apply(cmd));
  }
}

async function serve(service: LeaseService): Promise<{ address: string; server: grpc.Server }> {
  const server = new grpc.Server();
  service.register(server);
  const port = await new Promise<number>((ok, fail) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e !== null ? fail(e) : ok(p))),
  );
  return { address: `127.0.0.1:${port}`, server };
}

/** One report answered after one round of `service` (driven here). */
async function reportThrough(service: LeaseService, address: string, cellId: string): Promise<void> {
  const client = new Client(address, grpc.credentials.createInsecure());
  const req: ReportRequestMessage = {
    cellId,
    incarnation: 'i1',
    sentAtMs: 0,
    acks: [],
    velocity: [],
    capsVersion: 0,
    wantFull: false,
  };
  const seen = service.stats.reports;
  const answered = new Promise<grpc.ServiceError | null>((resolve) => {
    client.makeUnaryRequest(
      svc.report.path,
      svc.report.requestSerialize,
      svc.report.responseDeserialize,
      req,
      { deadline: Date.now() + 5000 },
      (err: grpc.ServiceError | null) => resolve(err),
    );
  });
  for (let i = 0; i < 500 && service.stats.reports === seen; i++) await new Promise((r) => setTimeout(r, 2));
  assert.ok(service.stats.reports > seen, 'the report arrived');
  await service.round();
  const err = await answered;
  client.close();
  assert.equal(err, null, `answered: ${err?.message ?? ''}`);
}

void test('a new leader whose clock is seconds off releases no lease early, and none of its own renewals is born expired', async () => {
  let real = 5_000_000; // simulated real time, ms
  const cluster = new Cluster();
  cluster.apply({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0.2 });
  cluster.apply({ type: 'putTenant', id: 'acme', tier: 'gold' });
  const old = new LeaseService({
    backend: new Replica('n1', cluster),
    logger: pino({ level: 'silent' }),
    roundMs: 1e9,
    expireEveryMs: 1e9,
    leaseTtlMs: TTL,
    monoMs: () => real,
    wallMs: () => real,
  });
  const a = await serve(old);
  // Settings of the new leader, changed per run (its clocks read these).
  let offset = 0;
  let rate = 1;
  let start = 0;
  const fresh = new LeaseService({
    backend: new Replica('n2', cluster),
    logger: pino({ level: 'silent' }),
    roundMs: 1e9,
    expireEveryMs: 1e9,
    leaseTtlMs: TTL,
    monoMs: () => start + (real - start) * rate,
    wallMs: () => real + offset,
  });
  const b = await serve(fresh);
  const expire = (s: LeaseService) => (s as unknown as { expire(): Promise<void> }).expire();
  try {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: -10_000, max: 10_000 }),
        fc.double({ min: 0.9, max: 1.1, noNaN: true }),
        fc.integer({ min: 0, max: 2_000 }),
        async (off, r, gap) => {
          // n1 leads (a new term of its own) and renews cell-old's lease; cell-old's agent sent the report at `sent`.
          real += 60_000;
          cluster.leader = 'n1';
          cluster.term += 1;
          const sent = real;
          await reportThrough(old, a.address, 'old');
          // Leadership moves to n2 `gap` ms later; n2's wall clock is `off` ms off, its rate `r`.
          real += gap;
          cluster.leader = 'n2';
          cluster.term += 1;
          offset = off;
          rate = r;
          start = real;
          let ownReceipt: number | null = null;
          let releasedOld: number | null = null;
          let releasedOwn: number | null = null;
          for (let step = 0; step < 200 && (releasedOld === null || releasedOwn === null); step++) {
            if (step === 5) {
              ownReceipt = real;
              await reportThrough(fresh, b.address, 'new');
              assert.equal(
                cluster.ledger.listCells().find((c) => c.id === 'new')?.leaseLive,
                true,
                'a renewal by the new leader is live when answered',
              );
            }
            await fresh.round();
            await expire(fresh);
            const cells = cluster.ledger.listCells();
            if (releasedOld === null && cells.find((c) => c.id === 'old')?.leaseExpiresAtMs === null)
              releasedOld = real;
            if (
              releasedOwn === null &&
              ownReceipt !== null &&
              cells.find((c) => c.id === 'new')?.leaseExpiresAtMs === null
            )
              releasedOwn = real;
            real += 100;
          }
          assert.ok(
            releasedOld !== null && releasedOwn !== null && ownReceipt !== null,
            'silent cells are released in the end',
          );
          // The agents' leases (their own clocks exact here) end at sent + TTL and ownReceipt + TTL at the latest.
          assert.ok(
            releasedOld >= sent + TTL,
            `offset ${off} ms, rate ${r}: the old leader's renewal released ${sent + TTL - releasedOld} ms before the agent's lease ended`,
          );
          assert.ok(
            releasedOwn >= ownReceipt + TTL,
            `offset ${off} ms, rate ${r}: its own renewal released ${ownReceipt + TTL - releasedOwn} ms early`,
          );
          // And not much later than the grace (TTL + margin on n2's clock) plus one expiry step.
          assert.ok(
            releasedOld <= start + (TTL + MARGIN) / r + gap + TTL + MARGIN + 300,
            `released at ${releasedOld - sent} ms after the report`,
          );
        },
      ),
      { numRuns: 40, seed: 13 },
    );
  } finally {
    old.stop();
    fresh.stop();
    a.server.forceShutdown();
    b.server.forceShutdown();
  }
});
