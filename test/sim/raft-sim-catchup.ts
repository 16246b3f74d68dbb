// A deterministic catch-up scenario for the Raft core under simulated time: three nodes, links with
// latency and a bandwidth (so a large snapshot takes a while to cross), a steady stream of writes at
// the leader, every node compacting its log every few entries. One follower is stopped long enough
// that the leader's log moves past it, then started again: it can only catch up through a snapshot,
// and the leader compacts several times while that snapshot is on the wire. The run reports how
// long (virtual time) the follower took to hold the leader's state at the index the leader had
// committed when it came back, and checks on the way that every node's state machine agrees at
// every index it applied (a rolling hash) and that no term has two leaders.
import {
  EntryKind,
  RaftNode,
  Role,
  type Message,
  type NodeId,
  type PlantedBugs,
  type RaftConfig,
  type Ready,
  type Snapshot,
} from '../../coordinator/raft/index.js';
import { sendBeforePersist } from '../../coordinator/raft/index.js';
import { EventQueue } from './sim-queue.js';
import { Rng } from '../../testkit/random.js';
import { SimDisk } from '../../testkit/raft/sim-disk.js';

export interface CatchUpOptions {
  readonly seed: number;
  /** Bytes of every snapshot (the state machine's state is padded to this size). */
  readonly snapshotBytes?: number;
  /** Each link's bandwidth, bytes per virtual ms; messages on a link queue behind each other. */
  readonly bytesPerMs?: number;
  readonly latencyMs?: number;
  /** Bytes of each write's entry (padding after its name). */
  readonly entryBytes?: number;
  /** The leader gets a write this often (virtual ms). */
  readonly writeEveryMs?: number;
  /** Every node compacts after this many applied entries, keeping `trailing` entries below. */
  readonly snapshotEvery?: number;
  readonly trailing?: number;
  readonly chunkBytes?: number;
  readonly maxAppendBytes?: number;
  readonly maxInflightSnapshotChunks?: number;
  /** Chance that a message is lost. */
  readonly dropRate?: number;
  /** How long the follower stays stopped before it starts again. */
  readonly downMs?: number;
  /** Stop the run (not caught up) this long after the follower started again. */
  readonly boundMs?: number;
  /** Crash the follower again this long after it started (mid-transfer), and start it at once. */
  readonly crashMidTransferAtMs?: number;
  readonly plantedBugs?: PlantedBugs;
}

export interface CatchUpResult {
  readonly caughtUp: boolean;
  /** Virtual ms from the follower's start to holding the leader's state at the target index. */
  readonly catchUpMs: number;
  /** The leader's commit index when the follower started again. */
  readonly targetIndex: number;
  /** Compactions on the leader while a snapshot transfer to the follower was in progress. */
  readonly compactionsDuringTransfer: number;
  readonly snapshotsInstalled: number;
  readonly snapshotChunkBytesSent: number;
  /** Bytes of AppendEntries sent to the follower that catches up (duplicates included). */
  readonly appendBytesToLagging: number;
  readonly writes: number;
}

interface Node {
  readonly id: NodeId;
  readonly rng: Rng;
  raft: RaftNode | null;
  readonly disk: SimDisk;
  hash: number;
  applied: number;
  snapshotIndex: number;
  incarnation: number;
}

const tickMs = 10;
const headerBytes = 8;

function mix(h: number, index: number, data: Uint8Array): number {
  let x = (h ^ index) >>> 0;
  for (const b of data) x = Math.imul(x ^ b, 16_777_619) >>> 0;
  return Math.imul(x ^ (index >>> 16), 2_246_822_507) >>> 0;
}

function encodeState(hash: number, applied: number, bytes: number): Uint8Array {
  const out = new Uint8Array(Math.max(headerBytes, bytes));
  const v = new DataView(out.buffer);
  v.setUint32(0, hash);
  v.setUint32(4, applied);
  return out;
}

function decodeHash(data: Uint8Array): number {
  return data.byteLength < headerBytes ? 0 : new DataView(data.buffer, data.byteOffset, data.byteLength).getUint32(0);
}

function messageBytes(m: Message): number {
  if (m.type === 'snapshot') return 64 + m.chunk.byteLength;
  if (m.type === 'append') return 64 + m.entries.reduce((a, e) => a + 24 + e.data.byteLength, 0);
  if (m.type === 'append-resp') return 48;
  return 48;
}

export function runCatchUp(opts: CatchUpOptions): CatchUpResult {
  return new CatchUpSimulation(opts).run();
}

class CatchUpSimulation {
  private readonly o: Required<Omit<CatchUpOptions, 'plantedBugs' | 'crashMidTransferAtMs'>> & {
    readonly plantedBugs: PlantedBugs | undefined;
    readonly crashMidTransferAtMs: number | undefined;
  };
  private readonly rng: Rng;
  private readonly q = new EventQueue();
  private readonly nodes = new Map<NodeId, Node>();
  private readonly linkFree = new Map<string, number>();
  /** The state hash every node must have after applying index i. */
  private readonly hashAt = new Map<number, number>();
  private readonly leaderOfTerm = new Map<number, NodeId>();
  private lagging: NodeId | null = null;
  private compactionsDuringTransfer = 0;
  private snapshotsInstalled = 0;
  private snapshotChunkBytesSent = 0;
  private appendBytesToLagging = 0;
  private writes = 0;

  constructor(opts: CatchUpOptions) {
    this.o = {
      seed: opts.seed,
      snapshotBytes: opts.snapshotBytes ?? 4 << 20,
      bytesPerMs: opts.bytesPerMs ?? 4000,
      latencyMs: opts.latencyMs ?? 1,
      writeEveryMs: opts.writeEveryMs ?? 4,
      entryBytes: opts.entryBytes ?? 0,
      snapshotEvery: opts.snapshotEvery ?? 50,
      trailing: opts.trailing ?? 25,
      chunkBytes: opts.chunkBytes ?? 64 << 10,
      maxAppendBytes: opts.maxAppendBytes ?? 64 << 10,
      maxInflightSnapshotChunks: opts.maxInflightSnapshotChunks ?? 4,
      dropRate: opts.dropRate ?? 0,
      downMs: opts.downMs ?? 2000,
      boundMs: opts.boundMs ?? 20_000,
      plantedBugs: opts.plantedBugs,
      crashMidTransferAtMs: opts.crashMidTransferAtMs,
    };
    this.rng = new Rng(opts.seed);
    const voters = ['n1', 'n2', 'n3'];
    for (const id of voters) {
      const disk = new SimDisk({
        hard: { term: 0, vote: null, commit: 0 },
        snapshot: { meta: { index: 0, term: 0, conf: { voters, learners: [] } }, data: encodeState(0, 0, headerBytes) },
        entries: [],
      });
      const node: Node = {
        id,
        rng: this.rng.fork(),
        raft: null,
        disk,
        hash: 0,
        applied: 0,
        snapshotIndex: 0,
        incarnation: 0,
      };
      this.nodes.set(id, node);
      this.start(node);
    }
  }

  run(): CatchUpResult {
    // A leader first, then a steady stream of writes.
    this.runUntil(() => this.leader() !== null && (this.leader()?.raft?.status().commit ?? 0) > 0, 5000, 'a leader');
    this.scheduleWrites();
    const leader = this.leader();
    if (leader === null) throw new Error('no leader');
    const lagging = [...this.nodes.values()].find((n) => n.id !== leader.id);
    if (lagging === undefined) throw new Error('no follower');
    this.lagging = lagging.id;
    this.crash(lagging);
    const downUntil = this.q.now + this.o.downMs;
    this.q.schedule(downUntil, () => undefined);
    this.runUntil(() => this.q.now >= downUntil, this.o.downMs + 1, 'the down time');
    const current = this.leader();
    if (current === null) throw new Error('no leader while the follower was down');
    const target = current.raft?.status().commit ?? 0;
    if (this.o.snapshotEvery > 0 && (current.raft?.status().firstIndex ?? 0) <= lagging.applied + 1)
      throw new Error('the leader did not compact past the stopped follower: raise downMs');
    const t0 = this.q.now;
    this.start(lagging);
    const crashAt = this.o.crashMidTransferAtMs;
    if (crashAt !== undefined) {
      this.q.schedule(t0 + crashAt, () => {
        this.crash(lagging);
        this.start(lagging);
      });
    }
    const caughtUp = (): boolean => lagging.applied >= target && this.hashAt.get(lagging.applied) === lagging.hash;
    const done = this.runUntil(caughtUp, this.o.boundMs, null);
    return {
      caughtUp: done,
      catchUpMs: done ? this.q.now - t0 : Number.POSITIVE_INFINITY,
      targetIndex: target,
      compactionsDuringTransfer: this.compactionsDuringTransfer,
      snapshotsInstalled: this.snapshotsInstalled,
      snapshotChunkBytesSent: this.snapshotChunkBytesSent,
      appendBytesToLagging: this.appendBytesToLagging,
      writes: this.writes,
    };
  }

  /** Runs events until `cond` holds (true) or `forMs` of virtual time passed (false, or throws if `what`). */
  private runUntil(cond: () => boolean, forMs: number, what: string | null): boolean {
    const until = this.q.now + forMs;
    while (!cond()) {
      if (!this.q.runNext(until)) {
        if (what !== null) throw new Error(`no ${what} within ${forMs} ms`);
        return false;
      }
    }
    return true;
  }

  private config(node: Node): RaftConfig {
    return {
      id: node.id,
      electionTicks: 20,
      heartbeatTicks: 2,
      randomInt: (n) => node.rng.int(n),
      preVote: true,
      checkQuorum: true,
      maxAppendBytes: this.o.maxAppendBytes,
      maxInflightAppends: 8,
      maxUncommittedBytes: 8 << 20,
      snapshotChunkBytes: this.o.chunkBytes,
      maxInflightSnapshotChunks: this.o.maxInflightSnapshotChunks,
      ...(this.o.plantedBugs === undefined ? {} : { plantedBugs: this.o.plantedBugs }),
    };
  }

  private start(node: Node): void {
    const { hard, snapshot, entries } = node.disk.load();
    node.raft = new RaftNode(this.config(node), { hardState: hard, snapshot, entries });
    node.hash = decodeHash(snapshot.data);
    node.applied = snapshot.meta.index;
    node.snapshotIndex = snapshot.meta.index;
    node.incarnation++;
    const inc = node.incarnation;
    const tick = (): void => {
      if (node.raft === null || node.incarnation !== inc) return;
      node.raft.tick();
      this.process(node);
      this.q.schedule(this.q.now + tickMs, tick);
    };
    this.q.schedule(this.q.now + node.rng.range(0, tickMs), tick);
    this.process(node);
  }

  private crash(node: Node): void {
    node.raft = null;
    node.disk.crash();
    node.incarnation++;
  }

  private leader(): Node | null {
    let best: Node | null = null;
    for (const n of this.nodes.values()) {
      const s = n.raft?.softState();
      if (s?.role === Role.Leader && (best === null || s.term > (best.raft?.softState().term ?? 0))) best = n;
    }
    return best;
  }

  private scheduleWrites(): void {
    const write = (): void => {
      const l = this.leader();
      if (l?.raft !== null && l !== null && l.raft !== null) {
        const name = new TextEncoder().encode(`w${this.writes}`);
        const data = new Uint8Array(name.byteLength + this.o.entryBytes);
        data.set(name);
        if (l.raft.propose(data).ok) this.writes++;
        this.process(l);
      }
      this.q.schedule(this.q.now + this.o.writeEveryMs * this.rng.range(0.5, 1.5), write);
    };
    this.q.schedule(this.q.now + this.o.writeEveryMs, write);
  }

  private process(node: Node): void {
    const raft = node.raft;
    if (raft === null) return;
    while (raft.hasReady()) {
      const rd = raft.ready();
      const s = rd.softState;
      if (s.role === Role.Leader) {
        const other = this.leaderOfTerm.get(s.term);
        if (other !== undefined && other !== node.id)
          throw new Error(`two leaders in term ${s.term}: ${other} and ${node.id}`);
        this.leaderOfTerm.set(s.term, node.id);
      }
      const early = s.role === Role.Leader ? rd.messages.filter(sendBeforePersist) : [];
      for (const m of early) this.send(m);
      this.persist(node, rd);
      for (const m of rd.messages) if (!early.includes(m)) this.send(m);
      this.apply(node, rd);
      raft.advance(rd);
    }
    this.maybeCompact(node);
  }

  private persist(node: Node, rd: Ready): void {
    if (rd.snapshot !== null) {
      node.disk.installSnapshot(rd.snapshot);
      this.snapshotsInstalled++;
    }
    node.disk.writeEntries(rd.entries);
    if (rd.hardState !== null) node.disk.writeHardState(rd.hardState);
    if (rd.mustSync) node.disk.sync();
  }

  private apply(node: Node, rd: Ready): void {
    if (rd.snapshot !== null) {
      node.hash = decodeHash(rd.snapshot.data);
      node.applied = rd.snapshot.meta.index;
      node.snapshotIndex = rd.snapshot.meta.index;
      this.checkAgreement(node);
    }
    for (const e of rd.committedEntries) {
      if (e.index <= node.applied) continue;
      if (e.kind === EntryKind.Normal) node.hash = mix(node.hash, e.index, e.data);
      node.applied = e.index;
      this.checkAgreement(node);
    }
  }

  /** State machine safety: every node that applied index i holds the same state there. */
  private checkAgreement(node: Node): void {
    const seen = this.hashAt.get(node.applied);
    if (seen === undefined) this.hashAt.set(node.applied, node.hash);
    else if (seen !== node.hash) throw new Error(`${node.id} disagrees at index ${node.applied}`);
  }

  private maybeCompact(node: Node): void {
    const raft = node.raft;
    if (raft === null || this.o.snapshotEvery <= 0 || node.applied - node.snapshotIndex < this.o.snapshotEvery) return;
    if (
      raft.softState().role === Role.Leader &&
      this.lagging !== null &&
      raft.status().progress.get(this.lagging)?.state === 'snapshot'
    )
      this.compactionsDuringTransfer++;
    const snap: Snapshot = raft.compact(encodeState(node.hash, node.applied, this.o.snapshotBytes), this.o.trailing);
    node.disk.writeSnapshot(snap, raft.firstIndex());
    node.disk.sync();
    node.snapshotIndex = snap.meta.index;
  }

  private send(m: Message): void {
    if (this.rng.chance(this.o.dropRate)) return;
    if (m.type === 'snapshot') this.snapshotChunkBytesSent += m.chunk.byteLength;
    if (m.type === 'append' && m.to === this.lagging) this.appendBytesToLagging += messageBytes(m);
    const link = `${m.from}>${m.to}`;
    const leaves = Math.max(this.q.now, this.linkFree.get(link) ?? 0) + messageBytes(m) / this.o.bytesPerMs;
    this.linkFree.set(link, leaves);
    this.q.schedule(leaves + this.o.latencyMs * this.rng.range(0.5, 1.5), () => {
      const to = this.nodes.get(m.to);
      if (to?.raft === null || to === undefined || to.raft === null) return;
      to.raft.step(m);
      this.process(to);
    });
  }
}
