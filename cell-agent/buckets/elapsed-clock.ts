// The deciders' clock read as a number, with nothing allocated: ns since the bucket table's start
// (startNs) on the monotonic clock that process.hrtime.bigint() reads — one clock for every thread
// of the process, so a worker's reading and the main thread's are on the same time line. A check
// reads it once (read()) into `elapsed[0]`; the table's takeKeyAt() and the check's latency read it
// from there, so the value is never boxed on its way (a double passed to or returned from a call
// that is not inlined is a heap number: an allocation).
//
// process.hrtime() returns [seconds, nanoseconds]; read() combines them relative to the origin:
// (s − s0)·1e9 + (ns − ns0). Exact: (s − s0)·1e9 is a multiple of 2^9 (exact far beyond 2^53) and
// the sum is an integer, exact while it is at most Number.MAX_SAFE_INTEGER (≈ 104 days after the
// origin); it then equals Number(process.hrtime.bigint() − startNs). Past that the reading is not
// exact and callers use the bigint clock (Decider does: `exact()`). The array process.hrtime()
// builds does not escape read() and is removed by the optimizing compiler (measured: 0 bytes per
// read once optimized; process.hrtime.bigint() allocates its BigInt, ~24 bytes, every call).

import { performance } from 'node:perf_hooks';

/** A clock the deciders read once per check; `elapsed[0]` holds the last reading. */
export interface ElapsedClock {
  /** The origin on the bigint clock (the bucket table's startNs). */
  readonly originNs: bigint;
  /** [0]: ns since originNs at the last read(): an integer, exact when ≤ Number.MAX_SAFE_INTEGER. */
  readonly elapsed: Float64Array;
  /** Reads the clock into elapsed[0]. */
  read(): void;
}

const NS_PER_S = 1_000_000_000n;

/** Whether elapsed[0] is exact (an integer within the safe range: takeKeyAt's domain). */
export function exactElapsed(clock: ElapsedClock): boolean {
  const e = clock.elapsed[0] as number;
  return e >= 0 && e <= Number.MAX_SAFE_INTEGER;
}

/** process.hrtime() since `originNs` (a process.hrtime.bigint() reading): the production clock. */
export class HrtimeClock implements ElapsedClock {
  readonly elapsed = new Float64Array(1);
  private readonly s0: number;
  private readonly ns0: number;

  constructor(readonly originNs: bigint) {
    if (originNs < 0n) throw new RangeError('originNs must be ≥ 0');
    this.s0 = Number(originNs / NS_PER_S);
    this.ns0 = Number(originNs % NS_PER_S);
  }

  read(): void {
    const t = process.hrtime();
    this.elapsed[0] = (t[0] - this.s0) * 1e9 + (t[1] - this.ns0);
  }
}

/**
 * performance.now() (a native call returning a double: nothing allocated, inlined or not) as ns
 * since the clock's creation, rounded to whole ns, plus `originNs`: the clock of ONE thread's
 * deciders and everything else that thread does with its table (the embedded limiter, where the
 * table is the thread's own). Not for a table shared by threads: each thread's performance.now()
 * counts from that thread's start, and the offset between two threads' readings is known only to
 * within the time of a read, so their readings would disagree by tens of ns; the agent's threads
 * use HrtimeClock. Integer and monotonic (each step of the rounding is monotonic); exact to the ns
 * while the time since the thread's start is below 2^51 ns (26 days), after that within a few ns —
 * the same clock for every reading, so the bucket arithmetic on its readings stays exact.
 * `nowNs()` is the same clock as a bigint (for the same thread's lease deadline, velocity window
 * and grant applications).
 *
 * `performance` is perf_hooks' own, imported: the global `performance` is an accessor (Node
 * installs it lazily), so reading it cost every clock read a global-load IC call and a getter call
 * (callgrind, Node 20: ~260 instructions a read, ~520 of a limiter.check()'s ~7,300).
 */
export class PerfClock implements ElapsedClock {
  readonly elapsed = new Float64Array(1);
  private readonly p0: number;

  constructor(readonly originNs: bigint) {
    if (originNs < 0n) throw new RangeError('originNs must be ≥ 0');
    this.p0 = Math.round(performance.now() * 1e6);
  }

  read(): void {
    this.elapsed[0] = Math.round(performance.now() * 1e6) - this.p0;
  }

  /** The clock as a bigint on originNs's line: originNs + ns since the clock's creation. */
  nowNs(): bigint {
    this.read();
    return this.originNs + BigInt(this.elapsed[0] as number);
  }
}

/** A bigint clock (tests' fake clocks) as an ElapsedClock: allocates per read; not for production. */
export class BigintElapsedClock implements ElapsedClock {
  readonly elapsed = new Float64Array(1);

  constructor(
    private readonly clock: () => bigint,
    readonly originNs: bigint,
  ) {}

  read(): void {
    this.elapsed[0] = Number(this.clock() - this.originNs);
  }
}
