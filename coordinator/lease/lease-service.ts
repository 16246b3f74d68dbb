// The agents' lease service (cellquota.lease.v1.QuotaLease/Report), registered on the coordinator's
// gRPC server: the same host:port as the Raft peers, or its own (`--lease-listen`).
//
// Who speaks (lease-auth.ts): with client certificates or per-cell tokens configured, a report for
// cell X is taken only from X's identity; anything else is refused (UNAUTHENTICATED or
// PERMISSION_DENIED, counted through onRefused) before it is looked at, on any replica. A removed
// cell's reports are refused (PERMISSION_DENIED) until it is dropped; a cell beyond the cell bound
// is not registered (RESOURCE_EXHAUSTED); demand keys beyond the per-cell bound are not kept.
//
// On the leader, each report is held until the next round (default every 100 ms) has COMMITTED:
//   1. cells never seen are registered (one registerCell entry each, once);
//   2. ONE reportAndGrant entry carries, for the cells that reported since the last round, the lease
//      renewals (expiry = the coordinator's receipt time of the cell's latest report + the lease TTL),
//      the acknowledgements that still change something, and the grants the policy computes (by
//      default the allocator) from the committed ledger and the cells' reported velocities;
//   3. once it is applied, every held report is answered from the committed ledger: the lease TTL and
//      the cell's grants newer than what the agent acknowledged (all of them for an agent incarnation
//      this leader has not seen: a restarted agent, or any agent after a leader change).
// Answering only after the commit is what makes the agent's lease safe: the agent times its lease
// from when it SENT the report, so it ends no later than receipt + TTL, which the ledger already
// holds, and the ledger releases the cell's grants only after that expiry plus its skew margin.
// Rounds are shorter than the agents' sync interval (100 ms vs 500 ms) so a report waits at most one
// round plus one commit, well within the agent's deadline (below its interval).
//
// If the policy's grants are refused (QUOTA_EXCEEDED: the state moved under it, e.g. an operator
// changed a quota), the round is proposed again without grants, so leases are still renewed.
// Periodically (default every second) the leader also proposes expireLeases when some cell's lease
// has surely expired, so the grants of silent cells are released even when nobody reports.
//
// Times: every time this service stamps (receipts, each command's nowMs) comes from a LeaderClock
// (leader-clock.ts): this process's monotonic clock, adopted to the ledger's frame after a read
// barrier at the start of each term of ours, and held at the ledger's time for the first TTL +
// margin of the term, so no offset between two coordinators' clocks can release a lease early.
//
// A follower (or a node that knows no leader) answers FAILED_PRECONDITION with the leader's id and
// address in the trailers. Nothing in memory matters for safety: a new leader starts with empty
// sessions (it sends every grant again) and demands (they come back with the next reports).
import * as grpc from '@grpc/grpc-js';
import type { Ledger, LedgerResult } from '../ledger/ledger.js';
import type { Grant, GrantAck, LedgerCommandInput, LeaseRenewal } from '../ledger/ledger-commands.js';
import {
  isName,
  MAX_CELLS,
  MAX_DROPS_PER_COMMAND,
  QUOTA_KEY_PATTERN,
  RELEASED_SLICES_FORMAT,
  REVIVE_IMPLICIT_FORMAT,
} from '../ledger/ledger-commands.js';
import type { SliceRelease } from '../ledger/ledger-commands.js';
import type { UnknownTenantPolicyName } from '../ledger/ledger-commands.js';
import type { Logger } from '../../shared/logging.js';
import { createAllocatorPolicy } from './incremental-policy.js';
import { DEFAULT_IMPLICIT_TENANT_IDLE_MS, DEFAULT_MAX_IMPLICIT_TENANTS, ImplicitTenants } from './implicit-tenants.js';
import type { GrantPolicy } from './grant-policy.js';
import { sameSliceNextEpoch } from './grant-policy.js';
import { LeaderClock } from './leader-clock.js';
import { planted } from '../../shared/planted-bugs.js';
import type { LeaseAuthenticator } from './lease-auth.js';
import { LEADER_ADDRESS_TRAILER, LEADER_ID_TRAILER, loadQuotaLeaseService } from '../../shared/lease-proto.js';
import type { GrantMessage, ReportRequestMessage, ReportResponseMessage } from '../../shared/lease-proto.js';

export const DEFAULT_LEASE_TTL_MS = 3_000;
export const DEFAULT_ROUND_MS = 100;
export const DEFAULT_EXPIRE_EVERY_MS = 1_000;
/** Most acknowledgements and velocity entries one report may carry. */
export const MAX_REPORT_ITEMS = 100_000;
/**
 * Demand moves up to max(MIN_DEMAND_DEAD_BAND req/s, DEMAND_DEAD_BAND_FRACTION × quota rate) are not taken
 * (noteDemand).
 */
export const DEMAND_DEAD_BAND_FRACTION = 0.005;
export const MIN_DEMAND_DEAD_BAND = 0.01;
/** Default bound on the demand keys the leader keeps per cell (--max-demand-keys). */
export const DEFAULT_MAX_DEMAND_KEYS = 100_000;

/** Why the service refused a report before any round (the refusal metric's `reason` label). */
export type LeaseRefusalReason = 'unauthenticated' | 'permission_denied' | 'cell_removed' | 'too_many_cells';

/** What the lease service needs of a coordinator replica (CoordinatorNode fits). */
export interface LeaseBackend {
  readonly id: string;
  isLeader(): boolean;
  leaderId(): string | null;
  /** The current Raft term: a term of ours starts a new LeaderClock grace. */
  term(): number;
  /** Resolves once the ledger reflects every entry committed before the call (a ReadIndex barrier). */
  readBarrier(): Promise<void>;
  /** The gRPC (peer) address of a member, null if unknown. */
  peerAddress(id: string): string | null;
  ledger(): Ledger;
  propose(cmd: LedgerCommandInput): Promise<LedgerResult>;
  /** Whether every other member reads command format `format` (absent: all do). */
  everyMemberReads?(format: number): boolean;
}

export interface LeaseServiceOptions {
  readonly backend: LeaseBackend;
  readonly logger: Logger;
  readonly leaseTtlMs?: number;
  readonly roundMs?: number;
  readonly expireEveryMs?: number;
  readonly policy?: GrantPolicy;
  /** Monotonic clock in ms (default performance.now; tests). */
  readonly monoMs?: () => number;
  /** Wall clock in ms, read once to anchor the monotonic one (default Date.now; tests). */
  readonly wallMs?: () => number;
  /**
   * Told every well-formed report the leader accepts, with its receipt time on the wall clock (the live view, the
   * overshoot).
   */
  readonly onReport?: (req: ReportRequestMessage, receiptMs: number) => void;
  /** Who may report for which cell; absent: anyone (no certificates, no tokens configured). */
  readonly auth?: LeaseAuthenticator | null;
  /** Told every refused report (a metric). */
  readonly onRefused?: (reason: LeaseRefusalReason) => void;
  /** The lease address of a member for the not-leader trailers (default: its peer address). */
  readonly leaseAddressOf?: (id: string) => string | null;
  /** Most cells that may register (default: the ledger's MAX_CELLS). */
  readonly maxCells?: number;
  /** Most demand keys kept per cell (default DEFAULT_MAX_DEMAND_KEYS). */
  readonly maxDemandKeys?: number;
  /** Most implicit tenants (policy tier:NAME) the ledger holds (default DEFAULT_MAX_IMPLICIT_TENANTS). */
  readonly maxImplicitTenants?: number;
  /** An implicit tenant without demand this long is wound down (default DEFAULT_IMPLICIT_TENANT_IDLE_MS). */
  readonly implicitTenantIdleMs?: number;
}

interface PendingReport {
  readonly req: ReportRequestMessage;
  /** This service's time at receipt (raised to the ledger's clock when the term's clock syncs). */
  receiptMs: number;
  /**
   * Its answer says releases_parked: the session took its releases (no resend) but drops no slice yet (its first
   * TTL + skew margin), so the agent sends them again once an answer comes without the flag.
   */
  releasesParked: boolean;
  readonly resolve: (r: ReportResponseMessage) => void;
  readonly reject: (e: grpc.ServiceError | Error) => void;
}

interface CellSession {
  incarnation: string;
  /** Quota key → the highest epoch the agent acknowledged. */
  readonly acked: Map<string, number>;
  /**
   * Keys granted to the cell that the agent has not acknowledged yet → the answer (this session's
   * count) that last carried the key's current grant, 0 if none did: what the next answers carry.
   */
  readonly outstanding: Map<string, number>;
  /** Answers given to this session. */
  answers: number;
  /** A full picture being sent in pages (paged answers): the cell's slice keys, how many were sent, the
   * answer that began it. */
  full: string[] | null;
  fullAt: number;
  fullSince: number;
  /** Tenant keys already named in unknown_keys to this incarnation. */
  readonly toldUnknown: Set<string>;
  /**
   * Keys the agent released (ReportRequest.released: it holds nothing for them): not sent to it (no resend,
   * not in full pictures) until the cell reports demand for the key again or the policy grants it anew.
   */
  readonly released: Set<string>;
  /**
   * Releases to drop from the ledger (dropReleasedSlices, from command format 7): key → the epoch released, the
   * slice's current epoch when it was taken. Left out (the slice stays counted, as before) when the key is sent to
   * the agent again, asked for again, or the session ends; emptied into the rounds' entries, MAX_DROPS_PER_COMMAND a
   * round, and the key leaves `released` with its dropped slice.
   */
  readonly toDrop: Map<string, number>;
  /**
   * Key → the highest epoch this incarnation released to this session (trusted or not). A slice at or below it is never
   * sent to the session again: it is granted anew one epoch higher (`regrant`) and sent then. So no release can name
   * an epoch the agent took back after releasing it, and a late copy of a report (a timed-out report overtaken by its
   * retry, a report processed below format 7) can drop only a slice the agent gave back. Entries go when a higher
   * epoch is sent or the slice is dropped; bounded by the cell's slices.
   */
  readonly releasedEpochs: Map<string, number>;
  /** Keys whose slice the next round grants one epoch higher, same numbers (see releasedEpochs). */
  readonly regrant: Set<string>;
  /**
   * From this time on (this service's clock) the session's releases may drop slices, once it answered the
   * incarnation before: TTL + skew margin after the session began (a copy of a report sent before it — to an earlier
   * leader, or by a dead incarnation — could name an epoch the live agent took back since, from an earlier leader or
   * from this session's first full picture; every copy of a report is assumed to reach the leader within that span,
   * and one that arrives in it is only recorded in releasedEpochs); never for an incarnation another replaced this term
   * (it may be that late copy).
   */
  dropsFromMs: number;
  /** Nothing answered to this session yet: the first answer carries every slice of the cell. */
  fresh: boolean;
  /** The demand sweep whose first page this session received (0: none). */
  sweepStarted: number;
  /** A whole demand sweep of this incarnation reached this session: the demands are complete. */
  swept: boolean;
}

/**
 * Most grants one answer to an agent with paged answers carries (≈ 80 bytes each: ≈ 400 KB); the rest
 * follow in the next answers, which the agent asks for at once. Bounds what building, sending and
 * applying one answer costs, whatever the number of slices a cell holds. Before, a full picture was
 * one answer with every slice of the cell (8 MB at 100,000), and each lapse of the agent's lease asked
 * for one again: in `npm run bench -- agent-tenants` the full answers grew with the tenants seen
 * (10,000 slices took 0.2-0.7 s to build on a loaded machine), ran past the agent's deadline, the lease
 * lapsed again, and from some size on the agent never held a grant.
 */
export const MAX_ANSWER_GRANTS = 5_000;
/** With paged answers, a grant not acknowledged is carried again this many answers after the last that carried it. */
export const RESEND_AFTER_ANSWERS = 4;

/** Most keys a session remembers having named unknown (beyond: forgotten, named again). */
const MAX_TOLD_UNKNOWN = 100_000;

export interface LeaseServiceStats {
  rounds: number;
  refusedRounds: number;
  failedRounds: number;
  reports: number;
  notLeader: number;
  grantsProposed: number;
  refused: number;
  /** Demand entries not kept because the cell had --max-demand-keys already. */
  demandKeysDropped: number;
  /** Demand entries of new implicit tenants not taken: --max-implicit-tenants were held (treated as deny). */
  implicitTenantsRefused: number;
  /** Idle implicit tenants proposed for winding down. */
  implicitTenantsRetired: number;
  /** Winding-down tenant keys taken back as implicit tenants because cells asked for them again. */
  implicitTenantsRevived: number;
  /** Slices dropped from the ledger because their cell's agent released them (dropReleasedSlices). */
  releasedSlicesDropped: number;
  /** Releases taken while their session dropped no slice yet, which the agent sends again later (releases_parked). */
  releasesParked: number;
}

function statusError(code: grpc.status, details: string, trailers?: grpc.Metadata): grpc.ServiceError {
  const e = new Error(details) as grpc.ServiceError;
  e.code = code;
  e.details = details;
  e.metadata = trailers ?? new grpc.Metadata();
  return e;
}

export class LeaseService {
  readonly stats: LeaseServiceStats = {
    rounds: 0,
    refusedRounds: 0,
    failedRounds: 0,
    reports: 0,
    notLeader: 0,
    grantsProposed: 0,
    refused: 0,
    demandKeysDropped: 0,
    implicitTenantsRefused: 0,
    implicitTenantsRetired: 0,
    implicitTenantsRevived: 0,
    releasedSlicesDropped: 0,
    releasesParked: 0,
  };
  private readonly backend: LeaseBackend;
  private readonly log: Logger;
  private readonly ttl: number;
  private readonly roundMs: number;
  private readonly expireEveryMs: number;
  private readonly policy: GrantPolicy;
  private readonly clock: LeaderClock;
  /** The term whose LeaderClock grace is running (null: not leader); barrier: its read barrier in flight. */
  private term: number | null = null;
  private barrier: Promise<void> | null = null;
  private readonly onReport: ((req: ReportRequestMessage, receiptMs: number) => void) | undefined;
  private pending: PendingReport[] = [];
  private readonly sessions = new Map<string, CellSession>();
  /** Per cell, the incarnations whose session another replaced this term (their releases drop nothing again). */
  private readonly replacedIncarnations = new Map<string, Set<string>>();
  /** Quota key → cell → demand (req/s), as the policy sees it (moves within the dead-band are not taken). */
  private readonly byKey = new Map<string, Map<string, number>>();
  /** Cell → its keys in byKey with the demand sweep that last stamped each (bounded by maxDemandKeys). */
  private readonly demandKeysOfCell = new Map<string, Map<string, number>>();
  /** Keys whose demand changed since the last round; null: the demands were forgotten (a new term). */
  private changedKeys: Set<string> | null = null;
  private roundTimer: NodeJS.Timeout | null = null;
  private expireTimer: NodeJS.Timeout | null = null;
  private inRound = false;
  private wasLeader = false;
  /** The unknown-tenant policy the sessions' toldUnknown sets were built under. */
  private unknownPolicy: UnknownTenantPolicyName | null = null;
  private server: grpc.Server | null = null;
  private readonly auth: LeaseAuthenticator | null;
  private readonly onRefused: ((reason: LeaseRefusalReason) => void) | undefined;
  private readonly leaseAddressOf: (id: string) => string | null;
  private readonly maxCells: number;
  private readonly maxDemandKeys: number;
  private readonly implicit: ImplicitTenants;
  /** Refusal log lines: at most one per cell and reason every 10 s. */
  private readonly refusalLogged = new Map<string, number>();

  constructor(opts: LeaseServiceOptions) {
    this.backend = opts.backend;
    this.log = opts.logger;
    this.ttl = opts.leaseTtlMs ?? DEFAULT_LEASE_TTL_MS;
    this.roundMs = opts.roundMs ?? DEFAULT_ROUND_MS;
    this.expireEveryMs = opts.expireEveryMs ?? DEFAULT_EXPIRE_EVERY_MS;
    this.policy = opts.policy ?? createAllocatorPolicy();
    this.onReport = opts.onReport;
    this.auth = opts.auth ?? null;
    this.onRefused = opts.onRefused;
    this.leaseAddressOf = opts.leaseAddressOf ?? ((id) => this.backend.peerAddress(id));
    this.maxCells = opts.maxCells ?? MAX_CELLS;
    this.maxDemandKeys = opts.maxDemandKeys ?? DEFAULT_MAX_DEMAND_KEYS;
    this.implicit = new ImplicitTenants(
      opts.maxImplicitTenants ?? DEFAULT_MAX_IMPLICIT_TENANTS,
      opts.implicitTenantIdleMs ?? DEFAULT_IMPLICIT_TENANT_IDLE_MS,
    );
    this.clock = new LeaderClock({ monoMs: opts.monoMs ?? (() => performance.now()), wallMs: opts.wallMs ?? Date.now });
  }

  /** This service's time (its LeaderClock; the frame every receipt and command of its term uses). */
  now(): number {
    return this.clock.time();
  }

  /** Registers QuotaLease on `server` and starts the round and expiry timers. */
  register(server: grpc.Server): void {
    const svc = loadQuotaLeaseService();
    server.addService(svc.definition, {
      Report: ((
        call: grpc.ServerUnaryCall<ReportRequestMessage, ReportResponseMessage>,
        cb: grpc.sendUnaryData<ReportResponseMessage>,
      ) => this.handleReport(call, cb)) as grpc.handleUnaryCall<ReportRequestMessage, ReportResponseMessage>,
    });
    this.server = server;
    this.roundTimer = setInterval(() => void this.round(), this.roundMs);
    this.expireTimer = setInterval(() => void this.expire(), this.expireEveryMs);
    this.roundTimer.unref();
    this.expireTimer.unref();
  }

  /** Stops the timers, fails held reports and removes the service from the server. */
  stop(): void {
    if (this.roundTimer !== null) clearInterval(this.roundTimer);
    if (this.expireTimer !== null) clearInterval(this.expireTimer);
    this.roundTimer = null;
    this.expireTimer = null;
    this.failPending(statusError(grpc.status.UNAVAILABLE, 'coordinator stopping'));
    if (this.server !== null) this.server.removeService(loadQuotaLeaseService().definition);
    this.server = null;
  }

  private notLeaderError(): grpc.ServiceError {
    const leader = this.backend.leaderId();
    const md = new grpc.Metadata();
    const known = leader !== null && leader !== this.backend.id ? leader : null;
    md.set(LEADER_ID_TRAILER, known ?? '');
    md.set(LEADER_ADDRESS_TRAILER, known === null ? '' : (this.leaseAddressOf(known) ?? ''));
    return statusError(
      grpc.status.FAILED_PRECONDITION,
      known === null ? 'not the leader; no leader known' : `not the leader; the leader is ${known}`,
      md,
    );
  }

  private handleReport(
    call: grpc.ServerUnaryCall<ReportRequestMessage, ReportResponseMessage>,
    cb: grpc.sendUnaryData<ReportResponseMessage>,
  ): void {
    // Who speaks is checked first, on any replica: an unauthenticated caller learns nothing more.
    if (this.auth !== null) {
      const a = this.auth.check(call, call.request.cellId);
      if (!a.ok) {
        this.stats.reports++;
        this.refuse((e) => cb(e), a.reason, a.code, a.details, call.request.cellId, call.getPeer());
        return;
      }
    }
    this.submit(
      call.request,
      (r) => cb(null, r),
      (e) => cb(e),
      call.getPeer(),
    );
  }

  /**
   * One report, however it arrived (the gRPC handler; the quota simulation's network): `resolve`
   * gets the answer once its round committed, `reject` a status error (FAILED_PRECONDITION with the
   * leader in the trailers, INVALID_ARGUMENT, UNAVAILABLE, RESOURCE_EXHAUSTED).
   */
  submit(
    req: ReportRequestMessage,
    resolve: (r: ReportResponseMessage) => void,
    reject: (e: grpc.ServiceError | Error) => void,
    peer = '',
  ): void {
    const receiptMs = this.now();
    this.stats.reports++;
    if (!this.backend.isLeader()) {
      this.stats.notLeader++;
      reject(this.notLeaderError());
      return;
    }
    const invalid = validateReport(req);
    if (invalid !== null) {
      reject(statusError(grpc.status.INVALID_ARGUMENT, invalid));
      return;
    }
    if (this.backend.ledger().getCell(req.cellId)?.removing === true) {
      this.refuse(
        reject,
        'cell_removed',
        grpc.status.PERMISSION_DENIED,
        `cell ${req.cellId} was removed by the operator (cellquota ctl cells remove); it gets no lease until ` +
          'it is dropped and registers again',
        req.cellId,
        peer,
      );
      return;
    }
    this.onReport?.(req, Date.now()); // the live view bins by this process's wall clock, not the lease frame
    this.pending.push({ req, receiptMs, releasesParked: false, resolve, reject });
  }

  private refuse(
    reject: (e: grpc.ServiceError) => void,
    reason: LeaseRefusalReason,
    code: grpc.status,
    details: string,
    cellId: string,
    peer: string,
  ): void {
    this.stats.refused++;
    this.onRefused?.(reason);
    if (this.firstIn10s(`${reason}\u0000${cellId.slice(0, 128)}`))
      this.log.warn({ reason, cellId: cellId.slice(0, 128), peer, details }, 'lease report refused');
    reject(statusError(code, details));
  }

  /** True at most once every 10 s per key (log lines a misbehaving caller could repeat). */
  private firstIn10s(key: string): boolean {
    const now = Date.now();
    if ((this.refusalLogged.get(key) ?? -Infinity) + 10_000 > now) return false;
    if (this.refusalLogged.size > 1000) this.refusalLogged.clear();
    this.refusalLogged.set(key, now);
    return true;
  }

  private failPending(err: grpc.ServiceError): void {
    const batch = this.pending;
    this.pending = [];
    for (const p of batch) p.reject(err);
  }

  /** One expiry check (run every expireEveryMs once started): releases the leases that surely expired. */
  async expire(): Promise<void> {
    if (!this.backend.isLeader() || this.inRound || this.term !== this.backend.term() || !this.clock.synced) return;
    // Between rounds, as a round: no round computes grants from a ledger the retirement then changes under it (its
    // grants for the key would be refused, and the round's others with them); reports wait for the next round.
    this.inRound = true;
    try {
      await this.retireIdleImplicitTenants();
    } finally {
      this.inRound = false;
    }
    if (!this.backend.isLeader() || this.inRound || this.term !== this.backend.term()) return;
    const nowMs = this.clock.stamp(this.backend.ledger().nowMs);
    // Only when some lease has surely expired (an entry per second forever would only grow the log).
    const skew = this.backend.ledger().config.skewMarginMs;
    // Or when a removed cell's lease is over, so it is dropped and its floor slot freed.
    if (
      !this.backend
        .ledger()
        .listCells()
        .some(
          (c) =>
            (c.leaseExpiresAtMs !== null && nowMs >= c.leaseExpiresAtMs + skew) ||
            (c.removing && !(c.leaseExpiresAtMs !== null && nowMs < c.leaseExpiresAtMs + skew)),
        )
    )
      return;
    try {
      await this.backend.propose({ type: 'expireLeases', nowMs });
    } catch (err) {
      this.log.debug({ err }, 'expireLeases not committed');
    }
  }

  /** Winds down the implicit tenants no cell reported demand for within implicitTenantIdleMs (one command). */
  private async retireIdleImplicitTenants(): Promise<void> {
    const keys = this.implicit.idle(this.backend.ledger(), this.clock.time(), (key) => this.byKey.has(key));
    if (keys.length === 0) return;
    // Only where the wind-down can be cancelled (reviveImplicitTenants, format 4) when demand comes back.
    if (this.backend.everyMemberReads?.(REVIVE_IMPLICIT_FORMAT) === false) {
      if (this.firstIn10s('implicit\u0000format'))
        this.log.warn(
          { idle: keys.length },
          `idle implicit tenants are not wound down until every replica reads command format ${REVIVE_IMPLICIT_FORMAT}`,
        );
      return;
    }
    try {
      const r = await this.backend.propose({ type: 'retireImplicitTenants', keys });
      if (!r.ok) {
        this.log.warn({ error: r.error }, 'winding down idle implicit tenants refused');
        return;
      }
      this.implicit.noteRetired(keys);
      this.stats.implicitTenantsRetired = this.implicit.retired;
      this.log.info(
        { retired: r.value.kind === 'implicitRetired' ? r.value.retired : keys.length },
        'idle implicit tenants wound down (--implicit-tenant-idle-ms)',
      );
    } catch (err) {
      this.log.debug({ err }, 'retireImplicitTenants not committed');
    }
  }

  /**
   * Takes back the winding-down tenant keys some cell asks for again (within --max-implicit-tenants), before the
   * round's grants are computed: their cells are then re-granted, never sent the zero grant of a key still asked for.
   */
  private async reviveAskedImplicitTenants(): Promise<void> {
    const ledger = this.backend.ledger();
    const refusedBefore = this.implicit.refused;
    let { revive, refused } = this.implicit.wanted(ledger, this.byKey);
    if (revive.length > 0 && this.backend.everyMemberReads?.(REVIVE_IMPLICIT_FORMAT) === false) {
      refused = revive;
      revive = [];
    }
    // Not taken back: their demand is forgotten, so they come back only through the bound's check (admit).
    for (const key of refused)
      for (const cellId of [...(this.byKey.get(key)?.keys() ?? [])]) this.noteDemand(ledger, key, cellId, 0, 0);
    if (this.implicit.refused > refusedBefore) this.stats.implicitTenantsRefused = this.implicit.refused;
    if (revive.length === 0) return;
    const r = await this.backend.propose({ type: 'reviveImplicitTenants', keys: revive });
    if (!r.ok) {
      this.log.warn({ error: r.error }, 'taking back winding-down implicit tenants refused');
      return;
    }
    this.implicit.noteRevived(revive);
    this.stats.implicitTenantsRevived = this.implicit.revived;
    this.log.info(
      { revived: r.value.kind === 'implicitRevived' ? r.value.revived : revive.length },
      'winding-down implicit tenants asked for again: taken back',
    );
  }

  /**
   * Adds to the round's grants, for each reporting cell's keys that were due to be sent again at an epoch its agent
   * released (CellSession.releasedEpochs), the same slice one epoch higher unless the policy grants the key already
   * (a new epoch too). The numbers are the slice's own (as the policy's re-grant of a stale definition), so nothing the
   * ledger counts changes; the answer then carries the new epoch, which no release sent before it can name.
   */
  private addRegrants(ledger: Ledger, reported: ReadonlySet<string>, grants: Grant[], nowMs: number): void {
    let granted: Set<string> | null = null;
    for (const cellId of reported) {
      const session = this.sessions.get(cellId);
      if (session === undefined || session.regrant.size === 0) continue;
      granted ??= new Set(grants.map((g) => `${g.cellId}\u0000${g.key}`));
      for (const key of session.regrant) {
        const s = ledger.getSlice(key, cellId);
        if (s === undefined || s.epoch === 0 || s.epoch > (session.releasedEpochs.get(key) ?? 0)) continue;
        if (granted.has(`${cellId}\u0000${key}`)) continue;
        grants.push(sameSliceNextEpoch(ledger, key, cellId, s, nowMs + this.ttl));
      }
      session.regrant.clear();
    }
  }

  /**
   * Proposes one dropReleasedSlices entry with the releases the reporting cells' sessions took (at most
   * MAX_DROPS_PER_COMMAND; the rest in the next rounds), before the round's grants are computed, so the policy sees the
   * slices gone and a key asked for again gets a first grant (a new slice, epochs above the cell's mark). A key is
   * proposed only while this session has not sent it again (emit and demand take it out of toDrop): the ledger checks
   * the epoch and the floors (ledger.ts, dropReleasedSlices, why that keeps the bound).
   */
  private async dropReleasedSlices(cellIds: Iterable<string>): Promise<void> {
    const releases: SliceRelease[] = [];
    const from: CellSession[] = [];
    for (const cellId of cellIds) {
      const session = this.sessions.get(cellId);
      if (session === undefined || session.toDrop.size === 0) continue;
      from.push(session);
      for (const [key, epoch] of session.toDrop) {
        if (releases.length >= MAX_DROPS_PER_COMMAND) break;
        releases.push({ key, cellId, epoch });
      }
    }
    if (releases.length === 0 || this.backend.ledger().commandFormat < RELEASED_SLICES_FORMAT) return;
    const r = await this.backend.propose({ type: 'dropReleasedSlices', releases });
    if (!r.ok) {
      this.log.warn({ error: r.error, releases: releases.length }, 'dropping released slices refused');
      return;
    }
    if (r.value.kind === 'slicesDropped') this.stats.releasedSlicesDropped += r.value.dropped;
    const ledger = this.backend.ledger();
    for (const rel of releases) {
      const session = this.sessions.get(rel.cellId);
      if (session === undefined || !from.includes(session)) continue;
      session.toDrop.delete(rel.key);
      // Dropped (or gone for another reason): nothing of the key is sent to this cell, nothing to remember.
      if (ledger.sliceEpoch(rel.key, rel.cellId) === 0) {
        session.released.delete(rel.key);
        session.releasedEpochs.delete(rel.key);
      }
    }
  }

  /** One round: registers new cells, proposes one reportAndGrant entry, answers the held reports. */
  async round(): Promise<void> {
    if (this.inRound) return;
    const leader = this.backend.isLeader();
    if (!leader) {
      if (this.wasLeader) {
        this.sessions.clear();
        this.replacedIncarnations.clear();
        this.byKey.clear();
        this.demandKeysOfCell.clear();
        this.changedKeys = null;
        this.implicit.reset();
      }
      this.wasLeader = false;
      if (this.pending.length > 0) this.failPending(this.notLeaderError());
      return;
    }
    const term = this.backend.term();
    if (!this.wasLeader || this.term !== term) {
      // A new term of ours: whatever we remembered may be stale (another leader served in between).
      this.sessions.clear();
      this.replacedIncarnations.clear();
      this.byKey.clear();
      this.demandKeysOfCell.clear();
      this.changedKeys = null;
      this.implicit.reset();
      this.wasLeader = true;
      this.term = term;
      this.clock.beginTerm(this.ttl + this.backend.ledger().config.skewMarginMs);
      this.barrier = null;
    }
    if (!this.clock.synced) {
      await (this.barrier ??= this.syncClock(term));
      if (!this.clock.synced || this.inRound) return;
    }
    if (this.pending.length === 0) return;
    const batch = this.pending;
    this.pending = [];
    this.inRound = true;
    try {
      await this.runRound(batch);
    } catch (err) {
      this.stats.failedRounds++;
      this.log.warn({ err }, 'lease round not committed; the reports are failed and will be retried by the agents');
      const e = !this.backend.isLeader()
        ? this.notLeaderError()
        : statusError(
            grpc.status.UNAVAILABLE,
            `lease round failed: ${err instanceof Error ? err.message : String(err)}`,
          );
      for (const p of batch) p.reject(e);
    } finally {
      this.inRound = false;
    }
  }

  /** The term's read barrier: then the clock adopts the ledger's frame (the grace runs on regardless). */
  private async syncClock(term: number): Promise<void> {
    try {
      await this.backend.readBarrier();
      if (this.term !== term || this.backend.term() !== term || !this.backend.isLeader()) return;
      const ledger = this.backend.ledger();
      this.clock.sync(ledger.nowMs);
      // Receipts stamped before the clock adopted the ledger's frame may lie below it: raised, so a
      // renewal is never born expired.
      for (const p of this.pending) p.receiptMs = Math.max(p.receiptMs, ledger.nowMs);
      const inherited = ledger.listCells().filter((c) => c.leaseExpiresAtMs !== null).length;
      if (inherited === 0) this.clock.endGrace();
      this.log.info(
        {
          term,
          ledgerNowMs: ledger.nowMs,
          graceLeftMs: Math.round(this.clock.graceLeftMs()),
          inheritedLeases: inherited,
        },
        'lease leader synced: releases nothing it did not renew itself until the grace is over',
      );
    } catch (err) {
      this.log.debug({ err }, 'lease leader read barrier failed; retried next round');
    } finally {
      if (this.term === term) this.barrier = null;
    }
  }

  private async runRound(batch: PendingReport[]): Promise<void> {
    const ledger = this.backend.ledger();
    // 1. New cells.
    const cells = new Map<string, PendingReport>();
    for (const p of batch) {
      const prev = cells.get(p.req.cellId);
      if (prev === undefined || prev.receiptMs <= p.receiptMs) cells.set(p.req.cellId, p);
    }
    for (const cellId of cells.keys()) {
      const known = ledger.getCell(cellId);
      if (known !== undefined && !known.removing) continue;
      if (known !== undefined || this.backend.ledger().listCells().length >= this.maxCells) {
        // Removed while its report waited; or the cell bound is reached.
        const e =
          known !== undefined
            ? statusError(
                grpc.status.PERMISSION_DENIED,
                `cell ${cellId} was removed by the operator (cellquota ctl cells remove)`,
              )
            : statusError(
                grpc.status.RESOURCE_EXHAUSTED,
                `cell ${cellId} cannot register: ${this.maxCells} cells are registered, the most this ` +
                  'coordinator takes (--max-cells); remove one with cellquota ctl cells remove ID',
              );
        if (known === undefined) {
          this.stats.refused++;
          this.onRefused?.('too_many_cells');
          this.log.warn({ cellId, maxCells: this.maxCells }, 'cell registration refused: the cell bound is reached');
        }
        for (const p of batch) if (p.req.cellId === cellId) p.reject(e);
        cells.delete(cellId);
        continue;
      }
      const r = await this.backend.propose({
        type: 'registerCell',
        cellId,
        nowMs: this.clock.stamp(this.backend.ledger().nowMs),
      });
      if (!r.ok) {
        this.log.warn({ cellId, error: r.error }, 'cell registration refused');
        const e = statusError(grpc.status.RESOURCE_EXHAUSTED, `cell ${cellId} cannot register: ${r.error.message}`);
        for (const p of batch) if (p.req.cellId === cellId) p.reject(e);
        cells.delete(cellId);
      } else {
        this.log.info({ cellId }, 'cell registered');
      }
    }
    if (cells.size === 0) return;

    // 2. Sessions, demands, renewals, acks.
    const leases: LeaseRenewal[] = [];
    const acks: GrantAck[] = [];
    for (const p of batch) {
      if (!cells.has(p.req.cellId)) continue;
      const session = this.session(p.req.cellId, p.req.incarnation);
      const trusted = session.answers > 0 && p.receiptMs >= session.dropsFromMs;
      const sweep = p.req.velocitySweep ?? 0;
      if (p.req.velocitySweepStart === true) session.sweepStarted = sweep;
      let dropped = 0;
      const refusedBefore = this.implicit.refused;
      for (const v of p.req.velocity) {
        const d = v.allowedPerS + v.refusedPerS;
        // A new implicit tenant beyond --max-implicit-tenants: not taken (no grant: refused as under deny).
        if (d > 0 && !this.byKey.has(v.key) && !this.implicit.admit(ledger, v.key)) continue;
        if (!this.noteDemand(ledger, v.key, p.req.cellId, d, sweep)) dropped++;
      }
      if (this.implicit.refused > refusedBefore) {
        this.stats.implicitTenantsRefused = this.implicit.refused;
        if (this.firstIn10s(`implicit\u0000${p.req.cellId}`))
          this.log.warn(
            {
              cellId: p.req.cellId,
              refused: this.implicit.refused - refusedBefore,
              maxImplicitTenants: this.implicit.max,
            },
            'unknown tenants beyond --max-implicit-tenants are refused (as under the policy deny) until ' +
              'idle implicit tenants are wound down',
          );
      }
      if (p.req.velocitySweepDone === true && sweep > 0) {
        // The sweep sent every key with demand: what it did not restamp is no longer reported.
        for (const [key, stamp] of [...(this.demandKeysOfCell.get(p.req.cellId) ?? [])])
          if (stamp < sweep) this.noteDemand(ledger, key, p.req.cellId, 0, sweep);
        // Complete only if this session saw the whole sweep (not its later pages alone).
        if (session.sweepStarted === sweep) session.swept = true;
      }
      if (dropped > 0) {
        this.stats.demandKeysDropped += dropped;
        if (this.firstIn10s(`demand\u0000${p.req.cellId}`))
          this.log.warn(
            { cellId: p.req.cellId, dropped, maxDemandKeys: this.maxDemandKeys },
            'demand keys beyond the per-cell bound (--max-demand-keys) are ' +
              'not kept: those keys get no grant until others go quiet',
          );
      }
      for (const a of p.req.acks) {
        if ((session.acked.get(a.key) ?? 0) < a.epoch) session.acked.set(a.key, a.epoch);
        if ((ledger.getSlice(a.key, p.req.cellId)?.epoch ?? 0) <= a.epoch) session.outstanding.delete(a.key);
        const s = ledger.getSlice(a.key, p.req.cellId);
        if (s !== undefined && s.epoch === a.epoch && !s.acknowledged)
          acks.push({ key: a.key, cellId: p.req.cellId, epoch: a.epoch });
        // Planted (simulation only): the acknowledged grant's slice is dropped as if the agent had released it.
        if (planted['forged-release'] && trusted && s !== undefined && s.epoch === a.epoch)
          session.toDrop.set(a.key, a.epoch);
      }
      const format7 = ledger.commandFormat >= RELEASED_SLICES_FORMAT;
      const gone = takeReleases(ledger, session, p.req, trusted && format7);
      // Not trusted yet, but will be: the agent keeps this report's releases and sends them again after the window
      // (before, a release that reached a new leader in its first TTL + margin was never dropped: the agent did not
      // send it again, and the cell's slices grew with every election — `npm run bench -- agent-tenants`).
      p.releasesParked = format7 && !trusted && Number.isFinite(session.dropsFromMs);
      if (p.releasesParked) this.stats.releasesParked += p.req.released?.length ?? 0;
      // From format 7 a released key's slice is dropped: a demand the leader still holds for it predates the release
      // (the agent evicts only keys without demand, and reports a key's demand anew when it comes back), and would
      // only have the round grant the key again at once.
      if (format7) for (const key of gone) this.noteDemand(ledger, key, p.req.cellId, 0, sweep);
    }
    if (planted['forged-ack']) {
      for (const cellId of cells.keys()) {
        for (const key of ledger.cellSliceKeys(cellId)) {
          const s = ledger.getSlice(key, cellId);
          if (s !== undefined && s.epoch > 0 && !s.acknowledged) acks.push({ key, cellId, epoch: s.epoch });
        }
      }
    }
    for (const [cellId, p] of cells) leases.push({ cellId, leaseExpiresAtMs: p.receiptMs + this.ttl });
    await this.dropReleasedSlices(cells.keys());
    await this.reviveAskedImplicitTenants();
    const reported = new Set(cells.keys());
    const nowMs = this.clock.stamp(ledger.nowMs);
    const changedKeys = this.changedKeys ?? undefined;
    this.changedKeys = new Set<string>();
    let grants = this.policy(
      ledger,
      { reported, byKey: this.byKey, acks: dedupeAcks(acks), leaseTtlMs: this.ttl, changedKeys },
      nowMs,
    );
    grants = grants.filter((g) => reported.has(g.cellId));
    this.addRegrants(ledger, reported, grants, nowMs);

    // 3. One entry (or, refused, the same without grants).
    let r = await this.backend.propose({ type: 'reportAndGrant', nowMs, leases, acks: dedupeAcks(acks), grants });
    if (!r.ok && grants.length > 0) {
      this.stats.refusedRounds++;
      this.log.warn(
        { error: r.error, grants: grants.length },
        "the round's grants were refused; renewing leases without them",
      );
      r = await this.backend.propose({
        type: 'reportAndGrant',
        nowMs: this.clock.stamp(Math.max(nowMs, this.backend.ledger().nowMs)),
        leases,
        acks: dedupeAcks(acks),
      });
    }
    if (!r.ok) throw new Error(`reportAndGrant refused: ${r.error.code}: ${r.error.message}`);
    this.stats.rounds++;
    this.stats.grantsProposed += grants.length;

    // 4. Answers from the committed ledger.
    const committed = this.backend.ledger();
    for (const g of grants) this.sessions.get(g.cellId)?.outstanding.set(g.key, 0);
    const settings = committed.settings;
    if (settings.unknownTenant !== this.unknownPolicy) {
      for (const session of this.sessions.values()) session.toldUnknown.clear();
      this.unknownPolicy = settings.unknownTenant;
    }
    const caps = committed.cappedDomains();
    for (const p of batch) {
      if (!cells.has(p.req.cellId)) continue;
      p.resolve(this.answer(committed, p.req, caps, settings.unknownTenant, p.releasesParked));
    }
  }

  /**
   * One agent's answer: its grants newer than what it acknowledged — every slice of the cell for a
   * session's first answer or when the agent asks for a full picture, else only the keys granted
   * since (a million tenants do not mean a million grants per answer) — each with the definition it
   * was stamped with; the unknown-tenant policy and the unknown keys it asked about; the capped
   * domains when its copy is stale.
   */
  private answer(
    ledger: Ledger,
    req: ReportRequestMessage,
    caps: { readonly domains: string[]; readonly version: number },
    unknownTenant: UnknownTenantPolicyName,
    releasesParked = false,
  ): ReportResponseMessage {
    const session = this.session(req.cellId, req.incarnation);
    const paged = req.pagedAnswers === true;
    const seq = ++session.answers;
    // A full picture starts with a session's first answer, or when the agent asks for one (while a
    // paged picture is under way, the agent's want_full continues it).
    const fullStart = session.fresh || (req.wantFull === true && session.full === null);
    session.fresh = false;
    if (fullStart) {
      session.full = this.fullPictureKeys(ledger, req.cellId, session.released);
      session.fullAt = 0;
      session.fullSince = seq;
      session.outstanding.clear();
    }
    // Without pages every answer carries every grant due, and every grant not yet acknowledged again.
    const limit = paged ? MAX_ANSWER_GRANTS : Infinity;
    const out: GrantMessage[] = [];
    const emit = (key: string, acked: number): void => {
      const s = ledger.getSlice(key, req.cellId);
      if (s === undefined || s.epoch === 0 || s.epoch <= acked) {
        session.outstanding.delete(key);
        return;
      }
      const released = session.releasedEpochs.get(key);
      if (released !== undefined) {
        if (s.epoch <= released) {
          // Released at this epoch: never sent again; the next round grants it one epoch higher.
          session.outstanding.delete(key);
          session.regrant.add(key);
          return;
        }
        session.releasedEpochs.delete(key);
      }
      session.outstanding.set(key, seq);
      session.toldUnknown.delete(key);
      session.released.delete(key);
      session.toDrop.delete(key);
      const def = ledger.definition(key);
      out.push({
        key,
        rate: s.rate,
        burst: s.burst,
        epoch: s.epoch,
        floorRate: s.floorRate,
        floorBurst: s.floorBurst,
        version: s.version,
        parent: def?.parent ?? '',
        deleted: def === undefined,
      });
    };
    // 1. Grants made since that no answer carried yet (while a paged picture is under way, in up to
    //    half of the page, so the keys in use are not held back by a picture of a million slices);
    // 2. the picture's next page;
    // 3. grants an answer carried and the agent did not acknowledge: without pages, every one again in
    //    every answer; with pages, RESEND_AFTER_ANSWERS answers after the last that carried it (an
    //    answer may be lost: the agent gave up on its call).
    const picture = session.full;
    const fresh = picture === null ? limit : Math.floor(limit / 2);
    const resend = paged ? seq - RESEND_AFTER_ANSWERS : seq;
    let more = false;
    const waiting: string[] = [];
    for (const [key, sent] of session.outstanding) {
      if (sent !== 0) {
        if (sent <= resend) waiting.push(key);
      } else if (out.length < fresh) emit(key, session.acked.get(key) ?? 0);
      else more = true;
    }
    if (picture !== null) {
      while (session.fullAt < picture.length && out.length < limit) emit(picture[session.fullAt++] as string, 0);
      if (session.fullAt >= picture.length) session.full = null;
      else more = true;
    }
    const full = picture !== null && session.full === null;
    for (const key of waiting) {
      if (out.length >= limit) break;
      if (session.outstanding.get(key) !== seq) emit(key, session.acked.get(key) ?? 0);
    }
    const unknownKeys: string[] = [];
    if (unknownTenant === 'allow') {
      if (session.toldUnknown.size > MAX_TOLD_UNKNOWN) session.toldUnknown.clear();
      for (const v of req.velocity) {
        if (!v.key.startsWith('tenant/') || session.toldUnknown.has(v.key) || ledger.getQuota(v.key) !== undefined)
          continue;
        session.toldUnknown.add(v.key);
        unknownKeys.push(v.key);
      }
    }
    const capsIncluded = (req.capsVersion ?? 0) !== caps.version;
    return {
      leaderId: this.backend.id,
      leaseTtlMs: this.ttl,
      grants: out,
      ledgerIndex: ledger.appliedIndex,
      unknownTenant,
      unknownKeys,
      capsIncluded,
      capsVersion: caps.version,
      cappedDomains: capsIncluded ? caps.domains : [],
      full,
      velocityResync: !session.swept,
      ...(paged
        ? {
            more,
            answerSeq: seq,
            fullPicture: picture !== null ? session.fullSince : 0,
            releases: true,
            releasesParked,
          }
        : {}),
    };
  }

  /**
   * The keys of a full picture of `cellId`: every slice the cell holds but the keys its agent released,
   * those it reported demand for first (with pages, the keys in use are back on their grants soonest).
   * Not sorted: at a million slices a sort costs seconds of the leader's event loop.
   */
  private fullPictureKeys(ledger: Ledger, cellId: string, released: ReadonlySet<string>): string[] {
    const demanded = this.demandKeysOfCell.get(cellId);
    const first: string[] = [];
    const rest: string[] = [];
    for (const key of ledger.cellSliceKeys(cellId)) {
      if (released.has(key)) continue;
      (demanded?.has(key) === true ? first : rest).push(key);
    }
    for (const key of rest) first.push(key);
    return first;
  }

  /**
   * Takes a reported demand (allowed + refused per second) for the next rounds. A demand that moves
   * less than the dead-band — max(MIN_DEMAND_DEAD_BAND, DEMAND_DEAD_BAND_FRACTION × the quota's rate) —
   * from the value the rounds last took is left at that value (measurement noise would otherwise
   * make every active quota "changed" on every report); a larger move, an appearance or a
   * disappearance is taken and names the key in the next round's changedKeys. The band is below the
   * allocator's smallest headroom (1% of the quota), so a cell cannot start refusing unseen.
   */
  /**
   * Records a cell's demand for a key, stamped with the report's sweep; false when it is a new key beyond the cell's
   * --max-demand-keys (not kept).
   */
  private noteDemand(ledger: Ledger, key: string, cellId: string, d: number, sweep: number): boolean {
    let row = this.byKey.get(key);
    const prev = row?.get(cellId);
    let held = this.demandKeysOfCell.get(cellId);
    if (d > 0) {
      if (prev !== undefined) {
        held?.set(key, sweep);
        const rate = ledger.getQuota(key)?.rate ?? 0;
        if (Math.abs(d - prev) <= Math.max(MIN_DEMAND_DEAD_BAND, DEMAND_DEAD_BAND_FRACTION * rate)) return true;
      } else {
        if ((held?.size ?? 0) >= this.maxDemandKeys) return false;
        if (held === undefined) this.demandKeysOfCell.set(cellId, (held = new Map<string, number>()));
        held.set(key, sweep);
      }
      if (row === undefined) this.byKey.set(key, (row = new Map<string, number>()));
      row.set(cellId, d);
    } else {
      if (prev === undefined || row === undefined) return true;
      row.delete(cellId);
      if (row.size === 0) this.byKey.delete(key);
      held?.delete(key);
      if (held?.size === 0) this.demandKeysOfCell.delete(cellId);
    }
    this.changedKeys?.add(key);
    return true;
  }

  private session(cellId: string, incarnation: string): CellSession {
    let s = this.sessions.get(cellId);
    if (s === undefined || s.incarnation !== incarnation) {
      // A new agent incarnation reports its demand from nothing: the old one's is dropped.
      let replaced = this.replacedIncarnations.get(cellId);
      if (s !== undefined) {
        for (const key of [...(this.demandKeysOfCell.get(cellId)?.keys() ?? [])])
          this.noteDemand(this.backend.ledger(), key, cellId, 0, 0);
        if (replaced === undefined) this.replacedIncarnations.set(cellId, (replaced = new Set<string>()));
        if (replaced.size < MAX_REPLACED_INCARNATIONS) replaced.add(s.incarnation);
      }
      s = {
        incarnation,
        acked: new Map(),
        outstanding: new Map(),
        answers: 0,
        full: null,
        fullAt: 0,
        fullSince: 0,
        toldUnknown: new Set(),
        released: new Set(),
        toDrop: new Map(),
        releasedEpochs: new Map(),
        regrant: new Set(),
        dropsFromMs:
          replaced?.has(incarnation) === true || (replaced?.size ?? 0) >= MAX_REPLACED_INCARNATIONS
            ? Infinity
            : this.now() + this.ttl + this.backend.ledger().config.skewMarginMs,
        fresh: true,
        sweepStarted: 0,
        swept: false,
      };
      this.sessions.set(cellId, s);
    }
    return s;
  }
}

/**
 * Most incarnations per cell remembered as replaced this term (once reached, the cell's releases drop nothing more
 * this term).
 */
const MAX_REPLACED_INCARNATIONS = 64;

/**
 * A report's releases (after its acks): a key the agent holds nothing for any more is no longer sent to
 * it, unless the ledger holds a newer grant than the epoch it names (sent as always). With `drop` (command
 * format 7, a trusted session), a release of the slice's current epoch is also queued to be dropped from the
 * ledger (toDrop). Then the report's demand: a released key the cell asks for again gets its current slice
 * with the next answer (and is not dropped); once dropped, a new slice through the round's first grants.
 * Returns the keys released and not asked for in this report.
 */
function takeReleases(ledger: Ledger, session: CellSession, req: ReportRequestMessage, drop: boolean): Set<string> {
  const taken = new Set<string>();
  for (const r of req.released ?? []) {
    const epoch = ledger.sliceEpoch(r.key, req.cellId);
    if (epoch > r.epoch) continue;
    if ((session.releasedEpochs.get(r.key) ?? 0) < r.epoch) session.releasedEpochs.set(r.key, r.epoch);
    session.acked.delete(r.key);
    session.outstanding.delete(r.key);
    session.released.add(r.key);
    taken.add(r.key);
    if (drop && epoch === r.epoch && epoch > 0) session.toDrop.set(r.key, epoch);
  }
  if (session.released.size === 0) return taken;
  for (const v of req.velocity)
    if (v.allowedPerS + v.refusedPerS > 0 && session.released.delete(v.key)) {
      session.toDrop.delete(v.key);
      session.outstanding.set(v.key, 0);
      // Sent back one epoch above the one released (this round's regrants), never at it.
      session.regrant.add(v.key);
      taken.delete(v.key);
    }
  return taken;
}

function dedupeAcks(acks: readonly GrantAck[]): GrantAck[] {
  const seen = new Map<string, GrantAck>();
  for (const a of acks) seen.set(`${a.cellId}\u0000${a.key}`, a);
  return [...seen.values()];
}

/** Null if the report is well formed, else why not. */
export function validateReport(req: ReportRequestMessage): string | null {
  if (!isName(req.cellId)) return 'cell_id must be 1..128 characters of [a-zA-Z0-9._:-]';
  if (req.incarnation.length === 0 || req.incarnation.length > 128) return 'incarnation must be 1..128 characters';
  const released = req.released ?? [];
  if (
    req.acks.length > MAX_REPORT_ITEMS ||
    req.velocity.length > MAX_REPORT_ITEMS ||
    released.length > MAX_REPORT_ITEMS
  )
    return `at most ${MAX_REPORT_ITEMS} acks, velocity and released entries`;
  for (const a of released) {
    if (!QUOTA_KEY_PATTERN.test(a.key)) return `released key ${a.key.slice(0, 140)} is not a quota key`;
    if (!Number.isSafeInteger(a.epoch) || a.epoch < 0) return `released epoch of ${a.key} must be an integer ≥ 0`;
  }
  for (const a of req.acks) {
    if (!QUOTA_KEY_PATTERN.test(a.key)) return `ack key ${a.key.slice(0, 140)} is not a quota key`;
    if (!Number.isSafeInteger(a.epoch) || a.epoch < 1) return `ack epoch of ${a.key} must be a positive integer`;
  }
  for (const v of req.velocity) {
    if (!QUOTA_KEY_PATTERN.test(v.key)) return `velocity key ${v.key.slice(0, 140)} is not a quota key`;
    if (!(Number.isFinite(v.allowedPerS) && v.allowedPerS >= 0 && Number.isFinite(v.refusedPerS) && v.refusedPerS >= 0))
      return `velocity of ${v.key} must be finite and ≥ 0`;
  }
  const sweep = req.velocitySweep ?? 0;
  if (!(Number.isSafeInteger(sweep) && sweep >= 0)) return 'velocity_sweep must be an integer ≥ 0';
  const failOpen = req.failOpenTotal ?? 0;
  if (!(Number.isFinite(failOpen) && failOpen >= 0)) return 'fail_open_total must be finite and ≥ 0';
  return null;
}
