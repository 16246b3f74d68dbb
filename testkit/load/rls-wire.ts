// The bytes the load generator sends and the little it reads back, encoded by hand (no protobuf
// library in the generator's hot path): envoy.service.ratelimit.v3.RateLimitRequest as Envoy sends
// it (docs/envoy-rls.md §2, §4) inside a gRPC length-prefixed message, and the
// `overall_code` of a RateLimitResponse.
//
//   RateLimitRequest      1 domain: string, 2 descriptors: RateLimitDescriptor (repeated)
//   RateLimitDescriptor   1 entries: Entry (repeated)
//   Entry                 1 key: string, 2 value: string
//   RateLimitResponse     1 overall_code: Code (UNKNOWN 0, OK 1, OVER_LIMIT 2),
//                         3 response_headers_to_add: HeaderValue (repeated) {1 key, 2 value}
// The agent marks a fail-open answer with the response header `x-ratelimit-degraded`
// (cell-agent/decide/check-service.ts); decodeResponse reports it, so a benchmark can tell real
// decisions from answers given without deciding.

export const RLS_PATH = '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit';

export const CODE_UNKNOWN = 0;
export const CODE_OK = 1;
export const CODE_OVER_LIMIT = 2;

export interface WireEntry {
  readonly key: string;
  readonly value: string;
}

function varint(n: number): number[] {
  const out: number[] = [];
  let v = n >>> 0;
  while (v >= 0x80) {
    out.push((v & 0x7f) | 0x80);
    v >>>= 7;
  }
  out.push(v);
  return out;
}

/** A length-delimited field: tag (field number, wire type 2), length, bytes. */
function lenField(field: number, bytes: Uint8Array): Uint8Array {
  const head = [...varint((field << 3) | 2), ...varint(bytes.length)];
  const out = new Uint8Array(head.length + bytes.length);
  out.set(head, 0);
  out.set(bytes, head.length);
  return out;
}

function concat(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

const utf8 = new TextEncoder();

/** RateLimitRequest{domain, descriptors: [{entries}] ...} (hits_addend unset: one hit). */
export function encodeRateLimitRequest(domain: string, descriptors: readonly (readonly WireEntry[])[]): Uint8Array {
  const parts: Uint8Array[] = [lenField(1, utf8.encode(domain))];
  for (const entries of descriptors) {
    const entryBytes = entries.map((e) =>
      lenField(1, concat([lenField(1, utf8.encode(e.key)), lenField(2, utf8.encode(e.value))])),
    );
    parts.push(lenField(2, concat(entryBytes)));
  }
  return concat(parts);
}

/** A gRPC length-prefixed message: 1 byte "compressed" (0), 4 bytes big-endian length, the message. */
export function grpcFrame(message: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(5 + message.length);
  out[0] = 0;
  out.writeUInt32BE(message.length, 1);
  out.set(message, 5);
  return out;
}

/** The benchmark's requests: one gRPC frame per tenant, [{key: 'tenant', value: 'tenant-N'}] in `domain`. */
export function tenantFrames(domain: string, tenants: number): Buffer[] {
  const frames: Buffer[] = [];
  for (let i = 0; i < tenants; i++)
    frames.push(grpcFrame(encodeRateLimitRequest(domain, [[{ key: 'tenant', value: `tenant-${i}` }]])));
  return frames;
}

export const DEGRADED_HEADER = 'x-ratelimit-degraded';
/** Set in decodeResponse's result when the answer carries the DEGRADED_HEADER response header. */
export const DEGRADED_FLAG = 0x1_0000;
export const FAIL_OPEN_HEADER = 'x-ratelimit-fail-open';
/** Set in decodeResponse's result when the answer carries the FAIL_OPEN_HEADER (given without a decision). */
export const FAIL_OPEN_FLAG = 0x2_0000;
const DEGRADED_KEY = utf8.encode(DEGRADED_HEADER);
const FAIL_OPEN_KEY = utf8.encode(FAIL_OPEN_HEADER);

/** True when HeaderValue bytes body[from, to) have key (field 1) = `key`. */
function isHeader(key: Uint8Array, body: Uint8Array, from: number, to: number): boolean {
  // The key is normally the first field: 0x0a, length, bytes.
  if (body[from] !== 0x0a || body[from + 1] !== key.length || from + 2 + key.length > to) return false;
  for (let i = 0; i < key.length; i++) if (body[from + 2 + i] !== key[i]) return false;
  return true;
}

/** The overall_code of a gRPC body (see decodeResponse), without the flags. */
export function decodeOverallCode(body: Uint8Array): number {
  const r = decodeResponse(body);
  return r < 0 ? r : r & 0xffff;
}

/**
 * The overall_code of the RateLimitResponse in a gRPC body (prefix included), OR DEGRADED_FLAG when a
 * response header is DEGRADED_HEADER and FAIL_OPEN_FLAG when one is FAIL_OPEN_HEADER; -1 when the
 * body is not one whole uncompressed message.
 * Walks the top-level fields, skipping all but fields 1 and 3.
 */
export function decodeResponse(body: Uint8Array): number {
  if (body.length < 5 || body[0] !== 0) return -1;
  const len = (((body[1] ?? 0) << 24) | ((body[2] ?? 0) << 16) | ((body[3] ?? 0) << 8) | (body[4] ?? 0)) >>> 0;
  const end = 5 + len;
  if (end !== body.length) return -1;
  let at = 5;
  let code = CODE_UNKNOWN;
  let flags = 0;
  const readVarint = (): number => {
    let result = 0;
    let shift = 0;
    for (;;) {
      if (at >= end) throw new RangeError('truncated varint');
      const b = body[at++] ?? 0;
      if (shift < 28) result |= (b & 0x7f) << shift;
      else result += (b & 0x7f) * 2 ** shift;
      if ((b & 0x80) === 0) return result;
      shift += 7;
      if (shift > 63) throw new RangeError('varint too long');
    }
  };
  try {
    while (at < end) {
      const tag = readVarint();
      const field = Math.floor(tag / 8);
      const wire = tag & 7;
      if (wire === 0) {
        const v = readVarint();
        if (field === 1) code = v;
      } else if (wire === 2) {
        const n = readVarint(); // not `at += readVarint()`: that reads `at` before the call moves it
        if (field === 3 && at + n <= end) {
          if (isHeader(DEGRADED_KEY, body, at, at + n)) flags |= DEGRADED_FLAG;
          else if (isHeader(FAIL_OPEN_KEY, body, at, at + n)) flags |= FAIL_OPEN_FLAG;
        }
        at += n;
      } else if (wire === 1) {
        at += 8;
      } else if (wire === 5) {
        at += 4;
      } else {
        return -1;
      }
    }
  } catch {
    return -1;
  }
  return at === end ? code | flags : -1;
}
