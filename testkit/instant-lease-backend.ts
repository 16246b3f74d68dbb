// A LeaseBackend over one in-process Ledger that applies every proposal at once (no Raft): for the
// lease service's tests and benchmarks that measure the lease protocol, not replication.
import { Ledger } from '../coordinator/ledger/ledger.js';
import type { LedgerResult } from '../coordinator/ledger/ledger.js';
import type { LedgerCommandInput } from '../coordinator/ledger/ledger-commands.js';
import * as grpc from '@grpc/grpc-js';
import type { LeaseBackend, LeaseService } from '../coordinator/lease/lease-service.js';

export class InstantBackend implements LeaseBackend {
  readonly id = 'n1';
  readonly ledgerInstance = new Ledger({ floorCells: 2, skewMarginMs: 1000 });
  private index = 0;
  isLeader(): boolean {
    return true;
  }
  leaderId(): string {
    return 'n1';
  }
  term(): number {
    return 2;
  }
  readBarrier(): Promise<void> {
    return Promise.resolve();
  }
  peerAddress(): string | null {
    return null;
  }
  ledger(): Ledger {
    return this.ledgerInstance;
  }
  propose(cmd: LedgerCommandInput): Promise<LedgerResult> {
    return Promise.resolve(this.ledgerInstance.apply(cmd, ++this.index));
  }
}

/** Tier gold (100/s, burst 100, floorFraction 0.5) and tenants t-0 … t-(n−1) on it, 5,000 an entry: their quota keys. */
export async function putGoldTenants(backend: InstantBackend, n: number): Promise<string[]> {
  await backend.propose({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0.5 });
  const keys: string[] = [];
  for (let i = 0; i < n; i += 5000) {
    const tenants = Array.from({ length: Math.min(5000, n - i) }, (_, j) => ({ id: `t-${i + j}`, tier: 'gold' }));
    const r = await backend.propose({ type: 'putTenants', tenants });
    if (!r.ok) throw new Error(`putTenants: ${r.error.message}`);
    for (const t of tenants) keys.push(`tenant/${t.id}`);
  }
  return keys;
}

/** Serves `service` over plaintext gRPC on a free loopback port: its address and the server (forceShutdown it). */
export async function serveLease(service: LeaseService): Promise<{ address: string; server: grpc.Server }> {
  const server = new grpc.Server();
  service.register(server);
  const port = await new Promise<number>((ok, fail) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e !== null ? fail(e) : ok(p))),
  );
  return { address: `127.0.0.1:${port}`, server };
}
