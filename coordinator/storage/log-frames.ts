// Record framing of the append-only Raft log (log-segments.ts) and the scan that reads a segment.
//
// A frame: u32 LE body length (> 0), u32 LE CRC-32 of (segment sequence number as u64 LE ++ body),
// then the body (u8 record type, msgpack payload, u8 trailer 0xA5), zero-padded to a multiple of 8
// bytes. Segments
// are preallocated with zeros, so a length of 0 is the end of the written log. Binding the CRC to
// the segment's sequence number makes a record copied or renamed into another segment fail its
// check, as storage-codec.ts binds a LevelDB record to its key.
//
// A frame that fails its check is a torn write when it lies where an unsynced write was cut off:
// its bytes run past the end of the file; or it is the last thing written in the segment and its
// trailer is still zero (a write cut at any byte leaves zeros from there on: the trailer, never
// zero when written, tells a cut record from a damaged one); or a whole 512-byte sector it overlaps
// is still all zeros (pages reach the disk in any order before an fdatasync; a sector the kernel
// never wrote reads as zeros — the rule etcd's WAL uses). Anything else is corruption; the reader
// then skips the frame by its length when it can, so the caller learns what lay beyond it (the
// highest index, the latest hard state).
import { crc32 } from './crc32.js';

export const frameHeaderBytes = 8;
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

/** One frame for segment `seq`, ready to write at an 8-byte-aligned offset. */
export function encodeFrame(seq: number, type: RecordType, payload: Uint8Array): Uint8Array {
  const bodyLength = 2 + payload.length;
  if (bodyLength > maxFrameBody) throw new RangeError(`log record of ${bodyLength} bytes exceeds ${maxFrameBody}`);
  const out = new Uint8Array(pad8(frameHeaderBytes + bodyLength));
  out[frameHeaderBytes] = type;
  out.set(payload, frameHeaderBytes + 1);
  out[frameHeaderBytes + bodyLength - 1] = trailer;
  const body = out.subarray(frameHeaderBytes, frameHeaderBytes + bodyLength);
  const view = new DataView(out.buffer);
  view.setUint32(0, bodyLength, true);
  view.setUint32(4, crc32(body, crc32(seqBytes(seq))), true);
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
  /** Frames that passed their check beyond a bad, non-torn frame (read by skipping it). */
  readonly beyond: Frame[];
  /** A bad frame beyond `bad` whose length could not be trusted: what lies past it is unknown. */
  readonly unreadableBeyond: boolean;
}

const allZero = (b: Uint8Array, from: number, to: number): boolean => {
  for (let i = from; i < to; i++) if (b[i] !== 0) return false;
  return true;
};

/**
 * Whether a whole 512-byte sector that the range [from, to) overlaps is all zeros: never written
 * (segments are preallocated with zeros, and a sector is written whole).
 */
function zeroSectorIn(b: Uint8Array, from: number, to: number): boolean {
  for (let s = from - (from % sectorBytes); s < to; s += sectorBytes) {
    if (allZero(b, s, Math.min(s + sectorBytes, b.length))) return true;
  }
  return false;
}

type Step = { kind: 'end' } | { kind: 'frame'; frame: Frame } | { kind: 'bad'; bad: BadFrame; next: number | null };

function step(seqPrefix: number, b: Uint8Array, view: DataView, at: number, dirtyEnd: number): Step {
  if (at + frameHeaderBytes > b.length) {
    return allZero(b, at, b.length)
      ? { kind: 'end' }
      : {
          kind: 'bad',
          bad: { offset: at, reason: 'frame header cut short by the end of the file', torn: true },
          next: null,
        };
  }
  const length = view.getUint32(at, true);
  const stored = view.getUint32(at + 4, true);
  if (length === 0) {
    if (stored === 0) return { kind: 'end' };
    return { kind: 'bad', bad: { offset: at, reason: 'frame of length 0 with a checksum', torn: false }, next: null };
  }
  const bodyEnd = at + frameHeaderBytes + length;
  if (length > maxFrameBody || bodyEnd > b.length) {
    const reason = `frame length ${length} runs past the end of the segment (${b.length} bytes)`;
    return { kind: 'bad', bad: { offset: at, reason, torn: true }, next: null };
  }
  const body = b.subarray(at + frameHeaderBytes, bodyEnd);
  const actual = crc32(body, seqPrefix);
  const end = Math.min(b.length, pad8(bodyEnd));
  if (actual !== stored || b[bodyEnd - 1] !== trailer) {
    // (a checksum that matches with a bad trailer: a record of another layout, or damage the CRC missed)
    const torn = (b[bodyEnd - 1] === 0 && dirtyEnd <= end) || zeroSectorIn(b, at, bodyEnd);
    const reason = `checksum mismatch (stored 0x${stored.toString(16)}, computed 0x${actual.toString(16)})`;
    return {
      kind: 'bad',
      bad: { offset: at, reason: torn ? `${reason}, a sector unwritten` : reason, torn },
      next: end,
    };
  }
  return { kind: 'frame', frame: { offset: at, end, type: body[0] ?? 0, payload: body.subarray(1, body.length - 1) } };
}

/** Reads segment `seq`'s bytes from `from` (the start) to its end of written data. */
export function scanSegment(seq: number, b: Uint8Array, from = 0): SegmentScan {
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const seqPrefix = crc32(seqBytes(seq));
  let dirtyEnd = b.length;
  while (dirtyEnd > 0 && b[dirtyEnd - 1] === 0) dirtyEnd--;
  const frames: Frame[] = [];
  let at = from;
  for (;;) {
    const s = step(seqPrefix, b, view, at, dirtyEnd);
    if (s.kind === 'end') return { frames, end: at, bad: null, beyond: [], unreadableBeyond: false };
    if (s.kind === 'frame') {
      frames.push(s.frame);
      at = s.frame.end;
      continue;
    }
    const beyond: Frame[] = [];
    let unreadableBeyond = s.next === null && !s.bad.torn;
    let next = s.bad.torn ? null : s.next;
    while (next !== null) {
      const t = step(seqPrefix, b, view, next, dirtyEnd);
      if (t.kind === 'end' || (t.kind === 'bad' && t.bad.torn)) break;
      if (t.kind === 'frame') {
        beyond.push(t.frame);
        next = t.frame.end;
      } else {
        next = t.next;
        if (next === null) unreadableBeyond = true;
      }
    }
    return { frames, end: at, bad: s.bad, beyond, unreadableBeyond };
  }
}
