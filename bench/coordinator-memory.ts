// `npm run bench -- coordinator-memory`: what 100,000 tenants cost the coordinators. Three real
// coordinator processes on loopback (testkit/coordinator-cluster.ts: LevelDB with
// fsync, gRPC between replicas, the admin API over HTTP); one tier, then N tenants written through
// the leader's admin API by 32 concurrent clients (PUT /v1/tenants/t-<i>, progress every 10,000).
// Each replica's RSS and V8 heap (from its own /metrics: prom-client's default process metrics,
// exported with the prefix cellquota_coordinator_process_) and its data dir on disk are taken
//
//   idle        leader elected, the tier written, nothing else
//   written     every replica has applied the N tenants (cellquota_ledger_tenants = N)
//   snapshot    every replica has taken a snapshot (--snapshot-every entries, default 10,000) at
//               an index ≥ the last write's: the writes rarely end on a snapshot boundary, so the
//               remaining entries are made by re-writing existing tenants (the tenant count does
//               not change)
//
// The Raft entry of a lease round at this scale (reportAndGrant with the round's grants) is measured
// by the allocator benchmark (bench/allocator.ts, 'entry bytes' for 10,000 and 100,000 tenants × 4
// and 16 cells); a round is not run here — no agent reports demands.
//
//   npx tsx bench/coordinator-memory.ts [--smoke] [--tenants N] [--snapshot-every N] [--clients N]
// Smoke: 2,000 tenants and --snapshot-every 1,000, so that a snapshot is taken at that size too.
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { CoordinatorCluster } from '../testkit/coordinator-cluster.js';
import type { BenchReport } from './bench-report.js';
import { sleep, waitFor } from '../testkit/wait.js';

export interface CoordinatorMemoryOptions {
  readonly smoke: boolean;
  readonly progress: (msg: string) => void;
  readonly tenants?: number;
  readonly clients?: number;
  /** --snapshot-every of every replica (default: the coordinator's default, 10,000; 1,000 in smoke). */
  readonly snapshotEvery?: number;
}

/** What one replica's /metrics said, and its data dir's size. */
export interface ReplicaSample {
  readonly replica: string;
  readonly leader: boolean;
  readonly tenants: number;
  readonly appliedIndex: number;
  readonly rssBytes: number;
  readonly heapUsedBytes: number;
  readonly heapTotalBytes: number;
  readonly diskBytes: number;
}

export interface SnapshotEvent {
  readonly replica: string;
  readonly index: number;
  readonly bytes: number;
  readonly ms: number;
  /** The synchronous encoding of the state machine (the event loop serves nothing meanwhile). */
  readonly encodeMs: number;
  /** The longest event-loop delay on that replica while the snapshot was taken and written. */
  readonly loopMaxMs: number;
}

export interface CoordinatorMemoryResult {
  readonly report: BenchReport;
  readonly samples: readonly {
    readonly phase: 'idle' | 'written' | 'snapshot';
    readonly replicas: readonly ReplicaSample[];
  }[];
  readonly snapshots: readonly SnapshotEvent[];
  readonly writes: {
    readonly ok: number;
    readonly retries: number;
    readonly perSec: number;
    readonly p50Ms: number;
    readonly p99Ms: number;
  };
  /** The metric names read (with the coordinator's prefix), for the notes and the test. */
  readonly metricNames: readonly string[];
}

const DEFAULT_SNAPSHOT_EVERY = 10_000;
const RSS = 'process_resident_memory_bytes';
const HEAP_USED = 'nodejs_heap_size_used_bytes';
const HEAP_TOTAL = 'nodejs_heap_size_total_bytes';

function dirBytes(dir: string): number {
  let total = 0;
  let entries: string[];
  try {
    entries = readdirSync(dir);
  } catch {
    return 0;
  }
  for (const name of entries) {
    const p = join(dir, name);
    try {
      const st = statSync(p);
      total += st.isDirectory() ? dirBytes(p) : st.size;
    } catch {
      // removed meanwhile (LevelDB compaction)
    }
  }
  return total;
}

/** The first sample of a metric whose name ends in `suffix` (the coordinator prefixes the defaults). */
function metric(text: string, suffix: string, names: Set<string>): number {
  const m = new RegExp(`^(\\w*${suffix})(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text);
  if (m === null) return Number.NaN;
  names.add(m[1] ?? suffix);
  return Number(m[2]);
}

async function sampleReplica(c: CoordinatorCluster, id: string, names: Set<string>): Promise<ReplicaSample> {
  const res = await fetch(`${c.adminUrl(id)}/metrics`, { signal: AbortSignal.timeout(10_000) });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`${id} /metrics: ${res.status}`);
  return {
    replica: id,
    leader: metric(text, 'cellquota_raft_is_leader', names) === 1,
    tenants: metric(text, 'cellquota_ledger_tenants', names),
    appliedIndex: metric(text, 'cellquota_raft_applied_index', names),
    rssBytes: metric(text, RSS, names),
    heapUsedBytes: metric(text, HEAP_USED, names),
    heapTotalBytes: metric(text, HEAP_TOTAL, names),
    diskBytes: dirBytes(c.replica(id).dataDir),
  };
}

async function sampleAll(c: CoordinatorCluster, names: Set<string>): Promise<ReplicaSample[]> {
  return Promise.all([...c.replicas.keys()].map((id) => sampleReplica(c, id, names)));
}

/** The "snapshot taken, log compacted" lines (pino JSON) a replica has printed so far. */
function snapshotsOf(c: CoordinatorCluster, id: string): SnapshotEvent[] {
  const out: SnapshotEvent[] = [];
  for (const line of c.replica(id).output.split('\n')) {
    if (!line.includes('snapshot taken')) continue;
    try {
      const j = JSON.parse(line) as {
        index?: number;
        bytes?: number;
        ms?: number;
        encodeMs?: number;
        loopMaxMs?: number;
      };
      if (typeof j.index === 'number')
        out.push({
          replica: id,
          index: j.index,
          bytes: j.bytes ?? Number.NaN,
          ms: j.ms ?? Number.NaN,
          encodeMs: j.encodeMs ?? Number.NaN,
          loopMaxMs: j.loopMaxMs ?? Number.NaN,
        });
    } catch {
      // not a JSON line
    }
  }
  return out;
}

function quantile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] ?? Number.NaN;
}

const mib = (b: number): number => Math.round((b / 1048576) * 10) / 10;
const fmtInt = (n: number): string => Math.round(n).toLocaleString('en-US');

/**
 * `count` PUTs by `clients` concurrent clients to the leader; a refused or failed write (leadership
 * moved, a timeout) is retried against the leader found again, up to 20 times per write.
 */
async function writeTenants(
  c: CoordinatorCluster,
  ids: (k: number) => string,
  count: number,
  clients: number,
  onProgress: (done: number) => void,
): Promise<{ latencies: number[]; retries: number; seconds: number }> {
  let leaderUrl = c.adminUrl(await c.waitForLeader());
  let next = 0;
  let done = 0;
  let retries = 0;
  const latencies: number[] = [];
  const started = performance.now();
  await Promise.all(
    Array.from({ length: clients }, async () => {
      for (;;) {
        const k = next++;
        if (k >= count) return;
        for (let attempt = 0; ; attempt++) {
          const t0 = performance.now();
          let status = 0;
          let detail: string;
          try {
            const res = await fetch(`${leaderUrl}/v1/tenants/${ids(k)}`, {
              method: 'PUT',
              headers: { 'content-type': 'application/json' },
              body: '{"tier":"bench"}',
              redirect: 'manual',
              signal: AbortSignal.timeout(10_000),
            });
            detail = await res.text();
            status = res.status;
          } catch (err) {
            detail = err instanceof Error ? err.message : String(err);
          }
          if (status === 200) {
            latencies.push(performance.now() - t0);
            break;
          }
          if (attempt >= 20) throw new Error(`PUT tenant ${ids(k)}: ${status} ${detail.slice(0, 200)}`);
          retries++;
          await sleep(50);
          leaderUrl = c.adminUrl(await c.waitForLeader());
        }
        done++;
        onProgress(done);
      }
    }),
  );
  return { latencies, retries, seconds: (performance.now() - started) / 1000 };
}

export async function runCoordinatorMemoryBenchDetailed(
  opts: CoordinatorMemoryOptions,
): Promise<CoordinatorMemoryResult> {
  const tenants = opts.tenants ?? (opts.smoke ? 2_000 : 100_000);
  const clients = opts.clients ?? 32;
  const snapshotEvery = opts.snapshotEvery ?? (opts.smoke ? 1_000 : DEFAULT_SNAPSHOT_EVERY);
  const progressEvery = opts.smoke ? 500 : 10_000;
  const progress = opts.progress;
  const names = new Set<string>();
  if (!(snapshotEvery >= 10)) throw new Error("snapshotEvery must be ≥ 10 (the coordinator's minimum)");
  const c = await CoordinatorCluster.create(['n1', 'n2', 'n3'], ['--snapshot-every', String(snapshotEvery)]);
  const samples: { phase: 'idle' | 'written' | 'snapshot'; replicas: ReplicaSample[] }[] = [];
  let snapshots: SnapshotEvent[];
  let writes: CoordinatorMemoryResult['writes'];
  const notes: string[] = [];
  try {
    progress(`starting 3 coordinators (--snapshot-every ${snapshotEvery})`);
    c.startAll();
    await c.waitForLeader(60_000);
    const tier = await c.write('PUT', '/v1/tiers/bench', { rate: 1000, burst: 1000 });
    if (tier.status !== 200) throw new Error(`PUT tier: ${tier.status} ${JSON.stringify(tier.body)}`);
    await waitFor(
      'every replica applied the tier',
      async () => {
        const s = await sampleAll(c, names);
        return s.every((r) => r.appliedIndex === s[0]?.appliedIndex);
      },
      { timeoutMs: 30_000, everyMs: 200 },
    );
    await sleep(opts.smoke ? 500 : 3000); // let start-up garbage settle
    samples.push({ phase: 'idle', replicas: await sampleAll(c, names) });
    progress(`idle: ${samples[0]?.replicas.map((r) => `${r.replica} RSS ${mib(r.rssBytes)} MiB`).join(', ')}`);

    progress(`writing ${fmtInt(tenants)} tenants with ${clients} concurrent clients`);
    const w = await writeTenants(
      c,
      (k) => `t-${k}`,
      tenants,
      clients,
      (done) => {
        if (done % progressEvery === 0) progress(`${fmtInt(done)} / ${fmtInt(tenants)} tenants written`);
      },
    );
    const sorted = [...w.latencies].sort((a, b) => a - b);
    writes = {
      ok: w.latencies.length,
      retries: w.retries,
      perSec: Math.round(w.latencies.length / w.seconds),
      p50Ms: Math.round(quantile(sorted, 0.5) * 100) / 100,
      p99Ms: Math.round(quantile(sorted, 0.99) * 100) / 100,
    };
    progress(
      `written in ${w.seconds.toFixed(1)} s (${fmtInt(writes.perSec)} writes/s, p50 ${writes.p50Ms} ms, p99 ${writes.p99Ms} ms, ${writes.retries} retries); waiting for every replica to apply them`,
    );
    let lastIndex = 0;
    await waitFor(
      `every replica holding ${tenants} tenants`,
      async () => {
        const s = await sampleAll(c, names);
        lastIndex = Math.max(...s.map((r) => r.appliedIndex));
        return s.every((r) => r.tenants === tenants && r.appliedIndex === lastIndex);
      },
      { timeoutMs: 120_000, everyMs: 200 },
    );
    samples.push({ phase: 'written', replicas: await sampleAll(c, names) });

    {
      // Top up with re-writes of existing tenants until every replica has taken a snapshot at an
      // index ≥ the last write's (at most snapshotEvery entries more).
      const snappedPast = (id: string): boolean => snapshotsOf(c, id).some((e) => e.index >= lastIndex);
      let topUp = 0;
      for (let round = 0; ![...c.replicas.keys()].every(snappedPast); round++) {
        if (round > 50) throw new Error(`no snapshot past index ${lastIndex} after ${topUp} more writes`);
        const applied = Math.max(...(await sampleAll(c, names)).map((r) => r.appliedIndex));
        const lastSnap = Math.max(0, ...[...c.replicas.keys()].flatMap((id) => snapshotsOf(c, id).map((e) => e.index)));
        const need = Math.max(1, Math.min(snapshotEvery, snapshotEvery - (applied - lastSnap)) + 1);
        progress(`${fmtInt(need)} more writes (existing tenants) to reach the next snapshot`);
        const more = await writeTenants(
          c,
          (k) => `t-${(topUp + k) % tenants}`,
          need,
          clients,
          () => undefined,
        );
        topUp += need;
        writes = { ...writes, retries: writes.retries + more.retries };
        await sleep(500);
      }
      await sleep(200);
      samples.push({ phase: 'snapshot', replicas: await sampleAll(c, names) });
      notes.push(
        `Snapshot phase: ${fmtInt(topUp)} re-writes of existing tenants after the ${fmtInt(tenants)} new ones, until every replica had taken a snapshot at an index ≥ ${fmtInt(lastIndex)} (the last new tenant's); measured right after it.`,
      );
    }
    snapshots = [...c.replicas.keys()].flatMap((id) => snapshotsOf(c, id));
  } finally {
    await c.cleanup();
  }

  const rows: Record<string, number | string>[] = [];
  const idle = new Map((samples.find((s) => s.phase === 'idle')?.replicas ?? []).map((r) => [r.replica, r]));
  for (const s of samples) {
    for (const r of s.replicas) {
      const base = idle.get(r.replica);
      const grown = base !== undefined && s.phase !== 'idle' ? Math.round((r.rssBytes - base.rssBytes) / tenants) : '';
      const heapGrown =
        base !== undefined && s.phase !== 'idle' ? Math.round((r.heapUsedBytes - base.heapUsedBytes) / tenants) : '';
      rows.push({
        phase: s.phase,
        replica: `${r.replica}${r.leader ? ' (leader)' : ''}`,
        tenants: r.tenants,
        'applied index': r.appliedIndex,
        'RSS MiB': mib(r.rssBytes),
        'heap used MiB': mib(r.heapUsedBytes),
        'heap total MiB': mib(r.heapTotalBytes),
        'data dir MiB': Math.round((r.diskBytes / 1048576) * 100) / 100,
        'RSS B/tenant vs idle': grown,
        'heap B/tenant vs idle': heapGrown,
      });
    }
  }
  const bySize = new Map<string, SnapshotEvent>();
  for (const e of snapshots) if ((bySize.get(e.replica)?.index ?? -1) < e.index) bySize.set(e.replica, e);
  const lastSnaps = [...bySize.values()];
  notes.unshift(
    `3 coordinators on loopback (LevelDB with fsync), --snapshot-every ${snapshotEvery}; ${fmtInt(tenants)} tenants (PUT /v1/tenants/t-<i> {"tier":"bench"}) by ${clients} concurrent clients on the leader's admin API: ${fmtInt(writes.perSec)} writes/s, p50 ${writes.p50Ms} ms, p99 ${writes.p99Ms} ms, ${writes.retries} retried.`,
    `Memory from each replica's /metrics (${[...names].filter((n) => n.endsWith(RSS) || n.includes('heap')).join(', ')}), sampled after the phase settled (no GC forced: the heap figures include garbage not yet collected); 'B/tenant vs idle' = (figure − idle figure) ÷ tenants. Data dir: the sum of the file sizes under the replica's --data-dir (LevelDB: Raft log, snapshot, hard state).`,
    lastSnaps.length > 0
      ? `Snapshots: ${snapshots.length} taken in all; the last per replica: ${lastSnaps.map((e) => `${e.replica} at index ${fmtInt(e.index)}, ${fmtInt(e.bytes)} bytes (${fmtInt(e.bytes / Math.max(1, tenants))} B/tenant), ${Math.round(e.ms)} ms`).join('; ')} (from the replicas' "snapshot taken, log compacted" log lines).`
      : 'Snapshots: none taken.',
    "The Raft entry of a lease round at this scale (reportAndGrant with the round's grants) is not made here (no agent reports demands): `npm run bench -- allocator` measures it for 10,000 and 100,000 tenants × 4 and 16 cells ('entry bytes', 'bytes/grant').",
  );
  return {
    report: {
      name: 'coordinator-memory',
      title: `Coordinator memory: 3 replicas, ${fmtInt(tenants)} tenants written through the admin API`,
      rows,
      notes,
    },
    samples,
    snapshots,
    writes,
    metricNames: [...names].sort(),
  };
}

/** The `npm run bench -- coordinator-memory` entry (bench/run.ts). */
export async function runCoordinatorMemoryBench(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
}): Promise<BenchReport> {
  return (await runCoordinatorMemoryBenchDetailed(opts)).report;
}

// ---- a million tenants: bulk load, memory, snapshots, catching a replica up under load ---------

/** The longest event-loop stall the leader's log reports for one of its snapshots. */
function leaderStall(snapshots: readonly SnapshotEvent[], leaderId: string | null): string {
  const own = snapshots.filter((e) => e.replica === leaderId && Number.isFinite(e.loopMaxMs));
  if (own.length === 0) return 'none taken on the leader';
  return `${fmtInt(Math.max(...own.map((e) => e.loopMaxMs)))} ms (${leaderId})`;
}

export interface MillionOptions {
  readonly smoke: boolean;
  readonly progress: (msg: string) => void;
  readonly tenants?: number;
  /** Tenants per POST /v1/tenants (≤ MAX_TENANTS_PER_BATCH). */
  readonly batch?: number;
  readonly snapshotEvery?: number;
}

export interface MillionResult {
  readonly report: BenchReport;
  readonly samples: readonly { readonly phase: string; readonly replicas: readonly ReplicaSample[] }[];
  readonly loadPerSec: number;
  readonly lagging: string;
  readonly catchUpMs: number;
  readonly catchUpPhases: CatchUpPhases;
  readonly installed: { readonly bytes: number; readonly ms: number } | null;
  readonly restartRestore: { readonly bytes: number; readonly ms: number } | null;
  readonly writesDuringCatchUp: number;
  readonly snapshots: readonly SnapshotEvent[];
}

/** The first JSON log line of the replica's current process whose msg is `msg`, with a numeric `ms`. */
function logLine(c: CoordinatorCluster, id: string, msg: string): { bytes: number; ms: number } | null {
  for (const line of c.replica(id).output.split('\n')) {
    if (!line.includes(msg)) continue;
    try {
      const j = JSON.parse(line) as { bytes?: number; ms?: number };
      if (typeof j.ms === 'number') return { bytes: j.bytes ?? Number.NaN, ms: j.ms };
    } catch {
      // not JSON
    }
  }
  return null;
}

/** Every JSON log line of the replica's current process whose msg is `msg`, with its time (epoch ms; pino writes ISO time here). */
function logLines(c: CoordinatorCluster, id: string, msg: string): { time: number; fields: Record<string, unknown> }[] {
  const out: { time: number; fields: Record<string, unknown> }[] = [];
  for (const line of c.replica(id).output.split('\n')) {
    if (!line.includes(msg)) continue;
    try {
      const j = JSON.parse(line) as Record<string, unknown>;
      const t = j['time'];
      const time = typeof t === 'number' ? t : typeof t === 'string' ? Date.parse(t) : Number.NaN;
      if (j['msg'] === msg && Number.isFinite(time)) out.push({ time, fields: j });
    } catch {
      // not JSON
    }
  }
  return out;
}

/** Where a catch-up's time went, from the replica's own log lines (ms since its start). */
export interface CatchUpPhases {
  /** First snapshot bytes received (the first progress line), ms after the start. */
  readonly firstChunkMs: number | null;
  /** All bytes of the snapshot received, ms after the start. */
  readonly receivedMs: number | null;
  /** Restored into the state machine ('installed a snapshot from the leader'), ms after the start. */
  readonly installedMs: number | null;
  readonly snapshotBytes: number | null;
  /** Snapshot bytes / (received − first chunk), MB/s. */
  readonly transferMBps: number | null;
  /** Progress lines: how many times a transfer started over at 0 bytes (1 = never restarted). */
  readonly transfersStarted: number;
}

function catchUpPhases(c: CoordinatorCluster, id: string, startedAt: number): CatchUpPhases {
  const prog = logLines(c, id, 'receiving a snapshot from the leader');
  const inst = logLines(c, id, 'installed a snapshot from the leader')[0];
  const first = prog[0];
  const full = prog.find((p) => p.fields['receivedBytes'] === p.fields['totalBytes']);
  let starts = 0;
  let last = Number.POSITIVE_INFINITY;
  for (const p of prog) {
    const r = Number(p.fields['receivedBytes']);
    if (r < last) starts++;
    last = r;
  }
  const bytes =
    full !== undefined ? Number(full.fields['totalBytes']) : inst !== undefined ? Number(inst.fields['bytes']) : null;
  const transferS = full !== undefined && first !== undefined ? (full.time - first.time) / 1000 : null;
  return {
    firstChunkMs: first !== undefined ? first.time - startedAt : null,
    receivedMs: full !== undefined ? full.time - startedAt : null,
    installedMs: inst !== undefined ? inst.time - startedAt : null,
    snapshotBytes: bytes,
    transferMBps:
      bytes !== null && transferS !== null && transferS > 0 ? Math.round((bytes / 1e6 / transferS) * 10) / 10 : null,
    transfersStarted: starts,
  };
}

/**
 * Three coordinators; one follower is stopped; N tenants are loaded through the leader's bulk
 * admin API (POST /v1/tenants, `batch` a request, 4 in flight); the two live replicas' memory is
 * sampled; then, while 8 clients keep writing (PUT of existing tenants), the stopped follower is
 * started again: its log ends long before the leader's compacted log, so the leader sends it a
 * snapshot (InstallSnapshot in chunks) — the time from its start until it holds all N tenants and
 * the leader's index at its start, and its restore time (its log line), are reported. Finally it is
 * restarted once more to time the restore of its own snapshot at start. Memory of all three after.
 */
export async function runCoordinatorMillionDetailed(opts: MillionOptions): Promise<MillionResult> {
  const tenants = opts.tenants ?? (opts.smoke ? 20_000 : 1_000_000);
  const batch = opts.batch ?? (opts.smoke ? 500 : 5_000);
  const snapshotEvery = opts.snapshotEvery ?? (opts.smoke ? 10 : 50);
  const progress = opts.progress;
  const names = new Set<string>();
  const c = await CoordinatorCluster.create(['n1', 'n2', 'n3'], ['--snapshot-every', String(snapshotEvery)]);
  const samples: { phase: string; replicas: ReplicaSample[] }[] = [];
  const live = (ids: readonly string[]): Promise<ReplicaSample[]> =>
    Promise.all(ids.map((id) => sampleReplica(c, id, names)));
  try {
    progress(`starting 3 coordinators (--snapshot-every ${snapshotEvery})`);
    c.startAll();
    const leader = await c.waitForLeader(60_000);
    const tier = await c.write('PUT', '/v1/tiers/bench', { rate: 1000, burst: 1000 });
    if (tier.status !== 200) throw new Error(`PUT tier: ${tier.status} ${JSON.stringify(tier.body)}`);
    const all = [...c.replicas.keys()];
    await waitFor(
      'every replica applied the tier',
      async () => (await live(all)).every((r) => r.tenants === 0 && r.appliedIndex >= 2),
      { timeoutMs: 30_000, everyMs: 200 },
    );
    await sleep(opts.smoke ? 300 : 2000);
    samples.push({ phase: 'idle', replicas: await live(all) });
    const lagging = all.find((id) => id !== leader) as string;
    const others = all.filter((id) => id !== lagging);
    await c.kill(lagging);
    progress(
      `${lagging} stopped; loading ${fmtInt(tenants)} tenants in batches of ${fmtInt(batch)} (POST /v1/tenants)`,
    );
    const started = performance.now();
    let next = 0;
    let loaded = 0;
    await Promise.all(
      Array.from({ length: 4 }, async () => {
        for (;;) {
          const from = next;
          next += batch;
          if (from >= tenants) return;
          const items = Array.from({ length: Math.min(batch, tenants - from) }, (_, k) => ({
            id: `t-${from + k}`,
            tier: 'bench',
          }));
          for (let attempt = 0; ; attempt++) {
            const r = await c
              .write('POST', '/v1/tenants', { tenants: items })
              .catch((e: unknown) => ({ status: 0, body: String(e) }));
            if (r.status === 200) break;
            if (attempt >= 10) throw new Error(`POST /v1/tenants: ${r.status} ${JSON.stringify(r.body).slice(0, 200)}`);
            await sleep(200);
          }
          loaded += items.length;
          if (loaded % (batch * 40) === 0 || loaded === tenants)
            progress(`${fmtInt(loaded)} / ${fmtInt(tenants)} loaded`);
        }
      }),
    );
    const loadSeconds = (performance.now() - started) / 1000;
    const loadPerSec = Math.round(tenants / loadSeconds);
    await waitFor(
      `${others.join(', ')} holding ${tenants} tenants`,
      async () => (await live(others)).every((r) => r.tenants === tenants),
      { timeoutMs: 300_000, everyMs: 200 },
    );
    await sleep(opts.smoke ? 300 : 2000);
    samples.push({ phase: 'loaded', replicas: await live(others) });

    // Catch the stopped follower up while writes go on.
    let writing = true;
    let writes = 0;
    const load = Promise.all(
      Array.from({ length: 8 }, async (_, w) => {
        for (let k = w; writing; k += 8) {
          const r = await c.write('PUT', `/v1/tenants/t-${k % tenants}`, { tier: 'bench' }).catch(() => null);
          if (r?.status === 200) writes++;
        }
      }),
    );
    await sleep(opts.smoke ? 200 : 1000);
    const target = Math.max(...(await live(others)).map((r) => r.appliedIndex));
    progress(`starting ${lagging} again under load (leader at index ${fmtInt(target)})`);
    const t0 = performance.now();
    const t0Wall = Date.now();
    c.start(lagging);
    await waitFor(
      `${lagging} caught up`,
      async () => {
        const r = await sampleReplica(c, lagging, names);
        return r.tenants === tenants && r.appliedIndex >= target;
      },
      { timeoutMs: 600_000, everyMs: 200 },
    );
    const catchUpMs = Math.round(performance.now() - t0);
    const writesBefore = writes;
    writing = false;
    await load;
    const installed = logLine(c, lagging, 'installed a snapshot from the leader'); // output restarts with the process
    const phases = catchUpPhases(c, lagging, t0Wall);
    progress(`${lagging} caught up in ${fmtInt(catchUpMs)} ms (${writesBefore} writes meanwhile)`);
    await sleep(opts.smoke ? 300 : 2000);
    samples.push({ phase: 'caught up', replicas: await live(all) });

    // Its own snapshot at start.
    await c.kill(lagging);
    c.start(lagging);
    await waitFor(`${lagging} restarted`, async () => (await sampleReplica(c, lagging, names)).tenants === tenants, {
      timeoutMs: 300_000,
      everyMs: 200,
    });
    const restartRestore = logLine(c, lagging, 'restored the snapshot at start');
    const snapshots = all.flatMap((id) => snapshotsOf(c, id));

    const rows: Record<string, number | string>[] = [];
    const ms = (v: number | null): number | string => (v === null ? '–' : Math.round(v));
    rows.push({
      phase: 'catch-up under load',
      replica: lagging,
      'caught up ms': catchUpMs,
      'first snapshot bytes ms': ms(phases.firstChunkMs),
      'snapshot received ms': ms(phases.receivedMs),
      'restored ms': ms(phases.installedMs),
      'snapshot MB': phases.snapshotBytes === null ? '–' : Math.round(phases.snapshotBytes / 1e5) / 10,
      'transfer MB/s': phases.transferMBps ?? '–',
      'transfers started': phases.transfersStarted,
      'writes meanwhile': writesBefore,
    });
    for (const sm of samples) {
      for (const r of sm.replicas) {
        rows.push({
          phase: sm.phase,
          replica: `${r.replica}${r.leader ? ' (leader)' : ''}`,
          tenants: r.tenants,
          'applied index': r.appliedIndex,
          'RSS MiB': mib(r.rssBytes),
          'RSS / 1 GiB': Math.round((r.rssBytes / 2 ** 30) * 100) / 100,
          'heap used MiB': mib(r.heapUsedBytes),
          'data dir MiB': Math.round((r.diskBytes / 1048576) * 10) / 10,
        });
      }
    }
    // Per replica its last three snapshots (the largest state).
    const lastThree = all.flatMap((id) => snapshots.filter((e) => e.replica === id).slice(-3));
    for (const e of lastThree)
      rows.push({
        phase: 'snapshot stall',
        replica: `${e.replica}${e.replica === leader ? ' (leader)' : ''}`,
        'applied index': e.index,
        'snapshot MB': Math.round(e.bytes / 1e5) / 10,
        'snapshot ms': e.ms,
        'encode ms': e.encodeMs,
        'longest loop stall ms': e.loopMaxMs,
      });
    const lastSnap = snapshots.reduce<SnapshotEvent | null>((a, e) => (a === null || e.index > a.index ? e : a), null);
    const notes = [
      `3 coordinators on loopback (LevelDB with fsync), --snapshot-every ${snapshotEvery}. ${fmtInt(tenants)} tenants loaded through the leader's bulk admin API (POST /v1/tenants, ${fmtInt(batch)} a request, 4 in flight) in ${loadSeconds.toFixed(1)} s: ${fmtInt(loadPerSec)} tenants/s, while ${lagging} was stopped.`,
      `Target: at most 1 GiB resident per replica with 1,000,000 tenants ('RSS / 1 GiB' ≤ 1). RSS and heap from each replica's /metrics, sampled after each phase settled (no GC forced).`,
      lastSnap !== null
        ? `Snapshots: ${snapshots.length} taken in all; the largest index: ${lastSnap.replica} at ${fmtInt(lastSnap.index)}, ${fmtInt(lastSnap.bytes)} bytes in ${Math.round(lastSnap.ms)} ms (encode + write, from its log), of which ${Math.round(lastSnap.encodeMs)} ms synchronous encoding; the longest event-loop stall on the leader during a snapshot: ${leaderStall(snapshots, leader)}. 'snapshot stall' rows (each replica's last three): 'encode ms' the snapshot's synchronous step (the state machine encoded, the event loop serving nothing), 'longest loop stall ms' the longest event-loop delay (perf_hooks monitorEventLoopDelay, any cause) while the snapshot was taken and written, from the replica's "snapshot taken" log line.`
        : 'Snapshots: none taken.',
      `Catch-up under load: ${lagging} started while 8 clients wrote (PUT of existing tenants); it held all ${fmtInt(tenants)} tenants and the leader's index at its start after ${fmtInt(catchUpMs)} ms${installed !== null ? `, through a snapshot from the leader (${fmtInt(installed.bytes)} bytes, restored in ${fmtInt(installed.ms)} ms)` : ' (no snapshot installed: it caught up from the log)'}; ${fmtInt(writesBefore)} writes were acknowledged meanwhile. The 'catch-up under load' row splits that time, from the replica's own log lines, ms after its process started: the first snapshot bytes received (process start, peer connection, the leader finding the follower behind its log), all bytes received, restored; 'transfers started' counts transfers that began again at byte 0 (1: the leader kept its snapshot to the end though it compacted meanwhile).`,
      restartRestore !== null
        ? `Restart: ${lagging} restored its own snapshot at start in ${fmtInt(restartRestore.ms)} ms (${fmtInt(restartRestore.bytes)} bytes).`
        : 'Restart: no snapshot restored at start.',
      "Loaded through the bulk admin API (issue 20's import path, `cellquota ctl tenants import` uses the same operation); no agent reports, so no slices: the tenants' definitions only.",
    ];
    return {
      report: {
        name: 'coordinator-million',
        title: `Coordinator: ${fmtInt(tenants)} tenants per replica — memory, snapshots, catch-up under load`,
        rows,
        notes,
      },
      samples,
      loadPerSec,
      lagging,
      catchUpMs,
      catchUpPhases: phases,
      installed,
      restartRestore,
      writesDuringCatchUp: writesBefore,
      snapshots,
    };
  } finally {
    await c.cleanup();
  }
}

/** The `npm run bench -- coordinator-million` entry (bench/run.ts). */
export async function runCoordinatorMillionBench(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
}): Promise<BenchReport> {
  return (await runCoordinatorMillionDetailed(opts)).report;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      smoke: { type: 'boolean', default: false },
      tenants: { type: 'string' },
      clients: { type: 'string' },
      'snapshot-every': { type: 'string' },
      out: { type: 'string', default: 'bench/results' },
    },
  });
  const num = (v: string | undefined): number | undefined => (v === undefined ? undefined : Number(v));
  const tenants = num(values.tenants);
  const clients = num(values.clients);
  const snapshotEvery = num(values['snapshot-every']);
  const { toMarkdown, writeResults } = await import('./bench-report.js');
  const r = await runCoordinatorMemoryBenchDetailed({
    smoke: values.smoke,
    progress: (m) => console.log(`  … ${m}`),
    ...(tenants !== undefined ? { tenants } : {}),
    ...(clients !== undefined ? { clients } : {}),
    ...(snapshotEvery !== undefined ? { snapshotEvery } : {}),
  });
  const command = `npx tsx bench/coordinator-memory.ts ${process.argv.slice(2).join(' ')}`.trim();
  console.log(toMarkdown([r.report], command));
  const files = writeResults(values.out, [r.report], command);
  console.log(`results: ${files.json}, ${files.md}`);
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) await main();
