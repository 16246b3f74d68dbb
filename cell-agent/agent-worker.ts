// A gRPC serving thread of the agent (started by agent-main.ts, one per --workers). It attaches the
// shared bucket table, velocity window and statistics, compiles the rules snapshot it was given,
// and serves the RLS and health services on its own Unix socket and/or TCP port. Logs go to the main
// thread (one logger for the whole agent); throttling counts and new velocity keys too.
import { parentPort, workerData } from 'node:worker_threads';
import type { MessagePort } from 'node:worker_threads';
import { pino } from 'pino';
import { HrtimeClock } from './buckets/elapsed-clock.js';
import { BucketTable } from './buckets/bucket-table.js';
import { CheckService, overloadAllowances } from './decide/check-service.js';
import { Decider } from './decide/decide.js';
import { warmUp } from './rls/warm-up.js';
import { warmUpTransport } from './rls/warm-up-transport.js';
import { CoordinatedQuotas, StaticQuotas } from './decide/quotas.js';
import { QuotaOverrides, applyLeaseEntries } from './lease/quota-overrides.js';
import { LeaseDeadline } from './lease/lease-deadline.js';
import { LagGuard } from './observe/lag-guard.js';
import { StatsWriter } from './observe/stats.js';
import { ThrottleCounts } from './observe/throttle-log.js';
import { compileSnapshot } from './agent-rules.js';
import type { MainToWorker, WorkerInit, WorkerToMain } from './agent-protocol.js';
import { encodeRateLimitResponse } from './rls/rls-codec.js';
import { startRlsServer } from './rls/rls-server.js';
import type { RlsServerHandle } from './rls/rls-server.js';
import { VelocityTable } from './velocity/velocity-table.js';

if (parentPort === null) throw new Error('agent-worker.ts runs as a worker thread');
const port: MessagePort = parentPort;
const init = workerData as WorkerInit;
const send = (m: WorkerToMain): void => port.postMessage(m);

const logger = pino(
  { level: init.logLevel, base: { worker: init.index }, timestamp: pino.stdTimeFunctions.isoTime },
  { write: (line: string) => send({ kind: 'log', line }) },
);

async function main(): Promise<void> {
  let server: RlsServerHandle | null = null;
  let throttleTimer: NodeJS.Timeout | null = null;
  const stats = new StatsWriter(init.stats, init.index);
  let lag: LagGuard | null = null;
  try {
    const table = BucketTable.attach(init.table);
    const velocity = VelocityTable.attach(init.velocity);
    velocity.onNewKey = (slot, gen, key) => send({ kind: 'vkey', slot, gen, key });
    const throttle = new ThrottleCounts();
    const deadline = LeaseDeadline.attach(init.deadline);
    const overrides = new QuotaOverrides(deadline);
    overrides.apply(init.overrides);
    const quotas = init.coordinated
      ? new CoordinatedQuotas(overrides)
      : new StaticQuotas(init.quotaFile, { staticShare: init.staticShare, unknownTenant: init.unknownTenant });
    const decider = new Decider(
      {
        table,
        quotas,
        clock: () => process.hrtime.bigint(),
        elapsed: new HrtimeClock(table.startNs),
        velocity,
        onRefused: (key, hits, why) => throttle.add(key, hits, why),
        overrides,
        deadline,
      },
      init.decider,
    );
    const rules = compileSnapshot(init.rules);
    decider.setRules(rules);
    // Warm the hot path before binding the sockets (no connection can reach this thread before it
    // decides at full speed: a fresh or restarted worker gives no fail-open in its first seconds).
    const warm = warmUp(rules, { quotas, overrides }, init.decider, init.overload, logger);
    const wire =
      init.listen.server === 'grpc-js'
        ? null
        : await warmUpTransport(warm.service, warm.requests, logger, {
            ...(init.listen.unix === undefined ? {} : { unixBeside: init.listen.unix.path }),
          });
    logger.debug(
      {
        checks: warm.checks,
        ms: Math.round(warm.ms),
        transportCalls: wire?.calls ?? 0,
        transportMs: Math.round(wire?.ms ?? 0),
      },
      'warmed up',
    );
    // On the decider's clock: a check's one reading serves its decision and the guard.
    const guard = new LagGuard(init.lag, stats, decider.elapsedClock);
    lag = guard;
    const service = new CheckService(decider, stats, guard, logger, {
      overload: init.overload,
      allowances: overloadAllowances(init.overload.allowance, table, throttle),
      throttle,
      cell: init.cell,
      // The lean server answers the overload path's constants from their encoding, made once.
      encode: (response) => encodeRateLimitResponse(response, true),
    });
    // No releaseStartupMemory here: this thread answers checks, and after the inspector's collection
    // every object literal with symbol keys (node's process.nextTick makes one per tick, ~8 a check)
    // is built on a slow path for the thread's life (shared/release-memory.ts). The young generation
    // that warm-up grew is bounded instead by the thread's resource limits (--worker-young-generation-mb).
    guard.start();
    server = await startRlsServer(service, init.listen, logger);
    const flushThrottle = (): void => {
      if (!throttle.empty) send({ kind: 'throttle', ...throttle.drain() });
    };
    // At most every second (only when there is something), so the per-quota fail-open metric in the
    // main thread is current; the log lines are still written once per interval there.
    throttleTimer = setInterval(flushThrottle, Math.min(init.throttleLogIntervalMs, 1000));
    throttleTimer.unref();

    const running = server;
    port.on('message', (m: MainToWorker) => {
      switch (m.kind) {
        case 'rules':
          try {
            decider.setRules(compileSnapshot(m.snapshot));
            send({ kind: 'rules-applied', fingerprint: m.snapshot.fingerprint });
          } catch (error) {
            send({
              kind: 'rules-failed',
              fingerprint: m.snapshot.fingerprint,
              message: error instanceof Error ? error.message : String(error),
            });
          }
          return;
        case 'overrides':
          // As the main thread applies them: existing buckets re-configured at once (quota-overrides.ts).
          try {
            applyLeaseEntries(table, overrides, m.entries, process.hrtime.bigint());
          } catch (error) {
            logger.error({ err: error }, 'applying the lease entries');
          }
          send({ kind: 'overrides-applied', seq: m.seq });
          return;
        case 'block': {
          send({ kind: 'blocking' });
          const until = Date.now() + m.ms;
          while (Date.now() < until) {
            // busy: the event loop is blocked, as under CPU starvation or a long GC pause
          }
          return;
        }
        case 'crash':
          process.exit(70);
          return;
        case 'stop':
          guard.stop();
          if (throttleTimer !== null) clearInterval(throttleTimer);
          flushThrottle();
          void running.stop(m.graceMs).then(() => {
            send({ kind: 'stopped' });
            port.close();
          });
          return;
      }
    });
    send({ kind: 'ready', endpoints: server.endpoints });
  } catch (error) {
    lag?.stop();
    if (throttleTimer !== null) clearInterval(throttleTimer);
    if (server !== null) await server.stop(0);
    const code =
      typeof error === 'object' && error !== null && typeof (error as { code?: unknown }).code === 'string'
        ? (error as { code: string }).code
        : null;
    send({ kind: 'fatal', message: error instanceof Error ? error.message : String(error), code });
    port.close();
  }
}

void main();
