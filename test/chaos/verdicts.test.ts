// The bound verdict's fail-open term (docs/quota-model.md "The bound"): decided admissions are held
// to quota·W + burst, answers given fail-open to the cells' allowance·W + its depth, window by window.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { RecordedBin } from '../../chaos/load.js';
import type { LoadBin } from '../../chaos/load-protocol.js';
import { boundVerdict } from '../../chaos/verdicts.js';

function bins(perBin: Partial<LoadBin>, count = 20): RecordedBin[] {
  return Array.from({ length: count }, (_, i) => ({
    t: (i + 1) * 100,
    durationMs: 100,
    cells: [
      {
        sent: 0,
        admitted: 0,
        refused: 0,
        errors: 0,
        degraded: 0,
        failOpen: 0,
        latenciesUs: [],
        maxAdmittedLatencyUs: 0,
        ...perBin,
      },
    ],
  }));
}

void test('bound verdict: fail-open answers within the allowance pass, beyond it fail, decided admissions keep their own bound', () => {
  const allowance = { rate: 180, depth: 180 };
  // 60 decided + 30 fail-open per 100 ms: 600 + 300 per second against 600 + 120 and 180 + 180.
  const within = boundVerdict(bins({ admitted: 60, failOpen: 30 }), 600, 120, allowance);
  assert.equal(within.ok, true, within.detail);
  assert.match(within.detail, /fail-open term/);
  const beyond = boundVerdict(bins({ admitted: 60, failOpen: 40 }), 600, 120, allowance);
  assert.equal(beyond.ok, false, `400 fail-open in a second > 360: ${beyond.detail}`);
  const decidedOver = boundVerdict(bins({ admitted: 80, failOpen: 0 }), 600, 120, allowance);
  assert.equal(decidedOver.ok, false, 'the allowance does not lend to decided admissions');
  const unknown = boundVerdict(bins({ admitted: 60, failOpen: 40 }), 600, 120, null);
  assert.equal(unknown.ok, true, 'allowance not known: fail-open answers are counted apart');
  assert.match(unknown.detail, /counted apart/);
});
