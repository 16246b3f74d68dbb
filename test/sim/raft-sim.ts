// The deterministic Raft simulator. Every source of nondeterminism — the network, the disks, the
// clocks, the clients, the faults — is drawn from one seed, so a seed replays a run exactly.
//
// A run has two phases. Safety: clients write to and read from a replicated key-value store while
// the network drops, duplicates, delays and reorders messages, links are cut (both ways or one
// way), nodes crash (losing unsynced writes), restart, pause, and leadership is transferred. After
// every event the checkers assert election safety, log matching, leader completeness and state
// machine safety. Liveness: the faults stop and everything heals; within a bounded time a leader
// must exist and every pending client operation must complete. Finally the whole client history
// must be linearizable (a Wing & Gong search, partitioned per key).
import {
  ClientSessions,
  EntryKind,
  RaftNode,
  Role,
  type ConfChange,
  type Entry,
  type Message,
  type NodeId,
  type PlantedBugs,
  type RaftConfig,
  type Ready,
  type Snapshot,
} from '../../coordinator/raft/index.js';
import { sendBeforePersist } from '../../coordinator/raft/index.js';
import { checkLinearizable, kvModel, type Operation } from '../../testkit/check/linearizability.js';
import { EventQueue } from './sim-queue.js';
import { Rng } from '../../testkit/random.js';
import { SimDisk } from '../../testkit/raft/sim-disk.js';

export class SimViolation extends Error {
  constructor(
    readonly kind: string,
    message: string,
  ) {
    super(`${kind}: ${message}`);
    this.name = 'SimViolation';
  }
}

export interface SimOptions {
  readonly seed: number;
  readonly nodeCount?: 3 | 5;
  /** Virtual milliseconds of the fault phase. */
  readonly safetyMs?: number;
  /** Bound on the healed phase: by then a leader exists and every client op completed. */
  readonly livenessMs?: number;
  readonly clients?: number;
  readonly plantedBugs?: PlantedBugs;
  /** Fault intensity in [0, 1]; 0 runs a clean network. */
  readonly faults?: number;
  /** Compact the log every this many applied entries (0: never). */
  readonly snapshotEvery?: number;
  /** Bytes per InstallSnapshot chunk (small to exercise chunking). */
  readonly snapshotChunkBytes?: number;
  /** Replace nodes through membership changes during the run. */
  readonly membershipChurn?: boolean;
  /** Skip the final linearizability check (for runs that plant bugs the checker would also find). */
  readonly checkHistory?: boolean;
}

export interface SimResult {
  readonly seed: number;
  readonly ok: boolean;
  readonly violation?: SimViolation;
  readonly stats: SimStats;
}

export interface SimStats {
  virtualMs: number;
  events: number;
  messagesSent: number;
  messagesDropped: number;
  crashes: number;
  elections: number;
  leaderTerms: number;
  opsCompleted: number;
  writesAcked: number;
  readsServed: number;
  snapshotsTaken: number;
  snapshotsInstalled: number;
  transfers: number;
  membershipChanges: number;
  historyOps: number;
}

type KvInput = { kind: 'put'; key: string; value: string } | { kind: 'get'; key: string };
type KvOutput = { value: string | null };

interface Command {
  readonly c: string;
  readonly s: number;
  readonly k: string;
  readonly v: string;
}

interface ClientOp {
  readonly clientId: string;
  readonly seq: number;
  readonly input: KvInput;
  readonly call: number;
  done: boolean;
  attempt: number;
  output: KvOutput | null;
  returnAt: number;
}

interface SimNode {
  readonly id: NodeId;
  readonly rng: Rng;
  tickMs: number;
  raft: RaftNode | null;
  disk: SimDisk;
  kv: Map<string, string>;
  sessions: ClientSessions<string>;
  applied: number;
  pausedUntil: number;
  /** Proposals waiting to be applied: index → who waits. */
  proposals: Map<number, { term: number; op: ClientOp }>;
  reads: Map<string, ClientOp>;
  readsWaitingApply: { index: number; op: ClientOp }[];
  lastLeaderTerm: number;
  lastVote: string;
  decommissioned: boolean;
  /** Bumped on every restart so stale timer events of an earlier incarnation are ignored. */
  incarnation: number;
}

const tickMsBase = 10;
const electionTicks = 10;
const opTimeoutMs = 400;
const keys = ['a', 'b', 'c', 'd'];
const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder();

export function runSimulation(opts: SimOptions): SimResult {
  const sim = new RaftSimulation(opts);
  return sim.run();
}

export class RaftSimulation {
  private readonly rng: Rng;
  private readonly q = new EventQueue();
  private readonly nodes = new Map<NodeId, SimNode>();
  private readonly bootstrapVoters: NodeId[];
  private readonly opts: Required<Omit<SimOptions, 'plantedBugs'>> & { plantedBugs: PlantedBugs };
  private readonly cut = new Set<string>(); // "from>to"
  private readonly removed = new Set<NodeId>();
  private dropRate = 0;
  private dupRate = 0;
  private maxDelayMs = 5;
  private faultsOn = true;
  private acceptingOps = true;
  private readonly history: ClientOp[] = [];
  private readonly clients: { id: string; seq: number; target: NodeId; busy: boolean }[] = [];
  // Checker state.
  private readonly leaderOfTerm = new Map<number, NodeId>();
  private readonly committed = new Map<number, { term: number; hash: number }>();
  private readonly logIdentity = new Map<string, { hash: number; prevTerm: number | undefined }>();
  private readonly ackedWrites: { index: number; term: number }[] = [];
  private nextNodeNumber: number;
  readonly stats: SimStats = {
    virtualMs: 0,
    events: 0,
    messagesSent: 0,
    messagesDropped: 0,
    crashes: 0,
    elections: 0,
    leaderTerms: 0,
    opsCompleted: 0,
    writesAcked: 0,
    readsServed: 0,
    snapshotsTaken: 0,
    snapshotsInstalled: 0,
    transfers: 0,
    membershipChanges: 0,
    historyOps: 0,
  };

  constructor(opts: SimOptions) {
    this.rng = new Rng(opts.seed);
    const r = this.rng.fork();
    this.opts = {
      seed: opts.seed,
      nodeCount: opts.nodeCount ?? (r.chance(0.7) ? 3 : 5),
      safetyMs: opts.safetyMs ?? 3000,
      livenessMs: opts.livenessMs ?? 4000,
      clients: opts.clients ?? 3,
      plantedBugs: opts.plantedBugs ?? {},
      faults: opts.faults ?? 1,
      snapshotEvery: opts.snapshotEvery ?? (r.chance(0.5) ? 20 + r.int(40) : 0),
      snapshotChunkBytes: opts.snapshotChunkBytes ?? 64 + r.int(512),
      membershipChurn: opts.membershipChurn ?? r.chance(0.25),
      checkHistory: opts.checkHistory ?? true,
    };
    this.dropRate = r.range(0, 0.15) * this.opts.faults;
    this.dupRate = r.range(0, 0.1) * this.opts.faults;
    this.maxDelayMs = 2 + r.int(20);
    this.bootstrapVoters = [];
    for (let i = 1; i <= this.opts.nodeCount; i++) this.bootstrapVoters.push(`n${i}`);
    this.nextNodeNumber = this.opts.nodeCount + 1;
    for (const id of this.bootstrapVoters) this.addNode(id);
    for (let i = 0; i < this.opts.clients; i++) {
      this.clients.push({ id: `c${i}`, seq: 0, target: this.rng.pick(this.bootstrapVoters), busy: false });
    }
  }

  run(): SimResult {
    try {
      this.schedulePlan();
      for (const c of this.clients) this.q.schedule(this.rng.int(50), () => this.startNextOp(c));
      const end = this.opts.safetyMs;
      this.q.schedule(end, () => this.heal());
      while (this.q.runNext(end)) this.stats.events++;
      this.heal();
      const deadline = end + this.opts.livenessMs;
      while (!this.livenessReached() && this.q.runNext(deadline)) this.stats.events++;
      if (!this.livenessReached()) {
        const pending = this.history
          .filter((o) => !o.done)
          .map((o) => `${o.clientId}#${o.seq} ${o.input.kind} attempt ${o.attempt} target ${this.clientOf(o).target}`);
        pending.push(
          ...[...this.nodes.values()].map(
            (n) =>
              `${n.id}: ${n.raft === null ? 'down' : JSON.stringify({ ...n.raft.status(), progress: [...n.raft.status().progress] })} decom=${n.decommissioned}`,
          ),
        );
        throw new SimViolation(
          'liveness',
          `${this.opts.livenessMs} ms after healing: leader=${this.currentLeader() ?? 'none'}, pending ops: ${pending.join(', ') || 'none'}`,
        );
      }
      this.stats.virtualMs = this.q.now;
      this.finalChecks();
      return { seed: this.opts.seed, ok: true, stats: this.stats };
    } catch (err) {
      this.stats.virtualMs = this.q.now;
      if (err instanceof SimViolation) return { seed: this.opts.seed, ok: false, violation: err, stats: this.stats };
      const e = err instanceof Error ? err : new Error(String(err));
      return {
        seed: this.opts.seed,
        ok: false,
        violation: new SimViolation('crash', `${e.message}\n${e.stack ?? ''}`),
        stats: this.stats,
      };
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Nodes

  private raftConfig(node: SimNode): RaftConfig {
    return {
      id: node.id,
      electionTicks,
      heartbeatTicks: 2,
      randomInt: (n) => node.rng.int(n),
      preVote: true,
      checkQuorum: true,
      maxAppendBytes: 4096,
      maxInflightAppends: 4,
      maxUncommittedBytes: 1 << 20,
      snapshotChunkBytes: this.opts.snapshotChunkBytes,
      plantedBugs: this.opts.plantedBugs,
    };
  }

  private addNode(id: NodeId): SimNode {
    const emptyState = encodeState(new Map(), new ClientSessions<string>(1000));
    const disk = new SimDisk({
      hard: { term: 0, vote: null, commit: 0 },
      // Every node, including one that joins later, starts from the bootstrap configuration.
      snapshot: {
        meta: { index: 0, term: 0, conf: { voters: [...this.bootstrapVoters], learners: [] } },
        data: emptyState,
      },
      entries: [],
    });
    const rng = this.rng.fork();
    const skew = 1 + rng.range(-0.1, 0.1) * this.opts.faults;
    const node: SimNode = {
      id,
      rng,
      tickMs: tickMsBase * skew,
      raft: null,
      disk,
      kv: new Map(),
      sessions: new ClientSessions<string>(1000),
      applied: 0,
      pausedUntil: 0,
      proposals: new Map(),
      reads: new Map(),
      readsWaitingApply: [],
      lastLeaderTerm: 0,
      lastVote: '',
      decommissioned: false,
      incarnation: 0,
    };
    this.nodes.set(id, node);
    this.start(node);
    return node;
  }

  private start(node: SimNode): void {
    const { hard, snapshot, entries } = node.disk.load();
    node.raft = new RaftNode(this.raftConfig(node), { hardState: hard, snapshot, entries });
    const st = decodeState(snapshot.data);
    node.kv = st.kv;
    node.sessions = st.sessions;
    node.applied = snapshot.meta.index;
    node.incarnation++;
    const inc = node.incarnation;
    const tick = (): void => {
      if (node.raft === null || node.incarnation !== inc) return;
      if (this.q.now >= node.pausedUntil) {
        node.raft.tick();
        this.processReady(node);
      }
      this.q.schedule(this.q.now + node.tickMs, tick);
    };
    this.q.schedule(this.q.now + node.rng.range(0, node.tickMs), tick);
    this.processReady(node);
  }

  private crash(node: SimNode): void {
    if (node.raft === null) return;
    node.raft = null;
    node.disk.crash();
    node.proposals.clear();
    node.reads.clear();
    node.readsWaitingApply = [];
    node.incarnation++;
    this.stats.crashes++;
  }

  private processReady(node: SimNode): void {
    const raft = node.raft;
    if (raft === null) return;
    while (raft.hasReady()) {
      const rd = raft.ready();
      // As the coordinator's driver does: a leader's replication messages leave before its own
      // write is durable (Raft thesis §10.2.1); everything else waits for the write.
      const early = rd.softState.role === Role.Leader ? rd.messages.filter(sendBeforePersist) : [];
      for (const m of early) this.send(m);
      if (early.length > 0 && rd.entries.length > 0 && this.faultsOn && node.rng.chance(0.01 * this.opts.faults)) {
        // The leader dies after sending its entries but before writing them.
        this.crash(node);
        this.q.schedule(this.q.now + 5 + node.rng.int(200), () => {
          if (node.raft === null && !node.decommissioned && this.faultsOn) this.start(node);
        });
        return;
      }
      this.persist(node, rd);
      for (const m of rd.messages) if (!early.includes(m)) this.send(m);
      this.apply(node, rd);
      raft.advance(rd);
      this.checkLeader(node);
      if (this.buggifyCrashAfterVote(node, rd)) return;
    }
    this.maybeCompact(node);
  }

  /**
   * A targeted fault (in the spirit of FoundationDB's BUGGIFY): right after a node granted a vote
   * it crashes and comes back at once, while the election it voted in is still going. This is
   * where a vote that was not durable would let it vote twice in one term.
   */
  private buggifyCrashAfterVote(node: SimNode, rd: Ready): boolean {
    const st = node.raft?.status();
    if (rd.hardState === null || st === undefined || st.vote === null || st.vote === node.id || !this.faultsOn)
      return false;
    const voteKey = `${st.term}:${st.vote}`;
    if (node.lastVote === voteKey) return false;
    node.lastVote = voteKey;
    if (!node.rng.chance(0.2 * this.opts.faults)) return false;
    this.crash(node);
    this.q.schedule(this.q.now + 0.5 + node.rng.float() * 3, () => {
      if (node.raft === null && !node.decommissioned) this.start(node);
    });
    return true;
  }

  private persist(node: SimNode, rd: Ready): void {
    if (rd.snapshot !== null) {
      node.disk.installSnapshot(rd.snapshot);
      this.stats.snapshotsInstalled++;
    }
    if (rd.entries.length > 0) {
      node.disk.writeEntries(rd.entries);
      this.checkLogMatching(node, rd.entries);
    }
    if (rd.hardState !== null) node.disk.writeHardState(rd.hardState);
    if (rd.mustSync) node.disk.sync();
  }

  private apply(node: SimNode, rd: Ready): void {
    if (rd.snapshot !== null) {
      const st = decodeState(rd.snapshot.data);
      node.kv = st.kv;
      node.sessions = st.sessions;
      node.applied = rd.snapshot.meta.index;
      // Proposals below the snapshot cannot be told apart any more: their clients retry.
      for (const idx of [...node.proposals.keys()]) if (idx <= node.applied) node.proposals.delete(idx);
    }
    for (const e of rd.committedEntries) {
      this.checkStateMachineSafety(node, e);
      let result: string | null = null;
      if (e.kind === EntryKind.Normal) {
        const cmd = decodeCommand(e.data);
        const check = node.sessions.check(cmd.c, cmd.s);
        if (check.kind === 'new') {
          node.kv.set(cmd.k, cmd.v);
          node.sessions.record(cmd.c, cmd.s, 'ok');
          result = 'ok';
        } else if (check.kind === 'duplicate') {
          result = check.result;
        }
      }
      node.applied = e.index;
      const waiting = node.proposals.get(e.index);
      if (waiting !== undefined) {
        node.proposals.delete(e.index);
        if (waiting.term === e.term && result !== null) {
          this.ackedWrites.push({ index: e.index, term: e.term });
          this.stats.writesAcked++;
          this.complete(waiting.op, { value: null });
        } else if (!waiting.op.done) {
          // Overwritten by another leader's entry: definitely not applied here; retry.
          this.retry(waiting.op, 1);
        }
      }
    }
    for (const rs of rd.readStates) {
      const op = node.reads.get(rs.ctx);
      if (op === undefined) continue;
      node.reads.delete(rs.ctx);
      node.readsWaitingApply.push({ index: rs.index, op });
    }
    for (const ctx of rd.failedReads) {
      const op = node.reads.get(ctx);
      if (op === undefined) continue;
      node.reads.delete(ctx);
      this.clientOf(op).target = this.rng.pick(this.liveIds());
      this.retry(op, 5);
    }
    const still: { index: number; op: ClientOp }[] = [];
    for (const w of node.readsWaitingApply) {
      if (w.index <= node.applied) {
        if (w.op.input.kind === 'get' && !w.op.done) {
          this.stats.readsServed++;
          this.complete(w.op, { value: node.kv.get(w.op.input.key) ?? null });
        }
      } else {
        still.push(w);
      }
    }
    node.readsWaitingApply = still;
  }

  private maybeCompact(node: SimNode): void {
    const raft = node.raft;
    const every = this.opts.snapshotEvery;
    if (raft === null || every === 0) return;
    const st = raft.status();
    if (st.applied - st.snapshotIndex < every) return;
    const keepTrailing = node.rng.int(every);
    const snap: Snapshot = raft.compact(encodeState(node.kv, node.sessions), keepTrailing);
    node.disk.writeSnapshot(snap, raft.firstIndex());
    node.disk.sync();
    this.stats.snapshotsTaken++;
  }

  // ---------------------------------------------------------------------------------------------
  // Network

  private send(m: Message): void {
    this.stats.messagesSent++;
    if (this.cut.has(`${m.from}>${m.to}`) || this.rng.chance(this.dropRate)) {
      this.stats.messagesDropped++;
      return;
    }
    const copies = this.rng.chance(this.dupRate) ? 2 : 1;
    for (let i = 0; i < copies; i++) {
      const delay = 0.5 + this.rng.float() * this.maxDelayMs;
      this.q.schedule(this.q.now + delay, () => this.deliver(m));
    }
  }

  private deliver(m: Message): void {
    const node = this.nodes.get(m.to);
    if (node === undefined || node.raft === null) return;
    if (this.q.now < node.pausedUntil) {
      // A paused process reads its socket when it resumes.
      this.q.schedule(node.pausedUntil + this.rng.float(), () => this.deliver(m));
      return;
    }
    node.raft.step(m);
    this.processReady(node);
  }

  // ---------------------------------------------------------------------------------------------
  // Faults

  private schedulePlan(): void {
    if (this.opts.faults === 0) return;
    let t = 100 + this.rng.int(300);
    while (t < this.opts.safetyMs) {
      const at = t;
      this.q.schedule(at, () => this.injectFault());
      t += 50 + this.rng.int(Math.round(600 / this.opts.faults));
    }
  }

  private injectFault(): void {
    if (!this.faultsOn) return;
    const live = [...this.nodes.values()].filter((n) => !n.decommissioned);
    const ids = live.map((n) => n.id);
    const roll = this.rng.int(100);
    if (roll < 20) {
      // Crash a node; restart it later from its disk.
      const n = this.rng.pick(live);
      if (n.raft === null) return;
      this.crash(n);
      this.q.schedule(this.q.now + 20 + this.rng.int(800), () => {
        if (n.raft === null && !n.decommissioned && this.faultsOn) this.start(n);
      });
    } else if (roll < 30) {
      // Crash the leader in particular.
      const leader = this.currentLeader();
      const n = leader === null ? undefined : this.nodes.get(leader);
      if (n === undefined || n.raft === null) return;
      this.crash(n);
      this.q.schedule(this.q.now + 20 + this.rng.int(500), () => {
        if (n.raft === null && !n.decommissioned && this.faultsOn) this.start(n);
      });
    } else if (roll < 45) {
      // Isolate one node both ways.
      const victim = this.rng.pick(ids);
      for (const o of ids) {
        if (o === victim) continue;
        this.cut.add(`${victim}>${o}`);
        this.cut.add(`${o}>${victim}`);
      }
    } else if (roll < 55) {
      // One-way cuts.
      for (let i = 0; i < 1 + this.rng.int(3); i++) {
        const a = this.rng.pick(ids);
        const b = this.rng.pick(ids);
        if (a !== b) this.cut.add(`${a}>${b}`);
      }
    } else if (roll < 62) {
      // Split into two random groups.
      const side = new Set(ids.filter(() => this.rng.chance(0.5)));
      for (const a of ids) for (const b of ids) if (side.has(a) !== side.has(b)) this.cut.add(`${a}>${b}`);
    } else if (roll < 77) {
      this.cut.clear();
    } else if (roll < 85) {
      // Pause a node (a GC or event-loop stall): it neither ticks nor reads its socket.
      const n = this.rng.pick(live);
      n.pausedUntil = this.q.now + 50 + this.rng.int(400);
    } else if (roll < 92) {
      const leader = this.currentLeader();
      const node = leader === null ? undefined : this.nodes.get(leader);
      const target = this.rng.pick(ids);
      if (node?.raft !== null && node !== undefined && target !== leader) {
        const res = node.raft?.transferLeadership(target);
        if (res?.ok === true) this.stats.transfers++;
        this.processReady(node);
      }
    } else if (this.opts.membershipChurn) {
      this.churnMembership();
    } else {
      this.cut.clear();
    }
  }

  /** Replaces a node: a fresh node joins as a learner, is promoted once caught up, then one voter is removed. */
  private churnMembership(): void {
    const leaderId = this.currentLeader();
    const leader = leaderId === null ? undefined : this.nodes.get(leaderId);
    const raft = leader?.raft;
    if (leader === undefined || raft === undefined || raft === null) return;
    const st = raft.status();
    // Decommission nodes whose removal the leader has applied.
    for (const id of this.removed) {
      const n = this.nodes.get(id);
      if (n !== undefined && !n.decommissioned && !st.conf.voters.includes(id) && !st.conf.learners.includes(id)) {
        this.crash(n);
        n.decommissioned = true;
      }
    }
    let cc: ConfChange | null = null;
    if (st.conf.learners.length > 0) {
      const learner = st.conf.learners[0];
      const pr = learner === undefined ? undefined : st.progress.get(learner);
      if (learner !== undefined && pr !== undefined && pr.match >= st.commit) cc = { op: 'promote', node: learner };
    } else if (st.conf.voters.length > this.opts.nodeCount) {
      cc = { op: 'remove', node: this.rng.pick(st.conf.voters) };
    } else {
      cc = { op: 'add-learner', node: `n${this.nextNodeNumber}` };
    }
    if (cc === null) return;
    const res = raft.proposeConfChange(cc);
    this.processReady(leader);
    if (!res.ok) return;
    this.stats.membershipChanges++;
    if (cc.op === 'add-learner') {
      this.nextNodeNumber++;
      this.addNode(cc.node);
    } else if (cc.op === 'remove') {
      this.removed.add(cc.node);
    }
  }

  private heal(): void {
    if (!this.faultsOn) return;
    this.faultsOn = false;
    this.acceptingOps = false;
    this.cut.clear();
    this.dropRate = 0;
    this.dupRate = 0;
    for (const n of this.nodes.values()) {
      n.pausedUntil = 0;
      if (n.raft === null && !n.decommissioned) this.start(n);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Clients

  private startNextOp(c: { id: string; seq: number; target: NodeId; busy: boolean }): void {
    if (!this.acceptingOps || c.busy) return;
    c.seq++;
    c.busy = true;
    const key = this.rng.pick(keys);
    const input: KvInput = this.rng.chance(0.5)
      ? { kind: 'put', key, value: `${c.id}-${c.seq}` }
      : { kind: 'get', key };
    const op: ClientOp = {
      clientId: c.id,
      seq: c.seq,
      input,
      call: this.q.now,
      done: false,
      attempt: 0,
      output: null,
      returnAt: Infinity,
    };
    this.history.push(op);
    this.attempt(op);
  }

  private attempt(op: ClientOp): void {
    if (op.done) return;
    op.attempt++;
    const attemptNo = op.attempt;
    const client = this.clientOf(op);
    const node = this.nodes.get(client.target);
    const raft = node?.raft;
    if (
      node === undefined ||
      raft === null ||
      raft === undefined ||
      node.decommissioned ||
      this.q.now < node.pausedUntil
    ) {
      client.target = this.rng.pick(this.liveIds());
      this.q.schedule(this.q.now + 10, () => this.attempt(op));
      return;
    }
    if (op.input.kind === 'put') {
      const cmd: Command = { c: op.clientId, s: op.seq, k: op.input.key, v: op.input.value };
      const res = raft.propose(textEncoder.encode(JSON.stringify(cmd)));
      this.processReady(node);
      if (!res.ok) {
        client.target = res.leader ?? this.rng.pick(this.liveIds());
        this.q.schedule(this.q.now + (res.leader === null ? 20 : 2), () => this.attempt(op));
        return;
      }
      node.proposals.set(res.index, { term: res.term, op });
    } else {
      const ctx = `${op.clientId}:${op.seq}:${attemptNo}`;
      node.reads.set(ctx, op);
      raft.readIndex(ctx);
      this.processReady(node);
    }
    this.q.schedule(this.q.now + opTimeoutMs, () => {
      if (!op.done && op.attempt === attemptNo) {
        client.target = this.rng.pick(this.liveIds());
        this.attempt(op);
      }
    });
  }

  private liveIds(): NodeId[] {
    return [...this.nodes.values()].filter((n) => !n.decommissioned).map((n) => n.id);
  }

  private retry(op: ClientOp, afterMs: number): void {
    if (op.done) return;
    const attemptNo = op.attempt;
    this.q.schedule(this.q.now + afterMs, () => {
      if (!op.done && op.attempt === attemptNo) this.attempt(op);
    });
  }

  private complete(op: ClientOp, output: KvOutput): void {
    if (op.done) return;
    op.done = true;
    op.output = output;
    op.returnAt = this.q.now;
    this.stats.opsCompleted++;
    const client = this.clientOf(op);
    client.busy = false;
    this.q.schedule(this.q.now + this.rng.int(20), () => this.startNextOp(client));
  }

  private clientOf(op: ClientOp): { id: string; seq: number; target: NodeId; busy: boolean } {
    const c = this.clients.find((x) => x.id === op.clientId);
    if (c === undefined) throw new Error(`unknown client ${op.clientId}`);
    return c;
  }

  // ---------------------------------------------------------------------------------------------
  // Checkers

  private checkLeader(node: SimNode): void {
    const raft = node.raft;
    if (raft === null) return;
    const s = raft.softState();
    if (s.role !== Role.Leader || node.lastLeaderTerm === s.term) return;
    node.lastLeaderTerm = s.term;
    const prior = this.leaderOfTerm.get(s.term);
    if (prior !== undefined && prior !== node.id) {
      throw new SimViolation('election-safety', `two leaders in term ${s.term}: ${prior} and ${node.id}`);
    }
    this.leaderOfTerm.set(s.term, node.id);
    this.stats.leaderTerms++;
    // Leader completeness: every committed entry is in the new leader's log.
    const st = raft.status();
    for (const [index, c] of this.committed) {
      if (index < st.firstIndex) continue;
      const t = raft.termAt(index);
      if (t !== c.term) {
        throw new SimViolation(
          'leader-completeness',
          `leader ${node.id} of term ${s.term} has term ${t ?? 'none'} at committed index ${index} (committed term ${c.term})`,
        );
      }
    }
  }

  private checkLogMatching(node: SimNode, entries: readonly Entry[]): void {
    const raft = node.raft;
    if (raft === null) return;
    for (const e of entries) {
      const key = `${e.index}/${e.term}`;
      const hash = hashEntry(e);
      const prevTerm = raft.termAt(e.index - 1);
      const seen = this.logIdentity.get(key);
      if (seen === undefined) {
        this.logIdentity.set(key, { hash, prevTerm });
        continue;
      }
      if (seen.hash !== hash)
        throw new SimViolation(
          'log-matching',
          `two different entries at index ${e.index} term ${e.term} (node ${node.id})`,
        );
      if (seen.prevTerm !== undefined && prevTerm !== undefined && seen.prevTerm !== prevTerm) {
        throw new SimViolation(
          'log-matching',
          `entry ${e.index}/${e.term} follows term ${prevTerm} on ${node.id} but term ${seen.prevTerm} elsewhere`,
        );
      }
    }
  }

  private checkStateMachineSafety(node: SimNode, e: Entry): void {
    const hash = hashEntry(e);
    const c = this.committed.get(e.index);
    if (c === undefined) {
      this.committed.set(e.index, { term: e.term, hash });
      return;
    }
    if (c.term !== e.term || c.hash !== hash) {
      throw new SimViolation(
        'state-machine-safety',
        `node ${node.id} applied ${e.index}/${e.term} but ${e.index}/${c.term} was applied elsewhere`,
      );
    }
  }

  private currentLeader(): NodeId | null {
    let best: { id: NodeId; term: number } | null = null;
    for (const n of this.nodes.values()) {
      const s = n.raft?.softState();
      if (s?.role === Role.Leader && (best === null || s.term > best.term)) best = { id: n.id, term: s.term };
    }
    return best?.id ?? null;
  }

  private livenessReached(): boolean {
    if (this.faultsOn) return false;
    if (this.currentLeader() === null) return false;
    return this.history.every((o) => o.done);
  }

  private finalChecks(): void {
    for (const w of this.ackedWrites) {
      const c = this.committed.get(w.index);
      if (c?.term !== w.term)
        throw new SimViolation(
          'lost-write',
          `acknowledged write ${w.index}/${w.term} is not the committed entry there`,
        );
    }
    this.stats.historyOps = this.history.length;
    if (!this.opts.checkHistory) return;
    const ops: Operation<KvInput, KvOutput>[] = [];
    for (const o of this.history) {
      if (o.input.kind === 'get' && !o.done) continue; // a read that never returned has no effect
      ops.push({
        clientId: o.clientId,
        input: o.input,
        output: o.output ?? { value: null },
        call: o.call,
        return: o.done ? o.returnAt : Infinity,
      });
    }
    const verdict = checkLinearizable(kvModel, ops);
    if (verdict.ok === false)
      throw new SimViolation('linearizability', `client history is not linearizable: ${verdict.reason}`);
    if (verdict.ok === 'unknown') throw new SimViolation('linearizability', `checker gave up: ${verdict.reason}`);
  }
}

function encodeState(kv: Map<string, string>, sessions: ClientSessions<string>): Uint8Array {
  return textEncoder.encode(JSON.stringify({ kv: [...kv], sessions: sessions.entries() }));
}

function decodeState(data: Uint8Array): { kv: Map<string, string>; sessions: ClientSessions<string> } {
  const v = JSON.parse(textDecoder.decode(data)) as {
    kv: [string, string][];
    sessions: { clientId: string; seq: number; result: string }[];
  };
  return { kv: new Map(v.kv), sessions: ClientSessions.fromEntries(1000, v.sessions) };
}

function decodeCommand(data: Uint8Array): Command {
  return JSON.parse(textDecoder.decode(data)) as Command;
}

function hashEntry(e: Entry): number {
  let h = 0x811c9dc5 ^ e.kind;
  for (const b of e.data) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}
