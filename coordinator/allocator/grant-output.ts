// The round's output: the changed grants in columns (quota row, cell, rate, burst — no object per
// grant while the round runs), the `Grant` objects made from them for whoever needs them, and the
// step that writes one quota's decisions there.

import type { Grant } from '../ledger/ledger-commands.js';
import type { AllocatorInput, AllocatorQuota } from './allocator-types.js';
import { checkQuotaGrants } from './postconditions.js';
import { F_EMIT, F_EMIT_RATE } from './round-context.js';
import type { Ctx } from './round-context.js';

/**
 * The changed grants of a round, in the order the round made them (parents before children): grant
 * g is quota `row[g]` of the input at cell `cell[g]`, new rate `rate[g]` and burst `burst[g]`; its
 * epoch is the slice's current epoch + 1 and its lease ends at `leaseExpiresAtMs`. Buffers are
 * reused by the next round on the same workspace.
 */
export class GrantColumns {
  count = 0;
  leaseExpiresAtMs = 0;
  row = new Int32Array(1024);
  cell = new Uint8Array(1024);
  rate = new Float64Array(1024);
  burst = new Float64Array(1024);

  reset(leaseExpiresAtMs: number): void {
    this.count = 0;
    this.leaseExpiresAtMs = leaseExpiresAtMs;
  }

  push(row: number, cell: number, rate: number, burst: number): void {
    const g = this.count;
    if (g === this.row.length) this.grow();
    this.row[g] = row;
    this.cell[g] = cell;
    this.rate[g] = rate;
    this.burst[g] = burst;
    this.count = g + 1;
  }

  private grow(): void {
    const size = this.row.length * 2;
    const row = new Int32Array(size);
    const cell = new Uint8Array(size);
    const rate = new Float64Array(size);
    const burst = new Float64Array(size);
    row.set(this.row);
    cell.set(this.cell);
    rate.set(this.rate);
    burst.set(this.burst);
    this.row = row;
    this.cell = cell;
    this.rate = rate;
    this.burst = burst;
  }

  /** Grant g as the ledger's `Grant`, with the given numbers (default: the round's). */
  grant(input: AllocatorInput, g: number, rate = this.rate[g] as number, burst = this.burst[g] as number): Grant {
    const q = this.row[g] as number;
    const c = this.cell[g] as number;
    const epoch = (input.slices.epoch[q * input.cells.length + c] as number) + 1;
    return {
      key: (input.quotas[q] as AllocatorQuota).key,
      cellId: (input.cells[c] as { id: string }).id,
      rate,
      burst,
      epoch,
      leaseExpiresAtMs: this.leaseExpiresAtMs,
    };
  }

  /** Every grant as a `Grant`, in order. */
  grants(input: AllocatorInput): Grant[] {
    const out: Grant[] = new Array<Grant>(this.count);
    for (let g = 0; g < this.count; g++) out[g] = this.grant(input, g);
    return out;
  }
}

/**
 * Writes quota `qi`'s levels (for its children's caps) and a grant for every flagged reporting cell
 * (scratch at [0, k)), after checking the quota's post-conditions (postconditions.ts) against the
 * counted use before the round, `usedR` / `usedB`.
 */
export function emitQuota(ctx: Ctx, q: AllocatorQuota, qi: number, k: number, usedR: number, usedB: number): void {
  const { idx, nr, nb, flags } = ctx.scratch;
  checkQuotaGrants(q, ctx.scratch, k, usedR, usedB);
  const levelRate = ctx.levelRate;
  const levelBurst = ctx.levelBurst;
  const out = ctx.out;
  const base = qi * ctx.n;
  let burstOnly = 0;
  for (let j = 0; j < k; j++) {
    const c = idx[j] as number;
    const fg = flags[j] as number;
    const r = nr[j] as number;
    const b = nb[j] as number;
    if (levelRate !== null && levelBurst !== null) {
      levelRate[base + c] = r;
      levelBurst[base + c] = b;
    }
    if ((fg & F_EMIT) === 0) continue;
    if ((fg & F_EMIT_RATE) === 0) burstOnly++;
    out.push(qi, c, r, b);
  }
  ctx.stats.burstOnly += burstOnly;
}
