// The gRPC transport between coordinator replicas.
//
// Outbound: one PeerLink per peer keeps ONE long-lived client-streaming `Stream` call open to that
// peer and writes frames on it (one frame = one msgpackr batch of Raft messages, see peer-codec.ts).
// `send()` groups a batch of messages by destination and enqueues one frame per destination; each
// link drains its queue onto its stream as fast as gRPC takes it, so AppendEntries are pipelined.
// A link's queue is bounded in bytes: when the peer is down or slow, the oldest frames are dropped
// (and counted) — Raft retransmits whatever matters, and stale messages are worthless anyway.
// A lost stream is re-opened with exponential backoff and jitter (capped at ~1 s); each attempt uses
// a fresh gRPC channel so gRPC's own (much longer) reconnect backoff never stands in the way.
//
// Inbound: the server accepts one `Stream` per sender, checks the sender's cluster id (metadata) and,
// with TLS, that the sender's verified client certificate names the sender id it declares
// (shared/cert-identity.ts: `urn:cellquota:replica:<id>`, or the CN), so no replica (nor a cell's
// certificate from the same CA) can speak under another replica's id;
// answers with response headers at once (so the sender knows the stream is live), decodes and
// validates every frame and hands the messages addressed to this node to `onMessages`. A malformed
// frame is dropped and counted; it never crashes the process nor closes the stream.

import * as grpc from '@grpc/grpc-js';
import type { Logger } from 'pino';
import type { Message, NodeId } from '../raft/raft-types.js';
import { decodeFrame, defaultPeerCodecLimits, encodeFrame, type PeerCodecLimits } from './peer-codec.js';
import { certNames } from '../../shared/cert-identity.js';
import {
  CLUSTER_ID_HEADER,
  COMMAND_FORMAT_HEADER,
  loadRaftPeerService,
  NODE_ID_HEADER,
  type FrameMessage,
  type ProbeRequestMessage,
  type ProbeResponseMessage,
  type RaftPeerService,
  type StreamSummaryMessage,
} from './peer-proto.js';

export interface PeerTlsOptions {
  /** PEM of the CA that signs every replica's certificate (server and client side). */
  readonly ca: Uint8Array | string;
  /** PEM of this replica's certificate chain; presented both as server and as client. */
  readonly cert: Uint8Array | string;
  /** PEM of this replica's private key. */
  readonly key: Uint8Array | string;
  /** Expect this name in peers' certificates instead of the host in their address. */
  readonly serverNameOverride?: string;
}

export interface BackoffOptions {
  /** Delay before the first reconnect attempt (before jitter). */
  readonly initialMs: number;
  /** Cap on the delay (before jitter). */
  readonly maxMs: number;
  readonly multiplier: number;
  /** Fraction of the delay that is randomized: the delay is d·(1 − jitter + jitter·random()). */
  readonly jitter: number;
}

const DEFAULT_KEEPALIVE_TIME_MS = 5_000;
const DEFAULT_KEEPALIVE_TIMEOUT_MS = 3_000;

export const defaultBackoff: BackoffOptions = { initialMs: 50, maxMs: 1000, multiplier: 2, jitter: 0.5 };

/** The delay before reconnect attempt `attempt` (0-based): exponential, capped, jittered. */
export function backoffDelay(attempt: number, random: () => number, opts: BackoffOptions = defaultBackoff): number {
  const base = Math.min(opts.maxMs, opts.initialMs * Math.pow(opts.multiplier, Math.max(0, attempt)));
  const r = Math.min(1, Math.max(0, random()));
  return Math.max(0, Math.round(base * (1 - opts.jitter + opts.jitter * r)));
}

export interface PeerStatusHint {
  readonly term: number;
  readonly leader: NodeId | null;
}

export interface PeerTransportOptions {
  readonly selfId: NodeId;
  readonly clusterId: string;
  /** 'host:port' to listen on; port 0 picks a free port (see start()). */
  readonly listen: string;
  /** Peer id → 'host:port'. An entry for selfId is ignored, so the full `--peers` list may be passed. */
  readonly peers: ReadonlyMap<NodeId, string>;
  /** Called once per accepted frame with its messages (all addressed to selfId), in the sender's order. */
  readonly onMessages: (batch: Message[]) => void;
  readonly logger: Logger;
  /** Mutual TLS between replicas; plaintext when absent. */
  readonly tls?: PeerTlsOptions;
  /** Randomness for the reconnect jitter, in [0, 1). Default Math.random. */
  readonly random?: () => number;
  readonly backoff?: Partial<BackoffOptions>;
  /** Bytes of encoded frames queued per peer before the oldest are dropped. Default 64 MiB. */
  readonly maxQueueBytes?: number;
  /** Bytes handed to gRPC per peer and not yet flushed to the socket. Default 8 MiB. */
  readonly maxInflightBytes?: number;
  /** A stream not accepted within this time is abandoned and retried. Default 3000 ms. */
  readonly connectTimeoutMs?: number;
  /** HTTP/2 keepalive ping interval and timeout (dead-peer detection). Defaults 5000 / 3000 ms. */
  readonly keepaliveTimeMs?: number;
  readonly keepaliveTimeoutMs?: number;
  readonly limits?: Partial<PeerCodecLimits>;
  /**
   * The newest Raft command format this replica reads, declared to every peer (COMMAND_FORMAT_HEADER);
   * what each peer declared is in peerCommandFormat(). Default 1.
   */
  readonly commandFormat?: number;
  /** What Probe reports as term and leader hints. */
  readonly status?: () => PeerStatusHint;
  /** Where proto/raft-peer.proto is (found automatically by default). */
  readonly protoPath?: string;
  /**
   * A gRPC server the caller owns, to share one port with other services (the agents' lease service
   * listens on the same host:port as the peers). start() then only registers RaftPeer on it and
   * returns the port written in `listen`; the caller binds it (with the same TLS credentials, see
   * peerServerCredentials) and shuts it down. Create it with peerServerOptions() so frames up to the
   * frame limit are accepted.
   */
  readonly server?: grpc.Server;
}

/** gRPC server options the RaftPeer service needs (frame size, keepalive); merge them into a shared server's. */
export function peerServerOptions(
  opts: {
    readonly limits?: Partial<PeerCodecLimits>;
    readonly keepaliveTimeMs?: number;
    readonly keepaliveTimeoutMs?: number;
  } = {},
): grpc.ServerOptions {
  const maxFrameBytes = opts.limits?.maxFrameBytes ?? defaultPeerCodecLimits.maxFrameBytes;
  return {
    'grpc.max_receive_message_length': maxFrameBytes + 1024,
    'grpc.keepalive_time_ms': opts.keepaliveTimeMs ?? DEFAULT_KEEPALIVE_TIME_MS,
    'grpc.keepalive_timeout_ms': opts.keepaliveTimeoutMs ?? DEFAULT_KEEPALIVE_TIMEOUT_MS,
  };
}

/** Server credentials for the peer port: mutual TLS (client certificates required) or plaintext. */
export function peerServerCredentials(tls: PeerTlsOptions | undefined): grpc.ServerCredentials {
  return tls !== undefined
    ? grpc.ServerCredentials.createSsl(
        toBuffer(tls.ca),
        [{ cert_chain: toBuffer(tls.cert), private_key: toBuffer(tls.key) }],
        true,
      )
    : grpc.ServerCredentials.createInsecure();
}

export interface PeerLinkStats {
  readonly address: string;
  /** The outbound stream to this peer is open and accepted. */
  readonly connected: boolean;
  readonly framesSent: number;
  readonly messagesSent: number;
  readonly bytesSent: number;
  /** Outbound frames dropped from the queue (oldest first) or on removal. */
  readonly framesDropped: number;
  readonly messagesDropped: number;
  readonly queuedFrames: number;
  readonly queuedBytes: number;
  readonly inflightBytes: number;
  /** Stream (re)open attempts after the first. */
  readonly reconnects: number;
  /** Streams that reached the peer but were refused (cluster id or identity mismatch). */
  readonly refused: number;
  readonly framesReceived: number;
  readonly messagesReceived: number;
}

export interface PeerTransportStats {
  readonly framesSent: number;
  readonly messagesSent: number;
  readonly bytesSent: number;
  readonly framesReceived: number;
  readonly messagesReceived: number;
  readonly bytesReceived: number;
  /** Outbound: frames dropped from peer queues (bounded queue, removal, stop). */
  readonly framesDropped: number;
  /** Outbound: messages dropped (in dropped frames, to unknown peers or to self, unencodable or oversized). */
  readonly messagesDropped: number;
  /** Inbound frames that failed to decode or validate (dropped). */
  readonly malformedFrames: number;
  /** Inbound messages whose from/to did not match the stream's sender and this node (dropped). */
  readonly misaddressedMessages: number;
  /** Inbound streams refused (cluster id mismatch, missing or bad sender id). */
  readonly refusedStreams: number;
  readonly reconnects: number;
  /** onMessages threw. */
  readonly handlerErrors: number;
  readonly peers: Readonly<Record<NodeId, PeerLinkStats>>;
}

export interface ProbeResult {
  readonly nodeId: string;
  readonly clusterId: string;
  readonly termHint: number;
  readonly leaderHint: string | null;
}

interface QueuedFrame {
  readonly data: Uint8Array;
  readonly count: number;
}

interface InboundCounters {
  frames: number;
  messages: number;
}

interface LinkContext {
  readonly selfId: NodeId;
  readonly clusterId: string;
  readonly service: RaftPeerService;
  readonly credentials: grpc.ChannelCredentials;
  readonly channelOptions: grpc.ChannelOptions;
  readonly logger: Logger;
  readonly random: () => number;
  readonly backoff: BackoffOptions;
  readonly maxQueueBytes: number;
  readonly maxInflightBytes: number;
  readonly connectTimeoutMs: number;
  readonly throttle: LogThrottle;
  readonly commandFormat: number;
  /** Records the command format a peer declared (from its stream's headers, either direction). */
  readonly noteCommandFormat: (peer: NodeId, headers: grpc.Metadata) => void;
}

/** Logs a repeated warning at most once per window per key, with the number suppressed meanwhile. */
class LogThrottle {
  private readonly last = new Map<string, { at: number; suppressed: number }>();
  constructor(private readonly windowMs = 5000) {}

  warn(logger: Logger, key: string, obj: Record<string, unknown>, msg: string): void {
    const now = Date.now();
    const seen = this.last.get(key);
    if (seen !== undefined && now - seen.at < this.windowMs) {
      seen.suppressed++;
      return;
    }
    logger.warn({ ...obj, suppressed: seen?.suppressed ?? 0 }, msg);
    this.last.set(key, { at: now, suppressed: 0 });
    if (this.last.size > 1000) this.last.clear();
  }
}

function firstString(md: grpc.Metadata, key: string): string | undefined {
  const v = md.get(key)[0];
  return typeof v === 'string' ? v : undefined;
}

function toBuffer(v: Uint8Array | string): Buffer {
  return typeof v === 'string' ? Buffer.from(v) : Buffer.from(v.buffer, v.byteOffset, v.byteLength);
}

/** 'host:port', 'ip:port' or '[ipv6]:port' with a port in 0..65535. */
function isHostPort(address: string): boolean {
  const m = /^(\[[0-9a-fA-F:.]+\]|[^\s:[\]]+):(\d{1,5})$/.exec(address);
  return m !== null && Number(m[2]) <= 65535;
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** One outbound peer: its queue, its stream and the reconnect loop. */
class PeerLink {
  address: string;
  /** Frames waiting for the stream; slots before `head` are already taken (cleared to undefined). */
  private queue: (QueuedFrame | undefined)[] = [];
  private head = 0;
  private queueBytes = 0;
  private client: grpc.Client | null = null;
  private call: grpc.ClientWritableStream<FrameMessage> | null = null;
  /** Bumped for every stream opened or abandoned; callbacks of older streams are ignored. */
  private gen = 0;
  private connected = false;
  private everConnected = false;
  private inflightBytes = 0;
  private attempt = 0;
  private reconnectTimer: NodeJS.Timeout | null = null;
  private connectTimer: NodeJS.Timeout | null = null;
  private active = false;
  private closed = false;
  private readonly log: Logger;

  framesSent = 0;
  messagesSent = 0;
  bytesSent = 0;
  framesDropped = 0;
  messagesDropped = 0;
  reconnects = 0;
  refused = 0;

  constructor(
    readonly id: NodeId,
    address: string,
    private readonly ctx: LinkContext,
  ) {
    this.address = address;
    this.log = ctx.logger.child({ peer: id });
  }

  get isConnected(): boolean {
    return this.connected;
  }

  get queuedFrames(): number {
    return this.queue.length - this.head;
  }

  get queuedBytes(): number {
    return this.queueBytes;
  }

  get inflight(): number {
    return this.inflightBytes;
  }

  /** Begins connecting (the transport has started). */
  activate(): void {
    if (this.active || this.closed) return;
    this.active = true;
    this.open();
  }

  enqueue(data: Uint8Array, count: number): void {
    if (this.closed) {
      this.framesDropped++;
      this.messagesDropped += count;
      return;
    }
    this.queue.push({ data, count });
    this.queueBytes += data.byteLength;
    // Bounded in bytes, oldest first; the newest frame is always kept (frames are bounded on their own).
    while (this.queueBytes > this.ctx.maxQueueBytes && this.queuedFrames > 1) {
      const dropped = this.shift();
      this.framesDropped++;
      this.messagesDropped += dropped.count;
    }
    this.flush();
  }

  setAddress(address: string): void {
    if (address === this.address) return;
    this.log.info({ from: this.address, to: address }, 'peer address changed');
    this.address = address;
    this.abandon();
    this.attempt = 0;
    if (this.active && !this.closed) {
      this.clearReconnectTimer();
      this.open();
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.clearReconnectTimer();
    const call = this.call;
    const client = this.client;
    this.gen++;
    this.clearConnectTimer();
    this.call = null;
    this.client = null;
    this.connected = false;
    if (call !== null) {
      try {
        call.end();
      } catch {
        // already ended
      }
    }
    client?.close();
    this.framesDropped += this.queuedFrames;
    for (let i = this.head; i < this.queue.length; i++) this.messagesDropped += this.queue[i]?.count ?? 0;
    this.queue = [];
    this.head = 0;
    this.queueBytes = 0;
    this.inflightBytes = 0;
  }

  private shift(): QueuedFrame {
    const f = this.queue[this.head];
    if (f === undefined) throw new Error('PeerLink queue underflow');
    this.queue[this.head] = undefined;
    this.head++;
    this.queueBytes -= f.data.byteLength;
    if (this.head === this.queue.length) {
      this.queue = [];
      this.head = 0;
    } else if (this.head >= 1024 && this.head * 2 >= this.queue.length) {
      this.queue = this.queue.slice(this.head);
      this.head = 0;
    }
    return f;
  }

  private open(): void {
    if (this.closed || this.call !== null) return;
    const gen = ++this.gen;
    const { service, credentials, channelOptions } = this.ctx;
    const md = new grpc.Metadata();
    md.set(CLUSTER_ID_HEADER, this.ctx.clusterId);
    md.set(NODE_ID_HEADER, this.ctx.selfId);
    md.set(COMMAND_FORMAT_HEADER, String(this.ctx.commandFormat));
    let client: grpc.Client | undefined;
    let call: grpc.ClientWritableStream<FrameMessage>;
    try {
      client = new grpc.Client(this.address, credentials, channelOptions);
      call = client.makeClientStreamRequest<FrameMessage, StreamSummaryMessage>(
        service.stream.path,
        service.stream.requestSerialize,
        service.stream.responseDeserialize,
        md,
        {},
        (err) => this.onEnd(gen, err),
      );
    } catch (err) {
      client?.close();
      this.ctx.throttle.warn(
        this.log,
        `open:${this.id}`,
        { err: errorText(err), address: this.address },
        'could not open peer stream',
      );
      this.scheduleReconnect();
      return;
    }
    this.client = client;
    this.call = call;
    call.on('metadata', (headers: grpc.Metadata) => this.onEstablished(gen, headers));
    // Errors are reported through the call's callback; this only keeps a stray 'error' from throwing.
    call.on('error', (err: unknown) => this.log.debug({ err: errorText(err) }, 'peer stream error'));
    this.connectTimer = setTimeout(() => {
      this.connectTimer = null;
      if (gen !== this.gen || this.connected) return;
      this.log.debug(
        { address: this.address, timeoutMs: this.ctx.connectTimeoutMs },
        'peer stream not accepted in time',
      );
      call.cancel();
    }, this.ctx.connectTimeoutMs);
    this.connectTimer.unref();
  }

  private onEstablished(gen: number, headers: grpc.Metadata): void {
    if (gen !== this.gen || this.call === null) return;
    const peerCluster = firstString(headers, CLUSTER_ID_HEADER);
    const peerId = firstString(headers, NODE_ID_HEADER);
    if (peerCluster !== this.ctx.clusterId || peerId !== this.id) {
      this.refused++;
      this.ctx.throttle.warn(
        this.log,
        `identity:${this.id}`,
        {
          address: this.address,
          expected: { node: this.id, cluster: this.ctx.clusterId },
          found: { node: peerId ?? null, cluster: peerCluster ?? null },
        },
        'peer at this address is not the expected node of this cluster; retrying',
      );
      this.call.cancel();
      return;
    }
    this.ctx.noteCommandFormat(this.id, headers);
    this.clearConnectTimer();
    this.connected = true;
    this.attempt = 0;
    this.log.info({ address: this.address, reconnect: this.everConnected }, 'peer stream connected');
    this.everConnected = true;
    this.flush();
  }

  private onEnd(gen: number, err: grpc.ServiceError | null): void {
    if (gen !== this.gen) return;
    const wasConnected = this.connected;
    this.clearConnectTimer();
    this.connected = false;
    this.call = null;
    this.inflightBytes = 0;
    this.client?.close();
    this.client = null;
    this.gen++;
    if (this.closed) return;
    if (err !== null && err.code === grpc.status.PERMISSION_DENIED) {
      this.refused++;
      this.ctx.throttle.warn(
        this.log,
        `refused:${this.id}`,
        { address: this.address, details: err.details },
        'peer refused our stream',
      );
    } else if (wasConnected) {
      this.log.warn(
        { address: this.address, code: err?.code ?? 0, details: err?.details ?? 'ended' },
        'peer stream lost; reconnecting',
      );
    } else {
      this.log.debug(
        { address: this.address, code: err?.code ?? 0, details: err?.details ?? 'ended' },
        'peer stream attempt failed',
      );
      if (this.attempt >= 3) {
        this.ctx.throttle.warn(
          this.log,
          `unreachable:${this.id}`,
          { address: this.address, attempts: this.attempt, details: err?.details ?? 'ended' },
          'peer unreachable; retrying',
        );
      }
    }
    this.scheduleReconnect();
  }

  private scheduleReconnect(): void {
    if (this.closed || this.reconnectTimer !== null) return;
    const delay = backoffDelay(this.attempt, this.ctx.random, this.ctx.backoff);
    this.attempt = Math.min(this.attempt + 1, 30);
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      if (this.closed) return;
      this.reconnects++;
      this.open();
    }, delay);
    this.reconnectTimer.unref();
  }

  /** Abandons the current stream (if any) without scheduling a reconnect. */
  private abandon(): void {
    const call = this.call;
    const client = this.client;
    this.gen++;
    this.clearConnectTimer();
    this.call = null;
    this.client = null;
    this.connected = false;
    this.inflightBytes = 0;
    if (call !== null) call.cancel();
    client?.close();
  }

  private flush(): void {
    const call = this.call;
    if (!this.connected || call === null) return;
    const gen = this.gen;
    while (this.queuedFrames > 0 && this.inflightBytes < this.ctx.maxInflightBytes) {
      const f = this.shift();
      const size = f.data.byteLength;
      this.inflightBytes += size;
      this.framesSent++;
      this.messagesSent += f.count;
      this.bytesSent += size;
      try {
        call.write({ data: f.data }, () => {
          if (gen !== this.gen) return;
          this.inflightBytes -= size;
          this.flush();
        });
      } catch (err) {
        // The call ended under us; its status callback reconnects. The frame is lost (Raft retransmits).
        this.log.debug({ err: errorText(err) }, 'write on a closing peer stream');
        return;
      }
    }
  }

  private clearConnectTimer(): void {
    if (this.connectTimer !== null) {
      clearTimeout(this.connectTimer);
      this.connectTimer = null;
    }
  }

  private clearReconnectTimer(): void {
    if (this.reconnectTimer !== null) {
      clearTimeout(this.reconnectTimer);
      this.reconnectTimer = null;
    }
  }
}

/** An accepted inbound stream from one sender. */
interface InboundStream {
  readonly sender: NodeId;
  finish(err: Partial<grpc.StatusObject> | null): void;
}

export class PeerTransport {
  readonly selfId: NodeId;
  readonly clusterId: string;
  private readonly opts: PeerTransportOptions;
  private readonly log: Logger;
  private readonly service: RaftPeerService;
  private readonly limits: PeerCodecLimits;
  private readonly ctx: LinkContext;
  private readonly links = new Map<NodeId, PeerLink>();
  private readonly inbound = new Map<NodeId, InboundStream>();
  private readonly received = new Map<NodeId, InboundCounters>();
  private readonly throttle = new LogThrottle();
  /** The newest command format each peer declared, last heard (kept while it is down). */
  private readonly peerFormats = new Map<NodeId, number>();
  private server: grpc.Server | null = null;
  private started = false;
  private stopped = false;

  private bytesReceived = 0;
  private framesReceived = 0;
  private messagesReceived = 0;
  private malformedFrames = 0;
  private misaddressedMessages = 0;
  private refusedStreams = 0;
  private handlerErrors = 0;
  /** Messages dropped before reaching a link (unknown peer, self, encoding) and by removed links. */
  private unroutedMessages = 0;
  private retiredFramesDropped = 0;
  private retiredMessagesDropped = 0;
  private retired = { framesSent: 0, messagesSent: 0, bytesSent: 0, reconnects: 0 };

  constructor(opts: PeerTransportOptions) {
    if (opts.selfId.length === 0) throw new Error('PeerTransport: selfId must not be empty');
    if (opts.clusterId.length === 0) throw new Error('PeerTransport: clusterId must not be empty');
    if (!isHostPort(opts.listen))
      throw new TypeError(`PeerTransport: listen must be host:port, got ${JSON.stringify(opts.listen)}`);
    this.opts = opts;
    this.selfId = opts.selfId;
    this.clusterId = opts.clusterId;
    this.log = opts.logger.child({ component: 'peer-transport', node: opts.selfId });
    this.service = loadRaftPeerService(opts.protoPath);
    this.limits = { ...defaultPeerCodecLimits, ...opts.limits };
    const backoff: BackoffOptions = { ...defaultBackoff, ...opts.backoff };
    const keepaliveTimeMs = opts.keepaliveTimeMs ?? DEFAULT_KEEPALIVE_TIME_MS;
    const keepaliveTimeoutMs = opts.keepaliveTimeoutMs ?? DEFAULT_KEEPALIVE_TIMEOUT_MS;
    const channelOptions: grpc.ChannelOptions = {
      'grpc.max_send_message_length': this.limits.maxFrameBytes + 1024,
      'grpc.max_receive_message_length': 1 << 20,
      'grpc.keepalive_time_ms': keepaliveTimeMs,
      'grpc.keepalive_timeout_ms': keepaliveTimeoutMs,
      'grpc.keepalive_permit_without_calls': 1,
      // Our own loop reconnects; a fresh channel per attempt must not share a backed-off subchannel.
      'grpc.use_local_subchannel_pool': 1,
      'grpc.initial_reconnect_backoff_ms': backoff.initialMs,
      'grpc.max_reconnect_backoff_ms': backoff.maxMs,
      // Transparent retries would buffer written frames a second time; Raft retransmits instead.
      'grpc.enable_retries': 0,
      ...(opts.tls?.serverNameOverride !== undefined
        ? { 'grpc.ssl_target_name_override': opts.tls.serverNameOverride }
        : {}),
    };
    const credentials =
      opts.tls !== undefined
        ? grpc.credentials.createSsl(toBuffer(opts.tls.ca), toBuffer(opts.tls.key), toBuffer(opts.tls.cert))
        : grpc.credentials.createInsecure();
    this.ctx = {
      selfId: opts.selfId,
      clusterId: opts.clusterId,
      service: this.service,
      credentials,
      channelOptions,
      logger: this.log,
      random: opts.random ?? Math.random,
      backoff,
      maxQueueBytes: opts.maxQueueBytes ?? 64 * 1024 * 1024,
      maxInflightBytes: opts.maxInflightBytes ?? 8 * 1024 * 1024,
      connectTimeoutMs: opts.connectTimeoutMs ?? 3000,
      throttle: this.throttle,
      commandFormat: opts.commandFormat ?? 1,
      noteCommandFormat: (peer, headers) => this.noteCommandFormat(peer, headers),
    };
    this.setPeers(opts.peers);
  }

  /**
   * The newest Raft command format `peer` declared on its last stream (either direction): null if
   * it was never heard from, 1 if it declared none (a build from before the header).
   */
  peerCommandFormat(peer: NodeId): number | null {
    return this.peerFormats.get(peer) ?? null;
  }

  private noteCommandFormat(peer: NodeId, headers: grpc.Metadata): void {
    const v = firstString(headers, COMMAND_FORMAT_HEADER);
    const n = v !== undefined && /^[0-9]{1,6}$/.test(v) ? Number(v) : 1;
    if (this.peerFormats.get(peer) !== n) this.log.info({ peer, commandFormat: n }, 'peer declared its command format');
    this.peerFormats.set(peer, n);
  }

  /** Binds the server and starts connecting to every peer. Resolves with the bound port. */
  async start(): Promise<{ port: number }> {
    if (this.started) throw new Error('PeerTransport already started');
    if (this.stopped) throw new Error('PeerTransport was stopped');
    this.started = true;
    const handlers: grpc.UntypedServiceImplementation = {
      Stream: ((
        call: grpc.ServerReadableStream<FrameMessage, StreamSummaryMessage>,
        callback: grpc.sendUnaryData<StreamSummaryMessage>,
      ) => this.handleStream(call, callback)) as grpc.handleClientStreamingCall<FrameMessage, StreamSummaryMessage>,
      Probe: ((
        call: grpc.ServerUnaryCall<ProbeRequestMessage, ProbeResponseMessage>,
        callback: grpc.sendUnaryData<ProbeResponseMessage>,
      ) => this.handleProbe(call, callback)) as grpc.handleUnaryCall<ProbeRequestMessage, ProbeResponseMessage>,
    };
    const tls = this.opts.tls;
    let port: number;
    if (this.opts.server !== undefined) {
      this.opts.server.addService(this.service.definition, handlers);
      port = Number(/:(\d+)$/.exec(this.opts.listen)?.[1] ?? 0);
      this.log.info({ listen: this.opts.listen, sharedServer: true }, 'peer transport registered on a shared server');
      for (const link of this.links.values()) link.activate();
      return { port };
    }
    const server = new grpc.Server(peerServerOptions(this.opts));
    server.addService(this.service.definition, handlers);
    try {
      port = await new Promise<number>((resolve, reject) => {
        server.bindAsync(this.opts.listen, peerServerCredentials(tls), (err, p) =>
          err !== null ? reject(err) : resolve(p),
        );
      });
    } catch (err) {
      server.forceShutdown();
      this.started = false;
      throw new Error(`PeerTransport: cannot listen on ${this.opts.listen}: ${errorText(err)}`, { cause: err });
    }
    if (this.stopped) {
      server.forceShutdown(); // stop() was called while binding
      return { port };
    }
    this.server = server;
    this.log.info(
      {
        listen: this.opts.listen,
        port,
        tls: tls !== undefined,
        peers: Object.fromEntries([...this.links].map(([id, l]) => [id, l.address])),
      },
      'peer transport listening',
    );
    for (const link of this.links.values()) link.activate();
    return { port };
  }

  /**
   * Sends messages: grouped by destination, one frame per destination (split only if a batch would
   * exceed the frame limit), queued on that peer's stream. Never throws and never blocks.
   */
  send(messages: readonly Message[]): void {
    if (messages.length === 0) return;
    const groups = new Map<NodeId, Message[]>();
    for (const m of messages) {
      const g = groups.get(m.to);
      if (g === undefined) groups.set(m.to, [m]);
      else g.push(m);
    }
    for (const [to, batch] of groups) {
      const link = this.links.get(to);
      if (link === undefined || this.stopped) {
        this.unroutedMessages += batch.length;
        this.throttle.warn(
          this.log,
          `unrouted:${to}`,
          { to, messages: batch.length, stopped: this.stopped },
          'messages for an unknown peer dropped',
        );
        continue;
      }
      this.encodeInto(link, batch);
    }
  }

  /** Replaces the peer set (membership changes). Queues of peers kept are kept; removed peers' are dropped. */
  setPeers(peers: ReadonlyMap<NodeId, string>): void {
    if (this.stopped) return;
    const invalid = [...peers].filter(([id, address]) => id.length === 0 || !isHostPort(address));
    if (invalid.length > 0) {
      throw new TypeError(
        `PeerTransport.setPeers: invalid peers ${invalid.map(([id, a]) => `${id}=${a}`).join(', ')} ` +
          '(expected id=host:port)',
      );
    }
    for (const [id, link] of this.links) {
      if (!peers.has(id) || id === this.selfId) {
        link.close();
        this.retire(link);
        this.links.delete(id);
        this.log.info({ peer: id }, 'peer removed');
      }
    }
    for (const [id, address] of peers) {
      if (id === this.selfId) continue;
      const link = this.links.get(id);
      if (link !== undefined) {
        link.setAddress(address);
        continue;
      }
      const created = new PeerLink(id, address, this.ctx);
      this.links.set(id, created);
      if (this.started) {
        this.log.info({ peer: id, address }, 'peer added');
        created.activate();
      }
    }
  }

  /** Asks the replica at a peer's address who it is (identity, cluster, term hint). */
  async probe(peerId: NodeId, timeoutMs = 2000): Promise<ProbeResult> {
    const link = this.links.get(peerId);
    if (link === undefined) throw new Error(`unknown peer ${peerId}`);
    return probeAddress(link.address, {
      timeoutMs,
      credentials: this.ctx.credentials,
      channelOptions: this.ctx.channelOptions,
      from: { clusterId: this.clusterId, nodeId: this.selfId },
      ...(this.opts.protoPath !== undefined ? { protoPath: this.opts.protoPath } : {}),
    });
  }

  /** Closes every stream and the server. Queued frames are dropped. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    for (const link of this.links.values()) link.close();
    for (const s of [...this.inbound.values()])
      s.finish({ code: grpc.status.UNAVAILABLE, details: 'receiver stopping' });
    this.inbound.clear();
    const server = this.server;
    this.server = null;
    if (server !== null) {
      // Peer streams never end on their own: do not wait for them.
      server.forceShutdown();
    } else if (this.started && this.opts.server !== undefined) {
      this.opts.server.removeService(this.service.definition);
    }
    await new Promise<void>((resolve) => setImmediate(resolve));
    this.log.info('peer transport stopped');
  }

  stats(): PeerTransportStats {
    const peers: Record<NodeId, PeerLinkStats> = {};
    let framesSent = this.retired.framesSent;
    let messagesSent = this.retired.messagesSent;
    let bytesSent = this.retired.bytesSent;
    let framesDropped = this.retiredFramesDropped;
    let messagesDropped = this.retiredMessagesDropped + this.unroutedMessages;
    let reconnects = this.retired.reconnects;
    for (const [id, l] of this.links) {
      const rx = this.received.get(id);
      peers[id] = {
        address: l.address,
        connected: l.isConnected,
        framesSent: l.framesSent,
        messagesSent: l.messagesSent,
        bytesSent: l.bytesSent,
        framesDropped: l.framesDropped,
        messagesDropped: l.messagesDropped,
        queuedFrames: l.queuedFrames,
        queuedBytes: l.queuedBytes,
        inflightBytes: l.inflight,
        reconnects: l.reconnects,
        refused: l.refused,
        framesReceived: rx?.frames ?? 0,
        messagesReceived: rx?.messages ?? 0,
      };
      framesSent += l.framesSent;
      messagesSent += l.messagesSent;
      bytesSent += l.bytesSent;
      framesDropped += l.framesDropped;
      messagesDropped += l.messagesDropped;
      reconnects += l.reconnects;
    }
    return {
      framesSent,
      messagesSent,
      bytesSent,
      framesReceived: this.framesReceived,
      messagesReceived: this.messagesReceived,
      bytesReceived: this.bytesReceived,
      framesDropped,
      messagesDropped,
      malformedFrames: this.malformedFrames,
      misaddressedMessages: this.misaddressedMessages,
      refusedStreams: this.refusedStreams,
      reconnects,
      handlerErrors: this.handlerErrors,
      peers,
    };
  }

  // ---------------------------------------------------------------------------------------------

  private retire(link: PeerLink): void {
    this.retired.framesSent += link.framesSent;
    this.retired.messagesSent += link.messagesSent;
    this.retired.bytesSent += link.bytesSent;
    this.retired.reconnects += link.reconnects;
    this.retiredFramesDropped += link.framesDropped;
    this.retiredMessagesDropped += link.messagesDropped;
  }

  private encodeInto(link: PeerLink, batch: readonly Message[]): void {
    let frame: Uint8Array;
    try {
      frame = encodeFrame(batch);
    } catch (err) {
      this.unroutedMessages += batch.length;
      this.log.error(
        { peer: link.id, err: errorText(err), messages: batch.length },
        'could not encode messages; dropped',
      );
      return;
    }
    if (frame.byteLength <= this.limits.maxFrameBytes) {
      link.enqueue(frame, batch.length);
      return;
    }
    if (batch.length === 1) {
      this.unroutedMessages += 1;
      this.log.error(
        { peer: link.id, type: batch[0]?.type, bytes: frame.byteLength, limit: this.limits.maxFrameBytes },
        'message larger than the frame limit; dropped',
      );
      return;
    }
    const mid = batch.length >> 1;
    this.encodeInto(link, batch.slice(0, mid));
    this.encodeInto(link, batch.slice(mid));
  }

  private handleProbe(
    _call: grpc.ServerUnaryCall<ProbeRequestMessage, ProbeResponseMessage>,
    callback: grpc.sendUnaryData<ProbeResponseMessage>,
  ): void {
    let hint: PeerStatusHint = { term: 0, leader: null };
    try {
      if (this.opts.status !== undefined) hint = this.opts.status();
    } catch (err) {
      this.log.warn({ err: errorText(err) }, 'status hint failed');
    }
    callback(null, {
      nodeId: this.selfId,
      clusterId: this.clusterId,
      termHint: hint.term,
      leaderHint: hint.leader ?? '',
    });
  }

  private handleStream(
    call: grpc.ServerReadableStream<FrameMessage, StreamSummaryMessage>,
    callback: grpc.sendUnaryData<StreamSummaryMessage>,
  ): void {
    const cluster = firstString(call.metadata, CLUSTER_ID_HEADER);
    const sender = firstString(call.metadata, NODE_ID_HEADER);
    const refuse = (code: grpc.status, details: string): void => {
      this.refusedStreams++;
      this.throttle.warn(
        this.log,
        `refuse:${sender ?? '?'}:${code}`,
        { sender: sender ?? null, cluster: cluster ?? null, peer: call.getPeer(), details },
        'peer stream refused',
      );
      callback({ code, details });
    };
    if (this.stopped) {
      callback({ code: grpc.status.UNAVAILABLE, details: 'receiver stopping' });
      return;
    }
    if (cluster !== this.clusterId) {
      refuse(
        grpc.status.PERMISSION_DENIED,
        `cluster id mismatch: receiver ${this.selfId} belongs to cluster ${JSON.stringify(this.clusterId)}, ` +
          `sender sent ${JSON.stringify(cluster ?? null)}`,
      );
      return;
    }
    if (sender === undefined || sender.length === 0 || sender.length > this.limits.maxIdLength) {
      refuse(grpc.status.INVALID_ARGUMENT, 'missing or invalid sender node id');
      return;
    }
    if (sender === this.selfId) {
      refuse(grpc.status.FAILED_PRECONDITION, `sender claims this node's own id ${sender}`);
      return;
    }
    if (this.opts.tls !== undefined) {
      const names = certNames('replica', call.getAuthContext()?.sslPeerCertificate);
      if (!names.includes(sender)) {
        refuse(
          grpc.status.PERMISSION_DENIED,
          `sender declares id ${sender} but its certificate names ` +
            `${names.length === 0 ? 'no replica' : names.join(', ')}`,
        );
        return;
      }
    }

    let frames = 0;
    let messages = 0;
    let finished = false;
    const stream: InboundStream = {
      sender,
      finish: (err) => {
        if (finished) return;
        finished = true;
        if (this.inbound.get(sender) === stream) this.inbound.delete(sender);
        try {
          if (err !== null) callback(err);
          else callback(null, { framesReceived: frames, messagesReceived: messages });
        } catch {
          // the call is already gone
        }
      },
    };
    // A newer stream from the same sender replaces the older one (the sender reconnected).
    const previous = this.inbound.get(sender);
    this.inbound.set(sender, stream);
    previous?.finish({ code: grpc.status.ABORTED, details: 'superseded by a newer stream from the same sender' });

    const headers = new grpc.Metadata();
    headers.set(CLUSTER_ID_HEADER, this.clusterId);
    headers.set(NODE_ID_HEADER, this.selfId);
    headers.set(COMMAND_FORMAT_HEADER, String(this.ctx.commandFormat));
    call.sendMetadata(headers);
    this.noteCommandFormat(sender, call.metadata);

    call.on('data', (frame: FrameMessage) => {
      if (finished || this.stopped) return;
      frames++;
      messages += this.receiveFrame(sender, frame);
    });
    call.on('end', () => stream.finish(null));
    call.on('cancelled', () => {
      finished = true;
      if (this.inbound.get(sender) === stream) this.inbound.delete(sender);
    });
    call.on('error', (err: unknown) => {
      this.log.debug({ sender, err: errorText(err) }, 'inbound peer stream error');
      finished = true;
      if (this.inbound.get(sender) === stream) this.inbound.delete(sender);
    });
  }

  /** Decodes, validates and delivers one frame; returns the number of messages delivered. */
  private receiveFrame(sender: NodeId, frame: FrameMessage): number {
    this.framesReceived++;
    const data = frame.data;
    const size = data instanceof Uint8Array ? data.byteLength : 0;
    this.bytesReceived += size;
    const decoded = decodeFrame(data, this.limits);
    if (!decoded.ok) {
      this.malformedFrames++;
      this.throttle.warn(
        this.log,
        `malformed:${sender}`,
        { sender, bytes: size, error: decoded.error },
        'malformed peer frame dropped',
      );
      return 0;
    }
    let batch = decoded.messages;
    if (batch.some((m) => m.from !== sender || m.to !== this.selfId)) {
      const kept = batch.filter((m) => m.from === sender && m.to === this.selfId);
      this.misaddressedMessages += batch.length - kept.length;
      this.throttle.warn(
        this.log,
        `misaddressed:${sender}`,
        { sender, dropped: batch.length - kept.length },
        'peer messages with a wrong from/to dropped',
      );
      batch = kept;
    }
    if (batch.length === 0) return 0;
    let rx = this.received.get(sender);
    if (rx === undefined) {
      rx = { frames: 0, messages: 0 };
      this.received.set(sender, rx);
    }
    rx.frames++;
    rx.messages += batch.length;
    this.messagesReceived += batch.length;
    try {
      this.opts.onMessages(batch);
    } catch (err) {
      this.handlerErrors++;
      this.log.error({ sender, err: errorText(err) }, 'onMessages threw; batch lost');
    }
    return batch.length;
  }
}

export interface ProbeOptions {
  readonly timeoutMs?: number;
  /** Plaintext by default. */
  readonly credentials?: grpc.ChannelCredentials;
  readonly channelOptions?: grpc.ChannelOptions;
  /** Who is asking (informational). */
  readonly from?: { readonly clusterId: string; readonly nodeId: string };
  readonly protoPath?: string;
}

/** Probes the coordinator replica at `address` ('host:port'): its node id, cluster id and term hint. */
export async function probeAddress(address: string, opts: ProbeOptions = {}): Promise<ProbeResult> {
  const service = loadRaftPeerService(opts.protoPath);
  const client = new grpc.Client(address, opts.credentials ?? grpc.credentials.createInsecure(), {
    'grpc.use_local_subchannel_pool': 1,
    ...opts.channelOptions,
  });
  try {
    const res = await new Promise<ProbeResponseMessage>((resolve, reject) => {
      client.makeUnaryRequest<ProbeRequestMessage, ProbeResponseMessage>(
        service.probe.path,
        service.probe.requestSerialize,
        service.probe.responseDeserialize,
        { clusterId: opts.from?.clusterId ?? '', nodeId: opts.from?.nodeId ?? '' },
        new grpc.Metadata(),
        { deadline: Date.now() + (opts.timeoutMs ?? 2000) },
        (err, value) =>
          err !== null || value === undefined ? reject(err ?? new Error('empty probe response')) : resolve(value),
      );
    });
    return {
      nodeId: res.nodeId,
      clusterId: res.clusterId,
      termHint: Number(res.termHint),
      leaderHint: res.leaderHint === '' ? null : res.leaderHint,
    };
  } finally {
    client.close();
  }
}
