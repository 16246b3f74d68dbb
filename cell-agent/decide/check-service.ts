// One check, as every front end (gRPC in the workers, HTTP in the main thread, the gateway) answers
// it: the overload path, the decision, the statistics, and fail-open on an unexpected error.
//
// - A request the agent refuses to decide (empty domain / descriptors, over an input bound): an error
//   with a gRPC status code, checked FIRST (before the overload guard: a huge request must not turn
//   its own decoding time into a fail-open OK); counted in rejected_requests.
// - Overloaded (LagGuard), by --overload-policy (decide/overload.ts):
//     bounded (default): the check is matched, then admitted fail-open only while every level holds
//       its hits in its fail-open allowance (counted as verdict "degraded", fail_open
//       {reason="overload"}, per quota key in the throttling log and quota_fail_open_total), else
//       refused at once (verdict "over_limit", overload_refused{reason="allowance"}). Both answers
//       are constants built once per descriptor count (encoded too, with the transport's encoder
//       when it gives one: the lean server's framed gRPC message): nothing
//       is allocated for the answer. With --overload-allowance 0, `shed()` refuses before decoding.
//     open: answered OK at once — one OK status per descriptor, `x-ratelimit-degraded` and
//       `x-ratelimit-fail-open` — without matching or touching a bucket (the behaviour before
//       issue 15, kept for comparison).
// - An exception inside the decision (a bug, or memory pressure): logged (at most once a second,
//   with the number suppressed), answered fail-open like the open policy — rate limiting must never
//   take down the traffic it protects — and counted as fail_open {reason="error"}. The process and
//   the thread keep serving.
import type { Logger } from '../../shared/logging.js';
import type { BucketTable } from '../buckets/bucket-table.js';
import type { ElapsedClock } from '../buckets/elapsed-clock.js';
import type { GcraLimit } from '../buckets/gcra.js';
import type { OverloadSignal } from '../observe/lag-guard.js';
import type { RejectReason, StatsWriter, Verdict } from '../observe/stats.js';
import type { ThrottleCounts } from '../observe/throttle-log.js';
import { UNMATCHED_QUOTA } from '../observe/throttle-log.js';
import type { RlsDescriptorStatus, RlsHeader, RlsRequest, RlsResponse } from '../messages/rls-messages.js';
import { RLS_CODE } from '../messages/rls-messages.js';
import type { Decider, DecisionScope } from './decide.js';
import { CELL_HEADER, DEGRADED_HEADER, FAIL_OPEN_HEADER, OVERLOAD_REFUSED_BY, REFUSED_BY_HEADER } from './decide.js';
import { DEFAULT_OVERLOAD, OverloadAllowances } from './overload.js';
import type { OverloadOptions, OverloadSink } from './overload.js';
import { checkRequest } from './request-check.js';

export type CheckOutcome =
  | {
      readonly kind: 'answer';
      readonly response: RlsResponse;
      readonly overLimit: boolean;
      readonly verdict: Verdict;
      readonly scope: DecisionScope;
      /** For HTTP Retry-After (0n when OK). */
      readonly retryAfterNs: bigint;
      /** Decision.statusLimits (empty for a fail-open answer). */
      readonly statusLimits: readonly (GcraLimit | null)[];
      /** The overload path's constants: the response encoded once with CheckServiceOptions.encode. */
      readonly encoded?: Buffer;
    }
  | { readonly kind: 'error'; readonly code: number; readonly message: string };

const NO_LIMITS: readonly (GcraLimit | null)[] = Object.freeze([]);
const OK_STATUS: RlsDescriptorStatus = Object.freeze({
  code: RLS_CODE.OK,
  currentLimit: null,
  limitRemaining: 0,
  durationUntilReset: null,
});
const FAIL_OPEN_HEADERS = Object.freeze([
  Object.freeze({ key: DEGRADED_HEADER, value: 'true' }),
  Object.freeze({ key: FAIL_OPEN_HEADER, value: 'true' }),
]);

/** The fail-open answer: OK for every descriptor, marked degraded and fail-open. */
export function failOpenResponse(descriptorCount: number): RlsResponse {
  return {
    overallCode: RLS_CODE.OK,
    statuses: new Array<RlsDescriptorStatus>(descriptorCount).fill(OK_STATUS),
    responseHeadersToAdd: FAIL_OPEN_HEADERS,
    requestHeadersToAdd: [],
    rawBody: null,
  };
}

type Answer = Extract<CheckOutcome, { kind: 'answer' }>;

const NS_PER_S = 1_000_000_000n;

/** How a transport encodes an answer once (the lean server: one framed gRPC message). */
export type AnswerEncoder = (response: RlsResponse) => Buffer;

/** The overload path's answers, built once per descriptor count and shared: nothing per answer. */
export class OverloadAnswers {
  private readonly failOpen: Answer[] = [];
  private readonly refused: Answer[] = [];
  private readonly refusedHeaders: readonly RlsHeader[];
  /** The refusal without statuses: what a check shed before decoding gets (its descriptors are unknown). */
  readonly shed: Answer;

  constructor(
    cell: string | null,
    private readonly encode: AnswerEncoder | null = null,
  ) {
    this.refusedHeaders = Object.freeze([
      Object.freeze({ key: DEGRADED_HEADER, value: 'true' }),
      Object.freeze({ key: REFUSED_BY_HEADER, value: OVERLOAD_REFUSED_BY }),
      ...(cell === null ? [] : [Object.freeze({ key: CELL_HEADER, value: cell })]),
    ]);
    this.shed = this.refusedAnswer(0);
  }

  failOpenFor(descriptors: number): Answer {
    let a = this.failOpen[descriptors];
    if (a === undefined) {
      const response = failOpenResponse(descriptors);
      a = Object.freeze({
        kind: 'answer',
        response,
        overLimit: false,
        verdict: 'degraded',
        scope: 'local',
        retryAfterNs: 0n,
        statusLimits: NO_LIMITS,
        ...this.encoded(response),
      });
      this.failOpen[descriptors] = a;
    }
    return a;
  }

  refusedFor(descriptors: number): Answer {
    let a = this.refused[descriptors];
    if (a === undefined) {
      a = this.refusedAnswer(descriptors);
      this.refused[descriptors] = a;
    }
    return a;
  }

  private refusedAnswer(descriptors: number): Answer {
    const response: RlsResponse = Object.freeze({
      overallCode: RLS_CODE.OVER_LIMIT,
      statuses: Object.freeze(new Array<RlsDescriptorStatus>(descriptors).fill(OVERLOAD_STATUS)),
      responseHeadersToAdd: this.refusedHeaders,
      requestHeadersToAdd: [],
      rawBody: null,
    });
    return Object.freeze({
      kind: 'answer',
      response,
      overLimit: true,
      verdict: 'over_limit',
      scope: 'local',
      retryAfterNs: NS_PER_S,
      statusLimits: NO_LIMITS,
      ...this.encoded(response),
    });
  }

  private encoded(response: RlsResponse): { encoded?: Buffer } {
    return this.encode === null ? {} : { encoded: this.encode(response) };
  }
}

const OVERLOAD_STATUS: RlsDescriptorStatus = Object.freeze({
  code: RLS_CODE.OVER_LIMIT,
  currentLimit: null,
  limitRemaining: 0,
  durationUntilReset: Object.freeze({ seconds: 1, nanos: 0 }),
});

export interface CheckServiceOptions {
  /** --overload-policy and --overload-allowance (default bounded, 1). */
  readonly overload?: OverloadOptions;
  /** This thread's allowances over the shared table (required for the bounded policy with an allowance > 0). */
  readonly allowances?: OverloadAllowances | null;
  /** This thread's throttling counts: fail-open answers per reason and quota, overload refusals. */
  readonly throttle?: ThrottleCounts | null;
  /** Named in the overload refusal's x-ratelimit-cell. */
  readonly cell?: string | null;
  /** The transport's encoder: the overload path's constant answers are encoded once with it (CheckOutcome.encoded). */
  readonly encode?: AnswerEncoder | null;
}

/** The allowances of a thread, counting into its throttling counts. */
export function overloadAllowances(
  factor: number,
  table: BucketTable,
  throttle: ThrottleCounts | null,
): OverloadAllowances {
  const sink: OverloadSink | null =
    throttle === null
      ? null
      : {
          failOpen: (key) => throttle.addFailOpen('overload', key),
          refused: (key, hits) => throttle.addOverload(key, hits),
        };
  return new OverloadAllowances(factor, table, sink);
}

export class CheckService {
  private lastErrorLogMs = 0;
  private suppressedErrors = 0;
  readonly overload: OverloadOptions;
  private readonly allowances: OverloadAllowances | null;
  private readonly throttle: ThrottleCounts | null;
  private readonly answers: OverloadAnswers;
  /** The decider's number clock (read at a check's start and end) and [0] the start's reading. */
  private readonly clock: ElapsedClock;
  private readonly started = new Float64Array(1);
  /** checkInPlace()'s outcome. */
  private readonly reused: { -readonly [K in keyof Answer]: Answer[K] } = {
    kind: 'answer',
    response: failOpenResponse(0),
    overLimit: false,
    verdict: 'ok',
    scope: 'local',
    retryAfterNs: 0n,
    statusLimits: NO_LIMITS,
  };

  constructor(
    readonly decider: Decider,
    private readonly stats: StatsWriter,
    private readonly lag: OverloadSignal | null,
    private readonly logger: Logger,
    opts: CheckServiceOptions = {},
  ) {
    this.overload = opts.overload ?? DEFAULT_OVERLOAD;
    this.allowances = opts.allowances ?? null;
    this.throttle = opts.throttle ?? null;
    this.answers = new OverloadAnswers(opts.cell ?? decider.options.cell ?? null, opts.encode ?? null);
    this.clock = decider.elapsedClock;
    if (lag !== null && this.overload.policy === 'bounded' && this.overload.allowance > 0 && this.allowances === null) {
      throw new Error('CheckService: the bounded overload policy with an allowance needs the allowances');
    }
  }

  /** True while this thread is overloaded (the lag guard says so, on its own clock). */
  overloaded(): boolean {
    return this.lag !== null && this.lag.overloaded();
  }

  /**
   * Before decoding: the constant refusal when this check is to be refused whatever it asks (the
   * thread is overloaded under the bounded policy with no allowance), else null (decode and check()).
   */
  shed(): Answer | null {
    if (this.overload.policy !== 'bounded' || this.overload.allowance > 0 || !this.overloaded()) return null;
    this.stats.overloadRefused('shed');
    this.stats.decision('over_limit', 'local', 0);
    return this.answers.shed;
  }

  check(req: RlsRequest): CheckOutcome {
    return this.run(req, false);
  }

  /**
   * check(), with an answer of the decision's common case written into objects reused check after
   * check (Decider.decideInPlace, and this service's outcome): valid until this service's next
   * checkInPlace(). For a caller that reads the outcome at once and keeps nothing of it (the
   * embedded limiter); the transports, which keep or encode the response later, use check().
   */
  checkInPlace(req: RlsRequest): CheckOutcome {
    return this.run(req, true);
  }

  private run(req: RlsRequest, inPlace: boolean): CheckOutcome {
    // One clock reading starts the check, the decision's own (decide(req, true, true) decides at it)
    // and the lag guard's (overloadedAt: a guard on this clock, as the agent's, reads no clock of its
    // own), and one more ends it for the latency histogram: the number clock, nothing allocated.
    const clock = this.clock;
    clock.read();
    this.started[0] = clock.elapsed[0] as number;
    // The request errors and input bounds first, before the overload guard: a request over a bound
    // is refused on every transport, even when its own size is what made the thread late.
    // An exception while checking the bounds (a request object built by an embedding app, with a
    // throwing getter) is an internal error like one inside the decision: the catch below.
    try {
      const failure = checkRequest(req, this.decider.options.bounds);
      if (failure !== null) {
        this.stats.rejected('invalid');
        return { kind: 'error', code: failure.code, message: failure.message };
      }
      if (this.lag !== null && this.lag.overloadedAt(clock)) {
        const answer = this.overloadAnswer(req);
        if (answer !== null) return answer;
        clock.read(); // decided after all: at a reading after the overload path's
      }
      const result = inPlace ? this.decider.decideInPlace(req, true, true) : this.decider.decide(req, true, true);
      if (!result.ok) {
        this.stats.rejected('invalid');
        return { kind: 'error', code: result.failure.code, message: result.failure.message };
      }
      const d = result.decision;
      const verdict: Verdict = d.overLimit ? 'over_limit' : 'ok';
      if (d.staticSlice) this.stats.staticSlice();
      if (d.tableFull && !d.overLimit) {
        this.stats.failOpen('table_full');
        this.throttle?.addFailOpen('table_full', d.tableFullKey ?? UNMATCHED_QUOTA);
      }
      this.decided(verdict, d.scope);
      if (inPlace) {
        const o = this.reused;
        o.response = d.response;
        o.overLimit = d.overLimit;
        o.verdict = verdict;
        o.scope = d.scope;
        o.retryAfterNs = d.retryAfterNs;
        o.statusLimits = d.statusLimits;
        return o;
      }
      return {
        kind: 'answer',
        response: d.response,
        overLimit: d.overLimit,
        verdict,
        scope: d.scope,
        retryAfterNs: d.retryAfterNs,
        statusLimits: d.statusLimits,
      };
    } catch (error) {
      this.reportError(error);
      this.stats.failOpen('error');
      this.throttle?.addFailOpen('error', UNMATCHED_QUOTA);
      this.decided('degraded', 'local');
      return {
        kind: 'answer',
        response: failOpenResponse(req.descriptors.length),
        overLimit: false,
        verdict: 'degraded',
        scope: 'local',
        retryAfterNs: 0n,
        statusLimits: NO_LIMITS,
      };
    }
  }

  /** The overload path's answer, or null: decide normally (nothing to bound, or no rules loaded). */
  private overloadAnswer(req: RlsRequest): Answer | null {
    const n = req.descriptors.length;
    if (this.overload.policy === 'open') {
      this.stats.failOpen('overload');
      this.throttle?.addFailOpen('overload', UNMATCHED_QUOTA);
      this.decided('degraded', 'local');
      return this.answers.failOpenFor(n);
    }
    if (this.overload.allowance === 0 || this.allowances === null) {
      this.stats.overloadRefused('allowance');
      this.decided('over_limit', 'local');
      return this.answers.refusedFor(n);
    }
    const nowNs = this.decider.now();
    const levels = this.decider.planLevels(req, nowNs);
    if (levels === null) return null;
    const verdict = this.allowances.admit(levels, nowNs);
    if (verdict === 'decide') return null;
    if (verdict === 'admit') {
      this.stats.failOpen('overload');
      this.decided('degraded', 'local');
      return this.answers.failOpenFor(n);
    }
    this.stats.overloadRefused('allowance');
    this.decided('over_limit', 'local');
    return this.answers.refusedFor(n);
  }

  /** Counts the check's verdict with its latency since its first clock reading (a second reading). */
  private decided(verdict: Verdict, scope: DecisionScope): void {
    this.stats.decisionSince(verdict, scope, this.clock, this.started);
  }

  /** Counts a request refused before deciding (undecodable bytes, a bad JSON body). */
  rejected(reason: RejectReason): void {
    this.stats.rejected(reason);
  }

  private reportError(error: unknown): void {
    const now = Date.now();
    if (now - this.lastErrorLogMs < 1000) {
      this.suppressedErrors++;
      return;
    }
    this.logger.error(
      { err: error, suppressed: this.suppressedErrors },
      'check failed inside the agent; answered fail-open',
    );
    this.lastErrorLogMs = now;
    this.suppressedErrors = 0;
  }
}
