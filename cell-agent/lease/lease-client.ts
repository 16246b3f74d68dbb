// The agent's lease client: every sync interval (default 500 ms) one Report call to the coordinator
// leader, with a deadline below the interval (grown while calls run out of time: deadlineFor()). It
// carries the acknowledgements of the grants applied since the last successful report and the demand
// that moved since the last answered one, within a byte budget, with periodic full sweeps
// (velocity-report.ts); the answer carries the lease TTL and the grants newer than what was
// acknowledged.
//
// Finding the leader: start at any of the configured addresses; a FAILED_PRECONDITION answer names
// the leader (id and address, in trailers) and the next call goes there — to this agent's own address
// for that id when the coordinators were configured as ID=HOST:PORT (the address the replicas know
// each other by may not be the one this cell reaches them at: proxies, per-replica load balancers),
// else to the address named; any other failure moves on to the next configured address, with
// exponential backoff (capped at 4 intervals, jittered).
//
// Lease timing: the lease is counted from when the report was SENT (this process's monotonic clock),
// never from when the answer arrived: expiry = sentAt + TTL. The coordinator answers only after the
// round that renewed the lease (expiry = its receipt time + TTL) is committed, and releases the grants
// only after that expiry plus its skew margin, so this view of the lease always ends first.
//
// Fail-static: when the lease expires, every global quota drops to its floor (the floor stamped on the
// grant; a key never granted stays refused), `state` turns 'expired', and every grant held is
// SUSPENDED: kept with its epoch and floor, but never in force again as it was. The agent keeps its
// incarnation (the leader keeps its demand, its acknowledgements and its session) and asks for a full
// picture (want_full); each page re-confirms a suspended grant with the value the ledger holds once
// the report's renewal committed — the same epoch is taken again for a suspended key, a newer one as
// always — and only then is that key leased again. Keys the picture does not carry are dropped.
//
// Why this keeps the bound (docs/quota-model.md, "The bound"): the coordinator may have released the
// cell's grants meanwhile (its lease surely expired: the ledger zeroes rate and burst and keeps the
// epoch), so a held grant may be worth less in the ledger than in the agent. A suspended grant's value
// is never used again as leased; what is used is what an answer carries, and every answer is built
// from the committed ledger after the renewal of the report it answers (receipt + TTL, no release
// before that plus the skew margin), while the agent counts that lease from the report's send time:
// exactly what a new incarnation's answers guarantee. Meanwhile the cell uses its floors, which the
// ledger counts through a release (the stamped floors are held until acknowledged away). Before, a
// lapse took a new incarnation, so the leader dropped the cell's demand and sent every slice again as
// to a stranger; at 100,000 tenants and more that answer ran past the deadline and lapsed the lease
// again (the agent-tenants bench: no grant held from some size on).
//
// Definitions: the coordinator is the one source of every quota this agent enforces. A key the
// agent holds nothing for is refused and its refusals are reported as velocity; the answer grants it
// (with its floor, the definition version the numbers come from and, for a tenant, its tier cap) or,
// when the coordinator's unknown-tenant policy is "allow", names it unknown. An answer marked full
// (the first one of an incarnation) carries every slice the cell holds: keys it leaves out are
// dropped. A grant marked deleted (the quota was deleted) is acknowledged and forgotten. The capped
// domains come with the answer whenever the agent's copy is stale.
//
// The lease's end also lives in shared memory when a LeaseDeadline writer is given (lease-deadline.ts):
// leased entries carry the lease generation, and every deciding thread falls to the floors once the
// deadline passed, without waiting for this client's expiry timer (the main thread may be busy).
//
// Inputs: the transport (gRPC by default), the timers, the clocks and the randomness (incarnations,
// jitter) can be given, so the quota simulation runs this very client in simulated time.
//
// Applying an answer never throws out of the client: an entry the bucket table cannot hold is
// clamped (QuotaOverrides) and logged; any other error while applying is logged, the grants of that
// answer are not acknowledged, and their keys stay on their floors (pending if they have none).
import { randomUUID } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import type { Logger } from '../../shared/logging.js';
import { LEADER_ADDRESS_TRAILER, LEADER_ID_TRAILER, loadQuotaLeaseService } from '../../shared/lease-proto.js';
import type {
  AckMessage,
  GrantMessage,
  ReportRequestMessage,
  ReportResponseMessage,
  VelocityMessage,
} from '../../shared/lease-proto.js';
import type { ClampedEntry, OverrideEntry } from './quota-overrides.js';
import type { LeaseDeadlineWriter } from './lease-deadline.js';
import { VelocityReporter } from './velocity-report.js';
import { HeldKeys } from './held-keys.js';

export const DEFAULT_SYNC_INTERVAL_MS = 500;
/** Delay of the extra report that acknowledges newly applied grants. */
const ACK_REPORT_DELAY_MS = 10;
/** After a failed report, the next configured coordinator is tried this soon (± half, jittered): a
 * round over every coordinator comes before any backoff, so a killed leader costs one round trip
 * and not a backoff per dead address (a follower that knows the new leader hints it at once). */
const NEXT_COORDINATOR_DELAY_MS = 50;
/** How far a report's deadline may grow past the configured one after calls ran out of time. */
const MAX_DEADLINE_FACTOR = 8;
/**
 * gRPC reconnects with exponential backoff up to 120 s by default, failing calls at once meanwhile:
 * after a 30 s outage of every coordinator an agent stayed on its floors for 20 s and more after they
 * were back (found by the coordinators-down chaos drill). The report loop has its own backoff (at most
 * 4 intervals), so the channel may retry often: at most every second.
 */
// A full answer carries every slice of the cell (about 80 bytes each: 8 MB at 100,000 slices,
// measured by bench/coordinator-source.ts), beyond grpc-js's 4 MiB default receive limit.
const CHANNEL_OPTIONS: grpc.ChannelOptions = Object.freeze({
  'grpc.initial_reconnect_backoff_ms': 200,
  'grpc.max_reconnect_backoff_ms': 1000,
  'grpc.max_receive_message_length': 64 * 1024 * 1024,
});
const QUOTA_KEY = /^(tenant|tier|domain)\/[a-zA-Z0-9._:-]{1,128}$/;

export type LeaseState = 'none' | 'leased' | 'expired';

/** A window sample: tokens allowed and refused over the last `windowMs`. */
export interface VelocityInput {
  readonly key: string;
  readonly allowed: number;
  readonly refused: number;
}

export interface LeaseClientOptions {
  readonly cellId: string;
  /** host:port of the coordinators; any one of them is enough. */
  readonly coordinators: readonly string[];
  /** This agent's address of a replica by id (from ID=HOST:PORT); preferred to the leader's address
   * named in a FAILED_PRECONDITION answer. */
  readonly coordinatorById?: ReadonlyMap<string, string>;
  readonly logger: Logger;
  /** The velocity window (keys are coordinator quota keys). */
  readonly velocity: () => readonly VelocityInput[];
  readonly velocityWindowMs?: number;
  /** Checks answered fail-open since the agent started (reported with every report). */
  readonly failOpenTotal?: () => number;
  /** Told the entries that changed (grants, floors, removals). A promise: the grants are acknowledged
   * to the coordinator only once it resolves (every serving thread decides with them). Returns (or
   * resolves to) the entries that had to be clamped. */
  readonly onOverrides: (entries: OverrideEntry[]) => ClampedEntry[] | void | Promise<ClampedEntry[] | void>;
  readonly onStateChange?: (state: LeaseState) => void;
  readonly intervalMs?: number;
  /** Per-call deadline (default 80% of the interval). */
  readonly deadlineMs?: number;
  /** Monotonic clock in ms (default performance.now). */
  readonly monotonicMs?: () => number;
  readonly credentials?: grpc.ChannelCredentials;
  /** Extra channel options of the default gRPC transport (TLS server name). */
  readonly channelOptions?: grpc.ChannelOptions;
  /** This cell's bearer token, sent as `authorization: Bearer` with every report (lease-credentials.ts). */
  readonly token?: string | null;
  /** Added to the failure log lines (e.g. that this agent presents no identity). */
  readonly failureHint?: string;
  /** The lease's end in shared memory, on the same clock as monotonicMs (the deciders read it). */
  readonly deadline?: LeaseDeadlineWriter;
  /** How reports reach the coordinators (default: gRPC with `credentials`). */
  readonly transport?: LeaseTransport;
  /** Timers (default the process's, unref'd). */
  readonly timers?: LeaseTimers;
  /** Wall clock in ms, for the report's sent_at stamp (default Date.now). */
  readonly wallMs?: () => number;
  /** Uniform in [0, 1): the first coordinator tried and the backoff jitter (default Math.random). */
  readonly random?: () => number;
  /** A new agent incarnation id (default randomUUID). */
  readonly newIncarnation?: () => string;
  /** The most keys a grant is held for (--max-lease-keys; default: no bound): past it the idle ones are
   * evicted and released to the leader (held-keys.ts). */
  readonly maxKeys?: number;
}

/** A failed report: the gRPC status code and details, and the leader a FAILED_PRECONDITION names. */
export interface LeaseCallError {
  readonly code: grpc.status;
  readonly details: string;
  readonly leaderId?: string;
  readonly leaderAddress?: string;
}

export type LeaseCallResult = { readonly res: ReportResponseMessage } | { readonly err: LeaseCallError };

/** One Report call to `address`, failed after `deadlineMs`; close() releases every connection. */
export interface LeaseTransport {
  report(address: string, req: ReportRequestMessage, deadlineMs: number): Promise<LeaseCallResult>;
  close(): void;
  /** Encoded bytes of every report sent and answer received so far (absent: not counted). */
  traffic?(): { readonly reportBytes: number; readonly answerBytes: number };
}

export interface LeaseTimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const PROCESS_TIMERS: LeaseTimers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms).unref(),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};

/** A gRPC status error as the client reads it (the leader from the trailers). */
export function leaseCallError(err: grpc.ServiceError): LeaseCallError {
  const leaderId = err.metadata?.get(LEADER_ID_TRAILER)[0];
  const leaderAddress = err.metadata?.get(LEADER_ADDRESS_TRAILER)[0];
  return {
    code: err.code,
    details: err.details,
    ...(typeof leaderId === 'string' ? { leaderId } : {}),
    ...(typeof leaderAddress === 'string' ? { leaderAddress } : {}),
  };
}

/** The lease service over gRPC (one channel per address). */
export class GrpcLeaseTransport implements LeaseTransport {
  private readonly svc = loadQuotaLeaseService();
  private readonly Client = grpc.makeGenericClientConstructor(loadQuotaLeaseService().definition, 'QuotaLease');
  private readonly clients = new Map<string, grpc.Client>();
  private reportBytes = 0;
  private answerBytes = 0;
  private readonly serialize = (req: ReportRequestMessage): Buffer => {
    const b = this.svc.report.requestSerialize(req);
    this.reportBytes += b.length;
    return b;
  };
  private readonly deserialize = (b: Buffer): ReportResponseMessage => {
    this.answerBytes += b.length;
    return this.svc.report.responseDeserialize(b);
  };

  constructor(
    private readonly credentials?: grpc.ChannelCredentials,
    private readonly channelOptions: grpc.ChannelOptions = {},
    /** This cell's bearer token, sent with every report (null: none). */
    private readonly token: string | null = null,
  ) {}

  report(address: string, req: ReportRequestMessage, deadlineMs: number): Promise<LeaseCallResult> {
    const md = new grpc.Metadata();
    if (this.token !== null) md.set('authorization', `Bearer ${this.token}`);
    return new Promise((resolve) => {
      this.client(address).makeUnaryRequest(
        this.svc.report.path,
        this.serialize,
        this.deserialize,
        req,
        md,
        { deadline: Date.now() + deadlineMs },
        (err: grpc.ServiceError | null, res?: ReportResponseMessage) => {
          if (err === null && res !== undefined) {
            resolve({ res });
            return;
          }
          if (err === null) {
            resolve({ err: { code: grpc.status.INTERNAL, details: 'empty answer' } });
            return;
          }
          resolve({ err: leaseCallError(err) });
        },
      );
    });
  }

  traffic(): { readonly reportBytes: number; readonly answerBytes: number } {
    return { reportBytes: this.reportBytes, answerBytes: this.answerBytes };
  }

  close(): void {
    for (const c of this.clients.values()) c.close();
    this.clients.clear();
  }

  private client(address: string): grpc.Client {
    let c = this.clients.get(address);
    if (c === undefined) {
      c = new this.Client(address, this.credentials ?? grpc.credentials.createInsecure(), {
        ...CHANNEL_OPTIONS,
        ...this.channelOptions,
      });
      this.clients.set(address, c);
    }
    return c;
  }
}

interface HeldGrant {
  readonly epoch: number;
  /** The lease lapsed since this grant arrived: floor only, until an answer re-confirms the key (same epoch or
   * newer). */
  readonly suspended: boolean;
  readonly rate: number;
  readonly burst: number;
  readonly floorRate: number;
  readonly floorBurst: number;
  readonly version: number;
  readonly parent: string | null;
}

/** What the agent knows of the coordinator's unknown-tenant policy before the first answer. */
const INITIAL_UNKNOWN_POLICY = 'deny';

export interface LeaseClientStatus {
  readonly state: LeaseState;
  readonly target: string;
  readonly leader: string | null;
  readonly incarnation: string;
  /** ms until the lease expires (≤ 0: expired or none). */
  readonly leaseRemainingMs: number;
  /** Grants in force (leased, not suspended). */
  readonly grants: number;
  /** Grants held on their floors since the lease lapsed, waiting to be re-confirmed by an answer. */
  readonly suspendedGrants: number;
  readonly reportsOk: number;
  readonly reportsFailed: number;
  /** Keys whose grant was evicted (idle past --max-lease-keys) or not taken from a full picture, so far. */
  readonly released: number;
  /** Releases not yet delivered to a leader (parked ones included). */
  readonly releasesPending: number;
  /** Of those, the ones a leader took but parked (releases_parked): sent again once a session drops slices. */
  readonly releasesParked: number;
  /** Encoded bytes of the reports sent and the answers received so far (0: the transport does not count). */
  readonly reportBytes: number;
  readonly answerBytes: number;
}

export class LeaseClient {
  private readonly transport: LeaseTransport;
  private readonly timers: LeaseTimers;
  private readonly wall: () => number;
  private readonly random: () => number;
  private readonly newIncarnation: () => string;
  private readonly interval: number;
  /** The configured per-call deadline. */
  private readonly deadline: number;
  /** The deadline grown for the leader's address after its calls ran out of time (a leader whose rounds
   * commit late, a busy machine), halved back after answers that came quickly (deadlineFor()). */
  private grownDeadline: number;
  /** The address the cluster names as leader: the last one that answered, or that a follower named;
   * null once a follower knows no leader or the address failed otherwise. Only it gets the grown deadline. */
  private leaderAddress: string | null = null;
  /** The last lease TTL an answer gave (the grown deadline stays under half of it). */
  private lastTtlMs = Infinity;
  private readonly windowMs: number;
  private readonly mono: () => number;
  /** This agent's incarnation: one per process (a lapse keeps it, see "Fail-static"). */
  private readonly incarnation: string;
  /** The lease generation of this incarnation's grants (lease-deadline.ts); null without a deadline writer. */
  private generation: number | null;
  private target: string;
  private nextConfigured = 0;
  private leader: string | null = null;
  private state: LeaseState = 'none';
  private leaseExpiresAt = -Infinity;
  private readonly grants = new Map<string, HeldGrant>();
  private pendingAcks = new Map<string, number>();
  /** What the reports carry: acks and changed demand within a byte budget, sweeps (velocity-report.ts). */
  private reporter = new VelocityReporter();
  /** Keys with an entry posted through onOverrides (grants, floors, pending domains, unknown markers). */
  private readonly posted = new Map<string, 'slice' | 'pending' | 'unknown'>();
  /** A full answer arrived in this incarnation (until then every report asks for one). */
  private haveFull = false;
  /** A full picture arriving in pages (paged answers): the answerSeq of its first page, the next one
   * expected, whether none was missed, and the keys its pages carried. */
  private picture: { since: number; next: number; whole: boolean; keys: Set<string> } | null = null;
  private unknownPolicy: string = INITIAL_UNKNOWN_POLICY;
  private capsVersion = 0;
  private cappedDomains = new Set<string>();
  private failures = 0;
  private inFlight = false;
  /** An acknowledgement is waiting: report again right after the call in flight. */
  private soon = false;
  private timer: unknown = null;
  private expiryTimer: unknown = null;
  private stopped = false;
  private reportsOk = 0;
  private reportsFailed = 0;
  /** The held keys' recency, the bound, the releases waiting (held-keys.ts). */
  private readonly held: HeldKeys;
  /** The last answer's leader takes releases (ReportResponse.releases): only then are keys evicted. */
  private leaderTakesReleases = false;
  private releasedTotal = 0;

  constructor(private readonly opts: LeaseClientOptions) {
    if (opts.coordinators.length === 0) throw new Error('LeaseClient: no coordinator address');
    this.interval = opts.intervalMs ?? DEFAULT_SYNC_INTERVAL_MS;
    this.deadline = opts.deadlineMs ?? Math.max(50, Math.floor(this.interval * 0.8));
    this.grownDeadline = this.deadline;
    this.windowMs = opts.velocityWindowMs ?? 500;
    this.mono = opts.monotonicMs ?? (() => performance.now());
    this.transport =
      opts.transport ?? new GrpcLeaseTransport(opts.credentials, opts.channelOptions, opts.token ?? null);
    this.timers = opts.timers ?? PROCESS_TIMERS;
    this.wall = opts.wallMs ?? Date.now;
    this.random = opts.random ?? Math.random;
    this.newIncarnation = opts.newIncarnation ?? randomUUID;
    this.incarnation = this.newIncarnation();
    this.held = new HeldKeys(opts.maxKeys ?? Infinity);
    this.generation = opts.deadline?.currentGeneration() ?? null;
    this.nextConfigured = Math.floor(this.random() * opts.coordinators.length);
    this.target = opts.coordinators[this.nextConfigured] as string;
  }

  start(): void {
    this.schedule(0);
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== null) this.timers.clearTimeout(this.timer);
    if (this.expiryTimer !== null) this.timers.clearTimeout(this.expiryTimer);
    this.timer = null;
    this.expiryTimer = null;
    this.transport.close();
  }

  status(): LeaseClientStatus {
    return {
      state: this.state,
      target: this.target,
      leader: this.leader,
      incarnation: this.incarnation,
      leaseRemainingMs: this.state === 'leased' ? this.leaseExpiresAt - this.mono() : 0,
      grants: this.leasedGrants(),
      suspendedGrants: this.grants.size - this.leasedGrants(),
      reportsOk: this.reportsOk,
      reportsFailed: this.reportsFailed,
      released: this.releasedTotal,
      releasesPending: this.held.pending,
      releasesParked: this.held.parkedCount,
      reportBytes: this.transport.traffic?.().reportBytes ?? 0,
      answerBytes: this.transport.traffic?.().answerBytes ?? 0,
    };
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    if (this.timer !== null) this.timers.clearTimeout(this.timer);
    this.timer = this.timers.setTimeout(() => {
      this.timer = null;
      void this.tick();
    }, ms);
  }

  private velocityMessages(): VelocityMessage[] {
    const perS = 1000 / this.windowMs;
    const now = new Map<string, VelocityMessage>();
    for (const v of this.opts.velocity()) {
      if (!QUOTA_KEY.test(v.key)) continue;
      const prev = now.get(v.key);
      const allowed = (prev?.allowedPerS ?? 0) + v.allowed * perS;
      const refused = (prev?.refusedPerS ?? 0) + v.refused * perS;
      now.set(v.key, { key: v.key, allowedPerS: allowed, refusedPerS: refused });
    }
    // Keys in use are the most recently used, and never evicted while they are.
    const demand = new Set<string>();
    for (const [key, m] of now) {
      if (!(m.allowedPerS + m.refusedPerS > 0)) continue;
      demand.add(key);
      if (this.grants.has(key)) this.held.touch(key);
    }
    this.held.setDemand(demand);
    return [...now.values()];
  }

  /** An extra report shortly (to acknowledge new grants), without waiting for the interval. */
  private reportSoon(): void {
    if (this.stopped || this.failures > 0) return;
    if (this.inFlight) this.soon = true;
    else this.schedule(ACK_REPORT_DELAY_MS);
  }

  private async tick(): Promise<void> {
    if (this.stopped || this.inFlight) return;
    this.inFlight = true;
    this.soon = false;
    const startedAt = this.mono();
    try {
      await this.reportOnce();
    } finally {
      this.inFlight = false;
    }
    if (this.stopped) return;
    if (this.soon && this.failures === 0) {
      this.schedule(ACK_REPORT_DELAY_MS);
    } else if (this.failures === 0) {
      this.schedule(Math.max(0, this.interval - (this.mono() - startedAt)));
    } else {
      this.schedule(this.retryDelay());
    }
  }

  /** The delay before the next report after `failures` failed ones in a row. Within a round over the
   * configured coordinators the next one is tried at once; after each whole round the delay doubles
   * (interval … 4 × interval, jittered). While a lease is live the delay leaves room for three more
   * tries before it runs out, so a leader change does not let a healthy cell's lease lapse. */
  private retryDelay(): number {
    const jitter = 0.5 + this.random() * 0.5;
    const n = this.opts.coordinators.length;
    if (this.failures % n !== 0) return NEXT_COORDINATOR_DELAY_MS * jitter;
    const rounds = this.failures / n;
    let backoff = Math.min(this.interval * 4, this.interval * 2 ** Math.min(rounds - 1, 3));
    if (this.state === 'leased')
      backoff = Math.min(backoff, Math.max(this.interval / 4, (this.leaseExpiresAt - this.mono()) / 3));
    return backoff * jitter;
  }

  /**
   * The deadline of the next call. A call that runs out of time is lost work on both sides: the leader
   * still commits its round, and the next report carries the same acknowledgements and demand again.
   * When every answer takes longer than the configured deadline (a leader whose rounds commit late
   * under load), a fixed deadline means no answer ever arrives and the cell never leaves its floors;
   * so each DEADLINE_EXCEEDED doubles the deadline that call had, up to MAX_DEADLINE_FACTOR × the
   * configured one and half the lease TTL. Only the address the cluster names as leader gets it (the
   * last one that answered, or that a follower named): any other address, and every address once a
   * follower says it knows no leader, has the configured deadline, so a leader gone silent costs what it
   * did before as soon as the followers notice. While a lease is live the deadline is at most half of
   * what is left of it (never below the configured one), leaving as long a try elsewhere. This is safe
   * for the bound: a lease is counted from when its report was sent, however late the answer.
   */
  private deadlineFor(address: string): number {
    if (address !== this.leaderAddress) return this.deadline;
    if (this.state !== 'leased') return this.grownDeadline;
    const room = (this.leaseExpiresAt - this.mono()) / 2;
    return Math.max(this.deadline, Math.min(this.grownDeadline, room));
  }

  /** One report to the current target. Exposed for tests. */
  async reportOnce(): Promise<boolean> {
    const incarnation = this.incarnation;
    const reporter = this.reporter;
    const page = reporter.page(this.velocityMessages(), this.pendingAcks);
    const acks: AckMessage[] = page.acks;
    const req: ReportRequestMessage = {
      cellId: this.opts.cellId,
      incarnation,
      sentAtMs: this.wall(),
      acks,
      velocity: page.velocity,
      failOpenTotal: this.opts.failOpenTotal?.() ?? 0,
      capsVersion: this.capsVersion,
      wantFull: !this.haveFull,
      velocitySweep: page.sweep,
      velocitySweepDone: page.sweepDone,
      velocitySweepStart: page.sweepStart,
      pagedAnswers: true,
      released: this.held.page(),
    };
    const address = this.target;
    const sentAt = this.mono();
    const used = this.deadlineFor(address);
    const result = await this.transport.report(address, req, used);
    if (this.stopped) return false;
    if ('err' in result) {
      if (result.err.code === grpc.status.DEADLINE_EXCEEDED) {
        // Grown from the deadline this call had; the leader keeps its address until a follower says otherwise.
        const cap = Math.max(this.deadline, Math.min(this.deadline * MAX_DEADLINE_FACTOR, this.lastTtlMs / 2));
        this.grownDeadline = Math.min(cap, Math.max(this.grownDeadline, used * 2));
      } else if (address === this.leaderAddress) {
        this.leaderAddress = null;
      }
      this.onFailure(address, result.err);
      return false;
    }
    this.leaderAddress = address;
    if (Number.isFinite(result.res.leaseTtlMs) && result.res.leaseTtlMs > 0) this.lastTtlMs = result.res.leaseTtlMs;
    if (this.mono() - sentAt < this.grownDeadline / 4)
      this.grownDeadline = Math.max(this.deadline, this.grownDeadline / 2);
    this.reportsOk++;
    this.failures = 0;
    this.leader = result.res.leaderId === '' ? null : result.res.leaderId;
    // Acknowledged: drop what was sent; the demand sent is what the leader holds now.
    for (const a of acks) if (this.pendingAcks.get(a.key) === a.epoch) this.pendingAcks.delete(a.key);
    reporter.delivered(page);
    if (result.res.velocityResync === true) reporter.resync();
    this.leaderTakesReleases = result.res.releases === true;
    // A leader that does not take releases keeps sending the grants given back: they are taken again. One that
    // took them but parked them (its session drops no slice yet) has them sent again once an answer comes
    // without the flag, so that their slices are dropped then (held-keys.ts).
    let unparked = false;
    if (this.leaderTakesReleases && result.res.releasesParked === true) this.held.park(req.released ?? []);
    else {
      unparked = this.held.unpark();
      if (this.leaderTakesReleases) this.held.delivered(req.released ?? []);
      else for (const r of req.released ?? []) this.held.unrelease(r.key);
    }
    this.applyAnswer(result.res, sentAt);
    if (this.leaderTakesReleases) this.evictIdle();
    // What did not fit in this report goes in the next one, at once; so does the next page of grants, and the
    // releases unparked.
    if (page.more || result.res.more === true || unparked) this.reportSoon();
    return true;
  }

  private onFailure(address: string, err: LeaseCallError): void {
    this.reportsFailed++;
    if (err.code === grpc.status.FAILED_PRECONDITION) {
      const hintedId = err.leaderId;
      const own = typeof hintedId === 'string' ? this.opts.coordinatorById?.get(hintedId) : undefined;
      const hinted = own ?? err.leaderAddress;
      if (typeof hinted === 'string' && hinted !== '' && hinted !== address) {
        this.opts.logger.info({ from: address, to: hinted }, 'following the coordinator leader');
        this.leaderAddress = hinted;
        this.target = hinted;
        this.failures = 0;
        this.schedule(0);
        return;
      }
    }
    // A follower that knows no leader: no address keeps the grown deadline.
    if (err.code === grpc.status.FAILED_PRECONDITION) this.leaderAddress = null;
    this.failures++;
    if (
      (err.code === grpc.status.UNAUTHENTICATED || err.code === grpc.status.PERMISSION_DENIED) &&
      (this.failures === 1 || this.failures % 20 === 0)
    ) {
      this.opts.logger.error(
        { coordinator: address, code: err.code, error: err.details, cell: this.opts.cellId },
        "the coordinator refused this cell's identity " +
          `(${err.code === grpc.status.UNAUTHENTICATED ? 'UNAUTHENTICATED' : 'PERMISSION_DENIED'}): ` +
          'no lease until it is fixed (--tls-cert naming the cell, or --lease-token-file); global quotas stay on ' +
          'their floors',
      );
    }
    this.nextConfigured = (this.nextConfigured + 1) % this.opts.coordinators.length;
    this.target = this.opts.coordinators[this.nextConfigured] as string;
    const log =
      this.failures === 1 || this.failures % 20 === 0
        ? this.opts.logger.warn.bind(this.opts.logger)
        : this.opts.logger.debug.bind(this.opts.logger);
    log(
      {
        coordinator: address,
        code: err.code,
        error: err.details,
        failures: this.failures,
        next: this.target,
        nextDeadlineMs: this.deadlineFor(this.target),
        ...(this.opts.failureHint === undefined || !mayBeAuthFailure(err) ? {} : { hint: this.opts.failureHint }),
      },
      'lease report failed',
    );
  }

  private applyAnswer(res: ReportResponseMessage, sentAt: number): void {
    const ttl = Number.isFinite(res.leaseTtlMs) && res.leaseTtlMs > 0 ? res.leaseTtlMs : 0;
    this.leaseExpiresAt = Math.max(this.leaseExpiresAt, sentAt + ttl);
    // An answer so late that the lease it renewed is already over: its grants apply as floors only.
    const live = this.leaseExpiresAt > this.mono();
    if (live) this.opts.deadline?.renew(this.leaseExpiresAt);
    const changed = new Map<string, OverrideEntry>();
    const toAck: [string, number][] = [];
    const forgotten: string[] = [];
    const granted = new Set<string>();
    const newHeld = new Map<string, HeldGrant>();
    const picturePage = res.full || (res.fullPicture ?? 0) > 0;
    for (const g of res.grants) {
      if (!QUOTA_KEY.test(g.key) || !validGrant(g)) continue;
      if (!this.grants.has(g.key) && !this.takeUnheld(g, picturePage)) continue;
      granted.add(g.key);
      const held = this.grants.get(g.key);
      // A suspended grant is re-confirmed by the same epoch (the answer holds the ledger's value now).
      if (held !== undefined && (held.epoch > g.epoch || (held.epoch === g.epoch && !held.suspended))) continue;
      if (g.deleted) {
        // The quota was deleted: acknowledge its zero grant, then forget the key.
        toAck.push([g.key, g.epoch]);
        this.grants.delete(g.key);
        this.held.forget(g.key);
        forgotten.push(g.key);
        continue;
      }
      const parent =
        typeof g.parent === 'string' && QUOTA_KEY.test(g.parent) && g.parent.startsWith('tier/') ? g.parent : null;
      const h: HeldGrant = {
        epoch: g.epoch,
        suspended: false,
        rate: g.rate,
        burst: g.burst,
        floorRate: g.floorRate,
        floorBurst: g.floorBurst,
        version: g.version,
        parent,
      };
      if (!live) {
        // Its lease is already over: the floor only, and the grant is neither held nor acknowledged,
        // so a later lease never resumes it as leased (the coordinator may have released it
        // meanwhile without a new epoch; found by the quota simulation, seed 1167). The next answer
        // carries it again.
        changed.set(g.key, floorEntry(g.key, h));
        continue;
      }
      toAck.push([g.key, g.epoch]);
      this.grants.set(g.key, h);
      this.held.touch(g.key);
      newHeld.set(g.key, h);
      changed.set(g.key, leasedEntry(g.key, h, this.generation));
    }
    if (this.applyDefinitions(res, granted, forgotten, changed)) this.haveFull = true;
    if (live && this.state !== 'leased') {
      // Resuming (or the first lease): the grants not suspended are in force again (after a lapse, every
      // grant held is suspended until an answer re-confirms it: see "Fail-static" above).
      for (const [key, g] of this.grants)
        if (!changed.has(key) && !g.suspended) changed.set(key, leasedEntry(key, g, this.generation));
      this.setState('leased');
      this.opts.logger.info(
        { leader: this.leader, grants: this.leasedGrants(), suspended: this.grants.size - this.leasedGrants() },
        'lease acquired: global quotas run on leased grants',
      );
    }
    if (live) this.armExpiry();
    if (changed.size === 0 && toAck.length === 0) return;
    const ack = (clamped: ClampedEntry[] | void): void => {
      if (clamped !== undefined && clamped.length > 0) {
        this.opts.logger.warn(
          { clamped: clamped.slice(0, 20), count: clamped.length },
          'grants whose GCRA window the bucket table cannot hold were clamped to the deepest bucket that fits ' +
            '(they admit less than granted)',
        );
      }
      for (const [key, epoch] of toAck)
        if (this.grants.get(key)?.epoch === epoch || forgotten.includes(key)) this.pendingAcks.set(key, epoch);
      // Acknowledge at once rather than at the next interval: a shrink frees capacity for another
      // cell only once acknowledged, so this takes one report interval off every rebalance.
      if (toAck.length > 0) this.reportSoon();
    };
    const failed = (err: unknown): void => {
      // Nothing of this answer is acknowledged; its grants' keys run on their floors (not leased),
      // and the coordinator sends the grants again with the next answer (they are not acknowledged).
      for (const [key] of toAck) {
        this.grants.delete(key);
        this.held.forget(key);
      }
      this.opts.logger.error(
        { err, grants: toAck.length },
        'a lease answer could not be applied: its quotas stay on their floors until the next answer',
      );
      try {
        const floors = [...newHeld].map(([key, h]) => floorEntry(key, h));
        const r = this.opts.onOverrides(floors);
        if (r instanceof Promise)
          r.catch((e: unknown) => this.opts.logger.error({ err: e }, 'could not fall back to the floors either'));
      } catch (e) {
        this.opts.logger.error({ err: e }, 'could not fall back to the floors either');
      }
    };
    try {
      const applied = this.opts.onOverrides([...changed.values()]);
      if (applied instanceof Promise) void applied.then(ack, failed);
      else ack(applied);
    } catch (err) {
      failed(err);
    }
  }

  /**
   * Whether a grant for a key this agent holds no grant for is taken. Not the one a waiting release gave
   * back (at or below its epoch; a newer one is taken and ends the release). Not, while the leader takes
   * releases and keys are bounded, one a full picture carries for a key with no demand and no entry:
   * acknowledged (the cell uses nothing for it) and released at once, so a picture of a million slices
   * (a new leader) does not make the agent hold a million grants.
   */
  private takeUnheld(g: GrantMessage, picturePage: boolean): boolean {
    const gaveBack = this.held.released(g.key);
    if (gaveBack !== undefined && g.epoch <= gaveBack) return false;
    if (gaveBack !== undefined) this.held.unrelease(g.key);
    if (
      !picturePage ||
      g.deleted ||
      !this.leaderTakesReleases ||
      !Number.isFinite(this.held.max) ||
      this.held.hasDemand(g.key) ||
      this.posted.has(g.key)
    )
      return true;
    this.pendingAcks.set(g.key, g.epoch);
    this.held.release(g.key, g.epoch);
    this.releasedTotal++;
    return false;
  }

  /**
   * Past the bound (--max-lease-keys), the least recently used keys without demand are evicted: their
   * entries removed in every thread (their checks are refused until a grant is back) and their grants
   * released to the leader with the next report (held-keys.ts: why the bound holds).
   */
  private evictIdle(): void {
    const victims = this.held.victims(this.grants.size, (key) => this.grants.has(key));
    if (victims.length === 0) return;
    const entries: OverrideEntry[] = [];
    const gone: [string, number][] = [];
    for (const key of victims) {
      const g = this.grants.get(key);
      if (g === undefined) continue;
      this.grants.delete(key);
      this.posted.delete(key);
      this.reporter.forget(key);
      gone.push([key, g.epoch]);
      entries.push({ key, remove: true });
    }
    this.releasedTotal += entries.length;
    this.opts.logger.debug(
      { evicted: entries.length, held: this.grants.size, maxKeys: this.held.max },
      'idle keys evicted past --max-lease-keys: their grants are released to the leader',
    );
    // Released only once every thread has removed them (as a grant is acknowledged only once every
    // thread decides with it): what the leader is told the cell does not use, no thread uses. A key
    // granted again meanwhile is held, not released.
    const release = (): void => {
      for (const [key, epoch] of gone) if (!this.grants.has(key)) this.held.release(key, epoch);
      this.reportSoon();
    };
    const failed = (err: unknown): void =>
      this.opts.logger.error({ err, keys: gone.length }, 'could not remove the evicted keys: they are not released');
    try {
      const applied = this.opts.onOverrides(entries);
      if (applied instanceof Promise) applied.then(release, failed);
      else release();
    } catch (err) {
      failed(err);
    }
  }

  /**
   * The non-grant parts of an answer: a full answer's dropped keys, the unknown-tenant policy and
   * unknown keys, the capped domains. Adds the entries to `changed`. True when the answer completed a
   * full picture (every page of it received).
   */
  private applyDefinitions(
    res: ReportResponseMessage,
    granted: ReadonlySet<string>,
    forgotten: readonly string[],
    changed: Map<string, OverrideEntry>,
  ): boolean {
    const picture = this.pictureKeys(res, granted);
    for (const key of forgotten) {
      this.posted.delete(key);
      changed.set(key, { key, remove: true });
    }
    for (const key of changed.keys()) if (!forgotten.includes(key)) this.posted.set(key, 'slice');
    const policy = res.unknownTenant === 'allow' ? 'allow' : 'deny';
    // tier:NAME: the coordinator grants such a tenant as one of tier NAME; until then it is refused, as under deny.
    if (res.unknownTenant !== this.unknownPolicy) {
      this.opts.logger.info({ unknownTenant: res.unknownTenant }, "the coordinator's unknown-tenant policy");
      this.unknownPolicy = res.unknownTenant;
    }
    if (res.capsIncluded && Number.isFinite(res.capsVersion)) {
      this.capsVersion = res.capsVersion;
      this.cappedDomains = new Set(res.cappedDomains.filter((d) => QUOTA_KEY.test(`domain/${d}`)));
    }
    // Drop what the coordinator no longer defines for this cell.
    for (const [key, kind] of [...this.posted]) {
      const domainCapped = key.startsWith('domain/') && this.cappedDomains.has(key.slice(7));
      const drop =
        (kind === 'unknown' && policy !== 'allow') ||
        (kind === 'pending' && !domainCapped) ||
        (kind === 'slice' && picture !== null && !picture.has(key));
      if (!drop) continue;
      this.grants.delete(key);
      this.held.forget(key);
      if (domainCapped) {
        this.posted.set(key, 'pending');
        changed.set(key, { key, rate: 0, burst: 0, leased: false });
      } else {
        this.posted.delete(key);
        changed.set(key, { key, remove: true });
      }
    }
    // A capped domain this cell holds nothing for: refused until its grant arrives (reported as demand).
    for (const d of this.cappedDomains) {
      const key = `domain/${d}`;
      if (this.posted.has(key) || this.grants.has(key)) continue;
      this.posted.set(key, 'pending');
      changed.set(key, { key, rate: 0, burst: 0, leased: false });
    }
    if (policy === 'allow') {
      for (const key of res.unknownKeys) {
        if (!QUOTA_KEY.test(key) || !key.startsWith('tenant/') || this.grants.has(key) || granted.has(key)) continue;
        this.posted.set(key, 'unknown');
        changed.set(key, { key, allowUnknown: true });
      }
    }
    return picture !== null;
  }

  /**
   * The keys of the full picture this answer completes, or null. A picture in pages counts only if
   * every page arrived (no gap in answerSeq from its first page): else nothing is dropped and the
   * next report asks for a new picture. An answer from a coordinator without pages is whole by itself.
   */
  private pictureKeys(res: ReportResponseMessage, granted: ReadonlySet<string>): ReadonlySet<string> | null {
    const since = res.fullPicture ?? 0;
    if (!(since > 0)) {
      this.picture = null;
      return res.full ? granted : null;
    }
    const seq = res.answerSeq ?? 0;
    // Its first page starts it afresh (answerSeq restarts with every session: a new leader, a new incarnation).
    if (this.picture?.since !== since || seq === since)
      this.picture = { since, next: since, whole: true, keys: new Set() };
    const p = this.picture;
    if (seq !== p.next) p.whole = false;
    p.next = seq + 1;
    for (const key of granted) p.keys.add(key);
    if (!res.full) return null;
    this.picture = null;
    return p.whole ? p.keys : null;
  }

  private armExpiry(): void {
    if (this.expiryTimer !== null) this.timers.clearTimeout(this.expiryTimer);
    const wait = this.leaseExpiresAt - this.mono();
    this.expiryTimer = this.timers.setTimeout(() => this.checkExpiry(), Math.max(0, wait));
  }

  /** Drops to floors when the lease has expired (also called by the timer). */
  checkExpiry(): void {
    if (this.state !== 'leased') return;
    const left = this.leaseExpiresAt - this.mono();
    if (left > 0) {
      this.armExpiry();
      return;
    }
    const entries: OverrideEntry[] = [];
    for (const [key, g] of this.grants) {
      if (g.suspended) continue;
      entries.push(floorEntry(key, g));
      this.grants.set(key, { ...g, suspended: true });
    }
    // The same incarnation: the leader keeps this cell's demand and session; a full picture re-confirms
    // the suspended grants (an acknowledgement still waiting is true: no older epoch is used any more).
    this.haveFull = false;
    this.picture = null;
    // Every deciding thread: grants of the old generation are floors from now on (they already are,
    // by the deadline; this keeps them so once a new lease renews it).
    if (this.opts.deadline !== undefined) this.generation = this.opts.deadline.nextGeneration();
    this.setState('expired');
    this.opts.logger.warn(
      { floors: entries.length, leader: this.leader },
      'lease expired: every global quota drops to its floor (fail-static) until the coordinator is reached again ' +
        '(the grants held wait, suspended, for an answer to confirm them)',
    );
    if (entries.length === 0) return;
    try {
      const applied = this.opts.onOverrides(entries);
      if (applied instanceof Promise)
        applied.catch((err: unknown) => this.opts.logger.error({ err }, 'could not apply the floors'));
    } catch (err) {
      this.opts.logger.error({ err }, 'could not apply the floors');
    }
  }

  /** Grants in force (held and not suspended). */
  private leasedGrants(): number {
    let n = 0;
    for (const g of this.grants.values()) if (!g.suspended) n++;
    return n;
  }

  private setState(s: LeaseState): void {
    if (this.state === s) return;
    this.state = s;
    this.opts.onStateChange?.(s);
  }
}

function validGrant(g: GrantMessage): boolean {
  return (
    Number.isSafeInteger(g.epoch) &&
    g.epoch > 0 &&
    [g.rate, g.burst, g.floorRate, g.floorBurst].every((v) => Number.isFinite(v) && v >= 0)
  );
}

/** While leased a cell may use max(grant, floor) (the ledger counts a cell at least at its floor);
 * with a deadline in shared memory, only while the lease of `generation` lasts, then the floor. */
function leasedEntry(key: string, g: HeldGrant, generation: number | null): OverrideEntry {
  const entry = {
    key,
    rate: Math.max(g.rate, g.floorRate),
    burst: Math.max(g.burst, g.floorBurst),
    leased: true,
    parent: g.parent,
    epoch: g.epoch,
  };
  return generation === null
    ? entry
    : { ...entry, lease: generation, floorRate: g.floorRate, floorBurst: g.floorBurst };
}

/** Without a live lease a cell uses the floor stamped on its latest grant (the ledger holds it counted). */
function floorEntry(key: string, g: HeldGrant): OverrideEntry {
  return { key, rate: g.floorRate, burst: g.floorBurst, leased: false, parent: g.parent, epoch: g.epoch };
}

/**
 * Whether a failed report may be an authentication failure (what the failure hint is about): the coordinator refused
 * the identity, or a TLS handshake failed. A reset connection (a killed leader), a deadline or a refused connection
 * is not, and gets no hint.
 */
function mayBeAuthFailure(err: LeaseCallError): boolean {
  if (err.code === grpc.status.UNAUTHENTICATED || err.code === grpc.status.PERMISSION_DENIED) return true;
  return err.code === grpc.status.UNAVAILABLE && /certificate|handshake|ssl|alert/i.test(err.details);
}
