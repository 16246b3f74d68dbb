// One check, as both front ends (gRPC in the workers, HTTP in the main thread) answer it: the
// overload guard, the decision, the statistics, and fail-open on an unexpected error.
//
// - A request the agent refuses to decide (empty domain / descriptors, over an input bound): an error
//   with a gRPC status code, checked FIRST (before the overload guard: a huge request must not turn
//   its own decoding time into a fail-open OK); counted in rejected_requests.
// - Overloaded (LagGuard): answer OK at once — one OK status per descriptor, `x-ratelimit-degraded:
//   true` — without matching or touching a bucket; counted as verdict "degraded", fail_open
//   {reason="overload"}.
// - An exception inside the decision (a bug, or memory pressure): logged (at most once a second,
//   with the number suppressed), answered fail-open like an overload — rate limiting must never
//   take down the traffic it protects — and counted as fail_open {reason="error"}. The process and
//   the thread keep serving.
import { performance } from 'node:perf_hooks';
import type { Logger } from '../../shared/logging.js';
import type { GcraLimit } from '../buckets/gcra.js';
import type { LagGuard } from '../observe/lag-guard.js';
import type { RejectReason, StatsWriter, Verdict } from '../observe/stats.js';
import type { RlsDescriptorStatus, RlsRequest, RlsResponse } from '../rls/rls-codec.js';
import { RLS_CODE } from '../rls/rls-codec.js';
import type { Decider, DecisionScope } from './decide.js';
import { DEGRADED_HEADER, FAIL_OPEN_HEADER } from './decide.js';
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
  }
  | { readonly kind: 'error'; readonly code: number; readonly message: string };

const NO_LIMITS: readonly (GcraLimit | null)[] = Object.freeze([]);
const OK_STATUS: RlsDescriptorStatus = Object.freeze({ code: RLS_CODE.OK, currentLimit: null, limitRemaining: 0, durationUntilReset: null });
const FAIL_OPEN_HEADERS = Object.freeze([Object.freeze({ key: DEGRADED_HEADER, value: 'true' }), Object.freeze({ key: FAIL_OPEN_HEADER, value: 'true' })]);

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

export class CheckService {
  private lastErrorLogMs = 0;
  private suppressedErrors = 0;

  constructor(
    readonly decider: Decider,
    private readonly stats: StatsWriter,
    private readonly lag: LagGuard | null,
    private readonly logger: Logger,
  ) {}

  check(req: RlsRequest): CheckOutcome {
    const start = performance.now();
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
      if (this.lag !== null && this.lag.overloaded(start)) {
        this.stats.failOpen('overload');
        this.stats.decision('degraded', 'local', (performance.now() - start) / 1000);
        return { kind: 'answer', response: failOpenResponse(req.descriptors.length), overLimit: false, verdict: 'degraded', scope: 'local', retryAfterNs: 0n, statusLimits: NO_LIMITS };
      }
      const result = this.decider.decide(req, true);
      if (!result.ok) {
        this.stats.rejected('invalid');
        return { kind: 'error', code: result.failure.code, message: result.failure.message };
      }
      const d = result.decision;
      const verdict: Verdict = d.overLimit ? 'over_limit' : 'ok';
      if (d.staticSlice) this.stats.staticSlice();
      if (d.tableFull) this.stats.failOpen('table_full');
      this.stats.decision(verdict, d.scope, (performance.now() - start) / 1000);
      return { kind: 'answer', response: d.response, overLimit: d.overLimit, verdict, scope: d.scope, retryAfterNs: d.retryAfterNs, statusLimits: d.statusLimits };
    } catch (error) {
      this.reportError(error);
      this.stats.failOpen('error');
      this.stats.decision('degraded', 'local', (performance.now() - start) / 1000);
      return { kind: 'answer', response: failOpenResponse(req.descriptors.length), overLimit: false, verdict: 'degraded', scope: 'local', retryAfterNs: 0n, statusLimits: NO_LIMITS };
    }
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
    this.logger.error({ err: error, suppressed: this.suppressedErrors }, 'check failed inside the agent; answered fail-open');
    this.lastErrorLogMs = now;
    this.suppressedErrors = 0;
  }
}
