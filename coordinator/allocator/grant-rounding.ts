// Rounding a round's grants to float32 in the safe direction, so the compact Raft entry
// (coordinator/ledger/round-codec.ts) carries each number in 4 bytes instead of 8. Pure.
//
// A grow (new value above the current grant) is rounded DOWN to a float32, never below the current
// grant; a shrink is rounded UP, never above the current grant. Hence the rounded round never lets a
// cell use more than the unrounded one (a lower grow; a shrink frees nothing until acknowledged in
// either case) and the ledger accepts it whenever it accepts the unrounded round. The error is below
// 2^-24 of the value (6e-8), far under the allocator's smallest step (0.1% of the quota), so the
// next round sees the cell at its target within that step and sends nothing more (no churn). A value
// that cannot be rounded that way (no float32 between it and the current grant) stays as it is.

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/** The largest float32 ≤ v (v finite, ≥ 0). */
export function float32Below(v: number): number {
  F32[0] = v;
  const f = F32[0];
  if (f <= v) return f;
  // f > v ≥ 0: the previous float32 (positive: one unit less in the bit pattern).
  U32[0] = (U32[0] as number) - 1;
  return F32[0];
}

/** The smallest float32 ≥ v (v finite, ≥ 0, below float32's largest finite value). */
export function float32Above(v: number): number {
  F32[0] = v;
  const f = F32[0];
  if (f >= v) return f;
  U32[0] = (U32[0] as number) + 1;
  return F32[0];
}

/** `next` rounded to a float32 towards `current` (see the header); `next` itself if no float32 fits. */
export function roundTowards(next: number, current: number): number {
  if (!(next > 0) || !Number.isFinite(next)) return next;
  if (next > current) {
    const r = float32Below(next);
    return r >= current ? r : next;
  }
  if (next < current) {
    const r = float32Above(next);
    return r <= current && Number.isFinite(r) ? r : next;
  }
  return next;
}
