// Coordinator benchmark, side by side with etcd (issue 6, item 3). Three cellquota coordinator
// processes on loopback (the Raft log in an append-only file, synced; gRPC between replicas; the
// admin API over HTTP) and a 3-member etcd cluster on loopback (bench/servers/etcd-cluster.ts),
// started and stopped here:
//
// - admin write latency and throughput with 1, 8 and 64 concurrent closed-loop writers, each system
//   written at its leader through Node's fetch (undici, keep-alive): cellquota `PUT /v1/tenants/NAME`
//   {"tier":"bench"}, etcd `POST /v3/kv/put` on its JSON gateway with key `tenants/NAME` and, as the
//   value, the tenant record cellquota stores (same bytes, same names). The systems take turns
//   phase by phase, the order reversed in the second round; the round with the higher throughput is
//   reported;
// - failover: SIGKILL of the leader → first write acknowledged by a survivor, writes sent to each
//   survivor every 5 ms without waiting for the previous ones; then the killed member is restarted on
//   its data dir and the next run waits until it follows the leader and has caught up. For etcd
//   both with its defaults (heartbeat 100 ms, election 1000 ms, pre-vote off) and with cellquota's
//   timing (50 ms, 500 ms randomized to [500, 1000) like cellquota's, pre-vote on like cellquota's).
//
// When `etcd` is not on PATH (nor $ETCD_BIN) the etcd rows are skipped with a note.
import os from 'node:os';
import { CoordinatorCluster, type HttpResult } from '../testkit/coordinator-cluster.js';
import type { BenchReport } from './bench-report.js';
import { EtcdCluster, findEtcd, etcdVersion, scrapeHistogram } from './servers/etcd-cluster.js';
import { sleep } from '../testkit/wait.js';

export type SystemName = 'cellquota' | 'etcd' | 'etcd 50/500';

export interface CoordinatorBenchOptions {
  readonly smoke: boolean;
  readonly progress: (msg: string) => void;
  /** Run the etcd side (default: when etcd is found). */
  readonly etcd?: boolean;
  readonly clients?: readonly number[];
  readonly failoverRuns?: number;
  readonly rounds?: number;
  readonly warmupMs?: number;
  readonly measureMs?: number;
}

export interface LatencyPhase {
  readonly system: SystemName;
  readonly clients: number;
  readonly round: number;
  /** Acknowledged writes that completed inside the measurement window. */
  readonly writes: number;
  /** Every acknowledged write of the phase, warm-up and tail included. */
  readonly acknowledged: number;
  readonly errors: number;
  readonly errorSamples: readonly string[];
  readonly measuredMs: number;
  readonly perSec: number;
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
}

export interface FailoverSeries {
  readonly system: SystemName;
  readonly description: string;
  /** ms from the SIGKILL of the leader to the first acknowledged write, one per run. */
  readonly runs: number[];
}

export interface CoordinatorBenchDetail {
  readonly report: BenchReport;
  readonly phases: readonly LatencyPhase[];
  readonly failovers: readonly FailoverSeries[];
  readonly skipped: readonly string[];
}

const CQ_DEFAULTS =
  'tick 50 ms, election timeout 10 ticks randomized in [500, 1000) ms, heartbeat 1 tick, PreVote and CheckQuorum on';
const POLL_MS = 5;
const ATTEMPT_TIMEOUT_MS = 1000;
const MAX_IN_FLIGHT = 512;

function quantile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i] ?? NaN;
}

const round2 = (v: number): number => (Number.isFinite(v) ? Math.round(v * 100) / 100 : NaN);
const ratio = (a: number, b: number): string =>
  Number.isFinite(a) && Number.isFinite(b) && b > 0 ? (a / b).toFixed(2) : '—';

/** One write: resolves true when acknowledged (200), false on any other answer; throws on I/O errors. */
type WriteFn = (key: string, signal?: AbortSignal) => Promise<{ ok: boolean; detail: string }>;

function cellquotaWriter(adminUrl: string): WriteFn {
  const body = '{"tier":"bench"}';
  return async (key, signal) => {
    const res = await fetch(`${adminUrl}/v1/tenants/${key}`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body,
      redirect: 'manual',
      ...(signal === undefined ? {} : { signal }),
    });
    const text = await res.text();
    return { ok: res.status === 200, detail: res.status === 200 ? '' : `${res.status} ${text.slice(0, 120)}` };
  };
}

function etcdPutBody(key: string, valueB64: string): string {
  return `{"key":"${Buffer.from(`tenants/${key}`).toString('base64')}","value":"${valueB64}"}`;
}

function etcdWriter(clientUrl: string, valueB64: string): WriteFn {
  return async (key, signal) => {
    const res = await fetch(`${clientUrl}/v3/kv/put`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: etcdPutBody(key, valueB64),
      ...(signal === undefined ? {} : { signal }),
    });
    const text = await res.text();
    return {
      ok: res.status === 200 && text.includes('"header"'),
      detail: res.status === 200 ? '' : `${res.status} ${text.slice(0, 120)}`,
    };
  };
}

/** `clients` closed-loop writers; latency and throughput of the writes completed in the window. */
async function closedLoop(
  write: WriteFn,
  clients: number,
  warmupMs: number,
  measureMs: number,
  keyPrefix: string,
): Promise<Omit<LatencyPhase, 'system' | 'clients' | 'round'>> {
  const lat: number[] = [];
  let acknowledged = 0;
  let errors = 0;
  const errorSamples: string[] = [];
  const start = performance.now();
  const from = start + warmupMs;
  const to = from + measureMs;
  const noteError = (what: string): void => {
    errors++;
    if (errorSamples.length < 5) errorSamples.push(what);
  };
  await Promise.all(
    Array.from({ length: clients }, async (_, client) => {
      for (let i = 0; performance.now() < to; i++) {
        const t0 = performance.now();
        try {
          const r = await write(`${keyPrefix}-${client}-${i}`, AbortSignal.timeout(10_000));
          const t1 = performance.now();
          if (r.ok) acknowledged++;
          if (!r.ok) noteError(r.detail);
          else if (t1 >= from && t1 <= to) lat.push(t1 - t0);
        } catch (err) {
          noteError(err instanceof Error ? err.message : String(err));
          if (errors > 1000) throw new Error(`too many failed writes (${errorSamples.join('; ')})`, { cause: err });
          await sleep(10);
        }
      }
    }),
  );
  lat.sort((a, b) => a - b);
  return {
    writes: lat.length,
    acknowledged,
    errors,
    errorSamples,
    measuredMs: measureMs,
    perSec: Math.round((lat.length * 1000) / measureMs),
    p50: round2(quantile(lat, 0.5)),
    p99: round2(quantile(lat, 0.99)),
    max: round2(lat.at(-1) ?? NaN),
  };
}

/**
 * Writes to every survivor every POLL_MS without waiting for earlier attempts (an etcd follower
 * holds a write it forwarded to a dead leader until its request timeout, seconds later), each
 * attempt aborted after ATTEMPT_TIMEOUT_MS; resolves with the ms from `killedAt` to the first
 * acknowledged write, once every attempt still in flight has been aborted and settled.
 */
async function firstWriteAfter(
  killedAt: number,
  survivors: readonly WriteFn[],
  keyPrefix: string,
  timeoutMs = 30_000,
): Promise<number> {
  const stop = new AbortController();
  const inFlight = new Set<Promise<void>>();
  let doneAt: number | null = null;
  let n = 0;
  while (doneAt === null) {
    if (performance.now() - killedAt > timeoutMs) break;
    for (const write of survivors) {
      if (inFlight.size >= MAX_IN_FLIGHT) break;
      const p = write(`${keyPrefix}-${n++}`, AbortSignal.any([stop.signal, AbortSignal.timeout(ATTEMPT_TIMEOUT_MS)]))
        .then((r) => {
          if (r.ok && doneAt === null) doneAt = performance.now();
        })
        .catch(() => undefined)
        .finally(() => inFlight.delete(p));
      inFlight.add(p);
    }
    await sleep(POLL_MS);
  }
  stop.abort();
  await Promise.allSettled([...inFlight]);
  if (doneAt === null) throw new Error(`no write acknowledged within ${timeoutMs} ms of the kill`);
  const acknowledgedAt: number = doneAt;
  return acknowledgedAt - killedAt;
}

// ---- cellquota side ------------------------------------------------------------------------

interface ClusterBody {
  leader?: string | null;
  commitIndex?: number;
  appliedIndex?: number;
}

async function cqCaughtUp(c: CoordinatorCluster, id: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < deadline) {
    if (c.replica(id).proc === null)
      throw new Error(`coordinator ${id} exited after its restart: ${c.replica(id).output.slice(-500)}`);
    const leader = await c.waitForLeader(Math.max(1, deadline - Date.now()));
    try {
      const l = (await c.http(leader, 'GET', '/v1/cluster?stale=true')).body as ClusterBody;
      const m = (await c.http(id, 'GET', '/v1/cluster?stale=true')).body as ClusterBody;
      if (m.leader === leader && (m.appliedIndex ?? -1) >= (l.commitIndex ?? Infinity)) return;
      last = `${id} applied ${m.appliedIndex ?? '?'}, leader ${leader} committed ${l.commitIndex ?? '?'}`;
    } catch (err) {
      last = err instanceof Error ? err.message : String(err);
    }
    await sleep(50);
  }
  throw new Error(`coordinator ${id} did not catch up within ${timeoutMs} ms (${last})`);
}

/** A setup write, retried while leadership settles (a young cluster on a busy machine may re-elect). */
async function cqWrite(c: CoordinatorCluster, path: string, body: unknown, timeoutMs = 30_000): Promise<HttpResult> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await c
      .write('PUT', path, body)
      .catch((err: unknown) => ({ status: 0, body: { error: String(err) }, headers: new Headers() }));
    if (r.status === 200) return r;
    if (Date.now() > deadline) throw new Error(`PUT ${path}: ${r.status} ${JSON.stringify(r.body)}`);
    await sleep(100);
  }
}

async function cqFailover(c: CoordinatorCluster, run: number): Promise<number> {
  const leader = await c.waitForLeader();
  const survivors = [...c.replicas.keys()].filter((id) => id !== leader).map((id) => cellquotaWriter(c.adminUrl(id)));
  const killedAt = performance.now();
  await c.kill(leader, 'SIGKILL');
  const ms = await firstWriteAfter(killedAt, survivors, `fo-${run}`);
  c.start(leader);
  await cqCaughtUp(c, leader);
  return ms;
}

async function etcdFailover(e: EtcdCluster, run: number, valueB64: string): Promise<number> {
  const leader = await e.waitForLeader();
  const survivors = e.members.filter((m) => m.name !== leader).map((m) => etcdWriter(m.clientUrl, valueB64));
  const killedAt = performance.now();
  await e.kill(leader, 'SIGKILL');
  const ms = await firstWriteAfter(killedAt, survivors, `fo-${run}`);
  e.start(leader);
  await e.waitCaughtUp(leader);
  return ms;
}

// ---- the benchmark -------------------------------------------------------------------------

export async function runCoordinatorBenchDetailed(opts: CoordinatorBenchOptions): Promise<CoordinatorBenchDetail> {
  const { smoke, progress } = opts;
  const clientsList = opts.clients ?? [1, 8, 64];
  const rounds = opts.rounds ?? (smoke ? 1 : 2);
  const warmupMs = opts.warmupMs ?? (smoke ? 100 : 1000);
  const measureMs = opts.measureMs ?? (smoke ? 300 : 5000);
  const failoverRuns = opts.failoverRuns ?? (smoke ? 1 : 20);
  const etcdBin = opts.etcd === false ? null : findEtcd();
  const skipped: string[] = [];
  if (etcdBin === null)
    skipped.push(
      opts.etcd === false
        ? 'etcd: not requested'
        : 'etcd: not found on PATH (nor $ETCD_BIN); install it with `apt-get install etcd-server` for the side-by-side rows',
    );

  const loadBefore = os.loadavg()[0] ?? 0;
  const phases: LatencyPhase[] = [];
  const failovers: FailoverSeries[] = [];
  const notes: string[] = [];
  let recordJson: string;
  const fsyncNotes: string[] = [];

  let cq: CoordinatorCluster | null = null;
  const etcds: EtcdCluster[] = [];
  const killAll = (): void => {
    if (cq !== null) for (const r of cq.replicas.values()) r.proc?.kill('SIGKILL');
    for (const e of etcds) e.killNow();
  };
  let stopping: Promise<unknown> | null = null;
  const onSignal = (signal: NodeJS.Signals): void => {
    progress(`${signal}: stopping every process this benchmark started`);
    const hardExit = setTimeout(() => {
      killAll();
      process.exit(signal === 'SIGINT' ? 130 : 143);
    }, 5000);
    stopping ??= Promise.allSettled([cq?.cleanup(), ...etcds.map((e) => e.stop(0))]).finally(() => {
      clearTimeout(hardExit);
      process.exit(signal === 'SIGINT' ? 130 : 143);
    });
  };
  process.on('exit', killAll);
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  try {
    // ---- start
    progress('starting 3 cellquota coordinators' + (etcdBin !== null ? ' and a 3-member etcd (defaults)' : ''));
    const c = await CoordinatorCluster.create(['n1', 'n2', 'n3']);
    cq = c;
    c.startAll();
    const etcdDefaults =
      etcdBin === null
        ? null
        : EtcdCluster.start({ bin: etcdBin, heartbeatMs: 100, electionMs: 1000, preVote: false, label: 'defaults' });
    const etcdDefault = etcdDefaults === null ? null : await etcdDefaults;
    if (etcdDefault !== null) etcds.push(etcdDefault);
    await c.waitForLeader(60_000);
    await cqWrite(c, '/v1/tiers/bench', { rate: 1000, burst: 1000 });
    const first = await cqWrite(c, '/v1/tenants/w-r0-c0-0-0', { tier: 'bench' });
    recordJson = JSON.stringify(first.body['tenant'] ?? first.body);
    const valueB64 = Buffer.from(recordJson).toString('base64');
    progress(`tenant record ${Buffer.byteLength(recordJson)} bytes: ${recordJson}`);

    // ---- latency and throughput, systems taking turns
    const systems: SystemName[] = etcdDefault === null ? ['cellquota'] : ['cellquota', 'etcd'];
    const fsyncBefore = new Map<SystemName, { leader: string; h: { sum: number; count: number } | null }>();
    const cqLeader0 = await c.waitForLeader();
    fsyncBefore.set('cellquota', {
      leader: cqLeader0,
      h: await scrapeHistogram(`${c.adminUrl(cqLeader0)}/metrics`, 'cellquota_storage_fsync_duration_seconds'),
    });
    if (etcdDefault !== null) {
      const l = await etcdDefault.waitForLeader();
      fsyncBefore.set('etcd', { leader: l, h: await etcdDefault.histogram(l, 'etcd_disk_wal_fsync_duration_seconds') });
    }
    for (let r = 1; r <= rounds; r++) {
      for (const clients of clientsList) {
        const order = r % 2 === 1 ? systems : [...systems].reverse();
        for (const system of order) {
          let write: WriteFn;
          if (system === 'cellquota') write = cellquotaWriter(c.adminUrl(await c.waitForLeader()));
          else if (etcdDefault !== null)
            write = etcdWriter(etcdDefault.member(await etcdDefault.waitForLeader()).clientUrl, valueB64);
          else continue;
          progress(`round ${r}/${rounds}: ${system}, ${clients} client(s), ${warmupMs} ms warm-up + ${measureMs} ms`);
          const res = await closedLoop(write, clients, warmupMs, measureMs, `w-r${r}-c${clients}`);
          phases.push({ system, clients, round: r, ...res });
          progress(
            `  ${res.perSec} writes/s, p50 ${res.p50} ms, p99 ${res.p99} ms${res.errors > 0 ? `, ${res.errors} errors (${res.errorSamples[0] ?? ''})` : ''}`,
          );
        }
      }
    }
    const writesBy = (s: SystemName): number =>
      phases.filter((p) => p.system === s).reduce((n, p) => n + p.acknowledged + p.errors, 0);
    for (const [system, before] of fsyncBefore) {
      const after =
        system === 'cellquota'
          ? await scrapeHistogram(`${c.adminUrl(before.leader)}/metrics`, 'cellquota_storage_fsync_duration_seconds')
          : await etcdDefault?.histogram(before.leader, 'etcd_disk_wal_fsync_duration_seconds');
      if (before.h === null || after === null || after === undefined || after.count <= before.h.count) continue;
      const count = after.count - before.h.count;
      const mean = ((after.sum - before.h.sum) / count) * 1000;
      fsyncNotes.push(
        `${system}: ${count} fsyncs on the leader (${before.leader}) during the write phases, mean ${mean.toFixed(2)} ms, ${(count / Math.max(1, writesBy(system))).toFixed(2)} per write`,
      );
    }

    // ---- failover
    let etcdFast: EtcdCluster | null = null;
    if (etcdBin !== null) {
      progress(
        "starting a second 3-member etcd with cellquota's timing (heartbeat 50 ms, election 500 ms, pre-vote on)",
      );
      etcdFast = await EtcdCluster.start({
        bin: etcdBin,
        heartbeatMs: 50,
        electionMs: 500,
        preVote: true,
        label: 'fast',
      });
      etcds.push(etcdFast);
    }
    const series: { system: SystemName; description: string; run: (i: number) => Promise<number> }[] = [
      { system: 'cellquota', description: CQ_DEFAULTS, run: (i) => cqFailover(c, i) },
    ];
    if (etcdDefault !== null)
      series.push({
        system: 'etcd',
        description: 'heartbeat 100 ms, election 1000 ms (randomized [1000, 2000)), pre-vote off: etcd 3.4 defaults',
        run: (i) => etcdFailover(etcdDefault, i, valueB64),
      });
    if (etcdFast !== null) {
      const e = etcdFast;
      series.push({
        system: 'etcd 50/500',
        description: "heartbeat 50 ms, election 500 ms (randomized [500, 1000)), pre-vote on: cellquota's timing",
        run: (i) => etcdFailover(e, i, valueB64),
      });
    }
    const results = new Map<SystemName, number[]>(series.map((s) => [s.system, []]));
    for (let i = 0; i < failoverRuns; i++) {
      const order = series.map((_, k) => series[(i + k) % series.length]).filter((s) => s !== undefined);
      for (const s of order) {
        progress(`failover ${i + 1}/${failoverRuns}: ${s.system}`);
        const ms = await s.run(i);
        results.get(s.system)?.push(ms);
        progress(
          `  first write acknowledged ${ms.toFixed(0)} ms after the SIGKILL; killed member restarted and caught up`,
        );
      }
    }
    for (const s of series)
      failovers.push({ system: s.system, description: s.description, runs: results.get(s.system) ?? [] });
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    if (stopping === null) {
      const stops = await Promise.allSettled([cq?.cleanup(), ...etcds.map((e) => e.stop())]);
      process.off('exit', killAll);
      progress(
        `stopped ${[cq !== null ? 'cellquota ×3' : '', ...etcds.map((e) => `etcd ${e.options.label ?? ''} ×3`)].filter((x) => x !== '').join(', ')}`,
      );
      for (const s of stops) if (s.status === 'rejected') progress(`stop failed: ${String(s.reason)}`);
    }
  }

  // ---- report
  const rows: Record<string, number | string>[] = [];
  const best = (system: SystemName, clients: number): LatencyPhase | undefined =>
    phases.filter((p) => p.system === system && p.clients === clients).sort((a, b) => b.perSec - a.perSec)[0];
  const verdicts: string[] = [];
  let allLatencyMet = true;
  for (const clients of clientsList) {
    const q = best('cellquota', clients);
    const e = best('etcd', clients);
    for (const p of [q, e]) {
      if (p === undefined) continue;
      const errs = phases
        .filter((x) => x.system === p.system && x.clients === clients)
        .reduce((n, x) => n + x.errors, 0);
      rows.push({
        system: p.system,
        measurement: `admin write, ${clients} client${clients === 1 ? '' : 's'}`,
        n: p.writes,
        'p50 ms': p.p50,
        'p99 ms': p.p99,
        'max ms': p.max,
        'writes/s': p.perSec,
        errors: errs,
        'cq ÷ etcd writes/s': p.system === 'etcd' && q !== undefined ? ratio(q.perSec, p.perSec) : '',
        'cq ÷ etcd p50': p.system === 'etcd' && q !== undefined ? ratio(q.p50, p.p50) : '',
      });
    }
    if (q !== undefined && e !== undefined) {
      const tput = q.perSec / e.perSec;
      const p50 = q.p50 / e.p50;
      const met = tput >= 1 && p50 <= 1;
      if (!met) allLatencyMet = false;
      verdicts.push(
        `${clients} client${clients === 1 ? '' : 's'}: throughput ${tput.toFixed(2)}× etcd's, p50 ${p50.toFixed(2)}× etcd's (p99 ${(q.p99 / e.p99).toFixed(2)}×) — ${met ? 'met' : 'NOT met'}`,
      );
    }
  }
  const cqRuns = failovers.find((f) => f.system === 'cellquota')?.runs ?? [];
  const cqMedian = quantile(
    [...cqRuns].sort((a, b) => a - b),
    0.5,
  );
  for (const f of failovers) {
    if (f.runs.length === 0) continue;
    const s = [...f.runs].sort((a, b) => a - b);
    const med = quantile(s, 0.5);
    rows.push({
      system: f.system,
      measurement: `failover: SIGKILL of the leader → first acknowledged write (${s.length} run${s.length === 1 ? '' : 's'})`,
      n: s.length,
      'p50 ms': round2(med),
      'p99 ms': round2(quantile(s, 0.99)),
      'max ms': round2(s.at(-1) ?? NaN),
      'writes/s': '',
      errors: '',
      'cq ÷ etcd writes/s': '',
      'cq ÷ etcd p50': f.system === 'cellquota' ? '' : ratio(cqMedian, med),
    });
  }

  notes.push(
    `cellquota: 3 coordinator processes (node + tsx) on loopback, the Raft log in an append-only segment file synced per Ready (coordinator/storage/README.md), gRPC between replicas; ${CQ_DEFAULTS}.`,
  );
  if (etcdBin !== null) {
    notes.push(
      `etcd ${etcdVersion(etcdBin)} (${etcdBin}): 3 members on loopback with fresh data dirs, fsync on (etcd always fsyncs its WAL). Write rows: etcd defaults (heartbeat 100 ms, election 1000 ms, pre-vote off); failover rows: "etcd" = those defaults, "etcd 50/500" = cellquota's timing (--heartbeat-interval 50 --election-timeout 500, randomized to [500, 1000) as in cellquota) with --pre-vote=true (cellquota runs PreVote).`,
    );
    notes.push(
      `Same payload both sides: cellquota PUT /v1/tenants/NAME with body {"tier":"bench"} (16 bytes), stored as a ${Buffer.byteLength(recordJson)}-byte tenant record; etcd POST /v3/kv/put on the JSON gateway (grpc-gateway, not native gRPC: etcd pays the gateway's JSON↔gRPC hop) with key "tenants/NAME" and that same ${Buffer.byteLength(recordJson)}-byte record as the value (request body ${Buffer.byteLength(etcdPutBody('w-r1-c8-0-0', Buffer.from(recordJson).toString('base64')))} bytes with base64). Both through Node's fetch (undici, keep-alive, one connection per writer) from the benchmark process, always to the leader.`,
    );
  } else {
    notes.push(
      `Skipped: ${skipped.join('; ')}. The comparison with etcd (docs/targets.md) cannot be evaluated without it.`,
    );
  }
  notes.push(
    `Writes: closed loop, c writers each with one write in flight; ${warmupMs} ms warm-up, then writes completed in a ${measureMs} ms window count (n); ${rounds} round(s), systems taking turns phase by phase (order reversed in even rounds), the round with the higher throughput reported. "errors" counts every non-200 answer over all rounds.`,
  );
  notes.push(
    `Failover: SIGKILL of the leader (time taken just before the signal) → first 200 from a survivor; a write goes to each survivor every ${POLL_MS} ms without waiting for earlier ones (each aborted after ${ATTEMPT_TIMEOUT_MS} ms: an etcd follower holds a write forwarded to a dead leader until its request timeout). After each run the killed member is restarted on its data dir and the next run waits until it follows the leader and has applied the leader's commit index; the systems take turns run by run.`,
  );
  if (fsyncNotes.length > 0)
    notes.push(
      `Fsync on the leader from its own metrics over the write phases (cellquota_storage_fsync_duration_seconds: a Ready's synced write to the Raft log, from the call to its return, lease rounds included; etcd_disk_wal_fsync_duration_seconds: the WAL fsync alone; below 1 per write = group commit): ${fsyncNotes.join('; ')}.`,
    );

  // Target evaluation.
  if (cqRuns.length > 0) {
    const max = Math.max(...cqRuns);
    const within = cqRuns.filter((v) => v <= 1500).length;
    const met = max <= 1500 && cqMedian <= 1000;
    const vs = failovers
      .filter((f) => f.system !== 'cellquota')
      .map(
        (f) =>
          `${f.system} median ${quantile(
            [...f.runs].sort((a, b) => a - b),
            0.5,
          ).toFixed(0)} ms`,
      )
      .join(', ');
    notes.push(
      `Target "a write acknowledged again within 1.5 s of a SIGKILL of the leader, median ≤ 1 s": cellquota median ${cqMedian.toFixed(0)} ms, max ${max.toFixed(0)} ms, ${within}/${cqRuns.length} runs within 1.5 s — ${met ? 'met' : 'NOT met'}${cqRuns.length < 20 ? ` (only ${cqRuns.length} run${cqRuns.length === 1 ? '' : 's'}: indicative)` : ''}${vs !== '' ? `; for comparison ${vs}` : ''}.`,
    );
  }
  if (verdicts.length > 0) {
    notes.push(
      `Target "admin write latency and throughput at least etcd's on the same machine, side by side" (throughput ratio ≥ 1 and p50 ratio ≤ 1 at each client count): ${verdicts.join('; ')} — overall ${allLatencyMet ? 'met' : 'NOT met'}.`,
    );
  } else {
    notes.push('Target "admin write latency and throughput at least etcd\'s": not evaluated (no etcd rows).');
  }
  notes.push(
    `Machine load (1-min load average, ${os.cpus().length} CPUs): ${loadBefore.toFixed(2)} before, ${(os.loadavg()[0] ?? 0).toFixed(2)} after. Servers, client and the idle cluster of the other system share these CPUs; the client's HTTP work (the same for both) is part of every figure.`,
  );

  const report: BenchReport = {
    name: 'coordinator',
    title: `Coordinator vs etcd: 3 processes each on loopback, fsync on, writes at the leader over HTTP${smoke ? ' (smoke)' : ''}`,
    rows,
    notes,
  };
  return { report, phases, failovers, skipped };
}

export async function runCoordinatorBench(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
}): Promise<BenchReport> {
  return (await runCoordinatorBenchDetailed(opts)).report;
}
