// The bucket keys of recent refusals, found by the key hash the bucket table took them under, so a
// bucket refused again and again (the common refusal: a client over its limit keeps asking) gets
// its key string and its x-ratelimit-refused-limit header without building either.
//
// Why: the fast path hashes a bucket key from the request's values and never builds it
// (rules-match.ts), but a refusal needs the key as a string, for the throttling log and for the
// refused-limit header of an unnamed rule. Built per refusal, that string is a fresh one: the
// throttling counts hash it again, and the codec measures and writes it, and the header's constant
// name, through Buffer's C++ calls. Kept here, the string is the same object every time (its hash
// computed once) and the header is frozen, so the codec copies the encoding it made the first time
// (rls-codec.ts, frozenHeaderBytes). `npm run bench -- decision`, check bytes to bytes over 256
// refused clients: 1.6 µs p50 kept against 2.2 µs built, about what an admission costs (1.7 µs).
//
// Admission: a key is kept at its second refusal while its words are still among its set's last
// WAYS misses. A key kept at its first refusal would cost an entry, a frozen header and the codec's
// kept encoding, for nothing when it is not refused again soon, and many distinct keys in turn
// (a flood from 10,000 addresses) would evict each other without end; so they only leave a note.
//
// Identity: the bucket table already treats a key's three hash words as the bucket's identity (two
// keys with the same words share one bucket, bucket-table.ts), so a key kept under the same words is
// the same key under the same assumption. The words depend on the table's seed: one RefusedKeys per
// decider, whose table never changes.
//
// Bounded: SETS × WAYS entries of keys up to MAX_KEPT_KEY characters (a longer key is built per
// refusal, as before): ~1.5 MiB at most with the codec's kept encodings; 40 KiB while nothing is
// refused.
import type { RlsHeader } from '../messages/rls-messages.js';

const SETS = 1024;
const WAYS = 2;
/** Longer keys are not kept (a bound on the memory a flood of distinct long keys can hold). */
export const MAX_KEPT_KEY = 256;

export interface RefusedKey {
  readonly key: string;
  /** { key: refusedLimitHeader, value: key }, frozen: the codec keeps its encoding. */
  readonly header: RlsHeader;
}

interface Entry extends RefusedKey {
  readonly h0: number;
  readonly h1: number;
  readonly h2: number;
}

export class RefusedKeys {
  /** Set s's ways at [s * WAYS, s * WAYS + WAYS): the most recently kept first. */
  private readonly entries: (Entry | null)[] = new Array<Entry | null>(SETS * WAYS).fill(null);
  /** Per set, the hash words of its last WAYS keys refused and not kept (keep()), the latest first. */
  private readonly ghosts = new Int32Array(SETS * WAYS * 3);

  constructor(private readonly headerName: string) {}

  /** The key kept under these hash words (bucket-table's key hash), or null. */
  find(hash: ArrayLike<number>): RefusedKey | null {
    const h0 = hash[0] as number;
    const h1 = hash[1] as number;
    const h2 = hash[2] as number;
    const at = (h1 & (SETS - 1)) * WAYS;
    for (let w = 0; w < WAYS; w++) {
      const e = this.entries[at + w];
      if (e !== null && e !== undefined && e.h0 === h0 && e.h1 === h1 && e.h2 === h2) return e;
    }
    return null;
  }

  /**
   * `key`, refused under these hash words and not found: kept if its words are among the set's last
   * WAYS misses (its second refusal since then), else only noted. Keys refused once and never
   * again, or more distinct keys than the sets hold in turn, so cost a note each and no entry: a
   * kept header's encoding is made once and kept by the codec, which only pays off when the key is
   * refused again. A key over MAX_KEPT_KEY characters is never kept.
   */
  keep(hash: ArrayLike<number>, key: string): RefusedKey {
    const h0 = hash[0] as number;
    const h1 = hash[1] as number;
    const h2 = hash[2] as number;
    const set = h1 & (SETS - 1);
    const g = set * WAYS * 3;
    const ghosts = this.ghosts;
    let seen = false;
    for (let w = 0; w < WAYS && !seen; w++) {
      const at = g + w * 3;
      seen = ghosts[at] === h0 && ghosts[at + 1] === h1 && ghosts[at + 2] === h2;
    }
    if (!seen || key.length > MAX_KEPT_KEY) {
      for (let at = g + (WAYS - 1) * 3; at > g; at -= 3) {
        ghosts[at] = ghosts[at - 3] as number;
        ghosts[at + 1] = ghosts[at - 2] as number;
        ghosts[at + 2] = ghosts[at - 1] as number;
      }
      ghosts[g] = h0;
      ghosts[g + 1] = h1;
      ghosts[g + 2] = h2;
      return { key, header: { key: this.headerName, value: key } };
    }
    const e: Entry = { key, header: Object.freeze({ key: this.headerName, value: key }), h0, h1, h2 };
    const at = set * WAYS;
    for (let w = WAYS - 1; w > 0; w--) this.entries[at + w] = this.entries[at + w - 1] ?? null;
    this.entries[at] = e;
    return e;
  }
}
