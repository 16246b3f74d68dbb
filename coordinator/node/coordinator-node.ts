// One coordinator replica: the Raft core driven over LevelDB storage and the gRPC peer transport,
// applying the replicated quota ledger. It is what `cellquota coordinator` runs and what the
// admin API talks to.
//
// A data directory that is new (or whose identity was never confirmed) may belong to a node that
// lost its disk: such a node must not vote as if it remembered its votes. At start it asks its
// peers; if any of them has seen a term above 0 the cluster already existed, so the node keeps
// refusing to vote and logs the command that re-adds it. Only when every peer answers that the
// cluster is new does it confirm its identity and vote.
import { RaftNode, type ConfChange, type NodeId, type RaftConfig } from '../raft/index.js';
import { LevelRaftStorage } from '../storage/index.js';
import { PeerTransport, type PeerTlsOptions } from '../transport/peer-transport.js';
import { Ledger, type LedgerResult } from '../ledger/ledger.js';
import { encodeCommand, type LedgerCommandInput } from '../ledger/ledger-commands.js';
import { RaftDriver, type ReplicatedStateMachine } from './raft-driver.js';
import type { Logger } from '../../shared/logging.js';

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
  readonly skewMarginMs: number;
  /** Join an existing cluster as a new (learner) member instead of bootstrapping one. */
  readonly join: boolean;
  readonly tls?: PeerTlsOptions;
}

export interface MemberView {
  readonly id: NodeId;
  readonly address: string | null;
  readonly role: 'leader' | 'follower' | 'candidate' | 'learner' | 'removed';
  readonly voter: boolean;
  readonly match: number | null;
  readonly reachable: boolean | null;
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
  readonly members: MemberView[];
}

class LedgerMachine implements ReplicatedStateMachine<LedgerResult> {
  constructor(
    public ledger: Ledger,
    private readonly opts: { floorCells: number; skewMarginMs: number },
  ) {}
  apply(data: Uint8Array, index: number): LedgerResult {
    return this.ledger.applyEncoded(data, index);
  }
  snapshot(): Uint8Array {
    return this.ledger.snapshot();
  }
  restore(data: Uint8Array): void {
    this.ledger = data.byteLength === 0 ? new Ledger(this.opts) : Ledger.restore(data);
  }
}

export class CoordinatorNode {
  private votingRefused = false;
  private addresses: Map<NodeId, string>;

  private constructor(
    readonly settings: CoordinatorSettings,
    private readonly logger: Logger,
    private readonly storage: LevelRaftStorage,
    private readonly transport: PeerTransport,
    private readonly driver: RaftDriver<LedgerResult>,
    private readonly machine: LedgerMachine,
  ) {
    this.addresses = new Map(settings.peers);
  }

  static async start(settings: CoordinatorSettings, logger: Logger): Promise<CoordinatorNode> {
    const log = logger.child({ component: 'coordinator', node: settings.id });
    const voters = settings.join ? [] : [...settings.peers.keys()].sort();
    const storage = await LevelRaftStorage.open(settings.dataDir, {
      nodeId: settings.id,
      clusterId: settings.clusterId,
      bootstrap: { conf: { voters, learners: [] }, data: new Uint8Array(0) },
      logger: { warn: (fields, msg) => log.warn(fields, msg) },
      onSync: (ms, bytes) => {
        if (ms > 100) log.warn({ ms, bytes }, 'slow fsync');
      },
    });
    const loaded = await storage.load();
    for (const r of loaded.meta.repairs) log.warn({ repair: r }, 'storage repaired a torn write at the log tail');
    const ledgerOpts = { floorCells: settings.floorCells, skewMarginMs: settings.skewMarginMs };
    const machine = new LedgerMachine(new Ledger(ledgerOpts), ledgerOpts);
    machine.restore(loaded.snapshot.data);
    const mayBeWiped = !loaded.meta.incarnationConfirmed && !settings.join;

    let nodeRef: CoordinatorNode | null = null;
    const transport = new PeerTransport({
      selfId: settings.id,
      clusterId: settings.clusterId,
      listen: settings.peers.get(settings.id) ?? '127.0.0.1:0',
      peers: settings.peers,
      onMessages: (batch) => nodeRef?.driver.receive(batch),
      logger: log.child({ component: 'transport' }),
      status: () => {
        const s = nodeRef?.driver.status();
        return { term: s?.term ?? 0, leader: s?.leader ?? null };
      },
      ...(settings.tls === undefined ? {} : { tls: settings.tls }),
    });
    await transport.start();

    let refuseToVote = false;
    if (mayBeWiped) refuseToVote = await CoordinatorNode.clusterExisted(settings, transport, log);
    if (!refuseToVote && !loaded.meta.incarnationConfirmed) await storage.confirmIncarnation();

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
      refuseToVote,
    };
    const raft = new RaftNode(raftConfig, loaded);
    const driver = new RaftDriver<LedgerResult>({
      raft,
      storage,
      outbox: transport,
      stateMachine: machine,
      appliedIndex: loaded.snapshot.meta.index,
      tickMs: settings.tickMs,
      snapshotEveryEntries: settings.snapshotEveryEntries,
      snapshotTrailingEntries: settings.snapshotTrailingEntries,
      requestTimeoutMs: settings.requestTimeoutMs,
      onLeaderChange: (leader, term) => log.info({ leader, term }, leader === null ? 'no leader' : `leader is ${leader}`),
      onError: (err) => log.fatal({ err }, 'raft node stopped: storage failed; restart the process after fixing the disk'),
    });
    const node = new CoordinatorNode(settings, log, storage, transport, driver, machine);
    node.votingRefused = refuseToVote;
    nodeRef = node;
    driver.start();
    log.info({ peers: Object.fromEntries(settings.peers), dataDir: settings.dataDir, snapshotIndex: loaded.snapshot.meta.index, term: loaded.hardState.term }, 'coordinator started');
    return node;
  }

  /** True if a peer reports a term above 0: this fresh data dir belongs to a node of a running cluster. */
  private static async clusterExisted(settings: CoordinatorSettings, transport: PeerTransport, log: Logger): Promise<boolean> {
    const others = [...settings.peers.keys()].filter((p) => p !== settings.id);
    if (others.length === 0) return false;
    for (let attempt = 0; ; attempt++) {
      const answers = await Promise.all(others.map((p) => transport.probe(p, 1000).then((r) => r, () => null)));
      const seen = answers.filter((a) => a !== null);
      if (seen.some((a) => a.termHint > 0)) {
        log.error(
          { peers: seen.map((a) => ({ id: a.nodeId, term: a.termHint })) },
          `data directory ${settings.dataDir} is new but the cluster already ran: this node lost its state and must not vote. ` +
            `Re-add it with an empty data dir: cellquota ctl members replace ${settings.id} --address ${settings.peers.get(settings.id) ?? 'HOST:PORT'}`,
        );
        return true;
      }
      if (seen.length === others.length) return false;
      if (attempt % 10 === 0) log.info({ reachable: seen.length, of: others.length }, 'waiting for peers to tell whether the cluster is new');
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  ledger(): Ledger {
    return this.machine.ledger;
  }

  /** Proposes a ledger command and resolves with its result once applied here. */
  async propose(cmd: LedgerCommandInput): Promise<LedgerResult> {
    return this.driver.propose(encodeCommand(cmd));
  }

  /** Runs `fn` on the ledger after a linearizable read barrier (or at once when stale). */
  async read<T>(fn: (l: Ledger) => T, stale: boolean): Promise<T> {
    if (!stale) await this.driver.linearizableRead();
    return fn(this.machine.ledger);
  }

  isLeader(): boolean {
    return this.driver.status().role === 'leader';
  }

  leaderId(): NodeId | null {
    return this.driver.status().leader;
  }

  transferLeadership(to: NodeId | null): Promise<NodeId> {
    const st = this.driver.status();
    const target = to ?? [...st.progress.entries()].filter(([id, p]) => !p.isLearner && st.conf.voters.includes(id)).sort((a, b) => b[1].match - a[1].match)[0]?.[0];
    if (target === undefined) return Promise.reject(new Error('no other voter to transfer leadership to'));
    return this.driver.transferLeadership(target).then(() => target);
  }

  /** One membership step; the address of an added node is carried in the entry and learned here. */
  async changeMembership(cc: ConfChange): Promise<void> {
    if (cc.op === 'add-learner' && cc.context !== undefined) this.learnAddress(cc.node, cc.context);
    await this.driver.proposeConfChange(cc);
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
      const role: MemberView['role'] = id === st.leader ? 'leader' : voter ? (id === st.id && st.role !== 'leader' && st.role !== 'follower' ? 'candidate' : 'follower') : 'learner';
      const link = tstats.peers[id];
      return {
        id,
        address: this.addresses.get(id) ?? null,
        role,
        voter,
        match: id === st.id ? st.lastIndex : (pr?.match ?? null),
        reachable: id === st.id ? true : (link?.connected ?? null),
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
      members,
    };
  }

  failure(): Error | null {
    return this.driver.failure();
  }

  async stop(): Promise<void> {
    await this.driver.stop();
    await this.transport.stop();
    await this.storage.close();
    this.logger.info('coordinator stopped');
  }
}
