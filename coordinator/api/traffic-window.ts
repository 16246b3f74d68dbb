// What the leader reconstructs from the cells' reports: per global quota, the admitted and refused
// rate of every cell, the admitted count over 1 s windows against the quota's bound (r·W + b, the
// overshoot ratio of DESIGN's "The bound"), and a 5-minute per-cell history for the live view.
// Pure: no timers, no I/O; the caller passes the time (the leader's clock) and the ledger lookups.
//
// Reconstruction. Each report carries, per quota, allowed/s over the agent's last 500 ms (a sliding
// window read at send time). A report received at R therefore tells how much the cell admitted in
// [R − 500 ms, R): its count is written, evenly, into that cell's 100 ms bins of that span. A later
// report covering the same bins overwrites them (never adds): jittered reports overlapping in time
// cannot double-count. Bins no report covers count 0 (a silent cell admits nothing we know of).
// A bin is settled SETTLE_MS after it ends (by then every cell's report covering it has arrived);
// at each settled bin the window of the last WINDOW_BINS bins, summed over cells, is divided by
// rate·W + burst. Spreading a report over its 500 ms smooths bursts shorter than that: the ratio is
// what the reports can show, a lower estimate of a true peak inside one report, exact for load that
// is steady over 100 ms.
//
// Bounds: at most MAX_TRACKED_KEYS quotas are followed (a key silent for HISTORY_MS is dropped; past
// the cap, new keys are not followed and counted in `untracked`); histories (HISTORY_POINTS seconds
// per cell) exist for at most MAX_HISTORY_KEYS quotas, the most recently busy ones.
//
// Cost (issue 12: the leader settles every 200 ms on its event loop, so this must stay small with
// 200,000 followed quotas): a key with no history and nothing admitted since before its last
// window (refusals write zero bins) is settled without a ledger lookup — its totals ring zeroed,
// exactly what settling its zero bins one by one did. Past MAX_HISTORY_KEYS, a history is made
// only for a key busy more recently than the last history dropped, and at most HISTORY_TRIM_BATCH
// a settle: making one (300-point arrays) for every busy key each second and dropping it at the
// next trim made the leader's event loop stall for hundreds of ms with 200,000 tenants, long
// enough for its followers to elect another leader.

export const BIN_MS = 100;
/** The window W of the bound r·W + b. */
export const WINDOW_MS = 1000;
export const WINDOW_BINS = WINDOW_MS / BIN_MS;
/** The span one report's velocity covers (the agent's velocity window). */
export const REPORT_SPAN_MS = 500;
/** A bin is final this long after its end. */
export const SETTLE_MS = 1500;
/** Bins kept per cell and quota (≥ the settle delay plus a window). */
const RING_BINS = 32;
export const HISTORY_POINTS = 300;
export const HISTORY_MS = HISTORY_POINTS * 1000;
/** Peak ratios are kept per second for this long (the gauge's horizon). */
export const PEAK_HORIZON_S = 60;
export const MAX_TRACKED_KEYS = 200_000;
export const MAX_HISTORY_KEYS = 4_000;
/** Histories are dropped in batches of this many past the cap (a sort per batch, not per key). */
const HISTORY_TRIM_BATCH = 64;
/** A window above 1 + this counts as over the bound (float noise aside). */
export const OVER_TOLERANCE = 1e-6;

export interface VelocityReport {
  readonly key: string;
  readonly allowedPerS: number;
  readonly refusedPerS: number;
}

/** Ledger lookups the reconstruction needs at settle time. */
export interface QuotaLookup {
  /** The quota's bound parameters, undefined when the quota no longer exists. */
  quota(key: string): { rate: number; burst: number } | undefined;
  /** The rate cell `cellId` may use for `key` right now (its live grant, else its floor). */
  cellLimit(key: string, cellId: string): number;
}

interface CellSeries {
  readonly bins: Float32Array;
  /** Absolute bin number one past the newest written bin. */
  head: number;
  lastAllowedPerS: number;
  lastRefusedPerS: number;
  lastAtMs: number;
}

interface History {
  /** Absolute second each ring slot holds (−1: empty). */
  readonly seconds: Float64Array;
  readonly quota: Float32Array;
  readonly cells: Map<string, { readonly admitted: Float32Array; readonly limit: Float32Array }>;
}

interface KeyState {
  readonly cells: Map<string, CellSeries>;
  /** One past the newest bin any report wrote a non-zero count into: every bin from it on is 0. */
  busyEnd: number;
  /** Settled per-bin totals over cells, by absolute bin mod RING_BINS. */
  readonly totals: Float64Array;
  /** Absolute bin number of the next bin to settle. */
  settled: number;
  lastTrafficMs: number;
  /** Ratio of the newest settled window. */
  lastRatio: number;
  /** Per-second peak ratio over the last PEAK_HORIZON_S seconds. */
  readonly peakSeconds: Float64Array;
  readonly peaks: Float32Array;
  windows: number;
  windowsOver: number;
  history: History | null;
}

export interface QuotaTraffic {
  readonly key: string;
  readonly admittedPerS: number;
  readonly refusedPerS: number;
  readonly cells: readonly {
    readonly cellId: string;
    readonly admittedPerS: number;
    readonly refusedPerS: number;
    readonly atMs: number;
  }[];
  /** Ratio of the newest settled 1 s window (admitted ÷ (r·W + b)). */
  readonly lastRatio: number;
  /** The largest ratio over the windows of the last PEAK_HORIZON_S seconds. */
  readonly peakRatio: number;
  readonly windows: number;
  readonly windowsOver: number;
}

export interface TrafficHistory {
  readonly key: string;
  /** Seconds (ms since the epoch, leader clock), oldest first. */
  readonly times: number[];
  readonly quota: (number | null)[];
  readonly cells: {
    readonly cellId: string;
    readonly admitted: (number | null)[];
    readonly limit: (number | null)[];
  }[];
}

export interface OvershootTotals {
  readonly windows: number;
  readonly windowsOver: number;
  /** Quotas not followed because MAX_TRACKED_KEYS were already. */
  readonly untracked: number;
}

/** A report counts as the cell's current rate for this long. */
const CURRENT_MS = 2000;

export class TrafficWindows {
  private readonly keys = new Map<string, KeyState>();
  private windowsTotal = 0;
  private windowsOverTotal = 0;
  private untrackedTotal = 0;
  private historyKeys = 0;
  /** lastTrafficMs of the most recently busy history dropped by the last trim (see historyPoint). */
  private historyFloorMs = Number.NEGATIVE_INFINITY;
  /** Histories a settle may still make past the cap (see mayMakeHistory). */
  private historiesToMake = HISTORY_TRIM_BATCH;

  constructor(private readonly limits: { readonly maxKeys?: number; readonly maxHistoryKeys?: number } = {}) {}

  get trackedKeys(): number {
    return this.keys.size;
  }

  /** One cell's report, received at `receiptMs`. */
  record(cellId: string, receiptMs: number, velocity: readonly VelocityReport[]): void {
    const end = Math.floor(receiptMs / BIN_MS);
    const start = end - REPORT_SPAN_MS / BIN_MS;
    for (const v of velocity) {
      if (!(
        Number.isFinite(v.allowedPerS) &&
        v.allowedPerS >= 0 &&
        Number.isFinite(v.refusedPerS) &&
        v.refusedPerS >= 0
      ))
        continue;
      let k = this.keys.get(v.key);
      if (k === undefined) {
        if (v.allowedPerS + v.refusedPerS === 0) continue;
        if (this.keys.size >= (this.limits.maxKeys ?? MAX_TRACKED_KEYS)) {
          this.untrackedTotal++;
          continue;
        }
        k = newKeyState(start);
        this.keys.set(v.key, k);
      }
      let c = k.cells.get(cellId);
      if (c === undefined) {
        c = { bins: new Float32Array(RING_BINS), head: start, lastAllowedPerS: 0, lastRefusedPerS: 0, lastAtMs: 0 };
        k.cells.set(cellId, c);
      }
      // Bins between the newest written one and this report's span: no report covered them.
      for (let b = Math.max(c.head, end - RING_BINS); b < end; b++) c.bins[b % RING_BINS] = 0;
      const perBin = (v.allowedPerS * BIN_MS) / 1000;
      for (let b = Math.max(start, end - RING_BINS, k.settled); b < end; b++) c.bins[b % RING_BINS] = perBin;
      c.head = Math.max(c.head, end);
      if (perBin > 0) k.busyEnd = Math.max(k.busyEnd, end);
      if (receiptMs >= c.lastAtMs) {
        c.lastAllowedPerS = v.allowedPerS;
        c.lastRefusedPerS = v.refusedPerS;
        c.lastAtMs = receiptMs;
      }
      if (v.allowedPerS + v.refusedPerS > 0) k.lastTrafficMs = Math.max(k.lastTrafficMs, receiptMs);
    }
  }

  /** Settles every bin that ended SETTLE_MS before `nowMs`: windows, ratios, histories. */
  settle(nowMs: number, lookup: QuotaLookup): void {
    this.historiesToMake = HISTORY_TRIM_BATCH;
    const target = Math.floor((nowMs - SETTLE_MS) / BIN_MS);
    for (const [key, k] of this.keys) {
      if (nowMs - k.lastTrafficMs > HISTORY_MS + SETTLE_MS) {
        if (k.history !== null) this.historyKeys--;
        this.keys.delete(key);
        continue;
      }
      if (k.settled < target - RING_BINS) k.settled = target - RING_BINS;
      if (k.history === null && k.busyEnd + WINDOW_BINS <= k.settled) {
        // Nothing admitted since before its last settled window: every bin to settle is 0, and so
        // is every window ending in them (lastRatio 0). What settleBin would do, without its
        // ledger lookups: the totals written, and a history point only if it gets a history now.
        for (let b = k.settled; b < target; b++) {
          k.totals[b % RING_BINS] = 0;
          if ((b + 1) % (1000 / BIN_MS) === 0 && (k.history !== null || this.mayMakeHistory(k)))
            this.historyPoint(key, k, Math.floor((b * BIN_MS) / 1000), lookup.quota(key), lookup);
        }
        k.lastRatio = 0;
        k.settled = Math.max(k.settled, target);
        continue;
      }
      for (let b = k.settled; b < target; b++) this.settleBin(key, k, b, lookup);
      k.settled = Math.max(k.settled, target);
    }
    this.trimHistories();
  }

  private settleBin(key: string, k: KeyState, b: number, lookup: QuotaLookup): void {
    let total = 0;
    for (const c of k.cells.values()) total += binValue(c, b);
    k.totals[b % RING_BINS] = total;
    let sum = 0;
    for (let i = 0; i < WINDOW_BINS; i++) sum += k.totals[(b - i + RING_BINS) % RING_BINS] ?? 0;
    const q = lookup.quota(key);
    if (q !== undefined && sum > 0) {
      const ratio = sum / ((q.rate * WINDOW_MS) / 1000 + q.burst);
      k.lastRatio = ratio;
      k.windows++;
      this.windowsTotal++;
      if (ratio > 1 + OVER_TOLERANCE) {
        k.windowsOver++;
        this.windowsOverTotal++;
      }
      const second = Math.floor((b * BIN_MS) / 1000);
      const slot = second % PEAK_HORIZON_S;
      if (k.peakSeconds[slot] !== second) {
        k.peakSeconds[slot] = second;
        k.peaks[slot] = 0;
      }
      if (ratio > (k.peaks[slot] ?? 0)) k.peaks[slot] = ratio;
    } else if (sum === 0) {
      k.lastRatio = 0;
    }
    // The last bin of a second: that second's point of the history.
    if ((b + 1) % (1000 / BIN_MS) === 0) this.historyPoint(key, k, Math.floor((b * BIN_MS) / 1000), q, lookup);
  }

  private historyPoint(
    key: string,
    k: KeyState,
    second: number,
    q: { rate: number } | undefined,
    lookup: QuotaLookup,
  ): void {
    if (k.history === null) {
      // At the cap, only a key busier than the histories the last trim dropped gets one (it would
      // be dropped again at the next trim otherwise).
      if (!this.mayMakeHistory(k)) return;
      if (this.historyKeys >= (this.limits.maxHistoryKeys ?? MAX_HISTORY_KEYS)) this.historiesToMake--;
      k.history = {
        seconds: new Float64Array(HISTORY_POINTS).fill(-1),
        quota: new Float32Array(HISTORY_POINTS),
        cells: new Map(),
      };
      this.historyKeys++;
    }
    const h = k.history;
    const slot = second % HISTORY_POINTS;
    h.seconds[slot] = second;
    h.quota[slot] = q?.rate ?? Number.NaN;
    const firstBin = (second * 1000) / BIN_MS;
    for (const [cellId, c] of k.cells) {
      let series = h.cells.get(cellId);
      if (series === undefined) {
        series = {
          admitted: new Float32Array(HISTORY_POINTS).fill(Number.NaN),
          limit: new Float32Array(HISTORY_POINTS).fill(Number.NaN),
        };
        h.cells.set(cellId, series);
      }
      let admitted = 0;
      for (let b = firstBin; b < firstBin + 1000 / BIN_MS; b++) admitted += binValue(c, b);
      series.admitted[slot] = admitted;
      series.limit[slot] = lookup.cellLimit(key, cellId);
    }
  }

  /**
   * Whether historyPoint makes `k` a history now: below the cap; at it, if `k` was busy (admitted or
   * refused) more recently than the histories the last trim dropped (else it would be dropped again
   * at the next trim), and at most HISTORY_TRIM_BATCH a settle (with thousands of quotas newly busy
   * every second, the most recently busy ones change faster than a history could show anything).
   */
  private mayMakeHistory(k: KeyState): boolean {
    return (
      this.historyKeys < (this.limits.maxHistoryKeys ?? MAX_HISTORY_KEYS) ||
      (k.lastTrafficMs > this.historyFloorMs && this.historiesToMake > 0)
    );
  }

  /** Past the cap, the histories of the least recently busy quotas go (in a batch, not one at a time). */
  private trimHistories(): void {
    const cap = this.limits.maxHistoryKeys ?? MAX_HISTORY_KEYS;
    if (this.historyKeys <= cap + HISTORY_TRIM_BATCH) return;
    const withHistory = [...this.keys.values()]
      .filter((k) => k.history !== null)
      .sort((a, b) => a.lastTrafficMs - b.lastTrafficMs);
    for (const k of withHistory.slice(0, this.historyKeys - cap)) {
      k.history = null;
      this.historyKeys--;
      this.historyFloorMs = Math.max(this.historyFloorMs, k.lastTrafficMs);
    }
  }

  /** The current traffic of one quota (null if it had none recently). */
  traffic(key: string, nowMs: number): QuotaTraffic | null {
    const k = this.keys.get(key);
    return k === undefined ? null : view(key, k, nowMs);
  }

  /**
   * The `n` busiest followed quotas (admitted + refused per second, then by key), busiest first, as
   * all() sorted would give them: only those `n` are made views (a scrape of the overshoot metrics
   * runs this on the leader's event loop over up to MAX_TRACKED_KEYS quotas).
   */
  busiest(nowMs: number, n: number): QuotaTraffic[] {
    const top: { key: string; k: KeyState; perS: number }[] = [];
    const before = (perS: number, key: string, t: { key: string; perS: number }): boolean =>
      perS > t.perS || (perS === t.perS && key < t.key);
    for (const [key, k] of this.keys) {
      if (n <= 0) break;
      const perS = currentPerS(k, nowMs);
      const last = top[top.length - 1];
      if (top.length >= n && last !== undefined && !before(perS, key, last)) continue;
      let i = top.length;
      while (i > 0 && before(perS, key, top[i - 1] as { key: string; perS: number })) i--;
      top.splice(i, 0, { key, k, perS });
      if (top.length > n) top.pop();
    }
    return top.map((t) => view(t.key, t.k, nowMs));
  }

  /** The largest peakRatio of all() (0 with none), without making a view per quota. */
  maxPeakRatio(nowMs: number): number {
    let max = 0;
    for (const k of this.keys.values()) max = Math.max(max, peakRatio(k, nowMs));
    return max;
  }

  /** Every followed quota's current traffic. */
  all(nowMs: number): QuotaTraffic[] {
    return [...this.keys].map(([key, k]) => view(key, k, nowMs));
  }

  /** The last HISTORY_POINTS seconds of one quota, oldest first (null if none kept). */
  history(key: string, nowMs: number): TrafficHistory | null {
    const h = this.keys.get(key)?.history;
    if (h === undefined || h === null) return null;
    const last = Math.floor((nowMs - SETTLE_MS) / 1000) - 1;
    const times: number[] = [];
    const quota: (number | null)[] = [];
    const cells = [...h.cells].map(([cellId]) => ({
      cellId,
      admitted: [] as (number | null)[],
      limit: [] as (number | null)[],
    }));
    for (let s = last - HISTORY_POINTS + 1; s <= last; s++) {
      const slot = ((s % HISTORY_POINTS) + HISTORY_POINTS) % HISTORY_POINTS;
      const have = h.seconds[slot] === s;
      times.push(s * 1000);
      quota.push(have ? finite(h.quota[slot]) : null);
      for (const c of cells) {
        const series = h.cells.get(c.cellId);
        c.admitted.push(have && series !== undefined ? finite(series.admitted[slot]) : null);
        c.limit.push(have && series !== undefined ? finite(series.limit[slot]) : null);
      }
    }
    return { key, times, quota, cells };
  }

  totals(): OvershootTotals {
    return { windows: this.windowsTotal, windowsOver: this.windowsOverTotal, untracked: this.untrackedTotal };
  }

  /** A new leader term: what an earlier term saw may have gaps; start over. */
  reset(): void {
    this.keys.clear();
    this.historyKeys = 0;
    this.historyFloorMs = Number.NEGATIVE_INFINITY;
  }
}

function newKeyState(firstBin: number): KeyState {
  return {
    cells: new Map(),
    busyEnd: firstBin,
    totals: new Float64Array(RING_BINS),
    settled: firstBin,
    lastTrafficMs: 0,
    lastRatio: 0,
    peakSeconds: new Float64Array(PEAK_HORIZON_S).fill(-1),
    peaks: new Float32Array(PEAK_HORIZON_S),
    windows: 0,
    windowsOver: 0,
    history: null,
  };
}

function binValue(c: CellSeries, b: number): number {
  return b < c.head && b >= c.head - RING_BINS ? (c.bins[b % RING_BINS] ?? 0) : 0;
}

function finite(x: number | undefined): number | null {
  return x === undefined || !Number.isFinite(x) ? null : Math.round(x * 1000) / 1000;
}

function peakRatio(k: KeyState, nowMs: number): number {
  const nowSecond = Math.floor(nowMs / 1000);
  let peak = 0;
  for (let i = 0; i < PEAK_HORIZON_S; i++) {
    const s = k.peakSeconds[i] ?? -1;
    if (s >= 0 && nowSecond - s <= PEAK_HORIZON_S) peak = Math.max(peak, k.peaks[i] ?? 0);
  }
  return peak;
}

/** admittedPerS + refusedPerS of view(), summed the same way (so ties and order are the same). */
function currentPerS(k: KeyState, nowMs: number): number {
  let admitted = 0;
  let refused = 0;
  for (const c of k.cells.values()) {
    if (nowMs - c.lastAtMs > CURRENT_MS) continue;
    admitted += c.lastAllowedPerS;
    refused += c.lastRefusedPerS;
  }
  return admitted + refused;
}

function view(key: string, k: KeyState, nowMs: number): QuotaTraffic {
  let admitted = 0;
  let refused = 0;
  const cells: { cellId: string; admittedPerS: number; refusedPerS: number; atMs: number }[] = [];
  for (const [cellId, c] of k.cells) {
    const current = nowMs - c.lastAtMs <= CURRENT_MS;
    const a = current ? c.lastAllowedPerS : 0;
    const r = current ? c.lastRefusedPerS : 0;
    admitted += a;
    refused += r;
    cells.push({ cellId, admittedPerS: a, refusedPerS: r, atMs: c.lastAtMs });
  }
  const peak = peakRatio(k, nowMs);
  return {
    key,
    admittedPerS: admitted,
    refusedPerS: refused,
    cells,
    lastRatio: k.lastRatio,
    peakRatio: peak,
    windows: k.windows,
    windowsOver: k.windowsOver,
  };
}
