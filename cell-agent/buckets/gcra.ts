// GCRA (generic cell rate algorithm) in integer nanoseconds: a token bucket stored as one
// "theoretical arrival time" (TAT). Pure functions, no clock. The arithmetic is integer: bigint
// (gcraStep), and the same on doubles where every value is an integer below 2^53 (gcraStepNumber,
// the hot path: exact in its domain, no rounding anywhere).
//
// Formulation (all quantities are bigint nanoseconds unless said otherwise):
//   T  = emission interval = ceil(unitNs / requestsPerUnit)   (one token refills every T ns)
//   b  = burst, a whole number of tokens (the bucket depth)
//   D  = T·b  (= τ + T with the usual burst tolerance τ = T·(b−1)); the time an empty bucket needs
//        to refill completely
//   TAT: the bucket is full at any now ≥ TAT; at now < TAT it owes (TAT − now) ns of refill, i.e.
//        its level is b − (TAT − now)/T tokens.
//   take n hits at now:  base = max(TAT, now);  TAT' = base + n·T
//                        allowed  ⇔  TAT' − now ≤ D           (then TAT := TAT', else TAT unchanged)
//   (the decision only depends on differences of times, so callers may shift every time value by
//   the same offset: the shared table keeps TATs relative to its start, plus a generation tag)
//   remaining = floor((D − (TAT' − now)) / T)  after an allowed take (the current level, floored,
//               after a refused one); resetNs = time until the bucket is full again;
//               retryAfterNs = time until the same n hits would be allowed (0 when allowed,
//               NEVER_NS when n > b or the rate is 0).
// Bound: the TAT advances by exactly n·T per admitted hit and never runs more than D ahead of the
// clock, so the hits admitted at times in any window [t, t + W] satisfy count·T ≤ W + D, i.e.
// count ≤ floor(W/T) + b ≤ r·W + b (T is rounded UP, so 1/T ≤ r). Integer math: no drift, and the
// only rounding (T up to a whole ns, burst down to a whole token) is on the safe side. Calls with a
// clock reading older than the bucket's last one are safe too (they see more debt, never less).
//
// Rate 0 (or burst 0) is encoded as intervalNs = 0n, burst = 0n: every take is over the limit.

/** Units of envoyproxy/ratelimit's `rate_limit.unit` (month = 30 days, year = 365 days, as there). */
import { MAX_GCRA_WINDOW_NS } from '../../shared/gcra-window.js';

export type TimeUnit = 'second' | 'minute' | 'hour' | 'day' | 'week' | 'month' | 'year';

const SECOND_NS = 1_000_000_000n;

export const UNIT_NS: Readonly<Record<TimeUnit, bigint>> = Object.freeze({
  second: SECOND_NS,
  minute: 60n * SECOND_NS,
  hour: 3_600n * SECOND_NS,
  day: 86_400n * SECOND_NS,
  week: 7n * 86_400n * SECOND_NS,
  month: 30n * 86_400n * SECOND_NS,
  year: 365n * 86_400n * SECOND_NS,
});

/**
 * How a bucket that has no state yet starts: 'full' (local descriptor rules, like a fresh
 * envoyproxy/ratelimit window) or 'empty' (global quota slices: a new, moved-in, re-created or
 * restarted bucket must not release a burst into the global count that this cell did not refill).
 */
export type StartPolicy = 'full' | 'empty';

/** The parameters the decision depends on. */
export interface GcraParams {
  /** T in ns (≥ 1n), or 0n for "rate 0: always over the limit". */
  readonly intervalNs: bigint;
  /** b in whole tokens (≥ 1n), or 0n together with intervalNs = 0n. */
  readonly burst: bigint;
  /** D = T·b: how long an empty bucket takes to fill completely (0n for rate 0). */
  readonly windowNs: bigint;
}

export interface GcraLimit extends GcraParams {
  readonly start: StartPolicy;
  /** This limit took over from another one at a known instant (a lease's floor, from the lease's
   * end): a bucket still kept under `succeeds.from` is re-configured as of that instant, not as of
   * the take that meets it first (bucket-table.ts). Absent on every other limit. */
  readonly succeeds?: LimitSuccession;
}

/**
 * Where a limit came from, for the bucket that meets it late: `from` is the limit it replaced, and
 * `since(nowNs)` the instant (the callers' clock, ns; ≤ nowNs) it replaced it at, or null when
 * unknown (then the re-configuration is as of now). Read only when a bucket is re-configured, never
 * on a decision that finds its bucket under its own limit.
 */
export interface LimitSuccession {
  readonly from: GcraParams;
  since(nowNs: bigint): bigint | null;
}

/** `limit`, to be applied as of `succession.since` to a bucket still under `succession.from`. */
export function succeeding(limit: GcraLimit, succession: LimitSuccession): GcraLimit {
  return Object.freeze({ ...limit, succeeds: succession });
}

/** Retry-after meaning "never": the hits exceed the burst, or the rate is 0. */
export const NEVER_NS = 0x7fff_ffff_ffff_ffffn;

/**
 * Largest allowed D = T·b (2^56 ns ≈ 2.28 years: a full year-unit window with twice its requests
 * as burst still fits). Keeps TAT arithmetic far from 64-bit overflow in the shared table.
 */
export const MAX_WINDOW_NS: bigint = MAX_GCRA_WINDOW_NS;

function checkWholeNonNegative(name: string, v: number): void {
  if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`${name} must be a non-negative safe integer, got ${v}`);
}

/**
 * Largest burst, in tokens: below 2^53 − 1, the value at which callers saturate summed hits, so a
 * saturated request is more than any bucket can ever hold (a refusal, never an overflow).
 */
export const MAX_BURST_TOKENS = BigInt(Number.MAX_SAFE_INTEGER) - 1n;

function makeLimit(intervalNs: bigint, burst: bigint, start: StartPolicy): GcraLimit {
  if (intervalNs === 0n || burst === 0n) return Object.freeze({ intervalNs: 0n, burst: 0n, windowNs: 0n, start });
  if (burst > MAX_BURST_TOKENS) throw new RangeError(`burst ${burst} exceeds ${MAX_BURST_TOKENS} tokens`);
  const window = intervalNs * burst;
  if (window > MAX_WINDOW_NS) throw new RangeError(`limit window T·burst = ${window} ns exceeds ${MAX_WINDOW_NS} ns`);
  return Object.freeze({ intervalNs, burst, windowNs: window, start });
}

/** ceil(a / b) for a ≥ 0, b > 0. */
function ceilDiv(a: bigint, b: bigint): bigint {
  return (a + b - 1n) / b;
}

export interface LimitOptions {
  /** Bucket depth in tokens; defaults to requestsPerUnit (one unit's worth). */
  readonly burst?: number;
  /** Defaults to 'full' (a local descriptor rule). */
  readonly start?: StartPolicy;
}

/**
 * A limit of `requestsPerUnit` per `unit` (an envoyproxy/ratelimit `rate_limit`). T is rounded up
 * to a whole nanosecond: at most 1 ns per token conservative; rates above 1e9/s are capped at
 * 1e9/s. requestsPerUnit = 0 blocks everything.
 */
export function limitPerUnit(requestsPerUnit: number, unit: TimeUnit, opts: LimitOptions = {}): GcraLimit {
  checkWholeNonNegative('requestsPerUnit', requestsPerUnit);
  const burst = opts.burst ?? requestsPerUnit;
  checkWholeNonNegative('burst', burst);
  const start = opts.start ?? 'full';
  if (requestsPerUnit === 0) return makeLimit(0n, 0n, start);
  const unitNs = UNIT_NS[unit];
  return makeLimit(ceilDiv(unitNs, BigInt(requestsPerUnit)), BigInt(burst), start);
}

export interface RateLimitOptions {
  /** Defaults to 'empty' (a slice of a global quota). */
  readonly start?: StartPolicy;
}

/**
 * A limit from a (rate per second, burst) pair, as the coordinator grants slices. The rate may be
 * fractional: it is quantized DOWN to a multiple of 1e-6 requests/s and T = ceil(1e15 / µrate) ns;
 * the burst is floored to whole tokens. Both roundings admit less, never more.
 */
export function limitFromRate(ratePerSecond: number, burst: number, opts: RateLimitOptions = {}): GcraLimit {
  if (!Number.isFinite(ratePerSecond) || ratePerSecond < 0)
    throw new RangeError(`ratePerSecond must be finite and ≥ 0, got ${ratePerSecond}`);
  if (!Number.isFinite(burst) || burst < 0) throw new RangeError(`burst must be finite and ≥ 0, got ${burst}`);
  const start = opts.start ?? 'empty';
  const microRate = BigInt(Math.floor(ratePerSecond * 1e6));
  const wholeBurst = BigInt(Math.floor(burst));
  if (microRate === 0n || wholeBurst === 0n) return makeLimit(0n, 0n, start);
  return makeLimit(ceilDiv(1_000_000n * SECOND_NS, microRate), wholeBurst, start);
}

/** A limit from an exact emission interval and burst (tests, or callers with their own units). */
export function limitFromInterval(intervalNs: bigint, burst: bigint, start: StartPolicy = 'full'): GcraLimit {
  if (intervalNs < 0n || burst < 0n) throw new RangeError('intervalNs and burst must be ≥ 0');
  return makeLimit(intervalNs, burst, start);
}

/** True for a rate-0 limit (every take is over the limit). */
export function isBlocked(p: GcraParams): boolean {
  return p.intervalNs === 0n;
}

export interface GcraDecision {
  readonly allowed: boolean;
  /** The bucket's TAT after this call (unchanged when refused or hits = 0, except max(TAT, now) is not stored). */
  readonly tat: bigint;
  /** Whole tokens left after this call. */
  readonly remaining: number;
  /** Time until the bucket is full again. */
  readonly resetNs: bigint;
  /** 0n when allowed; the wait until the same hits would be allowed; NEVER_NS if never. */
  readonly retryAfterNs: bigint;
}

/**
 * The GCRA step on raw integers (tat and now may share any offset: the shared table passes values
 * relative to its start plus a generation tag). intervalNs ≥ 1n and window = intervalNs·burst
 * (blocked limits are handled by the callers); hits ≥ 0n. With hits = 0n it only reports (allowed
 * is true and tat is the stored TAT).
 */
export function gcraStep(tat: bigint, now: bigint, intervalNs: bigint, window: bigint, hits: bigint): GcraDecision {
  return { ...gcraStepInto(newGcraScratch(), tat, now, intervalNs, window, hits) };
}

/** A GcraDecision the hot path overwrites in place (gcraStepInto), so a decision allocates no object. */
export type GcraDecisionScratch = { -readonly [K in keyof GcraDecision]: GcraDecision[K] };

export function newGcraScratch(): GcraDecisionScratch {
  return { allowed: false, tat: 0n, remaining: 0, resetNs: 0n, retryAfterNs: 0n };
}

/** gcraStep, written into `out` (returned). */
export function gcraStepInto(
  out: GcraDecisionScratch,
  tat: bigint,
  now: bigint,
  intervalNs: bigint,
  window: bigint,
  hits: bigint,
): GcraDecisionScratch {
  const base = tat > now ? tat : now;
  const debt = base - now;
  if (hits === 0n) {
    out.allowed = true;
    out.tat = tat;
    out.remaining = Number((window - debt) / intervalNs);
    out.resetNs = debt;
    out.retryAfterNs = 0n;
    return out;
  }
  const next = base + (hits === 1n ? intervalNs : hits * intervalNs);
  const nextDebt = next - now;
  if (nextDebt <= window) {
    out.allowed = true;
    out.tat = next;
    out.remaining = Number((window - nextDebt) / intervalNs);
    out.resetNs = nextDebt;
    out.retryAfterNs = 0n;
    return out;
  }
  out.allowed = false;
  out.tat = tat;
  out.remaining = debt >= window ? 0 : Number((window - debt) / intervalNs);
  out.resetNs = debt;
  // hits·T > D ⇔ hits > burst: never.
  out.retryAfterNs = nextDebt - debt > window ? NEVER_NS : nextDebt - window;
  return out;
}

/**
 * Largest D = T·b, and largest debt, for which gcraStepNumber is exact: 2^52 ns (≈ 52 days). Every
 * value it computes then stays at or below 2^53, where a double holds every integer.
 */
export const NUMBER_STEP_MAX_NS = 2 ** 52;

/** gcraStepNumber's answer: GcraDecision on numbers, with the debt after the call in place of the TAT. */
export interface GcraNumberDecision {
  allowed: boolean;
  /** TAT − now after this call (the caller stores now + nextDebt when allowed with hits > 0). */
  nextDebt: number;
  remaining: number;
  resetNs: number;
  /** 0 when allowed; Infinity for "never" (NEVER_NS in gcraStep). */
  retryAfterNs: number;
}

export function newGcraNumberScratch(): GcraNumberDecision {
  return { allowed: false, nextDebt: 0, remaining: 0, resetNs: 0, retryAfterNs: 0 };
}

/**
 * gcraStepInto on numbers, for a bucket that owes `debt` = max(TAT − now, 0) ns: the hot path's
 * arithmetic, with no BigInt (V8 allocates every BigInt value). Exact — the same answers as
 * gcraStepInto, field for field — when 0 ≤ debt ≤ NUMBER_STEP_MAX_NS, intervalNs ≥ 1, window =
 * intervalNs·burst ≤ NUMBER_STEP_MAX_NS and hits is a safe integer ≥ 0: a sum or difference of two
 * such integers stays ≤ 2^53, and hits·T is only formed when hits ≤ burst (≤ D). A quotient of two
 * integers below 2^52 rounds to a double whose floor (trunc) is the integer quotient's. Callers
 * outside that domain use gcraStepInto (bucket-table.ts does; test/cell-agent/buckets/gcra.test.ts
 * compares the two).
 */
export function gcraStepNumber(
  out: GcraNumberDecision,
  debt: number,
  intervalNs: number,
  window: number,
  burst: number,
  hits: number,
): GcraNumberDecision {
  if (hits === 0) {
    out.allowed = true;
    out.nextDebt = debt;
    // bigint division truncates toward zero: with a clock reading older than the TAT's writer's,
    // debt may exceed the window and the level is negative.
    const level = Math.trunc((window - debt) / intervalNs);
    out.remaining = level === 0 ? 0 : level; // never −0
    out.resetNs = debt;
    out.retryAfterNs = 0;
    return out;
  }
  if (hits <= burst) {
    const nextDebt = debt + (hits === 1 ? intervalNs : hits * intervalNs);
    if (nextDebt <= window) {
      out.allowed = true;
      out.nextDebt = nextDebt;
      out.remaining = Math.floor((window - nextDebt) / intervalNs);
      out.resetNs = nextDebt;
      out.retryAfterNs = 0;
      return out;
    }
    out.retryAfterNs = nextDebt - window;
  } else {
    // hits·T > D ⇔ hits > burst: never.
    out.retryAfterNs = Infinity;
  }
  out.allowed = false;
  out.nextDebt = debt;
  out.remaining = debt >= window ? 0 : Math.floor((window - debt) / intervalNs);
  out.resetNs = debt;
  return out;
}

const BLOCKED_DECISION_BASE = { allowed: false, remaining: 0, resetNs: 0n, retryAfterNs: NEVER_NS } as const;

/**
 * Take `hits` tokens at `nowNs` from a bucket whose state is `tat` under `params`. The caller stores
 * the returned `tat` (compare-and-swap in the shared table). Rate 0: always refused.
 */
export function gcraTake(tat: bigint, nowNs: bigint, params: GcraParams, hits: number | bigint = 1n): GcraDecision {
  const n = typeof hits === 'bigint' ? hits : BigInt(hits);
  if (n < 0n) throw new RangeError('hits must be ≥ 0');
  if (isBlocked(params)) return { ...BLOCKED_DECISION_BASE, tat };
  return gcraStep(tat, nowNs, params.intervalNs, params.windowNs, n);
}

/**
 * The TAT of a bucket that has no state yet. 'full': TAT = now (level b). 'empty': the bucket was
 * empty at `emptySinceNs` (by default now; the shared table passes its creation time) and has
 * refilled since: TAT = min(now, emptySince) + D.
 */
export function gcraInitialTat(limit: GcraLimit, nowNs: bigint, emptySinceNs: bigint = nowNs): bigint {
  if (limit.start === 'full' || isBlocked(limit)) return nowNs;
  return (emptySinceNs < nowNs ? emptySinceNs : nowNs) + limit.windowNs;
}

/**
 * Re-interpret a TAT kept under `from` for the limit `to`, at `nowNs`, preserving the bucket's
 * LEVEL (tokens available now) rather than the raw TAT:
 *   level L = b − debt/T (debt = max(TAT − now, 0)),  new level L' = min(L, b'),
 *   new debt = (b' − L')·T'  ⇒  TAT' = now + ceil(max((b' − b)·T + debt, 0) · T' / T).
 * So a rate change neither creates nor destroys tokens, a shrunk burst is clamped at once (never more
 * than b' tokens), and a grown burst adds no tokens (they refill at the new rate). Rounding is up
 * (more debt). Switching to rate 0 empties the bucket; switching away from rate 0 starts empty.
 * (Keeping the raw TAT instead would hand out tokens when the rate drops: the same debt in ns is
 * fewer tokens at a longer T.)
 */
export function gcraReconfigure(tat: bigint, nowNs: bigint, from: GcraParams, to: GcraParams): bigint {
  if (isBlocked(to)) return nowNs;
  if (isBlocked(from)) return nowNs + to.windowNs;
  if (from.intervalNs === to.intervalNs && from.burst === to.burst) return tat;
  const debt = tat > nowNs ? tat - nowNs : 0n;
  const owed = (to.burst - from.burst) * from.intervalNs + debt; // (b' − L')·T, in old ns
  if (owed <= 0n) return nowNs;
  const newDebt = ceilDiv(owed * to.intervalNs, from.intervalNs);
  const cap = to.windowNs;
  return nowNs + (newDebt < cap ? newDebt : cap);
}

/** Level (whole tokens) of a bucket at now: floor((D − debt)/T), 0 for rate 0. */
export function gcraLevel(tat: bigint, nowNs: bigint, params: GcraParams): number {
  if (isBlocked(params)) return 0;
  const debt = tat > nowNs ? tat - nowNs : 0n;
  const window = params.windowNs;
  return debt >= window ? 0 : Number((window - debt) / params.intervalNs);
}
