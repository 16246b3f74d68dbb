// The agent's bucket table: a fixed-capacity open-addressing hash table of GCRA buckets in ONE
// SharedArrayBuffer, so several worker threads decide from the same buckets exactly.
//
// Layout (one SharedArrayBuffer; S slots in groups of 8):
//   header  64 B: startNs, evictions, evictFloor (BigInt64); magic, version, capacity, groups, lock
//                 count, size, seed, sleep word (Int32)
//   keys    Int32[2S]: per slot k0 (key hash word 0; 0 = EMPTY, 1 = CLAIMING) and k2 (check word),
//                 interleaved so that a group's 8 (k0, k2) pairs fill exactly one 64-byte cache line
//   records 32 B per slot (one aligned half cache line), eight Int32 words:
//     ver      the slot's sequence word (a seqlock): even = stable, odd = one thread is writing the
//              slot (a decision storing its TAT, a re-configuration, an eviction); +2 per write
//     tatHi    the TAT − startNs, a 64-bit integer (< 2^58) in two words
//     tatLo
//     dHi      D = T·b, the window of the limit the TAT is kept under (≤ 2^56) ...
//     dLo
//     x        ... and b when b < 2^31, else −T (T·b ≤ 2^56, so one of them is below 2^28); 0 for
//              rate 0. (D, x) determine (T, b), so these three words ARE the slot's limit-config id:
//              re-interpreting the TAT needs the old parameters, and storing them avoids a shared
//              id registry that would need its own garbage collection as slices change every round.
//     k1       key hash word 1
//     access   last-access stamp, units of 2^30 ns (~1.07 s) since startNs (LRU choice)
//   locks   Int32[L]: insert stripes (futex-style mutexes), picked by key hash
//   = 40 B per slot, S ≈ 1.25 × capacity: ≈ 50 B per key (bytesFor()). A decision touches two cache
//   lines when the key is in its first home group.
//
// Decisions (seqlock): read ver (odd: wait), check the key is still the slot's, read the config and
// the TAT, compute the GCRA step; a refused take (or a 0-hit report) then re-reads ver and retries if
// it moved, an admitted one claims the slot with Atomics.compareExchange(ver, v, v + 1), stores the
// new TAT and publishes ver = v + 2. Every access to a slot's words is an Atomics operation on an
// Int32Array: sequentially consistent, and free of the BigInt values V8 allocates for every 64-bit
// Atomics result (the table's earlier layout, a BigInt64 state word with a CAS, cost about a dozen
// BigInt allocations per decision). Why it is exact across threads: a thread's decision uses values
// it read between two reads of the same even ver (the re-read, or the CAS that succeeds only if ver
// is still v); a writer makes ver odd BEFORE it changes any word of the slot and even again only
// after, so every such read saw no write in progress and no write in between: the decision is on a
// consistent, current state, and a successful CAS makes it the only write since. Admissions on one
// bucket are therefore serialized exactly as a 64-bit CAS would serialize them. ver wraps only after
// 2^31 writes of ONE slot while a thread sits between its two reads (minutes of a bucket taken at
// full speed by other threads while this thread is descheduled): the old 5-bit generation tag's ABA
// margin (32 changes) was far smaller. The cost of the lock word: a thread that stops between its
// CAS and its publish (three stores later) makes the others wait for it (backoff(): spin, then
// Atomics.wait in 50 µs steps); it never blocks a thread working on another slot.
//
// Placement: a key has two home groups (two-choice hashing) and, only when both homes hold no EMPTY
// slot, 4 overflow groups next to them: at most 48 slots are ever probed. Slots are never emptied
// again (eviction hands the slot straight to the new key), so a lookup that sees an EMPTY slot in a
// home group knows the key is absent without looking at the overflow groups.
//
// Inserts of the SAME key are serialized by a stripe lock picked by the key's hash (misses only; hits
// never lock), so a key can never get two buckets (two buckets would double its limit). A slot is
// claimed race-free: an EMPTY slot by CAS k0 EMPTY → CLAIMING (then filled and published with k0
// last, so a key is only ever found with a valid state), a live slot to evict by CAS of its ver to
// odd (then rewritten whole, key words included, before ver is even again).
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
// Threads: every thread attaches its own BucketTable object (it keeps per-thread scratch) over the
// same buffer. A thread must not be terminated in the middle of a take() (worker.terminate() at
// shutdown, with the table discarded, is fine): a slot whose ver it held odd, or an insert stripe,
// would stay held.
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
// ≈ 4.5 years] (a TAT is at most now + D ≤ now + 2^56 < 2^58: tatHi < 2^26).
//
// Arithmetic: the decision runs on doubles (gcra.ts's gcraStepNumber) whenever every value is an
// integer below 2^53 — the limit's D ≤ 2^52 (≈ 52 days), the debt ≤ 2^52, nowNs below 2^53 or the
// time since startNs below it (104 days) — and on bigint (gcraStepInto) otherwise: the same answers
// either way, only slower. Times are split into the two 32-bit words they are stored as.

import {
  gcraInitialTat,
  gcraReconfigure,
  gcraStepInto,
  gcraStepNumber,
  MAX_WINDOW_NS,
  NEVER_NS,
  NUMBER_STEP_MAX_NS,
  newGcraNumberScratch,
  newGcraScratch,
  type GcraDecisionScratch,
  type GcraLimit,
  type GcraNumberDecision,
  type GcraParams,
} from './gcra.js';
import { fmix32, hashKey, KeyHashStream, type KeyHasher } from './key-hash.js';

export type { KeyHasher } from './key-hash.js';

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

/**
 * takeKey()'s answer: TakeResult with the times as numbers of ns, exact for a limit whose D is at
 * most NUMBER_STEP_MAX_NS (the only ones the hot path hands it, see takeKey); retryAfterNs is
 * Infinity for "never".
 */
export interface KeyTakeResult {
  readonly verdict: TakeVerdict;
  readonly allowed: boolean;
  readonly remaining: number;
  readonly resetNs: number;
  readonly retryAfterNs: number;
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
const VERSION = 2;
const GROUP = 8;
const OVERFLOW_STEPS = 2; // overflow groups ga+1, gb+1, ga+2, gb+2
const SLOTS_PER_KEY = 1.25;
const HEADER_BYTES = 64;
const KEY_BYTES = 8;
const RECORD_BYTES = 32;
const RECORD_WORDS = RECORD_BYTES / 4;

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

// record: Int32 offsets within a slot's 8 words
const R_VER = 0;
const R_TAT_HI = 1;
const R_TAT_LO = 2;
const R_D_HI = 3;
const R_D_LO = 4;
const R_X = 5;
const R_K1 = 6;
const R_ACCESS = 7;

const EMPTY = 0;
const CLAIMING = 1;
const TWO_32 = 4294967296;
const TWO_53 = 2 ** 53;
const LOW_32 = 0xffff_ffffn;
const MAX_REL_NOW = 1n << 57n;
const SPINS_BEFORE_SLEEP = 64;
/** The largest b kept in the x word (larger bursts keep −T there). */
const X_BURST_MAX = 0x7fff_ffffn;

type MutableTakeResult = { -readonly [K in keyof KeyTakeResult]: KeyTakeResult[K] };

/** A limit as the slot words hold it, and as numbers for the hot path's arithmetic. */
interface LimitWords {
  readonly dHi: number;
  readonly dLo: number;
  readonly x: number;
  /** D ≤ NUMBER_STEP_MAX_NS: T, D and b below are exact and gcraStepNumber applies. */
  readonly narrow: boolean;
  readonly intervalNs: number;
  readonly windowNs: number;
  readonly burst: number;
}

/** Every limit a thread has met (frozen ones: their fields cannot change), as words; weakly held. */
const wordsOfLimit = new WeakMap<GcraLimit, LimitWords>();

/** Validates a limit and gives its words (computed once per frozen limit object). */
function limitWords(limit: GcraLimit): LimitWords {
  const known = wordsOfLimit.get(limit);
  if (known !== undefined) return known;
  const T = limit.intervalNs;
  const D = limit.windowNs;
  const b = limit.burst;
  if (
    typeof T !== 'bigint' ||
    typeof D !== 'bigint' ||
    typeof b !== 'bigint' ||
    T < 0n ||
    D < 0n ||
    D > MAX_WINDOW_NS ||
    (T === 0n) !== (D === 0n) ||
    (T === 0n ? b !== 0n : T * b !== D)
  ) {
    throw new TypeError('limit: not a GcraLimit (use limitPerUnit / limitFromRate / limitFromInterval)');
  }
  const words: LimitWords = Object.freeze({
    dHi: Number(D >> 32n),
    dLo: Number(D & LOW_32) | 0,
    x: T === 0n ? 0 : b <= X_BURST_MAX ? Number(b) : -Number(T),
    narrow: D <= BigInt(NUMBER_STEP_MAX_NS),
    intervalNs: Number(T),
    windowNs: Number(D),
    burst: Number(b),
  });
  if (Object.isFrozen(limit)) wordsOfLimit.set(limit, words);
  return words;
}

/** The limit parameters of a slot's config words (off the hot path: re-configuration, eviction, keptUnder). */
function paramsOfWords(dHi: number, dLo: number, x: number): GcraParams {
  const D = (BigInt(dHi) << 32n) | BigInt(dLo >>> 0);
  if (x === 0) return { intervalNs: 0n, windowNs: 0n, burst: 0n };
  if (x > 0) return { intervalNs: D / BigInt(x), windowNs: D, burst: BigInt(x) };
  return { intervalNs: BigInt(-x), windowNs: D, burst: D / BigInt(-x) };
}

/** gcraStepInto's output, reused (one decision at a time per thread; it never calls out). */
const stepScratch: GcraDecisionScratch = newGcraScratch();
const numberScratch: GcraNumberDecision = newGcraNumberScratch();

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
const KEY_TABLE_FULL: KeyTakeResult = Object.freeze({
  verdict: 'table-full',
  allowed: false,
  remaining: 0,
  resetNs: 0,
  retryAfterNs: 0,
});
const KEY_BLOCKED: KeyTakeResult = Object.freeze({
  verdict: 'deny',
  allowed: false,
  remaining: 0,
  resetNs: 0,
  retryAfterNs: Infinity,
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

function newKeyResult(): MutableTakeResult {
  return { verdict: 'allow', allowed: true, remaining: 0, resetNs: 0, retryAfterNs: 0 };
}

export class BucketTable {
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
  private readonly rec: Int32Array;
  private readonly locks: Int32Array;
  private readonly hashOut = new Int32Array(3);
  /** startNs as a number when below 2^53 (else -1: every now goes through bigint). */
  private readonly startNumber: number;
  /** The current call's now − startNs in two words (one decision at a time per thread). */
  private nowHi = 0;
  private nowLo = 0;
  /** The key of the next takeKey(), hashed as it is written (null with a custom hasher). */
  private readonly keyStream: KeyHashStream | null;
  /** takeKey()'s answer, reused: valid until this object's next takeKey(). */
  private readonly keyResult: MutableTakeResult = newKeyResult();
  /** take()'s working answer (converted before it is returned). */
  private readonly plainResult: MutableTakeResult = newKeyResult();
  /** The exact times of the last decision that ran on bigint (resetNs, retryAfterNs), else null. */
  private bigTimes: GcraDecisionScratch | null = null;

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
    this.rec = new Int32Array(buffer, recOff, RECORD_WORDS * S);
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
    this.startNumber = this.startNs < BigInt(TWO_53) ? Number(this.startNs) : -1;
    this.keyStream = this.hasher === hashKey ? new KeyHashStream() : null;
  }

  /** Map a table created elsewhere (another worker thread) onto its shared memory. */
  static attach(shared: BucketTableShared, opts: AttachOptions = {}): BucketTable {
    return new BucketTable(null, shared, opts);
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
    const rec = this.rec;
    const at = RECORD_WORDS * s;
    const kept = paramsOfWords(
      Atomics.load(rec, at + R_D_HI),
      Atomics.load(rec, at + R_D_LO),
      Atomics.load(rec, at + R_X),
    );
    return kept.intervalNs === params.intervalNs && kept.windowNs === params.windowNs;
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
    this.bigTimes = null;
    const r = this.takeHashed(out, limit, hits, nowNs, this.plainResult);
    if (r === KEY_TABLE_FULL) return TABLE_FULL;
    if (r === KEY_BLOCKED) return BLOCKED;
    const big = this.bigTimes as GcraDecisionScratch | null;
    return {
      verdict: r.verdict,
      allowed: r.allowed,
      remaining: r.remaining,
      resetNs: big !== null ? big.resetNs : BigInt(r.resetNs),
      retryAfterNs: big !== null ? big.retryAfterNs : r.retryAfterNs === Infinity ? NEVER_NS : BigInt(r.retryAfterNs),
    };
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

  /**
   * take() for the key written since beginKey(), with the times as numbers: exact for a limit
   * whose windowNs is at most NUMBER_STEP_MAX_NS (2^52 ns, ≈ 52 days; a wider one is refused with a
   * RangeError before anything is taken: use take()). Allocates nothing. The answer object is
   * reused: it is valid until this table object's next takeKey() (read it, do not keep it).
   */
  takeKey(limit: GcraLimit, hits: number, nowNs: bigint): Readonly<KeyTakeResult> {
    const k = this.keyStream;
    if (k === null) throw new Error('takeKey: this table has a custom hasher; use take()');
    if (!limitWords(limit).narrow)
      throw new RangeError(`takeKey: a limit window over ${NUMBER_STEP_MAX_NS} ns needs take()`);
    const out = this.hashOut;
    k.end(out);
    return this.takeHashed(out, limit, hits, nowNs, this.keyResult);
  }

  /** Whether takeKey() takes this limit (its window fits the numeric step). Validates the limit. */
  static keyTakes(limit: GcraLimit): boolean {
    return limitWords(limit).narrow;
  }

  private takeHashed(
    hash: Int32Array,
    limit: GcraLimit,
    hits: number,
    nowNs: bigint,
    res: MutableTakeResult,
  ): KeyTakeResult {
    if (!Number.isSafeInteger(hits) || hits < 0)
      throw new RangeError(`hits must be a non-negative safe integer, got ${hits}`);
    this.setNow(nowNs);
    // A malformed limit must fail here, never while this thread holds a slot's ver odd or CLAIMING.
    const words = limitWords(limit);
    let h0 = hash[0] ?? 0;
    if (h0 === EMPTY || h0 === CLAIMING) h0 += 2;
    const h1 = hash[1] ?? 0;
    const h2 = hash[2] ?? 0;
    for (;;) {
      let s = this.find(h0, h1, h2);
      if (s < 0) {
        if (words.x === 0) return KEY_BLOCKED;
        // A 0-hit report creates no 'full' bucket (it would report the same fresh one); an 'empty'
        // bucket is created by it, since it refills from its creation on: a key that is only ever
        // checked (a request refused at another level) must still start refilling.
        if (hits === 0 && limit.start === 'full') return this.reportFresh(limit, res);
        s = this.insert(h0, h1, h2, limit, words);
        if (s < 0) return KEY_TABLE_FULL;
      }
      if (this.takeAt(s, h0, h1, h2, limit, words, hits, res)) return res;
    }
  }

  /** Splits nowNs − startNs into this.nowHi / this.nowLo (range-checked). */
  private setNow(nowNs: bigint): void {
    const start = this.startNumber;
    const abs = Number(nowNs);
    if (start >= 0 && abs < TWO_53) {
      // Both exact as doubles: so is their difference.
      const rel = abs - start;
      if (rel < 0)
        throw new RangeError(`nowNs ${nowNs} is outside the table's time range (startNs ${this.startNs} ..)`);
      const hi = Math.floor(rel / TWO_32);
      this.nowHi = hi;
      this.nowLo = rel - hi * TWO_32;
      return;
    }
    const rel = nowNs - this.startNs;
    if (rel < 0n || rel > MAX_REL_NOW)
      throw new RangeError(`nowNs ${nowNs} is outside the table's time range (startNs ${this.startNs} .. +2^57)`);
    this.nowHi = Number(rel >> 32n);
    this.nowLo = Number(rel & LOW_32);
  }

  /** now − startNs as a bigint (off the hot path). */
  private nowRel(): bigint {
    return (BigInt(this.nowHi) << 32n) | BigInt(this.nowLo);
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
        if (Atomics.load(keys, 2 * s + 1) === h2 && Atomics.load(this.rec, RECORD_WORDS * s + R_K1) === h1) return s;
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
      Atomics.load(this.rec, RECORD_WORDS * s + R_K1) === h1
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
    words: LimitWords,
    hits: number,
    res: MutableTakeResult,
  ): boolean {
    const rec = this.rec;
    const at = RECORD_WORDS * s;
    let spins = 0;
    for (;;) {
      const v = Atomics.load(rec, at + R_VER);
      if ((v & 1) !== 0) {
        spins = this.backoff(spins);
        continue;
      }
      // A slot handed to another key changes its key words only while ver is odd: a stale key shows
      // here, or ver has moved when this read is validated (a mismatch is final either way: look again).
      if (!this.keyIs(s, h0, h1, h2)) return false;
      const dHi = Atomics.load(rec, at + R_D_HI);
      const dLo = Atomics.load(rec, at + R_D_LO);
      const x = Atomics.load(rec, at + R_X);
      if (dHi !== words.dHi || dLo !== words.dLo || x !== words.x) {
        this.reconfigure(s, v, dHi, dLo, x, limit);
        continue;
      }
      this.touch(s);
      if (x === 0) {
        if (Atomics.load(rec, at + R_VER) !== v) continue;
        copyInto(res, KEY_BLOCKED);
        return true;
      }
      const tatHi = Atomics.load(rec, at + R_TAT_HI);
      const tatLo = Atomics.load(rec, at + R_TAT_LO) >>> 0;
      const nowHi = this.nowHi;
      const nowLo = this.nowLo;
      // TAT − now: exact below 2^53 in magnitude; beyond, its sign is still right.
      const diff = (tatHi - nowHi) * TWO_32 + (tatLo - nowLo);
      if (!words.narrow || diff > NUMBER_STEP_MAX_NS) {
        const r = this.takeAtBig(at, v, tatHi, tatLo, limit, hits, res);
        if (r) return true;
        continue;
      }
      const d = gcraStepNumber(numberScratch, diff > 0 ? diff : 0, words.intervalNs, words.windowNs, words.burst, hits);
      if (d.allowed && hits !== 0) {
        if (Atomics.compareExchange(rec, at + R_VER, v, (v + 1) | 0) !== v) continue;
        // TAT' = now + nextDebt (nextDebt ≤ D ≤ 2^52): add in 32-bit words with the carry.
        const add = d.nextDebt;
        const addHi = Math.floor(add / TWO_32);
        let lo = nowLo + (add - addHi * TWO_32);
        let hi = nowHi + addHi;
        if (lo >= TWO_32) {
          lo -= TWO_32;
          hi += 1;
        }
        Atomics.store(rec, at + R_TAT_HI, hi);
        Atomics.store(rec, at + R_TAT_LO, lo | 0);
        Atomics.store(rec, at + R_VER, (v + 2) | 0);
      } else if (Atomics.load(rec, at + R_VER) !== v) {
        continue;
      }
      res.verdict = d.allowed ? 'allow' : 'deny';
      res.allowed = d.allowed;
      res.remaining = d.remaining;
      res.resetNs = d.resetNs;
      res.retryAfterNs = d.retryAfterNs;
      return true;
    }
  }

  /**
   * takeAt's step on bigint, for what the numeric step cannot hold exactly (a window over 2^52 ns, a
   * clock reading more than 2^52 ns behind the TAT): the same protocol, the exact times kept in
   * this.bigTimes for take(). false: ver moved, read again.
   */
  private takeAtBig(
    at: number,
    v: number,
    tatHi: number,
    tatLo: number,
    limit: GcraLimit,
    hits: number,
    res: MutableTakeResult,
  ): boolean {
    const rec = this.rec;
    const tat = (BigInt(tatHi) << 32n) | BigInt(tatLo);
    const n = BigInt(hits);
    const d = gcraStepInto(stepScratch, tat, this.nowRel(), limit.intervalNs, limit.windowNs, n);
    if (d.allowed && n !== 0n) {
      if (Atomics.compareExchange(rec, at + R_VER, v, (v + 1) | 0) !== v) return false;
      Atomics.store(rec, at + R_TAT_HI, Number(d.tat >> 32n));
      Atomics.store(rec, at + R_TAT_LO, Number(d.tat & LOW_32) | 0);
      Atomics.store(rec, at + R_VER, (v + 2) | 0);
    } else if (Atomics.load(rec, at + R_VER) !== v) {
      return false;
    }
    res.verdict = d.allowed ? 'allow' : 'deny';
    res.allowed = d.allowed;
    res.remaining = d.remaining;
    res.resetNs = Number(d.resetNs);
    res.retryAfterNs = d.retryAfterNs === NEVER_NS ? Infinity : Number(d.retryAfterNs);
    this.bigTimes = d;
    return true;
  }

  /** hits = 0 on an absent key: what a new bucket would report, without creating one. */
  private reportFresh(limit: GcraLimit, res: MutableTakeResult): KeyTakeResult {
    const nowRel = this.nowRel();
    const tat = this.initialTat(limit, nowRel);
    const d = gcraStepInto(stepScratch, tat, nowRel, limit.intervalNs, limit.windowNs, 0n);
    res.verdict = 'allow';
    res.allowed = true;
    res.remaining = d.remaining;
    res.resetNs = Number(d.resetNs);
    res.retryAfterNs = 0;
    this.bigTimes = d;
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

  /** Re-interpret slot s's TAT (read under ver v) for `limit`. A lost race just returns (caller retries). */
  private reconfigure(s: number, v: number, dHi: number, dLo: number, x: number, limit: GcraLimit): void {
    const rec = this.rec;
    const at = RECORD_WORDS * s;
    // Computed before locking, so nothing can throw while the slot's ver is odd. The words were read
    // under ver v; if they are stale the CAS below fails.
    const from = paramsOfWords(dHi, dLo, x);
    const tat = (BigInt(Atomics.load(rec, at + R_TAT_HI)) << 32n) | BigInt(Atomics.load(rec, at + R_TAT_LO) >>> 0);
    const nowRel = this.nowRel();
    const asOfNow = gcraReconfigure(tat, nowRel, from, limit);
    const since = this.reconfigureAt(from.intervalNs, from.windowNs, limit, nowRel);
    // As of a past instant, but never more tokens than as of now (the larger TAT): should the bucket
    // have been taken from under `from` after that instant (another grant with the same numbers),
    // going back would forget that debt.
    const asOfThen = since < nowRel ? gcraReconfigure(tat, since, from, limit) : asOfNow;
    const next = asOfThen > asOfNow ? asOfThen : asOfNow;
    const words = limitWords(limit);
    if (Atomics.compareExchange(rec, at + R_VER, v, (v + 1) | 0) !== v) return;
    this.writeLimit(at, words);
    this.writeTat(at, next);
    Atomics.store(rec, at + R_VER, (v + 2) | 0);
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

  private writeLimit(at: number, words: LimitWords): void {
    const rec = this.rec;
    Atomics.store(rec, at + R_D_HI, words.dHi);
    Atomics.store(rec, at + R_D_LO, words.dLo);
    Atomics.store(rec, at + R_X, words.x);
  }

  private writeTat(at: number, tat: bigint): void {
    Atomics.store(this.rec, at + R_TAT_HI, Number(tat >> 32n));
    Atomics.store(this.rec, at + R_TAT_LO, Number(tat & LOW_32) | 0);
  }

  /** The access stamp of now: (now − startNs) / 2^30, from its two words. */
  private stamp(): number {
    return this.nowHi * 4 + (this.nowLo >>> 30);
  }

  private touch(s: number): void {
    const stamp = this.stamp();
    const i = RECORD_WORDS * s + R_ACCESS;
    if (Atomics.load(this.rec, i) !== stamp) Atomics.store(this.rec, i, stamp);
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
  private insert(h0: number, h1: number, h2: number, limit: GcraLimit, words: LimitWords): number {
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
      const nowRel = this.nowRel();
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
          // A slot never used: its ver is even (0) and no reader finds it before k0 is published.
          this.publish(s, h0, h1, h2, limit, words, nowRel);
          return s;
        }
        Atomics.sub(this.h32, H_SIZE, 1);
      }
      return this.evictInto(homesHaveEmpty ? homes : homes.concat(overflow), h0, h1, h2, limit, words, nowRel);
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
    words: LimitWords,
    nowRel: bigint,
  ): number {
    const rec = this.rec;
    const nowHi = this.nowHi;
    const nowLo = this.nowLo;
    for (let attempt = 0; attempt < 4; attempt++) {
      let best = -1;
      let bestV = 0;
      let bestStamp = 0;
      for (const g of groups) {
        for (let s = g * GROUP, end = s + GROUP; s < end; s++) {
          const k = Atomics.load(this.keys, 2 * s);
          if (k === EMPTY || k === CLAIMING) continue;
          const at = RECORD_WORDS * s;
          const v = Atomics.load(rec, at + R_VER);
          if ((v & 1) !== 0) continue;
          // Only a full bucket (TAT ≤ now) or a rate-0 one (no tokens) may go; the CAS below checks
          // that nothing changed since these reads.
          if (Atomics.load(rec, at + R_X) !== 0) {
            const tatHi = Atomics.load(rec, at + R_TAT_HI);
            const tatLo = Atomics.load(rec, at + R_TAT_LO) >>> 0;
            if (tatHi > nowHi || (tatHi === nowHi && tatLo > nowLo)) continue;
          }
          const stamp = Atomics.load(rec, at + R_ACCESS);
          if (best < 0 || stamp < bestStamp) {
            best = s;
            bestV = v;
            bestStamp = stamp;
          }
        }
      }
      if (best < 0) return -1;
      this.raiseFloor(nowRel);
      const at = RECORD_WORDS * best;
      if (Atomics.compareExchange(rec, at + R_VER, bestV, (bestV + 1) | 0) !== bestV) continue;
      // The slot is ours: a thread that read it before fails its CAS or its re-read of ver; readers
      // wait while ver is odd and then see the key change.
      Atomics.add(this.h64, H_EVICTIONS, 1n);
      Atomics.store(this.keys, 2 * best, CLAIMING);
      this.publish(best, h0, h1, h2, limit, words, nowRel);
      Atomics.store(rec, at + R_VER, (bestV + 2) | 0);
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

  /** Fill a slot we own (k0 = CLAIMING): key words, limit and state, then k0 last. */
  private publish(
    s: number,
    h0: number,
    h1: number,
    h2: number,
    limit: GcraLimit,
    words: LimitWords,
    nowRel: bigint,
  ): void {
    const rec = this.rec;
    const at = RECORD_WORDS * s;
    Atomics.store(this.keys, 2 * s + 1, h2);
    Atomics.store(rec, at + R_K1, h1);
    Atomics.store(rec, at + R_ACCESS, this.stamp());
    this.writeLimit(at, words);
    this.writeTat(at, this.initialTat(limit, nowRel));
    Atomics.store(this.keys, 2 * s, h0);
  }
}

function copyInto(to: MutableTakeResult, from: KeyTakeResult): void {
  to.verdict = from.verdict;
  to.allowed = from.allowed;
  to.remaining = from.remaining;
  to.resetNs = from.resetNs;
  to.retryAfterNs = from.retryAfterNs;
}
