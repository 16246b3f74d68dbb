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
//     arrived meanwhile have waited that long in the socket buffers. The thread is overloaded from
//     then until a tick arrives on time again: as soon as the loop turns within the threshold, it
//     has caught up and decides again (no hold beyond that).
//   - stall: a request handled when the timer has not run for more than intervalMs + thresholdMs is
//     being handled inside one long turn of the loop (a burst larger than the thread can serve in
//     time): the requests at the end of the burst are late too.
// Both are a comparison of performance.now() values; nothing is allocated per request.
// monitorEventLoopDelay would give the same drift as a histogram, but only after the fact; the timer
// gives it at the first turn after a block, before the queued requests are read.
//
// Episodes: an overload episode starts when the loop first fell behind (the late tick's due time
// plus the threshold) and ends at the first on-time tick; its length goes to `onEpisodeEnd` (the
// statistics: cellquota_agent_overload_seconds_total), its start to `onEpisodeStart`.
import { performance } from 'node:perf_hooks';

export interface LagGuardOptions {
  /** Lag beyond which the thread counts as behind (ms). Default 10; 0 disables the guard. */
  readonly thresholdMs?: number;
  /** Timer period (ms). Default 5. */
  readonly intervalMs?: number;
}

/** Told when overload episodes start and end (the shared statistics). */
export interface OverloadEpisodes {
  overloadStarted(): void;
  overloadEnded(durationMs: number): void;
}

/** What the check service asks: is this thread overloaded now? (LagGuard; the warm-up's constant.) */
export interface OverloadSignal {
  overloaded(now?: number): boolean;
}

export class LagGuard implements OverloadSignal {
  readonly thresholdMs: number;
  readonly intervalMs: number;
  private lastTick = performance.now();
  /** The last tick was late: overloaded until a tick arrives on time. */
  private late = false;
  /** Start of the current episode (ms), NaN when none. */
  private episodeStart = Number.NaN;
  private timer: NodeJS.Timeout | null = null;
  /** Largest drift seen (ms), for diagnostics. */
  maxDriftMs = 0;

  constructor(opts: LagGuardOptions = {}, private readonly episodes: OverloadEpisodes | null = null) {
    this.thresholdMs = opts.thresholdMs ?? 10;
    this.intervalMs = opts.intervalMs ?? 5;
    if (!(this.thresholdMs >= 0) || !(this.intervalMs > 0)) throw new RangeError(`lag guard: threshold ${this.thresholdMs} ms, interval ${this.intervalMs} ms`);
  }

  get running(): boolean {
    return this.timer !== null;
  }

  start(now = performance.now()): void {
    if (this.timer !== null || this.thresholdMs <= 0) return;
    this.lastTick = now;
    this.late = false;
    this.timer = setInterval(() => this.tick(), this.intervalMs);
    this.timer.unref();
  }

  stop(now = performance.now()): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    this.endEpisode(now);
    this.late = false;
  }

  /** Forgets the lag so far (after a deliberate synchronous phase such as the warm-up). */
  reset(now = performance.now()): void {
    this.lastTick = now;
    this.late = false;
    this.episodeStart = Number.NaN;
  }

  /** The timer's body (public for tests that drive it). */
  tick(now = performance.now()): void {
    const drift = now - this.lastTick - this.intervalMs;
    if (drift > this.maxDriftMs) this.maxDriftMs = drift;
    if (drift > this.thresholdMs) {
      this.late = true;
      if (Number.isNaN(this.episodeStart)) {
        this.episodeStart = this.lastTick + this.intervalMs + this.thresholdMs;
        this.episodes?.overloadStarted();
      }
    } else {
      this.late = false;
      this.endEpisode(now);
    }
    this.lastTick = now;
  }

  /** True when a request handled now should take the overload path. */
  overloaded(now = performance.now()): boolean {
    if (this.timer === null) return false;
    if (this.late) return true;
    if (now - this.lastTick > this.intervalMs + this.thresholdMs) {
      // A stall noticed before the timer could run: the episode starts now at the latest.
      if (Number.isNaN(this.episodeStart)) {
        this.episodeStart = this.lastTick + this.intervalMs + this.thresholdMs;
        this.episodes?.overloadStarted();
      }
      return true;
    }
    return false;
  }

  private endEpisode(now: number): void {
    if (Number.isNaN(this.episodeStart)) return;
    const ms = Math.max(0, now - this.episodeStart);
    this.episodeStart = Number.NaN;
    this.episodes?.overloadEnded(ms);
  }
}
