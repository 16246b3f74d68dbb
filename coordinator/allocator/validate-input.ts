// The round's input checks: sizes, finite numbers, sane tuning. Throws AllocatorInputError.

import { AllocatorInputError } from './allocator-types.js';
import type { AllocatorInput, AllocatorTuning } from './allocator-types.js';
import { MAX_CELLS } from '../ledger/ledger-commands.js';

export function validateInput(input: AllocatorInput, tuning: AllocatorTuning): void {
  const n = input.cells.length;
  if (n > MAX_CELLS) throw new AllocatorInputError(`at most ${MAX_CELLS} cells`);
  const need = input.quotas.length * n;
  const s = input.slices;
  for (const [name, col] of Object.entries(s) as [string, Float64Array | Uint8Array][]) {
    if (col.length < need) throw new AllocatorInputError(`slices.${name} has ${col.length} entries, expected ${need}`);
  }
  if (!Number.isFinite(input.nowMs) || !Number.isFinite(input.leaseTtlMs) || input.leaseTtlMs <= 0)
    throw new AllocatorInputError('nowMs and leaseTtlMs must be finite, leaseTtlMs > 0');
  if (!Number.isFinite(input.skewMarginMs) || input.skewMarginMs < 0)
    throw new AllocatorInputError('skewMarginMs must be finite and ≥ 0');
  for (const [k, v] of Object.entries(tuning)) {
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0)
      throw new AllocatorInputError(`tuning.${k} must be a finite number ≥ 0`);
  }
  if (tuning.headroomFactor < 1) throw new AllocatorInputError('tuning.headroomFactor must be ≥ 1');
  if (tuning.starveTolerance >= 1) throw new AllocatorInputError('tuning.starveTolerance must be < 1');
  for (const q of input.quotas) {
    const ok =
      q.rate > 0 &&
      q.rate < Infinity &&
      q.burst >= 0 &&
      q.burst < Infinity &&
      q.floorRate >= 0 &&
      q.floorRate < Infinity &&
      q.floorBurst >= 0 &&
      q.floorBurst < Infinity &&
      q.ceilingRate >= 0 &&
      q.ceilingRate < Infinity &&
      q.ceilingBurst >= 0 &&
      q.ceilingBurst < Infinity &&
      q.countedRate >= 0 &&
      q.countedRate < Infinity &&
      q.countedBurst >= 0 &&
      q.countedBurst < Infinity;
    if (!ok) throw new AllocatorInputError(`quota ${q.key}: rates and bursts must be finite, ≥ 0, rate > 0`);
  }
}
