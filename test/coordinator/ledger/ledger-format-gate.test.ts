// What an existing command does when applied depends on the log, not on the build: the command format the log was
// raised to (raiseCommandFormat, replicated, in snapshots) chooses it. One log (format-gate-log.ts) through the
// replicas' state machine (CoordinatorState over encoded entries): below the raise every entry gives the result and
// the snapshot bytes the build before format 5 gave (recorded from it: fixtures/pre-format-5.json,
// test/coordinator/ledger/record-pre-format-5.ts); after it, format 5's semantics; a replica that cannot apply the raise stops there.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { CoordinatorState } from '../../../coordinator/node/coordinator-state.js';
import { Ledger, LedgerFormatError } from '../../../coordinator/ledger/ledger.js';
import type { LedgerResult } from '../../../coordinator/ledger/ledger.js';
import {
  BASE_COMMAND_FORMAT,
  NEWEST_COMMAND_FORMAT,
  TENANT_WIND_DOWN_FORMAT,
  encodeCommand,
} from '../../../coordinator/ledger/ledger-commands.js';
import type { LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';
import { POST_RAISE_LOG, PRE_RAISE_LOG, RAISE_ENTRY } from './format-gate-log.js';

interface Recorded {
  readonly commit: string;
  readonly floorCells: number;
  readonly entries: readonly { readonly result: string; readonly snapshot: string }[];
}
const recorded = JSON.parse(
  readFileSync(resolve(import.meta.dirname, 'fixtures/pre-format-5.json'), 'utf8'),
) as Recorded;

const describe = (r: LedgerResult): string => (r.ok ? `ok ${r.value.kind}` : r.error.code);

function replica(maxCommandFormat = NEWEST_COMMAND_FORMAT): {
  state: CoordinatorState;
  apply: (cmd: unknown) => LedgerResult;
} {
  const state = new CoordinatorState({ floorCells: recorded.floorCells, maxCommandFormat });
  let index = 0;
  return {
    state,
    apply: (cmd) => state.apply(encodeCommand(cmd as LedgerCommandInput), ++index) as LedgerResult,
  };
}

void test('below the raise a log applies as the build before format 5 applied it: each result and the snapshot bytes after each entry are those recorded from it', () => {
  assert.equal(recorded.entries.length, PRE_RAISE_LOG.length, 'the fixture records this log');
  const r = replica();
  PRE_RAISE_LOG.forEach((cmd, i) => {
    const want = recorded.entries[i];
    assert.ok(want !== undefined);
    const what = `entry ${i + 1} (${(cmd as { type: string }).type})`;
    assert.equal(describe(r.apply(cmd)), want.result, `${what}: the result of ${recorded.commit}`);
    assert.equal(
      Buffer.from(r.state.ledger.snapshot()).toString('base64'),
      want.snapshot,
      `${what}: the snapshot bytes of ${recorded.commit}`,
    );
  });
  assert.equal(r.state.ledger.commandFormat, BASE_COMMAND_FORMAT);
});

void test('the raise applies at its index on every replica alike; after it deleteTenant under tier:NAME winds the tenant down, and the snapshot carries the format', () => {
  const replicas = [replica(), replica()];
  for (const cmd of PRE_RAISE_LOG) for (const r of replicas) r.apply(cmd);
  for (const r of replicas) {
    const v = r.apply(RAISE_ENTRY);
    assert.deepEqual(v.ok && v.value, { kind: 'commandFormat', commandFormat: TENANT_WIND_DOWN_FORMAT, raised: true });
    assert.equal(r.state.ledger.commandFormat, TENANT_WIND_DOWN_FORMAT);
  }
  const one = replicas[0];
  assert.ok(one !== undefined);
  const results = POST_RAISE_LOG.map((cmd) => replicas.map((r) => describe(r.apply(cmd))));
  for (const [i, rs] of results.entries()) assert.equal(rs[0], rs[1], `entry ${i + 1} after the raise`);
  // Format 5: the deleted tenant winds down (no quota), the older leader's shrink is refused (no quota to grant
  // against), its revival makes it an implicit tenant of gold again and its next round is accepted.
  assert.deepEqual(
    results.map((rs) => rs[0]),
    ['ok tenant', 'ok settings', 'ok round', 'ok deleted', 'NOT_FOUND', 'ok implicitRevived', 'ok round'],
  );
  assert.equal(one.state.ledger.isImplicitTenant('tenant/initech'), true);
  const bytes = one.state.snapshot();
  assert.deepEqual(Buffer.from(bytes), Buffer.from(replicas[1]?.state.snapshot() ?? []), 'the replicas agree');
  // A restored replica goes on at format 5 (the same bytes), a replica pinned below it refuses the snapshot.
  const restored = new CoordinatorState({ floorCells: recorded.floorCells });
  restored.restore(bytes);
  assert.equal(restored.ledger.commandFormat, TENANT_WIND_DOWN_FORMAT);
  assert.deepEqual(Buffer.from(restored.snapshot()), Buffer.from(bytes));
  const pinned = new CoordinatorState({
    floorCells: recorded.floorCells,
    maxCommandFormat: TENANT_WIND_DOWN_FORMAT - 1,
  });
  assert.throws(() => pinned.restore(bytes), LedgerFormatError);
});

void test('a replica that cannot apply the raise stops at it (changing nothing) rather than apply later entries at other semantics; a raise to the format already held changes nothing', () => {
  const pinned = replica(TENANT_WIND_DOWN_FORMAT - 1);
  for (const cmd of PRE_RAISE_LOG) pinned.apply(cmd);
  const before = pinned.state.snapshot();
  const at = pinned.state.ledger.appliedIndex;
  assert.throws(
    () => pinned.apply(RAISE_ENTRY),
    (e: unknown) =>
      e instanceof LedgerFormatError &&
      e.code === 'LEDGER_FORMAT_UNSUPPORTED' &&
      /raises the command format to 5; this replica applies formats up to 4/.test(e.message),
  );
  assert.equal(pinned.state.ledger.appliedIndex, at);
  assert.deepEqual(Buffer.from(pinned.state.snapshot()), Buffer.from(before));
  // A format no build knows yet: refused by this one the same way.
  const current = new Ledger({ floorCells: 2 });
  assert.throws(
    () => current.apply({ type: 'raiseCommandFormat', format: NEWEST_COMMAND_FORMAT + 1 }, 1),
    LedgerFormatError,
  );
  const again = current.apply({ type: 'raiseCommandFormat', format: NEWEST_COMMAND_FORMAT }, 2);
  assert.ok(again.ok && again.value.kind === 'commandFormat' && again.value.raised);
  const twice = current.apply({ type: 'raiseCommandFormat', format: NEWEST_COMMAND_FORMAT }, 3);
  assert.ok(twice.ok && twice.value.kind === 'commandFormat' && !twice.value.raised);
  assert.equal(current.commandFormat, NEWEST_COMMAND_FORMAT);
});
