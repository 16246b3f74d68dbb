// The longest GCRA window the agents' bucket table can hold, and the check both sides apply.
//
// A GCRA limit stores D = T·b (T = 1/rate in ns, b = the burst) in 64-bit arithmetic; the bucket
// table keeps D ≤ 2^56 ns (≈ 2.28 years) so a bucket's theoretical arrival time stays far from
// overflow. A quota whose burst/rate exceeds that cannot be enforced: the coordinator's ledger
// refuses it (the admin API answers 400 naming this limit), and an agent handed a slice beyond it
// anyway (an older coordinator, rounding of a tiny rate) clamps the burst down to what fits — a
// smaller bucket admits less, never more.

/** Largest D = T·burst in ns (cell-agent/buckets/gcra.ts enforces it). */
export const MAX_GCRA_WINDOW_NS = 1n << 56n;
/** The same in seconds: the longest burst/rate a quota may have (72,057,594 s). */
export const MAX_GCRA_WINDOW_S = Math.floor(Number(MAX_GCRA_WINDOW_NS) / 1e9);

/** burst/rate in seconds (Infinity for a rate of 0 with a burst). */
export function gcraWindowSeconds(rate: number, burst: number): number {
  if (burst <= 0) return 0;
  return rate > 0 ? burst / rate : Infinity;
}

/** True if an agent can hold a bucket of this rate and burst exactly. */
export function gcraWindowFits(rate: number, burst: number): boolean {
  return gcraWindowSeconds(rate, burst) <= MAX_GCRA_WINDOW_S;
}
