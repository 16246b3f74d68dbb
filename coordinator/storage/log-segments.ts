// The append-only Raft log on disk: numbered segment files in `<data dir>/raft-log/`, each
// preallocated with zeros (so an fdatasync after an append writes the data and nothing else: the
// file's size and extents do not change) and filled with CRC-framed records (log-frames.ts).
//
// Segment `seq` is `<16 hex digits>.seg` and starts with a header record naming its seq. The next
// segment is prepared in the background (written as zeros to `.tmp`, synced, renamed, directory
// synced), so rotating costs one fdatasync of the finished segment. Rotation writes the caller's
// preamble (storage writes its current hard state) first in the new segment, so deleting older
// segments never loses the latest hard state.
//
// This module knows files and frames, not Raft: what a record means, and where a bad tail is
// truncated, is decided by raft-storage.ts. Writes are not serialised here: the caller does one
// operation at a time.
import { constants as fsc } from 'node:fs';
import { mkdir, open, readdir, readFile, rename, unlink, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { encodeFrame, scanSegment, type RecordType, type SegmentScan } from './log-frames.js';

export const logDirName = 'raft-log';
/** Default segment size: 16 MiB (a record larger than a segment gets a segment of its own size). */
export const defaultSegmentBytes = 16 * 1024 * 1024;
const zeroChunk = 1024 * 1024;

export interface LogRecord {
  readonly type: RecordType;
  readonly payload: Uint8Array;
}

export interface ReadSegment {
  readonly seq: number;
  readonly size: number;
  /** The offset past which every byte is zero. */
  readonly dirtyEnd: number;
  readonly scan: SegmentScan;
}

const segName = (seq: number): string => `${seq.toString(16).padStart(16, '0')}.seg`;
const parseSegName = (name: string): number | undefined => {
  const m = /^([0-9a-f]{16})\.seg$/.exec(name);
  if (m === null || m[1] === undefined) return undefined;
  const n = Number.parseInt(m[1], 16);
  return Number.isSafeInteger(n) ? n : undefined;
};

async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, fsc.O_RDONLY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

async function writeAll(fh: FileHandle, buf: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < buf.length) {
    const { bytesWritten } = await fh.write(buf, done, buf.length - done, position + done);
    if (bytesWritten <= 0) throw new Error(`write returned ${bytesWritten}`);
    done += bytesWritten;
  }
}

/** Creates segment `seq` of `size` zero bytes, durably, under its final name. */
async function createSegment(dir: string, seq: number, size: number): Promise<void> {
  const tmp = join(dir, `${segName(seq)}.tmp`);
  const fh = await open(tmp, 'w');
  try {
    const zeros = new Uint8Array(Math.min(zeroChunk, size));
    for (let at = 0; at < size; at += zeros.length)
      await writeAll(fh, zeros.subarray(0, Math.min(zeros.length, size - at)), at);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await rename(tmp, join(dir, segName(seq)));
  await fsyncDir(dir);
}

export interface SegmentLogOptions {
  readonly segmentBytes?: number;
}

export class SegmentLog {
  readonly dir: string;
  private readonly segmentBytes: number;
  /** Segment files present, by seq (the active one and any prepared spare included). */
  private readonly sizes = new Map<number, number>();
  /** For segments read at open: the offset past which every byte is zero. */
  private readonly dirtyEnd = new Map<number, number>();
  private fh: FileHandle | null = null;
  private seq = 0;
  private pos = 0;
  private size = 0;
  private spare: Promise<void> | null = null;
  private preamble: (seq: number) => LogRecord[] = () => [];

  private constructor(dir: string, opts: SegmentLogOptions) {
    this.dir = dir;
    this.segmentBytes = opts.segmentBytes ?? defaultSegmentBytes;
  }

  /**
   * Reads every segment at or above `logStart` (older ones, left by a compaction that was cut
   * short, and unfinished `.tmp` files are deleted). Writing starts with `resume`.
   */
  static async open(
    dataDir: string,
    logStart: number,
    opts: SegmentLogOptions = {},
  ): Promise<{ log: SegmentLog; segments: ReadSegment[] }> {
    const dir = join(dataDir, logDirName);
    await mkdir(dir, { recursive: true });
    const log = new SegmentLog(dir, opts);
    for (const name of await readdir(dir)) {
      const seq = parseSegName(name);
      if (name.endsWith('.seg.tmp') || (seq !== undefined && seq < logStart)) await unlink(join(dir, name));
    }
    const segments = await SegmentLog.read(dataDir, logStart);
    for (const seg of segments) {
      log.sizes.set(seg.seq, seg.size);
      log.dirtyEnd.set(seg.seq, seg.dirtyEnd);
    }
    return { log, segments };
  }

  /** Reads (changing nothing) every segment at or above `logStart`, ascending. */
  static async read(dataDir: string, logStart: number): Promise<ReadSegment[]> {
    const dir = join(dataDir, logDirName);
    const segments: ReadSegment[] = [];
    for (const name of (await readdir(dir)).sort()) {
      if (name.endsWith('.seg.tmp')) continue;
      const seq = parseSegName(name);
      if (seq === undefined) throw new Error(`unexpected file ${name} in ${dir}`);
      if (seq < logStart) continue;
      const bytes = await readFile(join(dir, name));
      let dirtyEnd = bytes.length;
      while (dirtyEnd > 0 && bytes[dirtyEnd - 1] === 0) dirtyEnd--;
      segments.push({ seq, size: bytes.length, dirtyEnd, scan: scanSegment(seq, bytes) });
    }
    return segments;
  }

  /** Deletes every segment file (a directory being initialised or upgraded starts empty). */
  static async clear(dataDir: string): Promise<void> {
    const dir = join(dataDir, logDirName);
    await mkdir(dir, { recursive: true });
    for (const name of await readdir(dir)) await unlink(join(dir, name));
    await fsyncDir(dir);
  }

  /**
   * Starts writing in segment `seq` at `offset` (zeroing, durably, whatever was written from there
   * on: a torn or truncated tail) and deletes segments above `seq`. With no segment yet (seq absent),
   * creates it. `preamble` gives the records every new segment starts with, after its header.
   */
  async resume(seq: number, offset: number, preamble: (seq: number) => LogRecord[]): Promise<void> {
    this.preamble = preamble;
    for (const s of [...this.sizes.keys()].filter((k) => k > seq)) {
      await unlink(join(this.dir, segName(s)));
      this.sizes.delete(s);
    }
    if (!this.sizes.has(seq)) {
      await createSegment(this.dir, seq, this.segmentBytes);
      this.sizes.set(seq, this.segmentBytes);
    }
    this.fh = await open(join(this.dir, segName(seq)), 'r+');
    this.seq = seq;
    this.size = this.sizes.get(seq) ?? 0;
    const written = this.dirtyEnd.get(seq) ?? 0;
    this.dirtyEnd.clear();
    if (offset < written) {
      const zeros = new Uint8Array(Math.min(zeroChunk, written - offset));
      for (let at = offset; at < written; at += zeros.length)
        await writeAll(this.fh, zeros.subarray(0, Math.min(zeros.length, written - at)), at);
      await this.fh.datasync();
    }
    this.pos = offset;
    if (offset === 0) await this.write(this.opening(seq), true);
    this.prepareSpare();
  }

  /** The active segment's seq. */
  get activeSeq(): number {
    return this.seq;
  }

  /** Segment seqs present, ascending. */
  segmentSeqs(): number[] {
    return [...this.sizes.keys()].sort((a, b) => a - b);
  }

  /**
   * Appends the records (rotating first if they do not fit in the active segment), then fdatasyncs
   * when `sync`. Returns the bytes written.
   */
  async append(records: readonly LogRecord[], sync: boolean): Promise<number> {
    let bytes = 0;
    for (const r of records) bytes += 8 + ((1 + r.payload.length + 7) & ~7);
    if (this.pos + bytes > this.size) await this.rotate(bytes);
    return this.write(
      records.map((r) => encodeFrame(this.seq, r.type, r.payload)),
      sync,
    );
  }

  /** Finishes the active segment and continues in a new one (starting with the preamble); returns its seq. */
  async rotate(atLeast = 0): Promise<number> {
    const fh = this.requireOpen();
    await fh.datasync();
    const next = this.seq + 1;
    const opening = this.opening(next);
    let need = atLeast;
    for (const f of opening) need += f.length;
    const spare = this.spare;
    this.spare = null;
    if (spare !== null) await spare.catch(() => undefined);
    const have = this.sizes.get(next) ?? 0;
    if (have < need) {
      const size = Math.max(this.segmentBytes, Math.ceil(need / zeroChunk) * zeroChunk);
      await createSegment(this.dir, next, size);
      this.sizes.set(next, size);
    }
    const nfh = await open(join(this.dir, segName(next)), 'r+');
    await fh.close();
    this.fh = nfh;
    this.seq = next;
    this.size = this.sizes.get(next) ?? 0;
    this.pos = 0;
    await this.write(opening, true);
    this.prepareSpare();
    return next;
  }

  /** Deletes the segments below `seq` (never the active one). */
  async removeBelow(seq: number): Promise<void> {
    for (const s of this.segmentSeqs()) {
      if (s >= seq || s >= this.seq) break;
      await unlink(join(this.dir, segName(s))).catch((err: unknown) => {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      });
      this.sizes.delete(s);
    }
  }

  async close(): Promise<void> {
    await this.spare?.catch(() => undefined);
    const fh = this.fh;
    this.fh = null;
    await fh?.close();
  }

  // -------------------------------------------------------------------------------------------

  private opening(seq: number): Uint8Array[] {
    const header: LogRecord = { type: 1, payload: new Uint8Array(0) };
    return [header, ...this.preamble(seq)].map((r) => encodeFrame(seq, r.type, r.payload));
  }

  private async write(frames: readonly Uint8Array[], sync: boolean): Promise<number> {
    const fh = this.requireOpen();
    let bytes = 0;
    for (const f of frames) bytes += f.length;
    if (bytes > 0) {
      const buf = frames.length === 1 && frames[0] !== undefined ? frames[0] : Buffer.concat(frames);
      await writeAll(fh, buf, this.pos);
      this.pos += bytes;
    }
    if (sync) await fh.datasync();
    return bytes;
  }

  private prepareSpare(): void {
    const next = this.seq + 1;
    if (this.sizes.has(next)) return;
    const p = createSegment(this.dir, next, this.segmentBytes).then(() => void this.sizes.set(next, this.segmentBytes));
    p.catch(() => undefined); // awaited at the next rotation, which creates the segment itself when this failed
    this.spare = p;
  }

  private requireOpen(): FileHandle {
    if (this.fh === null) throw new Error(`raft log at ${this.dir} is not open for writing`);
    return this.fh;
  }
}
