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
 *
 * head(part) is raw(part) for a part that starts the key and recurs (a rule's `domain|key=`, 21 of
 * the 29 characters of `bench|remote_address=10.0.1.2`): the state after it is kept per part (a few
 * at a time, by identity of the string and the seed) and restored instead of hashed again.
 * save()/restore() keep a key's state while others are hashed (a decision over several descriptors
 * takes from each bucket twice: once to check, once to take).
 */
export class KeyHashStream {
  private hi = 0;
  private lo = 0;
  private c = 0;
  private len = 0;
  private seed = 0;
  /** head()'s memo: HEADS parts, their seeds and the state after each (hi, lo, c, len). */
  private readonly headParts: (string | null)[] = new Array<string | null>(HEADS).fill(null);
  private readonly headStates = new Int32Array(HEADS * STATE_WORDS);
  private headNext = 0;

  begin(seed: number): void {
    // FNV-1a 64: offset basis 0xcbf29ce4_84222325, prime 2^40 + 0x1b3.
    this.hi = 0xcbf29ce4 | 0;
    this.lo = (0x84222325 ^ seed) | 0;
    this.c = (0x9747b28c ^ Math.imul(seed, 0x27d4eb2d)) | 0;
    this.len = 0;
    this.seed = seed | 0;
  }

  raw(part: string): void {
    this.mix(part, false);
  }

  escaped(part: string): void {
    this.mix(part, true);
  }

  /** raw(part) as the first part of the key (right after begin); memoized (see the class comment). */
  head(part: string): void {
    if (this.len !== 0) {
      this.raw(part);
      return;
    }
    const parts = this.headParts;
    const states = this.headStates;
    for (let i = 0; i < HEADS; i++) {
      if (parts[i] === part && states[i * STATE_WORDS + 4] === this.seed) {
        this.restore(states, i * STATE_WORDS);
        return;
      }
    }
    this.raw(part);
    const i = this.headNext;
    this.headNext = (i + 1) % HEADS;
    parts[i] = part;
    this.save(states, i * STATE_WORDS);
    states[i * STATE_WORDS + 4] = this.seed;
  }

  /** Writes the state (STATE_WORDS words, the last the seed) at into[at..]. */
  save(into: Int32Array, at: number): void {
    into[at] = this.hi;
    into[at + 1] = this.lo;
    into[at + 2] = this.c;
    into[at + 3] = this.len;
    into[at + 4] = this.seed;
  }

  /** Puts back a state save() wrote: the stream goes on (or ends) as it would have then. */
  restore(from: Int32Array, at: number): void {
    this.hi = from[at] ?? 0;
    this.lo = from[at + 1] ?? 0;
    this.c = from[at + 2] ?? 0;
    this.len = from[at + 3] ?? 0;
    this.seed = from[at + 4] ?? 0;
  }

  end(out: Int32Array): void {
    out[0] = this.hi;
    out[1] = this.lo;
    out[2] = fmix32(this.c ^ this.len);
  }

  /**
   * Hashes part's UTF-16 units on locals (the per-unit step of both hashes), with `escape` a
   * backslash before each of the four escaped characters: one pass, the check inside the loop.
   */
  private mix(part: string, escape: boolean): void {
    let hi = this.hi;
    let lo = this.lo;
    let c = this.c;
    const n = part.length;
    let units = n;
    for (let i = 0; i < n; i++) {
      const ch = part.charCodeAt(i);
      let pending = escape && (ch === BACKSLASH || ch === BAR || ch === EQUALS || ch === TILDE);
      if (pending) units++;
      for (;;) {
        const u = pending ? BACKSLASH : ch;
        // The FNV multiply on 32-bit halves, in integer operations only:
        // (hi·2^32 + lo)·(2^40 + 0x1b3) mod 2^64 = lo·0x1b3 + (hi·0x1b3 + lo·2^8)·2^32, with lo·0x1b3
        // (< 2^41) computed on lo's 16-bit halves: aL = loL·0x1b3, aH = loH·0x1b3 + aL / 2^16 (both
        // < 2^26), so lo·0x1b3 = aH·2^16 + (aL mod 2^16): its low word (aH·2^16 + aL mod 2^16) mod
        // 2^32, its carry into hi aH / 2^16. (No double arithmetic on the unit's dependency chain.)
        lo ^= u;
        const aL = (lo & 0xffff) * 0x1b3;
        const aH = (lo >>> 16) * 0x1b3 + (aL >>> 16);
        hi = (Math.imul(hi, 0x1b3) + (lo << 8) + (aH >>> 16)) | 0;
        lo = (aH << 16) | (aL & 0xffff);
        c = murmurStep(c, u);
        if (!pending) break;
        pending = false;
      }
    }
    this.hi = hi;
    this.lo = lo;
    this.c = c;
    this.len += units;
  }
}

/** The check word's step for one UTF-16 unit (MurmurHash3's block mix). */
function murmurStep(c: number, ch: number): number {
  let k = Math.imul(ch, 0xcc9e2d51);
  k = (k << 15) | (k >>> 17);
  k = Math.imul(k, 0x1b873593);
  let h = c ^ k;
  h = (h << 13) | (h >>> 19);
  return (Math.imul(h, 5) + 0xe6546b64) | 0;
}

/** Words of a saved stream state: hi, lo, c, len, seed. */
export const STATE_WORDS = 5;
/** Parts head() keeps the state after (a request's descriptors start with a few distinct heads). */
const HEADS = 4;
const BACKSLASH = 0x5c;
const BAR = 0x7c;
const EQUALS = 0x3d;
const TILDE = 0x7e;
/** JavaScript runs one hashKey at a time and it never calls out: one stream serves every call. */
const scratchStream = new KeyHashStream();
