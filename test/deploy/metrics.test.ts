// The Prometheus rules and the Grafana dashboard use only metrics the code really exports: every
// cellquota_* name (minus a histogram's _bucket/_sum/_count) is defined in coordinator/, cell-agent/
// or cli/ (or is a prom-client default metric under the prefix the code gives it), and every label
// value they match on is one the code writes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Registry, collectDefaultMetrics } from 'prom-client';
import { CoordinatorMetrics } from '../../coordinator/node/coordinator-metrics.js';
import { createAgentMetrics } from '../../cell-agent/observe/metrics.js';
import { createStatsShared } from '../../cell-agent/observe/stats.js';
import { BucketTable } from '../../cell-agent/buckets/bucket-table.js';
import { VelocityKeys, VelocityTable } from '../../cell-agent/velocity/velocity-table.js';
import { LiveTraffic } from '../../coordinator/api/live-traffic.js';
import { Ledger } from '../../coordinator/ledger/ledger.js';
import { asArray, at, deployDir, listFiles, loadYamlDocs, rel, repoRoot, walk } from './deploy-fixtures.js';

const SOURCE_DIRS = ['coordinator', 'cell-agent', 'cli'];
const HISTOGRAM_SUFFIXES = ['_bucket', '_sum', '_count'];

interface Exported {
  /** Every metric name exported, with its type. */
  readonly types: Map<string, string>;
  /** Prefixes given to prom-client's default metrics ('' = none). */
  readonly defaultPrefixes: string[];
}

async function defaultMetrics(prefix: string): Promise<Map<string, string>> {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix });
  const out = new Map((await registry.getMetricsAsJSON()).map((m) => [m.name, String(m.type)]));
  registry.clear();
  return out;
}

/** The metric definitions found in the TypeScript sources. */
async function scanSources(): Promise<Exported> {
  const types = new Map<string, string>();
  const defaultPrefixes: string[] = [];
  for (const dir of SOURCE_DIRS) {
    for (const file of listFiles(join(repoRoot, dir), (n) => n.endsWith('.ts'))) {
      const text = readFileSync(file, 'utf8');
      // name: 'cellquota_…' (prom-client constructors), gauge('cellquota_…', …), new ComputedMetric('cellquota_…', …)
      for (const m of text.matchAll(/(?:name:\s*|gauge\(\s*|ComputedMetric\(\s*)'(cellquota_[a-z0-9_]+)'/g))
        if (m[1] !== undefined && !types.has(m[1])) types.set(m[1], 'untyped');
      for (const m of text.matchAll(
        /new\s+(Counter|Gauge|Histogram|Summary)\(\s*\{\s*name:\s*'(cellquota_[a-z0-9_]+)'/g,
      ))
        if (m[1] !== undefined && m[2] !== undefined) types.set(m[2], m[1].toLowerCase());
      for (const m of text.matchAll(
        /ComputedMetric\(\s*'(cellquota_[a-z0-9_]+)',[\s\S]*?,\s*'(counter|gauge|histogram)'\s*,/g,
      ))
        if (m[1] !== undefined && m[2] !== undefined) types.set(m[1], m[2]);
      for (const m of text.matchAll(/gauge\(\s*'(cellquota_[a-z0-9_]+)'/g))
        if (m[1] !== undefined) types.set(m[1], 'gauge');
      for (const m of text.matchAll(/collectDefaultMetrics\(\s*\{([^}]*)\}\s*\)/g))
        defaultPrefixes.push(/prefix:\s*'([^']*)'/.exec(m[1] ?? '')?.[1] ?? '');
    }
  }
  for (const prefix of defaultPrefixes) for (const [name, type] of await defaultMetrics(prefix)) types.set(name, type);
  return { types, defaultPrefixes };
}

/** The leader's live-traffic metrics after one report (their label values are written at scrape time). */
function leaderTrafficRegistry(): Registry {
  const registry = new Registry();
  const traffic = new LiveTraffic(
    () => new Ledger(),
    () => true,
  );
  traffic.onReport(
    {
      cellId: 'c1',
      incarnation: 'i1',
      sentAtMs: 0,
      acks: [],
      velocity: [{ key: 'tenant/t1', allowedPerS: 1, refusedPerS: 0 }],
      failOpenTotal: 1,
      capsVersion: 0,
      wantFull: false,
    },
    Date.now(),
  );
  traffic.registerMetrics(registry);
  return registry;
}

/** The names real registries hold: CoordinatorMetrics (with sampled gauges), the leader's traffic metrics and the agent's metrics. */
async function liveRegistries(): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const m of await leaderTrafficRegistry().getMetricsAsJSON()) out.set(m.name, String(m.type));
  const coordinator = new Registry();
  new CoordinatorMetrics(coordinator).sample(coordinator, {
    term: () => 1,
    isLeader: () => true,
    commitIndex: () => 1,
    appliedIndex: () => 1,
    reachablePeers: () => 2,
    votingRefused: () => false,
    tenants: () => 0,
  });
  for (const m of await coordinator.getMetricsAsJSON()) out.set(m.name, String(m.type));
  const table = new BucketTable({ capacity: 1024 });
  const velocityTable = VelocityTable.create({ capacity: 64, startNs: 0n });
  const agent = createAgentMetrics({
    stats: createStatsShared(1),
    table,
    velocityTable,
    velocityKeys: new VelocityKeys(velocityTable),
    clock: () => 0n,
    workersServing: () => 1,
    rulesFingerprint: () => null,
  });
  for (const m of await agent.registry.getMetricsAsJSON()) out.set(m.name, String(m.type));
  agent.registry.clear();
  return out;
}

/** Every PromQL expression of the rules and the dashboard, with where it is. */
function expressions(): { where: string; expr: string }[] {
  const out: { where: string; expr: string }[] = [];
  for (const file of listFiles(join(deployDir, 'base/monitoring'), (n) => n === 'prometheusrule.yaml')) {
    for (const doc of loadYamlDocs(file)) {
      for (const g of asArray(at(doc, 'spec', 'groups'))) {
        for (const r of asArray(at(g, 'rules')))
          out.push({ where: `${rel(file)} ${String(at(r, 'alert') ?? at(r, 'record'))}`, expr: String(at(r, 'expr')) });
      }
    }
  }
  for (const file of listFiles(join(deployDir, 'base/monitoring/dashboards'), (n) => n.endsWith('.json'))) {
    const dash = JSON.parse(readFileSync(file, 'utf8')) as unknown;
    for (const [k, v] of walk(dash)) if (k === 'expr' && typeof v === 'string') out.push({ where: rel(file), expr: v });
  }
  return out;
}

function known(name: string, types: ReadonlyMap<string, string>): boolean {
  if (types.has(name)) return true;
  const suffix = HISTOGRAM_SUFFIXES.find((s) => name.endsWith(s));
  return suffix !== undefined && types.get(name.slice(0, -suffix.length)) === 'histogram';
}

void test('the source scan finds every metric the real registries export (so the name check below is complete)', async () => {
  const { types, defaultPrefixes } = await scanSources();
  const live = await liveRegistries();
  for (const [name, type] of live) {
    assert.ok(types.has(name), `${name} is exported but the scan missed it`);
    if (name.startsWith('cellquota_')) assert.equal(types.get(name), type, `${name}: type`);
  }
  assert.ok(defaultPrefixes.includes('cellquota_coordinator_process_'), 'the coordinator prefixes its process metrics');
  assert.ok(
    types.has('cellquota_coordinator_process_process_resident_memory_bytes'),
    'prom-client adds its own process_ to the prefix',
  );
  assert.ok(!types.has('cellquota_coordinator_process_resident_memory_bytes'));
});

void test('the rules and the dashboard use only cellquota_* metrics the code exports (histograms with _bucket/_sum/_count)', async () => {
  const { types } = await scanSources();
  const exprs = expressions();
  assert.ok(exprs.length >= 30, `expected the alerts and panels, found ${exprs.length} expressions`);
  const used = new Set<string>();
  const unknown: string[] = [];
  for (const { where, expr } of exprs) {
    // Quoted strings are label values (e.g. Envoy's cluster cellquota_rls), not metric names —
    // except a __name__ matcher's.
    const names = [...expr.matchAll(/__name__\s*=\s*"([^"]*)"/g)].map((m) => m[1] ?? '').join(' ');
    const bare = `${expr.replace(/"(?:[^"\\]|\\.)*"/g, '""')} ${names}`;
    for (const m of bare.matchAll(/cellquota_[a-z0-9_]+/g)) {
      used.add(m[0]);
      if (!known(m[0], types)) unknown.push(`${where}: ${m[0]}`);
    }
    // prom-client's unprefixed defaults (the agent registers them without a prefix)
    for (const m of bare.matchAll(/(?<![a-z0-9_])(?:process|nodejs)_[a-z0-9_]+/g))
      if (!known(m[0], types)) unknown.push(`${where}: ${m[0]}`);
  }
  assert.deepEqual(unknown, [], 'metric names the code does not export');
  for (const must of [
    'cellquota_raft_is_leader',
    'cellquota_storage_fsync_duration_seconds_bucket',
    'cellquota_agent_static_slice_decisions_total',
    'cellquota_agent_global_velocity_tokens_per_second',
    'cellquota_agent_fail_open_total',
  ]) {
    assert.ok(used.has(must), `${must} is used`);
  }
});

/**
 * The label values the code writes: those the real registries report, and the string literals in
 * the sources' label writes — `.inc({ result: … })`, `.labels(…)`, `.set(…)`, `.observe(…)` and
 * `labels: { … }` objects of computed metrics.
 */
async function labelValues(): Promise<Set<string>> {
  const out = new Set<string>();
  const coordinator = new Registry();
  new CoordinatorMetrics(coordinator);
  const table = new BucketTable({ capacity: 1024 });
  const velocityTable = VelocityTable.create({ capacity: 64, startNs: 0n });
  const agent = createAgentMetrics({
    stats: createStatsShared(1),
    table,
    velocityTable,
    velocityKeys: new VelocityKeys(velocityTable),
    clock: () => 0n,
    workersServing: () => 1,
    rulesFingerprint: () => null,
  });
  for (const r of [coordinator, leaderTrafficRegistry(), agent.registry]) {
    for (const m of await r.getMetricsAsJSON())
      for (const v of m.values)
        for (const l of Object.values((v.labels as Record<string, string | number> | undefined) ?? {}))
          out.add(String(l));
    r.clear();
  }
  for (const file of SOURCE_DIRS.flatMap((d) => listFiles(join(repoRoot, d), (n) => n.endsWith('.ts')))) {
    const text = readFileSync(file, 'utf8');
    const writes = [
      ...[...text.matchAll(/\.(?:inc|dec|set|observe|labels)\(/g)].map((m) =>
        callArguments(text, m.index + m[0].length),
      ),
      ...[...text.matchAll(/labels:\s*\{([^}]*)\}/g)].map((m) => m[1] ?? ''),
    ];
    for (const w of writes) for (const m of w.matchAll(/'([^'\\\n]*)'/g)) out.add(m[1] ?? '');
  }
  return out;
}

/** The text of a call's arguments, from just after its `(` to the matching `)` (over several lines, as
 * the formatter writes long calls), skipping parentheses inside string literals. */
function callArguments(text: string, from: number): string {
  let depth = 1;
  let quote: string | null = null;
  for (let i = from; i < text.length; i++) {
    const c = text[i];
    if (quote !== null) {
      if (c === '\\') i++;
      else if (c === quote) quote = null;
    } else if (c === "'" || c === '"' || c === '`') quote = c;
    else if (c === '(') depth++;
    else if (c === ')' && --depth === 0) return text.slice(from, i);
  }
  return text.slice(from);
}

void test('every label value the rules and the dashboard match on a cellquota_* metric is one the code writes', async () => {
  const values = await labelValues();
  const bad: string[] = [];
  for (const { where, expr } of expressions()) {
    for (const sel of expr.matchAll(/(cellquota_[a-z0-9_]+)\{([^}]*)\}/g)) {
      for (const m of (sel[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"]*)"/g)) {
        if (m[1] === 'le' || m[1] === 'namespace' || m[1] === 'pod') continue;
        if (!values.has(m[2] ?? '')) bad.push(`${where}: ${sel[1] ?? ''}{${m[1] ?? ''}="${m[2] ?? ''}"}`);
      }
    }
  }
  assert.deepEqual(bad, [], 'label values the code does not write');
});

void test('the alerts the deploy issue asks for exist, each with a severity and a summary', () => {
  const alerts = new Map<string, unknown>();
  for (const file of listFiles(join(deployDir, 'base/monitoring'), (n) => n === 'prometheusrule.yaml')) {
    for (const doc of loadYamlDocs(file)) {
      assert.equal(at(doc, 'apiVersion'), 'monitoring.coreos.com/v1');
      assert.equal(at(doc, 'kind'), 'PrometheusRule');
      for (const g of asArray(at(doc, 'spec', 'groups')))
        for (const r of asArray(at(g, 'rules'))) alerts.set(String(at(r, 'alert')), r);
    }
  }
  for (const name of [
    'CellquotaTenantThrottleSpike',
    'CellquotaAgentDegraded',
    'CellquotaAgentOnFloors',
    'CellquotaCoordinatorNoLeader',
    'CellquotaLeaseFailures',
    'CellquotaCoordinatorSlowFsync',
    'CellquotaQuotaOverBound',
  ]) {
    assert.ok(alerts.has(name), `alert ${name}`);
  }
  for (const [name, r] of alerts) {
    assert.ok(['info', 'warning', 'critical'].includes(String(at(r, 'labels', 'severity'))), `${name}: severity`);
    assert.equal(typeof at(r, 'annotations', 'summary'), 'string', `${name}: summary`);
    const f = at(r, 'for');
    if (f !== undefined) assert.ok(typeof f === 'string' && /^\d+[smh]$/.test(f), `${name}: for ${JSON.stringify(f)}`);
  }
});

void test('the dashboard is a Grafana dashboard: uid, title, a Prometheus datasource variable, panels with unique ids and targets', () => {
  const dash = JSON.parse(
    readFileSync(join(deployDir, 'base/monitoring/dashboards/cellquota.json'), 'utf8'),
  ) as unknown;
  assert.equal(at(dash, 'uid'), 'cellquota');
  assert.equal(typeof at(dash, 'title'), 'string');
  assert.ok(
    asArray(at(dash, 'templating', 'list')).some(
      (v) => at(v, 'type') === 'datasource' && at(v, 'query') === 'prometheus',
    ),
  );
  const panels = asArray(at(dash, 'panels'));
  const ids = panels.map((p) => at(p, 'id'));
  assert.equal(new Set(ids).size, ids.length, 'unique panel ids');
  for (const p of panels.filter((x) => at(x, 'type') !== 'row')) {
    assert.ok(asArray(at(p, 'targets')).length > 0, `panel ${String(at(p, 'title'))}: targets`);
    assert.equal(at(p, 'datasource', 'uid'), '${datasource}');
    for (const k of ['h', 'w', 'x', 'y'])
      assert.equal(typeof at(p, 'gridPos', k), 'number', `panel ${String(at(p, 'title'))}: gridPos.${k}`);
  }
});
