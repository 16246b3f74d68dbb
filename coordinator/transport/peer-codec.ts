// The wire codec of the Raft peer transport: a frame is one msgpack document `[version, messages]`
// holding one batch of Raft `Message`s from one sender (see proto/raft-peer.proto for why the Raft
// messages travel as msgpackr frames inside gRPC rather than as protobuf messages).
//
// Decoding is defensive: a frame comes from the network, so every field of every message is checked
// (type in the known set, ids bounded strings, numbers safe non-negative integers, binaries bounded)
// and rebuilt into a fresh object holding exactly the fields of its type. A frame that fails any check
// is reported as malformed as a whole — the caller drops it and counts it; Raft retransmits.
// Binary fields come back as plain `Uint8Array`s that own their bytes (not views into the receive
// buffer), so the core may keep them in its log for as long as it likes.

import { Packr, Unpackr } from 'msgpackr';
import type { ConfState, Entry, EntryKind, Message, MessageType, NodeId, SnapshotMeta } from '../raft/raft-types.js';
import { CellquotaError } from '../../shared/errors.js';

export const PEER_FRAME_VERSION = 1;

export interface PeerCodecLimits {
  /** Largest encoded frame accepted (and produced). */
  readonly maxFrameBytes: number;
  /** Longest node id. */
  readonly maxIdLength: number;
  /** Longest read-index context string. */
  readonly maxCtxLength: number;
  /** Most voters (and, separately, learners) in a snapshot's ConfState. */
  readonly maxConfMembers: number;
  /** Most messages in one frame. */
  readonly maxMessagesPerFrame: number;
}

export const defaultPeerCodecLimits: PeerCodecLimits = {
  maxFrameBytes: 64 * 1024 * 1024,
  maxIdLength: 256,
  maxCtxLength: 4096,
  maxConfMembers: 1024,
  maxMessagesPerFrame: 1 << 20,
};

export const MESSAGE_TYPES: readonly MessageType[] = [
  'pre-vote',
  'vote',
  'pre-vote-resp',
  'vote-resp',
  'append',
  'append-resp',
  'heartbeat',
  'heartbeat-resp',
  'snapshot',
  'snapshot-resp',
  'timeout-now',
  'read-index',
  'read-index-resp',
];
const messageTypeSet: ReadonlySet<string> = new Set(MESSAGE_TYPES);
const entryKinds: ReadonlySet<number> = new Set<number>([0, 1, 2]);

// Plain msgpack (no msgpackr records, no shared structures): every frame is self-describing and
// stateless, so any msgpack implementation can read it and no state leaks from one frame to the next.
const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true });

/** Encodes a batch of messages as one frame. Throws only if a message holds unencodable values. */
export function encodeFrame(messages: readonly Message[]): Uint8Array {
  return packr.pack([PEER_FRAME_VERSION, messages]);
}

export type DecodeResult =
  { readonly ok: true; readonly messages: Message[] } | { readonly ok: false; readonly error: string };

class FrameError extends CellquotaError {
  readonly code = 'PEER_FRAME_INVALID';
}

/** msgpackr's messages may quote the decoded data; keep errors short enough to log. */
function clip(text: string): string {
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}

function fail(what: string): never {
  throw new FrameError(what);
}

/** Decodes and validates a frame. Never throws: a malformed frame comes back as `{ ok: false }`. */
export function decodeFrame(frame: Uint8Array, limits: PeerCodecLimits = defaultPeerCodecLimits): DecodeResult {
  if (!(frame instanceof Uint8Array)) return { ok: false, error: 'frame is not binary' };
  if (frame.byteLength === 0) return { ok: false, error: 'empty frame' };
  if (frame.byteLength > limits.maxFrameBytes) {
    return { ok: false, error: `frame of ${frame.byteLength} bytes exceeds the limit of ${limits.maxFrameBytes}` };
  }
  let raw: unknown;
  try {
    raw = unpackr.unpack(frame);
  } catch (err) {
    return { ok: false, error: `not msgpack: ${clip(err instanceof Error ? err.message : String(err))}` };
  }
  try {
    return { ok: true, messages: validateFrame(raw, limits) };
  } catch (err) {
    if (err instanceof FrameError) return { ok: false, error: err.message };
    // A bug in a check (or something truly unexpected in the data): still never crash the caller.
    return { ok: false, error: `invalid frame: ${clip(err instanceof Error ? err.message : String(err))}` };
  }
}

function validateFrame(raw: unknown, limits: PeerCodecLimits): Message[] {
  if (!Array.isArray(raw) || raw.length !== 2) fail('frame is not [version, messages]');
  const [version, list] = raw as unknown[];
  if (version !== PEER_FRAME_VERSION) fail(`unsupported frame version ${String(version)}`);
  if (!Array.isArray(list)) fail('messages is not an array');
  const items = list as unknown[];
  if (items.length > limits.maxMessagesPerFrame)
    fail(`${items.length} messages exceed the limit of ${limits.maxMessagesPerFrame}`);
  const out: Message[] = new Array<Message>(items.length);
  for (let i = 0; i < items.length; i++) {
    try {
      out[i] = validateMessage(items[i], limits);
    } catch (err) {
      if (err instanceof FrameError) fail(`message ${i}: ${err.message}`);
      throw err;
    }
  }
  return out;
}

type Fields = Record<string, unknown>;

function asMap(v: unknown, what: string): Fields {
  if (typeof v !== 'object' || v === null || Array.isArray(v) || ArrayBuffer.isView(v) || v instanceof Map)
    fail(`${what} is not a map`);
  return v as Fields;
}

function int(o: Fields, key: string, min = 0): number {
  const v = o[key];
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) fail(`${key} is not an integer >= ${min}`);
  return v;
}

function bool(o: Fields, key: string): boolean {
  const v = o[key];
  if (typeof v !== 'boolean') fail(`${key} is not a boolean`);
  return v;
}

function str(o: Fields, key: string, maxLength: number): string {
  const v = o[key];
  if (typeof v !== 'string' || v.length > maxLength) fail(`${key} is not a string of at most ${maxLength} characters`);
  return v;
}

function nodeId(v: unknown, what: string, limits: PeerCodecLimits): NodeId {
  if (typeof v !== 'string' || v.length === 0 || v.length > limits.maxIdLength) {
    fail(`${what} is not a node id (1..${limits.maxIdLength} characters)`);
  }
  return v;
}

/** A binary field, copied into a plain Uint8Array of its own (msgpackr hands back Buffer views). */
function bin(o: Fields, key: string): Uint8Array {
  const v = o[key];
  if (!(v instanceof Uint8Array)) fail(`${key} is not binary`);
  return new Uint8Array(v);
}

function idList(v: unknown, what: string, limits: PeerCodecLimits): NodeId[] {
  if (!Array.isArray(v)) fail(`${what} is not an array`);
  const items = v as unknown[];
  if (items.length > limits.maxConfMembers) fail(`${what} has more than ${limits.maxConfMembers} members`);
  return items.map((x, i) => nodeId(x, `${what}[${i}]`, limits));
}

function confState(v: unknown, limits: PeerCodecLimits): ConfState {
  const o = asMap(v, 'meta.conf');
  return { voters: idList(o['voters'], 'voters', limits), learners: idList(o['learners'], 'learners', limits) };
}

function snapshotMeta(v: unknown, limits: PeerCodecLimits): SnapshotMeta {
  const o = asMap(v, 'meta');
  return { index: int(o, 'index'), term: int(o, 'term'), conf: confState(o['conf'], limits) };
}

function entries(v: unknown): Entry[] {
  if (!Array.isArray(v)) fail('entries is not an array');
  const items = v as unknown[];
  const out: Entry[] = new Array<Entry>(items.length);
  for (let i = 0; i < items.length; i++) {
    const o = asMap(items[i], `entries[${i}]`);
    const kind = int(o, 'kind');
    if (!entryKinds.has(kind)) fail(`entries[${i}].kind ${kind} is unknown`);
    out[i] = { term: int(o, 'term'), index: int(o, 'index'), kind: kind as EntryKind, data: bin(o, 'data') };
  }
  return out;
}

/** Validates one decoded message and rebuilds it with exactly the fields of its type. */
export function validateMessage(raw: unknown, limits: PeerCodecLimits = defaultPeerCodecLimits): Message {
  const o = asMap(raw, 'message');
  const type = o['type'];
  if (typeof type !== 'string' || !messageTypeSet.has(type))
    fail(`unknown message type ${JSON.stringify(type)?.slice(0, 64)}`);
  const from = nodeId(o['from'], 'from', limits);
  const to = nodeId(o['to'], 'to', limits);
  const term = int(o, 'term');
  const t = type as MessageType;
  switch (t) {
    case 'pre-vote':
      return { type: t, from, to, term, lastIndex: int(o, 'lastIndex'), lastTerm: int(o, 'lastTerm') };
    case 'vote':
      return {
        type: t,
        from,
        to,
        term,
        lastIndex: int(o, 'lastIndex'),
        lastTerm: int(o, 'lastTerm'),
        transfer: bool(o, 'transfer'),
      };
    case 'pre-vote-resp':
    case 'vote-resp':
      return { type: t, from, to, term, reject: bool(o, 'reject') };
    case 'append':
      return {
        type: t,
        from,
        to,
        term,
        prevIndex: int(o, 'prevIndex'),
        prevTerm: int(o, 'prevTerm'),
        entries: entries(o['entries']),
        commit: int(o, 'commit'),
      };
    case 'append-resp':
      return {
        type: t,
        from,
        to,
        term,
        reject: bool(o, 'reject'),
        index: int(o, 'index'),
        hintIndex: int(o, 'hintIndex'),
        hintTerm: int(o, 'hintTerm'),
      };
    case 'heartbeat':
      return { type: t, from, to, term, commit: int(o, 'commit'), readSeq: int(o, 'readSeq') };
    case 'heartbeat-resp':
      return { type: t, from, to, term, readSeq: int(o, 'readSeq') };
    case 'snapshot': {
      const offset = int(o, 'offset');
      const totalBytes = int(o, 'totalBytes');
      const chunk = bin(o, 'chunk');
      if (offset + chunk.byteLength > totalBytes)
        fail(`chunk [${offset}, ${offset + chunk.byteLength}) lies beyond totalBytes ${totalBytes}`);
      return {
        type: t,
        from,
        to,
        term,
        meta: snapshotMeta(o['meta'], limits),
        offset,
        totalBytes,
        chunk,
        done: bool(o, 'done'),
      };
    }
    case 'snapshot-resp':
      return { type: t, from, to, term, snapshotIndex: int(o, 'snapshotIndex'), nextOffset: int(o, 'nextOffset') };
    case 'timeout-now':
      return { type: t, from, to, term };
    case 'read-index':
      return { type: t, from, to, term, ctx: str(o, 'ctx', limits.maxCtxLength) };
    case 'read-index-resp':
      // index -1: the leader could not serve the read.
      return { type: t, from, to, term, ctx: str(o, 'ctx', limits.maxCtxLength), index: int(o, 'index', -1) };
  }
}
