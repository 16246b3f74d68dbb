// The bucket table as it was before issue 21 (a BigInt64 state word, compare-and-swap, bigint arithmetic),
// frozen here for `npm run bench -- decision` only: take() and takeKey() before and after, side by side in one
// run. Not product code; nothing else imports it. Remove it once the comparison has been made on a quiet machine.
//
// The agent's bucket table: a fixed-capacity open-addressing hash table of GCRA buckets in ONE
// SharedArrayBuffer, so several worker threads decide from the same buckets exactly.
//
// Layout (one SharedArrayBuffer; S slots in groups of 8):
//   header  64 B: startNs, evictions, evictFloor (BigInt64); magic, version, capacity, groups, lock
//                 count, size, seed, sleep word (Int32)
//   keys    Int32[2S]: per slot k0 (key hash word 0; 0 = EMPTY, 1 = CLAIMING) and k2 (check word),
//                 interleaved so that a group's 8 (k0, k2) pairs fill exactly one 64-byte cache line
//   records 32 B per slot (one aligned half cache line):
//     state    BigInt64  gen·2^58 + (TAT − startNs): the bucket; −1 = LOCKED (being re-configured
//                        or evicted by one thread)
//     interval BigInt64  T in ns (0 = rate 0) ...
//     window   BigInt64  ... and D = T·b: the limit the TAT is kept under. These two words ARE the
//                        slot's limit-config id: re-interpreting the TAT needs the old parameters,
//                        and storing them avoids a shared id registry that would need its own garbage
//                        collection as slices change every round.
//     k1       Int32     key hash word 1
//     access   Int32     last-access stamp, units of 2^30 ns (~1.07 s) since startNs (LRU choice)
//   locks   Int32[L]: insert stripes (futex-style mutexes), picked by key hash
//   = 40 B per slot, S ≈ 1.25 × capacity: ≈ 50 B per key (bytesFor()). A decision touches two cache
//   lines when the key is in its first home group.
//
// Decisions are lock-free: read the state word, check the key is still the slot's, compute the GCRA
// step, Atomics.compareExchange the new TAT; on a lost race, retry. A refused take writes nothing.
//
// Placement: a key has two home groups (two-choice hashing) and, only when both homes hold no EMPTY
// slot, 4 overflow groups next to them: at most 48 slots are ever probed. Slots are never emptied
// again (eviction hands the slot straight to the new key), so a lookup that sees an EMPTY slot in a
// home group knows the key is absent without looking at the overflow groups.
//
// Inserts of the SAME key are serialized by a stripe lock picked by the key's hash (misses only; hits
// never lock), so a key can never get two buckets (two buckets would double its limit). A slot is
// claimed race-free: an EMPTY slot by CAS k0 EMPTY → CLAIMING, a live slot to evict by CAS of its
// state word → LOCKED. The state word is published before k0, so a key is only ever found with a
// valid state.
//
// Eviction (only when a key needs a slot): a bucket may be evicted only when it is FULL at the
// evicting thread's now (TAT ≤ now: idle at least as long as it needs to refill completely) or its
// limit is rate 0 (it holds no tokens). Among such candidates in the key's probe groups the least
// recently used goes. If none is found the insert fails and take() answers verdict 'table-full': the
// caller applies its policy (the agent's fail-open/closed setting) and counts it; memory stays
// bounded whatever the key cardinality (e.g. per client IP). Eviction never changes a decision for an
// unchanged limit: a re-created bucket starts at TAT = max(its start TAT, evictFloor), where
// evictFloor is the largest now at which any bucket was evicted (raised before the eviction). At a
// now ≥ evictFloor the re-created bucket is full, exactly as the evicted one (full when evicted)
// would be; a thread whose clock reading lags behind evictFloor sees it LESS full, never more, so
// skew between threads' clock readings cannot turn an eviction into over-admission. (A key
// re-created under a DIFFERENT limit than it was evicted with starts as a new bucket of that limit,
// as a key first seen then would.)
//
// gen: 5 high bits of the state word (bits 58..62), bumped on every re-configuration and every
// eviction. A thread that read the word, then lost the CPU while the slot was re-configured or handed
// to another key, fails its CAS even if the new TAT happened to equal the old one (it would need
// exactly 32 such changes of that slot, and an identical TAT to the nanosecond, in between).
//
// Threads: every thread attaches its own BucketTable object (it keeps per-thread scratch) over the
// same buffer. A thread must not be terminated in the middle of a take() (worker.terminate() at
// shutdown, with the table discarded, is fine): a slot it held LOCKED, or an insert stripe, would
// stay held.
//
// Succession: a limit may name the limit it replaced and the instant it did (gcra.ts's
// LimitSuccession: a lease's floor replaces the grant at the lease's end). A bucket still kept under
// the replaced limit when it meets the new one is re-configured as of that instant (gcraReconfigure
// at it), not as of the take that happens to meet it first: nobody may have touched the key since
// the lease ended, and that time must refill at the floor's rate. The result never holds more tokens
// than re-configuring as of now would (the later of the two TATs), so a past instant can only take
// tokens away: should the bucket have been taken from after that instant (under a later grant with
// the same numbers), the debt of those takes is kept.
//
// Start: a bucket with no state yet starts FULL for a 'full' limit (local rules; see evictFloor
// above) and EMPTY AT ITS CREATION for an 'empty' limit (global quota slices): a new key, a key
// whose grant just moved in from another cell, a key re-created after eviction and every key after
// an agent restart all begin with no tokens and refill at their slice's rate, so no cell ever holds
// a burst it did not refill itself.
//
// Time: callers pass nowNs on their own clock (e.g. process.hrtime.bigint(), shared by all threads);
// startNs (default 0n) is the table's origin on that clock. nowNs must lie in [startNs, startNs + 2^57 ns
// ≈ 4.5 years] (a TAT is at most now + D ≤ now + 2^56 < 2^58, so it never reaches the gen bits).

import {
  gcraInitialTat,
  gcraReconfigure,
  gcraStepInto,
  MAX_WINDOW_NS,
  NEVER_NS,
  newGcraScratch,
  type GcraDecisionScratch,
  type GcraLimit,
  type GcraParams,
} from '../../cell-agent/buckets/gcra.js';
import { fmix32, hashKey, KeyHashStream, type KeyHasher } from './key-hash-before.js';

export type { KeyHasher } from './key-hash-before.js';

/** 'allow' / 'deny': a decision. 'table-full': no slot could be found for a new key (see above). */
export type TakeVerdict = 'allow' | 'deny' | 'table-full';

export interface TakeResult {
  readonly verdict: TakeVerdict;
  /** verdict === 'allow'. */
  readonly allowed: boolean;
  /** Whole tokens left after this call (0 for 'table-full'). */
  readonly remaining: number;
  /** Time until the bucket is full again. */
  readonly resetNs: bigint;
  /** 0n when allowed; the wait until the same hits would pass; NEVER_NS if never; 0n for 'table-full'. */
  readonly retryAfterNs: bigint;
}

export interface BucketTableOptions {
  /** Maximum number of live keys. */
  readonly capacity: number;
  /** Clock origin (and empty-start instant) on the callers' clock; default 0n. */
  readonly startNs?: bigint;
  /** Hash seed; random by default. */
  readonly seed?: number;
  /** Refuse to build a table whose buffer would exceed this many bytes. */
  readonly maxBytes?: number;
  /** Replaces the key hash (tests). Every thread attaching the table must use the same one. */
  readonly hasher?: KeyHasher;
}

/** What a worker needs to attach the table (structured-cloneable: pass it in workerData). */
export interface BucketTableShared {
  readonly buffer: SharedArrayBuffer;
}

export interface AttachOptions {
  readonly hasher?: KeyHasher;
}

const MAGIC = 0x43514254; // "CQBT"
const VERSION = 1;
const GROUP = 8;
const OVERFLOW_STEPS = 2; // overflow groups ga+1, gb+1, ga+2, gb+2
const SLOTS_PER_KEY = 1.25;
const HEADER_BYTES = 64;
const KEY_BYTES = 8;
const RECORD_BYTES = 32;

// header: BigInt64 indexes
const H_START = 0;
const H_EVICTIONS = 1;
const H_FLOOR = 2;
// header: Int32 indexes
const H_MAGIC = 8;
const H_VERSION = 9;
const H_CAPACITY = 10;
const H_GROUPS = 11;
const H_LOCKS = 12;
const H_SIZE = 13;
const H_SEED = 14;
const H_SLEEP = 15;

// record: BigInt64 offsets within a slot's 4 words, Int32 offsets within its 8 words
const R_STATE = 0;
const R_INTERVAL = 1;
const R_WINDOW = 2;
const R_K1 = 6;
const R_ACCESS = 7;

const EMPTY = 0;
const CLAIMING = 1;
const LOCKED = -1n;
const GEN_SHIFT = 58n;
const GEN_ONE = 1n << GEN_SHIFT;
const TAT_MASK = GEN_ONE - 1n;
const GEN_MASK = 31n << GEN_SHIFT;
const STAMP_SHIFT = 30n;
const MAX_REL_NOW = 1n << 57n;
const SPINS_BEFORE_SLEEP = 64;

type MutableTakeResult = { -readonly [K in keyof TakeResult]: TakeResult[K] };

function copyResult(to: MutableTakeResult, from: TakeResult): void {
  to.verdict = from.verdict;
  to.allowed = from.allowed;
  to.remaining = from.remaining;
  to.resetNs = from.resetNs;
  to.retryAfterNs = from.retryAfterNs;
}

/** gcraStepInto's output, reused (one decision at a time per thread; it never calls out). */
const stepScratch: GcraDecisionScratch = newGcraScratch();

const TABLE_FULL: TakeResult = Object.freeze({
  verdict: 'table-full',
  allowed: false,
  remaining: 0,
  resetNs: 0n,
  retryAfterNs: 0n,
});
const BLOCKED: TakeResult = Object.freeze({
  verdict: 'deny',
  allowed: false,
  remaining: 0,
  resetNs: 0n,
  retryAfterNs: NEVER_NS,
});

interface Layout {
  readonly groups: number;
  readonly slots: number;
  readonly locks: number;
  readonly bytes: number;
}

function layoutFor(capacity: number): Layout {
  if (!Number.isSafeInteger(capacity) || capacity < 1 || capacity > 50_000_000) {
    throw new RangeError(`capacity must be an integer in [1, 50e6], got ${capacity}`);
  }
  const groups = Math.max(2, Math.ceil((capacity * SLOTS_PER_KEY) / GROUP));
  const slots = groups * GROUP;
  let locks = 64;
  while (locks < 4096 && locks < groups / 4) locks *= 2;
  return { groups, slots, locks, bytes: HEADER_BYTES + slots * (KEY_BYTES + RECORD_BYTES) + locks * 4 };
}

function randomSeed(): number {
  const a = new Int32Array(1);
  globalThis.crypto.getRandomValues(a);
  return a[0] ?? 0;
}

/** The next generation tag of a state word (in place, i.e. already shifted). */
function nextGen(w: bigint): bigint {
  return (w + GEN_ONE) & GEN_MASK;
}

export class BigIntBucketTable {
  /** Pass to workers; BucketTable.attach(shared) there. */
  readonly shared: BucketTableShared;
  readonly capacity: number;
  readonly slotCount: number;
  readonly startNs: bigint;

  private readonly groups: number;
  private readonly lockMask: number;
  private readonly seed: number;
  private readonly hasher: KeyHasher;
  private readonly h64: BigInt64Array;
  private readonly h32: Int32Array;
  private readonly keys: Int32Array;
  private readonly rec64: BigInt64Array;
  private readonly rec32: Int32Array;
  private readonly locks: Int32Array;
  private readonly hashOut = new Int32Array(3);
  /** The key of the next takeKey(), hashed as it is written (null with a custom hasher). */
  private readonly keyStream: KeyHashStream | null;
  /** takeKey()'s answer, reused: valid until this object's next takeKey(). */
  private readonly keyResult: MutableTakeResult = {
    verdict: 'allow',
    allowed: true,
    remaining: 0,
    resetNs: 0n,
    retryAfterNs: 0n,
  };
  /** take()'s working answer (copied before it is returned). */
  private readonly plainResult: MutableTakeResult = {
    verdict: 'allow',
    allowed: true,
    remaining: 0,
    resetNs: 0n,
    retryAfterNs: 0n,
  };

  /** Bytes of shared memory a table of this capacity takes (the memory cap it is built to). */
  static bytesFor(capacity: number): number {
    return layoutFor(capacity).bytes;
  }

  constructor(opts: BucketTableOptions);
  /** @internal used by attach() */
  constructor(opts: null, shared: BucketTableShared, attach: AttachOptions);
  constructor(opts: BucketTableOptions | null, shared?: BucketTableShared, attach?: AttachOptions) {
    let buffer: SharedArrayBuffer;
    if (opts !== null) {
      const layout = layoutFor(opts.capacity);
      if (opts.maxBytes !== undefined && layout.bytes > opts.maxBytes) {
        throw new RangeError(
          `a table for ${opts.capacity} keys needs ${layout.bytes} bytes, over maxBytes ${opts.maxBytes}`,
        );
      }
      const startNs = opts.startNs ?? 0n;
      if (startNs < 0n) throw new RangeError('startNs must be ≥ 0');
      buffer = new SharedArrayBuffer(layout.bytes);
      const h64 = new BigInt64Array(buffer, 0, 8);
      const h32 = new Int32Array(buffer, 0, 16);
      h64[H_START] = startNs;
      h32[H_MAGIC] = MAGIC;
      h32[H_VERSION] = VERSION;
      h32[H_CAPACITY] = opts.capacity;
      h32[H_GROUPS] = layout.groups;
      h32[H_LOCKS] = layout.locks;
      h32[H_SEED] = opts.seed ?? randomSeed();
      this.hasher = opts.hasher ?? hashKey;
    } else {
      if (shared === undefined || !(shared.buffer instanceof SharedArrayBuffer))
        throw new TypeError('attach: not a bucket table');
      buffer = shared.buffer;
      this.hasher = attach?.hasher ?? hashKey;
    }
    const h64 = new BigInt64Array(buffer, 0, 8);
    const h32 = new Int32Array(buffer, 0, 16);
    if (h32[H_MAGIC] !== MAGIC || h32[H_VERSION] !== VERSION)
      throw new TypeError('attach: not a bucket table (bad magic/version)');
    const capacity = h32[H_CAPACITY] ?? 0;
    const layout = layoutFor(capacity);
    if (layout.groups !== h32[H_GROUPS] || layout.locks !== h32[H_LOCKS] || layout.bytes !== buffer.byteLength) {
      throw new TypeError('attach: table layout mismatch');
    }
    const S = layout.slots;
    const recOff = HEADER_BYTES + S * KEY_BYTES;
    this.keys = new Int32Array(buffer, HEADER_BYTES, 2 * S);
    this.rec64 = new BigInt64Array(buffer, recOff, 4 * S);
    this.rec32 = new Int32Array(buffer, recOff, 8 * S);
    this.locks = new Int32Array(buffer, recOff + S * RECORD_BYTES, layout.locks);
    this.h64 = h64;
    this.h32 = h32;
    this.shared = Object.freeze({ buffer });
    this.capacity = capacity;
    this.slotCount = S;
    this.groups = layout.groups;
    this.lockMask = layout.locks - 1;
    this.seed = h32[H_SEED] ?? 0;
    this.startNs = h64[H_START] ?? 0n;
    this.keyStream = this.hasher === hashKey ? new KeyHashStream() : null;
  }

  /** Map a table created elsewhere (another worker thread) onto its shared memory. */
  static attach(shared: BucketTableShared, opts: AttachOptions = {}): BigIntBucketTable {
    return new BigIntBucketTable(null, shared, opts);
  }

  /** Whether the key has a bucket (for tests and debugging: decisions do not depend on it). */
  has(key: string): boolean {
    const out = this.hashOut;
    this.hasher(key, this.seed, out);
    let h0 = out[0] ?? 0;
    if (h0 === EMPTY || h0 === CLAIMING) h0 += 2;
    return this.find(h0, out[1] ?? 0, out[2] ?? 0) >= 0;
  }

  /** Whether the key has a bucket kept under `params` (its T and D) now (off the hot path: assertions). */
  keptUnder(key: string, params: GcraParams): boolean {
    const out = this.hashOut;
    this.hasher(key, this.seed, out);
    let h0 = out[0] ?? 0;
    if (h0 === EMPTY || h0 === CLAIMING) h0 += 2;
    const s = this.find(h0, out[1] ?? 0, out[2] ?? 0);
    if (s < 0) return false;
    return (
      Atomics.load(this.rec64, 4 * s + R_INTERVAL) === params.intervalNs &&
      Atomics.load(this.rec64, 4 * s + R_WINDOW) === params.windowNs
    );
  }

  /** Live keys. */
  size(): number {
    return Atomics.load(this.h32, H_SIZE);
  }

  /** Buckets evicted so far (all threads). */
  get evictions(): number {
    return Number(Atomics.load(this.h64, H_EVICTIONS));
  }

  /** Shared memory held by the table. */
  bytes(): number {
    return this.shared.buffer.byteLength;
  }

  /**
   * Take `hits` tokens for `key` under `limit` at `nowNs`. hits = 0 only reports (and creates a
   * bucket only for an 'empty'-start limit, which refills from its creation on; 'table-full' if no
   * slot can be had). A key keeps one limit at a time: a different limit re-configures its bucket (level
   * preserved, burst clamped: gcraReconfigure). Rate 0: always 'deny'.
   */
  take(key: string, limit: GcraLimit, hits: number, nowNs: bigint): TakeResult {
    const out = this.hashOut;
    this.hasher(key, this.seed, out);
    const r = this.takeHashed(out, limit, hits, nowNs, this.plainResult);
    return r === TABLE_FULL || r === BLOCKED ? r : { ...r };
  }

  /**
   * The hot path's take() (cell-agent/decide): the key is written in parts to the returned stream
   * (raw / escaped, exactly the characters take() would get as one string, so both find the same
   * bucket) instead of being built as a string, then takeKey() takes for it. null when the table has
   * a custom hasher (tests): use take().
   */
  beginKey(): KeyHashStream | null {
    const k = this.keyStream;
    if (k === null) return null;
    k.begin(this.seed);
    return k;
  }

  /** take() for the key written since beginKey(). The answer object is reused: it is valid until
   * this table object's next takeKey() (read it, do not keep it). */
  takeKey(limit: GcraLimit, hits: number, nowNs: bigint): Readonly<TakeResult> {
    const k = this.keyStream;
    if (k === null) throw new Error('takeKey: this table has a custom hasher; use take()');
    const out = this.hashOut;
    k.end(out);
    return this.takeHashed(out, limit, hits, nowNs, this.keyResult);
  }

  private takeHashed(
    hash: Int32Array,
    limit: GcraLimit,
    hits: number,
    nowNs: bigint,
    res: MutableTakeResult,
  ): TakeResult {
    if (!Number.isSafeInteger(hits) || hits < 0)
      throw new RangeError(`hits must be a non-negative safe integer, got ${hits}`);
    const nowRel = nowNs - this.startNs;
    if (nowRel < 0n || nowRel > MAX_REL_NOW)
      throw new RangeError(`nowNs ${nowNs} is outside the table's time range (startNs ${this.startNs} .. +2^57)`);
    // A malformed limit must fail here, never while this thread holds a slot LOCKED or CLAIMING.
    const T = limit.intervalNs;
    const D = limit.windowNs;
    if (
      typeof T !== 'bigint' ||
      typeof D !== 'bigint' ||
      T < 0n ||
      D < 0n ||
      D > MAX_WINDOW_NS ||
      (T === 0n) !== (D === 0n)
    ) {
      throw new TypeError('limit: not a GcraLimit (use limitPerUnit / limitFromRate / limitFromInterval)');
    }
    let h0 = hash[0] ?? 0;
    if (h0 === EMPTY || h0 === CLAIMING) h0 += 2;
    const h1 = hash[1] ?? 0;
    const h2 = hash[2] ?? 0;
    const n = hits === 1 ? 1n : BigInt(hits);
    for (;;) {
      let s = this.find(h0, h1, h2);
      if (s < 0) {
        if (limit.intervalNs === 0n) return BLOCKED;
        // A 0-hit report creates no 'full' bucket (it would report the same fresh one); an 'empty'
        // bucket is created by it, since it refills from its creation on: a key that is only ever
        // checked (a request refused at another level) must still start refilling.
        if (n === 0n && limit.start === 'full') return this.reportFresh(limit, nowRel, res);
        s = this.insert(h0, h1, h2, limit, nowRel);
        if (s < 0) return TABLE_FULL;
      }
      if (this.takeAt(s, h0, h1, h2, limit, n, nowRel, res)) return res;
    }
  }

  // ---- lookup -------------------------------------------------------------------------------

  private homeA(h1: number): number {
    return Math.floor(((fmix32(h1) >>> 0) * this.groups) / 4294967296);
  }

  private homeB(h0: number, h2: number, ga: number): number {
    const gb = Math.floor(((fmix32(h0 ^ h2) >>> 0) * this.groups) / 4294967296);
    return gb === ga ? (ga + 1) % this.groups : gb;
  }

  /** The key's slot in group g; else -2 if the group has an EMPTY slot, -1 if not. */
  private scanGroup(g: number, h0: number, h1: number, h2: number): number {
    const keys = this.keys;
    let sawEmpty = false;
    for (let s = g * GROUP, end = s + GROUP; s < end; s++) {
      const k = Atomics.load(keys, 2 * s);
      if (k === h0) {
        if (Atomics.load(keys, 2 * s + 1) === h2 && Atomics.load(this.rec32, 8 * s + R_K1) === h1) return s;
      } else if (k === EMPTY) {
        sawEmpty = true;
      }
    }
    return sawEmpty ? -2 : -1;
  }

  private find(h0: number, h1: number, h2: number): number {
    const ga = this.homeA(h1);
    const a = this.scanGroup(ga, h0, h1, h2);
    if (a >= 0) return a;
    const gb = this.homeB(h0, h2, ga);
    const b = this.scanGroup(gb, h0, h1, h2);
    if (b >= 0) return b;
    if (a === -2 || b === -2) return -1; // a key lives in an overflow group only if both homes were full
    const G = this.groups;
    for (let j = 1; j <= OVERFLOW_STEPS; j++) {
      const x = this.scanGroup((ga + j) % G, h0, h1, h2);
      if (x >= 0) return x;
      const y = this.scanGroup((gb + j) % G, h0, h1, h2);
      if (y >= 0) return y;
    }
    return -1;
  }

  private keyIs(s: number, h0: number, h1: number, h2: number): boolean {
    return (
      Atomics.load(this.keys, 2 * s) === h0 &&
      Atomics.load(this.keys, 2 * s + 1) === h2 &&
      Atomics.load(this.rec32, 8 * s + R_K1) === h1
    );
  }

  // ---- decide ---------------------------------------------------------------------------------

  /** Decides in slot s into `res`; false if the slot is no longer the key's (the caller looks again). */
  private takeAt(
    s: number,
    h0: number,
    h1: number,
    h2: number,
    limit: GcraLimit,
    n: bigint,
    nowRel: bigint,
    res: MutableTakeResult,
  ): boolean {
    const rec = this.rec64;
    const at = 4 * s;
    let spins = 0;
    for (;;) {
      const w = Atomics.load(rec, at + R_STATE);
      if (w === LOCKED) {
        spins = this.backoff(spins);
        continue;
      }
      // The key check follows the state read: a slot handed to another key publishes its new state
      // only after its new key words, so a stale key shows here (or the CAS below fails on gen).
      if (!this.keyIs(s, h0, h1, h2)) return false;
      const T = Atomics.load(rec, at + R_INTERVAL);
      const D = Atomics.load(rec, at + R_WINDOW);
      if (T !== limit.intervalNs || D !== limit.windowNs) {
        this.reconfigure(s, w, T, D, limit, nowRel);
        continue;
      }
      this.touch(s, nowRel);
      if (T === 0n) {
        copyResult(res, BLOCKED);
        return true;
      }
      // Shift now by the word's gen tag: differences (all the decision uses) are plain ns.
      const d = gcraStepInto(stepScratch, w, nowRel + (w & GEN_MASK), T, D, n);
      if (d.allowed && n !== 0n && Atomics.compareExchange(rec, at + R_STATE, w, d.tat) !== w) continue;
      res.verdict = d.allowed ? 'allow' : 'deny';
      res.allowed = d.allowed;
      res.remaining = d.remaining;
      res.resetNs = d.resetNs;
      res.retryAfterNs = d.retryAfterNs;
      return true;
    }
  }

  /** hits = 0 on an absent key: what a new bucket would report, without creating one. */
  private reportFresh(limit: GcraLimit, nowRel: bigint, res: MutableTakeResult): TakeResult {
    const tat = this.initialTat(limit, nowRel);
    const d = gcraStepInto(stepScratch, tat, nowRel, limit.intervalNs, limit.windowNs, 0n);
    res.verdict = 'allow';
    res.allowed = true;
    res.remaining = d.remaining;
    res.resetNs = d.resetNs;
    res.retryAfterNs = 0n;
    return res;
  }

  /**
   * A new bucket's TAT. 'empty' (global quota slices): empty NOW, at its creation — whether the key
   * is new, came with a grant that moved in from another cell, or was evicted and comes back under
   * a larger burst — so a cell's bucket only ever holds what it refilled at its own slice's rate
   * since it began counting the key (the global bound's term Σ rateᵢ·W, with no burst it did not
   * earn). 'full' (local rules): full, but never fuller than an evicted bucket (evictFloor).
   */
  private initialTat(limit: GcraLimit, nowRel: bigint): bigint {
    const tat = gcraInitialTat(limit, nowRel);
    if (limit.start === 'empty') return tat;
    const floor = Atomics.load(this.h64, H_FLOOR);
    return tat > floor ? tat : floor;
  }

  /** Re-interpret slot s's TAT (state word w) for `limit`. A lost race just returns (caller retries). */
  private reconfigure(s: number, w: bigint, T: bigint, D: bigint, limit: GcraLimit, nowRel: bigint): void {
    const rec = this.rec64;
    const at = 4 * s;
    // Computed before locking, so nothing can throw while the slot is LOCKED. T and D were read
    // after w; they only change under LOCKED, so if they are stale the CAS below fails.
    const from = { intervalNs: T, windowNs: D, burst: T === 0n ? 0n : D / T };
    const tat = w & TAT_MASK;
    const asOfNow = gcraReconfigure(tat, nowRel, from, limit);
    const since = this.reconfigureAt(T, D, limit, nowRel);
    // As of a past instant, but never more tokens than as of now (the larger TAT): should the bucket
    // have been taken from under `from` after that instant (another grant with the same numbers),
    // going back would forget that debt.
    const asOfThen = since < nowRel ? gcraReconfigure(tat, since, from, limit) : asOfNow;
    const next = (asOfThen > asOfNow ? asOfThen : asOfNow) | nextGen(w);
    if (Atomics.compareExchange(rec, at + R_STATE, w, LOCKED) !== w) return;
    Atomics.store(rec, at + R_INTERVAL, limit.intervalNs);
    Atomics.store(rec, at + R_WINDOW, limit.windowNs);
    Atomics.store(rec, at + R_STATE, next);
  }

  /**
   * The instant a bucket kept under (T, D) takes `limit` on: now, or — for a limit that succeeded
   * the bucket's own at a known instant (gcra.ts's LimitSuccession: a lease's floor, from the end of
   * the lease) — that instant, so the time since refills at the new limit's rate, not the old one's.
   * Only on re-configuration: a decision under the bucket's own limit never gets here.
   */
  private reconfigureAt(T: bigint, D: bigint, limit: GcraLimit, nowRel: bigint): bigint {
    const succession = limit.succeeds;
    if (succession === undefined || succession.from.intervalNs !== T || succession.from.windowNs !== D) return nowRel;
    const since = succession.since(nowRel + this.startNs);
    if (since === null) return nowRel;
    const rel = since - this.startNs;
    // Never later than now (an instant in the future would refill nothing yet and wrongly so), never
    // before the table's origin.
    if (rel >= nowRel) return nowRel;
    return rel > 0n ? rel : 0n;
  }

  private touch(s: number, nowRel: bigint): void {
    const stamp = Number(nowRel >> STAMP_SHIFT);
    const i = 8 * s + R_ACCESS;
    if (Atomics.load(this.rec32, i) !== stamp) Atomics.store(this.rec32, i, stamp);
  }

  private backoff(spins: number): number {
    if (spins >= SPINS_BEFORE_SLEEP) Atomics.wait(this.h32, H_SLEEP, 0, 0.05);
    return spins + 1;
  }

  // ---- insert / evict -------------------------------------------------------------------------

  private lock(i: number): void {
    const locks = this.locks;
    let c = Atomics.compareExchange(locks, i, 0, 1);
    if (c === 0) return;
    if (c !== 2) c = Atomics.exchange(locks, i, 2);
    while (c !== 0) {
      Atomics.wait(locks, i, 2, 10);
      c = Atomics.exchange(locks, i, 2);
    }
  }

  private unlock(i: number): void {
    if (Atomics.sub(this.locks, i, 1) !== 1) {
      Atomics.store(this.locks, i, 0);
      Atomics.notify(this.locks, i, 1);
    }
  }

  private reserveSize(): boolean {
    const h32 = this.h32;
    for (;;) {
      const n = Atomics.load(h32, H_SIZE);
      if (n >= this.capacity) return false;
      if (Atomics.compareExchange(h32, H_SIZE, n, n + 1) === n) return true;
    }
  }

  private countEmpty(g: number): number {
    let c = 0;
    for (let s = g * GROUP, end = s + GROUP; s < end; s++) if (Atomics.load(this.keys, 2 * s) === EMPTY) c++;
    return c;
  }

  private claimEmpty(g: number): number {
    const keys = this.keys;
    for (let s = g * GROUP, end = s + GROUP; s < end; s++) {
      if (Atomics.load(keys, 2 * s) === EMPTY && Atomics.compareExchange(keys, 2 * s, EMPTY, CLAIMING) === EMPTY)
        return s;
    }
    return -1;
  }

  /** Find or create the key's slot; -1 if no slot can be had (table full of busy buckets). */
  private insert(h0: number, h1: number, h2: number, limit: GcraLimit, nowRel: bigint): number {
    const li = (h1 ^ h2) & this.lockMask;
    this.lock(li);
    try {
      const found = this.find(h0, h1, h2);
      if (found >= 0) return found;
      const G = this.groups;
      const ga = this.homeA(h1);
      const gb = this.homeB(h0, h2, ga);
      const homes = [ga, gb];
      const overflow: number[] = [];
      for (let j = 1; j <= OVERFLOW_STEPS; j++) overflow.push((ga + j) % G, (gb + j) % G);
      let homesHaveEmpty = this.countEmpty(ga) + this.countEmpty(gb) > 0;
      if (this.reserveSize()) {
        let s = -1;
        if (homesHaveEmpty) {
          const [first, second] = this.countEmpty(ga) >= this.countEmpty(gb) ? [ga, gb] : [gb, ga];
          s = this.claimEmpty(first);
          if (s < 0) s = this.claimEmpty(second);
          // Every EMPTY we saw is taken now, and slots never become EMPTY again.
          if (s < 0) homesHaveEmpty = false;
        }
        if (s < 0 && !homesHaveEmpty) {
          for (const g of overflow) {
            s = this.claimEmpty(g);
            if (s >= 0) break;
          }
        }
        if (s >= 0) {
          this.publish(s, h0, h1, h2, limit, nowRel, 0n);
          return s;
        }
        Atomics.sub(this.h32, H_SIZE, 1);
      }
      return this.evictInto(homesHaveEmpty ? homes : homes.concat(overflow), h0, h1, h2, limit, nowRel);
    } finally {
      this.unlock(li);
    }
  }

  /** Evict the least recently used full (or rate-0) bucket among the groups and give its slot to the key. */
  private evictInto(
    groups: readonly number[],
    h0: number,
    h1: number,
    h2: number,
    limit: GcraLimit,
    nowRel: bigint,
  ): number {
    const rec = this.rec64;
    for (let attempt = 0; attempt < 4; attempt++) {
      let best = -1;
      let bestW = 0n;
      let bestStamp = 0;
      for (const g of groups) {
        for (let s = g * GROUP, end = s + GROUP; s < end; s++) {
          const k = Atomics.load(this.keys, 2 * s);
          if (k === EMPTY || k === CLAIMING) continue;
          const w = Atomics.load(rec, 4 * s + R_STATE);
          if (w === LOCKED) continue;
          // Only a full bucket (TAT ≤ now) or a rate-0 one (no tokens) may go.
          if (Atomics.load(rec, 4 * s + R_INTERVAL) !== 0n && (w & TAT_MASK) > nowRel) continue;
          const stamp = Atomics.load(this.rec32, 8 * s + R_ACCESS);
          if (best < 0 || stamp < bestStamp) {
            best = s;
            bestW = w;
            bestStamp = stamp;
          }
        }
      }
      if (best < 0) return -1;
      this.raiseFloor(nowRel);
      if (Atomics.compareExchange(rec, 4 * best + R_STATE, bestW, LOCKED) !== bestW) continue;
      // The slot is ours: a thread still holding the old word fails its CAS; readers spin on LOCKED
      // and then see the key change.
      Atomics.add(this.h64, H_EVICTIONS, 1n);
      Atomics.store(this.keys, 2 * best, CLAIMING);
      this.publish(best, h0, h1, h2, limit, nowRel, nextGen(bestW));
      return best;
    }
    return -1;
  }

  private raiseFloor(nowRel: bigint): void {
    const h64 = this.h64;
    for (;;) {
      const f = Atomics.load(h64, H_FLOOR);
      if (f >= nowRel || Atomics.compareExchange(h64, H_FLOOR, f, nowRel) === f) return;
    }
  }

  /** Fill a slot we own (k0 = CLAIMING): key words and limit, then the state, then k0 last. */
  private publish(s: number, h0: number, h1: number, h2: number, limit: GcraLimit, nowRel: bigint, gen: bigint): void {
    const rec = this.rec64;
    Atomics.store(this.keys, 2 * s + 1, h2);
    Atomics.store(this.rec32, 8 * s + R_K1, h1);
    Atomics.store(this.rec32, 8 * s + R_ACCESS, Number(nowRel >> STAMP_SHIFT));
    Atomics.store(rec, 4 * s + R_INTERVAL, limit.intervalNs);
    Atomics.store(rec, 4 * s + R_WINDOW, limit.windowNs);
    Atomics.store(rec, 4 * s + R_STATE, this.initialTat(limit, nowRel) | gen);
    Atomics.store(this.keys, 2 * s, h0);
  }
}
