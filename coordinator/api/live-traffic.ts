// The leader's live picture of the traffic, fed by the lease service with every accepted report:
// the reconstructed windows of traffic-window.ts (settled every SETTLE_EVERY_MS against the
// committed ledger), and each cell's fail-open answers (a counter per agent incarnation, turned into
// a rate here). Exported as Prometheus metrics with bounded labels: the TOP_N busiest quotas by
// name, and "_all" over every followed quota.
//
// A replica that is not the leader receives no reports: it drops what it saw as a leader (the next
// term's leader starts from its own reports) and exports none of these series.
import { Counter, Gauge, type Registry } from 'prom-client';
import type { Ledger } from '../ledger/ledger.js';
import type { ReportRequestMessage } from '../../shared/lease-proto.js';
import { TrafficWindows, type QuotaLookup, type QuotaTraffic } from './traffic-window.js';

export const SETTLE_EVERY_MS = 200;
/** Quotas exported by name in the overshoot metrics (the busiest); the rest only in "_all". */
export const OVERSHOOT_TOP_N = 20;
export const ALL_QUOTAS_LABEL = '_all';
/** A cell's fail-open rate is its counter's increase between two reports at most this far apart. */
const MAX_FAIL_OPEN_RATE_GAP_MS = 5_000;

export interface CellLive {
  readonly cellId: string;
  readonly lastReportMs: number;
  /** Fail-open answers per second between its last two reports. */
  readonly failOpenPerS: number;
  /** Fail-open answers of every incarnation this leader saw report. */
  readonly failOpenTotal: number;
}

interface CellRec {
  incarnation: string;
  counter: number;
  lastReportMs: number;
  failOpenPerS: number;
  failOpenTotal: number;
}

export class LiveTraffic {
  readonly windows = new TrafficWindows();
  private readonly cells = new Map<string, CellRec>();
  private timer: NodeJS.Timeout | null = null;
  private wasLeader = false;

  constructor(
    private readonly ledger: () => Ledger,
    private readonly isLeader: () => boolean,
    private readonly now: () => number = Date.now,
  ) {}

  /** The lease service's hook: one accepted report. */
  onReport(req: ReportRequestMessage, receiptMs: number): void {
    this.windows.record(req.cellId, receiptMs, req.velocity);
    const counter = req.failOpenTotal ?? 0;
    let c = this.cells.get(req.cellId);
    if (c === undefined || c.incarnation !== req.incarnation) {
      // A new agent: its counter starts at 0, what it reports now happened since it started.
      const prevTotal = c?.failOpenTotal ?? 0;
      c = {
        incarnation: req.incarnation,
        counter: 0,
        lastReportMs: receiptMs,
        failOpenPerS: 0,
        failOpenTotal: prevTotal,
      };
      this.cells.set(req.cellId, c);
    }
    const delta = Math.max(0, counter - c.counter);
    const gap = receiptMs - c.lastReportMs;
    c.failOpenPerS =
      gap > 0 && gap <= MAX_FAIL_OPEN_RATE_GAP_MS ? (delta * 1000) / gap : delta > 0 ? c.failOpenPerS : 0;
    c.failOpenTotal += delta;
    c.counter = Math.max(c.counter, counter);
    c.lastReportMs = Math.max(c.lastReportMs, receiptMs);
  }

  start(): void {
    if (this.timer !== null) return;
    this.timer = setInterval(() => this.tick(), SETTLE_EVERY_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /** Settles what is due (also called by tests and before a read). */
  tick(): void {
    const leader = this.isLeader();
    if (!leader) {
      if (this.wasLeader) this.reset();
      this.wasLeader = false;
      return;
    }
    this.wasLeader = true;
    const now = this.now();
    this.windows.settle(now, quotaLookup(this.ledger(), now));
  }

  private reset(): void {
    this.windows.reset();
    this.cells.clear();
  }

  cell(cellId: string): CellLive | null {
    const c = this.cells.get(cellId);
    if (c === undefined) return null;
    const stale = this.now() - c.lastReportMs > MAX_FAIL_OPEN_RATE_GAP_MS;
    return {
      cellId,
      lastReportMs: c.lastReportMs,
      failOpenPerS: stale ? 0 : c.failOpenPerS,
      failOpenTotal: c.failOpenTotal,
    };
  }

  cellsLive(): CellLive[] {
    return [...this.cells.keys()].flatMap((id) => {
      const c = this.cell(id);
      return c === null ? [] : [c];
    });
  }

  /** The busiest followed quotas (admitted + refused per second), at most `n`. */
  busiest(n: number): QuotaTraffic[] {
    return this.windows.busiest(this.now(), n);
  }

  /** Registers the overshoot and fail-open metrics (sampled at scrape time, only on the leader). */
  registerMetrics(registry: Registry): void {
    const self = {
      isLeader: (): boolean => this.isLeader(),
      busiest: (n: number) => this.busiest(n),
      cellsLive: () => this.cellsLive(),
      windows: this.windows,
      now: () => this.now(),
    };
    new Gauge({
      name: 'cellquota_quota_overshoot_ratio',
      help:
        'Largest admitted ÷ (rate·1s + burst) over the 1 s windows of the last minute reconstructed from the ' +
        `cells' reports (leader only); the ${OVERSHOOT_TOP_N} busiest quotas by name, "${ALL_QUOTAS_LABEL}" over all`,
      labelNames: ['quota'],
      registers: [registry],
      collect() {
        this.reset();
        if (!self.isLeader()) return;
        this.set({ quota: ALL_QUOTAS_LABEL }, self.windows.maxPeakRatio(self.now()));
        for (const t of self.busiest(OVERSHOOT_TOP_N)) this.set({ quota: t.key }, t.peakRatio);
      },
    });
    // The windows checked against the bound, and those over it: all quotas and the busiest by name.
    type Windows = { windows: number; windowsOver: number };
    const windowsOf = (count: (t: Windows) => number) =>
      function collect(this: Counter<'quota'>): void {
        this.reset();
        if (!self.isLeader()) return;
        this.inc({ quota: ALL_QUOTAS_LABEL }, count(self.windows.totals()));
        for (const t of self.busiest(OVERSHOOT_TOP_N)) this.inc({ quota: t.key }, count(t));
      };
    const overAll = `; "${ALL_QUOTAS_LABEL}" over all quotas`;
    new Counter({
      name: 'cellquota_quota_windows_total',
      help: "1 s windows reconstructed from the cells' reports and checked against the bound (leader only)" + overAll,
      labelNames: ['quota'],
      registers: [registry],
      collect: windowsOf((t) => t.windows),
    });
    new Counter({
      name: 'cellquota_quota_windows_over_bound_total',
      help:
        'Reconstructed 1 s windows in which the cells together admitted ' +
        'more than rate·1s + burst (leader only): the bound broken' +
        overAll,
      labelNames: ['quota'],
      registers: [registry],
      collect: windowsOf((t) => t.windowsOver),
    });
    new Counter({
      name: 'cellquota_quota_untracked_total',
      help: 'Report entries of quotas the leader could not follow for the overshoot (over its cap of followed quotas)',
      registers: [registry],
      collect() {
        this.reset();
        if (self.isLeader()) this.inc(self.windows.totals().untracked);
      },
    });
    new Counter({
      name: 'cellquota_cell_fail_open_answers_total',
      help:
        'Checks answered fail-open (outside the bound by design) per ' +
        'cell, as the agents report them to the leader (leader only)',
      labelNames: ['cell'],
      registers: [registry],
      collect() {
        this.reset();
        if (!self.isLeader()) return;
        for (const c of self.cellsLive()) this.inc({ cell: c.cellId }, c.failOpenTotal);
      },
    });
  }
}

/** The committed ledger as the reconstruction's lookups. */
export function quotaLookup(ledger: Ledger, nowMs: number): QuotaLookup {
  return {
    quota: (key) => ledger.getQuota(key),
    cellLimit: (key, cellId) => sliceInForce(ledger, key, cellId, nowMs).rate,
  };
}

/** What a cell decides on for a quota now: its leased grant while its lease lives, else its floor. */
export function sliceInForce(
  ledger: Ledger,
  key: string,
  cellId: string,
  nowMs: number,
): { source: 'leased' | 'floor'; rate: number; burst: number; epoch: number } {
  const s = ledger.getSlice(key, cellId);
  if (s === undefined) return { source: 'floor', rate: 0, burst: 0, epoch: 0 };
  const cell = ledger.getCell(cellId);
  // The agent decides on its grant while its lease (renewed by every report) lives.
  const leased = s.epoch > 0 && cell !== undefined && cell.leaseExpiresAtMs !== null && cell.leaseExpiresAtMs > nowMs;
  return leased
    ? { source: 'leased', rate: s.rate, burst: s.burst, epoch: s.epoch }
    : { source: 'floor', rate: s.floorRate, burst: s.floorBurst, epoch: s.epoch };
}
