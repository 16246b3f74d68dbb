// Watches this process's event loop for stalls: while it is blocked (a long synchronous piece of
// work, a long GC pause, the process not scheduled on a loaded machine) a leader sends no heartbeat,
// and its followers elect another leader once it lasts their election timeout (500-1000 ms by
// default). The storage's fsync times are measured from JavaScript, so they include any stall that
// delayed the write's completion callback: `blockedDuring` says how much of a time span was a stall,
// so a 'slow fsync' warning can tell the disk from the event loop (issue 12).

/** How often the watch's timer runs; a stall is the timer's lateness beyond it. */
const WATCH_EVERY_MS = 50;
/** Stalls remembered for blockedDuring (each is at least thresholdMs long). */
const STALLS_KEPT = 16;

export interface LoopWatch {
  /** Milliseconds of [fromMs, toMs] (performance.now() times) the event loop spent in a noticed stall. */
  blockedDuring(fromMs: number, toMs: number): number;
  stop(): void;
}

/** Calls `onStall(ms)` after every stall longer than `thresholdMs`. */
export function watchEventLoop(thresholdMs: number, onStall: (ms: number) => void): LoopWatch {
  const stalls: { readonly start: number; readonly end: number }[] = [];
  let last = performance.now();
  const timer = setInterval(() => {
    const now = performance.now();
    const late = now - last - WATCH_EVERY_MS;
    last = now;
    if (late <= thresholdMs) return;
    stalls.push({ start: now - late, end: now });
    if (stalls.length > STALLS_KEPT) stalls.shift();
    onStall(late);
  }, WATCH_EVERY_MS);
  timer.unref();
  return {
    blockedDuring(fromMs, toMs) {
      // A stall that ends at `toMs` may not have been noticed yet (the timer runs after it): it
      // counts from the watch's last run, which is at most WATCH_EVERY_MS before the stall began.
      const pending = Math.max(0, toMs - last - WATCH_EVERY_MS);
      let blocked = pending > thresholdMs ? Math.min(pending, toMs - fromMs) : 0;
      for (const s of stalls) blocked += Math.max(0, Math.min(toMs, s.end) - Math.max(fromMs, s.start));
      return Math.min(blocked, toMs - fromMs);
    },
    stop() {
      clearInterval(timer);
    },
  };
}
