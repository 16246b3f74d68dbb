// Key layout and record encoding of the durable Raft storage.
//
// Keys (raw bytes, LevelDB orders them bytewise):
//   'meta'                    the node's identity (StoredMeta), written once at initialisation
//   'hard'                    the Raft hard state (term, vote, commit)
//   'snap'                    the latest snapshot (meta + the application's bytes)
//   'log/' + uint64 BE index  one log entry; fixed-width big-endian, so iteration is in index order
//
// Values: a 4-byte big-endian CRC-32 followed by the msgpack payload. The checksum covers the key
// and then the payload, so a record that was damaged, cut short, or written under another key
// fails the check. Payloads are msgpack arrays (plain msgpack, no msgpackr records/structures, so
// decoding never depends on state from earlier records).
import { Packr } from 'msgpackr';
import type { ConfState, Entry, HardState, Snapshot } from '../raft/index.js';
import { crc32 } from './crc32.js';

/** Version of the on-disk layout; bumped on any incompatible change. */
export const storageFormatVersion = 2;
/**
 * Format 1: everything in LevelDB (raft-storage-level.ts). Format 2: LevelDB holds meta, snap and
 * logs; the entries and the hard state are in the append-only log (raft-storage.ts).
 */
export const levelFormatVersion = 1;

const ascii = (s: string): Uint8Array => new TextEncoder().encode(s);

export const metaKey = ascii('meta');
export const hardKey = ascii('hard');
export const snapKey = ascii('snap');
export const entryKeyPrefix = ascii('log/');
const entryKeyLength = entryKeyPrefix.length + 8;

/** The key of the log entry at `index` (0 ≤ index ≤ 2^53 − 1). */
export function entryKey(index: number): Uint8Array {
  if (!Number.isSafeInteger(index) || index < 0) throw new RangeError(`bad log index ${index}`);
  const key = new Uint8Array(entryKeyLength);
  key.set(entryKeyPrefix, 0);
  const view = new DataView(key.buffer);
  view.setUint32(entryKeyPrefix.length, Math.floor(index / 0x1_0000_0000));
  view.setUint32(entryKeyPrefix.length + 4, index >>> 0);
  return key;
}

/** The index of an entry key, or undefined if `key` is not an entry key. */
export function entryIndexOfKey(key: Uint8Array): number | undefined {
  if (key.length !== entryKeyLength || !startsWith(key, entryKeyPrefix)) return undefined;
  const view = new DataView(key.buffer, key.byteOffset, key.byteLength);
  const hi = view.getUint32(entryKeyPrefix.length);
  const lo = view.getUint32(entryKeyPrefix.length + 4);
  const index = hi * 0x1_0000_0000 + lo;
  return Number.isSafeInteger(index) ? index : undefined;
}

export function isEntryKey(key: Uint8Array): boolean {
  return key.length >= entryKeyPrefix.length && startsWith(key, entryKeyPrefix);
}

/** A readable name for a key, for error messages: 'meta', 'hard', 'snap', 'log/42', else hex. */
export function describeKey(key: Uint8Array): string {
  if (bytesEqual(key, metaKey)) return 'meta';
  if (bytesEqual(key, hardKey)) return 'hard';
  if (bytesEqual(key, snapKey)) return 'snap';
  const index = entryIndexOfKey(key);
  if (index !== undefined) return `log/${index}`;
  return `0x${Buffer.from(key.buffer, key.byteOffset, key.byteLength).toString('hex')}`;
}

export function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function startsWith(a: Uint8Array, prefix: Uint8Array): boolean {
  if (a.length < prefix.length) return false;
  for (let i = 0; i < prefix.length; i++) if (a[i] !== prefix[i]) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Sealing: checksum framing

const packr = new Packr({ useRecords: false, moreTypes: false });

/** Encodes `value` with msgpack and frames it with the CRC-32 of key ++ payload. */
export function seal(key: Uint8Array, value: unknown): Uint8Array {
  const payload = packr.pack(value);
  const out = new Uint8Array(4 + payload.length);
  out.set(payload, 4);
  new DataView(out.buffer).setUint32(0, crc32(payload, crc32(key)));
  return out;
}

export type Decoded<T> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly reason: string };

const fail = (reason: string): { ok: false; reason: string } => ({ ok: false, reason });

/** Checks the frame's checksum and decodes its msgpack payload. */
export function unseal(key: Uint8Array, record: Uint8Array): Decoded<unknown> {
  if (record.length < 5) return fail(`record of ${record.length} bytes is too short`);
  const stored = new DataView(record.buffer, record.byteOffset, record.byteLength).getUint32(0);
  const payload = record.subarray(4);
  const actual = crc32(payload, crc32(key));
  if (stored !== actual)
    return fail(`checksum mismatch (stored ${hex32(stored)}, computed ${hex32(actual)} over ${payload.length} bytes)`);
  return unpack(payload);
}

const hex32 = (n: number): string => `0x${n.toString(16).padStart(8, '0')}`;

// ---------------------------------------------------------------------------------------------
// Record shapes

const isIndex = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
const isBytes = (v: unknown): v is Uint8Array => v instanceof Uint8Array;
const isStringArray = (v: unknown): v is string[] => Array.isArray(v) && v.every((x) => typeof x === 'string');
/** A plain Uint8Array copy (msgpackr hands out Buffer views into the record it decoded). */
const copyBytes = (b: Uint8Array): Uint8Array => new Uint8Array(b);

export function encodeEntry(e: Entry): Uint8Array {
  return seal(entryKey(e.index), [e.index, e.term, e.kind, e.data]);
}

export function decodeEntry(key: Uint8Array, record: Uint8Array): Decoded<Entry> {
  const r = unseal(key, record);
  if (!r.ok) return r;
  const e = entryFromValue(r.value);
  if (e.ok && e.value.index !== entryIndexOfKey(key)) return fail(`entry record says index ${e.value.index}`);
  return e;
}

/** An entry from its decoded msgpack array [index, term, kind, data]. */
export function entryFromValue(v: unknown): Decoded<Entry> {
  if (!Array.isArray(v) || v.length !== 4) return fail('entry record is not [index, term, kind, data]');
  const [index, term, kind, data] = v as unknown[];
  if (!isIndex(index) || !isIndex(term) || !isBytes(data)) return fail('entry record has fields of the wrong type');
  if (kind !== 0 && kind !== 1 && kind !== 2) return fail(`entry record has unknown kind ${String(kind)}`);
  return { ok: true, value: { index, term, kind, data: copyBytes(data) } };
}

/** The msgpack payload of an entry in the append-only log (framed and checked by log-frames.ts). */
export function packEntry(e: Entry): Uint8Array {
  return packr.pack([e.index, e.term, e.kind, e.data]);
}

export function packHardState(h: HardState): Uint8Array {
  return packr.pack([h.term, h.vote, h.commit]);
}

/** Decodes a log record's msgpack payload (its checksum already checked). */
export function unpack(payload: Uint8Array): Decoded<unknown> {
  try {
    return { ok: true, value: packr.unpack(payload) as unknown };
  } catch (err) {
    return fail(`undecodable payload: ${err instanceof Error ? err.message : String(err)}`);
  }
}

export function encodeHardState(h: HardState): Uint8Array {
  return seal(hardKey, [h.term, h.vote, h.commit]);
}

export function decodeHardState(record: Uint8Array): Decoded<HardState> {
  const r = unseal(hardKey, record);
  return r.ok ? hardStateFromValue(r.value) : r;
}

/** A hard state from its decoded msgpack array [term, vote, commit]. */
export function hardStateFromValue(v: unknown): Decoded<HardState> {
  if (!Array.isArray(v) || v.length !== 3) return fail('hard state record is not [term, vote, commit]');
  const [term, vote, commit] = v as unknown[];
  if (!isIndex(term) || !isIndex(commit) || (vote !== null && typeof vote !== 'string'))
    return fail('hard state record has fields of the wrong type');
  return { ok: true, value: { term, vote, commit } };
}

export function encodeSnapshot(s: Snapshot): Uint8Array {
  const { index, term, conf } = s.meta;
  return seal(snapKey, [index, term, conf.voters, conf.learners, s.data]);
}

export function decodeSnapshot(record: Uint8Array): Decoded<Snapshot> {
  const r = unseal(snapKey, record);
  if (!r.ok) return r;
  const v = r.value;
  if (!Array.isArray(v) || v.length !== 5) return fail('snapshot record is not [index, term, voters, learners, data]');
  const [index, term, voters, learners, data] = v as unknown[];
  if (!isIndex(index) || !isIndex(term) || !isStringArray(voters) || !isStringArray(learners) || !isBytes(data)) {
    return fail('snapshot record has fields of the wrong type');
  }
  const conf: ConfState = { voters, learners };
  return { ok: true, value: { meta: { index, term, conf }, data: copyBytes(data) } };
}

/** The identity record, written once when the data directory is initialised. */
export interface StoredMeta {
  readonly format: number;
  readonly clusterId: string;
  readonly nodeId: string;
  /** 128 random bits, hex: a new value each time the directory is (re)initialised. */
  readonly incarnation: string;
  /** ISO 8601 time of initialisation. */
  readonly createdAt: string;
  /** Set by confirmIncarnation(): the caller has decided this incarnation may vote. */
  readonly confirmed: boolean;
  /**
   * 0, or the highest log index this store held before a repair removed entries above the commit
   * index: entries it may have acknowledged. The node must not vote until its commit index has
   * reached it (cleared by clearVoteBarrier). Absent in records written before it existed: 0.
   */
  readonly voteBarrier: number;
  /**
   * Format 2: the sequence number of the first segment of the append-only log in use (0 in format
   * 1). Here rather than in a key of its own so that earlier versions, which ignore extra fields
   * of this record, read the format and refuse the directory with StorageFormatError.
   */
  readonly logStart: number;
}

export function encodeMeta(m: StoredMeta): Uint8Array {
  return seal(metaKey, [
    m.format,
    m.clusterId,
    m.nodeId,
    m.incarnation,
    m.createdAt,
    m.confirmed,
    m.voteBarrier,
    m.logStart,
  ]);
}

export function decodeMeta(record: Uint8Array): Decoded<StoredMeta> {
  const r = unseal(metaKey, record);
  if (!r.ok) return r;
  const v = r.value;
  if (!Array.isArray(v) || v.length < 6)
    return fail('meta record is not [format, clusterId, nodeId, incarnation, createdAt, confirmed]');
  const [format, clusterId, nodeId, incarnation, createdAt, confirmed, voteBarrier = 0, logStart = 0] = v as unknown[];
  if (
    !isIndex(format) ||
    typeof clusterId !== 'string' ||
    typeof nodeId !== 'string' ||
    typeof incarnation !== 'string' ||
    typeof createdAt !== 'string' ||
    typeof confirmed !== 'boolean' ||
    !isIndex(voteBarrier) ||
    !isIndex(logStart)
  ) {
    return fail('meta record has fields of the wrong type');
  }
  return { ok: true, value: { format, clusterId, nodeId, incarnation, createdAt, confirmed, voteBarrier, logStart } };
}
