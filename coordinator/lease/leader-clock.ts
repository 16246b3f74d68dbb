// The time a lease leader stamps on what it proposes, so that safety depends on clock RATES only,
// never on the offset between two machines' clocks.
//
// Lease expiries in the ledger are times in the frame of whichever leader renewed them. A new
// leader's clock may be seconds ahead of the old one's: compared with its own clock, an expiry the
// old leader stamped would pass seconds early and the grant be handed to another cell while the
// agent still uses it. So:
//   - Within one term the leader's clock is its own monotonic clock (anchored once to the wall
//     clock, so its times look like epoch ms): a step of the wall clock changes nothing.
//   - Once the new term's leader has applied every earlier committed entry (a read barrier), it
//     adopts the ledger's clock if that is ahead of its own (`synced`): its times never fall below
//     any expiry's frame base, so a renewal it stamps is never born expired.
//   - For the first TTL + margin of its term, measured on its own monotonic clock from when it
//     noticed the leadership (the "grace"), it stamps the ledger's current time, so the ledger's
//     clock does not advance and no lease is released that the ledger did not already release.
//     Every lease an earlier leader renewed was answered before this term began (answers follow
//     the commit, and no entry of an older term commits after a newer leader is elected), so the
//     agent's lease (sent + TTL on its own monotonic clock) is over by the end of the grace when
//     (TTL + margin)/(1 + ρ) ≥ TTL/(1 − ρ), i.e. margin ≥ 2ρ·TTL/(1 − ρ) for a clock-rate error ρ.
//   - After the grace it stamps max(its clock, the ledger's). A renewal of its own (expiry ≥
//     receipt + TTL in its frame) is released only once its monotonic clock ran TTL + margin
//     since the receipt: the same inequality.
// The defaults (TTL 3 s, margin 1 s) tolerate ρ up to 1/7 (quartz is ~1e-4). Beyond it a cell may
// use a grant for up to TTL/(1 − ρ) − (TTL + margin)/(1 + ρ) after the ledger released it.
import { planted } from '../../shared/planted-bugs.js';

export interface LeaderClockOptions {
  /** A monotonic clock in ms (performance.now). */
  readonly monoMs: () => number;
  /** The wall clock, read once to anchor the monotonic one (Date.now). */
  readonly wallMs: () => number;
}

export class LeaderClock {
  private readonly mono: () => number;
  private readonly anchor: number;
  private termStart: number | null = null;
  private graceMs = 0;
  private offset = 0;
  private isSynced = false;

  constructor(opts: LeaderClockOptions) {
    this.mono = opts.monoMs;
    this.anchor = opts.wallMs() - opts.monoMs();
  }

  /** This leader's time in its current frame (monotonic; ≥ the ledger's once synced). */
  time(): number {
    if (planted['release-by-wall-clock']) return this.anchor + this.mono();
    return this.anchor + this.mono() + this.offset;
  }

  /** A new term of ours begins now; `graceMs` = lease TTL + the ledger's skew margin. */
  beginTerm(graceMs: number): void {
    if (!(Number.isFinite(graceMs) && graceMs >= 0))
      throw new RangeError(`grace must be a finite, non-negative number of ms, not ${graceMs}`);
    this.termStart = this.mono();
    this.graceMs = graceMs;
    this.isSynced = false;
  }

  /** Called once this term's ledger reflects every earlier committed entry, with the ledger's clock. */
  sync(ledgerNowMs: number): void {
    const behind = ledgerNowMs - this.time();
    if (behind > 0) this.offset += behind;
    this.isSynced = true;
  }

  /** Ends the grace early: nothing needs it (no lease in the ledger that another leader renewed). */
  endGrace(): void {
    this.graceMs = 0;
  }

  get synced(): boolean {
    return this.isSynced;
  }

  /** Milliseconds of grace left in this term (0 once over). */
  graceLeftMs(): number {
    if (this.termStart === null) return Infinity;
    return Math.max(0, this.graceMs - (this.mono() - this.termStart));
  }

  /** The time to stamp on a command: the ledger's own during the grace, else max(ours, the ledger's). */
  stamp(ledgerNowMs: number): number {
    if (planted['release-by-wall-clock']) return this.anchor + this.mono();
    if (this.graceLeftMs() > 0 || !this.isSynced) return ledgerNowMs;
    return Math.max(this.time(), ledgerNowMs);
  }
}
