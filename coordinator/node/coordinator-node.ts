// One coordinator replica: the Raft core driven over durable storage (an append-only log beside
// LevelDB) and the gRPC peer transport, applying the replicated quota ledger. It is what
// `cellquota coordinator` runs and what the admin API talks to.
//
// A data directory that is new (or whose identity was never confirmed) may belong to a node that
// lost its disk: such a node must not vote as if it remembered its votes. At start it asks its
// peers which incarnation the cluster committed for it, and trusts only answers that reflect the
// committed record: a linearizable read (a peer's ReadIndex barrier through the leader), or, in a
// cluster that never elected a leader, enough peers still at the founding term that no majority can
// ever have existed. A stale "unknown" from a peer that has not applied the record yet (right after
// a full-cluster restart) is never taken for "new". Recorded elsewhere: the node keeps refusing to
// vote and logs the command that re-adds it.
//
// A log whose tail above the commit index was found corrupt and truncated at open (storage's vote
// barrier) may have lost entries this node acknowledged: it votes only once its commit index,
// learned from a leader, has reached the barrier (protocol-aware recovery).
//
// A failed persist (disk full, failed fsync) is fatal, by design a crash-stop: the driver has
// already refused to send, apply or acknowledge anything of the Ready it could not persist; the
// node then logs one fatal line naming the data directory and the errno, fails /healthz and
// /readyz, stops its lease rounds and tells its owner (settings.onFatal), which exits the process.
// Restarted, the node recovers from what is durable (RaftStorage.open truncates a corrupt tail
// above the commit index, with a vote barrier, and refuses, with StorageCorruptionError, anything
// worse).
import { bootstrapEntry, RaftNode, type ConfChange, type NodeId, type RaftConfig } from '../raft/index.js';
import { RaftStorage } from '../storage/index.js';
import * as grpc from '@grpc/grpc-js';
import {
  PeerTransport,
  peerServerCredentials,
  peerServerOptions,
  type PeerTlsOptions,
} from '../transport/peer-transport.js';
import { LeaseService, type LeaseServiceOptions, type LeaseServiceStats } from '../lease/lease-service.js';
import { createLeaseAuthenticator, type TokenFile } from '../lease/lease-auth.js';
import type { Ledger, LedgerResult } from '../ledger/ledger.js';
import {
  encodeCommand,
  NEWEST_COMMAND_FORMAT,
  ROUND_FORMAT_VERSION,
  type LedgerCommandInput,
} from '../ledger/ledger-commands.js';
import { RaftDriver, RaftPersistError } from './raft-driver.js';
import { CoordinatorState, encodeMemberRecord, type CoordinatorResult } from './coordinator-state.js';
import type { Logger } from '../../shared/logging.js';
import type { CoordinatorMetrics } from './coordinator-metrics.js';
import { watchEventLoop, type LoopWatch } from './loop-watch.js';

/** An event-loop stall at least this long is logged (half the default election timeout's minimum). */
const LOOP_STALL_WARN_MS = 250;

export interface CoordinatorSettings {
  readonly id: NodeId;
  readonly clusterId: string;
  /** Every voting member's peer address (host:port), this node included. */
  readonly peers: ReadonlyMap<NodeId, string>;
  readonly dataDir: string;
  readonly tickMs: number;
  readonly electionTicks: number;
  readonly heartbeatTicks: number;
  readonly snapshotEveryEntries: number;
  readonly snapshotTrailingEntries: number;
  readonly requestTimeoutMs: number;
  /** Expected number of cells, for the ledger's floors. */
  readonly floorCells: number;
  /**
   * The newest command format this replica declares to its peers and applies (--command-format; default
   * NEWEST_COMMAND_FORMAT). Lower, it holds the cluster's format raise back, as a replica of an older build would.
   */
  readonly commandFormat?: number;
  readonly skewMarginMs: number;
  /** Join an existing cluster as a new (learner) member instead of bootstrapping one. */
  readonly join: boolean;
  /** The admin API base URL of each member (to ask peers about incarnations), null if unknown. */
  readonly adminUrlOf: (id: NodeId) => string | null;
  /** The admin API's bearer token, for this replica's own calls to its peers' admin APIs. */
  readonly adminToken?: string;
  readonly tls?: PeerTlsOptions;
  /** The agents' lease service (cellquota.lease.v1.QuotaLease): on the peer port, or on `listen`. */
  readonly lease?: {
    readonly ttlMs?: number;
    readonly roundMs?: number;
    readonly expireEveryMs?: number;
    readonly onReport?: LeaseServiceOptions['onReport'];
    /** host:port of a gRPC server of its own for the lease service (absent: the peer port). */
    readonly listen?: string;
    /** Each member's lease address (named to agents that reached a follower); default: the peer address. */
    readonly addressOf?: (id: NodeId) => string | null;
    /** Per-cell bearer tokens. With TLS they need `listen` (the peer port requires certificates). */
    readonly tokens?: TokenFile;
    readonly maxCells?: number;
    readonly maxDemandKeys?: number;
    readonly maxImplicitTenants?: number;
    readonly implicitTenantIdleMs?: number;
    readonly onRefused?: LeaseServiceOptions['onRefused'];
  };
  /**
   * Called once when the node stops for good (see CoordinatorFailure), after it logged the fatal
   * line. The owner must end the process: the node serves nothing correct any more.
   */
  readonly onFatal?: (failure: CoordinatorFailure) => void;
}

/** Why a running node stopped for good. */
export interface CoordinatorFailure {
  /** 'storage': a write or sync of the data directory failed; 'internal': stepping or applying threw. */
  readonly kind: 'storage' | 'internal';
  readonly error: Error;
  readonly dataDir: string;
  /** The errno of the failed I/O when known (ENOSPC, EIO, ...). */
  readonly errno: string | null;
}

// strerror(3) texts LevelDB puts in its IOError messages ("IO error: <file>: <strerror>").
const errnoOfStrerror: Readonly<Record<string, string>> = {
  'No space left on device': 'ENOSPC',
  'Input/output error': 'EIO',
  'Disk quota exceeded': 'EDQUOT',
  'Read-only file system': 'EROFS',
  'File too large': 'EFBIG',
  'Permission denied': 'EACCES',
  'Too many open files': 'EMFILE',
  'No such file or directory': 'ENOENT',
};

/**
 * The errno behind a storage error: a Node `code` like ENOSPC, or LevelDB's strerror text, anywhere in the cause
 * chain.
 */
export function storageErrno(err: unknown): string | null {
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && /^E[A-Z0-9]+$/.test(code)) return code;
    const m = /IO error: .*: ([^:]+)$/.exec(e.message);
    const known = m?.[1] === undefined ? undefined : errnoOfStrerror[m[1].trim()];
    if (known !== undefined) return known;
  }
  return null;
}

export interface MemberView {
  readonly id: NodeId;
  readonly address: string | null;
  readonly role: 'leader' | 'follower' | 'candidate' | 'learner' | 'removed';
  readonly voter: boolean;
  readonly match: number | null;
  readonly reachable: boolean | null;
  /** The newest command format the member declared it reads (this replica's own for itself; null: not heard from). */
  readonly commandFormat: number | null;
}

export interface ClusterView {
  readonly id: NodeId;
  readonly clusterId: string;
  readonly leader: NodeId | null;
  readonly term: number;
  readonly commitIndex: number;
  readonly appliedIndex: number;
  readonly role: string;
  readonly votingRefused: boolean;
  /**
   * The command format this replica's log is raised to (the semantics its entries apply at) and the index of the
   * entry that raised it (0: never raised).
   */
  readonly commandFormat: { readonly log: number; readonly raisedAtIndex: number };
  readonly members: MemberView[];
}

/** Why a replica does not vote yet; it votes once there is none. */
type VoteHold = 'identity' | 'log-repair';

export class CoordinatorNode {
  private votingRefused = false;
  private readonly voteHolds = new Set<VoteHold>();
  private stopped = false;
  private fatal: CoordinatorFailure | null = null;
  private addresses: Map<NodeId, string>;
  private lease: LeaseService | null = null;

  /** The lease service's counters (null before it is registered). */
  leaseStats(): Readonly<LeaseServiceStats> | null {
    return this.lease?.stats ?? null;
  }
  private server: grpc.Server | null = null;
  private loopWatch: LoopWatch | null = null;
  private leaseServer: grpc.Server | null = null;
  private leasePort: number | null = null;

  private constructor(
    readonly settings: CoordinatorSettings,
    private readonly logger: Logger,
    private readonly storage: RaftStorage,
    private readonly transport: PeerTransport,
    private readonly driver: RaftDriver<CoordinatorResult>,
    private readonly machine: CoordinatorState,
    readonly incarnation: string,
    private readonly metrics: CoordinatorMetrics | null,
  ) {
    this.addresses = new Map(settings.peers);
  }

  static async start(
    settings: CoordinatorSettings,
    logger: Logger,
    metrics?: CoordinatorMetrics,
  ): Promise<CoordinatorNode> {
    const log = logger.child({ component: 'coordinator', node: settings.id });
    if (settings.lease?.tokens !== undefined && settings.tls !== undefined && settings.lease.listen === undefined) {
      throw new Error(
        'coordinator: lease tokens with TLS need the lease service on its own address (--lease-listen): the ' +
          'peer port requires replica certificates',
      );
    }
    const loopWatch = watchEventLoop(LOOP_STALL_WARN_MS, (ms) =>
      log.warn({ ms: Math.round(ms) }, 'event loop blocked: this replica sent nothing meanwhile'),
    );
    const storage = await RaftStorage.open(settings.dataDir, {
      nodeId: settings.id,
      clusterId: settings.clusterId,
      // Every data dir starts with no configuration; founders then write the bootstrap entry.
      bootstrap: { conf: { voters: [], learners: [] }, data: new Uint8Array(0) },
      logger: { warn: (fields, msg) => log.warn(fields, msg) },
      onSync: (ms, bytes) => {
        metrics?.fsyncSeconds.observe(ms / 1000);
        if (ms > 100) {
          // Measured from JavaScript: a stall of the event loop meanwhile counts as fsync time.
          const now = performance.now();
          const loopBlockedMs = Math.round(loopWatch.blockedDuring(now - ms, now));
          log.warn({ ms, bytes, loopBlockedMs }, 'slow fsync');
        }
      },
    });
    let loaded = await storage.load();
    if (
      !settings.join &&
      loaded.hardState.term === 0 &&
      loaded.entries.length === 0 &&
      loaded.snapshot.meta.index === 0
    ) {
      // A founding member: the identical committed entry 1 lists the initial voters.
      await storage.save({
        hardState: { term: 1, vote: null, commit: 1 },
        entries: [bootstrapEntry([...settings.peers.keys()])],
        snapshot: null,
        mustSync: true,
      });
      loaded = await storage.load();
    }
    for (const r of loaded.meta.repairs)
      log.warn(
        { repair: r, voteBarrier: loaded.meta.voteBarrier },
        'storage truncated a corrupt log tail above the commit index',
      );
    const machine = new CoordinatorState({
      floorCells: settings.floorCells,
      skewMarginMs: settings.skewMarginMs,
      maxCommandFormat: settings.commandFormat ?? NEWEST_COMMAND_FORMAT,
    });
    const restoreStarted = performance.now();
    machine.restore(loaded.snapshot.data);
    if (loaded.snapshot.meta.index > 0)
      log.info(
        {
          index: loaded.snapshot.meta.index,
          bytes: loaded.snapshot.data.byteLength,
          ms: Math.round(performance.now() - restoreStarted),
        },
        'restored the snapshot at start',
      );

    let nodeRef: CoordinatorNode | null = null;
    // One gRPC server on the peer address: the Raft peers' service and the agents' lease service.
    const server = new grpc.Server(peerServerOptions());
    const listen = settings.peers.get(settings.id) ?? '127.0.0.1:0';
    const transport = new PeerTransport({
      server,
      selfId: settings.id,
      clusterId: settings.clusterId,
      listen,
      peers: settings.peers,
      onMessages: (batch) => nodeRef?.driver.receive(batch),
      commandFormat: settings.commandFormat ?? NEWEST_COMMAND_FORMAT,
      logger: log.child({ component: 'transport' }),
      status: () => {
        const s = nodeRef?.driver.status();
        return { term: s?.term ?? 0, leader: s?.leader ?? null };
      },
      ...(settings.tls === undefined ? {} : { tls: settings.tls }),
    });
    await transport.start();

    // A data directory the cluster may not know yet votes only once the peers confirm it is not a
    // wiped one (checked in the background once everything, the admin API included, is up).
    const mustCheck = !loaded.meta.incarnationConfirmed && !settings.join;
    const voteBarrier = loaded.meta.voteBarrier;
    const refuseToVote = mustCheck || voteBarrier > 0;
    if (!mustCheck && !loaded.meta.incarnationConfirmed) await storage.confirmIncarnation();

    const raftConfig: RaftConfig = {
      id: settings.id,
      electionTicks: settings.electionTicks,
      heartbeatTicks: settings.heartbeatTicks,
      randomInt: (n) => Math.floor(Math.random() * n),
      preVote: true,
      checkQuorum: true,
      maxAppendBytes: 1 << 20,
      maxInflightAppends: 16,
      maxUncommittedBytes: 64 << 20,
      snapshotChunkBytes: 512 << 10,
      // 8 chunks (4 MiB) in flight: a 19 MB snapshot (1,000,000 tenants) streams in a few windows.
      maxInflightSnapshotChunks: 8,
      refuseToVote,
    };
    const raft = new RaftNode(raftConfig, loaded);
    const driver = new RaftDriver<CoordinatorResult>({
      raft,
      storage,
      outbox: transport,
      stateMachine: machine,
      appliedIndex: loaded.snapshot.meta.index,
      tickMs: settings.tickMs,
      snapshotEveryEntries: settings.snapshotEveryEntries,
      snapshotTrailingEntries: settings.snapshotTrailingEntries,
      requestTimeoutMs: settings.requestTimeoutMs,
      onLeaderChange: (leader, term) => {
        metrics?.leaderChanges.inc();
        log.info({ leader, term }, leader === null ? 'no leader' : `leader is ${leader}`);
      },
      onSnapshotTaken: (index, bytes, ms, stall) =>
        log.info(
          {
            index,
            bytes,
            ms: Math.round(ms),
            encodeMs: Math.round(stall.encodeMs),
            loopMaxMs: Math.round(stall.loopMaxMs),
          },
          'snapshot taken, log compacted',
        ),
      onSnapshotProgress: (index, received, total) =>
        log.info(
          {
            index,
            receivedBytes: received,
            totalBytes: total,
            percent: total === 0 ? 100 : Math.floor((received / total) * 100),
          },
          'receiving a snapshot from the leader',
        ),
      onSnapshotInstalled: (index, term, bytes, restoreMs) => {
        metrics?.snapshotsInstalled.inc();
        log.info({ index, term, bytes, ms: Math.round(restoreMs) }, 'installed a snapshot from the leader');
      },
      onError: (err) => nodeRef?.fail(err),
    });
    const node = new CoordinatorNode(
      settings,
      log,
      storage,
      transport,
      driver,
      machine,
      loaded.meta.incarnation,
      metrics ?? null,
    );
    node.votingRefused = refuseToVote;
    if (mustCheck) node.voteHolds.add('identity');
    if (voteBarrier > 0) node.voteHolds.add('log-repair');
    nodeRef = node;
    node.loopWatch = loopWatch;
    node.server = server;
    const leaseOpts = settings.lease;
    // Certificates identify the cells when TLS is on and no tokens are taken (then the lease port
    // requires client certificates, as the peer port does).
    const auth = createLeaseAuthenticator({
      certificates: settings.tls !== undefined && leaseOpts?.tokens === undefined,
      ...(leaseOpts?.tokens === undefined ? {} : { tokens: leaseOpts.tokens }),
    });
    if (auth === null)
      log.warn(
        'the lease service authenticates no one (no TLS, no --lease-tokens): ' +
          'anyone who reaches it can report for any cell',
      );
    else log.info({ auth: auth.describe() }, 'the lease service takes a report for a cell only from that cell');
    const lease = new LeaseService({
      backend: node,
      logger: log.child({ component: 'lease' }),
      auth,
      ...(leaseOpts?.addressOf === undefined ? {} : { leaseAddressOf: leaseOpts.addressOf }),
      ...(leaseOpts?.maxCells === undefined ? {} : { maxCells: leaseOpts.maxCells }),
      ...(leaseOpts?.maxDemandKeys === undefined ? {} : { maxDemandKeys: leaseOpts.maxDemandKeys }),
      ...(leaseOpts?.maxImplicitTenants === undefined ? {} : { maxImplicitTenants: leaseOpts.maxImplicitTenants }),
      ...(leaseOpts?.implicitTenantIdleMs === undefined
        ? {}
        : { implicitTenantIdleMs: leaseOpts.implicitTenantIdleMs }),
      ...(leaseOpts?.onRefused === undefined ? {} : { onRefused: leaseOpts.onRefused }),
      ...(settings.lease?.ttlMs === undefined ? {} : { leaseTtlMs: settings.lease.ttlMs }),
      ...(settings.lease?.roundMs === undefined ? {} : { roundMs: settings.lease.roundMs }),
      ...(settings.lease?.expireEveryMs === undefined ? {} : { expireEveryMs: settings.lease.expireEveryMs }),
      ...(settings.lease?.onReport === undefined ? {} : { onReport: settings.lease.onReport }),
    });
    const leaseServer =
      leaseOpts?.listen === undefined ? server : new grpc.Server({ 'grpc.max_receive_message_length': 64 << 20 });
    lease.register(leaseServer);
    node.lease = lease;
    let bindingWhat = listen;
    try {
      await new Promise<number>((resolveBind, rejectBind) => {
        server.bindAsync(listen, peerServerCredentials(settings.tls), (err, p) =>
          err !== null ? rejectBind(err) : resolveBind(p),
        );
      });
      if (leaseOpts?.listen !== undefined) {
        bindingWhat = leaseOpts.listen;
        const creds = leaseServerCredentials(settings.tls, leaseOpts.tokens === undefined);
        node.leasePort = await new Promise<number>((resolveBind, rejectBind) => {
          leaseServer.bindAsync(bindingWhat, creds, (err, p) => (err !== null ? rejectBind(err) : resolveBind(p)));
        });
        node.leaseServer = leaseServer;
        log.info(
          { leaseListen: leaseOpts.listen, port: node.leasePort, tls: settings.tls !== undefined },
          'lease service listening on its own address',
        );
      }
    } catch (err) {
      lease.stop();
      await transport.stop();
      server.forceShutdown();
      if (leaseServer !== server) leaseServer.forceShutdown();
      await storage.close();
      throw new Error(
        `coordinator: cannot listen on ${bindingWhat}: ${err instanceof Error ? err.message : String(err)}`,
        { cause: err },
      );
    }
    driver.start();
    // Background tasks: a storage failure in them (confirmIncarnation) is fatal like one in the
    // driver, and is handled here explicitly rather than left to an unhandled rejection.
    const background = [
      mustCheck ? node.confirmIdentity() : node.ensureIncarnationRecorded(),
      node.raiseCommandFormatWhenRead(),
    ];
    if (voteBarrier > 0) background.push(node.catchUpPastVoteBarrier(voteBarrier));
    for (const task of background) {
      task.catch((err: unknown) => {
        if (!node.stopped) node.fail(err instanceof Error ? err : new Error(String(err)));
      });
    }
    log.info(
      {
        peers: Object.fromEntries(settings.peers),
        dataDir: settings.dataDir,
        snapshotIndex: loaded.snapshot.meta.index,
        term: loaded.hardState.term,
      },
      'coordinator started',
    );
    return node;
  }

  /**
   * Asks the peers (admin API) which incarnation the cluster committed for this id. Another one than
   * ours: the data directory was wiped, so the node must not vote. Only answers that reflect the
   * committed record count (see the header): a linearizable read on any peer, or enough peers
   * still at the founding term (1) that no leader, hence no record and no vote of ours that
   * mattered, can ever have existed. Retries until one of the two is had.
   */
  private static async checkIncarnation(
    settings: CoordinatorSettings,
    mine: string,
    log: Logger,
    stopped: () => boolean,
  ): Promise<{ verdict: 'new' | 'same' | 'wiped'; basis: string }> {
    const others = [...settings.peers.keys()].filter((p) => p !== settings.id && settings.adminUrlOf(p) !== null);
    const voters = settings.peers.size;
    // Peers that never saw an election: with this many, at most a minority (us included) ever had a term above 1.
    const neededAtFoundingTerm = voters - (Math.floor(voters / 2) + 1) + 1;
    const headers = authHeader(settings.adminToken);
    // Seen at term 1 since this process started, hence after the old directory (if any) was gone: a
    // term only grows, so each sighting stays true of everything before it.
    const atFoundingTerm = new Set<NodeId>();
    for (let attempt = 0; !stopped(); attempt++) {
      for (const peer of others) {
        const url = settings.adminUrlOf(peer) ?? '';
        if (!atFoundingTerm.has(peer)) {
          try {
            const res = await fetch(`${url}/v1/cluster?stale=true`, { headers, signal: AbortSignal.timeout(1000) });
            if (res.ok && ((await res.json()) as { term?: number }).term === 1) atFoundingTerm.add(peer);
          } catch {
            // not reachable yet
          }
        }
        if (atFoundingTerm.size >= neededAtFoundingTerm) break;
        try {
          const res = await fetch(`${url}/v1/internal/incarnations`, { headers, signal: AbortSignal.timeout(2000) });
          if (res.ok) {
            const body = (await res.json()) as { incarnations?: Record<string, string> };
            const recorded = body.incarnations?.[settings.id];
            const basis = `linearizable read on ${peer}`;
            if (recorded === undefined) return { verdict: 'new', basis };
            if (recorded === mine) return { verdict: 'same', basis };
            log.error(
              { recordedIncarnation: recorded, incarnation: mine, peer, basis },
              `data directory ${settings.dataDir} is not the one the cluster knows for ${settings.id} (it was ` +
                'wiped or replaced): this node must not vote. ' +
                (`Re-add it: cellquota ctl members replace ${settings.id} --address ` +
                  `${settings.peers.get(settings.id) ?? 'HOST:PORT'}, then restart it with --join and an empty ` +
                  'data directory'),
            );
            return { verdict: 'wiped', basis };
          }
        } catch {
          // not reachable, or no leader to confirm the read yet
        }
      }
      if (others.length === 0 || atFoundingTerm.size >= neededAtFoundingTerm) {
        return {
          verdict: 'new',
          basis:
            `${atFoundingTerm.size} of ${voters} voters (${[...atFoundingTerm].join(', ') || 'none'}) never saw ` +
            'an election: the cluster never had a leader',
        };
      }
      if (attempt % 25 === 0) {
        log.info(
          { atFoundingTerm: [...atFoundingTerm] },
          'unconfirmed data directory: waiting for a linearizable answer from a peer (a leader) before voting; ' +
            'stale answers are not trusted',
        );
      }
      await new Promise((r) => setTimeout(r, 200));
    }
    return { verdict: 'new', basis: 'stopped' };
  }

  /** Asks the peers whether this data directory is the one they know; votes only if so (or if none is known). */
  private async confirmIdentity(): Promise<void> {
    const { verdict, basis } = await CoordinatorNode.checkIncarnation(
      this.settings,
      this.incarnation,
      this.logger,
      () => this.halted(),
    );
    if (this.halted() || verdict === 'wiped') return;
    await this.storage.confirmIncarnation().catch((err: unknown) => {
      throw new RaftPersistError('confirm-incarnation', err);
    });
    this.logger.info(
      { incarnation: this.incarnation, verdict, basis },
      `data directory confirmed (${verdict}, by ${basis})`,
    );
    await this.releaseVoteHold('identity');
    await this.ensureIncarnationRecorded();
  }

  /**
   * After a repair truncated entries up to `barrier` that this node may have acknowledged: waits
   * until the commit index a leader gave it has reached the barrier (its log holds every entry it
   * may have acknowledged again), lifts the barrier durably, then may vote.
   */
  private async catchUpPastVoteBarrier(barrier: number): Promise<void> {
    this.logger.warn(
      { voteBarrier: barrier, commit: this.driver.status().commit },
      `log repaired: not voting until the commit index reaches ${barrier} ` +
        '(entries this node may have acknowledged were lost)',
    );
    while (!this.halted() && this.driver.status().commit < barrier) await new Promise((r) => setTimeout(r, 100));
    if (this.halted()) return;
    const commit = this.driver.status().commit;
    await this.storage.clearVoteBarrier(commit).catch((err: unknown) => {
      throw new RaftPersistError('clear-vote-barrier', err);
    });
    this.logger.info(
      { voteBarrier: barrier, commit },
      `caught up past the repaired log (commit ${commit} >= ${barrier})`,
    );
    await this.releaseVoteHold('log-repair');
  }

  /** Drops one reason not to vote; the node votes once none is left. */
  private async releaseVoteHold(hold: VoteHold): Promise<void> {
    this.voteHolds.delete(hold);
    if (this.voteHolds.size > 0 || !this.votingRefused) return;
    await this.driver.setVoting(true);
    this.votingRefused = false;
    this.logger.info({ released: hold }, 'voting');
  }

  /**
   * On the leader: proposes raiseCommandFormat to this replica's format once the log is below it and every member of
   * the configuration declared it reads it (everyMemberReads). Until then entries apply at the log's format; a member
   * of an older build (or pinned lower) holds it back. Polls: members connect and declare in their own time.
   */
  private async raiseCommandFormatWhenRead(): Promise<void> {
    const format = this.settings.commandFormat ?? NEWEST_COMMAND_FORMAT;
    let waitingLogged = false;
    while (!this.halted()) {
      const ledger = this.machine.ledger;
      // Logged again by a leader elected anew: the line says which leader waits.
      if (ledger.commandFormat >= format || !this.isLeader()) waitingLogged = false;
      else if (this.isLeader() && this.everyMemberReads(format)) {
        const from = ledger.commandFormat;
        try {
          const r = await this.propose({ type: 'raiseCommandFormat', format });
          if (r.ok) this.logger.info({ commandFormat: format, from }, 'command format raised');
        } catch (err) {
          this.logger.debug({ err }, 'raising the command format failed; retrying');
        }
      } else if (this.isLeader() && !waitingLogged) {
        waitingLogged = true;
        this.logger.info(
          { commandFormat: ledger.commandFormat, target: format },
          'the command format is raised once every member declared it reads it',
        );
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }

  /** Until the cluster has recorded this node's incarnation, asks the leader to record it. */
  private async ensureIncarnationRecorded(): Promise<void> {
    while (!this.halted()) {
      if (this.machine.incarnationOf(this.settings.id) === this.incarnation) return;
      const leader = this.driver.status().leader;
      try {
        if (leader === this.settings.id) {
          await this.recordIncarnation(this.settings.id, this.incarnation);
        } else if (leader !== null) {
          const url = this.settings.adminUrlOf(leader);
          if (url !== null) {
            await fetch(`${url}/v1/internal/incarnations/${this.settings.id}`, {
              method: 'PUT',
              headers: { 'content-type': 'application/json', ...authHeader(this.settings.adminToken) },
              body: JSON.stringify({ incarnation: this.incarnation }),
              signal: AbortSignal.timeout(3000),
            });
          }
        }
      } catch (err) {
        this.logger.debug({ err }, 'recording the incarnation failed; retrying');
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }

  ledger(): Ledger {
    return this.machine.ledger;
  }

  /** Proposes a ledger command and resolves with its result once applied here. */
  async propose(cmd: LedgerCommandInput): Promise<LedgerResult> {
    const end = this.metrics?.proposalSeconds.startTimer();
    try {
      const compactRounds = cmd.type === 'reportAndGrant' && this.everyMemberReads(ROUND_FORMAT_VERSION);
      const r = (await this.driver.propose(encodeCommand(cmd, { compactRounds }))) as LedgerResult;
      this.metrics?.proposals.inc({ result: r.ok ? 'ok' : 'error' });
      return r;
    } catch (err) {
      this.metrics?.proposals.inc({
        result: (err as { code?: string }).code === 'NOT_LEADER' ? 'not_leader' : 'failed',
      });
      throw err;
    } finally {
      end?.();
    }
  }

  /**
   * Whether this replica and every other member (voters and learners) declared, on its last peer stream, that it
   * reads command format `format`. A member never heard from counts as not reading it.
   */
  everyMemberReads(format: number): boolean {
    if (format > (this.settings.commandFormat ?? NEWEST_COMMAND_FORMAT)) return false;
    const conf = this.driver.status().conf;
    for (const id of [...conf.voters, ...conf.learners]) {
      if (id === this.settings.id) continue;
      if ((this.transport.peerCommandFormat(id) ?? 0) < format) return false;
    }
    return true;
  }

  /** The incarnation the cluster has recorded for each member id. */
  incarnations(): Record<string, string> {
    return this.machine.incarnations();
  }

  /** Records a member's incarnation (leader only). */
  async recordIncarnation(id: NodeId, incarnation: string | null): Promise<void> {
    const r = await this.driver.propose(encodeMemberRecord(id, incarnation));
    if (!r.ok) throw new Error(r.error.message);
  }

  /** Runs `fn` on the ledger after a linearizable read barrier (or at once when stale). */
  async read<T>(fn: (l: Ledger) => T, stale: boolean): Promise<T> {
    if (!stale) await this.driver.linearizableRead();
    return fn(this.machine.ledger);
  }

  isLeader(): boolean {
    return this.driver.status().role === 'leader';
  }

  term(): number {
    return this.driver.status().term;
  }

  /** Resolves once this replica's ledger reflects every entry committed before the call. */
  readBarrier(): Promise<void> {
    return this.driver.linearizableRead();
  }

  leaderId(): NodeId | null {
    return this.driver.status().leader;
  }

  transferLeadership(to: NodeId | null): Promise<NodeId> {
    const st = this.driver.status();
    const target =
      to ??
      [...st.progress.entries()]
        .filter(([id, p]) => !p.isLearner && st.conf.voters.includes(id))
        .sort((a, b) => b[1].match - a[1].match)[0]?.[0];
    if (target === undefined) return Promise.reject(new Error('no other voter to transfer leadership to'));
    return this.driver.transferLeadership(target).then(() => target);
  }

  /** One membership step; the address of an added node is carried in the entry and learned here. */
  async changeMembership(cc: ConfChange): Promise<void> {
    if (cc.op === 'add-learner' && cc.context !== undefined) this.learnAddress(cc.node, cc.context);
    this.logger.info({ change: cc }, `membership change proposed: ${cc.op} ${cc.node}`);
    await this.driver.proposeConfChange(cc);
    this.logger.info({ change: cc }, `membership change committed: ${cc.op} ${cc.node}`);
  }

  /** The gRPC (peer and lease) address of a member, null if unknown. */
  peerAddress(id: NodeId): string | null {
    return this.addresses.get(id) ?? null;
  }

  get id(): NodeId {
    return this.settings.id;
  }

  learnAddress(id: NodeId, address: string): void {
    this.addresses.set(id, address);
    this.transport.setPeers(this.addresses);
  }

  cluster(): ClusterView {
    const st = this.driver.status();
    const tstats = this.transport.stats();
    const ids = new Set<NodeId>([...st.conf.voters, ...st.conf.learners]);
    const members: MemberView[] = [...ids].sort().map((id) => {
      const pr = st.progress.get(id);
      const voter = st.conf.voters.includes(id);
      const role: MemberView['role'] =
        id === st.leader
          ? 'leader'
          : voter
            ? id === st.id && st.role !== 'leader' && st.role !== 'follower'
              ? 'candidate'
              : 'follower'
            : 'learner';
      const link = tstats.peers[id];
      return {
        id,
        address: this.addresses.get(id) ?? null,
        role,
        voter,
        match: id === st.id ? st.lastIndex : (pr?.match ?? null),
        reachable: id === st.id ? true : (link?.connected ?? null),
        commandFormat:
          id === st.id ? (this.settings.commandFormat ?? NEWEST_COMMAND_FORMAT) : this.transport.peerCommandFormat(id),
      };
    });
    return {
      id: st.id,
      clusterId: this.settings.clusterId,
      leader: st.leader,
      term: st.term,
      commitIndex: st.commit,
      appliedIndex: st.applied,
      role: st.role,
      votingRefused: this.votingRefused,
      commandFormat: { log: this.machine.ledger.commandFormat, raisedAtIndex: this.machine.ledger.commandFormatIndex },
      members,
    };
  }

  failure(): Error | null {
    return this.fatal?.error ?? this.driver.failure();
  }

  private halted(): boolean {
    return this.stopped || this.fatal !== null;
  }

  /**
   * The node cannot go on (see the header): one fatal log line with the data directory and the
   * errno, no more lease rounds, /healthz and /readyz failing (failure() is set), and the owner
   * told to end the process. Idempotent: only the first failure is reported.
   */
  private fail(err: Error): void {
    if (this.fatal !== null) return;
    const kind = err instanceof RaftPersistError ? 'storage' : 'internal';
    const errno = kind === 'storage' ? storageErrno(err) : null;
    const failure: CoordinatorFailure = { kind, error: err, dataDir: this.settings.dataDir, errno };
    this.fatal = failure;
    this.logger.fatal(
      { err, kind, dataDir: failure.dataDir, errno },
      kind === 'storage'
        ? `storage failed on ${failure.dataDir} (${errno ?? 'unknown errno'}): nothing unpersisted was ` +
            'acknowledged; this replica stops serving and exits — fix the disk and restart it, it recovers from ' +
            'what is durable'
        : `raft node failed: ${err.message}; this replica stops serving and exits`,
    );
    this.lease?.stop();
    this.settings.onFatal?.(failure);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.loopWatch?.stop();
    this.lease?.stop();
    await this.driver.stop();
    await this.transport.stop();
    this.server?.forceShutdown();
    this.leaseServer?.forceShutdown();
    await this.storage.close();
    this.logger.info('coordinator stopped');
  }
}

/**
 * The lease port's credentials: the replica's certificate; client certificates required unless tokens identify the
 * cells.
 */
function leaseServerCredentials(
  tls: PeerTlsOptions | undefined,
  requireClientCertificates: boolean,
): grpc.ServerCredentials {
  if (tls === undefined) return grpc.ServerCredentials.createInsecure();
  const buf = (v: Uint8Array | string): Buffer =>
    typeof v === 'string' ? Buffer.from(v) : Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  return grpc.ServerCredentials.createSsl(
    buf(tls.ca),
    [{ cert_chain: buf(tls.cert), private_key: buf(tls.key) }],
    requireClientCertificates,
  );
}

function authHeader(token: string | undefined): Record<string, string> {
  return token === undefined ? {} : { authorization: `Bearer ${token}` };
}
