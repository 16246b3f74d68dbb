// Request validation shared by the gRPC server and the HTTP API: envoyproxy/ratelimit's two request
// errors, then the agent's input bounds.
//
// envoyproxy/ratelimit returns a plain Go error for an empty domain or an empty descriptor list, which
// grpc-go sends as status UNKNOWN with the error text; we send the same code and text. A request over
// one of the bounds below gets INVALID_ARGUMENT with a message naming the bound. Checked in this
// order: domain empty, descriptors empty, domain length, descriptor count, then per descriptor its
// entry count, key and value lengths and the limit override's unit.
import type { RlsRequest } from '../messages/rls-messages.js';
import { REQUEST_UNIT } from '../messages/rls-messages.js';

/** gRPC status codes used here (grpc-js's Status enum, without importing grpc into the decision code). */
export const GRPC_STATUS = Object.freeze({
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  RESOURCE_EXHAUSTED: 8,
});

export interface RequestBounds {
  /** Descriptors in one request. */
  readonly maxDescriptors: number;
  /** Entries in one descriptor. */
  readonly maxEntries: number;
  /** Length of an entry key, in UTF-16 code units. */
  readonly maxKeyLength: number;
  /** Length of an entry value, in UTF-16 code units. */
  readonly maxValueLength: number;
  /** Length of the domain, in UTF-16 code units. */
  readonly maxDomainLength: number;
}

export const DEFAULT_REQUEST_BOUNDS: RequestBounds = Object.freeze({
  maxDescriptors: 64,
  maxEntries: 16,
  maxKeyLength: 256,
  maxValueLength: 4096,
  maxDomainLength: 256,
});

/** A request the agent answers with an error instead of a decision. */
export interface RequestFailure {
  /** gRPC status code. */
  readonly code: number;
  readonly message: string;
}

export const EMPTY_DOMAIN_MESSAGE = 'rate limit domain must not be empty';
export const EMPTY_DESCRIPTORS_MESSAGE = 'rate limit descriptor list must not be empty';

/** null if the request may be decided, else the error to answer with. */
export function checkRequest(req: RlsRequest, bounds: RequestBounds): RequestFailure | null {
  if (req.domain === '') return { code: GRPC_STATUS.UNKNOWN, message: EMPTY_DOMAIN_MESSAGE };
  if (req.descriptors.length === 0) return { code: GRPC_STATUS.UNKNOWN, message: EMPTY_DESCRIPTORS_MESSAGE };
  if (req.domain.length > bounds.maxDomainLength) {
    return invalid(
      `domain is ${req.domain.length} characters long, more than the maximum of ${bounds.maxDomainLength}`,
    );
  }
  if (req.descriptors.length > bounds.maxDescriptors) {
    return invalid(
      `request has ${req.descriptors.length} descriptors, more than the maximum of ${bounds.maxDescriptors}`,
    );
  }
  // The loop only finds the first descriptor over a bound; its message is built after the loop, in
  // one place: with a message per bound inside the loop, Node 20's optimizing compiler converted `i`
  // to a string on every iteration, ahead of the branches that use it (seen in --print-opt-code).
  let over = OVER_NONE;
  let at = 0;
  let entry = 0;
  scan: for (let i = 0; i < req.descriptors.length; i++) {
    const d = req.descriptors[i];
    if (d === undefined) continue;
    if (d.entries.length > bounds.maxEntries) {
      over = OVER_ENTRIES;
      at = i;
      break;
    }
    for (let j = 0; j < d.entries.length; j++) {
      const e = d.entries[j];
      if (e === undefined) continue;
      if (e.key.length > bounds.maxKeyLength || e.value.length > bounds.maxValueLength) {
        over = e.key.length > bounds.maxKeyLength ? OVER_KEY : OVER_VALUE;
        at = i;
        entry = j;
        break scan;
      }
    }
    if (d.limit !== null && (d.limit.unit < REQUEST_UNIT.SECOND || d.limit.unit > REQUEST_UNIT.YEAR)) {
      over = OVER_UNIT;
      at = i;
      break;
    }
  }
  return over === OVER_NONE ? null : descriptorFailure(req, bounds, over, at, entry);
}

const OVER_NONE = 0;
const OVER_ENTRIES = 1;
const OVER_KEY = 2;
const OVER_VALUE = 3;
const OVER_UNIT = 4;

/** The error for descriptor i (entry j) over the bound `over`. */
function descriptorFailure(req: RlsRequest, bounds: RequestBounds, over: number, i: number, j: number): RequestFailure {
  const d = req.descriptors[i] as RlsRequest['descriptors'][number];
  switch (over) {
    case OVER_ENTRIES:
      return invalid(`descriptor ${i} has ${d.entries.length} entries, more than the maximum of ${bounds.maxEntries}`);
    case OVER_KEY: {
      const e = d.entries[j] as RlsRequest['descriptors'][number]['entries'][number];
      return invalid(
        `descriptor ${i} entry ${j}: key is ${e.key.length} characters ` +
          `long, more than the maximum of ${bounds.maxKeyLength}`,
      );
    }
    case OVER_VALUE: {
      const e = d.entries[j] as RlsRequest['descriptors'][number]['entries'][number];
      return invalid(
        `descriptor ${i} entry ${j}: value is ${e.value.length} characters ` +
          `long, more than the maximum of ${bounds.maxValueLength}`,
      );
    }
    default:
      return invalid(`descriptor ${i}: limit override has unit ${d.limit?.unit}, not one of SECOND..YEAR (1..6)`);
  }
}

function invalid(message: string): RequestFailure {
  return { code: GRPC_STATUS.INVALID_ARGUMENT, message };
}
