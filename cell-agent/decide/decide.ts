// The decision: one RateLimitRequest → one RateLimitResponse, from the rules and the shared bucket
// table. Pure of I/O; the gRPC server (worker threads) and the HTTP API (main thread) both call it.
//
// 1. Matching (cell-agent/rules). Per request descriptor i, hits_i = the descriptor's hits_addend
//    when set (0 allowed: check without counting), else max(1, request hits_addend) — as
//    envoyproxy/ratelimit's GetHitsAddends. matchWithAncestors gives the descriptor's own rule and
//    the `global: true` rules on the way to it; `replaces` is applied to the own rules
//    (applyReplaces); an ancestor global already counted by another descriptor is added once.
//    A descriptor carrying a `limit` override is not matched against local rules (envoyproxy/
//    ratelimit §2.2: requests_per_unit/unit from the request, never shadow, no name, no replaces),
//    but an override never lifts a global quota: the global rules the descriptor passes through
//    still apply.
// 2. Levels. Every limit the request must pass is one level with a bucket key and a GCRA limit:
//      local rule        rule.bucketKey, limitPerUnit(rpu, unit), starts FULL
//      limit override    `~o|domain|k=v…`, limitPerUnit(override), starts FULL
//      tenant quota      `~q|tenant/<id>`, the grant (or the tier's static slice), starts EMPTY
//      tier cap          `~q|tier/<tier>`, the cap's grant or static slice, starts EMPTY
//      domain cap        `~q|domain/<domain>`, the cap's grant or static slice, starts EMPTY
//    (`~` cannot start a rule key: the rules module escapes it.) A global level's bucket is named by
//    its coordinator quota key alone — never by the domain or the rule path that reached it — so a
//    tenant reached through two domains, two rule paths or two descriptor shapes is ONE bucket per
//    cell, the bucket the grant for that key is sized for (velocity is recorded per quota key too).
//    A key appearing twice in one request is one level with the hits summed; a global rule passed
//    on the way to a deeper match is counted once per request and quota key. Unknown tenants follow
//    the policy (quotas.ts).
// 3. Check, then take — all or nothing. Every level is first read without consuming (take with 0
//    hits: the level's whole tokens now); a level passes if it holds at least its hits (at least 1
//    for a 0-hit check). The verdicts give the statuses and overall_code (shadow_mode turns a
//    refusal into OK; quota_mode as envoyproxy/ratelimit). Only if overall_code is OK are tokens
//    taken, from every level that passed, tightest margin first; when it is OVER_LIMIT nothing is
//    consumed anywhere (unlike envoyproxy/ratelimit's default, which counts the passing descriptors
//    too: its STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT behaviour, made exact).
//    Another worker can drain a level between our check and our take. That take then fails, the
//    request is refused, and the tokens already taken from the other levels stay taken: a race can
//    only make the cell admit LESS than the limits allow, never more. (A refund operation on
//    BucketTable would close this small leak; see cell-agent/README.md.)
// 4. Response. One status per descriptor, in order: the refusing level if any, else the level with
//    the fewest remaining tokens; current_limit, limit_remaining and duration_until_reset filled so
//    Envoy's x-ratelimit headers work (unlimited: remaining 2^32−1, no limit; no rule: code OK
//    only). Optional RateLimit-* headers; `x-ratelimit-degraded: true` when a global quota was
//    decided on a static slice or the table was full.
//
// GCRA vs envoyproxy/ratelimit's fixed windows: a bucket of requests_per_unit tokens refilling
// continuously at requests_per_unit per unit, so `limit_remaining` is the bucket's whole tokens and
// `duration_until_reset` is the time until it is full again (for a refused status: until the
// refused hits would pass), rounded up to whole seconds.
import { IdentityMemo } from '../../shared/identity-memo.js';
import { BucketTable } from '../buckets/bucket-table.js';
import { RefusedKeys } from './refused-keys.js';
import type { KeyTakeResult, TakeResult } from '../buckets/bucket-table.js';
import { BigintElapsedClock, exactElapsed } from '../buckets/elapsed-clock.js';
import type { ElapsedClock } from '../buckets/elapsed-clock.js';
import { STATE_WORDS } from '../buckets/key-hash.js';
import type { KeyHashStream } from '../buckets/key-hash.js';
import { NEVER_NS, limitPerUnit } from '../buckets/gcra.js';
import type { GcraLimit, TimeUnit } from '../buckets/gcra.js';
import type { RuleNode, RuleSet } from '../rules/rules-compile.js';
import {
  applyReplaces,
  escapeKeyPart,
  lastLocalBucketKey,
  localBucketKey,
  matchGlobalAlone,
  matchLocalRate,
  matchWithAncestors,
} from '../rules/rules-match.js';
import type { DescriptorEntry, RuleMatch } from '../rules/rules-match.js';
import { MAX_UINT32, RATE_LIMIT_UNITS } from '../rules/rules-schema.js';
import { REFUSING_LEVELS, decidedOnText } from '../messages/refusal.js';
import type { Refusal, RefusingLevel } from '../messages/refusal.js';
import type {
  RlsDescriptorStatus,
  RlsHeader,
  RlsRateLimit,
  RlsRequest,
  RlsResponse,
} from '../messages/rls-messages.js';
import { RLS_CODE } from '../messages/rls-messages.js';
import type { LeaseLiveness, OverrideLookup, QuotaSlice, StaticQuotas } from './quotas.js';
import { planted } from '../../shared/planted-bugs.js';
import { domainCapKey, tenantKey, tierCapKey } from '../../shared/quota-keys.js';
import { GRPC_STATUS, checkRequest } from './request-check.js';
import type { RequestBounds, RequestFailure } from './request-check.js';

export const DEGRADED_HEADER = 'x-ratelimit-degraded';
/** Added (with DEGRADED_HEADER) to answers given fail-open, without a decision: overload, an internal
 * error, a full bucket table. They are the one exception to the global bound, so they say so. */
export const FAIL_OPEN_HEADER = 'x-ratelimit-fail-open';
export const RATELIMIT_LIMIT_HEADER = 'RateLimit-Limit';
export const RATELIMIT_REMAINING_HEADER = 'RateLimit-Remaining';
export const RATELIMIT_RESET_HEADER = 'RateLimit-Reset';
export const NO_CONFIG_MESSAGE = 'no rate limit configuration loaded';
/** A refusal's provenance (response_headers_to_add of an OVER_LIMIT answer, so Envoy passes them to
 * the client with its 429): which level refused, its rule name or quota key, what the cell decided
 * on (a lease with its epoch, a floor, a static share) and which cell. */
export const REFUSED_BY_HEADER = 'x-ratelimit-refused-by';
export const REFUSED_LIMIT_HEADER = 'x-ratelimit-refused-limit';
export const DECIDED_ON_HEADER = 'x-ratelimit-decided-on';
export const CELL_HEADER = 'x-ratelimit-cell';
export const PROVENANCE_HEADERS: readonly string[] = [
  REFUSED_BY_HEADER,
  REFUSED_LIMIT_HEADER,
  DECIDED_ON_HEADER,
  CELL_HEADER,
];

/** x-ratelimit-refused-by of a refusal on the overload path (decide/overload.ts): no level was decided. */
export const OVERLOAD_REFUSED_BY = 'overload';

/** Records per global quota what was allowed and refused (the velocity window). */
export interface VelocityRecorder {
  record(key: string, allowed: number, refused: number, nowNs: bigint): void;
}

export interface DeciderDeps {
  readonly table: BucketTable;
  readonly quotas: StaticQuotas;
  /** Now in ns on the table's clock (process.hrtime.bigint() in the agent). */
  readonly clock: () => bigint;
  /**
   * The same clock read as a number of ns since the table's startNs, allocation-free (HrtimeClock in
   * production; its originNs must be the table's startNs): the fast paths decide on it, and a check's
   * latency is measured on it (readingNs). Default: `clock` through a BigintElapsedClock (tests).
   */
  readonly elapsed?: ElapsedClock | null;
  readonly velocity?: VelocityRecorder | null;
  /** Called once per refused (non-shadow) level with its quota key (global) or bucket key (local) and
   * its provenance: the throttling log. */
  readonly onRefused?: ((key: string, hits: number, why: Refusal) => void) | null;
  /** Leased grants (or their floors) per coordinator quota key, used instead of the static slices. */
  readonly overrides?: OverrideLookup | null;
  /**
   * The lease's end in shared memory (lease-deadline.ts): a leased grant whose lease ended decides on its floor at
   * once.
   */
  readonly deadline?: LeaseLiveness | null;
}

export interface DeciderOptions {
  readonly bounds: RequestBounds;
  /** Add RateLimit-Limit / -Remaining / -Reset to response_headers_to_add (LIMIT_RESPONSE_HEADERS_ENABLED). */
  readonly responseHeaders: boolean;
  /** What a level does when the bucket table has no slot for its key: pass ('open') or refuse ('closed'). */
  readonly tableFull: 'open' | 'closed';
  /** Global quotas run on static slices (no coordinator): mark their answers degraded. With a
   * coordinator (false), a global level is degraded unless its key holds a live leased grant. */
  readonly staticSlices: boolean;
  /** This agent's cell, named in a refusal's provenance. */
  readonly cell?: string;
  /** Decide the common case without a plan (decideOneLocal); default true. false: always the
   * general path (the comparison in the tests and `npm run bench -- decision`). */
  readonly fastPath?: boolean;
}

export type DecisionScope = 'local' | 'global';

export interface Decision {
  readonly response: RlsResponse;
  readonly overLimit: boolean;
  /** 'global' if any level of the request was a global quota. */
  readonly scope: DecisionScope;
  /** Marked `x-ratelimit-degraded: true`: a static slice was used or the table was full. */
  readonly degraded: boolean;
  readonly staticSlice: boolean;
  readonly tableFull: boolean;
  /** The quota key (global) or bucket key (local) of the first level the full table had no slot for. */
  readonly tableFullKey: string | null;
  /** For HTTP Retry-After: the longest wait among the refusing levels (0 when OK). */
  readonly retryAfterNs: bigint;
  /** Per status, the bucket limit of the level it reports (its rate and depth; null: no level, or a
   * denied unknown tenant): what the embedded limiter's RateLimit-Policy header describes. */
  readonly statusLimits: readonly (GcraLimit | null)[];
  /** Why the request was refused (the first refusing level); null when admitted. */
  readonly refusal: Refusal | null;
}

export type DecideResult =
  { readonly ok: true; readonly decision: Decision } | { readonly ok: false; readonly failure: RequestFailure };

/** A level as the overload path (decide/overload.ts) sees it, after matching. */
export interface PlannedLevel {
  readonly key: string;
  readonly quotaKey: string | null;
  readonly scope: DecisionScope;
  readonly shadow: boolean;
  /** An unknown tenant under the deny policy. */
  readonly deny: boolean;
  readonly hits: number;
  /** Tokens/s this level may admit fail-open while overloaded (before --overload-allowance's factor):
   * a global quota's floor (a static share, or a slice without a floor: the slice itself), a local
   * rule's or override's rate; 0 for a denied tenant. */
  readonly allowanceRate: number;
}

interface Level extends PlannedLevel {
  readonly key: string;
  readonly limit: GcraLimit;
  readonly currentLimit: RlsRateLimit | null;
  readonly scope: DecisionScope;
  /** A global quota: its demand goes to the velocity window. */
  readonly velocity: boolean;
  /** A global quota's coordinator key (`tenant/<id>`, `tier/<name>`, `domain/<name>`; null: a local level). */
  readonly quotaKey: string | null;
  /** A global quota decided on a live leased grant (not a static share or a floor). */
  readonly leased: boolean;
  readonly shadow: boolean;
  /** An unknown tenant under the deny policy. */
  readonly deny: boolean;
  readonly kind: RefusingLevel;
  /** The rule's name (null: unnamed) for a local rule. */
  readonly ruleName: string | null;
  /** The leased grant's epoch (global levels with a grant). */
  readonly epoch: number | null;
  readonly descriptors: number[];
  hits: number;
  passed: boolean;
  remaining: number;
  resetNs: bigint;
  retryNs: bigint;
  tableFull: boolean;
}

/** A rate rule's bucket limit, built once per rule node. */
interface RuleLimit {
  readonly limit: GcraLimit;
  readonly currentLimit: RlsRateLimit;
  /** [limit]: the fast path's Decision.statusLimits. */
  readonly statusLimits: readonly GcraLimit[];
  /** The hot path's takeKey() decides under it (its window fits the numeric step). */
  readonly keyTakes: boolean;
  /** T, D and b as numbers (exact when keyTakes): the fast paths' retry arithmetic. */
  readonly intervalNs: number;
  readonly windowNs: number;
  readonly burst: number;
  /** A named rule's x-ratelimit-refused-limit header, frozen (the codec encodes it once); null when unnamed. */
  readonly refusedLimit: RlsHeader | null;
}

interface DescriptorPlan {
  readonly levels: Level[];
  unlimited: boolean;
  quotaMode: boolean;
}

const OK = RLS_CODE.OK;
const OVER_LIMIT = RLS_CODE.OVER_LIMIT;
const NS_PER_S = 1_000_000_000n;
const NO_HEADERS: readonly RlsHeader[] = Object.freeze([]);

const REQUEST_UNIT_NAMES: readonly (TimeUnit | undefined)[] = [
  undefined,
  'second',
  'minute',
  'hour',
  'day',
  'month',
  'year',
];

export class Decider {
  private rules: RuleSet | null = null;
  private readonly ruleLimits = new WeakMap<object, RuleLimit>();
  /** ruleLimitOf()'s last two rules and their limits (two descriptors alternate between two). */
  private readonly recentRuleLimits = new IdentityMemo<RuleNode, RuleLimit>();
  private readonly overrideLimits = new Map<string, { limit: GcraLimit; currentLimit: RlsRateLimit }>();
  /** The current decision's clock reading (the lease deadline is compared with it while planning). */
  private nowNs = 0n;
  /** The planted bug 'rule-path-buckets' only: the domain and rule path of the global match being planned. */
  private path = '';
  /** decideLocals' working state, one slot per descriptor (one decision at a time, and it never calls out
   * before it is done with them): each bucket key's hash state, its rule, hits and what its bucket said. */
  private readonly fast = newFastScratch();
  /** decideInPlace()'s answer for an admission on the one-descriptor fast path. */
  private readonly reused = newReusedAnswer('local');
  /** The same for the global fast path (decideOneGlobal). */
  private readonly reusedGlobal = newReusedAnswer('global');
  /** The one-descriptor fast path's refused bucket keys and their refused-limit headers, by key hash. */
  private readonly refusedKeys = new RefusedKeys(REFUSED_LIMIT_HEADER);
  /** decideOneGlobal's last grant limit and its Decision.statusLimits ([limit]), kept while the grant stays. */
  private globalLimit: GcraLimit | null = null;
  private globalStatusLimits: GcraLimit[] = [];
  /** The last domain's cap key (`domain/<name>`), so that the global fast path builds no string for it. */
  private capDomain = '';
  private capKey = domainCapKey('');
  /** The clock as a number (DeciderDeps.elapsed); its elapsed[0] is the current decision's reading. */
  readonly elapsedClock: ElapsedClock;

  constructor(
    private readonly deps: DeciderDeps,
    readonly options: DeciderOptions,
  ) {
    const startNs = deps.table.startNs;
    this.elapsedClock = deps.elapsed ?? new BigintElapsedClock(deps.clock, startNs);
    if (this.elapsedClock.originNs !== startNs)
      throw new Error(
        `Decider: the elapsed clock's origin ${this.elapsedClock.originNs} is not the table's startNs ${startNs}`,
      );
  }

  setRules(rules: RuleSet): void {
    this.rules = rules;
  }

  get ruleSet(): RuleSet | null {
    return this.rules;
  }

  /**
   * `boundsChecked`: the caller (CheckService) has already applied checkRequest to `req`.
   * `clockRead`: the caller has just read `elapsedClock` (CheckService: the check's one reading),
   * and the decision is made at that reading.
   */
  decide(req: RlsRequest, boundsChecked = false, clockRead = false): DecideResult {
    return this.run(req, boundsChecked, clockRead, false);
  }

  /**
   * decide(), with the common case's admission (one descriptor in one local bucket, no response
   * headers) written into objects this Decider reuses: the DecideResult, its Decision, response and
   * status are valid until this Decider's next decideInPlace() (read them, do not keep them). Every
   * other answer is fresh, as decide()'s. For callers that read the answer at once (the embedded
   * limiter); decide() is the call for anyone who keeps it.
   */
  decideInPlace(req: RlsRequest, boundsChecked = false, clockRead = false): DecideResult {
    return this.run(req, boundsChecked, clockRead, true);
  }

  private run(req: RlsRequest, boundsChecked: boolean, clockRead: boolean, inPlace: boolean): DecideResult {
    if (!boundsChecked) {
      const failure = checkRequest(req, this.options.bounds);
      if (failure !== null) return { ok: false, failure };
    }
    const rules = this.rules;
    if (rules === null) return { ok: false, failure: { code: GRPC_STATUS.UNKNOWN, message: NO_CONFIG_MESSAGE } };
    // One clock reading per decision, as a number (nothing allocated); the general path's bigint is
    // made from it (or read from the bigint clock past the number's exact range, 104 days).
    const clock = this.elapsedClock;
    if (!clockRead) clock.read();
    const exact = exactElapsed(clock);
    const n = req.descriptors.length;
    if (exact && n <= FAST_DESCRIPTORS && this.options.fastPath !== false) {
      const fast =
        n === 1
          ? (this.decideOneLocal(rules, req, inPlace) ?? this.decideOneGlobal(rules, req, inPlace))
          : this.decideLocals(rules, req);
      if (fast !== null) {
        if (fast === this.reused.decision) return this.reused.result;
        if (fast === this.reusedGlobal.decision) return this.reusedGlobal.result;
        return { ok: true, decision: fast };
      }
    }
    const nowNs = exact ? this.deps.table.startNs + BigInt(clock.elapsed[0] as number) : this.deps.clock();
    this.nowNs = nowNs;
    const { plans, levels } = this.plan(rules, req);
    return { ok: true, decision: this.evaluate(plans, levels, nowNs) };
  }

  // ---- 0: the fast path -------------------------------------------------------------------------

  /**
   * The common case (one descriptor counted in one local bucket, no limit override, hits ≥ 1), decided
   * without building a plan, a level or the bucket key string: matchLocalRate writes the key into the
   * table's hash stream and one takeKey() decides — a single take is all or nothing by itself. The
   * answer is what evaluate() gives for the same request (test/cell-agent/decide/decide-fast-path
   * checks it against `fastPath: false`); null: not the common case, use the general path.
   */
  private decideOneLocal(rules: RuleSet, req: RlsRequest, inPlace: boolean): Decision | null {
    const d = req.descriptors[0];
    if (d === undefined || d.limit !== null) return null;
    const hits = d.hitsAddend ?? (req.hitsAddend > 1 ? req.hitsAddend : 1);
    if (hits === 0) return null;
    const table = this.deps.table;
    const sink = table.beginKey();
    if (sink === null) return null;
    const node = matchLocalRate(rules, req.domain, d.entries, sink);
    if (node === null) return null;
    const ruleLimit = this.ruleLimitOf(node);
    const { limit, currentLimit, statusLimits, keyTakes } = ruleLimit;
    // A window over 2^52 ns (≈ 52 days) is decided on bigint: the general path's take().
    if (!keyTakes) return null;
    const r = table.takeKeyAt(limit, hits, this.elapsedClock.elapsed);
    if (r.verdict === 'table-full') return null; // rare: the general path applies the policy and marks it
    if (r.verdict === 'allow') {
      if (inPlace && !this.options.responseHeaders) {
        const reused = this.reused;
        const s = reused.status;
        s.currentLimit = currentLimit;
        s.limitRemaining = Math.min(r.remaining, MAX_UINT32);
        s.durationUntilReset = secondsOfNumber(r.resetNs);
        reused.decision.statusLimits = statusLimits;
        return reused.decision;
      }
      const status: RlsDescriptorStatus = {
        code: OK,
        currentLimit,
        limitRemaining: Math.min(r.remaining, MAX_UINT32),
        durationUntilReset: secondsOfNumber(r.resetNs),
      };
      const statuses = [status];
      return admitted(
        statuses,
        this.options.responseHeaders ? rateLimitHeaders(statuses) : NO_HEADERS,
        statusLimits,
        'local',
      );
    }
    const retryNs = r.retryAfterNs;
    // The bucket's key and refused-limit header as kept at its last refusal (refused-keys.ts), by
    // the hash words the table has just taken under; built from the walk (still in scratch) if not.
    const hash = table.lastKeyHash;
    const refused =
      this.refusedKeys.find(hash) ?? this.refusedKeys.keep(hash, lastLocalBucketKey(req.domain, d.entries));
    const key = refused.key;
    const refusal: Refusal = {
      level: 'local-rule',
      limit: node.name ?? key,
      decidedOn: null,
      epoch: null,
      cell: this.options.cell ?? null,
    };
    this.deps.onRefused?.(key, hits, refusal);
    const status: RlsDescriptorStatus = {
      code: OVER_LIMIT,
      currentLimit,
      limitRemaining: 0,
      durationUntilReset: secondsOfNumber(retryNs === Infinity ? r.resetNs : retryNs),
    };
    const statuses = [status];
    const provenance = provenanceHeaders(refusal, ruleLimit.refusedLimit ?? refused.header);
    const headers = this.options.responseHeaders ? [...rateLimitHeaders(statuses), ...provenance] : provenance;
    return {
      response: {
        overallCode: OVER_LIMIT,
        statuses,
        responseHeadersToAdd: headers,
        requestHeadersToAdd: NO_HEADERS,
        rawBody: null,
      },
      overLimit: true,
      scope: 'local',
      degraded: false,
      staticSlice: false,
      tableFull: false,
      tableFullKey: null,
      retryAfterNs: retryNs === Infinity ? (limit.windowNs > 0n ? limit.windowNs : NS_PER_S) : BigInt(retryNs),
      statusLimits,
      refusal,
    };
  }

  /**
   * The common global case, admitted: one descriptor counted in one tenant quota alone (no tier cap,
   * no domain cap, no limit override, no other global rule on its path) that holds a live leased
   * grant, hits ≥ 1 — decided without a plan, a level or the bucket key string (the key is hashed in
   * two parts), as evaluate() decides it: one take, the admission recorded in the velocity window.
   * Null for anything else and for every answer but an admission (a refusal takes nothing and a full
   * table places nothing, so the general path decides them as if first: test/cell-agent/decide/
   * decide-global-fast-path checks the answers against `fastPath: false`). Static slices and floors
   * are marked degraded: the general path answers them.
   */
  private decideOneGlobal(rules: RuleSet, req: RlsRequest, inPlace: boolean): Decision | null {
    const { overrides, table, deadline } = this.deps;
    if (this.options.responseHeaders || this.options.staticSlices || overrides === undefined || overrides === null)
      return null;
    if (overrides.size === 0 || planted['rule-path-buckets'] || planted['deadline-off-hot-path']) return null;
    const d = req.descriptors[0];
    if (d === undefined || d.limit !== null) return null;
    const hits = d.hitsAddend ?? (req.hitsAddend > 1 ? req.hitsAddend : 1);
    if (hits === 0) return null;
    const entries = d.entries;
    if (matchGlobalAlone(rules, req.domain, entries) === null) return null;
    const quotas = this.deps.quotas;
    if (quotas.domainCap !== null || overrides.get(this.domainCapKeyOf(req.domain)) !== undefined) return null;
    const tenantId = (entries[entries.length - 1] as DescriptorEntry).value;
    const r = quotas.resolve(tenantId);
    if (r.kind !== 'quota' || r.tier.cap !== null) return null;
    const quotaKey = tenantKey(tenantId);
    const o = overrides.get(quotaKey);
    if (o === undefined || !o.leased) return null;
    const elapsed = this.elapsedClock.elapsed;
    const nowNs = table.startNs + BigInt(elapsed[0] as number);
    // Past the lease's end the grant's floor decides (addSlice): not leased, so marked degraded.
    if (
      o.lease !== null &&
      o.floor !== null &&
      deadline !== undefined &&
      deadline !== null &&
      !deadline.live(o.lease, nowNs)
    )
      return null;
    const limit = o.limit;
    if (!BucketTable.keyTakes(limit)) return null;
    const sink = table.beginKey();
    if (sink === null) return null;
    // globalBucketKey(quotaKey), hashed in parts.
    sink.head(GLOBAL_BUCKET_HEAD);
    sink.raw(quotaKey);
    const t = table.takeKeyAt(limit, hits, elapsed);
    if (t.verdict !== 'allow') return null;
    this.deps.velocity?.record(quotaKey, hits, 0, nowNs);
    if (limit !== this.globalLimit) {
      this.globalLimit = limit;
      this.globalStatusLimits = [limit];
    }
    const remaining = Math.min(t.remaining, MAX_UINT32);
    const reset = secondsOfNumber(t.resetNs);
    if (inPlace) {
      const reused = this.reusedGlobal;
      const st = reused.status;
      st.currentLimit = o.currentLimit;
      st.limitRemaining = remaining;
      st.durationUntilReset = reset;
      reused.decision.statusLimits = this.globalStatusLimits;
      return reused.decision;
    }
    const status: RlsDescriptorStatus = {
      code: OK,
      currentLimit: o.currentLimit,
      limitRemaining: remaining,
      durationUntilReset: reset,
    };
    return admitted([status], NO_HEADERS, this.globalStatusLimits, 'global');
  }

  /** domainCapKey(domain), kept for the last domain asked about. */
  private domainCapKeyOf(domain: string): string {
    if (domain !== this.capDomain) {
      this.capDomain = domain;
      this.capKey = domainCapKey(domain);
    }
    return this.capKey;
  }

  /**
   * The common case of several descriptors (2 ≤ n ≤ FAST_DESCRIPTORS), each counted in one local bucket
   * of its own (Envoy's two-descriptor check, the embedded limiter's global + per-IP limiters): what
   * evaluate() does for the same request's levels — every bucket checked first without consuming, then,
   * only if all pass, taken from, tightest margin first — without a plan, a level or a key string. Each
   * bucket key is hashed once from the request's parts; its hash state is kept and restored for the
   * second take. null before any bucket is touched when the request is not such a case (a descriptor
   * not counted in exactly one local bucket, hits 0, a long window, two descriptors in one bucket).
   */
  private decideLocals(rules: RuleSet, req: RlsRequest): Decision | null {
    const table = this.deps.table;
    const f = this.fast;
    const n = req.descriptors.length;
    const defaultHits = req.hitsAddend > 1 ? req.hitsAddend : 1;
    for (let i = 0; i < n; i++) {
      const d = req.descriptors[i];
      if (d === undefined || d.limit !== null) return null;
      const hits = d.hitsAddend ?? defaultHits;
      if (hits === 0) return null;
      const sink = table.beginKey();
      if (sink === null) return null;
      const node = matchLocalRate(rules, req.domain, d.entries, sink);
      if (node === null) return null;
      const rule = this.ruleLimitOf(node);
      if (!rule.keyTakes) return null;
      sink.save(f.states, i * STATE_WORDS);
      // Two descriptors counted in one bucket are one level with the hits summed: the general path.
      for (let j = 0; j < i; j++) if (sameState(f.states, i, j)) return null;
      f.rules[i] = rule;
      f.nodes[i] = node;
      f.hits[i] = hits;
    }
    // Check: every bucket's whole tokens now (a 0-hit take creates no bucket for a local rule).
    let over = false;
    for (let i = 0; i < n; i++) {
      const rule = f.rules[i] as RuleLimit;
      const r = this.takeSaved(i, rule.limit, 0);
      if (r.verdict === 'table-full') return null; // not for a 0-hit take of a 'full' limit; never guess
      const need = f.hits[i] as number;
      f.remaining[i] = r.remaining;
      f.reset[i] = r.resetNs;
      f.tableFull[i] = 0;
      const passed = r.verdict !== 'deny' && r.remaining >= need;
      f.passed[i] = passed ? 1 : 0;
      if (!passed) {
        f.retry[i] = retryForNumber(rule, r.resetNs, need);
        over = true;
      }
    }
    // The first bucket in take order that had no slot: its key is the one the general path names.
    let firstFull = -1;
    if (!over) {
      // Take, tightest margin first (a stable order: ties in descriptor order, as evaluate() sorts).
      const order = f.order;
      for (let i = 0; i < n; i++) {
        let j = i;
        const margin = marginOf(f, i);
        while (j > 0 && marginOf(f, order[j - 1] as number) > margin) {
          order[j] = order[j - 1] as number;
          j--;
        }
        order[j] = i;
      }
      for (let k = 0; k < n; k++) {
        const i = order[k] as number;
        const rule = f.rules[i] as RuleLimit;
        const hits = f.hits[i] as number;
        const r = this.takeSaved(i, rule.limit, hits);
        if (r.verdict === 'allow') {
          f.remaining[i] = r.remaining;
          f.reset[i] = r.resetNs;
        } else if (r.verdict === 'table-full') {
          if (firstFull < 0) firstFull = i;
          f.tableFull[i] = 1;
          if (this.options.tableFull === 'closed') {
            f.passed[i] = 0;
            f.remaining[i] = 0;
            f.retry[i] = 1e9;
            over = true;
            break;
          }
        } else {
          // Lost a race to another worker between check and take (see the header).
          f.passed[i] = 0;
          f.remaining[i] = r.remaining;
          f.reset[i] = r.resetNs;
          f.retry[i] = retryForNumber(rule, r.resetNs, hits);
          over = true;
          break;
        }
      }
    }
    return this.localsDecision(rules, req, n, over, firstFull);
  }

  /** takeKey() for descriptor i's bucket key, from its saved hash state. */
  private takeSaved(i: number, limit: GcraLimit, hits: number): Readonly<KeyTakeResult> {
    const table = this.deps.table;
    (table.beginKey() as KeyHashStream).restore(this.fast.states, i * STATE_WORDS);
    return table.takeKeyAt(limit, hits, this.elapsedClock.elapsed);
  }

  /** decideLocals' answer from its scratch: evaluate()'s statuses, refusal, Retry-After and headers. */
  private localsDecision(rules: RuleSet, req: RlsRequest, n: number, over: boolean, firstFull: number): Decision {
    const f = this.fast;
    const tableFull = firstFull >= 0;
    const statuses: RlsDescriptorStatus[] = new Array<RlsDescriptorStatus>(n);
    const statusLimits: GcraLimit[] = new Array<GcraLimit>(n);
    const fullEntries = tableFull ? (req.descriptors[firstFull] as RlsRequest['descriptors'][number]).entries : null;
    const tableFullKey = fullEntries === null ? null : localBucketKey(rules, req.domain, fullEntries);
    let refusal: Refusal | null = null;
    let refusedLimit: RlsHeader | null = null;
    let retryAfterNs = 0;
    for (let i = 0; i < n; i++) {
      const rule = f.rules[i] as RuleLimit;
      statusLimits[i] = rule.limit;
      const entries = (req.descriptors[i] as RlsRequest['descriptors'][number]).entries;
      if (f.passed[i] === 1) {
        statuses[i] = {
          code: OK,
          currentLimit: rule.currentLimit,
          limitRemaining: Math.min(f.remaining[i] as number, MAX_UINT32),
          durationUntilReset: secondsOfNumber(f.reset[i] as number),
        };
        continue;
      }
      const retry = f.retry[i] as number;
      statuses[i] = {
        code: OVER_LIMIT,
        currentLimit: rule.currentLimit,
        limitRemaining: 0,
        durationUntilReset: secondsOfNumber(retry === Infinity ? (f.reset[i] as number) : retry),
      };
      const wait = retry === Infinity ? (rule.windowNs > 0 ? rule.windowNs : 1e9) : retry;
      if (wait > retryAfterNs) retryAfterNs = wait;
      const key = localBucketKey(rules, req.domain, entries);
      const why: Refusal = {
        level: 'local-rule',
        limit: (f.nodes[i] as RuleNode).name ?? key,
        decidedOn: null,
        epoch: null,
        cell: this.options.cell ?? null,
      };
      if (refusal === null) {
        refusal = why;
        refusedLimit = rule.refusedLimit;
      }
      this.deps.onRefused?.(key, f.hits[i] as number, why);
    }
    for (let i = 0; i < n; i++) {
      f.rules[i] = null;
      f.nodes[i] = null;
    }
    let headers: readonly RlsHeader[] = NO_HEADERS;
    if (this.options.responseHeaders || tableFull || refusal !== null) {
      const list: RlsHeader[] = this.options.responseHeaders ? rateLimitHeaders(statuses) : [];
      if (tableFull) list.push({ key: DEGRADED_HEADER, value: 'true' });
      if (refusal !== null) list.push(...provenanceHeaders(refusal, refusedLimit));
      headers = list;
    }
    return {
      response: {
        overallCode: over ? OVER_LIMIT : OK,
        statuses,
        responseHeadersToAdd: headers,
        requestHeadersToAdd: NO_HEADERS,
        rawBody: null,
      },
      overLimit: over,
      scope: 'local',
      degraded: tableFull,
      staticSlice: false,
      tableFull,
      tableFullKey,
      // Exact: every wait is an integer below 2^53 (a narrow limit's window and debt).
      retryAfterNs: over ? BigInt(retryAfterNs) : 0n,
      statusLimits,
      refusal,
    };
  }

  /** Now on the buckets' clock. */
  now(): bigint {
    return this.deps.clock();
  }

  /** The levels a request must pass (matching only, no bucket touched): the overload path's input.
   * Null when no rules are loaded. The request's bounds are the caller's to check first. */
  planLevels(req: RlsRequest, nowNs: bigint = this.deps.clock()): Iterable<PlannedLevel> | null {
    const rules = this.rules;
    if (rules === null) return null;
    this.nowNs = nowNs;
    return this.plan(rules, req).levels.values();
  }

  // ---- 1 + 2: matching and levels ---------------------------------------------------------------

  private plan(rules: RuleSet, req: RlsRequest): { plans: DescriptorPlan[]; levels: Map<string, Level> } {
    const domain = req.domain;
    const n = req.descriptors.length;
    const defaultHits = req.hitsAddend > 1 ? req.hitsAddend : 1;
    const hits = new Array<number>(n);
    const own: (RuleMatch | null)[] = new Array<RuleMatch | null>(n);
    const ancestors: (readonly RuleMatch[])[] = new Array<readonly RuleMatch[]>(n);
    for (let i = 0; i < n; i++) {
      const d = req.descriptors[i];
      if (d === undefined) continue;
      hits[i] = d.hitsAddend ?? defaultHits;
      const m = matchWithAncestors(rules, domain, d.entries);
      // An override replaces a local rule, never a global one.
      own[i] = d.limit !== null && m.match !== null && m.match.limit.kind !== 'global' ? null : m.match;
      ancestors[i] = m.ancestors;
    }
    const matched = applyReplaces(own);
    const levels = new Map<string, Level>();
    const plans: DescriptorPlan[] = new Array<DescriptorPlan>(n);
    for (let i = 0; i < n; i++) plans[i] = { levels: [], unlimited: false, quotaMode: false };
    // Quota keys already counted for this request: a global rule passed on the way to a deeper match
    // adds its quota once, unless a descriptor matched that quota itself.
    const knownDomain = rules.domains.has(domain);
    const countedGlobal = new Set<string>();
    for (const m of matched) if (m !== null && m.limit.kind === 'global') countedGlobal.add(globalQuotaKey(m));

    for (let i = 0; i < n; i++) {
      const d = req.descriptors[i];
      const plan = plans[i] as DescriptorPlan;
      const h = hits[i] ?? 1;
      if (d === undefined) continue;
      // envoyproxy/ratelimit looks the domain up first: in a domain without rules an override is "no limit" too.
      if (d.limit !== null && knownDomain) {
        const { limit, currentLimit } = this.overrideLimit(d.limit.requestsPerUnit, d.limit.unit);
        this.addLevel(
          levels,
          plan,
          i,
          overrideKey(domain, d.entries),
          limit,
          currentLimit,
          h,
          'local',
          false,
          false,
          false,
          null,
          false,
          { kind: 'limit-override' },
        );
      }
      const m = matched[i] ?? null;
      if (m !== null) {
        if (m.limit.kind === 'unlimited') plan.unlimited = true;
        else if (m.limit.kind === 'rate') {
          const { limit, currentLimit } = this.ruleLimit(m);
          plan.quotaMode = m.quotaMode;
          this.addLevel(
            levels,
            plan,
            i,
            m.bucketKey,
            limit,
            currentLimit,
            h,
            'local',
            false,
            m.shadowMode,
            false,
            null,
            false,
            { kind: 'local-rule', ruleName: m.name ?? null },
          );
        } else {
          this.addGlobal(levels, plan, i, domain, m, h);
        }
      }
      for (const a of ancestors[i] ?? []) {
        const quotaKey = globalQuotaKey(a);
        if (countedGlobal.has(quotaKey)) continue;
        countedGlobal.add(quotaKey);
        this.addGlobal(levels, plan, i, domain, a, h);
      }
    }
    return { plans, levels };
  }

  private addGlobal(
    levels: Map<string, Level>,
    plan: DescriptorPlan,
    i: number,
    domain: string,
    m: RuleMatch,
    hits: number,
  ): void {
    const quotas = this.deps.quotas;
    const tenantId = m.global?.value ?? '';
    if (planted['rule-path-buckets']) this.path = `${domain}|${m.bucketKey}`;
    const tenantQuota = tenantKey(tenantId);
    const r = quotas.resolve(tenantId);
    if (r.kind === 'deny') {
      this.addLevel(
        levels,
        plan,
        i,
        globalBucketKey(tenantQuota),
        DENY_LIMIT,
        { requestsPerUnit: 0, unit: 1, name: 'unknown-tenant' },
        hits,
        'global',
        false,
        m.shadowMode,
        true,
        tenantQuota,
        false,
        { kind: 'unknown-tenant' },
      );
    } else if (r.kind === 'quota') {
      this.addSlice(levels, plan, i, tenantQuota, r.tenant, hits, m.shadowMode, 'tenant-quota');
      this.addSlice(levels, plan, i, tierCapKey(r.tier.name), r.tier.cap, hits, m.shadowMode, 'tier-cap');
    }
    this.addSlice(levels, plan, i, domainCapKey(domain), quotas.domainCap, hits, m.shadowMode, 'domain-cap');
  }

  /**
   * A global level, in the bucket of `quotaKey`: its leased grant (or floor) if any, else the static slice (none: no
   * level).
   */
  private addSlice(
    levels: Map<string, Level>,
    plan: DescriptorPlan,
    i: number,
    quotaKey: string,
    slice: QuotaSlice | null,
    hits: number,
    shadow: boolean,
    kind: RefusingLevel,
  ): void {
    const overrides = this.deps.overrides;
    let o = overrides !== undefined && overrides !== null && overrides.size > 0 ? overrides.get(quotaKey) : undefined;
    // A leased grant holds only while its lease does: past the deadline, its floor (lease-deadline.ts).
    const deadline = this.deps.deadline;
    if (
      o !== undefined &&
      o.lease !== null &&
      o.floor !== null &&
      deadline !== undefined &&
      deadline !== null &&
      !planted['deadline-off-hot-path'] &&
      !deadline.live(o.lease, this.nowNs)
    )
      o = o.floor;
    const use = o ?? slice;
    if (use === null) return;
    this.addLevel(
      levels,
      plan,
      i,
      planted['rule-path-buckets'] ? `${globalBucketKey(quotaKey)}|${this.path}` : globalBucketKey(quotaKey),
      use.limit,
      use.currentLimit,
      hits,
      'global',
      true,
      shadow,
      false,
      quotaKey,
      o?.leased ?? false,
      { kind, epoch: o?.epoch ?? null, allowanceRate: o?.floor?.rate ?? use.rate },
    );
  }

  private addLevel(
    levels: Map<string, Level>,
    plan: DescriptorPlan,
    i: number,
    key: string,
    limit: GcraLimit,
    currentLimit: RlsRateLimit | null,
    hits: number,
    scope: DecisionScope,
    velocity: boolean,
    shadow: boolean,
    deny = false,
    quotaKey: string | null = null,
    leased = false,
    about: {
      readonly kind: RefusingLevel;
      readonly ruleName?: string | null;
      readonly epoch?: number | null;
      readonly allowanceRate?: number;
    } = { kind: 'local-rule' },
  ): void {
    const existing = levels.get(key);
    if (existing !== undefined) {
      existing.hits = saturatingAdd(existing.hits, hits);
      if (!existing.descriptors.includes(i)) {
        existing.descriptors.push(i);
        plan.levels.push(existing);
      }
      return;
    }
    const level: Level = {
      key,
      limit,
      currentLimit,
      scope,
      velocity,
      quotaKey,
      leased,
      shadow,
      deny,
      descriptors: [i],
      hits,
      kind: about.kind,
      ruleName: about.ruleName ?? null,
      epoch: about.epoch ?? null,
      allowanceRate: deny ? 0 : (about.allowanceRate ?? ratePerSecond(limit)),
      passed: false,
      remaining: 0,
      resetNs: 0n,
      retryNs: 0n,
      tableFull: false,
    };
    levels.set(key, level);
    plan.levels.push(level);
  }

  private ruleLimit(m: RuleMatch): { limit: GcraLimit; currentLimit: RlsRateLimit } {
    return this.ruleLimitOf(m.rule);
  }

  private ruleLimitOf(rule: RuleNode): RuleLimit {
    // The rules met last first (a decision path meets the same few rules again and again): no
    // WeakMap lookup then. Rule nodes are immutable (a rules reload compiles new ones).
    const recent = this.recentRuleLimits.get(rule);
    if (recent !== undefined) return recent;
    let cached = this.ruleLimits.get(rule);
    if (cached === undefined) {
      const l = rule.limit;
      if (l === null || l.kind !== 'rate') throw new Error('ruleLimit: not a rate rule');
      const unit = l.unit;
      const limit = limitPerUnit(
        l.requestsPerUnit,
        unit.toLowerCase() as TimeUnit,
        l.burst === undefined ? { start: 'full' } : { start: 'full', burst: l.burst },
      );
      cached = {
        limit,
        // Frozen: the codec keeps its encoding and copies it into every answer of this rule (rls-codec.ts).
        currentLimit: Object.freeze({
          requestsPerUnit: l.requestsPerUnit,
          unit: RATE_LIMIT_UNITS[unit].proto,
          name: rule.name ?? '',
        }),
        // Shared by every answer of this rule, and readonly by type, but not frozen: an indexed read
        // of a frozen (or sealed) array is a generic keyed-load call in Node 20's optimized code
        // (~70 instructions), where a plain array's is inlined; the limiter reads it on every check.
        statusLimits: [limit],
        keyTakes: BucketTable.keyTakes(limit),
        intervalNs: Number(limit.intervalNs),
        windowNs: Number(limit.windowNs),
        burst: Number(limit.burst),
        refusedLimit: rule.name === null ? null : Object.freeze({ key: REFUSED_LIMIT_HEADER, value: rule.name }),
      };
      this.ruleLimits.set(rule, cached);
    }
    this.recentRuleLimits.set(rule, cached);
    return cached;
  }

  private overrideLimit(requestsPerUnit: number, unit: number): { limit: GcraLimit; currentLimit: RlsRateLimit } {
    const id = `${requestsPerUnit}/${unit}`;
    let cached = this.overrideLimits.get(id);
    if (cached === undefined) {
      const timeUnit = REQUEST_UNIT_NAMES[unit];
      if (timeUnit === undefined) throw new Error(`overrideLimit: unit ${unit} was not validated`);
      cached = {
        limit: limitPerUnit(requestsPerUnit, timeUnit, { start: 'full' }),
        // envoy.type.v3.RateLimitUnit and RateLimitResponse.RateLimit.Unit agree on 1..6.
        currentLimit: Object.freeze({ requestsPerUnit, unit, name: '' }),
      };
      if (this.overrideLimits.size >= 4096) this.overrideLimits.clear();
      this.overrideLimits.set(id, cached);
    }
    return cached;
  }

  // ---- 3 + 4: check, take, respond --------------------------------------------------------------

  private evaluate(plans: DescriptorPlan[], levels: Map<string, Level>, nowNs: bigint): Decision {
    const table = this.deps.table;
    let scope: DecisionScope = 'local';
    let staticSlice = false;
    for (const level of levels.values()) {
      if (level.scope === 'global') {
        scope = 'global';
        if (!level.deny && (this.options.staticSlices || !level.leased)) staticSlice = true;
      }
    }

    let overLimit: boolean;
    let tableFull = false;
    let tableFullKey: string | null = null;
    const only = levels.size === 1 ? (levels.values().next().value as Level) : null;
    if (only !== null && !only.deny && only.hits > 0) {
      // One level (the common case): a single take is already all or nothing.
      const r = table.take(only.key, only.limit, only.hits, nowNs);
      only.remaining = r.remaining;
      only.resetNs = r.resetNs;
      only.passed = r.verdict !== 'deny';
      if (r.verdict === 'deny') only.retryNs = r.retryAfterNs;
      else if (r.verdict === 'table-full') {
        tableFull = true;
        tableFullKey = only.quotaKey ?? only.key;
        only.tableFull = true;
        if (this.options.tableFull === 'closed') {
          only.passed = false;
          only.retryNs = NS_PER_S;
        }
      }
      overLimit = overallOverLimit(plans);
    } else {
      for (const level of levels.values()) {
        if (level.deny) {
          level.passed = false;
          level.retryNs = NEVER_NS;
          continue;
        }
        const r = table.take(level.key, level.limit, 0, nowNs);
        const need = level.hits > 0 ? level.hits : 1;
        level.remaining = r.remaining;
        level.resetNs = r.resetNs;
        level.passed = r.verdict !== 'deny' && r.remaining >= need;
        if (!level.passed) level.retryNs = retryFor(level.limit, r.resetNs, need);
      }
      overLimit = overallOverLimit(plans);
    }
    if (!overLimit && only === null) {
      const toTake: Level[] = [];
      for (const level of levels.values()) if (level.passed && level.hits > 0) toTake.push(level);
      if (toTake.length > 1) toTake.sort((a, b) => a.remaining - a.hits - (b.remaining - b.hits));
      for (const level of toTake) {
        const r: TakeResult = table.take(level.key, level.limit, level.hits, nowNs);
        if (r.verdict === 'allow') {
          level.remaining = r.remaining;
          level.resetNs = r.resetNs;
        } else if (r.verdict === 'table-full') {
          tableFull = true;
          tableFullKey ??= level.quotaKey ?? level.key;
          level.tableFull = true;
          if (this.options.tableFull === 'closed') {
            level.passed = false;
            level.remaining = 0;
            level.retryNs = NS_PER_S;
            break;
          }
        } else {
          // Lost a race to another worker between check and take (see the header).
          level.passed = false;
          level.remaining = r.remaining;
          level.resetNs = r.resetNs;
          level.retryNs = retryFor(level.limit, r.resetNs, level.hits);
          break;
        }
      }
      overLimit = overallOverLimit(plans);
    }

    const statuses: RlsDescriptorStatus[] = new Array<RlsDescriptorStatus>(plans.length);
    const statusLimits: (GcraLimit | null)[] = new Array<GcraLimit | null>(plans.length);
    let retryAfterNs = 0n;
    for (let i = 0; i < plans.length; i++) {
      const plan = plans[i] as DescriptorPlan;
      const reported = reportedLevel(plan);
      statuses[i] = statusOf(reported, plan);
      statusLimits[i] = reported === null || reported.level.deny ? null : reported.level.limit;
    }
    const { velocity, onRefused } = this.deps;
    let refusal: Refusal | null = null;
    for (const level of levels.values()) {
      if (!level.passed) {
        if (!level.shadow) {
          const wait =
            level.retryNs === NEVER_NS ? (level.limit.windowNs > 0n ? level.limit.windowNs : NS_PER_S) : level.retryNs;
          if (wait > retryAfterNs) retryAfterNs = wait;
          const why = this.refusalOf(level);
          refusal ??= why;
          onRefused?.(level.quotaKey ?? level.key, level.hits, why);
        }
        if (level.velocity && level.hits > 0) velocity?.record(level.quotaKey ?? level.key, 0, level.hits, nowNs);
      } else if (!overLimit && level.velocity && level.hits > 0 && !level.tableFull) {
        velocity?.record(level.quotaKey ?? level.key, level.hits, 0, nowNs);
      }
    }
    if (!overLimit) {
      retryAfterNs = 0n;
      refusal = null;
    } else {
      // The status Envoy reports first names the level that refused, if it is one of ours.
      const first = plans.map(reportedLevel).find((r) => r !== null && r.as === 'refused');
      if (first !== undefined && first !== null) refusal = this.refusalOf(first.level);
    }
    const degraded = staticSlice || tableFull;
    let headers: readonly RlsHeader[] = NO_HEADERS;
    if (this.options.responseHeaders || degraded || refusal !== null) {
      const list: RlsHeader[] = this.options.responseHeaders ? rateLimitHeaders(statuses, plans) : [];
      if (degraded) list.push({ key: DEGRADED_HEADER, value: 'true' });
      if (refusal !== null) list.push(...provenanceHeaders(refusal));
      headers = list;
    }
    return {
      response: {
        overallCode: overLimit ? OVER_LIMIT : OK,
        statuses,
        responseHeadersToAdd: headers,
        requestHeadersToAdd: NO_HEADERS,
        rawBody: null,
      },
      overLimit,
      scope,
      degraded,
      staticSlice,
      tableFull,
      tableFullKey,
      retryAfterNs,
      statusLimits,
      refusal,
    };
  }

  private refusalOf(level: Level): Refusal {
    const global = level.scope === 'global' && !level.deny;
    const decidedOn = !global ? null : level.leased ? 'lease' : level.epoch !== null ? 'floor' : 'static-share';
    return {
      level: level.kind,
      limit: level.quotaKey ?? level.ruleName ?? level.key,
      decidedOn,
      epoch: global ? level.epoch : null,
      cell: this.options.cell ?? null,
    };
  }
}

// The provenance headers that repeat, frozen so that the codec encodes each once (rls-codec.ts):
// x-ratelimit-refused-by per level, and x-ratelimit-cell of the last cell named (one per agent).
const REFUSED_BY: ReadonlyMap<string, RlsHeader> = new Map(
  REFUSING_LEVELS.map((level) => [level, Object.freeze({ key: REFUSED_BY_HEADER, value: level })]),
);
let lastCell = '';
let lastCellHeader: RlsHeader = Object.freeze({ key: CELL_HEADER, value: '' });

function cellHeader(cell: string): RlsHeader {
  if (cell !== lastCell) {
    lastCell = cell;
    lastCellHeader = Object.freeze({ key: CELL_HEADER, value: cell });
  }
  return lastCellHeader;
}

/**
 * The provenance of a refusal as response headers. `refusedLimit`: the x-ratelimit-refused-limit
 * header of `r.limit` made once (a named rule's, RuleLimit.refusedLimit), else one is made here.
 */
export function provenanceHeaders(r: Refusal, refusedLimit: RlsHeader | null = null): RlsHeader[] {
  if (refusedLimit !== null && refusedLimit.value !== r.limit) {
    throw new Error(`provenanceHeaders: the refused-limit header says ${refusedLimit.value}, the refusal ${r.limit}`);
  }
  const out: RlsHeader[] = [
    REFUSED_BY.get(r.level) ?? { key: REFUSED_BY_HEADER, value: r.level },
    refusedLimit ?? { key: REFUSED_LIMIT_HEADER, value: r.limit },
  ];
  const on = decidedOnText(r);
  if (on !== null) out.push({ key: DECIDED_ON_HEADER, value: on });
  if (r.cell !== null) out.push(cellHeader(r.cell));
  return out;
}

/**
 * Hits summed over the descriptors of one request, saturating at 2^53 − 1 (the codec and the HTTP
 * schema saturate each addend there too): more than any bucket can hold, so a saturated sum is a plain
 * refusal (gcra.ts's MAX_BURST_TOKENS is below it) — never an unsafe integer that the bucket table
 * would have to reject by throwing.
 */
function saturatingAdd(a: number, b: number): number {
  const sum = a + b;
  return sum > Number.MAX_SAFE_INTEGER ? Number.MAX_SAFE_INTEGER : sum;
}

/** A GCRA limit's refill rate in tokens/s (0 for a blocked limit). */
function ratePerSecond(limit: GcraLimit): number {
  return limit.intervalNs === 0n ? 0 : 1e9 / Number(limit.intervalNs);
}

/** A limit whose every take is refused (unknown tenant, deny policy); never given to the table. */
const DENY_LIMIT: GcraLimit = Object.freeze({ intervalNs: 0n, burst: 0n, windowNs: 0n, start: 'empty' });

function retryFor(limit: GcraLimit, resetNs: bigint, hits: number): bigint {
  if (limit.intervalNs === 0n || BigInt(hits) > limit.burst) return NEVER_NS;
  // Allowed once debt + hits·T ≤ D, debt = resetNs shrinking 1:1 with time.
  const wait = resetNs + BigInt(hits) * limit.intervalNs - limit.windowNs;
  return wait > 0n ? wait : 0n;
}

/** retryFor() on numbers, for a rule whose window fits the numeric step (every value below 2^53). */
function retryForNumber(rule: RuleLimit, resetNs: number, hits: number): number {
  if (rule.intervalNs === 0 || hits > rule.burst) return Infinity;
  const wait = resetNs + hits * rule.intervalNs - rule.windowNs;
  return wait > 0 ? wait : 0;
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] };

/** The objects decideInPlace() overwrites: one admitted status, its response, Decision and DecideResult. */
interface ReusedAnswer {
  readonly status: Mutable<RlsDescriptorStatus>;
  readonly decision: Mutable<Decision>;
  readonly result: DecideResult;
}

function newReusedAnswer(scope: DecisionScope): ReusedAnswer {
  const status: Mutable<RlsDescriptorStatus> = {
    code: OK,
    currentLimit: null,
    limitRemaining: 0,
    durationUntilReset: null,
  };
  // Not frozen, for the reason given at ruleLimitOf's statusLimits (the limiter reads statuses[i]).
  const decision = admitted([status], NO_HEADERS, [], scope);
  return { status, decision, result: { ok: true, decision } };
}

/** A fast path's admission: one level per status (local ones, or one leased global quota), nothing degraded. */
function admitted(
  statuses: readonly RlsDescriptorStatus[],
  headers: readonly RlsHeader[],
  statusLimits: readonly GcraLimit[],
  scope: DecisionScope,
): Mutable<Decision> {
  return {
    response: {
      overallCode: OK,
      statuses,
      responseHeadersToAdd: headers,
      requestHeadersToAdd: NO_HEADERS,
      rawBody: null,
    },
    overLimit: false,
    scope,
    degraded: false,
    staticSlice: false,
    tableFull: false,
    tableFullKey: null,
    retryAfterNs: 0n,
    statusLimits,
    refusal: null,
  };
}

/** Descriptors decideLocals takes (more: the general path). */
const FAST_DESCRIPTORS = 4;

interface FastScratch {
  readonly states: Int32Array;
  readonly rules: (RuleLimit | null)[];
  readonly nodes: (RuleNode | null)[];
  readonly hits: Float64Array;
  readonly remaining: Float64Array;
  readonly reset: Float64Array;
  /** The wait until the refused hits would pass; Infinity: never. */
  readonly retry: Float64Array;
  readonly passed: Uint8Array;
  readonly tableFull: Uint8Array;
  readonly order: Int32Array;
}

function newFastScratch(): FastScratch {
  return {
    states: new Int32Array(FAST_DESCRIPTORS * STATE_WORDS),
    rules: new Array<RuleLimit | null>(FAST_DESCRIPTORS).fill(null),
    nodes: new Array<RuleNode | null>(FAST_DESCRIPTORS).fill(null),
    hits: new Float64Array(FAST_DESCRIPTORS),
    remaining: new Float64Array(FAST_DESCRIPTORS),
    reset: new Float64Array(FAST_DESCRIPTORS),
    retry: new Float64Array(FAST_DESCRIPTORS),
    passed: new Uint8Array(FAST_DESCRIPTORS),
    tableFull: new Uint8Array(FAST_DESCRIPTORS),
    order: new Int32Array(FAST_DESCRIPTORS),
  };
}

/** Tokens descriptor i's bucket would keep after its hits (evaluate() takes the smallest first). */
function marginOf(f: FastScratch, i: number): number {
  return (f.remaining[i] as number) - (f.hits[i] as number);
}

/** Whether the hash states saved for descriptors i and j are the same key's. */
function sameState(states: Int32Array, i: number, j: number): boolean {
  for (let w = 0; w < STATE_WORDS; w++) if (states[i * STATE_WORDS + w] !== states[j * STATE_WORDS + w]) return false;
  return true;
}

function descriptorRefused(plan: DescriptorPlan): boolean {
  for (const level of plan.levels) if (!level.passed && !level.shadow) return true;
  return false;
}

/**
 * envoyproxy/ratelimit: OVER_LIMIT iff a non-quota-mode descriptor is over, or every quota-mode one is (and there is
 * one).
 */
function overallOverLimit(plans: readonly DescriptorPlan[]): boolean {
  let quotaModeCount = 0;
  let quotaModeOver = 0;
  for (const plan of plans) {
    const refused = descriptorRefused(plan);
    if (plan.quotaMode) {
      quotaModeCount++;
      if (refused) quotaModeOver++;
    } else if (refused) {
      return true;
    }
  }
  return quotaModeCount > 0 && quotaModeOver === quotaModeCount;
}

/**
 * The level a descriptor's status reports: the refusing one, else a shadow refusal, else the one with the fewest
 * tokens.
 */
function reportedLevel(
  plan: DescriptorPlan,
): { readonly level: Level; readonly as: 'refused' | 'shadow' | 'least' } | null {
  if (plan.levels.length === 0) return null;
  let shadowRefusal: Level | null = null;
  for (const level of plan.levels) {
    if (!level.passed) {
      if (!level.shadow) return { level, as: 'refused' };
      shadowRefusal ??= level;
    }
  }
  if (shadowRefusal !== null) return { level: shadowRefusal, as: 'shadow' };
  let min = plan.levels[0] as Level;
  for (const level of plan.levels) if (level.remaining < min.remaining) min = level;
  return { level: min, as: 'least' };
}

function statusOf(reported: ReturnType<typeof reportedLevel>, plan: DescriptorPlan): RlsDescriptorStatus {
  if (reported === null) {
    return plan.unlimited
      ? { code: OK, currentLimit: null, limitRemaining: MAX_UINT32, durationUntilReset: null }
      : NO_LIMIT_STATUS;
  }
  const { level, as } = reported;
  if (as === 'refused') {
    return {
      code: OVER_LIMIT,
      currentLimit: level.currentLimit,
      limitRemaining: 0,
      durationUntilReset: level.deny ? null : seconds(level.retryNs === NEVER_NS ? level.resetNs : level.retryNs),
    };
  }
  if (as === 'shadow')
    return {
      code: OK,
      currentLimit: level.currentLimit,
      limitRemaining: 0,
      durationUntilReset: seconds(level.resetNs),
    };
  return {
    code: OK,
    currentLimit: level.currentLimit,
    limitRemaining: Math.min(level.remaining, MAX_UINT32),
    durationUntilReset: seconds(level.resetNs),
  };
}

const NO_LIMIT_STATUS: RlsDescriptorStatus = Object.freeze({
  code: OK,
  currentLimit: null,
  limitRemaining: 0,
  durationUntilReset: null,
});

/** The Durations of 0 .. DURATIONS - 1 whole seconds, shared (frozen): the fast path's answers allocate none. */
const DURATIONS = 3600;
const durations: ({ readonly seconds: number; readonly nanos: number } | undefined)[] = [];

/** seconds() for ns as a number (exact below 2^53: Math.ceil of the quotient of two such integers is exact). */
function secondsOfNumber(ns: number): { seconds: number; nanos: number } {
  const s = ns <= 0 ? 0 : Math.ceil(ns / 1e9);
  if (s >= DURATIONS) return { seconds: s, nanos: 0 };
  let d = durations[s];
  if (d === undefined) {
    d = Object.freeze({ seconds: s, nanos: 0 });
    durations[s] = d;
  }
  return d;
}

/** ns → a Duration of whole seconds, rounded up. */
function seconds(ns: bigint): { seconds: number; nanos: number } {
  return { seconds: ns <= 0n ? 0 : Number((ns + NS_PER_S - 1n) / NS_PER_S), nanos: 0 };
}

/**
 * envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED: among the statuses with a current_limit, a
 * non-quota-mode OVER_LIMIT one if any (the first), else the one with the fewest remaining (first
 * on ties).
 */
export function rateLimitHeaders(
  statuses: readonly RlsDescriptorStatus[],
  plans?: readonly { quotaMode: boolean }[],
): RlsHeader[] {
  let chosen: RlsDescriptorStatus | null = null;
  for (let i = 0; i < statuses.length; i++) {
    const s = statuses[i] as RlsDescriptorStatus;
    if (s.currentLimit === null) continue;
    if (s.code === OVER_LIMIT && plans?.[i]?.quotaMode !== true) {
      chosen = s;
      break;
    }
    if (chosen === null || s.limitRemaining < chosen.limitRemaining) chosen = s;
  }
  if (chosen === null || chosen.currentLimit === null) return [];
  return [
    { key: RATELIMIT_LIMIT_HEADER, value: String(chosen.currentLimit.requestsPerUnit) },
    { key: RATELIMIT_REMAINING_HEADER, value: String(chosen.limitRemaining) },
    { key: RATELIMIT_RESET_HEADER, value: String(chosen.durationUntilReset?.seconds ?? 0) },
  ];
}

// ---- Keys ---------------------------------------------------------------------------------------

/**
 * The bucket of a global quota: named by its coordinator quota key (`tenant/acme`, `tier/gold`,
 * `domain/api`) and nothing else, so every domain, rule path and descriptor that reaches the quota
 * shares one bucket per cell. (`~` cannot start a rule's bucket key, and `~o|` is the override prefix.)
 */
export function globalBucketKey(quotaKey: string): string {
  return `${GLOBAL_BUCKET_HEAD}${quotaKey}`;
}

/** What a global quota's bucket key starts with (the global fast path hashes it as a part of its own). */
const GLOBAL_BUCKET_HEAD = '~q|';

/** The tenant quota a `global: true` match selects: the tenant named by the descriptor's value. */
function globalQuotaKey(m: RuleMatch): string {
  return tenantKey(m.global?.value ?? '');
}

/** The bucket key of a descriptor with a limit override: per domain and request values. */
export function overrideKey(
  domain: string,
  entries: readonly { readonly key: string; readonly value: string }[],
): string {
  let key = `~o|${escapeKeyPart(domain)}`;
  for (const e of entries) key += `|${escapeKeyPart(e.key)}=${escapeKeyPart(e.value)}`;
  return key;
}
