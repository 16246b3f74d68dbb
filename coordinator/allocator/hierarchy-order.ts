// The order of a round's quotas: parents before children (by depth, input order within a depth),
// and each parent's children as one list — from the `parent` keys of the input.

import { AllocatorInputError } from './allocator-types.js';
import type { AllocatorQuota } from './allocator-types.js';

export interface QuotaOrder {
  /** The input rows in the order they are allocated. */
  readonly order: Int32Array;
  /** Children of row q: children[childStart[q] … childStart[q + 1]) (CSR); null: no quota has a parent. */
  readonly childStart: Int32Array | null;
  readonly children: Int32Array | null;
}

/** Throws AllocatorInputError for a parent not in the round, a parent key given twice, or a cycle. */
export function quotaOrder(quotas: readonly AllocatorQuota[]): QuotaOrder {
  const nq = quotas.length;
  let anyParent = false;
  for (let q = 0; q < nq && !anyParent; q++) if ((quotas[q] as AllocatorQuota).parent !== null) anyParent = true;
  if (!anyParent) {
    const order = new Int32Array(nq);
    for (let q = 0; q < nq; q++) order[q] = q;
    return { order, childStart: null, children: null };
  }
  const parentIdx = parentRows(quotas);
  const order = byDepth(quotas, parentIdx);
  // Children lists (CSR).
  const childStart = new Int32Array(nq + 1);
  for (let q = 0; q < nq; q++) {
    const p = parentIdx[q] as number;
    if (p >= 0) childStart[p + 1] = (childStart[p + 1] as number) + 1;
  }
  for (let q = 0; q < nq; q++) childStart[q + 1] = (childStart[q + 1] as number) + (childStart[q] as number);
  const children = new Int32Array(childStart[nq] as number);
  const fillAt = childStart.slice(0, nq);
  for (let q = 0; q < nq; q++) {
    const p = parentIdx[q] as number;
    if (p < 0) continue;
    const pos = fillAt[p] as number;
    children[pos] = q;
    fillAt[p] = pos + 1;
  }
  return { order, childStart, children };
}

/** Each row's parent row (−1: none). */
function parentRows(quotas: readonly AllocatorQuota[]): Int32Array {
  const nq = quotas.length;
  const parentIdx = new Int32Array(nq).fill(-1);
  // Only the few parent keys are looked up (a map of every key would cost a round of 100,000
  // quotas more than the rest of the hierarchy work).
  const parents = new Map<string, number>();
  for (let q = 0; q < nq; q++) {
    const p = (quotas[q] as AllocatorQuota).parent;
    if (p !== null) parents.set(p, -1);
  }
  for (let q = 0; q < nq; q++) {
    const key = (quotas[q] as AllocatorQuota).key;
    const known = parents.get(key);
    if (known === undefined) continue;
    if (known !== -1) throw new AllocatorInputError(`quota ${key} appears twice`);
    parents.set(key, q);
  }
  for (let q = 0; q < nq; q++) {
    const p = (quotas[q] as AllocatorQuota).parent;
    if (p === null) continue;
    const pi = parents.get(p) ?? -1;
    if (pi < 0)
      throw new AllocatorInputError(`quota ${(quotas[q] as AllocatorQuota).key}: parent ${p} is not in the round`);
    parentIdx[q] = pi;
  }
  return parentIdx;
}

/** The rows sorted by depth (a stable counting sort). */
function byDepth(quotas: readonly AllocatorQuota[], parentIdx: Int32Array): Int32Array {
  const nq = quotas.length;
  const depth = new Int32Array(nq).fill(-1);
  let maxDepth = 0;
  for (let q = 0; q < nq; q++) {
    let d = 0;
    let p = parentIdx[q] as number;
    while (p >= 0) {
      const known = depth[p] as number;
      if (known >= 0) {
        d += known + 1;
        break;
      }
      d++;
      if (d > nq) throw new AllocatorInputError(`quota ${(quotas[q] as AllocatorQuota).key}: its parents form a cycle`);
      p = parentIdx[p] as number;
    }
    depth[q] = d;
    if (d > maxDepth) maxDepth = d;
  }
  const count = new Int32Array(maxDepth + 2);
  for (let q = 0; q < nq; q++) {
    const at = (depth[q] as number) + 1;
    count[at] = (count[at] as number) + 1;
  }
  for (let k = 1; k < count.length; k++) count[k] = (count[k] as number) + (count[k - 1] as number);
  const order = new Int32Array(nq);
  for (let q = 0; q < nq; q++) {
    const at = depth[q] as number;
    const pos = count[at] as number;
    order[pos] = q;
    count[at] = pos + 1;
  }
  return order;
}
