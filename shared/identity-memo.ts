// A memo of the last two keys looked up, found by identity (===), in front of a WeakMap or a
// computation on a hot path that meets the same few objects again and again: a decision's rules and
// limits. A one-entry memo ("the last one") thrashes as soon as the path alternates between two (a
// request of two descriptors: a shared limit and a per-client one), and then every check pays the
// lookup or conversion behind it. Two fields, no array: small enough for the optimizing compiler to
// inline get() at its call sites. Keys are held strongly until replaced, so a memo keeps at most two
// replaced objects (a reloaded rule's limits) alive a little longer.

export class IdentityMemo<K extends object, V> {
  private k0: K | null = null;
  private v0: V | null = null;
  private k1: K | null = null;
  private v1: V | null = null;

  /** The value set for `key` (the same object), or undefined when it is not one of the last two set. */
  get(key: K): V | undefined {
    if (key === this.k0) return this.v0 as V;
    if (key === this.k1) return this.v1 as V;
    return undefined;
  }

  /** Remembers `value` for `key` in place of the older entry (call it after a get() of `key` missed). */
  set(key: K, value: V): void {
    this.k1 = this.k0;
    this.v1 = this.v0;
    this.k0 = key;
    this.v0 = value;
  }
}
