// Loads proto/lease.proto once and exposes the QuotaLease service definition with typed messages.
// Used by the coordinator's lease service and by the cell agent's lease client (shared/, so both
// can import it).
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

export const QUOTA_LEASE_SERVICE = 'cellquota.lease.v1.QuotaLease';

/** Trailers of a FAILED_PRECONDITION answer from a replica that is not the leader ('' when unknown). */
export const LEADER_ID_TRAILER = 'cellquota-leader-id';
export const LEADER_ADDRESS_TRAILER = 'cellquota-leader-address';

export interface AckMessage {
  key: string;
  epoch: number;
}
export interface VelocityMessage {
  key: string;
  allowedPerS: number;
  refusedPerS: number;
}
export interface ReportRequestMessage {
  cellId: string;
  incarnation: string;
  sentAtMs: number;
  acks: AckMessage[];
  velocity: VelocityMessage[];
  /** Fail-open answers of this agent incarnation so far (a counter; decoded as 0 when absent). */
  failOpenTotal?: number;
  /** The capped-domain list version the agent holds (decoded as 0 when absent). */
  capsVersion?: number;
  /** The agent asks for every slice of its cell (decoded as false when absent). */
  wantFull?: boolean;
  /** The demand sweep this report belongs to (velocity-report.ts; 0 from agents without sweeps). */
  velocitySweep?: number;
  /** This report ends its sweep: the leader drops the cell's demand the sweep did not restamp. */
  velocitySweepDone?: boolean;
  /** This report is its sweep's first page. */
  velocitySweepStart?: boolean;
  /** The agent takes answers in pages (more, answerSeq, fullPicture; decoded as false when absent). */
  pagedAnswers?: boolean;
  /** Keys the agent holds nothing for any more, with the highest epoch it saw (decoded as [] when absent). */
  released?: AckMessage[];
}
export interface GrantMessage {
  key: string;
  rate: number;
  burst: number;
  epoch: number;
  floorRate: number;
  floorBurst: number;
  version: number;
  parent: string;
  deleted: boolean;
}
export interface ReportResponseMessage {
  leaderId: string;
  leaseTtlMs: number;
  grants: GrantMessage[];
  ledgerIndex: number;
  unknownTenant: string;
  unknownKeys: string[];
  capsIncluded: boolean;
  capsVersion: number;
  cappedDomains: string[];
  full: boolean;
  /** The leader holds no complete demand picture of this agent incarnation: sweep (decoded false when absent). */
  velocityResync?: boolean;
  /** Paged answers: grants wait that did not fit this answer (decoded false when absent). */
  more?: boolean;
  /** Paged answers: this session's count of answers (a gap: an answer lost). */
  answerSeq?: number;
  /** Paged answers: the answerSeq of the first page of the full picture this answer belongs to (0: none). */
  fullPicture?: number;
  /** The leader takes ReportRequestMessage.released (decoded false when absent). */
  releases?: boolean;
  /**
   * The session does not drop released slices yet: the agent keeps the releases this report carried and sends
   * them again after an answer without the flag (decoded false when absent).
   */
  releasesParked?: boolean;
}

export interface QuotaLeaseService {
  readonly definition: grpc.ServiceDefinition;
  readonly report: grpc.MethodDefinition<ReportRequestMessage, ReportResponseMessage>;
}

/** Finds proto/lease.proto walking up from this module (works from the sources and from dist/). */
export function findLeaseProto(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    const candidate = join(dir, 'proto', 'lease.proto');
    if (existsSync(candidate)) return candidate;
    const parent = dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  throw new Error('proto/lease.proto not found above ' + dirname(fileURLToPath(import.meta.url)));
}

let cached: QuotaLeaseService | undefined;

export function loadQuotaLeaseService(protoPath: string = findLeaseProto()): QuotaLeaseService {
  if (cached !== undefined) return cached;
  const pkg = protoLoader.loadSync(protoPath, {
    keepCase: false,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const def = pkg[QUOTA_LEASE_SERVICE];
  if (def === undefined || !('Report' in def)) throw new Error(`${protoPath} does not define ${QUOTA_LEASE_SERVICE}`);
  const definition = def as grpc.ServiceDefinition;
  cached = {
    definition,
    report: definition['Report'] as grpc.MethodDefinition<ReportRequestMessage, ReportResponseMessage>,
  };
  return cached;
}
