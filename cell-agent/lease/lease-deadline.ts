// The lease's end, where every deciding thread reads it: one SharedArrayBuffer shared by the agent's
// main thread (the lease client writes it) and its worker threads (each Decider reads it).
//
// A live grant is in force only while the lease that carried it is: the Decider compares its own
// clock reading (the one it already takes per decision, the bucket table's monotonic ns) with the
// deadline here, and decides on the grant's floor once it passed, whatever the main thread is doing
// (serving HTTP, a long GC pause, a rule reload, a blocked event loop): the lease client's expiry
// timer and its floors message only tidy up afterwards. Cost on the hot path, per global level on a
// leased grant: two 32-bit atomic loads (the write count and the generation) and one BigInt
// comparison against the clock reading the decision takes anyway; no allocation. Each reader keeps
// the deadline it last loaded and reloads the 64-bit word only when the write count moved (once
// per lease renewal, every report interval). A reader that has not seen the latest renewal yet
// uses the earlier, smaller deadline of the same generation (renewals only extend it): it falls to
// the floor sooner, never later.
//
// Layout: BigInt64 [0] the deadline (ns on the deciders' clock; NO_LEASE when none), [1] the
// deadline the previous generation ended at, then Int32s: the lease generation and the write count.
//
// The end of a lease is also when a bucket left under its grant takes the floor on (endedAt(): the
// floor's LimitSuccession in quota-overrides.ts): a bucket nobody touched since the deadline
// passed is re-configured as of the deadline, whichever thread meets it first and however late.
// The client starts a new generation whenever its lease expires (its grants are suspended: the
// coordinator may have released or re-granted what it held); a
// grant is tagged with the generation it arrived in, and a grant of an older generation is never in
// force again, even once a new lease renews the deadline before that thread saw the floors message.
// Ordering: the writer bumps the generation BEFORE it publishes a deadline of the new generation;
// a reader loads the deadline BEFORE the generation. So a reader that sees the new deadline sees
// the new generation too (Atomics are sequentially consistent), and an old grant never rides on a
// new lease.

/** What a worker needs to attach the deadline (structured-cloneable). */
export interface LeaseDeadlineShared {
  readonly buffer: SharedArrayBuffer;
}

/** No live lease: below any clock reading. */
const NO_LEASE = -(1n << 62n);
const D_DEADLINE = 0;
const D_ENDED = 1;
const G_GENERATION = 0;
const G_WRITES = 1;
const BYTES = 24;

export class LeaseDeadline {
  readonly shared: LeaseDeadlineShared;
  private readonly deadline: BigInt64Array;
  private readonly generation: Int32Array;
  /** This thread's copy of the deadline, as of write count `seenWrites`. */
  private cached = NO_LEASE;
  private seenWrites = -1;

  private constructor(buffer: SharedArrayBuffer) {
    if (buffer.byteLength !== BYTES)
      throw new TypeError(`lease deadline: a ${BYTES}-byte SharedArrayBuffer expected, got ${buffer.byteLength}`);
    this.deadline = new BigInt64Array(buffer, 0, 2);
    this.generation = new Int32Array(buffer, 16, 2);
    this.shared = Object.freeze({ buffer });
  }

  /** A new deadline: no lease, generation 0. */
  static create(): LeaseDeadline {
    const d = new LeaseDeadline(new SharedArrayBuffer(BYTES));
    Atomics.store(d.deadline, D_DEADLINE, NO_LEASE);
    Atomics.store(d.deadline, D_ENDED, NO_LEASE);
    return d;
  }

  /** Map a deadline created by another thread. */
  static attach(shared: LeaseDeadlineShared): LeaseDeadline {
    return new LeaseDeadline(shared.buffer);
  }

  // ---- the writer (the lease client's thread) -------------------------------------------------

  /** The generation grants arriving now are tagged with. */
  currentGeneration(): number {
    return Atomics.load(this.generation, G_GENERATION);
  }

  /** Ends the lease and starts a new generation (its grants are floors from now on); returns it. */
  nextGeneration(): number {
    // The end first, then the deadline's reset: a reader that finds NO_LEASE finds the end too.
    Atomics.store(this.deadline, D_ENDED, Atomics.load(this.deadline, D_DEADLINE));
    Atomics.store(this.deadline, D_DEADLINE, NO_LEASE);
    Atomics.add(this.generation, G_WRITES, 1);
    const next = (Atomics.load(this.generation, G_GENERATION) + 1) | 0;
    Atomics.store(this.generation, G_GENERATION, next);
    return next;
  }

  /** The current generation's lease lasts until `deadlineNs` (never shortened here: the client only extends it). */
  renewUntil(deadlineNs: bigint): void {
    if (deadlineNs <= Atomics.load(this.deadline, D_DEADLINE)) return;
    Atomics.store(this.deadline, D_DEADLINE, deadlineNs);
    Atomics.add(this.generation, G_WRITES, 1);
  }

  // ---- the readers (every deciding thread) ----------------------------------------------------

  /** Whether a grant of `generation` is in force at `nowNs` (the deciders' clock). */
  live(generation: number, nowNs: bigint): boolean {
    const writes = Atomics.load(this.generation, G_WRITES);
    if (writes !== this.seenWrites) {
      // The count first, then the word: a count seen here is never newer than the word read after it.
      this.cached = Atomics.load(this.deadline, D_DEADLINE);
      this.seenWrites = writes;
    }
    if (nowNs >= this.cached) return false;
    return Atomics.load(this.generation, G_GENERATION) === generation;
  }

  /**
   * When the lease of `generation` ended, if it has by `nowNs` and this is known: the current
   * generation's deadline once passed, the previous generation's last deadline; null otherwise (not
   * ended yet, never leased, or an older generation: its floors were applied when it ended).
   * Off the hot path: called only when a bucket is re-configured from that lease's grant to its floor.
   */
  endedAt(generation: number, nowNs: bigint): bigint | null {
    const current = Atomics.load(this.generation, G_GENERATION);
    let end: bigint;
    if (current === generation) {
      end = Atomics.load(this.deadline, D_DEADLINE);
      // Reset by nextGeneration() since the generation was read: its end is stored first.
      if (end === NO_LEASE) end = Atomics.load(this.deadline, D_ENDED);
    } else if (((current - 1) | 0) === generation) {
      end = Atomics.load(this.deadline, D_ENDED);
    } else {
      return null;
    }
    return end !== NO_LEASE && end <= nowNs ? end : null;
  }

  /** ns left of the lease at `nowNs` (≤ 0: none). */
  remainingNs(nowNs: bigint): bigint {
    const d = Atomics.load(this.deadline, D_DEADLINE);
    return d === NO_LEASE ? 0n : d - nowNs;
  }
}

/**
 * The lease client's view of a LeaseDeadline on the deciders' clock: its monotonic clock in ms since
 * `originNs`, and the hooks it reports lease generations and ends through.
 */
export interface LeaseDeadlineWriter {
  /** A new generation (the client forgot its grants); returns it. */
  nextGeneration(): number;
  currentGeneration(): number;
  /** The lease lasts until `expiresAtMs` on the client's monotonic clock. */
  renew(expiresAtMs: number): void;
}

export function deadlineWriter(deadline: LeaseDeadline, originNs: bigint): LeaseDeadlineWriter {
  return {
    nextGeneration: () => deadline.nextGeneration(),
    currentGeneration: () => deadline.currentGeneration(),
    // Rounded down: the deciders' deadline is never later than the client's.
    renew: (expiresAtMs) => deadline.renewUntil(originNs + BigInt(Math.floor(expiresAtMs * 1e6))),
  };
}

/** The client's monotonic clock in ms on the deciders' clock `nowNs` (ns), counted from `originNs`. */
export function monotonicMsOf(nowNs: () => bigint, originNs: bigint): () => number {
  return () => Number(nowNs() - originNs) / 1e6;
}
