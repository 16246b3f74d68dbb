// Protobuf encoding and decoding of Envoy's RLS v3 messages and of gRPC health messages, by hand.
//
// Why not protobufjs (through @grpc/proto-loader)? The request decoder is on the agent's hot path and
// faces bytes from the network: a hand decoder for these few fixed messages allocates only the
// objects it returns, never throws (a malformed message comes back as a value the handler answers
// with INVALID_ARGUMENT, where grpc-js would turn a throwing deserializer into INTERNAL), and skips
// unknown fields the way protobuf requires (so a newer Envoy adding fields still works). The wire
// format is fixed by proto/envoy/** (Envoy's field numbers); test/cell-agent/rls/rls-codec.test.ts
// checks this codec against protobufjs loading those files, both directions, with random messages.
// The lean server's decoding (decodeRateLimitRequestReused) fills this thread's reused request
// objects, and a repeated short ASCII string is the one decoded last time (ascii-interner.ts): a
// common check allocates only its answer's buffer here. Headers that are frozen objects are encoded
// once and copied after (a refusal's repeating provenance headers: decide/decide.ts).
//
// Field numbers (docs/envoy-rls.md §2):
//   RateLimitRequest      1 domain string, 2 descriptors RateLimitDescriptor*, 3 hits_addend uint32
//   RateLimitDescriptor   1 entries Entry*, 2 limit RateLimitOverride, 3 hits_addend UInt64Value
//   Entry                 1 key string, 2 value string
//   RateLimitOverride     1 requests_per_unit uint32, 2 unit envoy.type.v3.RateLimitUnit
//   UInt64Value           1 value uint64
//   RateLimitResponse     1 overall_code Code, 2 statuses DescriptorStatus*, 3 response_headers_to_add
//                         HeaderValue*, 4 request_headers_to_add HeaderValue*, 5 raw_body bytes
//   DescriptorStatus      1 code, 2 current_limit RateLimit, 3 limit_remaining uint32,
//                         4 duration_until_reset Duration
//   RateLimit             1 requests_per_unit uint32, 2 unit Unit, 3 name string
//   Duration              1 seconds int64, 2 nanos int32
//   HeaderValue           1 key string, 2 value string
// Fields the agent never sends (dynamic_metadata, quota) are skipped when decoding a response.

import type {
  RlsCode,
  RlsDescriptor,
  RlsDescriptorStatus,
  RlsDuration,
  RlsEntry,
  RlsHeader,
  RlsLimitOverride,
  RlsRateLimit,
  RlsRequest,
  RlsResponse,
} from '../messages/rls-messages.js';
import { CellquotaError } from '../../shared/errors.js';
import { AsciiInterner } from './ascii-interner.js';

/** A decoded message, or why the bytes are not one. Decoders never throw. */
export type Decoded<T> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly error: string };

// ---- Reading ------------------------------------------------------------------------------------

const WT_VARINT = 0;
const WT_I64 = 1;
const WT_LEN = 2;
const WT_I32 = 5;

/** Thrown inside a decoder and caught at its top: decoders return a value, never throw. */
class Malformed extends CellquotaError {
  readonly code = 'RLS_MESSAGE_MALFORMED';
}

/** This thread's decoded short ASCII strings (ascii-interner.ts): a repeated domain, key or value is not rebuilt. */
const interned = new AsciiInterner();

/** UTF-8 bytes [start, end) as a string (invalid sequences become U+FFFD, as protobufjs reads them). */
function utf8(buf: Uint8Array, start: number, end: number): string {
  return Buffer.isBuffer(buf)
    ? buf.toString('utf8', start, end)
    : Buffer.from(buf.buffer, buf.byteOffset + start, end - start).toString('utf8');
}

/** A cursor over one length-delimited region; every read is bounds-checked. */
class Reader {
  pos: number;
  constructor(
    public buf: Uint8Array,
    start: number,
    /** The end of the region being read: a sub-message's while it is read (sub()), then the outer one's again. */
    public end: number,
  ) {
    this.pos = start;
  }

  /** Points this reader at the whole of `buf` (the decoders' one reader, reused message after message). */
  reset(buf: Uint8Array): void {
    this.buf = buf;
    this.pos = 0;
    this.end = buf.length;
    this.lastWireType = 0;
  }

  /** The last varint read: its low 32 bits (unsigned) and the bits above them (0 .. 2^32 − 1). */
  private lo = 0;
  private hi = 0;

  /** A varint as a number: exact up to 2^53, saturating above. */
  varint(): number {
    if (this.readVarint()) return this.lo;
    const value = this.hi * 0x1_0000_0000 + this.lo;
    return value > Number.MAX_SAFE_INTEGER ? Number.MAX_SAFE_INTEGER : value;
  }

  /** A varint truncated to its low 32 bits, unsigned (protobuf's uint32 / enum reading). */
  uint32(): number {
    this.readVarint();
    return this.lo;
  }

  /** Reads one varint into `lo` and `hi`; true when it was one byte (the common case: `hi` is 0). */
  private readVarint(): boolean {
    const buf = this.buf;
    let pos = this.pos;
    let byte = pos < this.end ? (buf[pos++] as number) : this.eof();
    if (byte < 0x80) {
      this.pos = pos;
      this.lo = byte;
      this.hi = 0;
      return true;
    }
    let lo = byte & 0x7f;
    let hi = 0;
    for (let i = 1; i < 10; i++) {
      byte = pos < this.end ? (buf[pos++] as number) : this.eof();
      if (i === 9 && byte > 1) throw new Malformed('varint longer than 64 bits');
      const bits = byte & 0x7f;
      if (i < 4) {
        lo |= bits << (7 * i);
      } else if (i === 4) {
        lo |= (bits & 0x0f) << 28; // bits 28..31 of the low word; the other 3 open the high word
        hi = bits >>> 4;
      } else {
        hi += bits * 2 ** (7 * i - 32);
      }
      if (byte < 0x80) {
        this.pos = pos;
        this.lo = lo >>> 0;
        this.hi = hi;
        return false;
      }
    }
    throw new Malformed('varint longer than 10 bytes');
  }

  /** An int32 field (sign-extended from 64-bit two's complement). */
  int32(): number {
    return this.uint32() | 0;
  }

  /** An int64 field as a number (values within ±2^53 are exact). */
  int64(): number {
    const lo = this.pos;
    const unsigned = this.varint();
    // A negative int64 is a 10-byte varint whose top bit is set; recover it through BigInt.
    if (this.pos - lo === 10 && (this.buf[this.pos - 1] as number) === 1) {
      let v = 0n;
      for (let i = 0; i < 10; i++) v |= BigInt((this.buf[lo + i] as number) & 0x7f) << BigInt(7 * i);
      return Number(BigInt.asIntN(64, v));
    }
    return unsigned;
  }

  /** The end offset of a length-delimited field starting at pos. */
  lengthEnd(): number {
    const len = this.varint();
    const end = this.pos + len;
    if (end > this.end) throw new Malformed('length-delimited field runs past the end of its message');
    return end;
  }

  string(): string {
    const end = this.lengthEnd();
    const start = this.pos;
    this.pos = end;
    if (start === end) return '';
    // Short ASCII (most domains, keys and values): the string made the last time these bytes came.
    return interned.get(this.buf, start, end, utf8) ?? utf8(this.buf, start, end);
  }

  bytes(): Uint8Array {
    const end = this.lengthEnd();
    const out = this.buf.slice(this.pos, end);
    this.pos = end;
    return out;
  }

  skip(wireType: number): void {
    switch (wireType) {
      case WT_VARINT:
        this.varint();
        return;
      case WT_I64:
        this.advance(8);
        return;
      case WT_LEN:
        this.pos = this.lengthEnd();
        return;
      case WT_I32:
        this.advance(4);
        return;
      default:
        throw new Malformed(`unsupported wire type ${wireType}`);
    }
  }

  private advance(n: number): void {
    if (this.pos + n > this.end) throw new Malformed('fixed-width field runs past the end of its message');
    this.pos += n;
  }

  /** Reads a tag; returns the field number (≥ 1), the wire type in lastWireType. */
  tag(): number {
    const t = this.uint32();
    const field = t >>> 3;
    if (field === 0) throw new Malformed('field number 0');
    this.lastWireType = t & 7;
    return field;
  }

  lastWireType = 0;

  private eof(): never {
    throw new Malformed('truncated message');
  }
}

function expect(r: Reader, wireType: number, what: string): void {
  if (r.lastWireType !== wireType) throw new Malformed(`${what} has wire type ${r.lastWireType}, expected ${wireType}`);
}

/**
 * Reads a length-delimited sub-message at the reader's position with the same reader (its end set to the
 * sub-message's meanwhile): no reader object per sub-message. `read` consumes the region or throws.
 */
function sub<T, A = undefined>(r: Reader, read: (inner: Reader, arg: A) => T, arg?: A): T {
  const end = r.lengthEnd();
  const outer = r.end;
  r.end = end;
  const value = read(r, arg as A);
  r.end = outer;
  r.pos = end;
  return value;
}

const NO_BYTES: Uint8Array = Buffer.alloc(0);
/**
 * The decoders' reader: decoding is synchronous and never re-entered (no callback reaches a decoder), so
 * one reader serves every message of this thread. It lets go of the message's bytes when done.
 */
const reader = new Reader(NO_BYTES, 0, 0);

function decodeWith<T>(bytes: Uint8Array, what: string, body: (r: Reader) => T): Decoded<T> {
  try {
    reader.reset(bytes);
    return { ok: true, value: body(reader) };
  } catch (error) {
    return { ok: false, error: malformedMessage(what, error) };
  } finally {
    reader.reset(NO_BYTES);
  }
}

function malformedMessage(what: string, error: unknown): string {
  if (error instanceof Malformed) return `malformed ${what}: ${error.message}`;
  return `malformed ${what}: ${error instanceof Error ? error.message : String(error)}`;
}

// ---- RateLimitRequest ---------------------------------------------------------------------------

/** Decodes a RateLimitRequest into objects of its own. Never throws. */
export function decodeRateLimitRequest(bytes: Uint8Array): Decoded<RlsRequest> {
  const decoded = decodeRateLimitRequestReused(bytes);
  return decoded.ok ? { ok: true, value: copyRequest(decoded.value) } : decoded;
}

/**
 * Decodes a RateLimitRequest into this thread's reused objects: the request, its first
 * POOLED_DESCRIPTORS descriptors and their first POOLED_ENTRIES entries are the same objects call after
 * call (more are made fresh), so the common check allocates nothing here but a string the interner
 * does not hold. The answer is valid until the next call in this thread: for a caller that decides on
 * it at once and keeps nothing of it (the lean RLS server). Never throws.
 */
export function decodeRateLimitRequestReused(bytes: Uint8Array): Decoded<RlsRequest> {
  try {
    reader.reset(bytes);
    readRateLimitRequest(reader);
    return scratch.decoded;
  } catch (error) {
    return { ok: false, error: malformedMessage('RateLimitRequest', error) };
  } finally {
    reader.reset(NO_BYTES);
  }
}

/** The mutable shapes the decoder fills (RlsRequest's readonly ones, as it reads them). */
interface EntryDraft {
  key: string;
  value: string;
}
interface DescriptorDraft {
  readonly entries: EntryDraft[];
  limit: { requestsPerUnit: number; unit: number } | null;
  hitsAddend: number | null;
}

/** Descriptors (and entries of each) whose objects the reused decoding keeps: Envoy's checks have one to a few. */
export const POOLED_DESCRIPTORS = 8;
export const POOLED_ENTRIES = 8;

/** The reused decoding's objects (one per thread: module state of the codec). */
class RequestScratch {
  readonly request: { domain: string; readonly descriptors: DescriptorDraft[]; hitsAddend: number } = {
    domain: '',
    descriptors: [],
    hitsAddend: 0,
  };
  readonly decoded: Decoded<RlsRequest> = { ok: true, value: this.request };
  /** Descriptor i's object, kept for i < POOLED_DESCRIPTORS. */
  private readonly descriptors: DescriptorDraft[] = [];
  /** Per kept descriptor, its entries' objects, kept for j < POOLED_ENTRIES. */
  private readonly entries: EntryDraft[][] = [];

  /** Descriptor i's object, its fields cleared. */
  descriptor(i: number): DescriptorDraft {
    if (i >= POOLED_DESCRIPTORS) return newDescriptor();
    while (this.descriptors.length <= i) {
      this.descriptors.push(newDescriptor());
      this.entries.push([]);
    }
    const d = this.descriptors[i] as DescriptorDraft;
    d.limit = null;
    d.hitsAddend = null;
    return d;
  }

  /** Entry j's object in descriptor i, its fields cleared (or a fresh object past the kept ones). */
  entry(i: number, j: number): EntryDraft {
    if (i >= POOLED_DESCRIPTORS || j >= POOLED_ENTRIES) return newEntry();
    const kept = this.entries[i] as EntryDraft[];
    while (kept.length <= j) kept.push(newEntry());
    const e = kept[j] as EntryDraft;
    e.key = '';
    e.value = '';
    return e;
  }
}

function newDescriptor(): DescriptorDraft {
  return { entries: [], limit: null, hitsAddend: null };
}

function newEntry(): EntryDraft {
  return { key: '', value: '' };
}

const scratch = new RequestScratch();

/** `list[i] = item`, for i ≤ list.length (a reused list is written over, then cut()). */
function put<T>(list: T[], i: number, item: T): void {
  if (i < list.length) list[i] = item;
  else list.push(item);
}

/** `list` cut to its first `count` items: what a longer request left in a reused list lets go. */
function cut(list: unknown[], count: number): void {
  if (list.length > count) list.length = count;
}

function readRateLimitRequest(r: Reader): void {
  const request = scratch.request;
  request.domain = '';
  request.hitsAddend = 0;
  let count = 0;
  while (r.pos < r.end) {
    switch (r.tag()) {
      case 1:
        expect(r, WT_LEN, 'domain');
        request.domain = r.string();
        break;
      case 2: {
        expect(r, WT_LEN, 'descriptors');
        put(request.descriptors, count, sub(r, readDescriptor, count));
        count++;
        break;
      }
      case 3:
        expect(r, WT_VARINT, 'hits_addend');
        request.hitsAddend = r.uint32();
        break;
      default:
        r.skip(r.lastWireType);
    }
  }
  cut(request.descriptors, count);
}

/** Reads the request's descriptor number `index` into its object (scratch.descriptor(index)). */
function readDescriptor(r: Reader, index: number): DescriptorDraft {
  const into = scratch.descriptor(index);
  let count = 0;
  while (r.pos < r.end) {
    switch (r.tag()) {
      case 1: {
        expect(r, WT_LEN, 'entries');
        put(into.entries, count, sub(r, readEntry, scratch.entry(index, count)));
        count++;
        break;
      }
      case 2: {
        expect(r, WT_LEN, 'limit');
        // A repeated occurrence of a singular message field merges into the first (protobuf rule).
        into.limit = sub(r, readOverride, into.limit ?? { requestsPerUnit: 0, unit: 0 });
        break;
      }
      case 3: {
        expect(r, WT_LEN, 'hits_addend');
        into.hitsAddend = sub(r, readUInt64Value, into.hitsAddend ?? 0);
        break;
      }
      default:
        r.skip(r.lastWireType);
    }
  }
  cut(into.entries, count);
  return into;
}

function readEntry(r: Reader, into: EntryDraft): EntryDraft {
  while (r.pos < r.end) {
    switch (r.tag()) {
      case 1:
        expect(r, WT_LEN, 'entry key');
        into.key = r.string();
        break;
      case 2:
        expect(r, WT_LEN, 'entry value');
        into.value = r.string();
        break;
      default:
        r.skip(r.lastWireType);
    }
  }
  return into;
}

/** A request of objects of its own (decodeRateLimitRequest's answer, from the reused decoding's). */
function copyRequest(m: RlsRequest): RlsRequest {
  return {
    domain: m.domain,
    descriptors: m.descriptors.map((d): RlsDescriptor => ({
      entries: d.entries.map((e): RlsEntry => ({ key: e.key, value: e.value })),
      limit: d.limit === null ? null : { requestsPerUnit: d.limit.requestsPerUnit, unit: d.limit.unit },
      hitsAddend: d.hitsAddend,
    })),
    hitsAddend: m.hitsAddend,
  };
}

/** Reads a RateLimitOverride into `into` (merging into an earlier occurrence's values). */
function readOverride(
  r: Reader,
  into: { requestsPerUnit: number; unit: number },
): { requestsPerUnit: number; unit: number } {
  while (r.pos < r.end) {
    switch (r.tag()) {
      case 1:
        expect(r, WT_VARINT, 'limit.requests_per_unit');
        into.requestsPerUnit = r.uint32();
        break;
      case 2:
        expect(r, WT_VARINT, 'limit.unit');
        into.unit = r.int32();
        break;
      default:
        r.skip(r.lastWireType);
    }
  }
  return into;
}

/** Reads a UInt64Value: its value, else `initial` (an earlier occurrence's). */
function readUInt64Value(r: Reader, initial: number): number {
  let value = initial;
  while (r.pos < r.end) {
    if (r.tag() === 1) {
      expect(r, WT_VARINT, 'hits_addend.value');
      value = r.varint();
    } else {
      r.skip(r.lastWireType);
    }
  }
  return value;
}

// ---- Writing ------------------------------------------------------------------------------------

/** Bytes of a varint for a non-negative safe integer. */
function varintSize(n: number): number {
  if (n < 0x80) return 1;
  if (n < 0x4000) return 2;
  if (n < 0x200000) return 3;
  if (n < 0x10000000) return 4;
  let size = 4;
  let v = Math.floor(n / 0x10000000);
  while (v > 0) {
    size++;
    v = Math.floor(v / 0x80);
  }
  return size;
}

// Measured on the 2-CPU machine of bench/README.md (Node 20): a JavaScript loop over a string's
// characters costs ~2-3 ns a character, Buffer.byteLength ~30 ns and Buffer#write ~90 ns a call
// whatever the (short) length. So short strings are measured and written here, longer ones in C++.
/** Strings up to this length are checked for ASCII in JavaScript (then their length is their UTF-8 size). */
const SHORT_ASCII_CHECK = 16;
/** ASCII strings up to this length are written byte by byte in JavaScript. */
const SHORT_ASCII_WRITE = 24;

/** UTF-8 bytes of `s`. */
function stringBytes(s: string): number {
  return s.length <= SHORT_ASCII_CHECK && isAscii(s) ? s.length : Buffer.byteLength(s, 'utf8');
}

function isAscii(s: string): boolean {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0x7f) return false;
  return true;
}

/** Size of a length-delimited field (tag < 16) holding `len` bytes. */
function lenField(len: number): number {
  return 1 + varintSize(len) + len;
}

class Writer {
  pos = 0;
  constructor(readonly buf: Buffer) {}

  varint(n: number): void {
    const buf = this.buf;
    let v = n;
    while (v >= 0x80) {
      buf[this.pos++] = (v % 0x80) | 0x80;
      v = Math.floor(v / 0x80);
    }
    buf[this.pos++] = v;
  }

  /** A negative int32/int64 as the 10-byte two's-complement varint. */
  signed(n: number): void {
    if (n >= 0) {
      this.varint(n);
      return;
    }
    let v = BigInt.asUintN(64, BigInt(n));
    for (let i = 0; i < 9; i++) {
      this.buf[this.pos++] = Number(v & 0x7fn) | 0x80;
      v >>= 7n;
    }
    this.buf[this.pos++] = Number(v);
  }

  tag(field: number, wireType: number): void {
    this.buf[this.pos++] = (field << 3) | wireType;
  }

  string(field: number, s: string, byteLength: number): void {
    this.tag(field, WT_LEN);
    this.varint(byteLength);
    if (byteLength === s.length && byteLength <= SHORT_ASCII_WRITE) {
      // ASCII (a UTF-8 length equal to the UTF-16 length says so) and short: written here, cheaper
      // than Buffer#write's call into C++ up to about this length.
      const buf = this.buf;
      const at = this.pos;
      for (let i = 0; i < byteLength; i++) buf[at + i] = s.charCodeAt(i);
      this.pos = at + byteLength;
      return;
    }
    this.pos += this.buf.write(s, this.pos, byteLength, 'utf8');
  }

  bytes(field: number, b: Uint8Array): void {
    this.tag(field, WT_LEN);
    this.varint(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }

  /** Bytes already encoded (a template), as they are. */
  raw(b: Uint8Array): void {
    const buf = this.buf;
    const at = this.pos;
    if (b.length <= SHORT_ASCII_WRITE) for (let i = 0; i < b.length; i++) buf[at + i] = b[i] as number;
    else buf.set(b, at);
    this.pos = at + b.length;
  }

  uintField(field: number, n: number): void {
    if (n === 0) return;
    this.tag(field, WT_VARINT);
    this.varint(n);
  }
}

function signedSize(n: number): number {
  return n >= 0 ? varintSize(n) : 10;
}

function uintFieldSize(n: number): number {
  return n === 0 ? 0 : 1 + varintSize(n);
}

function strFieldSize(s: string): number {
  return s === '' ? 0 : lenField(stringBytes(s));
}

function checkUint32(n: number, what: string): number {
  if (!Number.isInteger(n) || n < 0 || n > 0xffffffff) throw new RangeError(`${what} must be a uint32, got ${n}`);
  return n;
}

// ---- RateLimitResponse --------------------------------------------------------------------------

function rateLimitSize(l: RlsRateLimit): number {
  return uintFieldSize(l.requestsPerUnit) + uintFieldSize(l.unit) + strFieldSize(l.name);
}

function durationSize(d: RlsDuration): number {
  return (d.seconds === 0 ? 0 : 1 + signedSize(d.seconds)) + (d.nanos === 0 ? 0 : 1 + signedSize(d.nanos));
}

/** Size of a DescriptorStatus; `limitField`: the current_limit field's kept bytes, when it has them. */
function statusSize(s: RlsDescriptorStatus, limitField: Uint8Array | null): number {
  let size = uintFieldSize(s.code) + uintFieldSize(s.limitRemaining);
  if (limitField !== null) size += limitField.length;
  else if (s.currentLimit !== null) size += lenField(rateLimitSize(s.currentLimit));
  if (s.durationUntilReset !== null) size += lenField(durationSize(s.durationUntilReset));
  return size;
}

/**
 * The answer's template: a status's whole `current_limit` field (tag, length, requests_per_unit, unit,
 * name), encoded once per rule and copied into every answer after that, so an answer writes only the
 * numbers that change (its code, limit_remaining, duration_until_reset). Kept for a limit object that
 * is frozen: it cannot change, so its bytes cannot go stale. The decider freezes the limits it keeps
 * (its rules', a few per rules snapshot; the request overrides', at most 4,096), not the per-tenant
 * limits of the quotas, which would keep a template per tenant answered. The last one looked up is
 * checked first (an agent answers the same few rules again and again: no WeakMap lookup then).
 */
const limitFields = new WeakMap<RlsRateLimit, Uint8Array>();
let lastLimit: RlsRateLimit | null = null;
let lastLimitField: Uint8Array | null = null;

/** The current_limit field's kept bytes for a frozen limit (made at its first answer), null for any other. */
function limitFieldBytes(l: RlsRateLimit): Uint8Array | null {
  if (l === lastLimit) return lastLimitField;
  if (!Object.isFrozen(l)) return null;
  let bytes = limitFields.get(l);
  if (bytes === undefined) {
    checkUint32(l.requestsPerUnit, 'requests_per_unit');
    const size = rateLimitSize(l);
    const w = new Writer(Buffer.alloc(lenField(size)));
    w.tag(2, WT_LEN);
    w.varint(size);
    writeRateLimit(w, l);
    bytes = w.buf;
    limitFields.set(l, bytes);
  }
  lastLimit = l;
  lastLimitField = bytes;
  return bytes;
}

/** A RateLimit message's fields. */
function writeRateLimit(w: Writer, l: RlsRateLimit): void {
  w.uintField(1, l.requestsPerUnit);
  w.uintField(2, l.unit);
  if (l.name !== '') w.string(3, l.name, stringBytes(l.name));
}

/**
 * A HeaderValue message's bytes, kept for a header that is frozen: the constant headers of an answer
 * (the overload path's, a refusal's level and cell, a named rule's limit) are encoded once and copied
 * after that. A frozen object cannot change, so its encoding cannot go stale.
 */
const frozenHeaders = new WeakMap<RlsHeader, Buffer>();

/** Size of a HeaderValue message whose key and value have these UTF-8 lengths. */
function headerValueSize(keyBytes: number, valueBytes: number): number {
  return (keyBytes === 0 ? 0 : lenField(keyBytes)) + (valueBytes === 0 ? 0 : lenField(valueBytes));
}

/** A HeaderValue message's fields (key 1, value 2; empty ones left out, as protobuf does). */
function writeHeaderValue(w: Writer, h: RlsHeader, keyBytes: number, valueBytes: number): void {
  if (keyBytes !== 0) w.string(1, h.key, keyBytes);
  if (valueBytes !== 0) w.string(2, h.value, valueBytes);
}

function encodeHeaderValue(h: RlsHeader): Buffer {
  const keyBytes = stringBytes(h.key);
  const valueBytes = stringBytes(h.value);
  const w = new Writer(Buffer.alloc(headerValueSize(keyBytes, valueBytes)));
  writeHeaderValue(w, h, keyBytes, valueBytes);
  return w.buf;
}

/** The encoding of a frozen header (made at its first answer), null for any other. */
function frozenHeaderBytes(h: RlsHeader): Buffer | null {
  if (!Object.isFrozen(h)) return null;
  let bytes = frozenHeaders.get(h);
  if (bytes === undefined) {
    bytes = encodeHeaderValue(h);
    frozenHeaders.set(h, bytes);
  }
  return bytes;
}

// The headers of the answer being encoded, between the size pass and the write pass (one answer at a
// time: encoding never calls out): a frozen header's kept encoding, or null and the UTF-8 lengths of
// its key and value.
const headerScratch: (Buffer | null)[] = [];
// The statuses of the answer being encoded, the same way: each one's size, and its current_limit
// field's kept bytes (limitFieldBytes) or null.
const statusSizeScratch: number[] = [];
const limitFieldScratch: (Uint8Array | null)[] = [];
const keyBytesScratch: number[] = [];
const valueBytesScratch: number[] = [];

/** Size of the header fields of a list; what the write pass needs goes to the scratch from `at` on. */
function headersSize(headers: readonly RlsHeader[], at: number): number {
  let size = 0;
  for (let i = 0; i < headers.length; i++) {
    const h = headers[i] as RlsHeader;
    const bytes = frozenHeaderBytes(h);
    headerScratch[at + i] = bytes;
    if (bytes !== null) {
      size += lenField(bytes.length);
      continue;
    }
    const keyBytes = stringBytes(h.key);
    const valueBytes = stringBytes(h.value);
    keyBytesScratch[at + i] = keyBytes;
    valueBytesScratch[at + i] = valueBytes;
    size += lenField(headerValueSize(keyBytes, valueBytes));
  }
  return size;
}

function writeHeaders(w: Writer, field: number, headers: readonly RlsHeader[], at: number): void {
  for (let i = 0; i < headers.length; i++) {
    const h = headers[i] as RlsHeader;
    const bytes = headerScratch[at + i] as Buffer | null;
    headerScratch[at + i] = null;
    if (bytes !== null) {
      w.bytes(field, bytes);
      continue;
    }
    const keyBytes = keyBytesScratch[at + i] as number;
    const valueBytes = valueBytesScratch[at + i] as number;
    w.tag(field, WT_LEN);
    w.varint(headerValueSize(keyBytes, valueBytes));
    writeHeaderValue(w, h, keyBytes, valueBytes);
  }
}

/**
 * Encodes a RateLimitResponse. Throws RangeError on out-of-range numbers (a bug of the caller).
 * `framed`: as one gRPC length-prefixed message (flag 0, big-endian length, then the message), in
 * the same buffer — what the lean server writes as its DATA frame.
 */
export function encodeRateLimitResponse(m: RlsResponse, framed = false): Buffer {
  let size = uintFieldSize(m.overallCode);
  const statusSizes = statusSizeScratch;
  const limitBytes = limitFieldScratch;
  for (let i = 0; i < m.statuses.length; i++) {
    const s = m.statuses[i] as RlsDescriptorStatus;
    checkUint32(s.limitRemaining, 'limit_remaining');
    const l = s.currentLimit;
    const field = l === null ? null : limitFieldBytes(l);
    if (l !== null && field === null) checkUint32(l.requestsPerUnit, 'requests_per_unit');
    limitBytes[i] = field;
    const n = statusSize(s, field);
    statusSizes[i] = n;
    size += lenField(n);
  }
  const requestHeadersAt = m.responseHeadersToAdd.length;
  size += headersSize(m.responseHeadersToAdd, 0);
  size += headersSize(m.requestHeadersToAdd, requestHeadersAt);
  if (m.rawBody !== null && m.rawBody.length > 0) size += lenField(m.rawBody.length);

  const prefix = framed ? 5 : 0;
  const w = new Writer(Buffer.allocUnsafe(prefix + size));
  if (framed) {
    w.buf[0] = 0;
    w.buf.writeUInt32BE(size, 1);
    w.pos = prefix;
  }
  w.uintField(1, m.overallCode);
  for (let i = 0; i < m.statuses.length; i++) {
    const s = m.statuses[i] as RlsDescriptorStatus;
    w.tag(2, WT_LEN);
    w.varint(statusSizes[i] as number);
    w.uintField(1, s.code);
    const field = limitBytes[i] as Uint8Array | null;
    limitBytes[i] = null;
    if (field !== null) w.raw(field);
    else if (s.currentLimit !== null) {
      const l = s.currentLimit;
      w.tag(2, WT_LEN);
      w.varint(rateLimitSize(l));
      writeRateLimit(w, l);
    }
    w.uintField(3, s.limitRemaining);
    if (s.durationUntilReset !== null) {
      const d = s.durationUntilReset;
      w.tag(4, WT_LEN);
      w.varint(durationSize(d));
      if (d.seconds !== 0) {
        w.tag(1, WT_VARINT);
        w.signed(d.seconds);
      }
      if (d.nanos !== 0) {
        w.tag(2, WT_VARINT);
        w.signed(d.nanos);
      }
    }
  }
  writeHeaders(w, 3, m.responseHeadersToAdd, 0);
  writeHeaders(w, 4, m.requestHeadersToAdd, requestHeadersAt);
  if (m.rawBody !== null && m.rawBody.length > 0) w.bytes(5, m.rawBody);
  if (w.pos !== prefix + size)
    throw new Error(`RateLimitResponse size mismatch: wrote ${w.pos - prefix} of ${size} bytes`);
  return w.buf;
}

/** Decodes a RateLimitResponse (clients, tests, the benchmark's lean client). Never throws. */
export function decodeRateLimitResponse(bytes: Uint8Array): Decoded<RlsResponse> {
  return decodeWith(bytes, 'RateLimitResponse', (r) => {
    let overallCode = 0;
    const statuses: RlsDescriptorStatus[] = [];
    const responseHeadersToAdd: RlsHeader[] = [];
    const requestHeadersToAdd: RlsHeader[] = [];
    let rawBody: Uint8Array | null = null;
    while (r.pos < r.end) {
      const field = r.tag();
      if (field === 1 && r.lastWireType === WT_VARINT) overallCode = r.uint32();
      else if (field === 2 && r.lastWireType === WT_LEN) statuses.push(sub(r, readStatus));
      else if (field === 3 && r.lastWireType === WT_LEN) responseHeadersToAdd.push(sub(r, readHeader));
      else if (field === 4 && r.lastWireType === WT_LEN) requestHeadersToAdd.push(sub(r, readHeader));
      else if (field === 5 && r.lastWireType === WT_LEN) rawBody = r.bytes();
      else r.skip(r.lastWireType);
    }
    return { overallCode: overallCode as RlsCode, statuses, responseHeadersToAdd, requestHeadersToAdd, rawBody };
  });
}

function readStatus(r: Reader): RlsDescriptorStatus {
  let code = 0;
  let currentLimit: RlsRateLimit | null = null;
  let limitRemaining = 0;
  let durationUntilReset: RlsDuration | null = null;
  while (r.pos < r.end) {
    const field = r.tag();
    if (field === 1 && r.lastWireType === WT_VARINT) code = r.uint32();
    else if (field === 2 && r.lastWireType === WT_LEN) currentLimit = sub(r, readRateLimit);
    else if (field === 3 && r.lastWireType === WT_VARINT) limitRemaining = r.uint32();
    else if (field === 4 && r.lastWireType === WT_LEN) durationUntilReset = sub(r, readDuration);
    else r.skip(r.lastWireType);
  }
  return { code: code as RlsCode, currentLimit, limitRemaining, durationUntilReset };
}

function readRateLimit(r: Reader): RlsRateLimit {
  let requestsPerUnit = 0;
  let unit = 0;
  let name = '';
  while (r.pos < r.end) {
    const field = r.tag();
    if (field === 1 && r.lastWireType === WT_VARINT) requestsPerUnit = r.uint32();
    else if (field === 2 && r.lastWireType === WT_VARINT) unit = r.int32();
    else if (field === 3 && r.lastWireType === WT_LEN) name = r.string();
    else r.skip(r.lastWireType);
  }
  return { requestsPerUnit, unit, name };
}

function readDuration(r: Reader): RlsDuration {
  let seconds = 0;
  let nanos = 0;
  while (r.pos < r.end) {
    const field = r.tag();
    if (field === 1 && r.lastWireType === WT_VARINT) seconds = r.int64();
    else if (field === 2 && r.lastWireType === WT_VARINT) nanos = r.int32();
    else r.skip(r.lastWireType);
  }
  return { seconds, nanos };
}

function readHeader(r: Reader): RlsHeader {
  let key = '';
  let value = '';
  while (r.pos < r.end) {
    const field = r.tag();
    if (field === 1 && r.lastWireType === WT_LEN) key = r.string();
    else if (field === 2 && r.lastWireType === WT_LEN) value = r.string();
    else r.skip(r.lastWireType);
  }
  return { key, value };
}

// ---- RateLimitRequest encoding (clients) -------------------------------------------------------

function entrySize(e: RlsEntry): number {
  return strFieldSize(e.key) + strFieldSize(e.value);
}

function overrideSize(l: RlsLimitOverride): number {
  return uintFieldSize(l.requestsPerUnit) + (l.unit === 0 ? 0 : 1 + signedSize(l.unit));
}

function descriptorSize(d: RlsDescriptor): number {
  let size = 0;
  for (const e of d.entries) size += lenField(entrySize(e));
  if (d.limit !== null) size += lenField(overrideSize(d.limit));
  if (d.hitsAddend !== null) size += lenField(uintFieldSize(d.hitsAddend));
  return size;
}

/** Encodes a RateLimitRequest (for clients: tests and the benchmark). */
export function encodeRateLimitRequest(m: RlsRequest): Buffer {
  checkUint32(m.hitsAddend, 'hits_addend');
  let size = strFieldSize(m.domain) + uintFieldSize(m.hitsAddend);
  const sizes = m.descriptors.map(descriptorSize);
  for (const n of sizes) size += lenField(n);
  const w = new Writer(Buffer.allocUnsafe(size));
  if (m.domain !== '') w.string(1, m.domain, Buffer.byteLength(m.domain, 'utf8'));
  m.descriptors.forEach((d, i) => {
    w.tag(2, WT_LEN);
    w.varint(sizes[i] as number);
    for (const e of d.entries) {
      w.tag(1, WT_LEN);
      w.varint(entrySize(e));
      if (e.key !== '') w.string(1, e.key, Buffer.byteLength(e.key, 'utf8'));
      if (e.value !== '') w.string(2, e.value, Buffer.byteLength(e.value, 'utf8'));
    }
    if (d.limit !== null) {
      w.tag(2, WT_LEN);
      w.varint(overrideSize(d.limit));
      w.uintField(1, d.limit.requestsPerUnit);
      if (d.limit.unit !== 0) {
        w.tag(2, WT_VARINT);
        w.signed(d.limit.unit);
      }
    }
    if (d.hitsAddend !== null) {
      w.tag(3, WT_LEN);
      w.varint(uintFieldSize(d.hitsAddend));
      w.uintField(1, d.hitsAddend);
    }
  });
  w.uintField(3, m.hitsAddend);
  if (w.pos !== size) throw new Error(`RateLimitRequest size mismatch: wrote ${w.pos} of ${size} bytes`);
  return w.buf;
}

// ---- grpc.health.v1 -----------------------------------------------------------------------------

/** HealthCheckResponse.ServingStatus. */
export const SERVING_STATUS = Object.freeze({ UNKNOWN: 0, SERVING: 1, NOT_SERVING: 2, SERVICE_UNKNOWN: 3 });

/** HealthCheckRequest {service = 1}. Never throws. */
export function decodeHealthCheckRequest(bytes: Uint8Array): Decoded<{ service: string }> {
  return decodeWith(bytes, 'HealthCheckRequest', (r) => {
    let service = '';
    while (r.pos < r.end) {
      if (r.tag() === 1 && r.lastWireType === WT_LEN) service = r.string();
      else r.skip(r.lastWireType);
    }
    return { service };
  });
}

export function encodeHealthCheckRequest(m: { service: string }): Buffer {
  const w = new Writer(Buffer.allocUnsafe(strFieldSize(m.service)));
  if (m.service !== '') w.string(1, m.service, Buffer.byteLength(m.service, 'utf8'));
  return w.buf;
}

/** HealthCheckResponse {status = 1}. */
export function encodeHealthCheckResponse(m: { status: number }): Buffer {
  const w = new Writer(Buffer.allocUnsafe(uintFieldSize(m.status)));
  w.uintField(1, m.status);
  return w.buf;
}

/** HealthListResponse {map<string, HealthCheckResponse> statuses = 1}. */
export function encodeHealthListResponse(statuses: ReadonlyMap<string, number>): Buffer {
  const parts: Buffer[] = [];
  for (const [service, status] of statuses) {
    const value = encodeHealthCheckResponse({ status });
    const keyLen = Buffer.byteLength(service, 'utf8');
    const entryLen = (service === '' ? 0 : lenField(keyLen)) + lenField(value.length);
    const w = new Writer(Buffer.allocUnsafe(lenField(entryLen)));
    w.tag(1, WT_LEN);
    w.varint(entryLen);
    if (service !== '') w.string(1, service, keyLen);
    w.bytes(2, value);
    parts.push(w.buf);
  }
  return Buffer.concat(parts);
}
