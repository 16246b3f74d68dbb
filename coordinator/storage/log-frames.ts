// Record framing of the append-only Raft log (log-segments.ts) and the scan that reads a segment.
//
// A frame: a 12-byte header — u32 LE body length (> 0), u32 LE CRC-32 of (segment sequence number
// as u64 LE ++ body), u32 LE CRC-32 of (sequence number ++ the header's first 8 bytes) — then the
// body (u8 record type, msgpack payload, u8 trailer 0xA5), zero-padded to a multiple of 8 bytes.
// The header's own check means a length that passes it is the length written: damage to it is
// never taken for the end of a record cut short. Binding both checks to the segment's sequence
// number makes a record copied or renamed into another segment fail, as storage-codec.ts binds a
// LevelDB record to its key. Segments are extended with zeros ahead of the writes, so a header of
// zeros with nothing but zeros after it is the end of the written log.
//
// A frame that fails a check is a torn write only when that is the one explanation an unsynced
// write allows:
//   - the write was cut off: nothing but zeros from inside the frame to the end of the segment —
//     within its header (the header check failed), or with the body's trailer still zero (never
//     zero when written), or the body running past the end of the file;
//   - or a part of the frame lying in one 512-byte sector is all zeros: pages reach the disk in
//     any order before an fdatasync and a sector the kernel never wrote reads as zeros (the rule
//     etcd's WAL uses; a payload with 512 aligned zero bytes of its own would be mistaken, and
//     msgpack-encoded commands have none).
// Anything else is damage to a record that may have been synced. Past any bad frame the reader
// goes on — by its length when its header passed, else to the next 8-byte offset where a whole frame
// passes both checks — so the caller learns what lay beyond it (the highest index, the latest hard
// state), and how many bytes past it could not be read at all. A frame that passes both checks
// after one torn by the sector rule was written after it, so that frame is damage too (its sector
// was lost after it was written, maybe synced): torn stays torn only with nothing valid after it
// (the caller applies the same to later segments).
import { crc32 } from './crc32.js';

export const frameHeaderBytes = 12;
const trailer = 0xa5;
const sectorBytes = 512;
/** The largest body a frame may have (a snapshot never goes in the log; an entry is bounded well below this). */
export const maxFrameBody = 256 * 1024 * 1024;

export const RecordType = { Header: 1, Entry: 2, Hard: 3 } as const;
export type RecordType = (typeof RecordType)[keyof typeof RecordType];

const seqBytes = (seq: number): Uint8Array => {
  const b = new Uint8Array(8);
  const v = new DataView(b.buffer);
  v.setUint32(0, seq >>> 0, true);
  v.setUint32(4, Math.floor(seq / 0x1_0000_0000), true);
  return b;
};

const pad8 = (n: number): number => (n + 7) & ~7;

/** Bytes a frame of `payloadBytes` takes in a segment, padding included. */
export const frameBytes = (payloadBytes: number): number => pad8(frameHeaderBytes + 2 + payloadBytes);

/** One frame for segment `seq`, ready to write at an 8-byte-aligned offset. */
export function encodeFrame(seq: number, type: RecordType, payload: Uint8Array): Uint8Array {
  const bodyLength = 2 + payload.length;
  if (bodyLength > maxFrameBody) throw new RangeError(`log record of ${bodyLength} bytes exceeds ${maxFrameBody}`);
  const out = new Uint8Array(frameBytes(payload.length));
  out[frameHeaderBytes] = type;
  out.set(payload, frameHeaderBytes + 1);
  out[frameHeaderBytes + bodyLength - 1] = trailer;
  const body = out.subarray(frameHeaderBytes, frameHeaderBytes + bodyLength);
  const prefix = crc32(seqBytes(seq));
  const view = new DataView(out.buffer);
  view.setUint32(0, bodyLength, true);
  view.setUint32(4, crc32(body, prefix), true);
  view.setUint32(8, crc32(out.subarray(0, 8), prefix), true);
  return out;
}

export interface Frame {
  readonly offset: number;
  /** Offset just past the frame (padding included). */
  readonly end: number;
  readonly type: number;
  readonly payload: Uint8Array;
}

export interface BadFrame {
  readonly offset: number;
  readonly reason: string;
  /** Cut off by an unsynced write (see the module comment) rather than damaged after it was written. */
  readonly torn: boolean;
}

export interface SegmentScan {
  /** The frames that passed their check, up to the first bad one. */
  readonly frames: Frame[];
  /** Where writing continues when nothing is bad: the end of the last good frame. */
  readonly end: number;
  readonly bad: BadFrame | null;
  /** Frames that passed their checks beyond a bad, non-torn frame. */
  readonly beyond: Frame[];
  /**
   * Beyond a bad, non-torn frame: bytes at the end of the written data that no frame could be read
   * from (the damaged frame's own, and any frames after it damaged too). 0 when the scan found a
   * frame boundary right after the last thing it skipped.
   */
  readonly unreadableTail: number;
}

const allZero = (b: Uint8Array, from: number, to: number): boolean => {
  for (let i = from; i < to; i++) if (b[i] !== 0) return false;
  return true;
};

/** Whether the part of [from, to) that lies in some 512-byte sector is all zeros (never written). */
function zeroSectorPart(b: Uint8Array, from: number, to: number): boolean {
  for (let s = from - (from % sectorBytes); s < to; s += sectorBytes) {
    if (allZero(b, Math.max(s, from), Math.min(s + sectorBytes, to, b.length))) return true;
  }
  return false;
}

type Step =
  | { kind: 'end' }
  | { kind: 'frame'; frame: Frame }
  /** `next`: where the frame ends, when its header could be trusted. */
  /** `cutOff`: torn by the end of the written data (nothing can follow), not by a zero sector alone. */
  | { kind: 'bad'; bad: BadFrame; next: number | null; cutOff: boolean };

interface Scanner {
  readonly seqPrefix: number;
  readonly b: Uint8Array;
  readonly view: DataView;
  /** The offset past which every byte is zero. */
  readonly dirtyEnd: number;
}

/** The header at `at` passes its check: its length is the length written. */
function headerOk(sc: Scanner, at: number): boolean {
  if (at + frameHeaderBytes > sc.b.length) return false;
  const length = sc.view.getUint32(at, true);
  return (
    length > 0 &&
    length <= maxFrameBody &&
    sc.view.getUint32(at + 8, true) === crc32(sc.b.subarray(at, at + 8), sc.seqPrefix)
  );
}

function step(sc: Scanner, at: number): Step {
  const { b, view, dirtyEnd } = sc;
  if (at >= dirtyEnd) return { kind: 'end' };
  const headerEnd = at + frameHeaderBytes;
  if (!headerOk(sc, at)) {
    const cutOff = dirtyEnd <= headerEnd;
    const torn = cutOff || zeroSectorPart(b, at, Math.min(headerEnd, b.length));
    const reason =
      headerEnd > b.length
        ? 'frame header cut short by the end of the file'
        : allZero(b, at, headerEnd)
          ? 'a frame header of zeros before written data'
          : 'frame header checksum mismatch';
    return { kind: 'bad', bad: { offset: at, reason, torn }, next: null, cutOff };
  }
  const length = view.getUint32(at, true);
  const bodyEnd = headerEnd + length;
  const end = pad8(bodyEnd);
  if (bodyEnd > b.length) {
    const reason = `frame of ${length} bytes runs past the end of the segment (${b.length} bytes)`;
    return { kind: 'bad', bad: { offset: at, reason, torn: true }, next: null, cutOff: true };
  }
  const body = b.subarray(headerEnd, bodyEnd);
  const stored = view.getUint32(at + 4, true);
  const actual = crc32(body, sc.seqPrefix);
  if (actual !== stored || b[bodyEnd - 1] !== trailer) {
    // (a checksum that matches with a bad trailer: a record of another layout, or damage the CRC missed)
    const cutOff = b[bodyEnd - 1] === 0 && dirtyEnd <= bodyEnd;
    const torn = cutOff || zeroSectorPart(b, at, bodyEnd);
    const reason = `checksum mismatch (stored 0x${stored.toString(16)}, computed 0x${actual.toString(16)})`;
    return {
      kind: 'bad',
      bad: { offset: at, reason: torn ? `${reason}, a write cut off` : reason, torn },
      next: Math.min(end, b.length),
      cutOff,
    };
  }
  return {
    kind: 'frame',
    frame: { offset: at, end: Math.min(end, b.length), type: body[0] ?? 0, payload: body.subarray(1, length - 1) },
  };
}

/** The next 8-byte offset at or after `from` where a whole frame passes its checks, or null. */
function resync(sc: Scanner, from: number): number | null {
  for (let at = pad8(from); at + frameHeaderBytes <= sc.dirtyEnd; at += 8) {
    if (headerOk(sc, at) && step(sc, at).kind === 'frame') return at;
  }
  return null;
}

/** Reads segment `seq`'s bytes from `from` (the start) to its end of written data. */
export function scanSegment(seq: number, b: Uint8Array, from = 0): SegmentScan {
  let dirtyEnd = b.length;
  while (dirtyEnd > 0 && b[dirtyEnd - 1] === 0) dirtyEnd--;
  const sc: Scanner = {
    seqPrefix: crc32(seqBytes(seq)),
    b,
    view: new DataView(b.buffer, b.byteOffset, b.byteLength),
    dirtyEnd,
  };
  const frames: Frame[] = [];
  let at = from;
  for (;;) {
    const s = step(sc, at);
    if (s.kind === 'end') return { frames, end: at, bad: null, beyond: [], unreadableTail: 0 };
    if (s.kind === 'frame') {
      frames.push(s.frame);
      at = s.frame.end;
      continue;
    }
    // Past any bad frame, torn or not: a frame after it that passes both checks was written after
    // it, so a sector of zeros in it was lost after the write rather than never written.
    const beyond: Frame[] = [];
    let next: number | null = s.next ?? resync(sc, at + 8);
    let skippedFrom = s.next === null ? at : null;
    let unreadableTail = 0;
    for (;;) {
      if (next === null) {
        unreadableTail = skippedFrom === null ? 0 : dirtyEnd - skippedFrom;
        break;
      }
      const t = step(sc, next);
      if (t.kind === 'end') break;
      if (t.kind === 'frame') {
        beyond.push(t.frame);
        next = t.frame.end;
        skippedFrom = null;
      } else if (t.bad.torn && t.cutOff) break;
      else {
        skippedFrom = t.next === null ? next : null;
        next = t.next ?? resync(sc, next + 8);
      }
    }
    const bad =
      s.bad.torn && beyond.length > 0
        ? { offset: s.bad.offset, reason: `${s.bad.reason}, with valid records after it`, torn: false }
        : s.bad;
    return { frames, end: at, bad, beyond, unreadableTail };
  }
}
