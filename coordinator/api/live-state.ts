// The live view's one document (GET /ui/api/state): the cluster as this replica sees it, the cells,
// the overshoot, one page of tenants (searched, sorted busiest first or by id) and, for a chosen
// tenant, its slices and its last 5 minutes. Built from the committed ledger and, on the leader, its
// LiveTraffic; a follower forwards the request to the leader (it has no reports) and builds the
// document itself, without rates, only when no leader answers.
import { z } from 'zod';
import type { Ledger } from '../ledger/ledger.js';
import { MAX_NAME_LENGTH, tenantKey } from '../ledger/ledger-commands.js';
import type { ClusterView } from '../node/coordinator-node.js';
import { sliceInForce, type LiveTraffic } from './live-traffic.js';
import type { QuotaTraffic, TrafficHistory } from './traffic-window.js';

export const MAX_UI_PAGE_SIZE = 200;
export const DEFAULT_UI_PAGE_SIZE = 50;

export const liveQuerySchema = z.strictObject({
  q: z.string().max(MAX_NAME_LENGTH).optional().describe('substring of the tenant id'),
  page: z.coerce.number().int().min(0).max(1_000_000).default(0),
  size: z.coerce.number().int().min(1).max(MAX_UI_PAGE_SIZE).default(DEFAULT_UI_PAGE_SIZE),
  sort: z.enum(['busy', 'admitted', 'refused', 'id']).default('busy').describe('busy: admitted + refused'),
  tenant: z.string().max(MAX_NAME_LENGTH).optional().describe('the chosen tenant: its slices and history'),
});
export type LiveQuery = z.output<typeof liveQuerySchema>;

export interface SliceLive {
  readonly cellId: string;
  readonly source: 'leased' | 'floor';
  readonly epoch: number;
  readonly rate: number;
  readonly burst: number;
  readonly admittedPerS: number | null;
  readonly refusedPerS: number | null;
}

export interface TenantRow {
  readonly id: string;
  readonly tier: string;
  readonly rate: number;
  readonly burst: number;
  readonly admittedPerS: number | null;
  readonly refusedPerS: number | null;
  /** admitted ÷ (rate·1s + burst) of the newest reconstructed window, and the peak of the last minute. */
  readonly ratio: number | null;
  readonly peakRatio: number | null;
  readonly slices: SliceLive[];
}

export interface LiveState {
  readonly at: number;
  /** The replica that built this document (the leader, unless none answered). */
  readonly builtBy: string;
  /** Whether the rates are known (built on the leader). */
  readonly rates: boolean;
  readonly note: string | null;
  readonly cluster: {
    readonly clusterId: string;
    readonly self: string;
    readonly leader: string | null;
    readonly term: number;
    readonly commitIndex: number;
    readonly appliedIndex: number;
    readonly members: {
      id: string;
      role: string;
      voter: boolean;
      reachable: boolean | null;
      match: number | null;
      adminUrl: string | null;
    }[];
  };
  readonly cells: {
    id: string;
    lastReportAt: number | null;
    leaseLive: boolean;
    leaseExpiresAt: number | null;
    failOpenPerS: number | null;
    failOpenTotal: number | null;
  }[];
  readonly overshoot: {
    readonly peakRatio: number | null;
    readonly windows: number | null;
    readonly windowsOver: number | null;
    readonly peakQuota: string | null;
  };
  readonly tenants: {
    readonly total: number;
    readonly matched: number;
    readonly page: number;
    readonly size: number;
    readonly sort: LiveQuery['sort'];
    readonly rows: TenantRow[];
  };
  readonly selected: (TenantRow & { readonly history: TrafficHistory | null }) | null;
}

export interface LiveInput {
  readonly cluster: ClusterView;
  readonly adminUrlOf: (id: string) => string | null;
  readonly ledger: Ledger;
  /** The leader's traffic; null on a replica that builds the document without rates. */
  readonly traffic: LiveTraffic | null;
  readonly nowMs: number;
  readonly note?: string;
}

export function buildLiveState(input: LiveInput, query: LiveQuery): LiveState {
  const { ledger, traffic, nowMs } = input;
  traffic?.tick();
  const c = input.cluster;
  const cellsLive = new Map((traffic?.cellsLive() ?? []).map((x) => [x.cellId, x]));
  const cells = ledger.listCells().map((cell) => {
    const live = cellsLive.get(cell.id);
    return {
      id: cell.id,
      lastReportAt: cell.lastReportAtMs,
      leaseLive: cell.leaseLive && (cell.leaseExpiresAtMs ?? 0) > nowMs,
      leaseExpiresAt: cell.leaseExpiresAtMs,
      failOpenPerS: traffic === null ? null : round(live?.failOpenPerS ?? 0),
      failOpenTotal: traffic === null ? null : (live?.failOpenTotal ?? 0),
    };
  });

  const flows = traffic === null ? [] : traffic.windows.all(nowMs);
  const byKey = new Map(flows.map((f) => [f.key, f]));
  let peak: QuotaTraffic | null = null;
  for (const f of flows) if (peak === null || f.peakRatio > peak.peakRatio) peak = f;
  const totals = traffic?.windows.totals();

  // The tenants: matching ids, busiest first (then by id), or by id.
  const q = query.q?.trim() ?? '';
  const all = ledger.tenantIds();
  const matches = q === '' ? all : all.filter((id) => id.includes(q));
  let ordered: readonly string[] = matches;
  if (query.sort !== 'id' && flows.length > 0) {
    const measure = query.sort;
    const busy = flows
      .filter((f) => f.key.startsWith('tenant/') && load(f, measure) > 0)
      .map((f) => f.key.slice('tenant/'.length))
      .filter((id) => (q === '' || id.includes(q)) && ledger.getTenant(id) !== undefined);
    busy.sort(
      (a, b) => load(byKey.get(tenantKey(b)), measure) - load(byKey.get(tenantKey(a)), measure) || (a < b ? -1 : 1),
    );
    const busySet = new Set(busy);
    const start = query.page * query.size;
    const rest = start + query.size > busy.length ? matches.filter((id) => !busySet.has(id)) : [];
    ordered = busy.concat(rest);
  }
  const start = query.page * query.size;
  const rows = ordered.slice(start, start + query.size).flatMap((id) => {
    const r = tenantRow(input, id, byKey.get(tenantKey(id)) ?? null);
    return r === null ? [] : [r];
  });

  let selected: LiveState['selected'] = null;
  if (query.tenant !== undefined) {
    const row = tenantRow(input, query.tenant, byKey.get(tenantKey(query.tenant)) ?? null);
    if (row !== null) selected = { ...row, history: traffic?.windows.history(tenantKey(query.tenant), nowMs) ?? null };
  }

  return {
    at: nowMs,
    builtBy: c.id,
    rates: traffic !== null,
    note: input.note ?? null,
    cluster: {
      clusterId: c.clusterId,
      self: c.id,
      leader: c.leader,
      term: c.term,
      commitIndex: c.commitIndex,
      appliedIndex: c.appliedIndex,
      members: c.members.map((m) => ({
        id: m.id,
        role: m.role,
        voter: m.voter,
        reachable: m.reachable,
        match: m.match,
        adminUrl: input.adminUrlOf(m.id),
      })),
    },
    cells,
    overshoot: {
      peakRatio: traffic === null ? null : round(peak?.peakRatio ?? 0),
      windows: totals?.windows ?? null,
      windowsOver: totals?.windowsOver ?? null,
      peakQuota: peak !== null && peak.peakRatio > 0 ? peak.key : null,
    },
    tenants: { total: all.length, matched: matches.length, page: query.page, size: query.size, sort: query.sort, rows },
    selected,
  };
}

function load(t: QuotaTraffic | undefined, measure: 'busy' | 'admitted' | 'refused'): number {
  if (t === undefined) return 0;
  return measure === 'admitted'
    ? t.admittedPerS
    : measure === 'refused'
      ? t.refusedPerS
      : t.admittedPerS + t.refusedPerS;
}

function tenantRow(input: LiveInput, id: string, flow: QuotaTraffic | null): TenantRow | null {
  const t = input.ledger.getTenant(id);
  if (t === undefined) return null;
  const key = tenantKey(id);
  const rated = input.traffic !== null;
  const slices = t.slices.map((s): SliceLive => {
    const inForce = sliceInForce(input.ledger, key, s.cellId, input.nowMs);
    const cf = flow?.cells.find((x) => x.cellId === s.cellId);
    return {
      cellId: s.cellId,
      source: inForce.source,
      epoch: s.epoch,
      rate: round(inForce.rate),
      burst: round(inForce.burst),
      admittedPerS: rated ? round(cf?.admittedPerS ?? 0) : null,
      refusedPerS: rated ? round(cf?.refusedPerS ?? 0) : null,
    };
  });
  return {
    id,
    tier: t.tier,
    rate: t.quota.rate,
    burst: t.quota.burst,
    admittedPerS: rated ? round(flow?.admittedPerS ?? 0) : null,
    refusedPerS: rated ? round(flow?.refusedPerS ?? 0) : null,
    ratio: rated ? round(flow?.lastRatio ?? 0) : null,
    peakRatio: rated ? round(flow?.peakRatio ?? 0) : null,
    slices,
  };
}

function round(x: number): number {
  return Math.round(x * 1000) / 1000;
}
