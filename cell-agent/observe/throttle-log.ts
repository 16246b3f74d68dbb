// Throttling is logged in aggregate: per bucket key, how many hits were refused in the interval, one
// line per key per interval — never one line per request (a refused flood must not become a log
// flood). Every deciding thread counts into its own ThrottleCounts; workers post theirs to the main
// thread (at most every second, only when there is something), and the main thread's ThrottleLog
// merges them and writes the lines every interval.
//
// The overload path counts here too, without building a string per answer (the keys are the
// matched levels' own strings): refusals on the overload path per key (logged as `throttled` with
// refusedBy `overload`), and answers given fail-open per reason and quota key (logged as `answered
// fail-open`, and kept as running totals for cellquota_agent_quota_fail_open_total). With
// `overloadStats`, each interval also logs one `overloaded` line: how long the serving threads were
// overloaded in it and how many episodes ended.
import type { Logger } from '../../shared/logging.js';
import { decidedOnText, type Refusal } from '../messages/refusal.js';
import { FAIL_OPEN_REASONS, type FailOpenReason } from './stats.js';

// Counts are kept per key AND provenance (which level refused, on a lease with its epoch, a floor or
// a static share), so one line says why; the cell is the log's own. A thread counts them per
// provenance, then per key (no string is joined per refusal: a local level's provenance is its
// level's constant name); the drain joins each key and its provenance by SEP.
const SEP = '\u0001';

/** Distinct keys one thread tracks per interval; refusals for further keys are counted as `other`. */
export const MAX_THROTTLE_KEYS = 10_000;
/** Lines written per interval; the rest is summed into one line. */
export const MAX_THROTTLE_LINES = 100;
/** Quota keys with a running fail-open total per reason (the metric's label values); the rest count as OTHER_KEYS. */
export const MAX_FAIL_OPEN_QUOTAS = 1000;
export const OTHER_KEYS = '(other keys)';
/** The quota of a fail-open answer given without matching (an internal error, the open overload policy). */
export const UNMATCHED_QUOTA = '(not matched)';

/** What a thread's counts drain to (posted from a worker to the main thread). */
export interface ThrottleDrain {
  readonly counts: [string, number][];
  readonly other: number;
  /** Refusals on the overload path, per key. */
  readonly overload?: [string, number][];
  /** Answers given fail-open: [reason, quota key, count]. */
  readonly failOpen?: [FailOpenReason, string, number][];
}

function bump(map: Map<string, number>, key: string, n: number, max: number): boolean {
  const c = map.get(key);
  if (c !== undefined) map.set(key, c + n);
  else if (map.size < max) map.set(key, n);
  else return false;
  return true;
}

export class ThrottleCounts {
  /** Refused hits per provenance ('' for a key counted without one: a drain merged) and key. */
  private counts = new Map<string, Map<string, number>>();
  /** Keys in `counts`, over every provenance. */
  private keys = 0;
  private other = 0;
  private overload = new Map<string, number>();
  private failOpen: Map<string, number>[] = FAIL_OPEN_REASONS.map(() => new Map<string, number>());

  add(bucketOrQuotaKey: string, hits: number, why?: Refusal): void {
    const provenance =
      why === undefined ? '' : why.decidedOn === null ? why.level : `${why.level}${SEP}${decidedOnText(why)}`;
    const n = hits > 0 ? hits : 1;
    let byKey = this.counts.get(provenance);
    if (byKey === undefined) {
      byKey = new Map<string, number>();
      this.counts.set(provenance, byKey);
    }
    const c = byKey.get(bucketOrQuotaKey);
    if (c !== undefined) {
      byKey.set(bucketOrQuotaKey, c + n);
    } else if (this.keys < MAX_THROTTLE_KEYS) {
      byKey.set(bucketOrQuotaKey, n);
      this.keys++;
    } else {
      this.other += n;
    }
  }

  /** A refusal on the overload path (the key's fail-open allowance spent). */
  addOverload(key: string, hits: number): void {
    if (!bump(this.overload, key, hits > 0 ? hits : 1, MAX_THROTTLE_KEYS)) this.other += hits > 0 ? hits : 1;
  }

  /** An answer given fail-open, under one quota key (or UNMATCHED_QUOTA). */
  addFailOpen(reason: FailOpenReason, key: string, n = 1): void {
    const map = this.failOpen[FAIL_OPEN_REASONS.indexOf(reason)] as Map<string, number>;
    if (!bump(map, key, n, MAX_THROTTLE_KEYS)) bump(map, OTHER_KEYS, n, Number.POSITIVE_INFINITY);
  }

  /** The counts so far, and a fresh start. */
  drain(): ThrottleDrain {
    const failOpen: [FailOpenReason, string, number][] = [];
    FAIL_OPEN_REASONS.forEach((reason, i) => {
      const map = this.failOpen[i] as Map<string, number>;
      for (const [key, n] of map) failOpen.push([reason, key, n]);
      if (map.size > 0) this.failOpen[i] = new Map();
    });
    const counts: [string, number][] = [];
    for (const [provenance, byKey] of this.counts) {
      for (const [key, n] of byKey) counts.push([provenance === '' ? key : `${key}${SEP}${provenance}`, n]);
    }
    const out: ThrottleDrain = { counts, other: this.other, overload: [...this.overload], failOpen };
    this.counts = new Map();
    this.keys = 0;
    this.other = 0;
    if (this.overload.size > 0) this.overload = new Map();
    return out;
  }

  get empty(): boolean {
    return this.keys === 0 && this.other === 0 && this.overload.size === 0 && this.failOpen.every((m) => m.size === 0);
  }
}

/** The overload figures the log reads each interval (running totals over every thread). */
export interface OverloadTotals {
  readonly overloadMs: number;
  readonly overloadEpisodes: number;
  readonly overloadRefused: number;
  readonly failOpenOverload: number;
}

export class ThrottleLog {
  private readonly merged = new ThrottleCounts();
  private timer: NodeJS.Timeout | null = null;
  private readonly failOpenTotals: Map<string, number>[] = FAIL_OPEN_REASONS.map(() => new Map<string, number>());
  private lastOverload: OverloadTotals | null = null;

  constructor(
    private readonly logger: Logger,
    private readonly cell: string,
    readonly intervalMs: number,
    private readonly overloadStats: (() => OverloadTotals) | null = null,
  ) {
    this.lastOverload = overloadStats?.() ?? null;
  }

  /** Adds a thread's drained counts. */
  merge(part: ThrottleDrain): void {
    for (const [key, n] of part.counts) this.merged.add(key, n);
    if (part.other > 0) this.merged.add(OTHER_KEYS, part.other);
    for (const [key, n] of part.overload ?? []) this.merged.addOverload(key, n);
    for (const [reason, key, n] of part.failOpen ?? []) {
      this.merged.addFailOpen(reason, key, n);
      const totals = this.failOpenTotals[FAIL_OPEN_REASONS.indexOf(reason)] as Map<string, number>;
      if (!bump(totals, key, n, MAX_FAIL_OPEN_QUOTAS)) bump(totals, OTHER_KEYS, n, Number.POSITIVE_INFINITY);
    }
  }

  /** Running totals of answers given fail-open, per reason and quota key (what the metric shows). */
  failOpenByQuota(): { reason: FailOpenReason; quota: string; count: number }[] {
    const out: { reason: FailOpenReason; quota: string; count: number }[] = [];
    FAIL_OPEN_REASONS.forEach((reason, i) => {
      for (const [quota, count] of this.failOpenTotals[i] as Map<string, number>) out.push({ reason, quota, count });
    });
    return out;
  }

  start(local: ThrottleCounts): void {
    if (this.timer !== null) return;
    this.timer = setInterval(() => {
      this.merge(local.drain());
      this.flush();
    }, this.intervalMs);
    this.timer.unref();
  }

  stop(local: ThrottleCounts | null): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    if (local !== null) this.merge(local.drain());
    this.flush();
  }

  /** Writes one line per key (the most refused first, at most MAX_THROTTLE_LINES) and resets. */
  flush(): void {
    this.flushOverload();
    if (this.merged.empty) return;
    const { counts, other, overload = [], failOpen = [] } = this.merged.drain();
    overload.sort((a, b) => b[1] - a[1]);
    for (const [key, refused] of overload.slice(0, MAX_THROTTLE_LINES)) {
      this.logger.info(
        { key, refused, refusedBy: 'overload', cell: this.cell, intervalMs: this.intervalMs },
        'throttled',
      );
    }
    failOpen.sort((a, b) => b[2] - a[2]);
    for (const [reason, key, n] of failOpen.slice(0, MAX_THROTTLE_LINES)) {
      this.logger.warn(
        { key, failOpen: n, reason, cell: this.cell, intervalMs: this.intervalMs },
        'answered fail-open',
      );
    }
    counts.sort((a, b) => b[1] - a[1]);
    const shown = counts.slice(0, MAX_THROTTLE_LINES);
    for (const [composite, refused] of shown) {
      const [key, level, decidedOn] = composite.split(SEP);
      this.logger.info(
        {
          key,
          refused,
          ...(level === undefined ? {} : { refusedBy: level }),
          ...(decidedOn === undefined || decidedOn === '' ? {} : { decidedOn }),
          cell: this.cell,
          intervalMs: this.intervalMs,
        },
        'throttled',
      );
    }
    const rest = counts.slice(MAX_THROTTLE_LINES).reduce((s, [, n]) => s + n, 0) + other;
    if (rest > 0) {
      this.logger.info(
        { keys: counts.length - shown.length, refused: rest, cell: this.cell, intervalMs: this.intervalMs },
        'throttled (other keys)',
      );
    }
  }

  /** One `overloaded` line when the serving threads were overloaded since the last one. */
  private flushOverload(): void {
    if (this.overloadStats === null) return;
    const now = this.overloadStats();
    const last = this.lastOverload ?? now;
    this.lastOverload = now;
    const ms = now.overloadMs - last.overloadMs;
    const episodes = now.overloadEpisodes - last.overloadEpisodes;
    const refused = now.overloadRefused - last.overloadRefused;
    const failOpen = now.failOpenOverload - last.failOpenOverload;
    if (ms <= 0 && episodes <= 0 && refused <= 0 && failOpen <= 0) return;
    this.logger.warn(
      { overloadedMs: Math.round(ms), episodes, refused, failOpen, cell: this.cell, intervalMs: this.intervalMs },
      'overloaded',
    );
  }
}
