// The coordinator's replicated state machine: the quota ledger plus the registry of member
// incarnations (which data directory each replica id is running on). Entries whose first byte is
// memberRecordTag are member records; every other entry is a ledger command. Snapshots hold both.
//
// The registry is how a replica whose data directory was wiped is recognised: it comes back with a
// new random incarnation, and the cluster still remembers the old one for its id.
import { Packr } from 'msgpackr';
import { Ledger, type LedgerOptions, type LedgerResult } from '../ledger/ledger.js';
import type { ReplicatedStateMachine } from './raft-driver.js';
import { encodeSnapshotSteps } from '../ledger/snapshot-encoder.js';

export const memberRecordTag = 0xc1; // a byte msgpack never starts a value with ("never used")
const packr = new Packr({ useRecords: false, moreTypes: false });
const snapshotVersion = 1;
const incarnationPattern = /^[0-9a-f]{8,64}$/;

export type CoordinatorResult =
  | LedgerResult
  | { readonly ok: true; readonly value: { readonly member: string; readonly incarnation: string | null } };

/** A member's incarnation; null forgets it (the member was replaced). */
export function encodeMemberRecord(id: string, incarnation: string | null): Uint8Array {
  const body = packr.pack([id, incarnation]);
  const out = new Uint8Array(body.byteLength + 1);
  out[0] = memberRecordTag;
  out.set(body, 1);
  return out;
}

export class CoordinatorState implements ReplicatedStateMachine<CoordinatorResult> {
  ledger: Ledger;
  private members = new Map<string, string>();

  constructor(private readonly ledgerOptions: LedgerOptions) {
    this.ledger = new Ledger(ledgerOptions);
  }

  apply(data: Uint8Array, index: number): CoordinatorResult {
    if (data[0] === memberRecordTag) {
      const v = packr.unpack(data.subarray(1)) as unknown;
      if (Array.isArray(v) && typeof v[0] === 'string' && v[1] === null) {
        this.members.delete(v[0]);
        return { ok: true, value: { member: v[0], incarnation: null } };
      }
      if (Array.isArray(v) && typeof v[0] === 'string' && typeof v[1] === 'string' && incarnationPattern.test(v[1])) {
        this.members.set(v[0], v[1]);
        return { ok: true, value: { member: v[0], incarnation: v[1] } };
      }
      return { ok: false, error: { code: 'INVALID', message: 'malformed member record' } };
    }
    return this.ledger.applyEncoded(data, index);
  }

  incarnationOf(id: string): string | undefined {
    return this.members.get(id);
  }

  incarnations(): Record<string, string> {
    return Object.fromEntries([...this.members].sort((a, b) => a[0].localeCompare(b[0])));
  }

  snapshot(): Uint8Array {
    return packr.pack([
      snapshotVersion,
      this.ledger.snapshot(),
      [...this.members].sort((a, b) => a[0].localeCompare(b[0])),
    ]);
  }

  /** snapshot()'s bytes as of now, encoded by the returned steps (the state may change meanwhile). */
  snapshotSteps(): Generator<void, Uint8Array, void> {
    const ledger = encodeSnapshotSteps(this.ledger.snapshotCopy());
    const members = [...this.members].sort((a, b) => a[0].localeCompare(b[0]));
    return (function* () {
      const bytes = yield* ledger;
      return packr.pack([snapshotVersion, bytes, members]);
    })();
  }

  restore(data: Uint8Array): void {
    if (data.byteLength === 0) {
      this.ledger = new Ledger(this.ledgerOptions);
      this.members = new Map();
      return;
    }
    const v = packr.unpack(data) as unknown;
    if (!Array.isArray(v) || v[0] !== snapshotVersion || !(v[1] instanceof Uint8Array) || !Array.isArray(v[2])) {
      throw new Error('unrecognised coordinator snapshot (format version or shape)');
    }
    this.ledger = Ledger.restore(
      v[1],
      this.ledgerOptions.maxCommandFormat === undefined
        ? {}
        : { maxCommandFormat: this.ledgerOptions.maxCommandFormat },
    );
    this.members = new Map(v[2] as [string, string][]);
  }
}
