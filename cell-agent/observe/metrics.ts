// The agent's Prometheus metrics (prom-client, served at GET /metrics by the main thread).
//
// Decision counters and the latency histogram live in shared memory (stats.ts), written by every
// deciding thread; they are exposed through small prom-client-compatible metric objects whose get()
// sums the threads' regions at scrape time. Everything the main thread owns (reloads, worker
// restarts) is a plain prom-client Counter. Names follow Prometheus conventions: a `cellquota_agent_`
// prefix, base units, `_total` on counters.
//
//   cellquota_agent_decisions_total{verdict=ok|over_limit|degraded, scope=local|global}
//   cellquota_agent_decision_duration_seconds                      histogram, per check, in-process
//   cellquota_agent_fail_open_total{reason=overload|error|table_full}
//   cellquota_agent_quota_fail_open_total{reason, quota}             the same per quota key (global) or bucket
//                                                                   key (local), up to 1000 keys per reason
//   cellquota_agent_overload_refused_total{reason=allowance|shed}   refused on the overload path
//   cellquota_agent_overload_seconds_total, _overload_episodes_total time the serving threads were
//                                                                   overloaded (ended episodes), and how often
//   cellquota_agent_overloaded_threads                              serving threads overloaded now
//   cellquota_agent_rejected_requests_total{reason=invalid|malformed}
//   cellquota_agent_static_slice_decisions_total                    global quotas decided on a static slice
//   cellquota_agent_bucket_table_keys / _capacity / _bytes          gauges
//   cellquota_agent_bucket_evictions_total
//   cellquota_agent_config_reloads_total{result=success|failure}
//   cellquota_agent_rules_info{fingerprint}                         1, the rules in force
//   cellquota_agent_workers_serving, cellquota_agent_worker_restarts_total
//   cellquota_agent_global_velocity_tokens_per_second{quota, outcome=allowed|refused}
//                                                                   the 500 ms window, the VELOCITY_TOP_K
//                                                                   quotas with the highest demand
//   cellquota_agent_global_velocity_quotas                          quotas with a non-zero window
//   cellquota_agent_velocity_dropped_total                          samples the velocity table had no slot for
//   cellquota_agent_lease_state, _on_floor, _lease_changes_total   the lease (lease-metrics.ts)
// plus prom-client's default process metrics.
import { Counter, Registry, collectDefaultMetrics } from 'prom-client';
import type { Metric } from 'prom-client';
import type { BucketTable } from '../buckets/bucket-table.js';
import type { VelocityKeys, VelocityTable } from '../velocity/velocity-table.js';
import { VELOCITY_WINDOW_MS } from '../velocity/velocity-table.js';
import {
  FAIL_OPEN_REASONS,
  LATENCY_BUCKETS_S,
  OVERLOAD_REFUSAL_REASONS,
  REJECT_REASONS,
  SCOPES,
  VERDICTS,
  readStats,
} from './stats.js';
import type { StatsShared, StatsTotals } from './stats.js';

export const VELOCITY_TOP_K = 50;

type Labels = Record<string, string | number>;
interface Value {
  value: number;
  labels?: Labels;
  metricName?: string;
}

/** A metric computed at scrape time; registry.registerMetric accepts anything with name, help, type and get(). */
export class ComputedMetric {
  readonly aggregator = 'sum';
  constructor(
    readonly name: string,
    readonly help: string,
    readonly type: 'counter' | 'gauge' | 'histogram',
    private readonly compute: () => Value[],
  ) {}

  get(): Promise<{ name: string; help: string; type: string; aggregator: string; values: Value[] }> {
    return Promise.resolve({
      name: this.name,
      help: this.help,
      type: this.type,
      aggregator: this.aggregator,
      values: this.compute(),
    });
  }

  reset(): void {}
}

export interface AgentMetricsSources {
  readonly stats: StatsShared;
  readonly table: BucketTable;
  readonly velocityTable: VelocityTable;
  readonly velocityKeys: VelocityKeys;
  readonly clock: () => bigint;
  readonly workersServing: () => number;
  readonly rulesFingerprint: () => string | null;
  /** Running totals of fail-open answers per reason and quota key (the throttling log's). */
  readonly failOpenByQuota?: () => readonly { reason: string; quota: string; count: number }[];
}

export interface AgentMetrics {
  readonly registry: Registry;
  readonly configReloads: Counter<'result'>;
  readonly workerRestarts: Counter;
}

export function createAgentMetrics(src: AgentMetricsSources): AgentMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const add = (m: ComputedMetric): void => registry.registerMetric(m as unknown as Metric);

  // One read of the shared statistics per scrape, shared by the metrics below: the registry calls
  // every get() synchronously, so a value cached until the next turn of the event loop is per scrape.
  let cached: StatsTotals | null = null;
  const totals = (): StatsTotals => {
    if (cached === null) {
      cached = readStats(src.stats);
      setImmediate(() => {
        cached = null;
      });
    }
    return cached;
  };

  add(
    new ComputedMetric(
      'cellquota_agent_decisions_total',
      'Rate-limit checks answered, by verdict and by whether a global quota was involved.',
      'counter',
      () => {
        const t = totals();
        return VERDICTS.flatMap((verdict) =>
          SCOPES.map((scope) => ({ value: t.decisions[verdict][scope], labels: { verdict, scope } })),
        );
      },
    ),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_decision_duration_seconds',
      'Time to decide one check inside the agent (decode and network excluded).',
      'histogram',
      () => {
        const t = totals();
        const name = 'cellquota_agent_decision_duration_seconds';
        const values: Value[] = [];
        let cumulative = 0;
        LATENCY_BUCKETS_S.forEach((le, b) => {
          cumulative += t.latencyBuckets[b] ?? 0;
          values.push({ metricName: `${name}_bucket`, labels: { le }, value: cumulative });
        });
        cumulative += t.latencyBuckets[LATENCY_BUCKETS_S.length] ?? 0;
        values.push({ metricName: `${name}_bucket`, labels: { le: '+Inf' }, value: cumulative });
        values.push({ metricName: `${name}_sum`, value: t.latencySum });
        values.push({ metricName: `${name}_count`, value: t.latencyCount });
        return values;
      },
    ),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_fail_open_total',
      'Checks answered OK without deciding (overload, internal error) or without a bucket (table full).',
      'counter',
      () => {
        const t = totals();
        return FAIL_OPEN_REASONS.map((reason) => ({ value: t.failOpen[reason], labels: { reason } }));
      },
    ),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_quota_fail_open_total',
      'Checks answered OK without a decision, by reason and by quota key (global) or bucket key (local); keys ' +
        'beyond the first 1000 per reason as "(other keys)", unmatched ones as "(not matched)".',
      'counter',
      () =>
        (src.failOpenByQuota?.() ?? []).map((f) => ({ value: f.count, labels: { reason: f.reason, quota: f.quota } })),
    ),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_overload_refused_total',
      'Checks refused on the overload path: the fail-open allowance of a level was spent (allowance), or ' +
        'refused before decoding (shed).',
      'counter',
      () => {
        const t = totals();
        return OVERLOAD_REFUSAL_REASONS.map((reason) => ({ value: t.overloadRefused[reason], labels: { reason } }));
      },
    ),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_overload_seconds_total',
      'Time the serving threads were overloaded (event loop behind by more than --lag-threshold-ms), summed ' +
        'over threads, ended episodes.',
      'counter',
      () => [{ value: totals().overloadMs / 1000 }],
    ),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_overload_episodes_total',
      'Overload episodes that ended (from falling behind to the first on-time turn of the loop).',
      'counter',
      () => [{ value: totals().overloadEpisodes }],
    ),
  );
  add(
    new ComputedMetric('cellquota_agent_overloaded_threads', 'Serving threads overloaded now.', 'gauge', () => [
      { value: totals().overloadedNow },
    ]),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_rejected_requests_total',
      'Requests answered with an error: over an input bound or invalid (invalid), undecodable (malformed).',
      'counter',
      () => {
        const t = totals();
        return REJECT_REASONS.map((reason) => ({ value: t.rejected[reason], labels: { reason } }));
      },
    ),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_static_slice_decisions_total',
      'Checks that involved a global quota decided on a static slice (no coordinator lease).',
      'counter',
      () => [{ value: totals().staticSlice }],
    ),
  );
  add(
    new ComputedMetric('cellquota_agent_bucket_table_keys', 'Live keys in the shared bucket table.', 'gauge', () => [
      { value: src.table.size() },
    ]),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_bucket_table_capacity',
      'Capacity of the shared bucket table in keys.',
      'gauge',
      () => [{ value: src.table.capacity }],
    ),
  );
  add(
    new ComputedMetric('cellquota_agent_bucket_table_bytes', 'Shared memory held by the bucket table.', 'gauge', () => [
      { value: src.table.bytes() },
    ]),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_bucket_evictions_total',
      'Idle buckets evicted to make room for new keys.',
      'counter',
      () => [{ value: src.table.evictions }],
    ),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_bucket_busy_refusals_total',
      "Checks refused because another thread held the key's bucket past the wait bound (10 ms).",
      'counter',
      () => [{ value: src.table.busyRefusals }],
    ),
  );
  add(
    new ComputedMetric('cellquota_agent_rules_info', 'The rules in force (value 1), by fingerprint.', 'gauge', () => {
      const fp = src.rulesFingerprint();
      return fp === null ? [] : [{ value: 1, labels: { fingerprint: fp.slice(0, 16) } }];
    }),
  );
  add(
    new ComputedMetric('cellquota_agent_workers_serving', 'gRPC worker threads currently serving.', 'gauge', () => [
      { value: src.workersServing() },
    ]),
  );

  // The velocity window: one snapshot per scrape.
  let velocityCache: { top: { key: string; allowed: number; refused: number }[]; quotas: number } | null = null;
  const velocity = (): { top: { key: string; allowed: number; refused: number }[]; quotas: number } => {
    if (velocityCache === null) {
      const all = src.velocityKeys.snapshot(src.clock());
      all.sort((a, b) => b.allowed + b.refused - (a.allowed + a.refused));
      velocityCache = { top: all.slice(0, VELOCITY_TOP_K), quotas: all.length };
      setImmediate(() => {
        velocityCache = null;
      });
    }
    return velocityCache;
  };
  const perSecond = 1000 / VELOCITY_WINDOW_MS;
  add(
    new ComputedMetric(
      'cellquota_agent_global_velocity_tokens_per_second',
      `Tokens allowed and refused per global quota over the last ${VELOCITY_WINDOW_MS} ms (the ` +
        `${VELOCITY_TOP_K} busiest quotas).`,
      'gauge',
      () =>
        velocity().top.flatMap((s) => [
          { value: s.allowed * perSecond, labels: { quota: s.key, outcome: 'allowed' } },
          { value: s.refused * perSecond, labels: { quota: s.key, outcome: 'refused' } },
        ]),
    ),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_global_velocity_quotas',
      `Global quotas with traffic in the last ${VELOCITY_WINDOW_MS} ms.`,
      'gauge',
      () => [{ value: velocity().quotas }],
    ),
  );
  add(
    new ComputedMetric(
      'cellquota_agent_velocity_dropped_total',
      'Velocity samples dropped because the velocity table had no free slot.',
      'counter',
      () => [{ value: src.velocityTable.dropped }],
    ),
  );

  const configReloads = new Counter({
    name: 'cellquota_agent_config_reloads_total',
    help: 'Rules reloads, by result.',
    labelNames: ['result'] as const,
    registers: [registry],
  });
  configReloads.inc({ result: 'success' }, 0);
  configReloads.inc({ result: 'failure' }, 0);
  const workerRestarts = new Counter({
    name: 'cellquota_agent_worker_restarts_total',
    help: 'gRPC worker threads restarted after an unexpected exit.',
    registers: [registry],
  });
  return { registry, configReloads, workerRestarts };
}
