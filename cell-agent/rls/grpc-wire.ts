// gRPC over HTTP/2, the parts a unary server needs, pure (no sockets): status codes, the
// `grpc-timeout` header, the percent-encoding of `grpc-message`, and the reassembly of one
// length-prefixed message from DATA chunks. The wire format is gRPC's PROTOCOL-HTTP2.md:
//
//   request   HEADERS  :method POST, :path /pkg.Service/Method, content-type application/grpc[+proto|;...],
//                      te: trailers, grpc-timeout (optional), grpc-encoding (optional)
//             DATA     Length-Prefixed-Message*: 1 byte Compressed-Flag, 4 bytes big-endian length, bytes
//   response  HEADERS  :status 200, content-type application/grpc   (or, on error, "Trailers-Only":
//             DATA     the answer                                     one HEADERS frame with :status,
//             HEADERS  grpc-status, grpc-message (trailers)           content-type, grpc-status, grpc-message)

/** gRPC status codes (grpc/doc/statuscodes.md). */
export const GRPC_CODE = Object.freeze({
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  RESOURCE_EXHAUSTED: 8,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
});

/** Length of the message prefix: compressed flag and big-endian uint32 length. */
export const MESSAGE_PREFIX_BYTES = 5;

/** True for the content types gRPC accepts: application/grpc, application/grpc+proto, application/grpc;... */
export function isGrpcContentType(value: string | undefined): boolean {
  if (value === undefined || !value.startsWith('application/grpc')) return false;
  const rest = value.length === 16 ? '' : value.charAt(16);
  return rest === '' || rest === '+' || rest === ';';
}

const TIMEOUT_UNIT_MS: Readonly<Record<string, number>> = Object.freeze({
  H: 3_600_000,
  M: 60_000,
  S: 1000,
  m: 1,
  u: 1e-3,
  n: 1e-6,
});

/**
 * The `grpc-timeout` header ("TimeoutValue TimeoutUnit": 1 to 8 ASCII digits, one of H M S m u n)
 * in milliseconds; null when absent, NaN when present but malformed.
 */
export function parseGrpcTimeout(value: string | undefined): number | null {
  if (value === undefined) return null;
  const n = value.length;
  if (n < 2 || n > 9) return Number.NaN;
  const unit = TIMEOUT_UNIT_MS[value.charAt(n - 1)];
  if (unit === undefined) return Number.NaN;
  let digits = 0;
  for (let i = 0; i < n - 1; i++) {
    const c = value.charCodeAt(i) - 48;
    if (c < 0 || c > 9) return Number.NaN;
    digits = digits * 10 + c;
  }
  return digits * unit;
}

/**
 * `grpc-message` as the protocol carries it: UTF-8, with every byte outside 0x20..0x7E and '%'
 * itself percent-encoded (%XX).
 */
export function encodeGrpcMessage(message: string): string {
  let plain = true;
  for (let i = 0; i < message.length; i++) {
    const c = message.charCodeAt(i);
    if (c < 0x20 || c > 0x7e || c === 0x25) {
      plain = false;
      break;
    }
  }
  if (plain) return message;
  let out = '';
  for (const byte of Buffer.from(message, 'utf8')) {
    out +=
      byte >= 0x20 && byte <= 0x7e && byte !== 0x25
        ? String.fromCharCode(byte)
        : `%${byte.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

/** The inverse of encodeGrpcMessage (clients and tests); malformed escapes are kept as they are. */
export function decodeGrpcMessage(value: string): string {
  if (!value.includes('%')) return value;
  const bytes: number[] = [];
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c === 0x25 && i + 2 < value.length && /^[0-9A-Fa-f]{2}$/.test(value.slice(i + 1, i + 3))) {
      bytes.push(Number.parseInt(value.slice(i + 1, i + 3), 16));
      i += 2;
    } else {
      bytes.push(c & 0xff);
    }
  }
  return Buffer.from(bytes).toString('utf8');
}

/** What a stream's request body turned out to be, for a unary method. */
export type UnaryBody =
  | { readonly kind: 'message'; readonly bytes: Buffer }
  | { readonly kind: 'error'; readonly code: number; readonly message: string };

/**
 * Collects the DATA of one unary call: exactly one length-prefixed message, uncompressed, at most
 * `maxMessageBytes` long. push() returns an error as soon as the bytes seen so far rule the call out
 * (the caller answers at once and stops reading), else null; finish() at END_STREAM gives the
 * message or the error. A message that arrives in one chunk is returned as a view of that chunk
 * (no copy).
 */
export class UnaryCollector {
  private chunks: Buffer[] | null = null;
  private first: Buffer | null = null;
  private received = 0;
  /** Message length from the prefix, once 5 bytes were seen; -1 before. */
  private length = -1;

  constructor(private readonly maxMessageBytes: number) {}

  push(chunk: Buffer): UnaryBody | null {
    if (chunk.length === 0) return null;
    if (this.first === null) this.first = chunk;
    else (this.chunks ??= [this.first]).push(chunk);
    this.received += chunk.length;
    if (this.length < 0 && this.received >= MESSAGE_PREFIX_BYTES) {
      const head = this.chunks === null ? chunk : this.head();
      const flag = head[0] as number;
      if (flag === 1) {
        return {
          kind: 'error',
          code: GRPC_CODE.UNIMPLEMENTED,
          message: 'compressed messages are not supported: send them uncompressed (grpc-accept-encoding: identity)',
        };
      }
      if (flag !== 0)
        return {
          kind: 'error',
          code: GRPC_CODE.INTERNAL,
          message: `invalid compressed-flag byte ${flag} in the message prefix`,
        };
      this.length = head.readUInt32BE(1);
      if (this.length > this.maxMessageBytes) {
        return {
          kind: 'error',
          code: GRPC_CODE.RESOURCE_EXHAUSTED,
          message: `received message larger than max (${this.length} vs. ${this.maxMessageBytes})`,
        };
      }
    }
    if (this.length >= 0 && this.received > MESSAGE_PREFIX_BYTES + this.length) {
      return {
        kind: 'error',
        code: GRPC_CODE.UNIMPLEMENTED,
        message: 'more than one request message for a unary method',
      };
    }
    return null;
  }

  finish(): UnaryBody {
    if (this.received === 0)
      return { kind: 'error', code: GRPC_CODE.UNIMPLEMENTED, message: 'no request message for a unary method' };
    if (this.length < 0 || this.received < MESSAGE_PREFIX_BYTES + this.length) {
      return {
        kind: 'error',
        code: GRPC_CODE.INTERNAL,
        message: `the request ended inside a message (${this.received} bytes received)`,
      };
    }
    const all = this.chunks === null ? (this.first as Buffer) : Buffer.concat(this.chunks, this.received);
    return { kind: 'message', bytes: all.subarray(MESSAGE_PREFIX_BYTES, MESSAGE_PREFIX_BYTES + this.length) };
  }

  /** The first 5 bytes, across chunks. */
  private head(): Buffer {
    const chunks = this.chunks as Buffer[];
    return Buffer.concat(chunks, Math.min(this.received, 16)).subarray(0, MESSAGE_PREFIX_BYTES);
  }
}

/** One length-prefixed message: a new buffer holding the prefix and `message`. */
export function frameMessage(message: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(MESSAGE_PREFIX_BYTES + message.length);
  out[0] = 0;
  out.writeUInt32BE(message.length, 1);
  out.set(message, MESSAGE_PREFIX_BYTES);
  return out;
}
