// Is this serving thread behind? Envoy gives the rate-limit call 20 ms by default and then lets the
// request through anyway (failure_mode_deny false); a check answered after that is wasted work that
// delays every check queued behind it. While the thread is behind, the check service takes its
// overload path (decide/check-service.ts: under `--overload-policy bounded` at most a per-quota
// allowance is admitted without a decision and the rest is refused at once; under `open` every
// check is answered OK), until it has caught up.
//
// "Behind" is measured with one repeating timer per thread, every `intervalMs` (default 5 ms):
//   - late: the timer fired later than due by more than `thresholdMs` → the event loop was blocked
//     (GC pause, a slow callback, CPU starvation, a flood read in one turn) and the requests that
//     arrived meanwhile have waited that long in the socket buffers, until a tick arrives on time.
//   - stall: a request handled when the timer has not run for more than intervalMs + thresholdMs is
//     being handled inside one long turn of the loop (a burst larger than the thread can serve in
//     time): the requests at the end of the burst are late too.
// Behind is not yet overloaded: a thread is OVERLOADED only when it is behind AND has a backlog —
// more than `backlog` checks (default 64) handled since the last tick. A machine busy with other
// processes deschedules any thread for tens of ms now and then (a loaded 2-core box, a chaos drill's
// six processes, another process's GC): the few checks that queued meanwhile cost microseconds
// each and are decided, not waved through; a real flood fills the turn with far more than 64 checks
// and the rest of that turn takes the overload path. (Before, a single late tick put every check
// until the next on-time tick on the overload path: 57 fail-open answers of 14,107 in a leader-kill
// drill on a machine at load 3.5, 7 to 19 episodes of ~30 ms per agent in 10 s, no backlog.) The
// cost of the first `backlog` checks of a late turn is what the overload path saves from Envoy's
// 20 ms deadline: 64 decisions of ~20 µs.
// All of it is a comparison of clock readings (ms) and a counter; nothing is allocated per request.
// The clock: performance.now(), or, given one, the deciders' ElapsedClock (the agent's threads: the
// check service asks overloadedAt(clock) with the reading the check has just taken for its decision,
// so a check reads the clock once for both, not once more for the guard; the timer's ticks read the
// same clock, so ticks and checks are on one time line). monitorEventLoopDelay would give the same
// drift as a histogram, but only after the fact; the timer gives it at the first turn after a block,
// before the queued requests are read.
//
// Episodes: an overload episode starts when the loop first fell behind (the late tick's due time
// plus the threshold) — counted once a check met the overload there — and ends at the first on-time
// tick; its length goes to `onEpisodeEnd` (the statistics: cellquota_agent_overload_seconds_total),
// its start to `onEpisodeStart`.
import { performance } from 'node:perf_hooks';
import type { ElapsedClock } from '../buckets/elapsed-clock.js';

/** Checks a behind thread still decides per tick before it counts as overloaded (see the header). */
export const DEFAULT_OVERLOAD_BACKLOG = 64;

export interface LagGuardOptions {
  /** Lag beyond which the thread counts as behind (ms). Default 10; 0 disables the guard. */
  readonly thresholdMs?: number;
  /** Timer period (ms). Default 5. */
  readonly intervalMs?: number;
  /**
   * Checks handled since the last tick beyond which a behind thread is overloaded. Default DEFAULT_OVERLOAD_BACKLOG;
   * 0: behind is overloaded.
   */
  readonly backlog?: number;
}

/** Told when overload episodes start and end (the shared statistics). */
export interface OverloadEpisodes {
  overloadStarted(): void;
  overloadEnded(durationMs: number): void;
}

/** What the check service asks: is this thread overloaded now? (LagGuard; the warm-up's constant.) */
export interface OverloadSignal {
  /** At `now` (ms on the signal's own clock), by default read now. */
  overloaded(now?: number): boolean;
  /**
   * At the reading a check has just taken of `clock` (its elapsed[0]) when that is the signal's own
   * clock (no second reading); else as overloaded(), the signal reading its own clock.
   */
  overloadedAt(clock: ElapsedClock): boolean;
}

/** Event-loop lag (ms) beyond which a thread counts as overloaded, unless told otherwise (--lag-threshold-ms). */
export const DEFAULT_LAG_THRESHOLD_MS = 10;

export class LagGuard implements OverloadSignal {
  readonly thresholdMs: number;
  readonly intervalMs: number;
  readonly backlog: number;
  private lastTick: number;
  /** The last tick was late: behind until a tick arrives on time. */
  private late = false;
  /** When the loop fell behind (the late tick's due time plus the threshold). */
  private behindSince = Number.NaN;
  /** Checks asked about since the last tick. */
  private sinceTick = 0;
  /** Start of the current episode (ms), NaN when none. */
  private episodeStart = Number.NaN;
  private timer: NodeJS.Timeout | null = null;
  /** Largest drift seen (ms), for diagnostics. */
  maxDriftMs = 0;

  constructor(
    opts: LagGuardOptions = {},
    private readonly episodes: OverloadEpisodes | null = null,
    /** The clock of the guard's times (its elapsed ns as ms); null: performance.now(). */
    readonly clock: ElapsedClock | null = null,
  ) {
    this.lastTick = this.nowMs();
    this.thresholdMs = opts.thresholdMs ?? DEFAULT_LAG_THRESHOLD_MS;
    this.intervalMs = opts.intervalMs ?? 5;
    this.backlog = opts.backlog ?? DEFAULT_OVERLOAD_BACKLOG;
    if (!(this.thresholdMs >= 0) || !(this.intervalMs > 0) || !Number.isSafeInteger(this.backlog) || this.backlog < 0) {
      throw new RangeError(
        `lag guard: threshold ${this.thresholdMs} ms, interval ${this.intervalMs} ms, backlog ${this.backlog}`,
      );
    }
  }

  get running(): boolean {
    return this.timer !== null;
  }

  start(now = this.nowMs()): void {
    if (this.timer !== null || this.thresholdMs <= 0) return;
    this.lastTick = now;
    this.late = false;
    this.behindSince = Number.NaN;
    this.sinceTick = 0;
    this.timer = setInterval(() => this.tick(), this.intervalMs);
    this.timer.unref();
  }

  stop(now = this.nowMs()): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    this.endEpisode(now);
    this.late = false;
  }

  /** Forgets the lag so far (after a deliberate synchronous phase such as the warm-up). */
  reset(now = this.nowMs()): void {
    this.lastTick = now;
    this.late = false;
    this.behindSince = Number.NaN;
    this.sinceTick = 0;
    this.episodeStart = Number.NaN;
  }

  /** The timer's body (public for tests that drive it). */
  tick(now = this.nowMs()): void {
    const drift = now - this.lastTick - this.intervalMs;
    if (drift > this.maxDriftMs) this.maxDriftMs = drift;
    if (drift > this.thresholdMs) {
      if (!this.late) this.behindSince = this.lastTick + this.intervalMs + this.thresholdMs;
      this.late = true;
    } else {
      this.late = false;
      this.behindSince = Number.NaN;
      this.endEpisode(now);
    }
    this.sinceTick = 0;
    this.lastTick = now;
  }

  /** True when a request handled now should take the overload path (each call counts as one check). */
  overloaded(now = this.nowMs()): boolean {
    if (this.timer === null) return false;
    const checks = ++this.sinceTick;
    if (!this.late) {
      if (now - this.lastTick <= this.intervalMs + this.thresholdMs) return false;
      // A stall noticed before the timer could run: behind since interval + threshold after the last tick.
      if (Number.isNaN(this.behindSince)) this.behindSince = this.lastTick + this.intervalMs + this.thresholdMs;
    }
    // Behind, but only a few checks queued: decided (see the header).
    if (checks <= this.backlog) return false;
    if (Number.isNaN(this.episodeStart)) {
      this.episodeStart = this.behindSince;
      this.episodes?.overloadStarted();
    }
    return true;
  }

  overloadedAt(clock: ElapsedClock): boolean {
    return this.overloaded(clock === this.clock ? (clock.elapsed[0] as number) / 1e6 : this.nowMs());
  }

  /** The guard's clock read now (ms). */
  private nowMs(): number {
    const clock = this.clock;
    if (clock === null) return performance.now();
    clock.read();
    return (clock.elapsed[0] as number) / 1e6;
  }

  private endEpisode(now: number): void {
    if (Number.isNaN(this.episodeStart)) return;
    const ms = Math.max(0, now - this.episodeStart);
    this.episodeStart = Number.NaN;
    this.episodes?.overloadEnded(ms);
  }
}
