// Throttling is logged in aggregate: per bucket key, how many hits were refused in the interval, one
// line per key per interval — never one line per request (a refused flood must not become a log
// flood). Every deciding thread counts into its own ThrottleCounts; workers post theirs to the main
// thread every interval, and the main thread's ThrottleLog merges them and writes the lines.
import type { Logger } from '../../shared/logging.js';
import { decidedOnText, type Refusal } from '../decide/decide.js';

// Counts are kept per key AND provenance (which level refused, on a lease with its epoch, a floor or
// a static share), joined by SEP, so one line says why; the cell is the log's own.
const SEP = '\u0001';

/** Distinct keys one thread tracks per interval; refusals for further keys are counted as `other`. */
export const THROTTLE_KEYS_MAX = 10_000;
/** Lines written per interval; the rest is summed into one line. */
export const THROTTLE_LINES_MAX = 100;

export class ThrottleCounts {
  private counts = new Map<string, number>();
  private other = 0;

  add(bucketOrQuotaKey: string, hits: number, why?: Refusal): void {
    const key = why === undefined ? bucketOrQuotaKey : `${bucketOrQuotaKey}${SEP}${why.level}${SEP}${decidedOnText(why) ?? ''}`;
    const n = hits > 0 ? hits : 1;
    const c = this.counts.get(key);
    if (c !== undefined) this.counts.set(key, c + n);
    else if (this.counts.size < THROTTLE_KEYS_MAX) this.counts.set(key, n);
    else this.other += n;
  }

  /** The counts so far, and a fresh start. */
  drain(): { counts: [string, number][]; other: number } {
    const out = { counts: [...this.counts], other: this.other };
    this.counts = new Map();
    this.other = 0;
    return out;
  }

  get empty(): boolean {
    return this.counts.size === 0 && this.other === 0;
  }
}

export class ThrottleLog {
  private readonly merged = new ThrottleCounts();
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly logger: Logger, private readonly cell: string, readonly intervalMs: number) {}

  /** Adds a thread's drained counts. */
  merge(part: { counts: readonly (readonly [string, number])[]; other: number }): void {
    for (const [key, n] of part.counts) this.merged.add(key, n);
    if (part.other > 0) this.merged.add('(other keys)', part.other);
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

  /** Writes one line per key (the most refused first, at most THROTTLE_LINES_MAX) and resets. */
  flush(): void {
    if (this.merged.empty) return;
    const { counts, other } = this.merged.drain();
    counts.sort((a, b) => b[1] - a[1]);
    const shown = counts.slice(0, THROTTLE_LINES_MAX);
    for (const [composite, refused] of shown) {
      const [key, level, decidedOn] = composite.split(SEP);
      this.logger.info({ key, refused, ...(level === undefined ? {} : { refusedBy: level }), ...(decidedOn === undefined || decidedOn === '' ? {} : { decidedOn }), cell: this.cell, intervalMs: this.intervalMs }, 'throttled');
    }
    const rest = counts.slice(THROTTLE_LINES_MAX).reduce((s, [, n]) => s + n, 0) + other;
    if (rest > 0) {
      this.logger.info({ keys: counts.length - shown.length, refused: rest, cell: this.cell, intervalMs: this.intervalMs }, 'throttled (other keys)');
    }
  }
}
