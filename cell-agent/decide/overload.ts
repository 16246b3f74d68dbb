// What a serving thread answers while it is overloaded (observe/lag-guard.ts says when).
//
// `--overload-policy open` (the behaviour before issue 15, kept for comparison): every check is
// answered OK at once, without matching or buckets — the moment a flood saturates the thread, every
// limit is off.
//
// `--overload-policy bounded` (default): the check is matched (the levels it must pass, as a
// decision would find them), but no level's bucket is read or charged and no answer is built: each
// level has a **fail-open allowance**, its own small bucket in the shared table (`~f|<bucket key>`,
// so every thread of the cell spends one allowance together), refilling at
//     a = --overload-allowance × (a global quota's floor — the floor stamped on its grant, or the
//         static share or slice in force when it has none — or a local rule's / override's rate)
// with a depth of one second of it (at least one token). If every level holds its hits, the check is
// answered OK fail-open (`x-ratelimit-fail-open: true`, counted per reason and quota key); otherwise
// it is refused at once with a constant OVER_LIMIT answer (`x-ratelimit-refused-by: overload`). So
// while overloaded a key admits at most a·t + its depth beyond what its buckets admit, whatever the
// flood: the term the bound gains (docs/quota-model.md "The bound"). Global allowances start empty,
// like the global buckets (a restart releases no burst of them); local ones start full, like local
// buckets. A denied unknown tenant, a pending key (no grant yet: floor 0) and a full table have no
// allowance. Shadow levels are skipped (they never refuse); quota mode is not applied here (every
// level must pass: stricter, never looser). A request with no level to bound (no rule matched,
// unlimited) is decided normally: that costs no bucket either.
//
// `--overload-allowance 0`: no fail-open at all; every check that arrives while the thread is
// overloaded is refused before its message is even decoded (the lean RLS server answers a constant
// message as soon as the stream's headers are in).
//
// Cheap on purpose: the levels are iterated once into a reused array, the limits are cached per
// rate, the answer is a constant (check-service.ts), nothing is logged per request (counts only).
import { MAX_GCRA_WINDOW_S } from '../../shared/gcra-window.js';
import type { BucketTable } from '../buckets/bucket-table.js';
import { limitFromRate } from '../buckets/gcra.js';
import type { GcraLimit, StartPolicy } from '../buckets/gcra.js';
import type { PlannedLevel } from './decide.js';

export const OVERLOAD_POLICIES = ['bounded', 'open'] as const;
export type OverloadPolicy = (typeof OVERLOAD_POLICIES)[number];

export interface OverloadOptions {
  readonly policy: OverloadPolicy;
  /** Factor on each level's allowance basis (floor or rule rate), ≥ 0; 0: refuse everything in overload. */
  readonly allowance: number;
}

export const DEFAULT_OVERLOAD: OverloadOptions = Object.freeze({ policy: 'bounded', allowance: 1 });
/** Largest --overload-allowance factor (beyond it the "allowance" would be no bound worth the name). */
export const MAX_OVERLOAD_ALLOWANCE = 10;

/** The allowance bucket of a level's bucket key. */
export function allowanceKey(bucketKey: string): string {
  return `~f|${bucketKey}`;
}

/** The allowance limit for a basis rate (tokens/s) and factor: rate·factor, one second deep (≥ 1 token). */
export function allowanceLimit(basisRate: number, factor: number, start: StartPolicy): GcraLimit {
  const rate = basisRate * factor;
  // A rate so small that one token takes longer than the table's longest window: no allowance.
  if (!(rate > 0) || !Number.isFinite(rate) || 1 / rate > MAX_GCRA_WINDOW_S) return limitFromRate(0, 0, { start });
  return limitFromRate(rate, Math.max(1, Math.floor(rate)), { start });
}

export type OverloadVerdict = 'admit' | 'refuse' | 'decide';

/** Told which keys an overload answer concerned (the throttling log and the per-quota metric). */
export interface OverloadSink {
  /** Admitted fail-open: once per level, under its quota key (global) or bucket key (local). */
  failOpen(key: string): void;
  /** Refused on the overload path: the first level without allowance. */
  refused(key: string, hits: number): void;
}

const MAX_LIMIT_CACHE = 4096;

/** One thread's overload allowances over the shared bucket table. */
export class OverloadAllowances {
  private readonly limits: [Map<number, GcraLimit>, Map<number, GcraLimit>] = [
    new Map<number, GcraLimit>(),
    new Map<number, GcraLimit>(),
  ];
  private readonly scratch: PlannedLevel[] = [];

  constructor(
    readonly factor: number,
    private readonly table: BucketTable,
    private readonly sink: OverloadSink | null = null,
  ) {
    if (!(factor >= 0) || factor > MAX_OVERLOAD_ALLOWANCE)
      throw new RangeError(`overload allowance factor ${factor} is not in [0, ${MAX_OVERLOAD_ALLOWANCE}]`);
  }

  private limitOf(level: PlannedLevel): GcraLimit {
    const start: StartPolicy = level.scope === 'global' ? 'empty' : 'full';
    const cache = this.limits[start === 'full' ? 0 : 1];
    let limit = cache.get(level.allowanceRate);
    if (limit === undefined) {
      limit = allowanceLimit(level.allowanceRate, this.factor, start);
      if (cache.size >= MAX_LIMIT_CACHE) cache.clear();
      cache.set(level.allowanceRate, limit);
    }
    return limit;
  }

  /**
   * Admit the check fail-open (every level holds its hits in its allowance: taken), refuse it, or
   * 'decide' when it has no level to bound. All or nothing across levels, as a decision is: checked
   * first, then taken (a race with another thread can only make a take fail: refused, admitting less).
   */
  admit(levels: Iterable<PlannedLevel>, nowNs: bigint): OverloadVerdict {
    const bounded = this.scratch;
    bounded.length = 0;
    for (const level of levels) if (!level.shadow) bounded.push(level);
    if (bounded.length === 0) return 'decide';
    const table = this.table;
    if (bounded.length === 1) {
      const level = bounded[0] as PlannedLevel;
      if (level.deny || level.allowanceRate <= 0 || this.factor === 0) return this.refuse(level);
      const r = table.take(allowanceKey(level.key), this.limitOf(level), level.hits, nowNs);
      if (r.verdict !== 'allow' || (level.hits === 0 && r.remaining < 1)) return this.refuse(level);
      this.sink?.failOpen(level.quotaKey ?? level.key);
      return 'admit';
    }
    for (const level of bounded) {
      if (level.deny || level.allowanceRate <= 0 || this.factor === 0) return this.refuse(level);
      const r = table.take(allowanceKey(level.key), this.limitOf(level), 0, nowNs);
      if (r.verdict !== 'allow' || r.remaining < (level.hits > 0 ? level.hits : 1)) return this.refuse(level);
    }
    for (const level of bounded) {
      if (level.hits === 0) continue;
      const r = table.take(allowanceKey(level.key), this.limitOf(level), level.hits, nowNs);
      if (r.verdict !== 'allow') return this.refuse(level);
    }
    if (this.sink !== null) for (const level of bounded) this.sink.failOpen(level.quotaKey ?? level.key);
    return 'admit';
  }

  private refuse(level: PlannedLevel): 'refuse' {
    this.sink?.refused(level.quotaKey ?? level.key, level.hits);
    return 'refuse';
  }
}
