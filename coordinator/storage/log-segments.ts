// The append-only Raft log on disk: numbered segment files in `<data dir>/raft-log/`, filled with
// CRC-framed records (log-frames.ts). Ahead of the write position each segment is extended with
// zeros, 1 MiB at a time and synced, in the background after a write: an append then lands in
// space the file already has, so its fdatasync writes the data and nothing else (the file's size
// and extents do not change; an append that grows a file also commits its new size through the
// filesystem journal). The zeros also mark the end of the written log (a length of 0).
//
// A synced append is one pwrite on a second descriptor of the active segment opened with O_DSYNC:
// the kernel writes the data and syncs it (what fdatasync does: ext4 runs the same sync for both)
// before the call returns, so the append is durable when its one trip through libuv's threadpool
// ends. A pwrite then an fdatasync took two trips, with a turn of the event loop between them.
// Writes that need no sync (the zeros) go through the plain descriptor and are fdatasync'd.
//
// Segment `seq` is `<16 hex digits>.seg` and starts with a header record. Rotation (when a segment
// reaches its size) syncs the finished segment, creates the next one and syncs the directory, then
// writes the caller's preamble (storage writes its current hard state) first in the new segment,
// so deleting older segments never loses the latest hard state.
//
// This module knows files and frames, not Raft: what a record means, and where a bad tail is
// truncated, is decided by raft-storage.ts. Writes are not serialised here: the caller does one
// operation at a time.
import { constants as fsc } from 'node:fs';
import { mkdir, open, readdir, readFile, unlink, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { encodeFrame, frameBytes, RecordType, scanSegment, type SegmentScan } from './log-frames.js';

export const logDirName = 'raft-log';
/** Default segment size: 64 MiB (a record larger than that goes alone in a segment). */
export const defaultSegmentBytes = 64 * 1024 * 1024;
/** Zeros are added ahead of the write position in steps of this size... */
const zeroChunk = 1024 * 1024;
/** ...when less than this is left. */
const zeroAhead = 256 * 1024;

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

/**
 * The log directory in `dataDir`, created if missing — durably: the data directory is synced
 * after the mkdir, so the directory entry survives a crash with the segments it will hold.
 */
async function ensureLogDir(dataDir: string): Promise<string> {
  const dir = join(dataDir, logDirName);
  const created = await mkdir(dir, { recursive: true });
  if (created !== undefined) {
    await fsyncDir(dir);
    await fsyncDir(dataDir);
  }
  return dir;
}

/** Creates segment `seq`, empty, durably (the directory synced). */
async function createSegment(dir: string, seq: number): Promise<void> {
  const fh = await open(join(dir, segName(seq)), 'wx');
  await fh.close();
  await fsyncDir(dir);
}

async function writeZeros(fh: FileHandle, from: number, to: number): Promise<void> {
  const zeros = new Uint8Array(Math.min(zeroChunk, Math.max(0, to - from)));
  for (let at = from; at < to; at += zeros.length)
    await writeAll(fh, zeros.subarray(0, Math.min(zeros.length, to - at)), at);
}

/** Segment `seq` opened for synchronised-data writes (O_DSYNC). */
function openDsync(dir: string, seq: number): Promise<FileHandle> {
  return open(join(dir, segName(seq)), fsc.O_RDWR | fsc.O_DSYNC);
}

export interface SegmentLogOptions {
  readonly segmentBytes?: number;
}

export class SegmentLog {
  readonly dir: string;
  private readonly segmentBytes: number;
  /** Segment files present, by seq. */
  private readonly seqs = new Set<number>();
  /** For segments read at open: the offset past which every byte is zero, and the file's size. */
  private readonly found = new Map<number, { dirtyEnd: number; size: number }>();
  private fh: FileHandle | null = null;
  /** The active segment again, opened with O_DSYNC: synced appends go here (see the module comment). */
  private dsync: FileHandle | null = null;
  private seq = 0;
  /** Where the next record goes. */
  private pos = 0;
  /** The file's size: zeros (or records) up to here. */
  private zeroedTo = 0;
  private extending: Promise<void> | null = null;
  private extendFailure: Error | null = null;
  private preamble: (seq: number) => LogRecord[] = () => [];

  private constructor(dir: string, opts: SegmentLogOptions) {
    this.dir = dir;
    this.segmentBytes = opts.segmentBytes ?? defaultSegmentBytes;
  }

  /**
   * Reads every segment at or above `logStart` (older ones, left by a compaction that was cut
   * short, and files of an older layout's unfinished writes are deleted). Writing starts with `resume`.
   */
  static async open(
    dataDir: string,
    logStart: number,
    opts: SegmentLogOptions = {},
  ): Promise<{ log: SegmentLog; segments: ReadSegment[] }> {
    const dir = await ensureLogDir(dataDir);
    const log = new SegmentLog(dir, opts);
    for (const name of await readdir(dir)) {
      const seq = parseSegName(name);
      if (name.endsWith('.seg.tmp') || (seq !== undefined && seq < logStart)) await unlink(join(dir, name));
    }
    const segments = await SegmentLog.read(dataDir, logStart);
    for (const seg of segments) {
      log.seqs.add(seg.seq);
      log.found.set(seg.seq, { dirtyEnd: seg.dirtyEnd, size: seg.size });
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
    const dir = await ensureLogDir(dataDir);
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
    const above = [...this.seqs].filter((k) => k > seq);
    for (const s of above) {
      await unlink(join(this.dir, segName(s)));
      this.seqs.delete(s);
    }
    // Durably gone before anything is written after the cut: come back, they would read as the log's continuation.
    if (above.length > 0) await fsyncDir(this.dir);
    if (!this.seqs.has(seq)) {
      await createSegment(this.dir, seq);
      this.seqs.add(seq);
    }
    this.fh = await open(join(this.dir, segName(seq)), 'r+');
    this.dsync = await openDsync(this.dir, seq);
    this.seq = seq;
    const found = this.found.get(seq) ?? { dirtyEnd: 0, size: 0 };
    this.found.clear();
    this.zeroedTo = found.size;
    if (offset < found.dirtyEnd) await writeZeros(this.fh, offset, found.dirtyEnd);
    // Whatever a previous process left unsynced in this segment is made durable before the first
    // append: appends sync only the range they write (O_DSYNC), never the pages before them.
    await this.fh.datasync();
    this.pos = offset;
    if (offset === 0) await this.write(this.opening(seq), true);
  }

  /** Replaces the preamble (records every new segment starts with, after its header). */
  setPreamble(preamble: (seq: number) => LogRecord[]): void {
    this.preamble = preamble;
  }

  /** The active segment's seq. */
  get activeSeq(): number {
    return this.seq;
  }

  /** Segment seqs present, ascending. */
  segmentSeqs(): number[] {
    return [...this.seqs].sort((a, b) => a - b);
  }

  /**
   * Appends the records (rotating first when the active segment is full), then fdatasyncs when
   * `sync`. Returns the bytes written.
   */
  async append(records: readonly LogRecord[], sync: boolean): Promise<number> {
    let bytes = 0;
    for (const r of records) bytes += frameBytes(r.payload.length);
    if (this.pos > 0 && this.pos + bytes > this.segmentBytes) await this.rotate();
    return this.write(
      records.map((r) => encodeFrame(this.seq, r.type, r.payload)),
      sync,
    );
  }

  /** Finishes the active segment and continues in a new one (starting with the preamble); returns its seq. */
  async rotate(): Promise<number> {
    const fh = this.requireOpen();
    await this.settleExtension();
    await fh.datasync();
    const next = this.seq + 1;
    await createSegment(this.dir, next);
    this.seqs.add(next);
    const nfh = await open(join(this.dir, segName(next)), 'r+');
    const ndsync = await openDsync(this.dir, next).catch(async (err: unknown) => {
      await nfh.close();
      throw err;
    });
    const old = this.dsync;
    this.fh = nfh;
    this.dsync = ndsync;
    await fh.close();
    await old?.close();
    this.seq = next;
    this.pos = 0;
    this.zeroedTo = 0;
    await this.write(this.opening(next), true);
    return next;
  }

  /** Deletes the segments below `seq` (never the active one). */
  async removeBelow(seq: number): Promise<void> {
    for (const s of this.segmentSeqs()) {
      if (s >= seq || s >= this.seq) break;
      await unlink(join(this.dir, segName(s))).catch((err: unknown) => {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      });
      this.seqs.delete(s);
    }
  }

  async close(): Promise<void> {
    await this.extending?.catch(() => undefined);
    const fh = this.fh;
    const dsync = this.dsync;
    this.fh = null;
    this.dsync = null;
    await fh?.close();
    await dsync?.close();
  }

  // -------------------------------------------------------------------------------------------

  private opening(seq: number): Uint8Array[] {
    const header: LogRecord = { type: RecordType.Header, payload: new Uint8Array(0) };
    return [header, ...this.preamble(seq)].map((r) => encodeFrame(seq, r.type, r.payload));
  }

  private async write(frames: readonly Uint8Array[], sync: boolean): Promise<number> {
    const fh = this.requireOpen();
    let bytes = 0;
    for (const f of frames) bytes += f.length;
    // The zeros being added lie at and after zeroedTo: a write that reaches there waits for them.
    if (this.pos + bytes > this.zeroedTo) await this.settleExtension();
    if (bytes > 0) {
      const buf = frames.length === 1 && frames[0] !== undefined ? frames[0] : Buffer.concat(frames);
      // Synced: durable when the pwrite returns (O_DSYNC), no fdatasync after it.
      await writeAll(sync ? this.requireDsync() : fh, buf, this.pos);
      this.pos += bytes;
      if (this.pos > this.zeroedTo) this.zeroedTo = this.pos;
    } else if (sync) {
      await fh.datasync();
    }
    if (this.extending === null && this.zeroedTo - this.pos < zeroAhead) this.extend(fh);
    return bytes;
  }

  /** Adds zeros after zeroedTo, synced, in the background (see the module comment). */
  private extend(fh: FileHandle): void {
    const from = this.zeroedTo;
    const to = Math.min(Math.max(from + zeroChunk, this.pos + zeroAhead), Math.max(this.segmentBytes, from));
    if (to <= from) return;
    const p = (async () => {
      await writeZeros(fh, from, to);
      await fh.datasync();
      this.zeroedTo = Math.max(this.zeroedTo, to);
    })();
    this.extending = p.then(
      () => void (this.extending = null),
      (err: unknown) => {
        this.extendFailure = err instanceof Error ? err : new Error(String(err));
        this.extending = null;
      },
    );
  }

  /** Waits for the zeros in flight; a failure there fails the write that waited (the disk is in trouble). */
  private async settleExtension(): Promise<void> {
    await this.extending;
    const err = this.extendFailure;
    if (err !== null) {
      this.extendFailure = null;
      throw err;
    }
  }

  private requireDsync(): FileHandle {
    if (this.dsync === null) throw new Error(`raft log at ${this.dir} is not open for writing`);
    return this.dsync;
  }

  private requireOpen(): FileHandle {
    if (this.fh === null) throw new Error(`raft log at ${this.dir} is not open for writing`);
    return this.fh;
  }
}
