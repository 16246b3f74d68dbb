// The RLS messages as the agent handles them: Envoy's RateLimitRequest and RateLimitResponse
// (envoy.service.ratelimit.v3, proto/envoy/service/ratelimit/v3/rls.proto) as plain objects, and
// the numbers of their enums. What decides (decide/) and what carries them (rls/'s codec and
// servers, the HTTP API, the embedded limiter) share these types; only rls/rls-codec.ts knows the
// wire format.
/** RateLimitResponse.Code. */
export const RLS_CODE = Object.freeze({ UNKNOWN: 0, OK: 1, OVER_LIMIT: 2 });
export type RlsCode = 0 | 1 | 2;

/** envoy.type.v3.RateLimitUnit (a request's limit override): no WEEK here. */
export const REQUEST_UNIT = Object.freeze({ UNKNOWN: 0, SECOND: 1, MINUTE: 2, HOUR: 3, DAY: 4, MONTH: 5, YEAR: 6 });

export interface RlsEntry {
  readonly key: string;
  readonly value: string;
}

export interface RlsLimitOverride {
  readonly requestsPerUnit: number;
  /** envoy.type.v3.RateLimitUnit number (REQUEST_UNIT). */
  readonly unit: number;
}

export interface RlsDescriptor {
  readonly entries: readonly RlsEntry[];
  readonly limit: RlsLimitOverride | null;
  /** The descriptor's hits_addend when the wrapper is present (0 allowed), else null. Saturates at 2^53 − 1. */
  readonly hitsAddend: number | null;
}

export interface RlsRequest {
  readonly domain: string;
  readonly descriptors: readonly RlsDescriptor[];
  /** The request-level hits_addend (uint32; 0 when absent). */
  readonly hitsAddend: number;
}

export interface RlsRateLimit {
  readonly requestsPerUnit: number;
  /** RateLimitResponse.RateLimit.Unit number (WEEK = 7). */
  readonly unit: number;
  readonly name: string;
}

export interface RlsDuration {
  readonly seconds: number;
  readonly nanos: number;
}

export interface RlsDescriptorStatus {
  readonly code: RlsCode;
  readonly currentLimit: RlsRateLimit | null;
  readonly limitRemaining: number;
  readonly durationUntilReset: RlsDuration | null;
}

export interface RlsHeader {
  readonly key: string;
  readonly value: string;
}

export interface RlsResponse {
  readonly overallCode: RlsCode;
  readonly statuses: readonly RlsDescriptorStatus[];
  readonly responseHeadersToAdd: readonly RlsHeader[];
  readonly requestHeadersToAdd: readonly RlsHeader[];
  readonly rawBody: Uint8Array | null;
}
