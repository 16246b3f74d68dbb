// The embedded limiter's Prometheus metrics, in the registry the app passes (or the limiter's own).
// Nothing is counted through prom-client on the request path: the decision statistics are the
// agent's (cell-agent/observe/stats.ts, one region, plain adds), and these metrics read them at
// scrape time. Several limiters in one registry share each metric, told apart by `limiter`.
//
//   cellquota_embedded_decisions_total{limiter, verdict=ok|over_limit|degraded, scope=local|global}
//   cellquota_embedded_decision_duration_seconds{limiter}             histogram, in-process
//   cellquota_embedded_fail_open_total{limiter, reason=error|table_full}
//   cellquota_embedded_rejected_requests_total{limiter, reason=invalid}
//   cellquota_embedded_static_slice_decisions_total{limiter}          global quotas on a floor / static share
//   cellquota_embedded_shadow_refusals_total{limiter}                 refusals let through (shadow mode)
//   cellquota_embedded_bucket_table_keys{limiter}, _capacity{limiter}
//   cellquota_embedded_lease_state{limiter}                           0 none yet, 1 leased, 2 expired (floors)
//   cellquota_embedded_on_floor{limiter}                              1 while global quotas run without a live lease
import type { Metric, Registry } from 'prom-client';
import type { BucketTable } from '../cell-agent/buckets/bucket-table.js';
import type { LeaseState } from '../cell-agent/lease/lease-client.js';
import { ComputedMetric } from '../cell-agent/observe/metrics.js';
import { LATENCY_BUCKETS_S, SCOPES, VERDICTS, readStats } from '../cell-agent/observe/stats.js';
import type { StatsShared, StatsTotals } from '../cell-agent/observe/stats.js';

/** What the limiter counts itself (plain fields, read at scrape time). */
export interface LimiterCounters {
  shadowRefused: number;
  /**
   * Failures around the decision in the HTTP integrations (the descriptors function threw; descriptors over the
   * bounds).
   */
  failOpenOutside: number;
  invalidOutside: number;
  leaseState: 'off' | LeaseState;
}

export interface LimiterSource {
  readonly name: string;
  readonly stats: StatsShared;
  readonly table: BucketTable;
  readonly counters: LimiterCounters;
}

type Value = { value: number; labels?: Record<string, string | number>; metricName?: string };

const LEASE_STATE_VALUE: Readonly<Record<LeaseState, number>> = { none: 0, leased: 1, expired: 2 };

interface RegistryEntry {
  readonly sources: Set<LimiterSource>;
  /** Drops the per-scrape cache (a limiter came or went). */
  readonly invalidate: () => void;
}

const byRegistry = new WeakMap<Registry, RegistryEntry>();

/** Registers `source` in `registry` (the metrics themselves once per registry); returns the unregister. */
export function registerLimiterMetrics(registry: Registry, source: LimiterSource): () => void {
  let entry = byRegistry.get(registry);
  if (entry === undefined) {
    const sources = new Set<LimiterSource>();
    const { metrics, invalidate } = metricsOver(sources);
    for (const m of metrics) {
      if (registry.getSingleMetric(m.name) !== undefined)
        throw new Error(`cellquota: the registry already has a metric named ${m.name}`);
    }
    for (const m of metrics) registry.registerMetric(m as unknown as Metric);
    entry = { sources, invalidate };
    byRegistry.set(registry, entry);
  }
  for (const s of entry.sources)
    if (s.name === source.name)
      throw new Error(
        `cellquota: a limiter named '${source.name}' is already registered ` +
          'in this registry; give each limiter its own name',
      );
  entry.sources.add(source);
  entry.invalidate();
  const e = entry;
  return () => {
    e.sources.delete(source);
    e.invalidate();
  };
}

function metricsOver(sources: ReadonlySet<LimiterSource>): { metrics: ComputedMetric[]; invalidate: () => void } {
  // One read of every limiter's statistics per scrape (the registry calls each get() in one turn).
  let cached: Map<LimiterSource, StatsTotals> | null = null;
  const totals = (): Map<LimiterSource, StatsTotals> => {
    if (cached === null) {
      const map = new Map<LimiterSource, StatsTotals>();
      for (const s of sources) map.set(s, readStats(s.stats));
      cached = map;
      setImmediate(() => {
        cached = null;
      });
    }
    return cached;
  };
  const each =
    (f: (s: LimiterSource, t: StatsTotals) => Value[]): (() => Value[]) =>
    () => {
      const out: Value[] = [];
      for (const [s, t] of totals()) out.push(...f(s, t));
      return out;
    };
  const histogram = 'cellquota_embedded_decision_duration_seconds';
  const metrics = [
    new ComputedMetric(
      'cellquota_embedded_decisions_total',
      'Checks decided in-process, by verdict (degraded: let through without ' +
        'a decision) and by whether a global quota was involved.',
      'counter',
      each((s, t) =>
        VERDICTS.flatMap((verdict) =>
          SCOPES.map((scope) => ({ value: t.decisions[verdict][scope], labels: { limiter: s.name, verdict, scope } })),
        ),
      ),
    ),
    new ComputedMetric(
      histogram,
      'Time to decide one check in-process.',
      'histogram',
      each((s, t) => {
        const values: Value[] = [];
        let cumulative = 0;
        LATENCY_BUCKETS_S.forEach((le, b) => {
          cumulative += t.latencyBuckets[b] ?? 0;
          values.push({ metricName: `${histogram}_bucket`, labels: { limiter: s.name, le }, value: cumulative });
        });
        cumulative += t.latencyBuckets[LATENCY_BUCKETS_S.length] ?? 0;
        values.push({ metricName: `${histogram}_bucket`, labels: { limiter: s.name, le: '+Inf' }, value: cumulative });
        values.push({ metricName: `${histogram}_sum`, labels: { limiter: s.name }, value: t.latencySum });
        values.push({ metricName: `${histogram}_count`, labels: { limiter: s.name }, value: t.latencyCount });
        return values;
      }),
    ),
    new ComputedMetric(
      'cellquota_embedded_fail_open_total',
      'Checks let through without a decision (an internal error) or without a bucket (table full).',
      'counter',
      each((s, t) => [
        { value: t.failOpen.error + s.counters.failOpenOutside, labels: { limiter: s.name, reason: 'error' } },
        { value: t.failOpen.table_full, labels: { limiter: s.name, reason: 'table_full' } },
      ]),
    ),
    new ComputedMetric(
      'cellquota_embedded_rejected_requests_total',
      'Checks refused undecided: descriptors over the request bounds.',
      'counter',
      each((s, t) => [
        { value: t.rejected.invalid + s.counters.invalidOutside, labels: { limiter: s.name, reason: 'invalid' } },
      ]),
    ),
    new ComputedMetric(
      'cellquota_embedded_static_slice_decisions_total',
      'Checks that involved a global quota decided on a floor or static share (no live lease).',
      'counter',
      each((s, t) => [{ value: t.staticSlice, labels: { limiter: s.name } }]),
    ),
    new ComputedMetric(
      'cellquota_embedded_shadow_refusals_total',
      'Refusals let through because the limiter is in shadow mode.',
      'counter',
      each((s) => [{ value: s.counters.shadowRefused, labels: { limiter: s.name } }]),
    ),
    new ComputedMetric(
      'cellquota_embedded_bucket_table_keys',
      "Live keys in the limiter's bucket table.",
      'gauge',
      each((s) => [{ value: s.table.size(), labels: { limiter: s.name } }]),
    ),
    new ComputedMetric(
      'cellquota_embedded_bucket_table_capacity',
      "Capacity of the limiter's bucket table in keys.",
      'gauge',
      each((s) => [{ value: s.table.capacity, labels: { limiter: s.name } }]),
    ),
    new ComputedMetric(
      'cellquota_embedded_lease_state',
      'Lease with the coordinators: 0 none yet (static shares), 1 leased, 2 expired (fail-static on floors); ' +
        'absent without coordinators.',
      'gauge',
      each((s) =>
        s.counters.leaseState === 'off'
          ? []
          : [{ value: LEASE_STATE_VALUE[s.counters.leaseState], labels: { limiter: s.name } }],
      ),
    ),
    new ComputedMetric(
      'cellquota_embedded_on_floor',
      '1 while global quotas run on floors or static shares (no live lease), else 0; absent without coordinators.',
      'gauge',
      each((s) =>
        s.counters.leaseState === 'off'
          ? []
          : [{ value: s.counters.leaseState === 'leased' ? 0 : 1, labels: { limiter: s.name } }],
      ),
    ),
  ];
  return {
    metrics,
    invalidate: () => {
      cached = null;
    },
  };
}
