// The velocity window: per global quota, the tokens allowed and refused over the last 500 ms, in five
// 100 ms buckets, in ONE SharedArrayBuffer written by every thread that decides (the gRPC workers and
// the main thread's HTTP API) and read by the main thread (/metrics now; the lease client later, which
// reports allowed + refused as the cell's demand: refusals are demand too).
//
// Layout: `capacity` slots, open addressing with linear probing (at most PROBE slots per key).
//   keys     Int32[4·capacity]: k0 (hash word 0; 0 = EMPTY, 1 = CLAIMING), k1, k2 (the 96-bit key hash
//            of cell-agent/buckets/key-hash.ts) and gen (bumped each time the slot is given to a key)
//   counters BigInt64[10·capacity]: for bucket b = epoch mod 5, word 2b = allowed, 2b+1 = refused,
//            each word = epoch·2^32 + count (count saturates at 2^32 − 1), epoch = 100 ms ticks since
//            the table's start. An add is one compare-and-swap loop on one word: a word from an older
//            epoch is replaced by (current epoch, n), so no increment is ever lost and no stale count
//            ever leaks into a newer bucket.
// Reading sums the words whose epoch lies in the last five ticks (the current one included). The
// reader reads each word as its two 32-bit halves (a Uint32Array over the same memory, little-endian:
// the tick is the high half), never as a BigInt: the lease client reads every slot of the table each
// report, and a BigInt per word read (and per shift) made that scan 19 s of 63 s of the main thread's
// work in `npm run bench -- agent-tenants` at 100,000 tenants (65,536 slots, several reports a
// second). The halves are read high, low, high again until both high reads agree: a word only moves
// to a later tick, so equal high halves mean the low half belongs to that tick.
//
// Key strings: slots hold only hashes, so whoever puts a key into a slot tells the reader: the
// recorder's onNewKey(slot, gen, key) callback (a worker posts it to the main thread, which keeps a
// VelocityKeys map). A key seen by the reader with a gen it has no string for yet (message still in
// flight) is skipped once.
//
// Eviction: when a key's probe run is full, a slot idle for a whole window (every word older than
// five ticks) is taken over (CAS k0 → CLAIMING, reset, new key, gen + 1). A writer that found the old
// key just before may add one increment to the new key: the window is a demand estimate, and that
// error is bounded by one request per racing thread. Two threads inserting the same new key at once
// may create it twice; the reader sums by key string, so the totals stay exact. When no slot can be
// had the sample is dropped and counted (`dropped`).
import { hashKey } from '../buckets/key-hash.js';

export const VELOCITY_BUCKET_MS = 100;
export const VELOCITY_BUCKETS = 5;
export const VELOCITY_WINDOW_MS = VELOCITY_BUCKET_MS * VELOCITY_BUCKETS;

const BUCKET_NS = BigInt(VELOCITY_BUCKET_MS) * 1_000_000n;
const WORDS = 2 * VELOCITY_BUCKETS;
const PROBE = 32;
const HEADER_WORDS = 8; // Int32: magic, capacity, seed, dropped; BigInt64 at [2]: startNs
const MAGIC = 0x43515654; // "CQVT"
const EMPTY = 0;
const CLAIMING = 1;
const MAX_COUNT = 0xffff_ffffn;
const LOW32 = 0xffff_ffffn;
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

export interface VelocityShared {
  readonly buffer: SharedArrayBuffer;
}

export interface VelocitySample {
  readonly key: string;
  /** Tokens allowed and refused in the window. */
  readonly allowed: number;
  readonly refused: number;
}

export interface VelocityOptions {
  readonly capacity: number;
  /** Clock origin on the callers' clock (ns). */
  readonly startNs: bigint;
  readonly seed?: number;
}

export type NewKeyListener = (slot: number, gen: number, key: string) => void;

export class VelocityTable {
  readonly shared: VelocityShared;
  readonly capacity: number;
  readonly startNs: bigint;
  private readonly header: Int32Array;
  private readonly keys: Int32Array;
  private readonly counters: BigInt64Array;
  /** The counters' words as 32-bit halves (little-endian platforms; null elsewhere: read as BigInts). */
  private readonly halves: Uint32Array | null;
  private readonly seed: number;
  private readonly hashOut = new Int32Array(3);
  /** Told when this thread gives a slot to a key. */
  onNewKey: NewKeyListener | null = null;

  static bytesFor(capacity: number): number {
    return HEADER_WORDS * 8 + capacity * 16 + capacity * WORDS * 8;
  }

  static create(opts: VelocityOptions): VelocityTable {
    if (!Number.isSafeInteger(opts.capacity) || opts.capacity < 1 || opts.capacity > 16_000_000) {
      throw new RangeError(`velocity capacity must be an integer in [1, 16e6], got ${opts.capacity}`);
    }
    const buffer = new SharedArrayBuffer(VelocityTable.bytesFor(opts.capacity));
    const h32 = new Int32Array(buffer, 0, HEADER_WORDS * 2);
    h32[0] = MAGIC;
    h32[1] = opts.capacity;
    h32[2] = opts.seed ?? (Math.random() * 0x7fffffff) | 0;
    new BigInt64Array(buffer, 0, HEADER_WORDS)[2] = opts.startNs;
    return new VelocityTable({ buffer });
  }

  static attach(shared: VelocityShared): VelocityTable {
    return new VelocityTable(shared);
  }

  private constructor(shared: VelocityShared) {
    const buffer = shared.buffer;
    this.header = new Int32Array(buffer, 0, HEADER_WORDS * 2);
    if (this.header[0] !== MAGIC) throw new TypeError('not a velocity table');
    const capacity = this.header[1] ?? 0;
    if (buffer.byteLength !== VelocityTable.bytesFor(capacity)) throw new TypeError('velocity table layout mismatch');
    this.capacity = capacity;
    this.seed = this.header[2] ?? 0;
    this.startNs = new BigInt64Array(buffer, 0, HEADER_WORDS)[2] ?? 0n;
    this.keys = new Int32Array(buffer, HEADER_WORDS * 8, capacity * 4);
    this.counters = new BigInt64Array(buffer, HEADER_WORDS * 8 + capacity * 16, capacity * WORDS);
    this.halves = LITTLE_ENDIAN
      ? new Uint32Array(buffer, HEADER_WORDS * 8 + capacity * 16, capacity * WORDS * 2)
      : null;
    this.shared = Object.freeze({ buffer });
  }

  /** Samples dropped because no slot could be had (all threads). */
  get dropped(): number {
    return Atomics.load(this.header, 3);
  }

  /** The 100 ms tick of a clock reading. */
  epochOf(nowNs: bigint): bigint {
    const rel = nowNs - this.startNs;
    return rel <= 0n ? 0n : rel / BUCKET_NS;
  }

  /** Adds allowed and refused tokens for `key` at `nowNs`. Returns false if the sample was dropped. */
  record(key: string, allowed: number, refused: number, nowNs: bigint): boolean {
    const epoch = this.epochOf(nowNs);
    const slot = this.slotFor(key, epoch);
    if (slot < 0) {
      Atomics.add(this.header, 3, 1);
      return false;
    }
    const base = slot * WORDS + Number(epoch % BigInt(VELOCITY_BUCKETS)) * 2;
    if (allowed > 0) this.add(base, epoch, allowed);
    if (refused > 0) this.add(base + 1, epoch, refused);
    return true;
  }

  private add(i: number, epoch: bigint, n: number): void {
    const c = this.counters;
    const inc = BigInt(Math.min(n, 0xffff_ffff));
    for (;;) {
      const w = Atomics.load(c, i);
      const we = w >> 32n;
      let next: bigint;
      if (we >= epoch) {
        // Same tick (or a newer one written by a thread whose clock read later): add to it.
        const count = (w & LOW32) + inc;
        next = (we << 32n) | (count > MAX_COUNT ? MAX_COUNT : count);
      } else {
        next = (epoch << 32n) | inc;
      }
      if (Atomics.compareExchange(c, i, w, next) === w) return;
    }
  }

  private hash(key: string): [number, number, number] {
    const out = this.hashOut;
    hashKey(key, this.seed, out);
    let h0 = out[0] ?? 0;
    if (h0 === EMPTY || h0 === CLAIMING) h0 += 2;
    return [h0, out[1] ?? 0, out[2] ?? 0];
  }

  private slotFor(key: string, epoch: bigint): number {
    const [h0, h1, h2] = this.hash(key);
    const keys = this.keys;
    const cap = this.capacity;
    const home = (h1 >>> 0) % cap;
    const probe = Math.min(PROBE, cap);
    let empty = -1;
    for (let j = 0; j < probe; j++) {
      const s = (home + j) % cap;
      const k0 = Atomics.load(keys, 4 * s);
      if (k0 === h0 && Atomics.load(keys, 4 * s + 1) === h1 && Atomics.load(keys, 4 * s + 2) === h2) return s;
      if (k0 === EMPTY) {
        empty = s;
        break; // slots never become EMPTY again: the key is not further along
      }
    }
    if (empty >= 0 && Atomics.compareExchange(keys, 4 * empty, EMPTY, CLAIMING) === EMPTY)
      return this.publish(empty, h0, h1, h2, key);
    // Take over a slot idle for a whole window.
    for (let j = 0; j < probe; j++) {
      const s = (home + j) % cap;
      const k0 = Atomics.load(keys, 4 * s);
      if (k0 === EMPTY) {
        if (Atomics.compareExchange(keys, 4 * s, EMPTY, CLAIMING) === EMPTY) return this.publish(s, h0, h1, h2, key);
        continue;
      }
      if (k0 === CLAIMING || !this.idle(s, epoch)) continue;
      if (Atomics.compareExchange(keys, 4 * s, k0, CLAIMING) !== k0) continue;
      for (let w = 0; w < WORDS; w++) Atomics.store(this.counters, s * WORDS + w, 0n);
      return this.publish(s, h0, h1, h2, key);
    }
    return -1;
  }

  private idle(s: number, epoch: bigint): boolean {
    const oldest = epoch - BigInt(VELOCITY_BUCKETS);
    for (let w = 0; w < WORDS; w++) {
      const word = Atomics.load(this.counters, s * WORDS + w);
      if (word !== 0n && word >> 32n > oldest) return false;
    }
    return true;
  }

  private publish(s: number, h0: number, h1: number, h2: number, key: string): number {
    const keys = this.keys;
    Atomics.store(keys, 4 * s + 1, h1);
    Atomics.store(keys, 4 * s + 2, h2);
    const gen = (Atomics.add(keys, 4 * s + 3, 1) + 1) | 0;
    Atomics.store(keys, 4 * s, h0);
    this.onNewKey?.(s, gen, key);
    return s;
  }

  /** The slot's current gen, or null if the slot holds no key. */
  slotGen(s: number): number | null {
    const k0 = Atomics.load(this.keys, 4 * s);
    return k0 === EMPTY || k0 === CLAIMING ? null : Atomics.load(this.keys, 4 * s + 3);
  }

  /** Allowed and refused tokens of slot s in the window ending at nowNs. */
  slotWindow(s: number, nowNs: bigint): { allowed: number; refused: number } {
    const out = new Float64Array(2);
    this.windowAt(s, Number(this.epochOf(nowNs)), out);
    return { allowed: out[0] ?? 0, refused: out[1] ?? 0 };
  }

  /** Allowed and refused tokens of slot s in the window ending at tick `epoch` (epochOf), into out[0] and out[1]. */
  windowAt(s: number, epoch: number, out: Float64Array): void {
    const h = this.halves;
    if (h === null) {
      this.windowAtBig(s, BigInt(epoch), out);
      return;
    }
    const oldest = epoch - VELOCITY_BUCKETS;
    let allowed = 0;
    let refused = 0;
    const base = s * WORDS * 2;
    // Most slots of a big table are idle: plain reads of the ticks first (a stale one only delays a
    // sample to the next report), the atomic reads only for a slot with a word in the window.
    let recent = false;
    for (let w = 0; w < WORDS && !recent; w++) {
      const hi = h[base + 2 * w + 1] ?? 0;
      recent = hi > oldest && hi <= epoch;
    }
    if (!recent) {
      out[0] = 0;
      out[1] = 0;
      return;
    }
    for (let w = 0; w < WORDS; w++) {
      const i = base + 2 * w;
      let hi = Atomics.load(h, i + 1);
      let lo = Atomics.load(h, i);
      for (let again = Atomics.load(h, i + 1); again !== hi; again = Atomics.load(h, i + 1)) {
        hi = again;
        lo = Atomics.load(h, i);
      }
      if (hi <= oldest || hi > epoch) continue;
      if ((w & 1) === 0) allowed += lo;
      else refused += lo;
    }
    out[0] = allowed;
    out[1] = refused;
  }

  private windowAtBig(s: number, epoch: bigint, out: Float64Array): void {
    const oldest = epoch - BigInt(VELOCITY_BUCKETS);
    let allowed = 0;
    let refused = 0;
    for (let b = 0; b < VELOCITY_BUCKETS; b++) {
      const a = Atomics.load(this.counters, s * WORDS + 2 * b);
      const r = Atomics.load(this.counters, s * WORDS + 2 * b + 1);
      if (a !== 0n && a >> 32n > oldest && a >> 32n <= epoch) allowed += Number(a & LOW32);
      if (r !== 0n && r >> 32n > oldest && r >> 32n <= epoch) refused += Number(r & LOW32);
    }
    out[0] = allowed;
    out[1] = refused;
  }
}

/**
 * The reader's side (main thread): slot → key strings, fed by onNewKey callbacks from every thread,
 * and the window per key summed over its slots.
 */
export class VelocityKeys {
  private readonly slots = new Map<number, { gen: number; key: string }>();
  private readonly window = new Float64Array(2);

  constructor(private readonly table: VelocityTable) {}

  /** A thread gave `slot` to `key` (gen increases with every reuse; an older report is ignored). */
  learn(slot: number, gen: number, key: string): void {
    const known = this.slots.get(slot);
    if (known !== undefined && known.gen - gen > 0) return;
    this.slots.set(slot, { gen, key });
  }

  /** Every key with a non-zero window, allowed and refused tokens in the last 500 ms. */
  snapshot(nowNs: bigint): VelocitySample[] {
    const byKey = new Map<string, { allowed: number; refused: number }>();
    const epoch = Number(this.table.epochOf(nowNs));
    const w = this.window;
    for (const [slot, { gen, key }] of this.slots) {
      const current = this.table.slotGen(slot);
      if (current !== gen) {
        if (current === null || current - gen > 0) this.slots.delete(slot);
        continue;
      }
      this.table.windowAt(slot, epoch, w);
      const allowed = w[0] ?? 0;
      const refused = w[1] ?? 0;
      if (allowed === 0 && refused === 0) continue;
      const sum = byKey.get(key);
      if (sum === undefined) byKey.set(key, { allowed, refused });
      else {
        sum.allowed += allowed;
        sum.refused += refused;
      }
    }
    return [...byKey].map(([key, w]) => ({ key, allowed: w.allowed, refused: w.refused }));
  }

  get size(): number {
    return this.slots.size;
  }
}
