// A fault-injecting TCP (and Unix-socket) proxy for chaos drills and benchmarks. It sits between a
// client and a target (agent → coordinator, coordinator → coordinator over gRPC/HTTP2, a Redis
// client → redis-server) and, per direction, adds latency, cuts the link (holding the bytes and
// delivering them in order when the cut heals, as TCP would after a partition), refuses connections
// or drops a share of new ones. Faults change at run time with set()/heal() and apply to open
// connections at once.
//
// Per connection and direction there is one FIFO of chunks, each with a due time
// max(arrival + delay, previous due time), so order always holds; one timer per direction waits for
// the head. Backpressure: when the destination's write() returns false the source is paused until
// 'drain'. An error on either socket resets the other; a clean close (FIN) is forwarded after the
// data queued before it.
import net from 'node:net';
import { lstatSync, unlinkSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

export type Endpoint = { readonly host: string; readonly port: number } | { readonly path: string };

export interface FaultSettings {
  /** Extra latency, ms, for every chunk flowing client→server (order preserved). */
  readonly delayUpMs?: number;
  /** Extra latency, ms, for every chunk flowing server→client (order preserved). */
  readonly delayDownMs?: number;
  /** Hold (do not deliver) bytes client→server — a one-way cut; held bytes are delivered in order when the cut heals (like TCP retransmitting after a partition heals). */
  readonly cutUp?: boolean;
  /** Same, server→client. cutUp+cutDown = blackhole. */
  readonly cutDown?: boolean;
  /** Refuse: new connections are destroyed at once (RST-like) and every open one is destroyed when this is set. */
  readonly reject?: boolean;
  /** Probability in [0,1] that a NEW connection is destroyed at once (connection drop). */
  readonly dropConnections?: number;
}

export interface FaultProxyStats {
  /** Connections the listener accepted (including those dropped or refused at once). */
  readonly accepted: number;
  /** Proxied connections open now. */
  readonly open: number;
  /** Connections the proxy destroyed on purpose: refused (reject), dropped (dropConnections), destroyed by reject/resetConnections(), or over maxHeldBytes. */
  readonly dropped: number;
  /** Bytes delivered client→server. */
  readonly bytesUp: number;
  /** Bytes delivered server→client. */
  readonly bytesDown: number;
  /** Bytes queued client→server in open connections and not yet delivered (held by a cut, waiting out a delay, or behind backpressure). */
  readonly heldUp: number;
  /** Same, server→client. */
  readonly heldDown: number;
}

export interface FaultProxyOptions {
  readonly target: Endpoint;
  /** Default { host: '127.0.0.1', port: 0 }. */
  readonly listen?: Endpoint;
  readonly name?: string;
  /** Default Math.random; used for dropConnections. */
  readonly random?: () => number;
  /** Per connection per direction, default 16 MiB; beyond it the connection is destroyed. */
  readonly maxHeldBytes?: number;
}

const DEFAULT_MAX_HELD_BYTES = 16 * 1024 * 1024;

type Direction = 'up' | 'down';

interface Entry {
  /** null: the source's FIN, forwarded as end() once everything before it is delivered. */
  readonly buf: Buffer | null;
  due: number;
}

function isPathEndpoint(e: Endpoint): e is { readonly path: string } {
  return 'path' in e;
}

function describe(e: Endpoint): string {
  if (isPathEndpoint(e)) return e.path;
  return e.host.includes(':') ? `[${e.host}]:${e.port}` : `${e.host}:${e.port}`;
}

/** RST where the socket type allows it (TCP, connected), a plain destroy otherwise; never throws. */
function hardClose(socket: net.Socket): void {
  if (socket.destroyed) return;
  if (!socket.connecting) {
    try {
      socket.resetAndDestroy();
      return;
    } catch {
      // a Unix socket (or an odd handle): no RST, fall through to destroy
    }
  }
  socket.destroy();
}

function validate(f: FaultSettings): FaultSettings {
  for (const key of ['delayUpMs', 'delayDownMs'] as const) {
    const v = f[key];
    if (v !== undefined && (!Number.isFinite(v) || v < 0))
      throw new RangeError(`fault-proxy: ${key} must be a finite number >= 0, got ${v}`);
  }
  const d = f.dropConnections;
  if (d !== undefined && (!Number.isFinite(d) || d < 0 || d > 1))
    throw new RangeError(`fault-proxy: dropConnections must be in [0,1], got ${d}`);
  return Object.freeze({ ...f });
}

/** One direction of one connection: the FIFO, its timer, backpressure. */
class Pipe {
  private readonly queue: Entry[] = [];
  private head = 0;
  private timer: NodeJS.Timeout | null = null;
  private waitingDrain = false;
  private endQueued = false;
  /** Bytes queued and not yet written. */
  queuedBytes = 0;
  private lastDue = 0;

  constructor(
    private readonly conn: Connection,
    readonly dir: Direction,
    private readonly src: net.Socket,
    private readonly dst: net.Socket,
  ) {}

  private get cut(): boolean {
    const f = this.conn.proxy.faults;
    return (this.dir === 'up' ? f.cutUp : f.cutDown) === true;
  }

  private get delay(): number {
    const f = this.conn.proxy.faults;
    return (this.dir === 'up' ? f.delayUpMs : f.delayDownMs) ?? 0;
  }

  private enqueue(buf: Buffer | null): void {
    const due = Math.max(performance.now() + this.delay, this.lastDue);
    this.lastDue = due;
    this.queue.push({ buf, due });
  }

  push(chunk: Buffer): void {
    if (this.endQueued) return;
    this.enqueue(chunk);
    this.queuedBytes += chunk.length;
    this.conn.proxy.noteHeld(this.dir, chunk.length);
    if (this.queuedBytes > this.conn.proxy.maxHeldBytes) {
      this.conn.abort(true);
      return;
    }
    this.pump();
  }

  /** The source sent FIN (or is gone): end the destination after what is queued. */
  pushEnd(): void {
    if (this.endQueued) return;
    this.endQueued = true;
    this.enqueue(null);
    this.pump();
  }

  /** A cut was lifted: what it held goes out no earlier than now + the current delay. */
  restamp(): void {
    const floor = performance.now() + this.delay;
    for (let i = this.head; i < this.queue.length; i++) {
      const e = this.queue[i];
      if (e !== undefined && e.due < floor) e.due = floor;
    }
    if (this.lastDue < floor && this.head < this.queue.length) this.lastDue = floor;
    this.clearTimer();
    this.pump();
  }

  /** Delivers every chunk that is due, unless cut, waiting for 'drain', or upstream not connected. */
  pump(): void {
    if (this.conn.closed || this.waitingDrain || !this.conn.ready) return;
    if (this.cut) {
      this.clearTimer();
      return;
    }
    while (this.head < this.queue.length) {
      const e = this.queue[this.head];
      if (e === undefined) break;
      const now = performance.now();
      if (e.due > now) {
        this.arm(e.due - now);
        return;
      }
      this.shift();
      if (this.dst.destroyed || this.dst.writableEnded) {
        this.discard();
        return;
      }
      if (e.buf === null) {
        this.deliverEnd();
        return;
      }
      this.queuedBytes -= e.buf.length;
      this.conn.proxy.noteHeld(this.dir, -e.buf.length);
      this.conn.proxy.noteDelivered(this.dir, e.buf.length);
      if (!this.dst.write(e.buf)) {
        this.waitingDrain = true;
        if (!this.src.destroyed) this.src.pause();
        this.dst.once('drain', () => {
          this.waitingDrain = false;
          if (!this.src.destroyed) this.src.resume();
          this.pump();
        });
        return;
      }
    }
  }

  private deliverEnd(): void {
    const dst = this.dst;
    if (this.src.destroyed) {
      // The source is gone for good: nothing more can flow back through it, so once the FIN is
      // written the destination is closed outright.
      dst.end(() => dst.destroy());
    } else {
      dst.end();
    }
  }

  private shift(): void {
    this.head++;
    if (this.head === this.queue.length) {
      this.queue.length = 0;
      this.head = 0;
    } else if (this.head >= 1024 && this.head * 2 >= this.queue.length) {
      this.queue.splice(0, this.head);
      this.head = 0;
    }
  }

  private arm(ms: number): void {
    if (this.timer !== null) return;
    this.timer = setTimeout(
      () => {
        this.timer = null;
        this.pump();
      },
      Math.max(1, Math.ceil(ms)),
    );
  }

  private clearTimer(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }

  /** Drops everything queued (the destination is gone or the connection is torn down). */
  discard(): void {
    this.clearTimer();
    this.conn.proxy.noteHeld(this.dir, -this.queuedBytes);
    this.queuedBytes = 0;
    this.queue.length = 0;
    this.head = 0;
  }
}

class Connection {
  closed = false;
  ready = false;
  private clientClosed = false;
  private upstreamClosed = false;
  private readonly up: Pipe;
  private readonly down: Pipe;

  constructor(
    readonly proxy: FaultProxy,
    private readonly client: net.Socket,
    private readonly upstream: net.Socket,
  ) {
    this.up = new Pipe(this, 'up', client, upstream);
    this.down = new Pipe(this, 'down', upstream, client);

    client.on('data', (d: Buffer) => this.up.push(d));
    client.on('end', () => this.up.pushEnd());
    client.on('error', () => this.abort(false));
    client.on('close', () => {
      this.clientClosed = true;
      this.down.discard();
      this.up.pushEnd();
      this.settle();
    });

    upstream.on('connect', () => {
      this.ready = true;
      if (!this.closed) upstream.setNoDelay(true);
      this.up.pump();
      this.down.pump();
    });
    upstream.on('data', (d: Buffer) => this.down.push(d));
    upstream.on('end', () => this.down.pushEnd());
    upstream.on('error', () => this.abort(false));
    upstream.on('close', () => {
      this.upstreamClosed = true;
      this.up.discard();
      this.down.pushEnd();
      if (!this.ready) {
        // The target refused (or was unreachable): nothing to proxy to.
        this.abort(false);
        return;
      }
      this.settle();
    });
  }

  /** Both sockets closed: the connection is done. */
  private settle(): void {
    if (this.clientClosed && this.upstreamClosed) this.finish();
  }

  private finish(): void {
    if (this.closed) return;
    this.closed = true;
    this.up.discard();
    this.down.discard();
    this.proxy.forget(this);
  }

  /** Resets both sides at once. `byProxy`: a fault did it (counted as dropped). */
  abort(byProxy: boolean): void {
    if (this.closed) return;
    if (byProxy) this.proxy.noteDropped();
    this.finish();
    hardClose(this.client);
    hardClose(this.upstream);
  }

  /** A cut in `dir` was lifted. */
  healed(dir: Direction): void {
    (dir === 'up' ? this.up : this.down).restamp();
  }
}

export class FaultProxy {
  readonly name: string;
  /** "127.0.0.1:PORT" for TCP, the socket path for Unix sockets. */
  readonly address: string;
  readonly port: number | null;
  readonly maxHeldBytes: number;

  private current: FaultSettings = Object.freeze({});
  private readonly conns = new Set<Connection>();
  private counters = { accepted: 0, dropped: 0, bytesUp: 0, bytesDown: 0, heldUp: 0, heldDown: 0 };
  private stopping: Promise<void> | null = null;

  private constructor(
    private readonly server: net.Server,
    private readonly target: Endpoint,
    private readonly random: () => number,
    maxHeldBytes: number,
    address: string,
    port: number | null,
    name: string | undefined,
  ) {
    this.maxHeldBytes = maxHeldBytes;
    this.address = address;
    this.port = port;
    this.name = name ?? `fault-proxy ${address} -> ${describe(target)}`;
    server.on('connection', (socket) => this.accept(socket));
    // Accept errors (EMFILE and the like) must not take the process down.
    server.on('error', () => undefined);
  }

  static async start(opts: FaultProxyOptions): Promise<FaultProxy> {
    const listen: Endpoint = opts.listen ?? { host: '127.0.0.1', port: 0 };
    const maxHeldBytes = opts.maxHeldBytes ?? DEFAULT_MAX_HELD_BYTES;
    if (!(maxHeldBytes > 0)) throw new RangeError(`fault-proxy: maxHeldBytes must be > 0, got ${maxHeldBytes}`);
    if (isPathEndpoint(listen)) removeStaleSocket(listen.path);
    const server = net.createServer({ allowHalfOpen: true });
    await new Promise<void>((resolve, reject) => {
      const onError = (err: Error): void => reject(err);
      server.once('error', onError);
      const onListening = (): void => {
        server.off('error', onError);
        resolve();
      };
      if (isPathEndpoint(listen)) server.listen(listen.path, onListening);
      else server.listen(listen.port, listen.host, onListening);
    });
    let address: string;
    let port: number | null;
    const bound = server.address();
    if (isPathEndpoint(listen) || bound === null || typeof bound === 'string') {
      address = typeof bound === 'string' ? bound : describe(listen);
      port = null;
    } else {
      address = describe({ host: bound.address, port: bound.port });
      port = bound.port;
    }
    return new FaultProxy(server, opts.target, opts.random ?? Math.random, maxHeldBytes, address, port, opts.name);
  }

  get faults(): FaultSettings {
    return this.current;
  }

  /** Replaces the current faults; applies to open connections at once (delays apply to chunks arriving from now on; a cut that is lifted flushes what it held, in order, still honouring the current delay). */
  set(faults: FaultSettings): void {
    const prev = this.current;
    this.current = validate(faults);
    if (this.current.reject === true) {
      for (const c of [...this.conns]) c.abort(true);
      return;
    }
    const liftedUp = prev.cutUp === true && this.current.cutUp !== true;
    const liftedDown = prev.cutDown === true && this.current.cutDown !== true;
    for (const c of [...this.conns]) {
      if (liftedUp) c.healed('up');
      if (liftedDown) c.healed('down');
    }
  }

  /** set({}) */
  heal(): void {
    this.set({});
  }

  /** Destroys every open connection (both sides). */
  resetConnections(): void {
    for (const c of [...this.conns]) c.abort(true);
  }

  stats(): FaultProxyStats {
    return { ...this.counters, open: this.conns.size };
  }

  /** Closes the listener and every connection. */
  stop(): Promise<void> {
    if (this.stopping !== null) return this.stopping;
    this.stopping = new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      for (const c of [...this.conns]) c.abort(false);
    });
    return this.stopping;
  }

  // -- used by Connection/Pipe -------------------------------------------------------------------

  /** @internal */
  noteHeld(dir: Direction, delta: number): void {
    if (dir === 'up') this.counters.heldUp += delta;
    else this.counters.heldDown += delta;
  }

  /** @internal */
  noteDelivered(dir: Direction, n: number): void {
    if (dir === 'up') this.counters.bytesUp += n;
    else this.counters.bytesDown += n;
  }

  /** @internal */
  noteDropped(): void {
    this.counters.dropped++;
  }

  /** @internal */
  forget(c: Connection): void {
    this.conns.delete(c);
  }

  private accept(client: net.Socket): void {
    this.counters.accepted++;
    client.on('error', () => undefined);
    if (this.stopping !== null) {
      hardClose(client);
      return;
    }
    const f = this.current;
    const dropP = f.dropConnections ?? 0;
    if (f.reject === true || (dropP > 0 && this.random() < dropP)) {
      this.counters.dropped++;
      hardClose(client);
      return;
    }
    if (!isPathEndpoint(this.target)) client.setNoDelay(true);
    let upstream: net.Socket;
    try {
      upstream = isPathEndpoint(this.target)
        ? net.connect({ path: this.target.path, allowHalfOpen: true })
        : net.connect({ host: this.target.host, port: this.target.port, allowHalfOpen: true });
    } catch {
      hardClose(client);
      return;
    }
    upstream.on('error', () => undefined);
    this.conns.add(new Connection(this, client, upstream));
  }
}

/** Unix-socket listen: a socket file left behind by a dead process is removed; anything else is not touched. */
function removeStaleSocket(path: string): void {
  let isSocket: boolean;
  try {
    isSocket = lstatSync(path).isSocket();
  } catch {
    return; // nothing there
  }
  if (!isSocket) throw new Error(`fault-proxy: ${path} exists and is not a socket`);
  unlinkSync(path);
}
