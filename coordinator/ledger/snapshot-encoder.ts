// Encoding a ledger snapshot in steps, from a copy of the state taken at one applied index.
//
// The ledger's snapshot used to be built and packed in one synchronous call on the event loop:
// 1.6 s at 200,000 tenants on the test machine, during which the coordinator answered nothing, sent
// no heartbeat and applied no entry. It is split here in two:
//   - `LedgerSnapshotCopy`, taken synchronously by Ledger.snapshotCopy(): every value the snapshot
//     holds, copied into flat columns (strings and typed arrays, no object per tenant or slice) —
//     the ledger may change as soon as it returns;
//   - `encodeSnapshotSteps(copy)`: a generator that sorts the copy (a merge sort in bounded steps)
//     and packs it a chunk at a time, yielding between steps; whoever runs it decides when the next
//     step runs (Ledger.snapshot() runs them all at once, the Raft driver between other work).
// The bytes are exactly those of msgpackr packing the whole snapshot document at once (the format
// restore() reads, unchanged): the small parts are packed whole, each large array as its msgpack
// array header followed by its elements packed a chunk at a time without the chunk's own header —
// msgpack is context-free, so the concatenation is the same bytes. Pure: no I/O, no clock.
import { Packr } from 'msgpackr';

/** Elements packed per step (tenants, slices, ceilings, keys). */
const CHUNK = 2_000;
/** Index moves per step of the merge sort. */
const SORT_STEP = 32_768;

/** The snapshot's quota rows: [name, rate, burst, floorFraction, updatedIndex]. */
export type SnapQuotaRow = [name: string, rate: number, burst: number, floorFraction: number, updatedIndex: number];

/** Every value of a ledger snapshot, copied out of the ledger at one applied index (unsorted). */
export interface LedgerSnapshotCopy {
  readonly v: number;
  readonly config: [floorCells: number, skewMarginMs: number, maxSessions: number];
  readonly nowMs: number;
  readonly appliedIndex: number;
  readonly tiers: SnapQuotaRow[];
  readonly tierCaps: SnapQuotaRow[];
  readonly domainCaps: SnapQuotaRow[];
  /** Tenants: id, tier, rate and burst (NaN: no override), updatedIndex; one position per tenant. */
  readonly tenants: {
    readonly id: string[];
    readonly tier: string[];
    readonly rate: Float64Array;
    readonly burst: Float64Array;
    readonly updatedIndex: Float64Array;
  };
  /** Cells as their snapshot tuples, in registration order. */
  readonly cells: unknown[][];
  /**
   * Slices grouped by quota key: key g's slices are at [start[g], start[g + 1]); per slice its cell
   * and its numbers, in SLICE_FIELDS order (`num[f][s]`).
   */
  readonly slices: {
    readonly key: string[];
    readonly start: Int32Array;
    readonly cellId: string[];
    readonly num: Float64Array[];
  };
  readonly ceilings: { readonly key: string[]; readonly rate: Float64Array; readonly burst: Float64Array };
  /** Client sessions as their snapshot tuples (their results are never changed once recorded). */
  readonly sessions: unknown[][];
  readonly settings: unknown[];
  /** Implicit tenants winding down; null: none (the field is left out). */
  readonly retiringImplicit: string[] | null;
  /** Removed cells' tombstones, [id, highest epoch issued], sorted by id; null when there is none. */
  readonly cellTombstones: [string, number][] | null;
}

/** A slice's numbers after its key and cell, in the snapshot tuple's order. */
export const SLICE_FIELDS = [
  'epoch',
  'rate',
  'burst',
  'leaseExpiresAtMs',
  'floorRate',
  'floorBurst',
  'heldRate',
  'heldBurst',
  'heldFloorRate',
  'heldFloorBurst',
  'version',
] as const;

const packr = new Packr({ useRecords: false, moreTypes: false });

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** msgpack's header of an array of `n` elements (msgpackr's choice: fixarray, array 16, array 32). */
function arrayHeader(n: number): Uint8Array {
  if (n < 16) return Uint8Array.of(0x90 | n);
  if (n < 0x10000) return Uint8Array.of(0xdc, n >>> 8, n & 0xff);
  return Uint8Array.of(0xdd, n >>> 24, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff);
}

/** The header msgpackr writes for an object of `n` fields: always map 16 (it counts the keys as it goes). */
function mapHeader(n: number): Uint8Array {
  return Uint8Array.of(0xde, n >>> 8, n & 0xff);
}

/** Positions 0..n-1 ordered by `keys` (stable), in steps of bounded work: insertion runs, then merges. */
function* sortedOrder(keys: readonly string[]): Generator<void, Int32Array, void> {
  const n = keys.length;
  let a = new Int32Array(n);
  let b = new Int32Array(n);
  for (let i = 0; i < n; i++) a[i] = i;
  const RUN = 32;
  let work = 0;
  for (let lo = 0; lo < n; lo += RUN) {
    const hi = Math.min(n, lo + RUN);
    for (let i = lo + 1; i < hi; i++) {
      const v = a[i] as number;
      const kv = keys[v] as string;
      let j = i - 1;
      while (j >= lo && cmp(keys[a[j] as number] as string, kv) > 0) {
        a[j + 1] = a[j] as number;
        j--;
      }
      a[j + 1] = v;
    }
    work += RUN * 4;
    if (work >= SORT_STEP) {
      work = 0;
      yield;
    }
  }
  for (let width = RUN; width < n; width *= 2) {
    for (let lo = 0; lo < n; lo += 2 * width) {
      const mid = Math.min(n, lo + width);
      const hi = Math.min(n, lo + 2 * width);
      let i = lo;
      let j = mid;
      let k = lo;
      while (i < mid && j < hi) {
        // Stable: the left run's element first on equal keys.
        if (cmp(keys[a[j] as number] as string, keys[a[i] as number] as string) < 0) b[k++] = a[j++] as number;
        else b[k++] = a[i++] as number;
        if (++work >= SORT_STEP) {
          work = 0;
          yield;
        }
      }
      while (i < mid) b[k++] = a[i++] as number;
      while (j < hi) b[k++] = a[j++] as number;
    }
    const t = a;
    a = b;
    b = t;
  }
  return a;
}

/**
 * Appends to `out` the array of `count` elements that `element(i)` makes for i in order, packed a
 * chunk at a time (one step each).
 */
function* packArray(out: Uint8Array[], count: number, element: (i: number) => unknown): Generator<void, void, void> {
  out.push(arrayHeader(count));
  for (let from = 0; from < count; from += CHUNK) {
    const to = Math.min(count, from + CHUNK);
    const chunk = new Array<unknown>(to - from);
    for (let i = from; i < to; i++) chunk[i - from] = element(i);
    const bytes = packr.pack(chunk);
    out.push(bytes.subarray(arrayHeader(chunk.length).length));
    yield;
  }
}

const num = (x: number): number | null => (Number.isNaN(x) ? null : x);

/** The snapshot's bytes from `copy`, one bounded step per `yield`. */
export function* encodeSnapshotSteps(copy: LedgerSnapshotCopy): Generator<void, Uint8Array, void> {
  const out: Uint8Array[] = [];
  const field = (name: string): void => {
    out.push(packr.pack(name));
  };
  const small = (name: string, value: unknown): void => {
    field(name);
    out.push(packr.pack(value));
  };
  const byName = (rows: SnapQuotaRow[]): SnapQuotaRow[] => [...rows].sort((x, y) => cmp(x[0], y[0]));
  out.push(mapHeader(13 + (copy.retiringImplicit === null ? 0 : 1) + (copy.cellTombstones === null ? 0 : 1)));
  small('v', copy.v);
  small('config', copy.config);
  small('nowMs', copy.nowMs);
  small('appliedIndex', copy.appliedIndex);
  small('tiers', byName(copy.tiers));
  small('tierCaps', byName(copy.tierCaps));
  small('domainCaps', byName(copy.domainCaps));

  const t = copy.tenants;
  const tenantOrder = yield* sortedOrder(t.id);
  field('tenants');
  yield* packArray(out, tenantOrder.length, (i) => {
    const p = tenantOrder[i] as number;
    return [t.id[p], t.tier[p], num(t.rate[p] as number), num(t.burst[p] as number), t.updatedIndex[p]];
  });

  small('cells', copy.cells);

  // Slices: keys sorted, each key's cells sorted (a handful).
  const s = copy.slices;
  const keyOrder = yield* sortedOrder(s.key);
  const sliceOrder = new Int32Array(s.cellId.length);
  let at = 0;
  for (let g = 0; g < keyOrder.length; g++) {
    const k = keyOrder[g] as number;
    const from = s.start[k] as number;
    const to = s.start[k + 1] as number;
    const cells: number[] = [];
    for (let x = from; x < to; x++) cells.push(x);
    cells.sort((x, y) => cmp(s.cellId[x] as string, s.cellId[y] as string));
    for (const x of cells) sliceOrder[at++] = x;
    if ((g & 0x3fff) === 0x3fff) yield;
  }
  const keyOfSlice: string[] = new Array<string>(s.cellId.length);
  for (let g = 0; g < s.key.length; g++)
    for (let x = s.start[g] as number; x < (s.start[g + 1] as number); x++) keyOfSlice[x] = s.key[g] as string;
  field('slices');
  yield* packArray(out, at, (i) => {
    const x = sliceOrder[i] as number;
    const row: unknown[] = [keyOfSlice[x], s.cellId[x]];
    for (const col of s.num) row.push(col[x]);
    return row;
  });

  const c = copy.ceilings;
  const ceilingOrder = yield* sortedOrder(c.key);
  field('ceilings');
  yield* packArray(out, ceilingOrder.length, (i) => {
    const p = ceilingOrder[i] as number;
    return [c.key[p], c.rate[p], c.burst[p]];
  });

  small('sessions', copy.sessions);
  small('settings', copy.settings);
  if (copy.retiringImplicit !== null) {
    const keys = copy.retiringImplicit;
    const order = yield* sortedOrder(keys);
    field('retiringImplicit');
    yield* packArray(out, order.length, (i) => keys[order[i] as number]);
  }
  if (copy.cellTombstones !== null) small('cellTombstones', copy.cellTombstones);
  let size = 0;
  for (const part of out) size += part.byteLength;
  const bytes = new Uint8Array(size);
  let pos = 0;
  for (const part of out) {
    bytes.set(part, pos);
    pos += part.byteLength;
  }
  return bytes;
}

/** Runs every step at once: the snapshot's bytes now. */
export function encodeSnapshotNow(copy: LedgerSnapshotCopy): Uint8Array {
  const steps = encodeSnapshotSteps(copy);
  for (;;) {
    const r = steps.next();
    if (r.done === true) return r.value;
  }
}
