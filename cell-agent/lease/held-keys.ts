// Which quota keys the lease client keeps a grant for, and which it gives back (releases). Pure: no
// I/O, no clock.
//
// Why: an agent that sees a million distinct tenants held a grant (and an override entry in every
// thread) for each of them forever: ~3-6 KB per key over the main thread and a worker, 968 MiB at
// 200,000 tenants (`npm run bench -- agent-tenants`), and every lapse of the lease asked for a full
// picture of all of them again. So at most `max` keys are held: past it, the keys no check asked
// about for longest (no demand in the velocity window since) are evicted down to LOW_WATERMARK × max
// and released to the leader (ReportRequest.released), which stops sending them until the cell asks
// for the key again (demand), then sends its current slice. A grant a full picture carries for a key
// the agent does not hold and has no demand for is released at once, never held.
//
// The bound (docs/quota-model.md): an evicted key's override is removed in every thread (confirmed, as
// an acknowledgement is) before its release is sent, so its checks are refused (the agent holds
// nothing for it) until a grant arrives; from command format 7 the leader drops the cell's slice from the
// ledger when the release names its current epoch (docs/quota-model.md, "Format 7"), below it the ledger
// counts the slice as before. While a
// release waits, a grant at or below the released epoch is not taken (it is the one given back); a
// newer one is, as always. A key that comes
// back takes the slice the answer carries (built from the committed ledger, as any answer). Its bucket,
// if the table still has it, is not emptied by the eviction and would refill at the old limit (a GCRA
// level grows with time); what empties it is the refused checks that ask for the key again: each takes
// the bucket under the pending slice (rate 0), and a key comes back only through that demand (the
// leader grants a released key again only when the cell reports demand for it). So it comes back
// empty. (A grant arriving without such a check would find the old level: none is sent today.)
//
// A release that reaches a leader in its session's first TTL + skew margin is taken (the key is not sent
// again) but drops no slice (ReportResponse.releases_parked: a copy of a report sent before the session
// began could name a grant the agent took back since). Such releases are parked here and sent again once
// an answer comes without the flag: a release sent then is one the session may trust, as any new one. Before,
// they were done at once and their slices stayed counted for good (the cell's slices grew with every
// election: 18,000 -> 53,838 over 4 at 1,000,000 tenants in `npm run bench -- agent-tenants`).

/** --max-lease-keys by default (measured cost per held key: cell-agent/README.md). */
export const DEFAULT_MAX_LEASE_KEYS = 20_000;
/** Eviction goes down to this share of the bound, so it runs once per many new keys, not per key. */
export const LOW_WATERMARK = 0.9;
/** Most releases one report carries (≈ 20 bytes each); the rest go in the next report, sent at once. */
export const MAX_RELEASES_PER_REPORT = 10_000;

export interface ReleaseEntry {
  readonly key: string;
  readonly epoch: number;
}

export class HeldKeys {
  /** Held keys, least recently used first (a Map keeps insertion order). */
  private readonly order = new Map<string, true>();
  /** Keys released and not yet delivered to a leader → the epoch given back. */
  private readonly releasing = new Map<string, number>();
  /**
   * Of those, the ones a leader took but parked (ReportResponse.releases_parked: its session drops no slice yet):
   * not sent again until unpark(). Still releases in every other way: no grant at or below their epoch is taken.
   */
  private readonly parked = new Set<string>();
  /** Keys with demand in the latest velocity window. */
  private demand: ReadonlySet<string> = new Set();

  /** `max`: the most keys held (Infinity: no eviction). */
  constructor(readonly max: number) {}

  /** `key` was granted or asked about now: the most recently used. */
  touch(key: string): void {
    this.order.delete(key);
    this.order.set(key, true);
  }

  /** `key` is no longer held (dropped, deleted, evicted). */
  forget(key: string): void {
    this.order.delete(key);
  }

  /** The keys with demand in the velocity window of this report (never evicted while they have it). */
  setDemand(keys: ReadonlySet<string>): void {
    this.demand = keys;
  }

  hasDemand(key: string): boolean {
    return this.demand.has(key);
  }

  /**
   * The held keys to evict now: none while at most `max` are held (`held`, the grants map's size); else
   * the least recently used without demand, down to LOW_WATERMARK × max. `isHeld` drops stale entries.
   */
  victims(held: number, isHeld: (key: string) => boolean): string[] {
    if (!(held > this.max)) return [];
    const target = Math.floor(this.max * LOW_WATERMARK);
    const out: string[] = [];
    let left = held;
    for (const key of this.order.keys()) {
      if (left <= target) break;
      if (!isHeld(key)) {
        this.order.delete(key);
        continue;
      }
      if (this.demand.has(key)) continue;
      out.push(key);
      left--;
    }
    for (const key of out) this.order.delete(key);
    return out;
  }

  /** Gives `key` back at `epoch` (the highest the agent saw for it): sent with the next reports. */
  release(key: string, epoch: number): void {
    this.order.delete(key);
    const before = this.releasing.get(key);
    this.releasing.set(key, Math.max(epoch, before ?? 0));
    if (before === undefined || epoch > before) this.parked.delete(key);
  }

  /** The epoch a waiting release gave back for `key`, or undefined. */
  released(key: string): number | undefined {
    return this.releasing.get(key);
  }

  /** A grant newer than the release arrived: the key is held again. */
  unrelease(key: string): void {
    this.releasing.delete(key);
    this.parked.delete(key);
  }

  /** Releases waiting. */
  get pending(): number {
    return this.releasing.size;
  }

  /** Of the releases waiting, those parked (sent again after unpark()). */
  get parkedCount(): number {
    return this.parked.size;
  }

  /** The next report's releases (at most MAX_RELEASES_PER_REPORT), parked ones left out. */
  page(): ReleaseEntry[] {
    const out: ReleaseEntry[] = [];
    if (this.parked.size === this.releasing.size) return out;
    for (const [key, epoch] of this.releasing) {
      if (out.length >= MAX_RELEASES_PER_REPORT) break;
      if (this.parked.has(key)) continue;
      out.push({ key, epoch });
    }
    return out;
  }

  /** A leader answered the report that carried `sent`: those releases are done. */
  delivered(sent: readonly ReleaseEntry[]): void {
    for (const r of sent)
      if (this.releasing.get(r.key) === r.epoch) {
        this.releasing.delete(r.key);
        this.parked.delete(r.key);
      }
  }

  /**
   * A leader took the releases `sent` but parked them (its session drops no slice yet): kept, not sent again until
   * unpark(). One it took and dropped nothing for would otherwise stay counted in its ledger for good.
   */
  park(sent: readonly ReleaseEntry[]): void {
    for (const r of sent) if (this.releasing.get(r.key) === r.epoch) this.parked.add(r.key);
  }

  /** A leader's session drops released slices now: the parked releases go with the next reports. Whether any did. */
  unpark(): boolean {
    if (this.parked.size === 0) return false;
    this.parked.clear();
    return true;
  }

  /** Held keys tracked (for tests and status). */
  get size(): number {
    return this.order.size;
  }
}
