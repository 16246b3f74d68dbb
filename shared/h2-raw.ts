// A minimal HTTP/2 client: gRPC unary calls over one socket with every request's bytes prepared
// before, and answers read at the frame level. Two users:
//   - the load generator (LoadJob.client 'raw'; the accuracy scenario, the drills' load), because
//     node:http2's client costs about as much CPU per request as the grpc-js server it measures (a
//     ClientHttp2Stream, its events and header objects per request); on a small machine whose cores
//     share a physical core, a generator that heavy takes CPU from the server under test;
//   - the agent's transport warm-up (cell-agent/rls/warm-up-transport.ts), which calls its own lean
//     server from the serving thread: node's client streams share node's stream code with the
//     server's, and a warm-up through node's client left that code slower for the thread's life.
//
// What it does (RFC 9113):
//   - preface, SETTINGS (push off, stream windows at the maximum), a connection WINDOW_UPDATE to the
//     maximum, replenished as answers arrive; ACKs the server's SETTINGS and PINGs; honours the
//     server's MAX_CONCURRENT_STREAMS and the connection send window (requests wait in a queue)
//   - a request = one HEADERS frame (END_HEADERS) + one DATA frame (END_STREAM), copied from a
//     template and given its stream id; written in one socket write per event-loop turn
//   - answers: DATA payloads are collected per stream (padding removed); a HEADERS frame with
//     END_STREAM ends the stream (CONTINUATION frames followed to END_HEADERS)
// What it does not do: decode HPACK. The header blocks it sends use no dynamic table, and it never
// needs a value from the server's blocks: a stream that received a response message and then ended
// with trailers is counted ok, and one that ended with a single header block (gRPC's
// "trailers-only" form, how grpc-js answers every non-OK status of a unary call) is an error — for
// grpc-js servers (all of those measured here) a unary answer with a message always carries
// grpc-status 0. RST_STREAM, GOAWAY and a closed socket fail the streams concerned.
import net from 'node:net';

const FRAME_DATA = 0x0;
const FRAME_HEADERS = 0x1;
const FRAME_RST_STREAM = 0x3;
const FRAME_SETTINGS = 0x4;
const FRAME_PING = 0x6;
const FRAME_GOAWAY = 0x7;
const FRAME_WINDOW_UPDATE = 0x8;
const FRAME_CONTINUATION = 0x9;

const FLAG_END_STREAM = 0x1;
const FLAG_ACK = 0x1;
const FLAG_END_HEADERS = 0x4;
const FLAG_PADDED = 0x8;

const SETTINGS_ENABLE_PUSH = 0x2;
const SETTINGS_MAX_CONCURRENT_STREAMS = 0x3;
const SETTINGS_INITIAL_WINDOW_SIZE = 0x4;

const MAX_WINDOW = 0x7fffffff;
const DEFAULT_WINDOW = 65535;
const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');

function frameHeader(length: number, type: number, flags: number, streamId: number): Buffer {
  const b = Buffer.alloc(9);
  b.writeUIntBE(length, 0, 3);
  b[3] = type;
  b[4] = flags;
  b.writeUInt32BE(streamId & 0x7fffffff, 5);
  return b;
}

function hpackString(s: string): Buffer {
  const bytes = Buffer.from(s, 'latin1');
  if (bytes.length >= 127) throw new Error('header value too long for this encoder');
  return Buffer.concat([Buffer.from([bytes.length]), bytes]);
}

/**
 * The request header block, HPACK without the dynamic table and without Huffman coding (RFC 7541):
 * :method POST and :scheme http from the static table (indexed), the others as literals without
 * indexing with a static name where there is one.
 */
export function grpcRequestHeaderBlock(path: string, authority: string): Buffer {
  return Buffer.concat([
    Buffer.from([0x83]), // :method POST (static 3)
    Buffer.from([0x86]), // :scheme http (static 6)
    Buffer.from([0x04]),
    hpackString(path), // :path (static name 4), literal without indexing
    Buffer.from([0x01]),
    hpackString(authority), // :authority (static name 1)
    Buffer.from([0x0f, 0x10]),
    hpackString('application/grpc'), // content-type (static name 31 = 15 + 16)
    Buffer.from([0x00]),
    hpackString('te'),
    hpackString('trailers'), // new name
  ]);
}

/** HEADERS + DATA for one request, stream id 0 (set per request by RawH2Session). */
export interface RequestTemplate {
  readonly bytes: Buffer;
  /** Offset of the DATA frame's header in `bytes`. */
  readonly dataAt: number;
  /** Length of the DATA payload (the gRPC message with its 5-byte prefix). */
  readonly dataLength: number;
}

export function requestTemplate(headerBlock: Buffer, grpcMessage: Buffer): RequestTemplate {
  const headers = Buffer.concat([frameHeader(headerBlock.length, FRAME_HEADERS, FLAG_END_HEADERS, 0), headerBlock]);
  const data = Buffer.concat([frameHeader(grpcMessage.length, FRAME_DATA, FLAG_END_STREAM, 0), grpcMessage]);
  return { bytes: Buffer.concat([headers, data]), dataAt: headers.length, dataLength: grpcMessage.length };
}

/** How a stream ended: ok (message + trailers) with the body, or an error text. */
export interface StreamSink {
  /** Called exactly once per request. */
  streamDone(token: unknown, body: Buffer | null, error: string | null): void;
}

interface OpenStream {
  readonly token: unknown;
  headers: number; // header blocks received (1 = response headers, 2 = trailers)
  body: Buffer | null;
}

export class RawH2Session {
  private readonly streams = new Map<number, OpenStream>();
  private readonly queue: { template: RequestTemplate; token: unknown }[] = [];
  private nextStreamId = 1;
  private maxConcurrent = 100; // RFC 9113 suggests assuming at least 100 until SETTINGS arrive
  private sendWindow = DEFAULT_WINDOW; // connection-level, for our DATA
  private peerStreamWindow = DEFAULT_WINDOW;
  private received = 0; // DATA bytes since the last connection WINDOW_UPDATE
  private pending: Buffer[] = [];
  private flushScheduled = false;
  private inbuf: Buffer = Buffer.alloc(0);
  private continuation: { streamId: number; endStream: boolean } | null = null;
  private closed: string | null = null;
  private lastGoodStream = MAX_WINDOW;

  private constructor(
    private readonly socket: net.Socket,
    private readonly sink: StreamSink,
  ) {
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('error', (err) => this.fail(`socket error: ${err.message}`));
    socket.on('close', () => this.fail('connection closed'));
  }

  /** Connects (Unix socket path, or host:port) and completes the SETTINGS exchange. */
  static connect(target: string, sink: StreamSink): Promise<RawH2Session> {
    return new Promise((resolve, reject) => {
      let socket: net.Socket;
      if (target.startsWith('/')) socket = net.connect(target);
      else {
        const colon = target.lastIndexOf(':');
        socket = net.connect({ host: target.slice(0, colon), port: Number(target.slice(colon + 1)) });
        socket.setNoDelay(true);
      }
      const session = new RawH2Session(socket, sink);
      const onError = (err: Error): void => reject(err);
      socket.once('error', onError);
      socket.once('connect', () => {
        const settings = Buffer.alloc(12);
        settings.writeUInt16BE(SETTINGS_ENABLE_PUSH, 0);
        settings.writeUInt32BE(0, 2);
        settings.writeUInt16BE(SETTINGS_INITIAL_WINDOW_SIZE, 6);
        settings.writeUInt32BE(MAX_WINDOW, 8);
        const windowUpdate = Buffer.alloc(4);
        windowUpdate.writeUInt32BE(MAX_WINDOW - DEFAULT_WINDOW, 0);
        socket.write(
          Buffer.concat([
            PREFACE,
            frameHeader(12, FRAME_SETTINGS, 0, 0),
            settings,
            frameHeader(4, FRAME_WINDOW_UPDATE, 0, 0),
            windowUpdate,
          ]),
        );
        session.settingsReceived = () => {
          socket.off('error', onError);
          resolve(session);
        };
      });
    });
  }

  private settingsReceived: (() => void) | null = null;

  /** Why the connection ended (null while open): requests made now fail at once with it. */
  get closedReason(): string | null {
    return this.closed;
  }

  get inFlight(): number {
    return this.streams.size + this.queue.length;
  }

  request(template: RequestTemplate, token: unknown): void {
    if (this.closed !== null) {
      this.sink.streamDone(token, null, this.closed);
      return;
    }
    if (this.queue.length > 0 || !this.canSend(template)) this.queue.push({ template, token });
    else this.send(template, token);
  }

  /** Ends the connection; streams still open fail with `reason`. */
  destroy(reason = 'session destroyed'): void {
    this.fail(reason);
    this.socket.destroy();
  }

  close(): Promise<void> {
    return new Promise((resolve) => {
      if (this.socket.destroyed) {
        resolve();
        return;
      }
      const timer = setTimeout(() => this.socket.destroy(), 1000);
      this.socket.once('close', () => {
        clearTimeout(timer);
        resolve();
      });
      const goaway = Buffer.alloc(8);
      goaway.writeUInt32BE(0, 0);
      goaway.writeUInt32BE(0, 4);
      this.socket.end(Buffer.concat([frameHeader(8, FRAME_GOAWAY, 0, 0), goaway]));
    });
  }

  private canSend(t: RequestTemplate): boolean {
    return this.streams.size < this.maxConcurrent && this.sendWindow >= t.dataLength && this.nextStreamId < MAX_WINDOW;
  }

  private send(t: RequestTemplate, token: unknown): void {
    if (t.dataLength > this.peerStreamWindow) {
      this.sink.streamDone(
        token,
        null,
        `request of ${t.dataLength} bytes exceeds the server's stream window ${this.peerStreamWindow}`,
      );
      return;
    }
    const id = this.nextStreamId;
    this.nextStreamId += 2;
    this.sendWindow -= t.dataLength;
    const bytes = Buffer.allocUnsafe(t.bytes.length);
    t.bytes.copy(bytes);
    bytes.writeUInt32BE(id, 5);
    bytes.writeUInt32BE(id, t.dataAt + 5);
    this.streams.set(id, { token, headers: 0, body: null });
    this.write(bytes);
  }

  private write(bytes: Buffer): void {
    this.pending.push(bytes);
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      process.nextTick(() => this.flush());
    }
  }

  private flush(): void {
    this.flushScheduled = false;
    if (this.pending.length === 0 || this.socket.destroyed) return;
    const out = this.pending.length === 1 ? this.pending[0] : Buffer.concat(this.pending);
    this.pending = [];
    if (out !== undefined) this.socket.write(out);
  }

  private drainQueue(): void {
    while (this.queue.length > 0 && this.closed === null) {
      const next = this.queue[0];
      if (next === undefined || !this.canSend(next.template)) break;
      this.queue.shift();
      this.send(next.template, next.token);
    }
  }

  private finish(id: number, error: string | null): void {
    const s = this.streams.get(id);
    if (s === undefined) return;
    this.streams.delete(id);
    if (error !== null) this.sink.streamDone(s.token, null, error);
    else if (s.body === null || s.headers < 2)
      this.sink.streamDone(
        s.token,
        null,
        s.body === null ? 'trailers-only answer (a non-OK grpc-status)' : 'stream ended without trailers',
      );
    else this.sink.streamDone(s.token, s.body, null);
    this.drainQueue();
  }

  private fail(reason: string): void {
    if (this.closed === null) this.closed = reason;
    const streams = [...this.streams.values()];
    this.streams.clear();
    const queued = this.queue.splice(0);
    for (const s of streams) this.sink.streamDone(s.token, null, reason);
    for (const q of queued) this.sink.streamDone(q.token, null, reason);
  }

  private onData(chunk: Buffer): void {
    let buf = this.inbuf.length === 0 ? chunk : Buffer.concat([this.inbuf, chunk]);
    let at = 0;
    while (buf.length - at >= 9) {
      const length = buf.readUIntBE(at, 3);
      if (buf.length - at < 9 + length) break;
      const type = buf[at + 3] ?? 0;
      const flags = buf[at + 4] ?? 0;
      const streamId = buf.readUInt32BE(at + 5) & 0x7fffffff;
      this.onFrame(type, flags, streamId, buf, at + 9, at + 9 + length);
      at += 9 + length;
    }
    buf = buf.subarray(at);
    this.inbuf = buf.length === 0 ? Buffer.alloc(0) : Buffer.from(buf);
  }

  private onFrame(type: number, flags: number, streamId: number, buf: Buffer, from: number, to: number): void {
    if (this.continuation !== null && type !== FRAME_CONTINUATION) {
      this.destroy('protocol error: expected CONTINUATION');
      return;
    }
    switch (type) {
      case FRAME_DATA: {
        const length = to - from;
        this.received += length;
        if (this.received > MAX_WINDOW / 2) {
          const inc = Buffer.alloc(4);
          inc.writeUInt32BE(this.received, 0);
          this.received = 0;
          this.write(Buffer.concat([frameHeader(4, FRAME_WINDOW_UPDATE, 0, 0), inc]));
        }
        const s = this.streams.get(streamId);
        if (s === undefined) return;
        let start = from;
        let end = to;
        if ((flags & FLAG_PADDED) !== 0) {
          end -= buf[from] ?? 0;
          start += 1;
        }
        const part = buf.subarray(start, end);
        s.body = s.body === null ? Buffer.from(part) : Buffer.concat([s.body, part]);
        if ((flags & FLAG_END_STREAM) !== 0) this.finish(streamId, null);
        return;
      }
      case FRAME_HEADERS: {
        const s = this.streams.get(streamId);
        if (s !== undefined) s.headers++;
        const endStream = (flags & FLAG_END_STREAM) !== 0;
        // The block is not decoded, so its padding and PRIORITY fields need no parsing.
        if ((flags & FLAG_END_HEADERS) === 0) this.continuation = { streamId, endStream };
        else if (endStream) this.finish(streamId, null);
        return;
      }
      case FRAME_CONTINUATION: {
        const c = this.continuation;
        if (c === null || c.streamId !== streamId) {
          this.destroy('protocol error: unexpected CONTINUATION');
          return;
        }
        if ((flags & FLAG_END_HEADERS) !== 0) {
          this.continuation = null;
          if (c.endStream) this.finish(streamId, null);
        }
        return;
      }
      case FRAME_RST_STREAM:
        this.finish(streamId, `RST_STREAM ${buf.readUInt32BE(from)}`);
        return;
      case FRAME_SETTINGS: {
        if ((flags & FLAG_ACK) !== 0) return;
        for (let p = from; p + 6 <= to; p += 6) {
          const id = buf.readUInt16BE(p);
          const value = buf.readUInt32BE(p + 2);
          if (id === SETTINGS_MAX_CONCURRENT_STREAMS) this.maxConcurrent = value;
          else if (id === SETTINGS_INITIAL_WINDOW_SIZE) this.peerStreamWindow = value;
        }
        this.write(frameHeader(0, FRAME_SETTINGS, FLAG_ACK, 0));
        this.settingsReceived?.();
        this.settingsReceived = null;
        this.drainQueue();
        return;
      }
      case FRAME_PING:
        if ((flags & FLAG_ACK) === 0)
          this.write(Buffer.concat([frameHeader(8, FRAME_PING, FLAG_ACK, 0), buf.subarray(from, to)]));
        return;
      case FRAME_GOAWAY: {
        this.lastGoodStream = buf.readUInt32BE(from) & 0x7fffffff;
        this.closed ??= `GOAWAY (error ${buf.readUInt32BE(from + 4)})`;
        for (const id of [...this.streams.keys()]) if (id > this.lastGoodStream) this.finish(id, this.closed);
        return;
      }
      case FRAME_WINDOW_UPDATE:
        if (streamId === 0) {
          this.sendWindow += buf.readUInt32BE(from) & 0x7fffffff;
          this.drainQueue();
        }
        return;
      default:
        return; // PRIORITY, PUSH_PROMISE (push is off), unknown types: ignored
    }
  }
}
