// Decision statistics shared across threads without messages: one SharedArrayBuffer with a region
// per thread (worker i at region i, the main thread's HTTP API at the last one). Each region has
// exactly one writer, so counting is a plain Float64 add on memory no other core writes (no
// contended cache lines, no atomics on the hot path); the main thread sums the regions when
// Prometheus scrapes. Regions are padded to 64-byte multiples.
//
// Words of a region (all counters only grow):
//   decisions[verdict][scope]      verdict ok | over_limit | degraded, scope local | global
//   latency histogram              LATENCY_BUCKETS_S buckets (non-cumulative) + overflow, sum (s), count
//   fail_open[reason]              overload | error | table_full
//   rejected[reason]               invalid (bounds, empty domain / descriptors) | malformed (undecodable)
//   static_slice                   answers decided on a static slice of a global quota
//   overload_refused[reason]       refused on the overload path: allowance (the key's fail-open
//                                  allowance was spent) | shed (refused before decoding)
//   overload_ms, overload_episodes the time this thread was overloaded (ended episodes) and how often
//   overloaded_now                 1 while this thread is in an overload episode
import type { ElapsedClock } from '../buckets/elapsed-clock.js';
import type { OverloadEpisodes } from './lag-guard.js';

export const VERDICTS = ['ok', 'over_limit', 'degraded'] as const;
export type Verdict = (typeof VERDICTS)[number];
export const SCOPES = ['local', 'global'] as const;
export type Scope = (typeof SCOPES)[number];
export const FAIL_OPEN_REASONS = ['overload', 'error', 'table_full'] as const;
export type FailOpenReason = (typeof FAIL_OPEN_REASONS)[number];
export const REJECT_REASONS = ['invalid', 'malformed'] as const;
export type RejectReason = (typeof REJECT_REASONS)[number];
export const OVERLOAD_REFUSAL_REASONS = ['allowance', 'shed'] as const;
export type OverloadRefusalReason = (typeof OVERLOAD_REFUSAL_REASONS)[number];

/** Upper bounds (seconds) of the decision latency histogram. */
export const LATENCY_BUCKETS_S: readonly number[] = Object.freeze([
  0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1,
]);

/**
 * LATENCY_BUCKETS_S as a plain array for count(): an indexed read of a frozen array is a generic
 * keyed-load call in Node 20's optimized code (~70 instructions, on every decision), a plain one inlined.
 */
const LATENCY_BOUNDS_S: number[] = [...LATENCY_BUCKETS_S];

const W_DECISIONS = 0;
const W_LATENCY = W_DECISIONS + VERDICTS.length * SCOPES.length;
const W_LATENCY_SUM = W_LATENCY + LATENCY_BUCKETS_S.length + 1;
const W_LATENCY_COUNT = W_LATENCY_SUM + 1;
const W_FAIL_OPEN = W_LATENCY_COUNT + 1;
const W_REJECTED = W_FAIL_OPEN + FAIL_OPEN_REASONS.length;
const W_STATIC = W_REJECTED + REJECT_REASONS.length;
const W_OVERLOAD_REFUSED = W_STATIC + 1;
const W_OVERLOAD_MS = W_OVERLOAD_REFUSED + OVERLOAD_REFUSAL_REASONS.length;
const W_OVERLOAD_EPISODES = W_OVERLOAD_MS + 1;
const W_OVERLOADED_NOW = W_OVERLOAD_EPISODES + 1;
const WORDS_USED = W_OVERLOADED_NOW + 1;
const REGION_WORDS = Math.ceil(WORDS_USED / 8) * 8;

export interface StatsShared {
  readonly buffer: SharedArrayBuffer;
  readonly regions: number;
}

export function createStatsShared(regions: number): StatsShared {
  return Object.freeze({ buffer: new SharedArrayBuffer(regions * REGION_WORDS * 8), regions });
}

/** One thread's writer over its region (also the lag guard's episode sink). */
export class StatsWriter implements OverloadEpisodes {
  private readonly w: Float64Array;
  /** The latency being counted (s), passed in memory rather than as an argument. */
  private readonly latency = new Float64Array(1);

  constructor(shared: StatsShared, region: number) {
    if (!Number.isInteger(region) || region < 0 || region >= shared.regions)
      throw new RangeError(`stats region ${region} out of range`);
    this.w = new Float64Array(shared.buffer, region * REGION_WORDS * 8, REGION_WORDS);
  }

  decision(verdict: Verdict, scope: Scope, seconds: number): void {
    this.latency[0] = seconds;
    this.count(verdict, scope);
  }

  /**
   * decision() with the latency from `started[0]` to a reading of `clock` taken now (ns on the
   * clock's line): no time crosses a call as a number (a boxed double: an allocation per check).
   */
  decisionSince(verdict: Verdict, scope: Scope, clock: ElapsedClock, started: Float64Array): void {
    clock.read();
    this.latency[0] = ((clock.elapsed[0] as number) - (started[0] as number)) / 1e9;
    this.count(verdict, scope);
  }

  /** Counts a decision of latency this.latency[0] s. */
  private count(verdict: Verdict, scope: Scope): void {
    const seconds = this.latency[0] as number;
    const w = this.w;
    // (The verdict's index without VERDICTS.indexOf: a builtin call on every decision.)
    const v = verdict === 'ok' ? 0 : verdict === 'over_limit' ? 1 : 2;
    w[W_DECISIONS + v * SCOPES.length + (scope === 'global' ? 1 : 0)]! += 1;
    let b = 0;
    const bounds = LATENCY_BOUNDS_S;
    while (b < bounds.length && seconds > (bounds[b] as number)) b++;
    w[W_LATENCY + b]! += 1;
    w[W_LATENCY_SUM]! += seconds;
    w[W_LATENCY_COUNT]! += 1;
  }

  failOpen(reason: FailOpenReason): void {
    this.w[W_FAIL_OPEN + FAIL_OPEN_REASONS.indexOf(reason)]! += 1;
  }

  rejected(reason: RejectReason): void {
    this.w[W_REJECTED + REJECT_REASONS.indexOf(reason)]! += 1;
  }

  staticSlice(): void {
    this.w[W_STATIC]! += 1;
  }

  overloadRefused(reason: OverloadRefusalReason): void {
    this.w[W_OVERLOAD_REFUSED + (reason === 'shed' ? 1 : 0)]! += 1;
  }

  overloadStarted(): void {
    this.w[W_OVERLOADED_NOW] = 1;
  }

  overloadEnded(durationMs: number): void {
    const w = this.w;
    w[W_OVERLOADED_NOW] = 0;
    w[W_OVERLOAD_MS]! += durationMs;
    w[W_OVERLOAD_EPISODES]! += 1;
  }
}

export interface StatsTotals {
  readonly decisions: Readonly<Record<Verdict, Readonly<Record<Scope, number>>>>;
  /** Non-cumulative counts per LATENCY_BUCKETS_S bucket, then the overflow bucket. */
  readonly latencyBuckets: readonly number[];
  readonly latencySum: number;
  readonly latencyCount: number;
  readonly failOpen: Readonly<Record<FailOpenReason, number>>;
  readonly rejected: Readonly<Record<RejectReason, number>>;
  readonly staticSlice: number;
  readonly overloadRefused: Readonly<Record<OverloadRefusalReason, number>>;
  /** Summed over threads: ended overload episodes, their time (ms), threads in an episode now. */
  readonly overloadMs: number;
  readonly overloadEpisodes: number;
  readonly overloadedNow: number;
}

/** Sums every region (the main thread, at scrape time). */
export function readStats(shared: StatsShared): StatsTotals {
  const all = new Float64Array(shared.buffer);
  const sum = (word: number): number => {
    let s = 0;
    for (let r = 0; r < shared.regions; r++) s += all[r * REGION_WORDS + word] ?? 0;
    return s;
  };
  const decisions = {} as Record<Verdict, Record<Scope, number>>;
  VERDICTS.forEach((v, vi) => {
    decisions[v] = { local: sum(W_DECISIONS + vi * SCOPES.length), global: sum(W_DECISIONS + vi * SCOPES.length + 1) };
  });
  const failOpen = {} as Record<FailOpenReason, number>;
  FAIL_OPEN_REASONS.forEach((r, i) => {
    failOpen[r] = sum(W_FAIL_OPEN + i);
  });
  const rejected = {} as Record<RejectReason, number>;
  REJECT_REASONS.forEach((r, i) => {
    rejected[r] = sum(W_REJECTED + i);
  });
  const overloadRefused = {} as Record<OverloadRefusalReason, number>;
  OVERLOAD_REFUSAL_REASONS.forEach((r, i) => {
    overloadRefused[r] = sum(W_OVERLOAD_REFUSED + i);
  });
  return {
    decisions,
    latencyBuckets: Array.from({ length: LATENCY_BUCKETS_S.length + 1 }, (_, b) => sum(W_LATENCY + b)),
    latencySum: sum(W_LATENCY_SUM),
    latencyCount: sum(W_LATENCY_COUNT),
    failOpen,
    rejected,
    staticSlice: sum(W_STATIC),
    overloadRefused,
    overloadMs: sum(W_OVERLOAD_MS),
    overloadEpisodes: sum(W_OVERLOAD_EPISODES),
    overloadedNow: sum(W_OVERLOADED_NOW),
  };
}
