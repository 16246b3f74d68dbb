// createLimiter: the cell agent's decision inside a Node process. The same rules loader, Decider and
// bucket table as the agent (cell-agent/), one thread, no sockets on the request path. With
// `coordinators` and `cell`, the replica runs the agent's own LeaseClient: it reports its velocity
// every 500 ms, decides global quotas on the leased grants, drops to the floors stamped on them when
// the lease lapses (fail-static) and starts on its static share before the first grant — the same
// floors and the same bound as an agent (cell-agent/README.md, "Leases").
//
// check({ descriptors, hits }) is synchronous and allocation-light: the descriptors go to
// Decider.decide through the agent's CheckService, which answers fail-open (marked, counted, logged
// at most once a second) if the decision throws. Up to four descriptors (one; a global limiter and a
// per-client one: the common cases) travel in request objects reused by every check, so they reach
// the Decider's fast paths with nothing allocated on the way; what is allocated is the answer the
// caller keeps.
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { BucketTable } from '../cell-agent/buckets/bucket-table.js';
import { PerfClock } from '../cell-agent/buckets/elapsed-clock.js';
import type { GcraLimit } from '../cell-agent/buckets/gcra.js';
import { CheckService } from '../cell-agent/decide/check-service.js';
import { Decider } from '../cell-agent/decide/decide.js';
import { loadQuotaFile, parseQuotaFile } from '../cell-agent/decide/quota-file.js';
import { CoordinatedQuotas, StaticQuotas } from '../cell-agent/decide/quotas.js';
import type { QuotaFile } from '../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../cell-agent/decide/request-check.js';
import { LeaseClient } from '../cell-agent/lease/lease-client.js';
import type { LeaseState } from '../cell-agent/lease/lease-client.js';
import { QuotaOverrides, applyLeaseEntries } from '../cell-agent/lease/quota-overrides.js';
import { loadLeaseCredentials } from '../cell-agent/lease/lease-credentials.js';
import { LeaseDeadline, deadlineWriter, monotonicMsOf } from '../cell-agent/lease/lease-deadline.js';
import { StatsWriter, createStatsShared } from '../cell-agent/observe/stats.js';
import type { RlsDescriptor, RlsDescriptorStatus, RlsEntry, RlsRequest } from '../cell-agent/messages/rls-messages.js';
import { RLS_CODE } from '../cell-agent/messages/rls-messages.js';
import { compileRules } from '../cell-agent/rules/rules-compile.js';
import type { RuleSet } from '../cell-agent/rules/rules-compile.js';
import { loadRules, watchRules } from '../cell-agent/rules/rules-load.js';
import { parseRulesObject } from '../cell-agent/rules/rules-schema.js';
import { VelocityKeys, VelocityTable } from '../cell-agent/velocity/velocity-table.js';
import type { Logger } from '../shared/logging.js';
import { IdentityMemo } from '../shared/identity-memo.js';
import { registerLimiterMetrics } from './metrics.js';
import type { LimiterCounters } from './metrics.js';
import { parseLimiterOptions } from './options.js';
import type { LimiterLogger, LimiterOptions } from './options.js';
import { CellquotaError } from '../shared/errors.js';

/** One descriptor: its entries, in order (`[{ key: 'remote_address', value: '192.0.2.1' }]`). */
export type Descriptor = readonly RlsEntry[];

export interface CheckInput {
  readonly descriptors: readonly Descriptor[];
  /** Tokens this request takes from every level (default 1; 0 asks without taking). */
  readonly hits?: number;
}

/** The state of one descriptor's tightest level after the check. */
export interface PolicyStatus {
  /** Index of the descriptor in the request. */
  readonly descriptor: number;
  /** The rule's `name`, else the descriptor's keys joined by '.' (global quotas: the tier's name). */
  readonly name: string;
  /** Requests per window (`requests_per_unit`, or a leased slice per second/minute/...). */
  readonly limit: number;
  readonly windowSeconds: number;
  /** The bucket: tokens per second and depth. */
  readonly ratePerSecond: number;
  readonly burst: number;
  readonly remaining: number;
  /** Whole seconds until the bucket is full again (refused: until the refused hits would pass). */
  readonly resetSeconds: number;
  readonly overLimit: boolean;
}

export interface LimitDecision {
  /** Let the request through. False only when the rules refused it and the limiter is not in shadow mode. */
  readonly allowed: boolean;
  /** The rules refused it (in shadow mode the request is let through anyway). */
  readonly overLimit: boolean;
  /** Whole seconds until the refused hits would pass (≥ 1 when over the limit, else 0). */
  readonly retryAfterSeconds: number;
  /** A global quota was decided on a floor or static share (no live lease), or the bucket table was full. */
  readonly degraded: boolean;
  /** Let through without a decision: an internal error (counted and logged). */
  readonly failOpen: boolean;
  /** One entry per descriptor that met a limit, in request order. */
  readonly policies: readonly PolicyStatus[];
}

export interface LimiterStatus {
  readonly name: string;
  readonly domain: string;
  readonly rules: string | null;
  /** 'off' without coordinators; else the lease client's state. */
  readonly lease: 'off' | LeaseState;
  readonly keys: number;
}

export interface Limiter {
  readonly name: string;
  readonly domain: string;
  /** Where the metrics are: the registry passed in, or the limiter's own. */
  readonly registry: Registry;
  readonly shadow: boolean;
  /** A fresh decision object per call: the caller may keep it. */
  check(input: CheckInput): LimitDecision;
  /**
   * check(), with the answer written into a decision object (and policy objects) this limiter
   * reuses: valid until its next checkInPlace() — read it at once, keep nothing of it (copy what you
   * keep). In the common case (one descriptor in one local bucket, admitted) nothing is allocated.
   */
  checkInPlace(input: CheckInput): LimitDecision;
  status(): LimiterStatus;
  /** Stops the lease client and the rules watcher, unregisters the metrics. Idempotent. */
  close(): Promise<void>;
}

/** A check the limiter will not decide: the descriptors exceed the agent's request bounds. */
export class LimiterInputError extends CellquotaError {
  readonly code = 'CELLQUOTA_INPUT_INVALID';
  constructor(message: string) {
    super(message);
    this.name = 'LimiterInputError';
  }
}

/** Largest `hits` one check may take (bounded so summed hits stay exact). */
export const MAX_HITS = 1_000_000;

const NS_PER_S = 1_000_000_000n;
const UNIT_SECONDS: Readonly<Record<number, number>> = {
  1: 1,
  2: 60,
  3: 3600,
  4: 86_400,
  5: 2_592_000,
  6: 31_536_000,
  7: 604_800,
};
const NO_POLICIES: readonly PolicyStatus[] = Object.freeze([]);
/** Descriptor counts check() passes in reused request objects (the Decider's fast paths take up to 4). */
const POOLED_DESCRIPTORS = 4;
const NO_ENTRIES: Descriptor = Object.freeze([]);
const ALLOW_NOTHING_MET: LimitDecision = Object.freeze({
  allowed: true,
  overLimit: false,
  retryAfterSeconds: 0,
  degraded: false,
  failOpen: false,
  policies: NO_POLICIES,
});
const FAIL_OPEN_DECISION: LimitDecision = Object.freeze({
  allowed: true,
  overLimit: false,
  retryAfterSeconds: 0,
  degraded: true,
  failOpen: true,
  policies: NO_POLICIES,
});

export async function createLimiter(options: LimiterOptions): Promise<Limiter> {
  const o = parseLimiterOptions(options);
  const logger: LimiterLogger = o.logger ?? pino({ name: 'cellquota', level: 'warn' });

  const ruleSet =
    typeof o.rules === 'string'
      ? await loadRules(o.rules)
      : compileRules(o.rules.map((doc, i) => parseRulesObject(doc, o.rules.length === 1 ? 'rules' : `rules[${i}]`)));
  const domains = [...ruleSet.domains.keys()];
  const domain = o.domain ?? (domains.length === 1 ? domains[0] : undefined);
  if (domain === undefined)
    throw new Error(
      `cellquota createLimiter: the rules have ${domains.length} domains ` +
        `(${domains.join(', ')}); say which with the domain option`,
    );
  if (!ruleSet.domains.has(domain))
    throw new Error(`cellquota createLimiter: the rules have no domain '${domain}' (they have: ${domains.join(', ')})`);
  const name = o.name ?? domain;

  // With coordinators every quota comes from them (as for an agent: CoordinatedQuotas over the lease
  // client's entries); alone, from the tenants option at the static share (the options refuse both).
  const coordinated = o.coordinators.length > 0;
  const creds = coordinated
    ? loadLeaseCredentials({
        cell: o.cell as string,
        tlsCa: o.tlsCa,
        tlsCert: o.tlsCert,
        tlsKey: o.tlsKey,
        tlsServerName: o.tlsServerName,
        leaseTokenFile: o.leaseTokenFile,
      })
    : null;
  const deadline = coordinated ? LeaseDeadline.create() : null;
  const overrides = coordinated ? new QuotaOverrides(deadline) : null;
  const quotaFile: QuotaFile =
    o.tenants === undefined
      ? { tiers: {}, tenants: {} }
      : typeof o.tenants === 'string'
        ? await loadQuotaFile(o.tenants)
        : parseQuotaFile(o.tenants, 'tenants');
  const quotas: StaticQuotas =
    overrides !== null
      ? new CoordinatedQuotas(overrides)
      : new StaticQuotas(quotaFile, { staticShare: o.staticShare, unknownTenant: o.unknownTenant });

  // One clock for everything this limiter does with its own table (decisions, the lease deadline, the
  // velocity window, grants applied): performance.now() read as ns, nothing allocated per check.
  const startNs = process.hrtime.bigint();
  const elapsedClock = new PerfClock(startNs);
  const clock = (): bigint => elapsedClock.nowNs();
  const table = new BucketTable({ capacity: o.tableCapacity, startNs });
  let velocityKeys: VelocityKeys | null = null;
  let velocityTable: VelocityTable | null = null;
  if (coordinated) {
    velocityTable = VelocityTable.create({ capacity: o.velocityCapacity, startNs });
    const keys = new VelocityKeys(velocityTable);
    velocityTable.onNewKey = (slot, gen, key) => keys.learn(slot, gen, key);
    velocityKeys = keys;
  }
  const decider = new Decider(
    { table, quotas, clock, elapsed: elapsedClock, velocity: velocityTable, overrides, deadline },
    {
      bounds: DEFAULT_REQUEST_BOUNDS,
      responseHeaders: false,
      tableFull: o.tableFull,
      staticSlices: !coordinated,
    },
  );
  decider.setRules(ruleSet);
  let rules: RuleSet = ruleSet;
  const stats = createStatsShared(1);
  const service = new CheckService(decider, new StatsWriter(stats, 0), null, logger as Logger);

  const counters: LimiterCounters = { shadowRefused: 0, failOpenOutside: 0, invalidOutside: 0, leaseState: 'off' };
  const registry = o.registry ?? new Registry();
  const unregister = registerLimiterMetrics(registry, { name, stats, table, counters });

  let lease: LeaseClient | null = null;
  if (coordinated && velocityKeys !== null && overrides !== null) {
    const keys = velocityKeys;
    const byId = new Map<string, string>();
    for (const c of o.coordinators) if (c.id !== undefined) byId.set(c.id, grpcAddress(c));
    counters.leaseState = 'none';
    if (creds === null) throw new Error('createLimiter: coordinated without lease credentials');
    lease = new LeaseClient({
      cellId: o.cell as string,
      credentials: creds.channel,
      channelOptions: creds.channelOptions,
      token: creds.token,
      ...(creds.noIdentityHint === undefined ? {} : { failureHint: creds.noIdentityHint }),
      coordinators: o.coordinators.map(grpcAddress),
      coordinatorById: byId,
      logger: logger as Logger,
      velocity: () => keys.snapshot(clock()),
      ...(deadline === null
        ? {}
        : { monotonicMs: monotonicMsOf(clock, startNs), deadline: deadlineWriter(deadline, startNs) }),
      // One thread: the Decider reads the same QuotaOverrides, so a grant is in force once applied.
      onOverrides: (entries) => {
        return applyLeaseEntries(table, overrides, entries, clock());
      },
      onStateChange: (state) => {
        counters.leaseState = state;
      },
    });
    lease.start();
  }

  let unwatch: (() => void) | null = null;
  if (o.watchRules && typeof o.rules === 'string') {
    unwatch = watchRules(
      o.rules,
      (next) => {
        if (!next.domains.has(domain)) {
          logger.error(
            { limiter: name, domain },
            "reloaded rules have no rules for this limiter's domain; keeping the last good rules",
          );
          return;
        }
        rules = next;
        decider.setRules(next);
        logger.info({ limiter: name, fingerprint: next.fingerprint }, 'rules reloaded');
      },
      (error) => {
        logger.error(
          { limiter: name, error: error.message, code: error.code },
          'rules reload failed; keeping the last good rules',
        );
      },
      { initial: ruleSet },
    );
  }

  const shadow = o.shadow;
  let closed = false;

  // Requests of up to POOLED_DESCRIPTORS descriptors travel in objects reused call after call (the
  // decision is synchronous and keeps nothing of them): the wrapper adds no allocation to the decision.
  const pooled: { entries: Descriptor; limit: null; hitsAddend: number | null }[] = Array.from(
    { length: POOLED_DESCRIPTORS },
    () => ({ entries: NO_ENTRIES, limit: null, hitsAddend: null }),
  );
  const pooledRequests: RlsRequest[] = Array.from({ length: POOLED_DESCRIPTORS + 1 }, (_, n) => ({
    domain,
    descriptors: pooled.slice(0, n),
    hitsAddend: 0,
  }));

  // checkInPlace()'s answer: the decision and one policy object per descriptor index, reused.
  // (An array per policy count, so that no array is resized: setting length 0 drops its storage.)
  const reusedPolicies: MutablePolicy[] = [];
  const reusedLists: PolicyStatus[][] = [];
  const reused: Mutable<LimitDecision> = { ...ALLOW_NOTHING_MET };

  /** The decision into `out` (checkInPlace), or a fresh one (out null: check). */
  const decide = (input: CheckInput, out: Mutable<LimitDecision> | null): LimitDecision => {
    const descriptors = input.descriptors;
    if (descriptors.length === 0) return ALLOW_NOTHING_MET;
    const hits = input.hits;
    if (hits !== undefined && !(Number.isSafeInteger(hits) && hits >= 0 && hits <= MAX_HITS))
      throw new LimiterInputError(`hits must be an integer in 0..${MAX_HITS}, got ${String(hits)}`);
    const hitsAddend = hits ?? null;
    const n = descriptors.length;
    let request: RlsRequest;
    if (n <= POOLED_DESCRIPTORS) {
      // The common cases (one descriptor; a global and a per-client one): the pooled request.
      for (let i = 0; i < n; i++) {
        const d = pooled[i] as (typeof pooled)[number];
        d.entries = descriptors[i] as Descriptor;
        d.hitsAddend = hitsAddend;
      }
      request = pooledRequests[n] as RlsRequest;
    } else {
      const rls: RlsDescriptor[] = new Array<RlsDescriptor>(descriptors.length);
      for (let i = 0; i < descriptors.length; i++)
        rls[i] = { entries: descriptors[i] as Descriptor, limit: null, hitsAddend };
      request = { domain, descriptors: rls, hitsAddend: 0 };
    }
    // Read here at once: the service's reused outcome (nothing of it is kept).
    const outcome = service.checkInPlace(request);
    // Hold no reference to the caller's descriptors.
    for (let i = 0; i < n && i < POOLED_DESCRIPTORS; i++) (pooled[i] as (typeof pooled)[number]).entries = NO_ENTRIES;
    if (outcome.kind === 'error') throw new LimiterInputError(outcome.message);
    const response = outcome.response;
    // 'degraded' is CheckService's fail-open answer (an exception inside the decision; no lag guard here).
    if (outcome.verdict === 'degraded') return FAIL_OPEN_DECISION;
    const statuses = response.statuses;
    const limits = outcome.statusLimits;
    let met = 0;
    for (let i = 0; i < statuses.length; i++) if ((statuses[i] as RlsDescriptorStatus).currentLimit !== null) met++;
    // The list at its final length from the start (an empty literal grown by push() allocates a
    // backing store of 17 slots for the first policy: ~150 B of every check()).
    const policies: PolicyStatus[] | null =
      met === 0
        ? null
        : out === null
          ? new Array<PolicyStatus>(met)
          : (reusedLists[met] ??= new Array<PolicyStatus>(met));
    let k = 0;
    for (let i = 0; policies !== null && i < statuses.length; i++) {
      const s = statuses[i] as RlsDescriptorStatus;
      if (s.currentLimit === null) continue;
      const p = out === null ? newPolicy() : (reusedPolicies[i] ??= newPolicy());
      policies[k++] = policyInto(p, i, s, limits[i] ?? null, descriptors[i] as Descriptor);
    }
    const overLimit = outcome.overLimit;
    if (overLimit && shadow) counters.shadowRefused++;
    const allowed = !overLimit || shadow;
    const retryAfterSeconds = overLimit ? wholeSeconds(outcome.retryAfterNs) : 0;
    // With responseHeaders off, the Decider's only header is x-ratelimit-degraded.
    const degraded = response.responseHeadersToAdd.length > 0;
    if (out === null)
      return { allowed, overLimit, retryAfterSeconds, degraded, failOpen: false, policies: policies ?? NO_POLICIES };
    out.allowed = allowed;
    out.overLimit = overLimit;
    out.retryAfterSeconds = retryAfterSeconds;
    out.degraded = degraded;
    out.failOpen = false;
    out.policies = policies ?? NO_POLICIES;
    return out;
  };
  const check = (input: CheckInput): LimitDecision => decide(input, null);
  const checkInPlace = (input: CheckInput): LimitDecision => decide(input, reused);

  const limiter: Limiter = {
    name,
    domain,
    registry,
    shadow,
    check,
    checkInPlace,
    status: () => ({
      name,
      domain,
      rules: rules.fingerprint,
      lease: lease === null ? 'off' : lease.status().state,
      keys: table.size(),
    }),
    close: () => {
      if (!closed) {
        closed = true;
        lease?.stop();
        unwatch?.();
        unregister();
      }
      return Promise.resolve();
    },
  };
  COUNTERS.set(limiter, counters);
  return limiter;
}

const COUNTERS = new WeakMap<Limiter, LimiterCounters>();

/** The counters of a limiter made by createLimiter (for the HTTP integrations' failures around the decision). */
export function countersOf(limiter: Limiter): LimiterCounters | undefined {
  return COUNTERS.get(limiter);
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] };
type MutablePolicy = Mutable<PolicyStatus>;

function newPolicy(): MutablePolicy {
  return {
    descriptor: 0,
    name: '',
    limit: 0,
    windowSeconds: 1,
    ratePerSecond: 0,
    burst: 0,
    remaining: 0,
    resetSeconds: 0,
    overLimit: false,
  };
}

/** A limit's rate (per second) and burst as numbers. */
interface LimitNumbers {
  readonly rate: number;
  readonly burst: number;
}

/** policyInto()'s last two limits and their numbers (limits are immutable; two levels alternate). */
const recentNumbers = new IdentityMemo<GcraLimit, LimitNumbers>();
const NO_LIMIT_NUMBERS: LimitNumbers = Object.freeze({ rate: 0, burst: 0 });

/** A check meets the same limit objects again and again: their numbers are converted from bigint once. */
function limitNumbers(limit: GcraLimit | null): LimitNumbers {
  if (limit === null) return NO_LIMIT_NUMBERS;
  let n = recentNumbers.get(limit);
  if (n === undefined) {
    n = { rate: limit.intervalNs === 0n ? 0 : 1e9 / Number(limit.intervalNs), burst: Number(limit.burst) };
    recentNumbers.set(limit, n);
  }
  return n;
}

function policyInto(
  p: MutablePolicy,
  i: number,
  s: RlsDescriptorStatus,
  limit: GcraLimit | null,
  descriptor: Descriptor,
): PolicyStatus {
  const cl = s.currentLimit as NonNullable<RlsDescriptorStatus['currentLimit']>;
  let name = cl.name;
  if (name === '') {
    name = descriptor.length === 1 ? (descriptor[0] as RlsEntry).key : descriptor.map((e) => e.key).join('.');
  }
  p.descriptor = i;
  p.name = name;
  p.limit = cl.requestsPerUnit;
  p.windowSeconds = UNIT_SECONDS[cl.unit] ?? 1;
  const numbers = limitNumbers(limit);
  p.ratePerSecond = numbers.rate;
  p.burst = numbers.burst;
  p.remaining = s.limitRemaining;
  p.resetSeconds = s.durationUntilReset?.seconds ?? 0;
  p.overLimit = s.code === RLS_CODE.OVER_LIMIT;
  return p;
}

/** ns → whole seconds, rounded up, at least 1. */
function wholeSeconds(ns: bigint): number {
  const s = Number((ns + NS_PER_S - 1n) / NS_PER_S);
  return s < 1 ? 1 : s;
}

function grpcAddress(c: { readonly host: string; readonly port: number }): string {
  return `${c.host.includes(':') ? `[${c.host}]` : c.host}:${c.port}`;
}
