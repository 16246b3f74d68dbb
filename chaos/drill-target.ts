// The contract between the drill runner (drill-runner.ts) and what it drills: the deployment started
// here (local-deployment.ts) or one reached by address (remote-deployment.ts).
import type { AgentLeaseStatus } from './agent-lease-probe.js';

/** What a drill runs against: the tenant it loads and the cells and coordinators it watches. */
export interface DrillSpec {
  readonly cells: readonly string[];
  readonly coordinators: readonly string[];
  readonly tenant: string;
  readonly domain: string;
  /** The tenant's quota (req/s) and burst: the bound is quota·1 s + burst. */
  readonly quota: number;
  readonly burst: number;
  /** Offered req/s per cell, in the order of `cells`. */
  readonly offered: readonly number[];
  /** The tenant's fail-open allowance summed over the cells (docs/quota-model.md "The bound"): the
   * agents' --overload-allowance × their floors, and its depth. Null when not known (a deployment
   * reached by address): fail-open answers are then only counted apart. */
  readonly failOpenAllowance?: { readonly rate: number; readonly depth: number } | null;
  /** The tier of the tenants the operators' writes go to (null: no admin writes). */
  readonly adminTier: string | null;
  /** Bearer token for admin writes (null: none). */
  readonly adminToken: string | null;
}

/**
 * The deployments started and not yet stopped (a deployment adds itself when it starts processes and removes itself
 * in stop()): what the drill runner stops when it is interrupted (SIGINT, SIGTERM).
 */
export const runningTargets = new Set<{ stop(): Promise<void> }>();

/** Stops every running deployment (each at most once at a time); resolves when all stopped, whatever failed. */
export async function stopRunningTargets(): Promise<void> {
  await Promise.allSettled([...runningTargets].map((t) => t.stop()));
}

/** The deployment under a drill: the local one (local-deployment.ts) or one reached by address
 * (remote-deployment.ts). */
export interface DrillTarget {
  readonly spec: DrillSpec;
  start(progress: (msg: string) => void): Promise<void>;
  stop(): Promise<void>;
  /** Where each cell's RLS server listens (a Unix socket path or host:port), in the order of cells. */
  rlsTargets(): string[];
  /** Admin URLs of the replicas that may answer now. */
  adminUrls(): string[];
  agentQuota(cell: string, timeoutMs: number): Promise<{ source: string; rate: number; burst: number } | null>;
  /** The cell's lease client as its agent reports it (null: no answer, or no coordinators). */
  agentLease(cell: string, timeoutMs: number): Promise<AgentLeaseStatus | null>;
  leader(timeoutMs: number): Promise<string | null>;
  waitForLeader(timeoutMs: number): Promise<string>;
}
