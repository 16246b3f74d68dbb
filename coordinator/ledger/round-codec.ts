// The compact binary form of a `reportAndGrant` round in the Raft log (command format 2).
//
// A round carries up to hundreds of thousands of grants, and plain msgpack of the grant objects
// repeats six field names, the key and the cell id in every grant (~93 bytes a grant at 100,000
// tenants × 16 cells). This form is columnar and stateless (it needs nothing of the ledger to decode):
//
//   nowMs f64 · presence byte (leases / acks / grants / session given) · [session: clientId, seq]
//   cells:   count, then each id (length + UTF-8), in first-seen order
//   keys:    count, then each key front-coded against the previous one (shared prefix length,
//            suffix length, suffix bytes), in first-seen order — the allocator emits grants key by
//            key in nearly sorted order, so a tenant key costs ~3 bytes
//   leases:  count, then per renewal: cell index, leaseExpiresAtMs f64
//   acks:    count, then per ack: key index as a signed delta from the previous item's, cell
//            index, epoch
//   grants:  count, the distinct leaseExpiresAtMs values (a round has one, nowMs + TTL), then per
//            grant: key delta, cell index, one tag byte (rate kind, burst kind, expiry index), epoch,
//            rate, burst
//
// Numbers are exact: a value is 0, a non-negative integer (varint), a float32 that equals it exactly
// (4 bytes; the lease round rounds its grants to float32 in the safe direction,
// coordinator/allocator/grant-rounding.ts),
// or a float64 (8 bytes). Order and multiplicity of every item are kept, so a decoded round is the
// round that was encoded (the ledger refuses duplicates exactly as before). Decoding bounds every
// count and length and throws RoundCodecError on anything malformed; the caller then validates the
// command with the same zod schema as every other command.
import { CellquotaError } from '../../shared/errors.js';

/** Thrown on bytes that are not a packed round (truncated, over a bound, trailing bytes). */
export class RoundCodecError extends CellquotaError {
  readonly code = 'ROUND_CODEC_INVALID';
}

export interface PackedRound {
  readonly nowMs: number;
  readonly leases?: readonly { readonly cellId: string; readonly leaseExpiresAtMs: number }[] | undefined;
  readonly acks?: readonly { readonly key: string; readonly cellId: string; readonly epoch: number }[] | undefined;
  readonly grants?:
    | readonly {
        readonly key: string;
        readonly cellId: string;
        readonly rate: number;
        readonly burst: number;
        readonly epoch: number;
        readonly leaseExpiresAtMs: number;
      }[]
    | undefined;
  readonly session?: { readonly clientId: string; readonly seq: number } | undefined;
}

/** Bounds the decoder enforces (the command schema's own bounds are checked after decoding). */
export interface RoundCodecLimits {
  readonly maxItems: number;
  readonly maxCells: number;
  readonly maxNameLength: number;
}

const P_LEASES = 1;
const P_ACKS = 2;
const P_GRANTS = 4;
const P_SESSION = 8;

const K_ZERO = 0;
const K_INT = 1;
const K_F32 = 2;
const K_F64 = 3;
/** Expiry index in the tag's high nibble; 15 means "a varint index follows". */
const EXPIRY_ESCAPE = 15;

const f32 = new Float32Array(1);

function kindOf(v: number): number {
  if (v === 0) return K_ZERO; // also -0: stored as +0 (as msgpack did)
  if (Number.isSafeInteger(v) && v > 0) return K_INT;
  f32[0] = v;
  return f32[0] === v ? K_F32 : K_F64;
}

class Writer {
  private buf = new Uint8Array(1024);
  private view = new DataView(this.buf.buffer);
  private at = 0;
  private readonly text = new TextEncoder();

  private room(n: number): void {
    if (this.at + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.at + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.at));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  byte(b: number): void {
    this.room(1);
    this.buf[this.at++] = b;
  }

  /** Unsigned LEB128 of a non-negative safe integer (arithmetic, not 32-bit shifts). */
  uint(v: number): void {
    this.room(8);
    let x = v;
    while (x >= 0x80) {
      this.buf[this.at++] = (x % 0x80) | 0x80;
      x = Math.floor(x / 0x80);
    }
    this.buf[this.at++] = x;
  }

  /** Zigzag signed integer. */
  int(v: number): void {
    this.uint(v >= 0 ? v * 2 : -v * 2 - 1);
  }

  f64(v: number): void {
    this.room(8);
    this.view.setFloat64(this.at, v, true);
    this.at += 8;
  }

  f32(v: number): void {
    this.room(4);
    this.view.setFloat32(this.at, v, true);
    this.at += 4;
  }

  str(s: string): void {
    const b = this.text.encode(s);
    this.uint(b.length);
    this.bytes(b);
  }

  bytes(b: Uint8Array): void {
    this.room(b.length);
    this.buf.set(b, this.at);
    this.at += b.length;
  }

  value(kind: number, v: number): void {
    if (kind === K_INT) this.uint(v);
    else if (kind === K_F32) this.f32(v);
    else if (kind === K_F64) this.f64(v);
  }

  done(): Uint8Array {
    return this.buf.slice(0, this.at);
  }
}

class Reader {
  private at = 0;
  private readonly view: DataView;
  private readonly text = new TextDecoder('utf-8', { fatal: true });
  constructor(private readonly buf: Uint8Array) {
    this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  private need(n: number): void {
    if (this.at + n > this.buf.length) throw new RoundCodecError('truncated packed round');
  }

  byte(): number {
    this.need(1);
    return this.buf[this.at++] as number;
  }

  uint(): number {
    let x = 0;
    let scale = 1;
    for (let i = 0; i < 8; i++) {
      const b = this.byte();
      x += (b & 0x7f) * scale;
      if ((b & 0x80) === 0) {
        if (!Number.isSafeInteger(x)) throw new RoundCodecError('integer beyond 2^53 in packed round');
        return x;
      }
      scale *= 0x80;
    }
    throw new RoundCodecError('integer too long in packed round');
  }

  int(): number {
    const z = this.uint();
    return z % 2 === 0 ? z / 2 : -(z + 1) / 2;
  }

  f64(): number {
    this.need(8);
    const v = this.view.getFloat64(this.at, true);
    this.at += 8;
    return v;
  }

  f32(): number {
    this.need(4);
    const v = this.view.getFloat32(this.at, true);
    this.at += 4;
    return v;
  }

  str(maxBytes: number): string {
    const n = this.uint();
    if (n > maxBytes) throw new RoundCodecError(`string of ${n} bytes in packed round (at most ${maxBytes})`);
    this.need(n);
    const s = this.text.decode(this.buf.subarray(this.at, this.at + n));
    this.at += n;
    return s;
  }

  value(kind: number): number {
    if (kind === K_ZERO) return 0;
    if (kind === K_INT) return this.uint();
    if (kind === K_F32) return this.f32();
    return this.f64();
  }

  count(max: number, what: string): number {
    const n = this.uint();
    if (n > max) throw new RoundCodecError(`${n} ${what} in packed round (at most ${max})`);
    return n;
  }

  end(): void {
    if (this.at !== this.buf.length) throw new RoundCodecError('trailing bytes after packed round');
  }
}

/** Interns strings in first-seen order. */
class Table {
  readonly list: string[] = [];
  private readonly index = new Map<string, number>();
  id(s: string): number {
    let i = this.index.get(s);
    if (i === undefined) {
      i = this.list.length;
      this.index.set(s, i);
      this.list.push(s);
    }
    return i;
  }
}

function sharedPrefix(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++;
  return i;
}

/** Encodes a round (numbers must be finite; the caller validated the command). */
export function packRound(r: PackedRound): Uint8Array {
  const cells = new Table();
  const keys = new Table();
  for (const l of r.leases ?? []) cells.id(l.cellId);
  for (const a of r.acks ?? []) {
    keys.id(a.key);
    cells.id(a.cellId);
  }
  for (const g of r.grants ?? []) {
    keys.id(g.key);
    cells.id(g.cellId);
  }
  const w = new Writer();
  w.f64(r.nowMs + 0);
  w.byte(
    (r.leases !== undefined ? P_LEASES : 0) |
      (r.acks !== undefined ? P_ACKS : 0) |
      (r.grants !== undefined ? P_GRANTS : 0) |
      (r.session !== undefined ? P_SESSION : 0),
  );
  if (r.session !== undefined) {
    w.str(r.session.clientId);
    w.uint(r.session.seq);
  }
  w.uint(cells.list.length);
  for (const c of cells.list) w.str(c);
  w.uint(keys.list.length);
  let prev = '';
  // Front coding works on UTF-16 code units; keys are ASCII by their pattern, so units are bytes.
  for (const k of keys.list) {
    const p = sharedPrefix(prev, k);
    w.uint(p);
    w.str(k.slice(p));
    prev = k;
  }
  if (r.leases !== undefined) {
    w.uint(r.leases.length);
    for (const l of r.leases) {
      w.uint(cells.id(l.cellId));
      w.f64(l.leaseExpiresAtMs + 0);
    }
  }
  let lastKey = 0;
  if (r.acks !== undefined) {
    w.uint(r.acks.length);
    for (const a of r.acks) {
      const k = keys.id(a.key);
      w.int(k - lastKey);
      lastKey = k;
      w.uint(cells.id(a.cellId));
      w.uint(a.epoch);
    }
  }
  if (r.grants !== undefined) {
    const expiries = new Map<number, number>();
    const expiryList: number[] = [];
    for (const g of r.grants) {
      const e = g.leaseExpiresAtMs + 0;
      if (!expiries.has(e)) {
        expiries.set(e, expiryList.length);
        expiryList.push(e);
      }
    }
    w.uint(r.grants.length);
    w.uint(expiryList.length);
    for (const e of expiryList) w.f64(e);
    for (const g of r.grants) {
      const k = keys.id(g.key);
      w.int(k - lastKey);
      lastKey = k;
      w.uint(cells.id(g.cellId));
      const rk = kindOf(g.rate);
      const bk = kindOf(g.burst);
      const ei = expiries.get(g.leaseExpiresAtMs + 0) as number;
      w.byte(rk | (bk << 2) | ((ei < EXPIRY_ESCAPE ? ei : EXPIRY_ESCAPE) << 4));
      if (ei >= EXPIRY_ESCAPE) w.uint(ei);
      w.uint(g.epoch);
      w.value(rk, g.rate);
      w.value(bk, g.burst);
    }
  }
  return w.done();
}

/** Decodes packRound's bytes; throws RoundCodecError on malformed input (never returns partial data). */
export function unpackRound(bytes: Uint8Array, limits: RoundCodecLimits): PackedRound {
  const r = new Reader(bytes);
  const nowMs = r.f64();
  const presence = r.byte();
  if ((presence & ~(P_LEASES | P_ACKS | P_GRANTS | P_SESSION)) !== 0)
    throw new RoundCodecError('unknown presence bits in packed round');
  const nameBytes = limits.maxNameLength;
  let session: { clientId: string; seq: number } | undefined;
  if ((presence & P_SESSION) !== 0) session = { clientId: r.str(nameBytes), seq: r.uint() };
  const nCells = r.count(limits.maxCells, 'cells');
  const cells: string[] = [];
  for (let i = 0; i < nCells; i++) cells.push(r.str(nameBytes));
  const keyBytes = nameBytes + 8; // "tenant/" + a name
  const nKeys = r.count(2 * limits.maxItems, 'keys');
  const keys: string[] = [];
  let prev = '';
  for (let i = 0; i < nKeys; i++) {
    const p = r.uint();
    if (p > prev.length) throw new RoundCodecError('bad key prefix in packed round');
    const k = prev.slice(0, p) + r.str(keyBytes);
    if (k.length > keyBytes) throw new RoundCodecError('key too long in packed round');
    keys.push(k);
    prev = k;
  }
  const cellAt = (): string => {
    const i = r.uint();
    const c = cells[i];
    if (c === undefined) throw new RoundCodecError('cell index out of range in packed round');
    return c;
  };
  let lastKey = 0;
  const keyAt = (): string => {
    const i = lastKey + r.int();
    const k = keys[i];
    if (k === undefined) throw new RoundCodecError('key index out of range in packed round');
    lastKey = i;
    return k;
  };
  const out: { -readonly [K in keyof PackedRound]: PackedRound[K] } = { nowMs };
  if (session !== undefined) out.session = session;
  if ((presence & P_LEASES) !== 0) {
    const n = r.count(limits.maxCells, 'leases');
    const leases: { cellId: string; leaseExpiresAtMs: number }[] = [];
    for (let i = 0; i < n; i++) leases.push({ cellId: cellAt(), leaseExpiresAtMs: r.f64() });
    out.leases = leases;
  }
  if ((presence & P_ACKS) !== 0) {
    const n = r.count(limits.maxItems, 'acks');
    const acks: { key: string; cellId: string; epoch: number }[] = [];
    for (let i = 0; i < n; i++) {
      const key = keyAt();
      acks.push({ key, cellId: cellAt(), epoch: r.uint() });
    }
    out.acks = acks;
  }
  if ((presence & P_GRANTS) !== 0) {
    const n = r.count(limits.maxItems, 'grants');
    const ne = r.count(Math.max(1, n), 'lease expiries');
    const expiries: number[] = [];
    for (let i = 0; i < ne; i++) expiries.push(r.f64());
    const grants: {
      key: string;
      cellId: string;
      rate: number;
      burst: number;
      epoch: number;
      leaseExpiresAtMs: number;
    }[] = [];
    for (let i = 0; i < n; i++) {
      const key = keyAt();
      const cellId = cellAt();
      const tag = r.byte();
      const e = tag >> 4;
      const ei = e === EXPIRY_ESCAPE ? r.uint() : e;
      const leaseExpiresAtMs = expiries[ei];
      if (leaseExpiresAtMs === undefined) throw new RoundCodecError('lease expiry index out of range in packed round');
      const epoch = r.uint();
      const rate = r.value(tag & 3);
      const burst = r.value((tag >> 2) & 3);
      grants.push({ key, cellId, rate, burst, epoch, leaseExpiresAtMs });
    }
    out.grants = grants;
  }
  r.end();
  return out;
}
