// Fail-open when the serving thread falls behind. Envoy gives the rate-limit call 20 ms by default
// and then lets the request through anyway (failure_mode_deny false); a check answered after that is
// wasted work that delays every check queued behind it. So when this thread is behind, it answers
// OK at once (no rule matching, no buckets), marked degraded, until it has caught up.
//
// "Behind" is measured with one repeating timer per thread, every `intervalMs` (default 5 ms):
//   - drift: the timer fires later than due by more than `thresholdMs` → the event loop was blocked
//     (GC pause, a slow callback, CPU starvation) and the requests that arrived meanwhile have waited
//     that long in the socket buffers. Stay in overload for as long as the block lasted (capped at
//     `maxHoldMs`): long enough to drain that backlog quickly.
//   - stall: a request handled when the timer has not run for more than intervalMs + thresholdMs is
//     being handled inside one long turn of the loop (a burst larger than the thread can serve in
//     time): the requests at the end of the burst are late too.
// Both are a comparison of performance.now() values; nothing is allocated per request.
// monitorEventLoopDelay would give the same drift as a histogram, but only after the fact; the timer
// gives it at the first turn after a block, before the queued requests are read.
import { performance } from 'node:perf_hooks';

export interface LagGuardOptions {
  /** Lag beyond which the thread counts as behind (ms). Default 10; 0 disables the guard. */
  readonly thresholdMs?: number;
  /** Timer period (ms). Default 5. */
  readonly intervalMs?: number;
  /** Longest overload period after one block (ms). Default 1000. */
  readonly maxHoldMs?: number;
}

export class LagGuard {
  readonly thresholdMs: number;
  readonly intervalMs: number;
  readonly maxHoldMs: number;
  private lastTick = performance.now();
  private overloadedUntil = 0;
  private timer: NodeJS.Timeout | null = null;
  /** Largest drift seen (ms), for diagnostics. */
  maxDriftMs = 0;

  constructor(opts: LagGuardOptions = {}) {
    this.thresholdMs = opts.thresholdMs ?? 10;
    this.intervalMs = opts.intervalMs ?? 5;
    this.maxHoldMs = opts.maxHoldMs ?? 1000;
  }

  start(now = performance.now()): void {
    if (this.timer !== null || this.thresholdMs <= 0) return;
    this.lastTick = now;
    this.timer = setInterval(() => this.tick(), this.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /** The timer's body (public for tests that drive it). */
  tick(now = performance.now()): void {
    const drift = now - this.lastTick - this.intervalMs;
    if (drift > this.maxDriftMs) this.maxDriftMs = drift;
    if (drift > this.thresholdMs) this.overloadedUntil = Math.max(this.overloadedUntil, now + Math.min(drift, this.maxHoldMs));
    this.lastTick = now;
  }

  /** True when a request handled now should be answered fail-open. */
  overloaded(now = performance.now()): boolean {
    if (this.timer === null) return false;
    return now < this.overloadedUntil || now - this.lastTick > this.intervalMs + this.thresholdMs;
  }
}
