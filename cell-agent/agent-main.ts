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
import type { Logger } from '../shared/logging.js';
import { componentLogger } from '../shared/logging.js';
import { coordinatorAddress } from './agent-address.js';
import { RulesChangedError, snapshotOf } from './agent-rules.js';
import type { RulesSnapshot } from './agent-rules.js';
import type { AgentConfig } from './agent-config.js';
import { AGENT_ALONE_NOTE, AGENT_COORDINATED_NOTE } from './agent-config.js';
import type { WorkerInit } from './agent-protocol.js';
import { RlsWorkers } from './agent-workers.js';
import { HrtimeClock } from './buckets/elapsed-clock.js';
import { BucketTable } from './buckets/bucket-table.js';
import { CheckService, overloadAllowances } from './decide/check-service.js';
import { Decider } from './decide/decide.js';
import type { DeciderOptions } from './decide/decide.js';
import type { OverloadOptions } from './decide/overload.js';
import { CoordinatedQuotas, StaticQuotas, formatUnknownTenantPolicy } from './decide/quotas.js';
import type { QuotaFile, QuotaSlice } from './decide/quotas.js';
import type { Routes } from './front-door/routes.js';
import type { HttpApiHandle, QuotaInForce } from './http/http-api.js';
import type { LeaseClient } from './lease/lease-client.js';
import { LeaseDeadline } from './lease/lease-deadline.js';
import { QuotaOverrides } from './lease/quota-overrides.js';
import { LagGuard } from './observe/lag-guard.js';
import type { LagGuardOptions } from './observe/lag-guard.js';
import { createLeaseMetrics } from './observe/lease-metrics.js';
import { createAgentMetrics } from './observe/metrics.js';
import type { AgentMetrics } from './observe/metrics.js';
import { StatsWriter, createStatsShared, readStats } from './observe/stats.js';
import type { StatsShared } from './observe/stats.js';
import { ThrottleCounts, ThrottleLog } from './observe/throttle-log.js';
import type { RlsListenOptions } from './rls/rls-server.js';
import { warmUp } from './rls/warm-up.js';
import type { RulesError } from './rules/rules-errors.js';
import type { RuleSet } from './rules/rules-compile.js';
import { loadRules, watchRules } from './rules/rules-load.js';
import type { LoadRulesOptions } from './rules/rules-load.js';
import { VelocityKeys, VelocityTable } from './velocity/velocity-table.js';
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

export async function startAgent(config: AgentConfig, logger: Logger): Promise<AgentHandle> {
  const log = componentLogger(logger, 'agent');
  // The lease credentials first: a certificate for another cell fails the start. The lease client
  // (grpc-js, proto-loader: ~8 MiB resident) and the HTTP API (fastify) are imported only when
  // configured, so an agent without them does not hold their code (bench/agent-idle-rss.ts).
  const lease = config.coordinators.length > 0 ? await import('./agent-lease.js') : null;
  const leaseCreds = lease === null ? null : lease.loadLeaseCredentials(config);
  const memory = createSharedMemory(config);
  const inputs = await loadInputs(config, log, memory.deadline);
  const inForce = { rules: inputs.ruleSet, snapshot: inputs.snapshot };
  const settings = decisionSettings(config);
  const main = mainThreadCheck(config, logger, inputs, memory, settings);
  const workers: RlsWorkers = new RlsWorkers({
    count: config.workers,
    initFor: (index) => workerInit(config, index, { inputs, memory, settings, rules: inForce.snapshot }),
    log,
    workerLog: componentLogger(logger, 'rls-worker'),
    onThrottle: (m) => main.throttleLog.merge(m),
    onVelocityKey: (slot, gen, key) => memory.velocityKeys.learn(slot, gen, key),
    onRestart: () => metrics.workerRestarts.inc(),
    ...(config.workerYoungGenerationMb === 0
      ? {}
      : { resourceLimits: { maxYoungGenerationSizeMb: config.workerYoungGenerationMb } }),
    table: memory.table,
  });
  const metrics = createAgentMetrics({
    ...memory,
    workersServing: () => workers.serving,
    rulesFingerprint: () => inForce.rules.fingerprint,
    failOpenByQuota: () => main.throttleLog.failOpenByQuota(),
  });
  let leaseClient: LeaseClient | null = null;
  // The main thread's checks (HTTP API, forward-auth, an embedding gateway) are warmed too, before
  // the HTTP port exists; the lag guard then starts from now.
  const warmMain = (): void => main.warmUp(inForce.rules);
  warmMain();
  const http =
    config.http === undefined
      ? null
      : await startHttp(config, config.http, logger, {
          check: main.service,
          metrics,
          inputs,
          workers,
          rules: () => inForce.rules,
          lease: () => leaseClient,
        });
  // The workers last: each warms up and only then binds its sockets, while this thread's own start-up
  // work (above) is done and no longer competes with them for the CPU. Until they serve, /healthz
  // answers 503.
  try {
    await workers.start();
  } catch (error) {
    if (http !== null) await http.close();
    throw error;
  }
  main.lag.reset();
  main.lag.start();
  main.throttleLog.start(main.throttle);
  const leaseMetrics = createLeaseMetrics(metrics.registry);
  if (lease !== null && leaseCreds !== null) {
    leaseClient = lease.startAgentLease(
      config,
      leaseCreds,
      { ...memory, overrides: inputs.overrides, workers, metrics: leaseMetrics },
      logger,
    );
  }
  const unwatch = watchAgentRules(config, log, metrics, inputs.ruleSet, (next, snapshot) => {
    inForce.rules = next;
    inForce.snapshot = snapshot;
    main.decider.setRules(next);
    workers.postRules(snapshot);
  });
  const sockets = workers.endpoints();
  const endpoints: AgentEndpoints = { rlsUnix: sockets.unix, rlsTcp: sockets.tcp, http: http?.url ?? null };
  logStarted(config, log, endpoints, inputs, inForce.rules);

  const parts = { endpoints, main, workers, metrics, memory, http, unwatch, lease: () => leaseClient };
  return agentHandle(config, log, parts, () => inForce.rules, warmMain);
}

interface AgentParts {
  readonly endpoints: AgentEndpoints;
  readonly main: MainThreadCheck;
  readonly workers: RlsWorkers;
  readonly metrics: AgentMetrics;
  readonly memory: SharedMemory;
  readonly http: HttpApiHandle | null;
  readonly unwatch: () => void;
  readonly lease: () => LeaseClient | null;
}

/** The running agent: its stop (in the reverse order of the start) and its views. */
function agentHandle(
  config: AgentConfig,
  log: Logger,
  parts: AgentParts,
  rules: () => RuleSet,
  warmMain: () => void,
): AgentHandle {
  const { main, workers, metrics, memory, http } = parts;
  let stopPromise: Promise<void> | null = null;
  return {
    cell: config.cell,
    endpoints: parts.endpoints,
    stop: () => {
      stopPromise ??= (async () => {
        parts.unwatch();
        parts.lease()?.stop();
        main.lag.stop();
        if (http !== null) await http.close();
        await workers.stop();
        main.throttleLog.stop(main.throttle);
        log.info({ cell: config.cell }, 'cell agent stopped');
      })();
      return stopPromise;
    },
    check: main.service,
    warmUp: warmMain,
    healthy: () => workers.healthy(),
    metricsText: () => metrics.registry.metrics(),
    velocity: () => memory.velocityKeys.snapshot(memory.clock()),
    rulesStatus: () => ({ main: rules().fingerprint, workers: workers.rulesApplied() }),
    blockWorkerForTesting: (index, ms) => workers.blockForTesting(index, ms),
    crashWorkerForTesting: (index) => workers.crashForTesting(index),
  };
}

/** What the agent decides with, read at the start: rules, routes, the quota table. */
interface AgentInputs {
  readonly ruleSet: RuleSet;
  readonly snapshot: RulesSnapshot;
  /** The --routes file's routes; null: the default routes (without --http nothing uses them). */
  readonly routes: Routes | null;
  /** Started with --coordinators: every quota comes from the coordinator's entries. */
  readonly coordinated: boolean;
  readonly quotaFile: QuotaFile;
  readonly quotas: StaticQuotas;
  /** The coordinator's entries in force (filled by the lease client). */
  readonly overrides: QuotaOverrides;
}

async function loadInputs(config: AgentConfig, log: Logger, deadline: LeaseDeadline): Promise<AgentInputs> {
  const { ruleSet, snapshot } = await loadRulesWithSnapshot(config.rules, { mergeDomains: config.mergeDomains });
  // The routes and tenants files are validated with zod: their modules are imported only when the
  // file is given, so an agent without them does not hold zod (bench/agent-idle-rss.ts).
  const routes =
    config.routes === undefined ? null : await (await import('./front-door/routes.js')).loadRoutes(config.routes);
  // With coordinators every quota comes from them (CoordinatedQuotas over the lease client's
  // entries); alone, from the --tenants file at --static-share (the config refuses mixing the two).
  const coordinated = config.coordinators.length > 0;
  const quotaFile: QuotaFile =
    config.tenants === undefined
      ? { tiers: {}, tenants: {} }
      : await (await import('./decide/quota-file.js')).loadQuotaFile(config.tenants);
  const quotaOptions = { staticShare: config.staticShare, unknownTenant: config.unknownTenant };
  // A leased grant's floor takes over at the lease's end (quota-overrides.ts).
  const overrides = new QuotaOverrides(deadline);
  const quotas: StaticQuotas = coordinated
    ? new CoordinatedQuotas(overrides)
    : new StaticQuotas(quotaFile, quotaOptions);
  const zero = quotas.zeroSlices();
  if (zero.length > 0) {
    log.warn(
      { slices: zero, staticShare: config.staticShare },
      'these global quotas have a slice below one token at this static share: they refuse every request',
    );
  }
  if (!coordinated && ruleSet.rules.some((r) => r.global) && config.tenants === undefined) {
    log.warn(
      { unknownTenant: formatUnknownTenantPolicy(config.unknownTenant) },
      'the rules have global quotas but neither --coordinators nor a --tenants table was given: ' +
        'every tenant is unknown',
    );
  }
  return { ruleSet, snapshot, routes, coordinated, quotaFile, quotas, overrides };
}

/** What every thread attaches to: the buckets, the velocity window, the statistics, the lease's end. */
interface SharedMemory {
  readonly startNs: bigint;
  /** Now in ns on the buckets' clock. */
  readonly clock: () => bigint;
  readonly table: BucketTable;
  readonly velocityTable: VelocityTable;
  readonly velocityKeys: VelocityKeys;
  /** One statistics region per thread: the workers', then the main thread's. */
  readonly stats: StatsShared;
  /** The lease's end, read by every deciding thread (lease-deadline.ts) on the same clock as the buckets. */
  readonly deadline: LeaseDeadline;
}

function createSharedMemory(config: AgentConfig): SharedMemory {
  const startNs = process.hrtime.bigint();
  const table = new BucketTable({ capacity: config.tableCapacity, startNs });
  const velocityTable = VelocityTable.create({ capacity: config.velocityCapacity, startNs });
  const velocityKeys = new VelocityKeys(velocityTable);
  velocityTable.onNewKey = (slot, gen, key) => velocityKeys.learn(slot, gen, key);
  const stats = createStatsShared(config.workers + 1);
  return {
    startNs,
    clock: () => process.hrtime.bigint(),
    table,
    velocityTable,
    velocityKeys,
    stats,
    deadline: LeaseDeadline.create(),
  };
}

/** How every thread decides: the same options in the main thread and in each worker. */
interface DecisionSettings {
  readonly decider: DeciderOptions;
  readonly lag: LagGuardOptions;
  readonly overload: OverloadOptions;
}

function decisionSettings(config: AgentConfig): DecisionSettings {
  return {
    decider: {
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
    },
    lag: { thresholdMs: config.lagThresholdMs },
    overload: { policy: config.overloadPolicy, allowance: config.overloadAllowance },
  };
}

/** The main thread's own checks (HTTP API, forward-auth, an embedding gateway) and its throttling log. */
interface MainThreadCheck {
  readonly decider: Decider;
  readonly service: CheckService;
  readonly lag: LagGuard;
  readonly throttle: ThrottleCounts;
  readonly throttleLog: ThrottleLog;
  /** Warms the main thread's check path on `rules` and restarts its lag guard's count from now. */
  warmUp(rules: RuleSet): void;
}

function mainThreadCheck(
  config: AgentConfig,
  logger: Logger,
  inputs: AgentInputs,
  memory: SharedMemory,
  settings: DecisionSettings,
): MainThreadCheck {
  const { table, stats } = memory;
  const throttle = new ThrottleCounts();
  const throttleLog = new ThrottleLog(
    componentLogger(logger, 'throttle'),
    config.cell,
    config.throttleLogIntervalMs,
    () => {
      const t = readStats(stats);
      return {
        overloadMs: t.overloadMs,
        overloadEpisodes: t.overloadEpisodes,
        overloadRefused: t.overloadRefused.allowance + t.overloadRefused.shed,
        failOpenOverload: t.failOpen.overload,
      };
    },
  );
  const decider = new Decider(
    {
      table,
      quotas: inputs.quotas,
      clock: memory.clock,
      elapsed: new HrtimeClock(table.startNs),
      velocity: memory.velocityTable,
      onRefused: (key, hits, why) => throttle.add(key, hits, why),
      overrides: inputs.overrides,
      deadline: memory.deadline,
    },
    settings.decider,
  );
  decider.setRules(inputs.ruleSet);
  const writer = new StatsWriter(stats, config.workers);
  // On the decider's clock: a check's one reading serves its decision and the guard.
  const lag = new LagGuard(settings.lag, writer, decider.elapsedClock);
  const service = new CheckService(decider, writer, lag, componentLogger(logger, 'http'), {
    overload: settings.overload,
    allowances: overloadAllowances(settings.overload.allowance, table, throttle),
    throttle,
    cell: config.cell,
  });
  const log = componentLogger(logger, 'agent');
  const warmMain = (rules: RuleSet): void => {
    const warm = warmUp(
      rules,
      { quotas: inputs.quotas, overrides: inputs.overrides },
      settings.decider,
      settings.overload,
      log,
    );
    lag.reset();
    log.debug({ checks: warm.checks, ms: Math.round(warm.ms) }, 'main thread warmed up');
  };
  return { decider, service, lag, throttle, throttleLog, warmUp: warmMain };
}

/** Worker `index`'s init: the shared memory, the rules and the overrides in force now, its sockets. */
function workerInit(
  config: AgentConfig,
  index: number,
  at: {
    readonly inputs: AgentInputs;
    readonly memory: SharedMemory;
    readonly settings: DecisionSettings;
    readonly rules: RulesSnapshot;
  },
): WorkerInit {
  const { inputs, memory, settings } = at;
  return {
    index,
    cell: config.cell,
    logLevel: config.logLevel,
    table: memory.table.shared,
    velocity: memory.velocityTable.shared,
    stats: memory.stats,
    deadline: memory.deadline.shared,
    quotaFile: inputs.quotaFile,
    coordinated: inputs.coordinated,
    staticShare: config.staticShare,
    unknownTenant: config.unknownTenant,
    rules: at.rules,
    decider: settings.decider,
    lag: settings.lag,
    overload: settings.overload,
    listen: listenFor(config, index),
    throttleLogIntervalMs: config.throttleLogIntervalMs,
    overrides: inputs.overrides.entries(),
  };
}

/** Worker `index`'s sockets: `<rls-socket>` (worker 0) or `<rls-socket>.<index>`, TCP PORT + index. */
function listenFor(config: AgentConfig, index: number): RlsListenOptions {
  return {
    unix:
      config.rlsSocket === undefined
        ? undefined
        : {
            path: index === 0 ? config.rlsSocket : `${config.rlsSocket}.${index}`,
            mode: config.socketMode,
            uid: config.socketOwner?.uid,
            gid: config.socketOwner?.gid,
          },
    tcp:
      config.rlsListen === undefined
        ? undefined
        : { host: config.rlsListen.host, port: config.rlsListen.port === 0 ? 0 : config.rlsListen.port + index },
    maxMessageBytes: config.maxMessageBytes,
    server: config.rlsServer,
  };
}

interface HttpSources {
  readonly check: CheckService;
  readonly metrics: AgentMetrics;
  readonly inputs: AgentInputs;
  readonly workers: RlsWorkers;
  readonly rules: () => RuleSet;
  readonly lease: () => LeaseClient | null;
}

/** The HTTP API (--http): checks, forward-auth, the quotas in force, /metrics, /healthz. */
async function startHttp(
  config: AgentConfig,
  at: { readonly host: string; readonly port: number },
  logger: Logger,
  src: HttpSources,
): Promise<HttpApiHandle> {
  const { inputs, workers } = src;
  const { startHttpApi } = await import('./http/http-api.js');
  const routes = inputs.routes ?? (await import('./front-door/routes.js')).DEFAULT_ROUTES;
  return startHttpApi(
    {
      host: at.host,
      port: at.port,
      bodyLimit: config.httpBodyLimit,
      ...(config.forwardAuthSocket === undefined
        ? {}
        : {
            forwardAuthSocket: {
              path: config.forwardAuthSocket,
              mode: config.socketMode,
              uid: config.socketOwner?.uid,
              gid: config.socketOwner?.gid,
            },
          }),
    },
    {
      check: src.check,
      metrics: async () => ({
        contentType: src.metrics.registry.contentType,
        body: await src.metrics.registry.metrics(),
      }),
      quota: (key) => quotaInForce(key, inputs.overrides, inputs.coordinated ? null : inputs.quotas),
      health: () => {
        const serving = workers.serving;
        return {
          ok: serving === workers.size,
          details: {
            cell: config.cell,
            workers: { serving, total: workers.size },
            rules: src.rules().fingerprint,
            staticSlices: config.coordinators.length === 0,
            lease: src.lease()?.status() ?? null,
          },
        };
      },
      forwardAuth: {
        routes: () => routes,
        trusted: config.trustedProxies,
        denyStatus: config.forwardAuthDenyStatus,
      },
    },
    componentLogger(logger, 'http'),
  );
}

/** Hot reload: a changed rules file that compiles is applied (`apply`), a broken one keeps the last good rules. */
function watchAgentRules(
  config: AgentConfig,
  log: Logger,
  metrics: AgentMetrics,
  initial: RuleSet,
  apply: (next: RuleSet, snapshot: RulesSnapshot) => void,
): () => void {
  let current = initial;
  const applyRules = (next: RuleSet): void => {
    const snapshot = snapshotOf(next); // throws RulesChangedError: the watcher retries on the next change
    current = next;
    apply(next, snapshot);
    metrics.configReloads.inc({ result: 'success' });
    log.info(
      { fingerprint: next.fingerprint, files: next.files.length, domains: [...next.domains.keys()] },
      'rules reloaded',
    );
  };
  return watchRules(
    config.rules,
    applyRules,
    (error: RulesError, lastGood: RuleSet | null) => {
      if (error.cause instanceof RulesChangedError) {
        log.debug({ error: error.message }, 'rules changed while being read; waiting for the next change');
        return;
      }
      metrics.configReloads.inc({ result: 'failure' });
      log.error(
        { error: error.message, code: error.code, keeping: lastGood?.fingerprint ?? current.fingerprint },
        'rules reload failed; keeping the last good rules',
      );
    },
    { initial, debounceMs: config.rulesDebounceMs, mergeDomains: config.mergeDomains },
  );
}

function logStarted(
  config: AgentConfig,
  log: Logger,
  endpoints: AgentEndpoints,
  inputs: AgentInputs,
  rules: RuleSet,
): void {
  const alone = config.coordinators.length === 0;
  // With coordinators the agent has no tenants file, static share or unknown-tenant policy of its
  // own (they are refused), so the line names only what it does use.
  const quotaSource = alone
    ? {
        tenants: inputs.quotas.tenantCount,
        tiers: inputs.quotas.tierCount,
        staticShare: config.staticShare,
        unknownTenant: formatUnknownTenantPolicy(config.unknownTenant),
      }
    : {
        coordinators: config.coordinators.map((c) =>
          c.id === undefined ? coordinatorAddress(c) : `${c.id}=${coordinatorAddress(c)}`,
        ),
      };
  log.info(
    { cell: config.cell, endpoints, workers: config.workers, rules: rules.fingerprint, ...quotaSource },
    `cell agent started; ${alone ? AGENT_ALONE_NOTE : AGENT_COORDINATED_NOTE}`,
  );
}

/** loadRules, then the snapshot of exactly those files (retried if a file changes in between). */
async function loadRulesWithSnapshot(
  path: string,
  options: LoadRulesOptions,
): Promise<{ ruleSet: RuleSet; snapshot: RulesSnapshot }> {
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

/** What GET /v1/quotas/KIND/NAME answers: the coordinator's entry in force, else (alone) the static share. */
function quotaInForce(key: string, overrides: QuotaOverrides, quotas: StaticQuotas | null): QuotaInForce | null {
  const o = overrides.get(key);
  if (o !== undefined)
    return { key, source: o.unknown ? 'unknown-allowed' : o.leased ? 'leased' : 'floor', rate: o.rate, burst: o.burst };
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
