// Shared helpers of the ledger tests: a ledger fed with consecutive log indexes.
import assert from 'node:assert/strict';
import { Ledger } from '../../../coordinator/ledger/ledger.js';
import type { LedgerOptions, LedgerResult, LedgerValue } from '../../../coordinator/ledger/ledger.js';
import type { LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';

export class Driver {
  index = 0;
  constructor(readonly ledger: Ledger = new Ledger({ assertInvariants: true })) {}

  static create(options: LedgerOptions = {}): Driver {
    return new Driver(new Ledger({ assertInvariants: true, ...options }));
  }

  apply(cmd: LedgerCommandInput): LedgerResult {
    return this.ledger.apply(cmd, ++this.index);
  }

  /** Applies and asserts success, returning the value. */
  ok(cmd: LedgerCommandInput): LedgerValue {
    const r = this.apply(cmd);
    if (!r.ok) assert.fail(`${cmd.type} failed: ${r.error.code} ${r.error.message}`);
    return r.value;
  }

  /** Applies and asserts the error code, and that the state did not change. */
  err(cmd: LedgerCommandInput, code: string): string {
    const before = this.ledger.snapshot();
    const r = this.apply(cmd);
    if (r.ok) assert.fail(`${cmd.type} succeeded, expected ${code}`);
    assert.equal(r.error.code, code, r.error.message);
    assertUnchanged(before, this.ledger);
    return r.error.message;
  }
}

/**
 * The ledger holds the same domain state as the snapshot `before` did: replaying a no-op entry at the
 * same applied index onto `before` gives byte-identical snapshots (every entry advances the applied
 * index, errors included).
 */
export function assertUnchanged(before: Uint8Array, ledger: Ledger): void {
  const probe = Ledger.restore(before);
  probe.apply({ type: 'expireLeases', nowMs: 0 }, ledger.appliedIndex);
  assert.deepEqual(Buffer.from(probe.snapshot()), Buffer.from(ledger.snapshot()), 'the state changed');
}
