// The decoder's short strings, made once: a check's domain, descriptor keys and most values (tenant
// ids, route names) come back request after request, so the codec looks the bytes up here instead of
// building a new string each time. A hit allocates nothing, and it returns the string the rules'
// maps and the bucket keys already met: its hash is computed once, and the domain is the very string
// rules-match.ts's memo of the last domain holds, equal at the first comparison. A miss builds the
// string (one allocation, as before) and keeps it in its slot, replacing whatever was there.
//
// Bounded: a fixed number of slots, four to a set (the set chosen by an FNV-1a hash of the bytes,
// each slot keeping its string's hash so that a lookup compares characters only on a hash match; a
// miss replaces the set's slots in turn), strings of at most MAX_INTERNED_BYTES ASCII bytes: at most
// slots × (header + 32 bytes) held, ~250 KiB at the default. Four ways, not one: with 1,000 tenants in
// 4,096 direct-mapped slots, a quarter of them shared a slot with another and evicted each other, one
// lookup in four a miss. A stream of distinct values (client addresses) only turns hits into misses:
// the cost of a miss is the hash and the string the decoder built before this table existed.
//
// Pure: no I/O; one instance per thread (module state of the codec), used by one call at a time.

/** Longest string (bytes, all ASCII) kept. */
export const MAX_INTERNED_BYTES = 32;
/** Slots of the codec's table (a power of two, at least WAYS). */
export const INTERNER_SLOTS = 4096;
/** Slots per set. */
const WAYS = 4;

const FNV_OFFSET = 0x811c9dc5;
const FNV_PRIME = 0x01000193;

export class AsciiInterner {
  private readonly strings: string[];
  private readonly hashes: Int32Array;
  /** Per set: the slot the next miss replaces. */
  private readonly nextWay: Uint8Array;
  private readonly setMask: number;

  constructor(slots = INTERNER_SLOTS) {
    if (!Number.isInteger(slots) || slots < WAYS || (slots & (slots - 1)) !== 0) {
      throw new RangeError(`AsciiInterner: slots must be a power of two of at least ${WAYS}, got ${slots}`);
    }
    this.strings = new Array<string>(slots).fill('');
    this.hashes = new Int32Array(slots);
    this.nextWay = new Uint8Array(slots / WAYS);
    this.setMask = slots / WAYS - 1;
  }

  /**
   * The string of bytes [start, end) of `buf` when they are 1 to MAX_INTERNED_BYTES ASCII bytes (the
   * same string object as the last time these bytes were looked up, unless it was replaced since);
   * null when a byte is not ASCII or the range is empty or too long (the caller decodes UTF-8 itself).
   * `make` builds the string on a miss from the same range.
   */
  get(
    buf: Uint8Array,
    start: number,
    end: number,
    make: (buf: Uint8Array, start: number, end: number) => string,
  ): string | null {
    const length = end - start;
    if (length <= 0 || length > MAX_INTERNED_BYTES) return null;
    let hash = FNV_OFFSET ^ length;
    for (let i = start; i < end; i++) {
      const c = buf[i] as number;
      if (c >= 0x80) return null;
      hash = Math.imul(hash ^ c, FNV_PRIME);
    }
    const set = (hash ^ (hash >>> 15)) & this.setMask;
    const first = set * WAYS;
    const hashes = this.hashes;
    for (let slot = first; slot < first + WAYS; slot++) {
      if (hashes[slot] !== hash) continue;
      const held = this.strings[slot] as string;
      if (held.length === length && sameBytes(held, buf, start)) return held;
    }
    const made = make(buf, start, end);
    if (made.length !== length) {
      throw new Error(`AsciiInterner: made a ${made.length}-character string of ${length} ASCII bytes`);
    }
    const way = this.nextWay[set] as number;
    this.nextWay[set] = (way + 1) % WAYS;
    this.strings[first + way] = made;
    hashes[first + way] = hash;
    return made;
  }
}

/** True when `s` (of the range's length) has the range's bytes as its characters. */
function sameBytes(s: string, buf: Uint8Array, start: number): boolean {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) !== buf[start + i]) return false;
  return true;
}
