// The decoder's short strings, made once: a check's domain, descriptor keys and most values (tenant
// ids, route names) come back request after request, so the codec looks the bytes up here instead of
// building a new string each time. A hit allocates nothing, and it returns the string the rules'
// maps and the bucket keys already met: its hash is computed once, and the domain is the very string
// rules-match.ts's memo of the last domain holds, equal at the first comparison. A miss builds the
// string (one allocation, as before) and keeps it in its slot, replacing whatever was there.
//
// Bounded: a fixed number of slots (direct-mapped by an FNV-1a hash of the bytes), strings of at most
// MAX_INTERNED_BYTES ASCII bytes: at most slots × (header + 32 bytes) held, ~250 KiB at the default. A
// stream of distinct values (client addresses) only turns hits into misses: the cost of a miss is the
// hash and the string the decoder built before this cache existed.
//
// Pure: no I/O; one instance per thread (module state of the codec), used by one call at a time.

/** Longest string (bytes, all ASCII) kept. */
export const MAX_INTERNED_BYTES = 32;
/** Slots of the codec's table (a power of two). */
export const INTERNER_SLOTS = 4096;

const FNV_OFFSET = 0x811c9dc5;
const FNV_PRIME = 0x01000193;

export class AsciiInterner {
  private readonly slots: string[];
  private readonly mask: number;

  constructor(slots = INTERNER_SLOTS) {
    if (!Number.isInteger(slots) || slots < 1 || (slots & (slots - 1)) !== 0) {
      throw new RangeError(`AsciiInterner: slots must be a power of two, got ${slots}`);
    }
    this.slots = new Array<string>(slots).fill('');
    this.mask = slots - 1;
  }

  /**
   * The string of bytes [start, end) of `buf` when they are 1 to MAX_INTERNED_BYTES ASCII bytes (the
   * same string object as the last time these bytes were looked up, unless another string took its
   * slot since); null when a byte is not ASCII or the range is empty or too long (the caller decodes
   * UTF-8 itself). `make` builds the string on a miss from the same range.
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
    const slot = (hash ^ (hash >>> 15)) & this.mask;
    const held = this.slots[slot] as string;
    if (held.length === length && sameBytes(held, buf, start)) return held;
    const made = make(buf, start, end);
    if (made.length !== length)
      throw new Error(`AsciiInterner: made a ${made.length}-character string of ${length} ASCII bytes`);
    this.slots[slot] = made;
    return made;
  }
}

/** True when `s` (of the range's length) has the range's bytes as its characters. */
function sameBytes(s: string, buf: Uint8Array, start: number): boolean {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) !== buf[start + i]) return false;
  return true;
}
