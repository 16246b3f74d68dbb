// The transport warm-up's client (warm-up-transport.ts): RLS calls written as raw HTTP/2 frames on
// a plain socket. Why not node:http2's client: it runs in the serving thread itself, and node's
// stream classes share their code between a client's streams and a server's, so a warm-up through
// node's client left that code compiled for both kinds of stream (and for the TCP socket it used
// beside the Unix socket served): the serving thread spent ~1.5 µs more a check for the rest of its
// life (CPU profiles of the serving thread, 24.3 against 22.5–22.8 µs a check without the transport
// warm-up; bench/README.md, issue 21, 7 Dec). Frames written here touch only the server's side.
//
// What it speaks (RFC 9113, RFC 7541): the connection preface, an empty SETTINGS, a connection
// WINDOW_UPDATE so that answers never wait for the client's window; per call one HEADERS (HPACK
// without a dynamic table or Huffman coding: static-table indices and literals "without indexing")
// and one DATA with END_STREAM. It answers the server's SETTINGS and PING, follows its connection
// window for what it sends, and counts a call done at the frame that ends its stream (or a
// RST_STREAM). A warm-up is best effort: on any error it stops and reports what it finished.
import net from 'node:net';
import { performance } from 'node:perf_hooks';

const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');
const FRAME_HEADER_BYTES = 9;
const TYPE_DATA = 0x0;
const TYPE_HEADERS = 0x1;
const TYPE_RST_STREAM = 0x3;
const TYPE_SETTINGS = 0x4;
const TYPE_PING = 0x6;
const TYPE_GOAWAY = 0x7;
const TYPE_WINDOW_UPDATE = 0x8;
const FLAG_END_STREAM = 0x1;
const FLAG_ACK = 0x1;
const FLAG_END_HEADERS = 0x4;
/** RFC 9113's initial flow-control window, and the frame size every peer accepts. */
const INITIAL_WINDOW = 65_535;
const MAX_FRAME_PAYLOAD = 16_384;
/** The connection window this client opens for the server's answers. */
const RECEIVE_WINDOW_INCREMENT = 1 << 30;

/** One frame: its 9-byte header, then the payload. */
export function frame(type: number, flags: number, streamId: number, payload: Uint8Array): Buffer {
  if (payload.length > MAX_FRAME_PAYLOAD)
    throw new RangeError(`frame payload ${payload.length} > ${MAX_FRAME_PAYLOAD}`);
  const out = Buffer.allocUnsafe(FRAME_HEADER_BYTES + payload.length);
  out.writeUIntBE(payload.length, 0, 3);
  out[3] = type;
  out[4] = flags;
  out.writeUInt32BE(streamId & 0x7fffffff, 5);
  out.set(payload, FRAME_HEADER_BYTES);
  return out;
}

/** An HPACK integer of an N-bit prefix, the prefix's other bits `high` (RFC 7541 §5.1). */
function hpackInt(value: number, prefixBits: number, high: number): number[] {
  const max = (1 << prefixBits) - 1;
  if (value < max) return [high | value];
  const out = [high | max];
  let rest = value - max;
  while (rest >= 128) {
    out.push((rest & 0x7f) | 0x80);
    rest >>>= 7;
  }
  out.push(rest);
  return out;
}

/** A string literal without Huffman coding (§5.2). */
function hpackString(s: string): number[] {
  const bytes = Buffer.from(s, 'latin1');
  return [...hpackInt(bytes.length, 7, 0), ...bytes];
}

/** Static-table indices (RFC 7541 Appendix A) of what a gRPC call sends. */
const STATIC = { authority: 1, methodPost: 3, path: 4, schemeHttp: 6, contentType: 31 } as const;

/**
 * The header block of a gRPC call to `path`: :method POST and :scheme http indexed, :authority,
 * :path and content-type as literals of indexed names, te as a literal of a new name.
 */
export function grpcRequestHeaderBlock(path: string): Buffer {
  const indexed = (i: number): number[] => hpackInt(i, 7, 0x80);
  const literal = (nameIndex: number, value: string): number[] => [...hpackInt(nameIndex, 4, 0), ...hpackString(value)];
  return Buffer.from([
    ...indexed(STATIC.methodPost),
    ...indexed(STATIC.schemeHttp),
    ...literal(STATIC.authority, 'localhost'),
    ...literal(STATIC.path, path),
    ...literal(STATIC.contentType, 'application/grpc'),
    0x00,
    ...hpackString('te'),
    ...hpackString('trailers'),
  ]);
}

export interface WarmUpCallsOptions {
  /** A Unix socket path, or a TCP host and port. */
  readonly target: string | { readonly host: string; readonly port: number };
  /** The gRPC method's path. */
  readonly path: string;
  /** Length-prefixed gRPC messages, sent in turn. */
  readonly bodies: readonly Buffer[];
  readonly calls: number;
  readonly concurrency: number;
  readonly budgetMs: number;
}

/** Sends the calls, `concurrency` at a time; resolves with how many ended (never rejects). */
export function sendWarmUpCalls(opts: WarmUpCallsOptions): Promise<{ calls: number; error: Error | null }> {
  const started = performance.now();
  const headerBlock = grpcRequestHeaderBlock(opts.path);
  // One DATA frame a call: a request longer than a frame is left out of the warm-up.
  const bodies = opts.bodies.filter((b) => b.length <= MAX_FRAME_PAYLOAD);
  if (bodies.length === 0) return Promise.resolve({ calls: 0, error: new Error('no warm-up request fits one frame') });
  return new Promise((resolve) => {
    const socket =
      typeof opts.target === 'string' ? net.connect(opts.target) : net.connect(opts.target.port, opts.target.host);
    let nextStreamId = 1;
    let sent = 0;
    let done = 0;
    /** Streams sent and not yet ended (a stream counts once, whatever frames end it). */
    const open = new Set<number>();
    let sendWindow = INITIAL_WINDOW;
    let finished = false;
    let pending: Buffer = Buffer.alloc(0);
    const end = (error: Error | null): void => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ calls: done, error });
    };
    // However the server behaves, the warm-up ends a second past its budget.
    const timer = setTimeout(() => end(new Error('the warm-up calls did not end in time')), opts.budgetMs + 1000);
    const inTime = (): boolean => performance.now() - started <= opts.budgetMs;
    const fill = (): void => {
      while (open.size < opts.concurrency && sent < opts.calls && inTime()) {
        const body = bodies[sent % bodies.length] as Buffer;
        if (body.length > sendWindow) return; // wait for the server's WINDOW_UPDATE
        sendWindow -= body.length;
        const id = nextStreamId;
        nextStreamId += 2;
        sent++;
        open.add(id);
        socket.write(
          Buffer.concat([
            frame(TYPE_HEADERS, FLAG_END_HEADERS, id, headerBlock),
            frame(TYPE_DATA, FLAG_END_STREAM, id, body),
          ]),
        );
      }
      if (open.size === 0) end(null);
    };
    const onFrame = (type: number, flags: number, streamId: number, payload: Buffer): void => {
      if (type === TYPE_SETTINGS && (flags & FLAG_ACK) === 0)
        socket.write(frame(TYPE_SETTINGS, FLAG_ACK, 0, Buffer.alloc(0)));
      else if (type === TYPE_PING && (flags & FLAG_ACK) === 0) socket.write(frame(TYPE_PING, FLAG_ACK, 0, payload));
      else if (type === TYPE_WINDOW_UPDATE && streamId === 0 && payload.length === 4)
        sendWindow += payload.readUInt32BE(0) & 0x7fffffff;
      else if (type === TYPE_GOAWAY) end(new Error('the warm-up server sent GOAWAY'));
      else if (
        (type === TYPE_RST_STREAM ||
          ((type === TYPE_HEADERS || type === TYPE_DATA) && (flags & FLAG_END_STREAM) !== 0)) &&
        open.delete(streamId)
      ) {
        done++;
      }
    };
    socket.on('data', (chunk: Buffer) => {
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      let at = 0;
      while (pending.length - at >= FRAME_HEADER_BYTES) {
        const length = pending.readUIntBE(at, 3);
        if (pending.length - at < FRAME_HEADER_BYTES + length) break;
        const type = pending[at + 3] as number;
        const flags = pending[at + 4] as number;
        const streamId = pending.readUInt32BE(at + 5) & 0x7fffffff;
        onFrame(type, flags, streamId, pending.subarray(at + FRAME_HEADER_BYTES, at + FRAME_HEADER_BYTES + length));
        at += FRAME_HEADER_BYTES + length;
        if (finished) return;
      }
      pending = pending.subarray(at);
      fill();
    });
    socket.once('error', (error) => end(error));
    socket.once('close', () => end(done >= sent ? null : new Error('the warm-up connection closed')));
    socket.once('connect', () => {
      const increment = Buffer.alloc(4);
      increment.writeUInt32BE(RECEIVE_WINDOW_INCREMENT, 0);
      socket.write(
        Buffer.concat([
          PREFACE,
          frame(TYPE_SETTINGS, 0, 0, Buffer.alloc(0)),
          frame(TYPE_WINDOW_UPDATE, 0, 0, increment),
        ]),
      );
      fill();
    });
  });
}
