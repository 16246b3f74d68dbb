// Records what an older build of the ledger does with the entries of test/coordinator/ledger/format-gate-log.ts
// written before the format raise: each entry's result and the snapshot bytes after it, into
// test/coordinator/ledger/fixtures/pre-format-5.json, which ledger-format-gate.test.ts compares this build against
// (the same log must give the same state and bytes below format 5). Run on a checkout of the build to compare with:
//   git archive <commit> coordinator shared | tar -x -C /tmp/old && ln -s "$PWD/node_modules" /tmp/old/node_modules
//   cp package.json tsconfig.json /tmp/old/
//   npx tsx test/coordinator/ledger/record-pre-format-5.ts /tmp/old <commit>
import { writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { PRE_RAISE_LOG } from './format-gate-log.js';
import type * as LedgerModule from '../../../coordinator/ledger/ledger.js';

const [checkout, commit] = process.argv.slice(2);
if (checkout === undefined || commit === undefined) {
  console.error('usage: tsx test/coordinator/ledger/record-pre-format-5.ts CHECKOUT_DIR COMMIT');
  process.exit(2);
}
const { Ledger } = (await import(resolve(checkout, 'coordinator/ledger/ledger.ts'))) as typeof LedgerModule;
// As a replica runs it: no invariant assertions (the builds before format 5 break the bound on one of these entries).
const ledger = new Ledger({ floorCells: 2 });
const entries = PRE_RAISE_LOG.map((cmd, i) => {
  const r = ledger.apply(cmd as never, i + 1);
  return {
    result: r.ok ? `ok ${r.value.kind}` : r.error.code,
    snapshot: Buffer.from(ledger.snapshot()).toString('base64'),
  };
});
const out = resolve(import.meta.dirname, 'fixtures/pre-format-5.json');
writeFileSync(out, JSON.stringify({ commit, floorCells: 2, entries }, null, 1) + '\n');
console.log(`${entries.length} entries recorded from ${commit} into ${out}`);
