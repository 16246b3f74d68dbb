// The agent's lease client (lease/lease-client.ts) wired into the agent: what it reports (the
// velocity window, the fail-open count), where its grants go (the overrides table, the buckets they
// re-configure, every worker: acknowledged only once all of them decide with them), the lease's end
// in shared memory, and its state as metrics.
import type { Logger } from '../shared/logging.js';
import { componentLogger } from '../shared/logging.js';
import type { AgentConfig } from './agent-config.js';
import type { RlsWorkers } from './agent-workers.js';
import type { BucketTable } from './buckets/bucket-table.js';
import { coordinatorAddress } from './agent-address.js';
import { LeaseClient } from './lease/lease-client.js';
import type { LeaseCredentials } from './lease/lease-credentials.js';

export { loadLeaseCredentials } from './lease/lease-credentials.js';
import { deadlineWriter, monotonicMsOf } from './lease/lease-deadline.js';
import type { LeaseDeadline } from './lease/lease-deadline.js';
import { applyLeaseEntries } from './lease/quota-overrides.js';
import type { ClampedEntry, QuotaOverrides } from './lease/quota-overrides.js';
import type { LeaseMetrics } from './observe/lease-metrics.js';
import { readStats } from './observe/stats.js';
import type { StatsShared } from './observe/stats.js';
import type { VelocityKeys } from './velocity/velocity-table.js';

export interface AgentLeaseDeps {
  readonly table: BucketTable;
  readonly overrides: QuotaOverrides;
  readonly workers: RlsWorkers;
  readonly velocityKeys: VelocityKeys;
  readonly stats: StatsShared;
  readonly deadline: LeaseDeadline;
  /** The deciders' clock (ns) and its zero. */
  readonly clock: () => bigint;
  readonly startNs: bigint;
  readonly metrics: LeaseMetrics;
}

/** Starts the lease client of an agent with --coordinators. */
export function startAgentLease(
  config: AgentConfig,
  creds: LeaseCredentials,
  deps: AgentLeaseDeps,
  logger: Logger,
): LeaseClient {
  const log = componentLogger(logger, 'agent');
  if (creds.token !== null && config.tlsCa === undefined) {
    log.warn(
      'the lease token is sent without TLS (no --tls-ca): ' +
        'only where the network path is encrypted otherwise (a mesh, a tunnel)',
    );
  }
  log.info({ leaseCredentials: creds.describe }, 'lease client credentials');
  const { table, overrides, workers, clock } = deps;
  const client = new LeaseClient({
    cellId: config.cell,
    credentials: creds.channel,
    channelOptions: creds.channelOptions,
    token: creds.token,
    ...(creds.noIdentityHint === undefined ? {} : { failureHint: creds.noIdentityHint }),
    coordinators: config.coordinators.map(coordinatorAddress),
    coordinatorById: new Map(
      config.coordinators.flatMap((c) => (c.id === undefined ? [] : [[c.id, coordinatorAddress(c)] as const])),
    ),
    logger: componentLogger(logger, 'lease'),
    velocity: () => deps.velocityKeys.snapshot(clock()),
    failOpenTotal: () => Object.values(readStats(deps.stats).failOpen).reduce((a, b) => a + b, 0),
    monotonicMs: monotonicMsOf(clock, deps.startNs),
    deadline: deadlineWriter(deps.deadline, deps.startNs),
    onOverrides: async (entries): Promise<ClampedEntry[]> => {
      const clamped = applyLeaseEntries(table, overrides, entries, clock());
      await workers.postOverrides(entries);
      return clamped;
    },
    onStateChange: (state) => deps.metrics.stateChanged(state),
    maxKeys: config.maxLeaseKeys,
  });
  client.start();
  return client;
}
