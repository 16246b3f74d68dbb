// The cell agent process: startAgent(config, logger) loads the rules and the static quota table,
// creates the shared memory, starts the gRPC worker threads and the HTTP API, and keeps the rules
// current. See cell-agent/README.md for the design and envoy-wiring.md for pointing Envoy at it.
//
// Threads:
//   main thread   rules loading and hot reload (validated here, then posted to the workers as
//                 texts), the HTTP API (its checks decide on the same shared buckets), /metrics (sums
//                 the shared statistics), the aggregated throttling log, worker supervision (a worker
//                 that exits unexpectedly is restarted on the same socket, with back-off).
//   worker i      one RLS server (the lean node:http2 one, or grpc-js with --rls-server grpc-js):
//                 RLS + health on `<rls-socket>` (i = 0) or `<rls-socket>.<i>`,
//                 and on TCP port PORT + i (any free port each when PORT is 0).
//   shared        ONE bucket table, the velocity window and the statistics, in SharedArrayBuffers:
//                 every thread decides from the same buckets, so a key's limit is shared exactly.
import { Worker } from 'node:worker_threads';
import type { Logger } from '../shared/logging.js';
import { componentLogger } from '../shared/logging.js';
import { BucketTable } from './buckets/bucket-table.js';
import type { RuleSet } from './rules/rules-compile.js';
import type { RulesError } from './rules/rules-errors.js';
import { loadRules, watchRules } from './rules/rules-load.js';
import type { LoadRulesOptions } from './rules/rules-load.js';
import { CheckService, overloadAllowances } from './decide/check-service.js';
import { Decider } from './decide/decide.js';
import type { DeciderOptions } from './decide/decide.js';
import { warmUp } from './rls/warm-up.js';
import { CoordinatedQuotas, StaticQuotas, formatUnknownTenantPolicy, loadQuotaFile } from './decide/quotas.js';
import type { QuotaFile, QuotaSlice } from './decide/quotas.js';
import { startHttpApi } from './http/http-api.js';
import { DEFAULT_ROUTES, loadRoutes } from './front-door/routes.js';
import type { Routes } from './front-door/routes.js';
import type { HttpApiHandle, QuotaInForce } from './http/http-api.js';
import { LagGuard } from './observe/lag-guard.js';
import { createAgentMetrics } from './observe/metrics.js';
import { StatsWriter, createStatsShared, readStats } from './observe/stats.js';
import { ThrottleCounts, ThrottleLog } from './observe/throttle-log.js';
import { RulesChangedError, snapshotOf } from './agent-rules.js';
import type { RulesSnapshot } from './agent-rules.js';
import type { AgentConfig } from './agent-config.js';
import type { MainToWorker, WorkerInit, WorkerToMain } from './agent-protocol.js';
import type { RlsEndpoints, RlsListenOptions } from './rls/rls-server.js';
import { VelocityKeys, VelocityTable } from './velocity/velocity-table.js';
import { Counter, Gauge } from 'prom-client';
import { LeaseClient } from './lease/lease-client.js';
import type { LeaseState } from './lease/lease-client.js';
import { QuotaOverrides, reconfigureBuckets } from './lease/quota-overrides.js';
import { LeaseDeadline, deadlineWriter, monotonicMsOf } from './lease/lease-deadline.js';
import { loadLeaseCredentials } from './lease/lease-credentials.js';
import type { LeaseCredentials } from './lease/lease-credentials.js';
import type { ClampedEntry } from './lease/quota-overrides.js';
import type { VelocitySample } from './velocity/velocity-table.js';

export interface AgentEndpoints {
  /** Unix socket paths, one per worker, in worker order. */
  readonly rlsUnix: readonly string[];
  /** host:port, one per worker, in worker order. */
  readonly rlsTcp: readonly string[];
  /** http://host:port of the HTTP API. */
  readonly http: string | null;
}

export interface AgentHandle {
  readonly cell: string;
  readonly endpoints: AgentEndpoints;
  /** Stops serving (gRPC and HTTP), stops the workers and the rules watcher. Idempotent. */
  stop(): Promise<void>;
  /** The Prometheus exposition text (what GET /metrics serves). */
  metricsText(): Promise<string>;
  /** The velocity window: per global quota, tokens allowed and refused over the last 500 ms. */
  velocity(): VelocitySample[];
  /** Fingerprint of the rules in force in the main thread, and as applied by each worker. */
  rulesStatus(): { main: string | null; workers: (string | null)[] };
  /** The main thread's check (the HTTP API's and an embedding gateway's): same buckets and leases. */
  readonly check: CheckService;
  /** True while every RLS worker serves (always with --workers 0). */
  healthy(): boolean;
  /** Warms the main thread's check path again and restarts its lag guard's count from now: for an
   * embedding server (the gateway) right before it starts listening, after its own start-up work. */
  warmUp(): void;
  /** Testing and drills: block worker `index`'s event loop for `ms` (induced overload); resolves once it is blocked. */
  blockWorkerForTesting(index: number, ms: number): Promise<void>;
  /** Testing: make worker `index` exit abruptly; it is restarted like after a crash. */
  crashWorkerForTesting(index: number): void;
}

const WORKER_START_TIMEOUT_MS = 30_000;
const WORKER_STOP_GRACE_MS = 2_000;
const RESTART_BACKOFF_MIN_MS = 250;
const RESTART_BACKOFF_MAX_MS = 10_000;

interface WorkerSlot {
  readonly index: number;
  worker: Worker | null;
  serving: boolean;
  endpoints: RlsEndpoints | null;
  applied: string | null;
  /** The last overrides batch this worker decides with (confirmed, or given in its init). */
  overridesSeq: number;
  restarts: number;
  restartTimer: NodeJS.Timeout | null;
  stopped: (() => void) | null;
}

export async function startAgent(config: AgentConfig, logger: Logger): Promise<AgentHandle> {
  const log = componentLogger(logger, 'agent');
  const workerLog = componentLogger(logger, 'rls-worker');

  // ---- lease credentials (read and checked first: a certificate for another cell fails the start) --
  const leaseCreds = config.coordinators.length > 0 ? loadLeaseCredentials(config) : null;

  // ---- rules and quotas -------------------------------------------------------------------------
  const { ruleSet, snapshot } = await loadRulesWithSnapshot(config.rules, { mergeDomains: config.mergeDomains });
  let currentRules: RuleSet = ruleSet;
  let currentSnapshot: RulesSnapshot = snapshot;
  const routes: Routes = config.routes === undefined ? DEFAULT_ROUTES : await loadRoutes(config.routes);
  // With coordinators every quota comes from them (CoordinatedQuotas over the lease client's
  // entries); alone, from the --tenants file at --static-share (the config refuses mixing the two).
  const coordinated = config.coordinators.length > 0;
  const quotaFile: QuotaFile = config.tenants === undefined ? { tiers: {}, tenants: {} } : await loadQuotaFile(config.tenants);
  const quotaOptions = { staticShare: config.staticShare, unknownTenant: config.unknownTenant };
  const overrides = new QuotaOverrides();
  const quotas: StaticQuotas = coordinated ? new CoordinatedQuotas(overrides) : new StaticQuotas(quotaFile, quotaOptions);
  const zero = quotas.zeroSlices();
  if (zero.length > 0) log.warn({ slices: zero, staticShare: config.staticShare }, 'these global quotas have a slice below one token at this static share: they refuse every request');
  if (!coordinated && ruleSet.rules.some((r) => r.global) && config.tenants === undefined) {
    log.warn({ unknownTenant: formatUnknownTenantPolicy(config.unknownTenant) }, 'the rules have global quotas but neither --coordinators nor a --tenants table was given: every tenant is unknown');
  }

  // ---- shared memory ----------------------------------------------------------------------------
  const startNs = process.hrtime.bigint();
  const clock = (): bigint => process.hrtime.bigint();
  const table = new BucketTable({ capacity: config.tableCapacity, startNs });
  const velocityTable = VelocityTable.create({ capacity: config.velocityCapacity, startNs });
  const velocityKeys = new VelocityKeys(velocityTable);
  velocityTable.onNewKey = (slot, gen, key) => velocityKeys.learn(slot, gen, key);
  const stats = createStatsShared(config.workers + 1);
  // The lease's end, read by every deciding thread (lease-deadline.ts) on the same clock as the buckets.
  const deadline = LeaseDeadline.create();

  const deciderOptions: DeciderOptions = {
    bounds: {
      maxDescriptors: config.maxDescriptors,
      maxEntries: config.maxEntries,
      maxKeyLength: config.maxKeyLength,
      maxValueLength: config.maxValueLength,
      maxDomainLength: config.maxDomainLength,
    },
    responseHeaders: config.responseHeaders,
    tableFull: config.tableFull,
    // Without coordinators every global quota runs on its static slice (always degraded); with them,
    // a global level is degraded unless it holds a live leased grant.
    staticSlices: config.coordinators.length === 0,
    cell: config.cell,
  };
  const lagOptions = { thresholdMs: config.lagThresholdMs };
  const overloadOptions = { policy: config.overloadPolicy, allowance: config.overloadAllowance };

  // ---- the main thread's own checks (HTTP API) --------------------------------------------------
  const mainThrottle = new ThrottleCounts();
  const throttleLog = new ThrottleLog(componentLogger(logger, 'throttle'), config.cell, config.throttleLogIntervalMs, () => {
    const t = readStats(stats);
    return { overloadMs: t.overloadMs, overloadEpisodes: t.overloadEpisodes, overloadRefused: t.overloadRefused.allowance + t.overloadRefused.shed, failOpenOverload: t.failOpen.overload };
  });
  const mainDecider = new Decider({ table, quotas, clock, velocity: velocityTable, onRefused: (key, hits, why) => mainThrottle.add(key, hits, why), overrides, deadline }, deciderOptions);
  mainDecider.setRules(currentRules);
  const mainStats = new StatsWriter(stats, config.workers);
  const mainLag = new LagGuard(lagOptions, mainStats);
  const mainService = new CheckService(mainDecider, mainStats, mainLag, componentLogger(logger, 'http'), {
    overload: overloadOptions,
    allowances: overloadAllowances(overloadOptions.allowance, table, mainThrottle),
    throttle: mainThrottle,
    cell: config.cell,
  });

  // ---- workers ----------------------------------------------------------------------------------
  const slots: WorkerSlot[] = Array.from({ length: config.workers }, (_, index) => ({
    index, worker: null, serving: false, endpoints: null, applied: null, overridesSeq: 0, restarts: 0, restartTimer: null, stopped: null,
  }));
  let stopping = false;
  // Overrides batches posted to the workers; a batch counts as applied once every running worker has
  // confirmed it (a worker that dies is restarted with the full table), and only then does the lease
  // client acknowledge its grants to the coordinator.
  let overrideSeq = 0;
  const overrideWaiters: { readonly seq: number; readonly resolve: () => void }[] = [];
  const checkOverrideWaiters = (): void => {
    for (let i = overrideWaiters.length - 1; i >= 0; i--) {
      const w = overrideWaiters[i];
      if (w === undefined || !slots.every((s) => s.worker === null || s.overridesSeq >= w.seq)) continue;
      overrideWaiters.splice(i, 1);
      w.resolve();
    }
  };

  const listenFor = (index: number): RlsListenOptions => ({
    unix: config.rlsSocket === undefined ? undefined : {
      path: index === 0 ? config.rlsSocket : `${config.rlsSocket}.${index}`,
      mode: config.socketMode,
      uid: config.socketOwner?.uid,
      gid: config.socketOwner?.gid,
    },
    tcp: config.rlsListen === undefined ? undefined : { host: config.rlsListen.host, port: config.rlsListen.port === 0 ? 0 : config.rlsListen.port + index },
    maxMessageBytes: config.maxMessageBytes,
    server: config.rlsServer,
  });

  const initFor = (index: number): WorkerInit => ({
    index,
    cell: config.cell,
    logLevel: config.logLevel,
    table: table.shared,
    velocity: velocityTable.shared,
    stats,
    deadline: deadline.shared,
    quotaFile,
    coordinated,
    staticShare: config.staticShare,
    unknownTenant: config.unknownTenant,
    rules: currentSnapshot,
    decider: deciderOptions,
    lag: lagOptions,
    overload: overloadOptions,
    listen: listenFor(index),
    throttleLogIntervalMs: config.throttleLogIntervalMs,
    overrides: overrides.entries(),
  });

  const onWorkerMessage = (slot: WorkerSlot, m: WorkerToMain): void => {
    switch (m.kind) {
      case 'log':
        relayLog(workerLog, m.line);
        return;
      case 'throttle':
        throttleLog.merge(m);
        return;
      case 'vkey':
        velocityKeys.learn(m.slot, m.gen, m.key);
        return;
      case 'overrides-applied':
        slot.overridesSeq = Math.max(slot.overridesSeq, m.seq);
        checkOverrideWaiters();
        return;
      case 'rules-applied':
        slot.applied = m.fingerprint;
        return;
      case 'rules-failed':
        log.error({ worker: slot.index, fingerprint: m.fingerprint, error: m.message }, 'a worker could not compile rules the main thread accepted; it keeps its previous rules');
        return;
      case 'stopped':
        slot.serving = false;
        slot.stopped?.();
        return;
      case 'ready':
      case 'fatal':
        return; // handled by startWorker
      case 'blocking':
        return; // handled by blockWorkerForTesting
    }
  };

  const startWorker = (slot: WorkerSlot): Promise<RlsEndpoints> => new Promise((resolveStart, rejectStart) => {
    const init = initFor(slot.index);
    slot.overridesSeq = overrideSeq; // init.overrides is the table as of this batch
    const worker = spawnWorker(init);
    slot.worker = worker;
    let started = false;
    const timer = setTimeout(() => {
      if (started) return;
      started = true;
      rejectStart(new Error(`rls worker ${slot.index} did not start within ${WORKER_START_TIMEOUT_MS} ms`));
      void worker.terminate();
    }, WORKER_START_TIMEOUT_MS);
    worker.on('message', (m: WorkerToMain) => {
      if (!started && (m.kind === 'ready' || m.kind === 'fatal')) {
        started = true;
        clearTimeout(timer);
        if (m.kind === 'ready') {
          slot.serving = true;
          slot.endpoints = m.endpoints;
          slot.applied = init.rules.fingerprint;
          resolveStart(m.endpoints);
        } else {
          slot.worker = null;
          void worker.terminate();
          rejectStart(Object.assign(new Error(`rls worker ${slot.index}: ${m.message}`), { code: m.code ?? 'RLS_WORKER_FAILED' }));
        }
        return;
      }
      onWorkerMessage(slot, m);
    });
    worker.on('error', (error) => {
      log.error({ worker: slot.index, err: error }, 'rls worker failed');
      if (!started) {
        started = true;
        clearTimeout(timer);
        rejectStart(error);
      }
    });
    worker.on('exit', (code) => {
      const wasServing = slot.serving;
      slot.serving = false;
      slot.worker = null;
      slot.stopped?.();
      checkOverrideWaiters();
      if (!started) {
        started = true;
        clearTimeout(timer);
        rejectStart(new Error(`rls worker ${slot.index} exited with code ${code} while starting`));
        return;
      }
      if (stopping || !wasServing) return;
      const delay = Math.min(RESTART_BACKOFF_MAX_MS, RESTART_BACKOFF_MIN_MS * 2 ** Math.min(slot.restarts, 10));
      log.error({ worker: slot.index, exitCode: code, restartInMs: delay }, 'rls worker exited unexpectedly; restarting it');
      scheduleRestart(slot, delay);
    });
  });

  const scheduleRestart = (slot: WorkerSlot, delay: number): void => {
    slot.restartTimer = setTimeout(() => {
      slot.restartTimer = null;
      if (stopping) return;
      slot.restarts++;
      metrics.workerRestarts.inc();
      startWorker(slot).then(
        (endpoints) => log.info({ worker: slot.index, endpoints }, 'rls worker restarted'),
        (error: unknown) => {
          log.error({ worker: slot.index, err: error }, 'rls worker restart failed');
          if (!stopping) scheduleRestart(slot, Math.min(RESTART_BACKOFF_MAX_MS, delay * 2));
        },
      );
    }, delay);
    slot.restartTimer.unref();
  };

  const stopWorker = (slot: WorkerSlot): Promise<void> => {
    if (slot.restartTimer !== null) clearTimeout(slot.restartTimer);
    slot.restartTimer = null;
    const worker = slot.worker;
    if (worker === null) return Promise.resolve();
    return new Promise<void>((done) => {
      const timer = setTimeout(() => {
        void worker.terminate().then(() => done());
      }, WORKER_STOP_GRACE_MS + 3_000);
      slot.stopped = () => {
        clearTimeout(timer);
        slot.stopped = null;
        // The worker closes its port after 'stopped'; terminate makes sure the thread is gone.
        void worker.terminate().then(() => done());
      };
      worker.postMessage({ kind: 'stop', graceMs: WORKER_STOP_GRACE_MS } satisfies MainToWorker);
    });
  };

  const metrics = createAgentMetrics({
    stats,
    table,
    velocityTable,
    velocityKeys,
    clock,
    workersServing: () => slots.filter((s) => s.serving).length,
    rulesFingerprint: () => currentRules.fingerprint,
    failOpenByQuota: () => throttleLog.failOpenByQuota(),
  });

  let leaseClient: LeaseClient | null = null;

  // The main thread's checks (HTTP API, forward-auth, an embedding gateway) are warmed too, before
  // the HTTP port exists; the lag guard then starts from now.
  const warmMain = (): void => {
    const warm = warmUp(currentRules, { quotas, overrides }, deciderOptions, overloadOptions, log);
    mainLag.reset();
    log.debug({ checks: warm.checks, ms: Math.round(warm.ms) }, 'main thread warmed up');
  };
  warmMain();

  // ---- HTTP API ---------------------------------------------------------------------------------
  let http: HttpApiHandle | null = null;
  if (config.http !== undefined) {
    try {
      http = await startHttpApi({ host: config.http.host, port: config.http.port, bodyLimit: config.httpBodyLimit }, {
        check: mainService,
        metrics: async () => ({ contentType: metrics.registry.contentType, body: await metrics.registry.metrics() }),
        quota: (key) => quotaInForce(key, overrides, coordinated ? null : quotas),
        health: () => {
          const serving = slots.filter((s) => s.serving).length;
          return {
            ok: serving === slots.length,
            details: { cell: config.cell, workers: { serving, total: slots.length }, rules: currentRules.fingerprint, staticSlices: config.coordinators.length === 0, lease: leaseClient?.status() ?? null },
          };
        },
        forwardAuth: { routes: () => routes, trusted: config.trustedProxies, denyStatus: config.forwardAuthDenyStatus },
      }, componentLogger(logger, 'http'));
    } catch (error) {
      stopping = true;
      throw error;
    }
  }

  // The workers last: each warms up and only then binds its sockets, while this thread's own start-up
  // work (above) is done and no longer competes with them for the CPU. Until they serve, /healthz
  // answers 503.
  const started = await Promise.allSettled(slots.map((slot) => startWorker(slot)));
  const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed !== undefined) {
    stopping = true;
    await Promise.all(slots.map(stopWorker));
    if (http !== null) await http.close();
    throw failed.reason;
  }
  mainLag.reset();
  mainLag.start();
  throttleLog.start(mainThrottle);

  // ---- lease client -----------------------------------------------------------------------------
  const leaseStateGauge = new Gauge({ name: 'cellquota_agent_lease_state', help: 'lease with the coordinator: 0 none yet (static shares), 1 leased, 2 expired (fail-static on floors)', registers: [metrics.registry] });
  const onFloorGauge = new Gauge({ name: 'cellquota_agent_on_floor', help: '1 while global quotas run on floors or static shares (no live lease), else 0', registers: [metrics.registry] });
  const leaseChanges = new Counter({ name: 'cellquota_agent_lease_changes_total', help: 'lease state changes', labelNames: ['state'], registers: [metrics.registry] });
  const LEASE_STATE_VALUE: Record<LeaseState, number> = { none: 0, leased: 1, expired: 2 };
  leaseStateGauge.set(0);
  onFloorGauge.set(1);
  if (config.coordinators.length > 0) {
    const creds = leaseCreds as LeaseCredentials;
    if (creds.token !== null && config.tlsCa === undefined) log.warn('the lease token is sent without TLS (no --tls-ca): only where the network path is encrypted otherwise (a mesh, a tunnel)');
    log.info({ leaseCredentials: creds.describe }, 'lease client credentials');
    leaseClient = new LeaseClient({
      cellId: config.cell,
      credentials: creds.channel,
      channelOptions: creds.channelOptions,
      token: creds.token,
      ...(creds.noIdentityHint === undefined ? {} : { failureHint: creds.noIdentityHint }),
      coordinators: config.coordinators.map(coordinatorAddress),
      coordinatorById: new Map(config.coordinators.flatMap((c) => (c.id === undefined ? [] : [[c.id, coordinatorAddress(c)] as const]))),
      logger: componentLogger(logger, 'lease'),
      velocity: () => velocityKeys.snapshot(clock()),
      failOpenTotal: () => Object.values(readStats(stats).failOpen).reduce((a, b) => a + b, 0),
      monotonicMs: monotonicMsOf(clock, startNs),
      deadline: deadlineWriter(deadline, startNs),
      onOverrides: (entries) => {
        const clamped = overrides.apply(entries);
        reconfigureBuckets(table, overrides, entries, clock());
        const seq = ++overrideSeq;
        for (const slot of slots) slot.worker?.postMessage({ kind: 'overrides', entries, seq } satisfies MainToWorker);
        return new Promise<ClampedEntry[]>((resolve) => {
          overrideWaiters.push({ seq, resolve: () => resolve(clamped) });
          checkOverrideWaiters();
        });
      },
      onStateChange: (state) => {
        leaseStateGauge.set(LEASE_STATE_VALUE[state]);
        onFloorGauge.set(state === 'leased' ? 0 : 1);
        leaseChanges.inc({ state });
      },
    });
    leaseClient.start();
  }

  // ---- hot reload -------------------------------------------------------------------------------
  const applyRules = (next: RuleSet): void => {
    const nextSnapshot = snapshotOf(next); // throws RulesChangedError: the watcher retries on the next change
    currentRules = next;
    currentSnapshot = nextSnapshot;
    mainDecider.setRules(next);
    for (const slot of slots) slot.worker?.postMessage({ kind: 'rules', snapshot: nextSnapshot } satisfies MainToWorker);
    metrics.configReloads.inc({ result: 'success' });
    log.info({ fingerprint: next.fingerprint, files: next.files.length, domains: [...next.domains.keys()] }, 'rules reloaded');
  };
  const unwatch = watchRules(config.rules, applyRules, (error: RulesError, lastGood: RuleSet | null) => {
    if (error.cause instanceof RulesChangedError) {
      log.debug({ error: error.message }, 'rules changed while being read; waiting for the next change');
      return;
    }
    metrics.configReloads.inc({ result: 'failure' });
    log.error({ error: error.message, code: error.code, keeping: lastGood?.fingerprint ?? currentRules.fingerprint }, 'rules reload failed; keeping the last good rules');
  }, { initial: ruleSet, debounceMs: config.rulesDebounceMs, mergeDomains: config.mergeDomains });

  const endpoints: AgentEndpoints = {
    rlsUnix: slots.flatMap((s) => (s.endpoints?.unix === null || s.endpoints?.unix === undefined ? [] : [s.endpoints.unix])),
    rlsTcp: slots.flatMap((s) => (s.endpoints?.tcp === null || s.endpoints?.tcp === undefined ? [] : [s.endpoints.tcp])),
    http: http?.url ?? null,
  };
  const coordinatorNote = config.coordinators.length === 0
    ? 'no coordinators configured: the agent runs alone on static slices'
    : 'coordinators configured: the agent runs on static slices until the coordinator leader grants leased slices';
  log.info({
    cell: config.cell,
    endpoints,
    workers: config.workers,
    rules: currentRules.fingerprint,
    tenants: quotas.tenantCount,
    tiers: quotas.tierCount,
    staticShare: config.staticShare,
    unknownTenant: formatUnknownTenantPolicy(config.unknownTenant),
    coordinators: config.coordinators.map((c) => (c.id === undefined ? coordinatorAddress(c) : `${c.id}=${coordinatorAddress(c)}`)),
  }, `cell agent started; ${coordinatorNote}`);

  let stopPromise: Promise<void> | null = null;
  return {
    cell: config.cell,
    endpoints,
    stop: () => {
      stopPromise ??= (async () => {
        stopping = true;
        unwatch();
        leaseClient?.stop();
        mainLag.stop();
        if (http !== null) await http.close();
        await Promise.all(slots.map(stopWorker));
        throttleLog.stop(mainThrottle);
        log.info({ cell: config.cell }, 'cell agent stopped');
      })();
      return stopPromise;
    },
    check: mainService,
    warmUp: warmMain,
    healthy: () => slots.every((s) => s.serving),
    metricsText: () => metrics.registry.metrics(),
    velocity: () => velocityKeys.snapshot(clock()),
    rulesStatus: () => ({ main: currentRules.fingerprint, workers: slots.map((s) => s.applied) }),
    blockWorkerForTesting: (index, ms) => new Promise<void>((resolveBlocked, reject) => {
      const worker = slots[index]?.worker;
      if (worker === null || worker === undefined) {
        reject(new Error(`no running worker ${index}`));
        return;
      }
      const onMessage = (m: WorkerToMain): void => {
        if (m.kind !== 'blocking') return;
        worker.off('message', onMessage);
        resolveBlocked();
      };
      worker.on('message', onMessage);
      worker.postMessage({ kind: 'block', ms } satisfies MainToWorker);
    }),
    crashWorkerForTesting: (index) => {
      slots[index]?.worker?.postMessage({ kind: 'crash' } satisfies MainToWorker);
    },
  };
}

/** loadRules, then the snapshot of exactly those files (retried if a file changes in between). */
async function loadRulesWithSnapshot(path: string, options: LoadRulesOptions): Promise<{ ruleSet: RuleSet; snapshot: RulesSnapshot }> {
  for (let attempt = 0; ; attempt++) {
    const ruleSet = await loadRules(path, options);
    try {
      return { ruleSet, snapshot: snapshotOf(ruleSet) };
    } catch (error) {
      if (!(error instanceof RulesChangedError) || attempt >= 10) throw error;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/** Starts agent-worker: the compiled .js next to this file, or the .ts source through tsx. */
/** What GET /v1/quotas/KIND/NAME answers: the coordinator's entry in force, else (alone) the static share. */
function quotaInForce(key: string, overrides: QuotaOverrides, quotas: StaticQuotas | null): QuotaInForce | null {
  const o = overrides.get(key);
  if (o !== undefined) return { key, source: o.unknown ? 'unknown-allowed' : o.leased ? 'leased' : 'floor', rate: o.rate, burst: o.burst };
  if (quotas === null) return null;
  const slash = key.indexOf('/');
  const kind = key.slice(0, slash);
  const name = key.slice(slash + 1);
  let slice: QuotaSlice | null = null;
  if (kind === 'tenant') {
    const r = quotas.resolve(name);
    slice = r.kind === 'quota' && r.known ? r.tenant : null;
  } else if (kind === 'tier') {
    slice = quotas.tier(name)?.cap ?? null;
  } else if (kind === 'domain') {
    slice = quotas.domainCap;
  }
  return slice === null ? null : { key, source: 'static', rate: slice.rate, burst: slice.burst };
}

/** host:port as gRPC dials it (IPv6 hosts in brackets). */
function coordinatorAddress(c: { readonly host: string; readonly port: number }): string {
  return `${c.host.includes(':') ? `[${c.host}]` : c.host}:${c.port}`;
}

function spawnWorker(init: WorkerInit): Worker {
  const fromSource = import.meta.url.endsWith('.ts');
  const entry = new URL(fromSource ? './agent-worker.ts' : './agent-worker.js', import.meta.url);
  if (!fromSource) return new Worker(entry, { workerData: init });
  // Node 20 does not apply the parent's --import tsx loader to a worker's .ts entry: register it first.
  const api = import.meta.resolve('tsx/esm/api');
  const boot = `import(${JSON.stringify(api)}).then((m) => { m.register(); return import(${JSON.stringify(entry.href)}); });`;
  return new Worker(boot, { eval: true, workerData: init });
}

const PINO_KEYS = new Set(['level', 'time', 'pid', 'hostname', 'msg']);
const PINO_LEVELS: Record<number, 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal'> = { 10: 'trace', 20: 'debug', 30: 'info', 40: 'warn', 50: 'error', 60: 'fatal' };

/** Re-emits a worker's pino line through the agent's logger. */
function relayLog(logger: Logger, line: string): void {
  try {
    const record = JSON.parse(line) as Record<string, unknown>;
    const level = PINO_LEVELS[typeof record['level'] === 'number' ? record['level'] : 30] ?? 'info';
    const fields: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(record)) if (!PINO_KEYS.has(k)) fields[k] = v;
    logger[level](fields, typeof record['msg'] === 'string' ? record['msg'] : '');
  } catch {
    logger.info({ line }, 'worker log line');
  }
}
