// Messages between the agent's main thread and its gRPC worker threads. Everything here is
// structured-cloneable; the shared memory (bucket table, velocity window, statistics) is passed once
// in WorkerInit and never copied.
import type { BucketTableShared } from './buckets/bucket-table.js';
import type { DeciderOptions } from './decide/decide.js';
import type { QuotaFile, UnknownTenantPolicy } from './decide/quotas.js';
import type { LagGuardOptions } from './observe/lag-guard.js';
import type { OverloadOptions } from './decide/overload.js';
import type { ThrottleDrain } from './observe/throttle-log.js';
import type { StatsShared } from './observe/stats.js';
import type { RulesSnapshot } from './agent-rules.js';
import type { RlsEndpoints, RlsListenOptions } from './rls/rls-server.js';
import type { VelocityShared } from './velocity/velocity-table.js';
import type { OverrideEntry } from './lease/quota-overrides.js';
import type { LeaseDeadlineShared } from './lease/lease-deadline.js';

export interface WorkerInit {
  readonly index: number;
  readonly cell: string;
  readonly logLevel: string;
  readonly table: BucketTableShared;
  readonly velocity: VelocityShared;
  readonly stats: StatsShared;
  /** The lease's end (lease-deadline.ts), written by the main thread's lease client. */
  readonly deadline: LeaseDeadlineShared;
  readonly quotaFile: QuotaFile;
  /** Started with --coordinators: every quota comes from the coordinator's entries (CoordinatedQuotas). */
  readonly coordinated: boolean;
  readonly staticShare: number;
  readonly unknownTenant: UnknownTenantPolicy;
  readonly rules: RulesSnapshot;
  readonly decider: DeciderOptions;
  readonly lag: LagGuardOptions;
  readonly overload: OverloadOptions;
  readonly listen: RlsListenOptions;
  readonly throttleLogIntervalMs: number;
  /** The leased grants (or floors) in force when the worker starts. */
  readonly overrides: readonly OverrideEntry[];
}

export type MainToWorker =
  | { readonly kind: 'rules'; readonly snapshot: RulesSnapshot }
  /** Changed global quota limits from the lease client; confirmed with 'overrides-applied'. */
  | { readonly kind: 'overrides'; readonly entries: readonly OverrideEntry[]; readonly seq: number }
  | { readonly kind: 'stop'; readonly graceMs: number }
  /** Testing and drills: block this worker's event loop for `ms` (induced overload). */
  | { readonly kind: 'block'; readonly ms: number }
  /** Testing: make this worker exit abruptly (supervision and restart). */
  | { readonly kind: 'crash' };

export type WorkerToMain =
  | { readonly kind: 'ready'; readonly endpoints: RlsEndpoints }
  | { readonly kind: 'fatal'; readonly message: string; readonly code: string | null }
  | { readonly kind: 'rules-applied'; readonly fingerprint: string }
  | { readonly kind: 'rules-failed'; readonly fingerprint: string; readonly message: string }
  | ({ readonly kind: 'throttle' } & ThrottleDrain)
  | { readonly kind: 'vkey'; readonly slot: number; readonly gen: number; readonly key: string }
  | { readonly kind: 'log'; readonly line: string }
  | { readonly kind: 'overrides-applied'; readonly seq: number }
  /** Testing: sent just before the worker blocks on a 'block' message. */
  | { readonly kind: 'blocking' }
  | { readonly kind: 'stopped' };
