// Frozen copy of cell-agent/buckets/key-hash.ts before the head memo and the step on locals (issue 21,
// the decision bench's "[before]" rows use it through bucket-table-bigint.ts). Not product code.
// Key hashing for the shared bucket table: 96 bits per key, written into three int32 words.
//
//   out[0], out[1] = high and low halves of a seeded 64-bit FNV-1a over the key's UTF-16 code units
//   out[2]         = an independent seeded 32-bit hash (MurmurHash3-style mixing) of the same units
//
// The table treats two keys as the same bucket iff all 96 bits match (after it remaps out[0] values
// 0 and 1, which it reserves, to 2 and 3). For n distinct live keys the chance that any two of them
// collide is about n²/2^97: ~6·10^-18 for a million keys. The seed is random per table (stored in
// the shared header, so every worker hashes alike), so key sets cannot be chosen offline to collide
// or to pile into the same groups; a collision would make two keys share one bucket (each then gets
// less, never more, than its own limit would allow when both are busy).

export type KeyHasher = (key: string, seed: number, out: Int32Array) => void;

/** Final avalanche of MurmurHash3 (fmix32). */
export function fmix32(x: number): number {
  let h = x | 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h | 0;
}

const TWO_32 = 4294967296;

/** The default hasher: seeded FNV-1a 64 (as two int32 halves) + seeded 32-bit check hash. */
export function hashKey(key: string, seed: number, out: Int32Array): void {
  const h = scratchStream;
  h.begin(seed);
  h.raw(key);
  h.end(out);
}

/**
 * hashKey over a key given in parts, without building the string: begin(seed), then raw(part) and
 * escaped(part) in order, then end(out). `escaped(part)` hashes the part as the rules module writes it
 * into a bucket key (`\`, `|`, `=` and `~` preceded by a backslash). The result is exactly
 * hashKey(the concatenated key): the hot path hashes a rule's bucket key from the request's values,
 * and every other path (the string key) finds the same bucket.
 */
export class KeyHashStream {
  private hi = 0;
  private lo = 0;
  private c = 0;
  private len = 0;

  begin(seed: number): void {
    // FNV-1a 64: offset basis 0xcbf29ce4_84222325, prime 2^40 + 0x1b3.
    this.hi = 0xcbf29ce4 | 0;
    this.lo = (0x84222325 ^ seed) | 0;
    this.c = (0x9747b28c ^ Math.imul(seed, 0x27d4eb2d)) | 0;
    this.len = 0;
  }

  raw(part: string): void {
    const n = part.length;
    for (let i = 0; i < n; i++) this.unit(part.charCodeAt(i));
  }

  escaped(part: string): void {
    const n = part.length;
    for (let i = 0; i < n; i++) {
      const ch = part.charCodeAt(i);
      if (ch === BACKSLASH || ch === BAR || ch === EQUALS || ch === TILDE) this.unit(BACKSLASH);
      this.unit(ch);
    }
  }

  end(out: Int32Array): void {
    out[0] = this.hi;
    out[1] = this.lo;
    out[2] = fmix32(this.c ^ this.len);
  }

  private unit(ch: number): void {
    // The FNV multiply on 32-bit halves:
    // (hi·2^32 + lo)·(2^40 + 0x1b3) mod 2^64 = lo·0x1b3 + (hi·0x1b3 + lo·2^8)·2^32.
    let lo = this.lo ^ ch;
    const t = (lo >>> 0) * 0x1b3; // < 2^41: exact in a double
    const carry = (t / TWO_32) | 0;
    this.hi = (Math.imul(this.hi, 0x1b3) + (lo << 8) + carry) | 0;
    lo = t | 0;
    this.lo = lo;
    let k = Math.imul(ch, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, 0x1b873593);
    let c = this.c ^ k;
    c = (c << 13) | (c >>> 19);
    this.c = (Math.imul(c, 5) + 0xe6546b64) | 0;
    this.len++;
  }
}

const BACKSLASH = 0x5c;
const BAR = 0x7c;
const EQUALS = 0x3d;
const TILDE = 0x7e;
/** JavaScript runs one hashKey at a time and it never calls out: one stream serves every call. */
const scratchStream = new KeyHashStream();
