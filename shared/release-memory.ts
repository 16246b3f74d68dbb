// Gives back what a thread's start-up left in its V8 heap, once, when start-up is done.
//
// Start-up (module loading, warm-up) leaves many survivors, so V8 grows the thread's young generation
// (semi-spaces up to 16 MiB) and keeps it, and keeps old-space pages the start-up's garbage occupied.
// V8's memory reducer returns them by itself only 20-60 s into an idle period. Here the thread asks
// for the same collection at once: the inspector's HeapProfiler.collectGarbage is the isolate's
// LowMemoryNotification (full collections that shrink the young generation and release free pages),
// which Node exposes no other way; gc() (--expose-gc) does not shrink the young generation. In-process
// session only (no port, nothing listens); one collection of a start-up-sized heap, ~50-200 ms.
// Measured in bench/agent-idle-rss.ts (cell-agent/README.md, "Memory of an idle agent").
//
// Only for a thread that answers no checks. After this collection (Node 20 and 22: V8 11.3, 12.4),
// creating an object literal with symbol keys stays on a slow path in that isolate for good: measured
// 15 → 250 ns per literal, where gc() with flavor 'last-resort' leaves it at 7 ns. node:internal makes one per
// process.nextTick (the tick object), about eight a check on node:http2, so a serving thread that
// ran it answered 0.77-0.84 × the checks of one that did not (`npm run bench -- agent`, issue 21).
import type { Session } from 'node:inspector';
import v8 from 'node:v8';
import type { Logger } from './logging.js';

export interface MemoryReleased {
  /** The V8 heap's committed physical memory before and after, in bytes. */
  readonly heapBefore: number;
  readonly heapAfter: number;
  readonly ms: number;
}

const MiB = 1024 * 1024;

/**
 * Runs the isolate's low-memory collection in the calling thread (main thread or worker); resolves
 * when it is done, logged at debug. Null when this Node has no inspector (built without it): nothing
 * is released then.
 */
export async function releaseStartupMemory(logger: Pick<Logger, 'debug'>): Promise<MemoryReleased | null> {
  const released = await lowMemoryCollection();
  if (released !== null)
    logger.debug(
      {
        heapMiB: Math.round((released.heapBefore / MiB) * 10) / 10,
        heapAfterMiB: Math.round((released.heapAfter / MiB) * 10) / 10,
        ms: Math.round(released.ms),
      },
      'start-up memory released',
    );
  return released;
}

async function lowMemoryCollection(): Promise<MemoryReleased | null> {
  let session: Session;
  const heapBefore = v8.getHeapStatistics().total_physical_size;
  const started = performance.now();
  try {
    session = new (await import('node:inspector')).Session();
    session.connect();
  } catch {
    return null;
  }
  try {
    await new Promise<void>((resolve, reject) =>
      session.post('HeapProfiler.collectGarbage', (error) => (error === null ? resolve() : reject(error))),
    );
  } finally {
    // Not from inside the post's callback: a session disconnected there never finishes (Node 20).
    session.disconnect();
  }
  return { heapBefore, heapAfter: v8.getHeapStatistics().total_physical_size, ms: performance.now() - started };
}
