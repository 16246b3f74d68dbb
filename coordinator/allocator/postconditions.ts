// The round's post-conditions, checked in production as it runs (as the Raft core asserts its
// invariants): a broken one is a bug, and the round throws AllocatorInvariantError rather than
// propose grants that may break the bound. Cheap: O(cells) per computed quota, O(children × cells)
// per computed cap, so a round's checks cost what the round computes.
//
// Per quota (checkQuotaGrants), over the grants it sends:
//   - every grant is finite and at least the cell's floor (rate and burst; no negative grant);
//   - Σ counted after the round ≤ max(quota, Σ counted before): a grant x raises its cell's counted
//     use u to max(u, x) (a shrink lowers nothing until acknowledged), so the rises Σ max(0, x − u)
//     must fit in the free capacity max(0, quota − Σu) — none at all while over the limit. This is
//     the ledger's own acceptance rule (it refuses a round above the quota's ceiling), rates and
//     bursts, as the allocator counts use before the entry.
// Per cap (checkChildren), at every reporting cell:
//   - Σ_children max(floor, grant) ≤ max(the cap's max(floor, grant), Σ_children floors).

import { AllocatorInvariantError } from './allocator-types.js';
import type { AllocatorQuota } from './allocator-types.js';
import { F_EMIT } from './round-context.js';
import type { Ctx, Scratch } from './round-context.js';

/** Tolerance of the checks, relative (the ledger's bound tolerance). */
const TOL = 1e-9;

/** Quota q's decisions in the scratch (reporting cells at [0, k)) against its counted use before. */
export function checkQuotaGrants(q: AllocatorQuota, sc: Scratch, k: number, usedR: number, usedB: number): void {
  const { fl, flb, u, ub, nr, nb, flags } = sc;
  let riseR = 0;
  let riseB = 0;
  for (let j = 0; j < k; j++) {
    if (((flags[j] as number) & F_EMIT) === 0) continue;
    const r = nr[j] as number;
    const b = nb[j] as number;
    const f = fl[j] as number;
    const fb = flb[j] as number;
    if (!(r >= f - TOL * (f > 1 ? f : 1) && r < Infinity && b >= fb - TOL * (fb > 1 ? fb : 1) && b < Infinity)) {
      throw new AllocatorInvariantError(
        `quota ${q.key}: grant ${r}/${b} (rate/burst) is not finite or below the floor ${f}/${fb}`,
      );
    }
    const ur = u[j] as number;
    const urb = ub[j] as number;
    if (r > ur) riseR += r - ur;
    if (b > urb) riseB += b - urb;
  }
  const freeR = q.rate > usedR ? q.rate - usedR : 0;
  const freeB = q.burst > usedB ? q.burst - usedB : 0;
  if (riseR > freeR + TOL * Math.max(1, q.rate) || riseB > freeB + TOL * Math.max(1, q.burst)) {
    throw new AllocatorInvariantError(
      `quota ${q.key}: the grants raise the counted use by ${riseR}/${riseB} ` +
        `(rate/burst), more than the free ${freeR}/${freeB}`,
    );
  }
}

/**
 * After the round: cap `p`'s children (`children`, input rows) hold at most the cap's level at
 * every reporting cell, above their floors. Needs the round's levels (ctx.levelRate/levelBurst).
 */
export function checkChildren(ctx: Ctx, p: number, children: Int32Array): void {
  const { n, quotas, reported, hasFloor } = ctx;
  const levelRate = ctx.levelRate as Float64Array;
  const levelBurst = ctx.levelBurst as Float64Array;
  for (let c = 0; c < n; c++) {
    if (reported[c] !== 1) continue;
    const floored = hasFloor[c] === 1;
    let sumR = 0;
    let sumB = 0;
    let floorR = 0;
    let floorB = 0;
    for (let x = 0; x < children.length; x++) {
      const ch = children[x] as number;
      const i = ch * n + c;
      sumR += levelRate[i] as number;
      sumB += levelBurst[i] as number;
      if (floored) {
        const cq = quotas[ch] as AllocatorQuota;
        floorR += cq.floorRate;
        floorB += cq.floorBurst;
      }
    }
    const capR = Math.max(levelRate[p * n + c] as number, floorR);
    const capB = Math.max(levelBurst[p * n + c] as number, floorB);
    if (sumR > capR * (1 + TOL) + TOL || sumB > capB * (1 + TOL) + TOL) {
      throw new AllocatorInvariantError(
        `cap ${(quotas[p] as AllocatorQuota).key} at cell ${ctx.cells[c]?.id ?? c}: ` +
          `its children hold ${sumR}/${sumB} (rate/burst), above its level ${capR}/${capB}`,
      );
    }
  }
}
