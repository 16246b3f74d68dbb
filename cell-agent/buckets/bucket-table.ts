// The agent's bucket table: a fixed-capacity open-addressing hash table of GCRA buckets in ONE
// SharedArrayBuffer, so several worker threads decide from the same buckets exactly.
//
// Layout (one SharedArrayBuffer; S slots in groups of 8):
//   header  64 B: startNs, evictions, evictFloor (BigInt64); magic, version, capacity, groups, lock
//                 count, size, seed, sleep word (Int32)
//   keys    Int32[2S]: per slot k0 (key hash word 0, moved out of [0, 128): 0 = EMPTY, 1 + r = being
//                 claimed by the thread of record r, 127 = DEAD) and k2 (check word), interleaved
//                 so that a group's 8 (k0, k2) pairs fill exactly one 64-byte cache line
//   records 32 B per slot (one aligned half cache line), eight Int32 words:
//     ver      the slot's sequence word (a seqlock): even = stable; odd = held by the thread of record
//              r, which writes the slot (a decision storing its TAT, a re-configuration, an
//              eviction): 2r + 1; +2 per write
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
//   locks   Int32[L]: insert stripes (futex-style mutexes naming their holder), picked by key hash
//   threads 64 × 64 B: one record per attached thread (its owner, and what its latest claim writes)
//   = 40 B per slot, S ≈ 1.25 × capacity: ≈ 50 B per key (bytesFor()). A decision touches two cache
//   lines when the key is in its first home group.
//
// Decisions (seqlock): read ver (odd: wait), check the key is still the slot's, read the config and
// the TAT, compute the GCRA step; a refused take (or a 0-hit report) then re-reads ver and retries if
// it moved, an admitted one claims the slot with Atomics.compareExchange(ver, v, 2r + 1), stores the
// new TAT and publishes ver = v + 2. Every write to a slot's words, and every read a decision is
// validated by, is an Atomics operation on an
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
// Atomics.wait in 50 µs steps); it never blocks a thread working on another slot. A waiter gives up
// after NAPS_BEFORE_GIVING_UP naps (≥ 10 ms): the take is refused as busy (below).
//
// Plain reads. An Atomics.load costs ~10 ns on Node 20 (a builtin call) against ~1 ns for a plain
// read, so the words a decision computes on — the limit (3 words) and the TAT (2), and the access
// stamp — are read plain after the Atomics read of ver (the key words stay on Atomics: keyIs), and
// nothing is decided on them unvalidated:
// - an admission (and a re-configuration) counts only if its CAS from v succeeds. Then its plain
//   reads saw exactly the state published with v: that publish (an Atomics store, read by the first
//   ver read) happens before them, so they see its writes or later ones; and a later write exists
//   only after a claim of the slot, which must read this CAS's own publish, so it happens after
//   them (ECMAScript's memory model: synchronizes-with through the SC ver word). So the computation
//   is the one Atomics reads would have given.
// - a refusal (or a report, rate 0) writes nothing, so no CAS validates it: readsHeld() reads the
//   words it used again on Atomics and ver last, and the decision stands only if all are unchanged.
//   Atomics reads between two Atomics reads of the same even ver see no write of a claim (every write
//   of the slot is an Atomics store made while ver is odd): the decision is the one the Atomics
//   reads give, i.e. the protocol above. Writers keep every store on Atomics for this reason (a plain
//   store after the claim could be seen early on a weakly ordered CPU).
// The cost is only the refusal's: 5 Atomics reads it made before, now made after its plain ones.
//
// Placement: a key has two home groups (two-choice hashing) and, only when both homes hold no EMPTY
// slot, 4 overflow groups next to them: at most 48 slots are ever probed. Slots are never emptied
// again (eviction hands the slot straight to the new key), so a lookup that sees an EMPTY slot in a
// home group knows the key is absent without looking at the overflow groups.
//
// Inserts of the SAME key are serialized by a stripe lock picked by the key's hash (misses only; hits
// never lock), so a key can never get two buckets (two buckets would double its limit). A slot is
// claimed race-free: an EMPTY slot by CAS k0 EMPTY → 1 + r (then filled and published with k0
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
// same buffer, and takes a thread record r (by its threadId; at most 64 threads at a time).
//
// Dead threads. A thread holds a slot from its claim to its publish (a few stores), and an insert
// stripe around an insert. If it stopped for good in there — a worker terminated, or killed by
// ERR_WORKER_OUT_OF_MEMORY — the slot or stripe would stay held against every thread for good (the
// main thread's re-configurations and evictions too), and one waiting on it would spin forever.
// Three parts make that impossible:
// - The window has nothing in it that can throw or stop the thread itself. Every value a claim
//   writes is computed before it (the TAT's words, the limit's, a new bucket's: commitTat,
//   reconfigure, prepareFill); the window is the rest of ONE function body after its CAS: Atomics
//   stores of those values, no call of JS code (a stack-overflow RangeError is raised at a call's
//   entry, and that entry lies before the claim), no allocation (no GC, no out-of-memory there), no
//   loop (V8 delivers a terminate() at calls and loop back-edges). Before, the window called
//   writeLimit / writeTat / publish and computed BigInt in it: a RangeError thrown there left the
//   slot odd in a thread that went on serving (the decider answered fail-open).
// - What a thread holds is named in shared memory, so that once the thread is gone its supervisor
//   can release it (releaseThread; cell-agent/agent-workers.ts calls it on a worker's 'exit'). The
//   odd ver value is the holder's own (2r + 1, not v + 1), as are an EMPTY slot's claim (k0 = 1 + r)
//   and a stripe's lock word ((1 + r)·2): whether the dead thread holds a slot is read from the slot
//   itself, exactly. Its thread record says what to put back: before each claim the thread writes
//   the slot, v and the state before (the TAT; a re-configuration's limit words too) there, with
//   plain stores (about a nanosecond each). The record can be stale (the CAS after it failed, or the
//   write was published): the slot's own word tells, so it is never cleared — the direction first
//   proposed (a record written and cleared with Atomics around every admission, two more
//   sequentially consistent stores on the hot path) could not tell a record written just before a
//   failed CAS from a hold either. The CAS orders the record before the claim; releaseThread reads
//   it only after the thread's exit. An admission or re-configuration is undone exactly (the state
//   before the claim, as if the write never began: its request was never answered), so no count
//   moves; an insert or eviction, whose key words may be half written, leaves the slot DEAD: it
//   matches no key, holds rate 0 and the oldest stamp (the first an eviction takes; it counts in
//   size() until then), and the key it was for is absent (an evicted key's evictFloor was raised
//   before its eviction). A release never gives a bucket more tokens than it had: the bound holds.
// - A wait is bounded: past NAPS_BEFORE_GIVING_UP naps the take is refused as busy: verdict 'deny',
//   retryAfter BUSY_RETRY_NS, counted (busyRefusals); a stripe that cannot be taken refuses the
//   insert the same way. Never 'table-full': a holder that is alive but descheduled for 10 ms is
//   ordinary on a loaded machine, and under the default --table-full open every other thread's take
//   of that key would be admitted while it waits (review: 22 admitted of a 2/hour bucket). A refusal
//   never breaks the bound; it costs the request a retry, never a silent pass or an endless spin.
// What stays undefined: releaseThread on a thread that still runs (the caller must know it exited).
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

import { IdentityMemo } from '../../shared/identity-memo.js';
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
import { threadId } from 'node:worker_threads';
import { fmix32, hashKey, KeyHashStream, type KeyHasher } from './key-hash.js';

export type { KeyHasher } from './key-hash.js';

/**
 * 'allow' / 'deny': a decision ('deny' also when the key's slot or insert stripe is held by another
 * thread past the wait bound: see above). 'table-full': no slot can be had for a new key.
 */
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
const VERSION = 3;
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
const H_BUSY = 3;
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

// k0 values [0, KEY_RESERVED) are never a key's (keyWord0 moves a hash word there up by KEY_RESERVED):
// EMPTY, the insert claim of thread record h (1 + h) and DEAD (a slot repaired after its writer died).
const EMPTY = 0;
const DEAD = 127;
const KEY_RESERVED = 128;

// Thread records (one per attached thread, each in its own cache line): Int32 offsets.
/** Threads that may attach one table at once (the agent's main thread and its serving workers). */
export const MAX_THREADS = 64;
const THREAD_WORDS = 16;
const T_OWNER = 0; // threadId + 1 of the thread holding the record (0: free); Atomics
const T_SLOT = 1; // the slot of the thread's latest claim (plain stores, read only after the thread died)
const T_VER = 2; // the even ver it claimed it from
const T_KIND = 3; // what that claim writes: CLAIM_* below
const T_TAT_HI = 4; // the slot's state before it: its TAT ...
const T_TAT_LO = 5;
const T_D_HI = 6; // ... and, for a re-configuration, its limit words
const T_D_LO = 7;
const T_X = 8;
const CLAIM_NONE = 0;
const CLAIM_ADMIT = 1;
const CLAIM_RECONFIGURE = 2;
const CLAIM_EVICT = 3;
const CLAIM_INSERT = 4;
const TWO_32 = 4294967296;
const TWO_53 = 2 ** 53;
const LOW_32 = 0xffff_ffffn;
const MAX_REL_NOW = 1n << 57n;
const SPINS_BEFORE_SLEEP = 64;
/** Naps (Atomics.wait, NAP_MS each) a waiter takes before it gives up on a held slot or stripe. */
const NAPS_BEFORE_GIVING_UP = 200;
const NAP_MS = 0.05;
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

/**
 * The limits limitWords() answered for last, and their words: a decision meets one limit, or a few
 * (two descriptors: a shared and a per-client limit), again and again — no WeakMap lookup then.
 */
const recentWords = new IdentityMemo<GcraLimit, LimitWords>();

/** Validates a limit and gives its words (computed once per frozen limit object). */
function limitWords(limit: GcraLimit): LimitWords {
  const recent = recentWords.get(limit);
  if (recent !== undefined) return recent;
  const known = wordsOfLimit.get(limit);
  if (known !== undefined) {
    recentWords.set(limit, known);
    return known;
  }
  return wordsOf(limit);
}

function wordsOf(limit: GcraLimit): LimitWords {
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
  if (Object.isFrozen(limit)) {
    wordsOfLimit.set(limit, words);
    recentWords.set(limit, words);
  }
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
/** The wait a busy refusal names (a slot held past the wait bound): short, the holder is usually just descheduled. */
const BUSY_RETRY_NS = 100_000_000;
/** insert()'s answer when its stripe is held past the wait bound. */
const INSERT_BUSY = -2;
const KEY_BUSY: KeyTakeResult = Object.freeze({
  verdict: 'deny',
  allowed: false,
  remaining: 0,
  resetNs: 0,
  retryAfterNs: BUSY_RETRY_NS,
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

/** A key's k0 word: its hash word 0, moved out of the reserved values. */
function keyWord0(h0: number): number {
  return h0 >= 0 && h0 < KEY_RESERVED ? h0 + KEY_RESERVED : h0;
}

/** The test hook between a claim and its writes (setClaimHookForTesting); null in production. */
let claimHook: ((slot: number) => void) | null = null;

/**
 * Tests only: `hook(slot)` runs in every claim's window, after the claim and before the writes and
 * the publish (in the thread that calls this; a hook that parks makes the window observable).
 */
export function setClaimHookForTesting(hook: ((slot: number) => void) | null): void {
  claimHook = hook;
}

/** What releaseThread() found and repaired for a thread that is gone. */
export interface ThreadRelease {
  /** The slot it held between a claim and its publish, restored (-1: none). */
  readonly slot: number;
  /** What that claim wrote: 'admit' | 're-configure' (old state restored), 'evict' | 'insert' (slot made DEAD). */
  readonly claim: 'admit' | 're-configure' | 'evict' | 'insert' | null;
  /** Insert stripes it held, released. */
  readonly stripes: number;
}

function layoutFor(capacity: number): Layout {
  if (!Number.isSafeInteger(capacity) || capacity < 1 || capacity > 50_000_000) {
    throw new RangeError(`capacity must be an integer in [1, 50e6], got ${capacity}`);
  }
  const groups = Math.max(2, Math.ceil((capacity * SLOTS_PER_KEY) / GROUP));
  const slots = groups * GROUP;
  let locks = 64;
  while (locks < 4096 && locks < groups / 4) locks *= 2;
  const bytes = HEADER_BYTES + slots * (KEY_BYTES + RECORD_BYTES) + locks * 4 + MAX_THREADS * THREAD_WORDS * 4;
  return { groups, slots, locks, bytes };
}

/** The record of thread `threadId` in a table's thread records: its own (a second attach), else a free one. */
function claimThreadRecord(threads: Int32Array, threadId: number): number {
  const owner = threadId + 1;
  for (let r = 0; r < MAX_THREADS; r++) if (Atomics.load(threads, r * THREAD_WORDS + T_OWNER) === owner) return r;
  for (let r = 0; r < MAX_THREADS; r++) {
    if (Atomics.compareExchange(threads, r * THREAD_WORDS + T_OWNER, 0, owner) === 0) {
      Atomics.store(threads, r * THREAD_WORDS + T_KIND, CLAIM_NONE);
      return r;
    }
  }
  throw new RangeError(
    `bucket table: ${MAX_THREADS} threads are attached already (a thread that is gone is released with releaseThread)`,
  );
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
  /** Every thread's record (MAX_THREADS × THREAD_WORDS). */
  private readonly threads: Int32Array;
  /** This thread's record: its first word's index in `threads`. */
  private readonly mine: number;
  /** This thread's odd ver value while it holds a slot: 2·record + 1. */
  private readonly slotTag: number;
  /** This thread's k0 value while it claims an EMPTY slot: 1 + record. */
  private readonly claimTag: number;
  /** This thread's stripe-lock value (the low bit marks waiters): (1 + record) · 2. */
  private readonly stripeTag: number;
  /** The bucket insert() / evictInto() write into a claimed slot, computed before the claim. */
  private fillH0 = 0;
  private fillH1 = 0;
  private fillH2 = 0;
  private fillDHi = 0;
  private fillDLo = 0;
  private fillX = 0;
  private fillTatHi = 0;
  private fillTatLo = 0;
  private fillStamp = 0;
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
    this.threads = new Int32Array(buffer, recOff + S * RECORD_BYTES + layout.locks * 4, MAX_THREADS * THREAD_WORDS);
    const record = claimThreadRecord(this.threads, threadId);
    this.mine = record * THREAD_WORDS;
    this.slotTag = 2 * record + 1;
    this.claimTag = 1 + record;
    this.stripeTag = (1 + record) * 2;
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
    return this.find(keyWord0(out[0] ?? 0), out[1] ?? 0, out[2] ?? 0) >= 0;
  }

  /** Whether the key has a bucket kept under `params` (its T and D) now (off the hot path: assertions). */
  keptUnder(key: string, params: GcraParams): boolean {
    const out = this.hashOut;
    this.hasher(key, this.seed, out);
    const s = this.find(keyWord0(out[0] ?? 0), out[1] ?? 0, out[2] ?? 0);
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

  /** Takes refused because the key's slot or insert stripe stayed held past the wait bound (all threads). */
  get busyRefusals(): number {
    return Number(Atomics.load(this.h64, H_BUSY));
  }

  /** A busy refusal into res, counted. */
  private busy(res: MutableTakeResult): KeyTakeResult {
    Atomics.add(this.h64, H_BUSY, 1n);
    copyInto(res, KEY_BUSY);
    return res;
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
    this.setNow(nowNs);
    const r = this.takeHashed(out, limit, null, hits, this.plainResult);
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
    this.setNow(nowNs);
    return this.takeKeyNow(limit, hits);
  }

  /**
   * takeKey() at `elapsed[0]` ns since startNs (an ElapsedClock's reading, elapsed-clock.ts: a safe
   * integer ≥ 0, else a RangeError before anything is taken): the time never becomes a bigint or a
   * boxed number on its way, so the take allocates nothing at all. The same answer as takeKey() at
   * startNs + elapsed[0].
   */
  takeKeyAt(limit: GcraLimit, hits: number, elapsed: Float64Array): Readonly<KeyTakeResult> {
    this.setElapsed(elapsed[0] as number);
    return this.takeKeyNow(limit, hits);
  }

  /** takeKey() at the time set last (setNow / setElapsed). */
  private takeKeyNow(limit: GcraLimit, hits: number): Readonly<KeyTakeResult> {
    const k = this.keyStream;
    if (k === null) throw new Error('takeKey: this table has a custom hasher; use take()');
    // A malformed limit fails here, never while this thread holds a slot's ver odd or claimed.
    const words = limitWords(limit);
    if (!words.narrow) throw new RangeError(`takeKey: a limit window over ${NUMBER_STEP_MAX_NS} ns needs take()`);
    const out = this.hashOut;
    k.end(out);
    return this.takeHashed(out, limit, words, hits, this.keyResult);
  }

  /**
   * The hash words of the key hashed last (by takeKey / takeKeyAt, or any call given a string key):
   * the bucket's identity in this table. Valid until this table object's next call.
   */
  get lastKeyHash(): Readonly<Int32Array> {
    return this.hashOut;
  }

  /** Whether takeKey() takes this limit (its window fits the numeric step). Validates the limit. */
  static keyTakes(limit: GcraLimit): boolean {
    return limitWords(limit).narrow;
  }

  private takeHashed(
    hash: Int32Array,
    limit: GcraLimit,
    known: LimitWords | null,
    hits: number,
    res: MutableTakeResult,
  ): KeyTakeResult {
    if (!Number.isSafeInteger(hits) || hits < 0)
      throw new RangeError(`hits must be a non-negative safe integer, got ${hits}`);
    // A malformed limit must fail here, never while this thread holds a slot's ver odd or claimed.
    const words = known ?? limitWords(limit);
    const h0 = keyWord0(hash[0] ?? 0);
    const h1 = hash[1] ?? 0;
    const h2 = hash[2] ?? 0;
    // The first probe on plain reads (findHint); a miss, and every probe after a slot changed hands
    // under us, on Atomics (find).
    let s = this.findHint(h0, h1, h2);
    for (;;) {
      if (s < 0) s = this.find(h0, h1, h2);
      if (s < 0) {
        if (words.x === 0) return KEY_BLOCKED;
        // A 0-hit report creates no 'full' bucket (it would report the same fresh one); an 'empty'
        // bucket is created by it, since it refills from its creation on: a key that is only ever
        // checked (a request refused at another level) must still start refilling.
        if (hits === 0 && limit.start === 'full') return this.reportFresh(limit, res);
        s = this.insert(h0, h1, h2, limit, words);
        if (s === INSERT_BUSY) return this.busy(res);
        if (s < 0) return KEY_TABLE_FULL;
      }
      if (this.takeAt(s, h0, h1, h2, limit, words, hits, res)) return res;
      s = -1;
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

  /** Sets this.nowHi / this.nowLo from now − startNs as a number (a safe integer ≥ 0). */
  private setElapsed(rel: number): void {
    if (!Number.isSafeInteger(rel) || rel < 0)
      throw new RangeError(`elapsed ${rel} ns is outside the table's time range (a safe integer ≥ 0)`);
    const hi = Math.floor(rel / TWO_32);
    this.nowHi = hi;
    this.nowLo = rel - hi * TWO_32;
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

  /**
   * The key's slot in group g; else -2 if the group has an EMPTY slot, -1 if not. `plain`: the key
   * words are read with plain loads (findHint), else with Atomics.
   */
  private scanGroup(g: number, h0: number, h1: number, h2: number, plain: boolean): number {
    const keys = this.keys;
    const rec = this.rec;
    let sawEmpty = false;
    for (let s = g * GROUP, end = s + GROUP; s < end; s++) {
      const k = plain ? (keys[2 * s] as number) : Atomics.load(keys, 2 * s);
      if (k === h0) {
        if (plain) {
          if (keys[2 * s + 1] === h2 && rec[RECORD_WORDS * s + R_K1] === h1) return s;
        } else if (Atomics.load(keys, 2 * s + 1) === h2 && Atomics.load(rec, RECORD_WORDS * s + R_K1) === h1) {
          return s;
        }
      } else if (k === EMPTY) {
        sawEmpty = true;
      }
    }
    return sawEmpty ? -2 : -1;
  }

  /** The key's slot, -1 if it has none (Atomics reads: a miss here is a miss). */
  private find(h0: number, h1: number, h2: number): number {
    return this.probe(h0, h1, h2, false);
  }

  /**
   * find() on plain reads, for the first probe of a take: a hint, as find()'s answer always was — a
   * slot that held the key when its words were read, which takeAt checks again (keyIs, Atomics) after
   * it has read the slot's sequence word, before it decides anything; a miss (-1) is confirmed by
   * find() before a bucket is reported fresh or inserted. An Atomics.load costs ~13 ns here against ~2
   * for a plain read (Node 20, V8 11; test: 2·10^7 loads), and the probe is 10 of an admission's 20
   * loads. (A plain read that races a writer returns one of the values written: never undefined
   * behaviour in JavaScript, only a stale hint, which keyIs refuses.)
   */
  private findHint(h0: number, h1: number, h2: number): number {
    return this.probe(h0, h1, h2, true);
  }

  private probe(h0: number, h1: number, h2: number, plain: boolean): number {
    const ga = this.homeA(h1);
    const a = this.scanGroup(ga, h0, h1, h2, plain);
    if (a >= 0) return a;
    const gb = this.homeB(h0, h2, ga);
    const b = this.scanGroup(gb, h0, h1, h2, plain);
    if (b >= 0) return b;
    if (a === -2 || b === -2) return -1; // a key lives in an overflow group only if both homes were full
    const G = this.groups;
    for (let j = 1; j <= OVERFLOW_STEPS; j++) {
      const x = this.scanGroup((ga + j) % G, h0, h1, h2, plain);
      if (x >= 0) return x;
      const y = this.scanGroup((gb + j) % G, h0, h1, h2, plain);
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
        if (spins > SPINS_BEFORE_SLEEP + NAPS_BEFORE_GIVING_UP) {
          // Held past the bound (its writer descheduled that long, or dead until its supervisor
          // releases it): refused as busy (see the header), never left to the table-full policy.
          this.busy(res);
          return true;
        }
        continue;
      }
      // A slot handed to another key changes its key words only while ver is odd: a stale key shows
      // here, or ver has moved when this read is validated (a mismatch is final either way: look again).
      if (!this.keyIs(s, h0, h1, h2)) return false;
      // The slot's limit and TAT on plain reads (an Atomics.load costs ~10 ns here, a plain one ~1):
      // every decision made on them is validated on Atomics before it counts ("Plain reads" in the
      // header): an admission (and a re-configuration) by its CAS from v, a refusal by readsHeld().
      const dHi = rec[at + R_D_HI] as number;
      const dLo = rec[at + R_D_LO] as number;
      const x = rec[at + R_X] as number;
      if (dHi !== words.dHi || dLo !== words.dLo || x !== words.x) {
        this.reconfigure(s, v, dHi, dLo, x, limit);
        continue;
      }
      this.touch(s);
      const tatHiWord = rec[at + R_TAT_HI] as number;
      const tatLoWord = rec[at + R_TAT_LO] as number;
      if (x === 0) {
        if (!this.readsHeld(at, v, words, tatHiWord, tatLoWord)) continue;
        copyInto(res, KEY_BLOCKED);
        return true;
      }
      const tatHi = tatHiWord;
      const tatLo = tatLoWord >>> 0;
      const nowHi = this.nowHi;
      const nowLo = this.nowLo;
      // TAT − now: exact below 2^53 in magnitude; beyond, its sign is still right.
      const diff = (tatHi - nowHi) * TWO_32 + (tatLo - nowLo);
      if (!words.narrow || diff > NUMBER_STEP_MAX_NS) {
        const r = this.takeAtBig(s, v, tatHi, tatLo, limit, hits, res);
        if (r) return true;
        continue;
      }
      const d = gcraStepNumber(numberScratch, diff > 0 ? diff : 0, words.intervalNs, words.windowNs, words.burst, hits);
      if (d.allowed && hits !== 0) {
        // TAT' = now + nextDebt (nextDebt ≤ D ≤ 2^52): add in 32-bit words with the carry.
        const add = d.nextDebt;
        const addHi = Math.floor(add / TWO_32);
        let lo = nowLo + (add - addHi * TWO_32);
        let hi = nowHi + addHi;
        if (lo >= TWO_32) {
          lo -= TWO_32;
          hi += 1;
        }
        if (!this.commitTat(s, v, tatHi, tatLo, hi, lo | 0)) continue;
      } else if (!this.readsHeld(at, v, words, tatHiWord, tatLoWord)) {
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
    s: number,
    v: number,
    tatHi: number,
    tatLo: number,
    limit: GcraLimit,
    hits: number,
    res: MutableTakeResult,
  ): boolean {
    const tat = (BigInt(tatHi) << 32n) | BigInt(tatLo);
    const n = BigInt(hits);
    const d = gcraStepInto(stepScratch, tat, this.nowRel(), limit.intervalNs, limit.windowNs, n);
    if (d.allowed && n !== 0n) {
      if (!this.commitTat(s, v, tatHi, tatLo, Number(d.tat >> 32n), Number(d.tat & LOW_32) | 0)) return false;
    } else if (!this.readsHeld(RECORD_WORDS * s, v, limitWords(limit), tatHi, tatLo | 0)) {
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

  /**
   * Whether a decision that writes nothing (a refusal, a report, rate 0) made on plain reads of the
   * slot at `at` under ver v — its limit `words`, its TAT words — stands: the same words read again
   * on Atomics, and ver still v after them. Then the decision is the one Atomics reads between two
   * reads of the same even ver would have given: consistent and current (the header, "Plain reads").
   */
  private readsHeld(at: number, v: number, words: LimitWords, tatHi: number, tatLo: number): boolean {
    const rec = this.rec;
    return (
      Atomics.load(rec, at + R_TAT_HI) === tatHi &&
      Atomics.load(rec, at + R_TAT_LO) === tatLo &&
      Atomics.load(rec, at + R_D_HI) === words.dHi &&
      Atomics.load(rec, at + R_D_LO) === words.dLo &&
      Atomics.load(rec, at + R_X) === words.x &&
      Atomics.load(rec, at + R_VER) === v
    );
  }

  /**
   * An admission's write: claims slot s from ver v, stores the new TAT (hi, lo) and publishes v + 2;
   * false if ver is no longer v. The window between the claim and the publish is this method's body
   * after the CAS: Atomics stores of values computed before it, no call, no allocation (see "Dead
   * threads" above); the thread record (plain stores, before the claim) says what to restore.
   */
  private commitTat(s: number, v: number, oldHi: number, oldLo: number, hi: number, lo: number): boolean {
    this.noteClaim(s, v, CLAIM_ADMIT, oldHi, oldLo);
    const rec = this.rec;
    const at = RECORD_WORDS * s;
    if (Atomics.compareExchange(rec, at + R_VER, v, this.slotTag) !== v) return false;
    if (claimHook !== null) claimHook(s);
    Atomics.store(rec, at + R_TAT_HI, hi);
    Atomics.store(rec, at + R_TAT_LO, lo);
    Atomics.store(rec, at + R_VER, (v + 2) | 0);
    return true;
  }

  /**
   * Notes in this thread's record, with plain stores before the claim (see "Dead threads" above), the
   * slot it is about to claim from ver v, what the claim writes and the TAT before it: what
   * releaseThread puts back should the thread stop inside the window.
   */
  private noteClaim(s: number, v: number, kind: number, oldHi: number, oldLo: number): void {
    const t = this.threads;
    const me = this.mine;
    t[me + T_SLOT] = s;
    t[me + T_VER] = v;
    t[me + T_KIND] = kind;
    t[me + T_TAT_HI] = oldHi;
    t[me + T_TAT_LO] = oldLo;
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
    const oldHi = Atomics.load(rec, at + R_TAT_HI);
    const oldLo = Atomics.load(rec, at + R_TAT_LO);
    const tat = (BigInt(oldHi) << 32n) | BigInt(oldLo >>> 0);
    const nowRel = this.nowRel();
    const asOfNow = gcraReconfigure(tat, nowRel, from, limit);
    const since = this.reconfigureAt(from.intervalNs, from.windowNs, limit, nowRel);
    // As of a past instant, but never more tokens than as of now (the larger TAT): should the bucket
    // have been taken from under `from` after that instant (another grant with the same numbers),
    // going back would forget that debt.
    const asOfThen = since < nowRel ? gcraReconfigure(tat, since, from, limit) : asOfNow;
    const next = asOfThen > asOfNow ? asOfThen : asOfNow;
    const words = limitWords(limit);
    const hi = Number(next >> 32n);
    const lo = Number(next & LOW_32) | 0;
    this.noteClaim(s, v, CLAIM_RECONFIGURE, oldHi, oldLo);
    const t = this.threads;
    const me = this.mine;
    t[me + T_D_HI] = dHi;
    t[me + T_D_LO] = dLo;
    t[me + T_X] = x;
    if (Atomics.compareExchange(rec, at + R_VER, v, this.slotTag) !== v) return;
    // The window: stores only (see commitTat).
    if (claimHook !== null) claimHook(s);
    Atomics.store(rec, at + R_D_HI, words.dHi);
    Atomics.store(rec, at + R_D_LO, words.dLo);
    Atomics.store(rec, at + R_X, words.x);
    Atomics.store(rec, at + R_TAT_HI, hi);
    Atomics.store(rec, at + R_TAT_LO, lo);
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

  /** The access stamp of now: (now − startNs) / 2^30, from its two words. */
  private stamp(): number {
    return this.nowHi * 4 + (this.nowLo >>> 30);
  }

  private touch(s: number): void {
    const stamp = this.stamp();
    const i = RECORD_WORDS * s + R_ACCESS;
    // A plain read (a hint: at worst one store too many); the store, once per stamp (~1 s) per key, on Atomics.
    if (this.rec[i] !== stamp) Atomics.store(this.rec, i, stamp);
  }

  /** One step of a wait for a held slot: spin, then nap; the caller gives up past the bound. */
  private backoff(spins: number): number {
    if (spins >= SPINS_BEFORE_SLEEP) Atomics.wait(this.h32, H_SLEEP, 0, NAP_MS);
    return spins + 1;
  }

  // ---- insert / evict -------------------------------------------------------------------------

  /**
   * Takes insert stripe i (a futex-style mutex whose word names its holder: this thread's stripeTag,
   * the low bit set while others wait). false once the wait bound has passed (its holder descheduled
   * that long, or dead until its supervisor releases it): the insert gives up.
   */
  private lock(i: number): boolean {
    const locks = this.locks;
    const mine = this.stripeTag;
    let c = Atomics.compareExchange(locks, i, 0, mine);
    for (let naps = 0; c !== 0;) {
      if ((c & 1) === 0) {
        // Mark that a waiter is there (the holder's unlock then wakes it).
        const d = Atomics.compareExchange(locks, i, c, c | 1);
        if (d !== c) {
          c = d === 0 ? Atomics.compareExchange(locks, i, 0, mine | 1) : d;
          continue;
        }
      }
      if (naps++ >= NAPS_BEFORE_GIVING_UP) return false;
      Atomics.wait(locks, i, c | 1, NAP_MS);
      // Taken with the waiter bit kept: others may still wait.
      c = Atomics.compareExchange(locks, i, 0, mine | 1);
    }
    return true;
  }

  private unlock(i: number): void {
    if ((Atomics.exchange(this.locks, i, 0) & 1) !== 0) Atomics.notify(this.locks, i);
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

  /** Claims an EMPTY slot of group g and writes the prepared bucket into it; -1 if none. */
  private claimEmpty(g: number): number {
    const keys = this.keys;
    for (let s = g * GROUP, end = s + GROUP; s < end; s++)
      if (Atomics.load(keys, 2 * s) === EMPTY && this.claimAndFill(s, false, 0)) return s;
    return -1;
  }

  /** Find or create the key's slot; -1 if no slot can be had (table full of busy buckets). */
  private insert(h0: number, h1: number, h2: number, limit: GcraLimit, words: LimitWords): number {
    const li = (h1 ^ h2) & this.lockMask;
    if (!this.lock(li)) return INSERT_BUSY;
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
        this.prepareFill(h0, h1, h2, limit, words, nowRel);
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
        if (s >= 0) return s;
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
          if (k >= EMPTY && k <= MAX_THREADS) continue; // EMPTY, or being claimed
          const at = RECORD_WORDS * s;
          const v = Atomics.load(rec, at + R_VER);
          if ((v & 1) !== 0) continue;
          // Only a full bucket (TAT ≤ now) or a rate-0 one (no tokens; a DEAD slot too) may go; the
          // CAS below checks that nothing changed since these reads.
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
      // After the raise: a re-created 'full' bucket starts at the floor (initialTat).
      this.prepareFill(h0, h1, h2, limit, words, nowRel);
      // A thread that read the slot before fails its CAS or its re-read of ver; readers wait while
      // ver is odd and then see the key change.
      if (!this.claimAndFill(best, true, bestV)) continue;
      Atomics.add(this.h64, H_EVICTIONS, 1n);
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

  /** Computes the bucket claimAndFill() writes (before the claim: nothing is computed while a slot is held). */
  private prepareFill(h0: number, h1: number, h2: number, limit: GcraLimit, words: LimitWords, nowRel: bigint): void {
    const tat = this.initialTat(limit, nowRel);
    this.fillH0 = h0;
    this.fillH1 = h1;
    this.fillH2 = h2;
    this.fillDHi = words.dHi;
    this.fillDLo = words.dLo;
    this.fillX = words.x;
    this.fillTatHi = Number(tat >> 32n);
    this.fillTatLo = Number(tat & LOW_32) | 0;
    this.fillStamp = this.stamp();
  }

  /**
   * Claims slot s and writes the prepared bucket into it (key words, limit and state, k0 last, so a
   * key is only ever found with a valid state); false if the claim failed. An EMPTY slot is claimed
   * by its k0 (EMPTY → this thread's claimTag; a slot never used: its ver stays even, 0, and no
   * reader finds it before k0 is published); a live one to evict (`evict`) by its ver (v → slotTag,
   * published v + 2 after). The window is this method's body after the CAS: stores only (commitTat).
   */
  private claimAndFill(s: number, evict: boolean, v: number): boolean {
    const rec = this.rec;
    const keys = this.keys;
    const at = RECORD_WORDS * s;
    // (An insert or eviction is undone by making the slot DEAD: no state before it to note.)
    this.noteClaim(s, v, evict ? CLAIM_EVICT : CLAIM_INSERT, 0, 0);
    if (evict) {
      if (Atomics.compareExchange(rec, at + R_VER, v, this.slotTag) !== v) return false;
      if (claimHook !== null) claimHook(s);
      Atomics.store(keys, 2 * s, this.claimTag);
    } else {
      if (Atomics.compareExchange(keys, 2 * s, EMPTY, this.claimTag) !== EMPTY) return false;
      if (claimHook !== null) claimHook(s);
    }
    Atomics.store(keys, 2 * s + 1, this.fillH2);
    Atomics.store(rec, at + R_K1, this.fillH1);
    Atomics.store(rec, at + R_ACCESS, this.fillStamp);
    Atomics.store(rec, at + R_D_HI, this.fillDHi);
    Atomics.store(rec, at + R_D_LO, this.fillDLo);
    Atomics.store(rec, at + R_X, this.fillX);
    Atomics.store(rec, at + R_TAT_HI, this.fillTatHi);
    Atomics.store(rec, at + R_TAT_LO, this.fillTatLo);
    Atomics.store(keys, 2 * s, this.fillH0);
    if (evict) Atomics.store(rec, at + R_VER, (v + 2) | 0);
    return true;
  }

  // ---- dead threads ---------------------------------------------------------------------------

  /**
   * Releases what thread `threadId` (a worker's threadId) held when it stopped, and frees its
   * record. Call it ONLY once that thread is gone (its 'exit' event: its last writes are visible
   * then, and it writes nothing more): the slot it held between a claim and its publish gets the
   * state it had before the claim (an admission, a re-configuration: restored exactly, as if the
   * write never began), or becomes DEAD (an insert or eviction: its key words may be half written;
   * a DEAD slot matches no key, holds rate 0 and is evicted first), published; its insert stripes
   * are unlocked. null if the thread never attached this table.
   */
  releaseThread(gone: number): ThreadRelease | null {
    const t = this.threads;
    const owner = gone + 1;
    let r = 0;
    while (r < MAX_THREADS && Atomics.load(t, r * THREAD_WORDS + T_OWNER) !== owner) r++;
    if (r === MAX_THREADS) return null;
    if (r * THREAD_WORDS === this.mine) throw new Error('releaseThread: a thread cannot release its own record');
    const claim = this.releaseSlot(r);
    let stripes = 0;
    const stripeTag = (1 + r) * 2;
    for (let i = 0; i < this.locks.length; i++) {
      const c = Atomics.load(this.locks, i);
      // Its waiter bit may change under us (a live waiter marking itself): retry until ours is gone.
      if ((c & ~1) === stripeTag && Atomics.compareExchange(this.locks, i, c, 0) === c) {
        Atomics.notify(this.locks, i);
        stripes++;
      } else if ((c & ~1) === stripeTag) {
        i--;
      }
    }
    Atomics.store(t, r * THREAD_WORDS + T_KIND, CLAIM_NONE);
    Atomics.store(t, r * THREAD_WORDS + T_OWNER, 0);
    return { slot: claim === null ? -1 : Atomics.load(t, r * THREAD_WORDS + T_SLOT), claim, stripes };
  }

  /** The slot record r's thread holds, if any, restored or made DEAD and published. */
  private releaseSlot(r: number): ThreadRelease['claim'] {
    const t = this.threads;
    const base = r * THREAD_WORDS;
    const kind = Atomics.load(t, base + T_KIND);
    const s = Atomics.load(t, base + T_SLOT);
    if (kind === CLAIM_NONE || !(s >= 0 && s < this.slotCount)) return null;
    const rec = this.rec;
    const at = RECORD_WORDS * s;
    if (kind === CLAIM_INSERT) {
      // Claimed EMPTY and not yet published (k0 still its claim): never readable, so DEAD as it is.
      if (Atomics.load(this.keys, 2 * s) !== 1 + r) return null;
      this.writeDead(s);
      return 'insert';
    }
    // A stale record (its CAS failed, or it published since) names a slot it does not hold: skipped.
    if (Atomics.load(rec, at + R_VER) !== 2 * r + 1) return null;
    let claim: ThreadRelease['claim'];
    if (kind === CLAIM_EVICT) {
      // The key it evicted is gone (evictFloor was raised before): counted as the eviction it was.
      this.writeDead(s);
      Atomics.add(this.h64, H_EVICTIONS, 1n);
      claim = 'evict';
    } else {
      if (kind === CLAIM_RECONFIGURE) {
        Atomics.store(rec, at + R_D_HI, Atomics.load(t, base + T_D_HI));
        Atomics.store(rec, at + R_D_LO, Atomics.load(t, base + T_D_LO));
        Atomics.store(rec, at + R_X, Atomics.load(t, base + T_X));
      }
      Atomics.store(rec, at + R_TAT_HI, Atomics.load(t, base + T_TAT_HI));
      Atomics.store(rec, at + R_TAT_LO, Atomics.load(t, base + T_TAT_LO));
      claim = kind === CLAIM_ADMIT ? 'admit' : 're-configure';
    }
    Atomics.store(rec, at + R_VER, (Atomics.load(t, base + T_VER) + 2) | 0);
    return claim;
  }

  /** A slot no key owns (k0 DEAD): rate 0, stamp 0 (the first an eviction takes). Its writer is gone. */
  private writeDead(s: number): void {
    const rec = this.rec;
    const at = RECORD_WORDS * s;
    Atomics.store(this.keys, 2 * s, DEAD);
    Atomics.store(this.keys, 2 * s + 1, 0);
    for (let w = R_TAT_HI; w <= R_ACCESS; w++) Atomics.store(rec, at + w, 0);
  }
}

function copyInto(to: MutableTakeResult, from: KeyTakeResult): void {
  to.verdict = from.verdict;
  to.allowed = from.allowed;
  to.remaining = from.remaining;
  to.resetNs = from.resetNs;
  to.retryAfterNs = from.retryAfterNs;
}
