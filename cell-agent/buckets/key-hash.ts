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
  // FNV-1a 64: offset basis 0xcbf29ce4_84222325, prime 2^40 + 0x1b3. The multiply is done on 32-bit
  // halves: (hi·2^32 + lo)·(2^40 + 0x1b3) mod 2^64 = lo·0x1b3 + (hi·0x1b3 + lo·2^8)·2^32.
  let hi = 0xcbf29ce4 | 0;
  let lo = (0x84222325 ^ seed) | 0;
  let c = (0x9747b28c ^ Math.imul(seed, 0x27d4eb2d)) | 0;
  const len = key.length;
  for (let i = 0; i < len; i++) {
    const ch = key.charCodeAt(i);
    lo ^= ch;
    const t = (lo >>> 0) * 0x1b3; // < 2^41: exact in a double
    const carry = (t / TWO_32) | 0;
    hi = (Math.imul(hi, 0x1b3) + (lo << 8) + carry) | 0;
    lo = t | 0;
    let k = Math.imul(ch, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, 0x1b873593);
    c ^= k;
    c = (c << 13) | (c >>> 19);
    c = (Math.imul(c, 5) + 0xe6546b64) | 0;
  }
  out[0] = hi;
  out[1] = lo;
  out[2] = fmix32(c ^ len);
}
