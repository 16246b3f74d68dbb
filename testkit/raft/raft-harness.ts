// A hand-driven cluster for scenario tests: the test decides which node ticks, which messages are
// delivered or dropped, and when nodes crash. Storage is the simulator's fake disk, so a crash
// loses exactly what was not synced.
import {
  bootstrapEntry,
  EntryKind,
  RaftNode,
  Role,
  type Entry,
  type Message,
  type NodeId,
  type PlantedBugs,
  type RaftConfig,
  type ReadState,
  type Snapshot,
} from '../../coordinator/raft/index.js';
import { SimDisk } from './sim-disk.js';
import { Rng } from '../random.js';

export interface HarnessNode {
  readonly id: NodeId;
  raft: RaftNode | null;
  readonly disk: SimDisk;
  /** Normal entries applied, in order, as strings. */
  applied: string[];
  appliedIndex: number;
  /** Term of every entry this node applied, by index (survives only in memory, for checks). */
  appliedTerms: Map<number, number>;
  readStates: ReadState[];
  failedReads: string[];
  /** The state machine: the applied commands, serialized into snapshots. */
  snapshotData: Uint8Array;
}

export interface HarnessOptions {
  readonly preVote?: boolean;
  readonly checkQuorum?: boolean;
  readonly plantedBugs?: PlantedBugs;
  readonly snapshotChunkBytes?: number;
  readonly electionTicks?: number;
  readonly maxAppendBytes?: number;
  readonly seed?: number;
  /**
   * 'snapshot': every node (also one added later) starts from a conf-only snapshot listing the
   * founding voters. 'entry': founders write the bootstrap entry at index 1 (as the coordinator
   * does); a node added later starts empty and learns the configuration from the log.
   */
  readonly bootstrap?: 'snapshot' | 'entry';
}

const enc = new TextEncoder();
const dec = new TextDecoder();

export class Harness {
  readonly nodes = new Map<NodeId, HarnessNode>();
  /** Messages sent and not yet delivered. */
  inflight: Message[] = [];
  /** Links that drop everything: "from>to". */
  readonly cut = new Set<string>();
  readonly electionTicks: number;
  private readonly rng: Rng;

  constructor(
    readonly voters: readonly NodeId[],
    private readonly opts: HarnessOptions = {},
  ) {
    this.electionTicks = opts.electionTicks ?? 10;
    this.rng = new Rng(opts.seed ?? 1);
    for (const id of voters) this.addNode(id);
  }

  addNode(id: NodeId): HarnessNode {
    const founder = this.voters.includes(id) && !this.nodes.has(id) && this.nodes.size < this.voters.length;
    const byEntry = this.opts.bootstrap === 'entry';
    const disk = new SimDisk({
      hard: byEntry && founder ? { term: 1, vote: null, commit: 1 } : { term: 0, vote: null, commit: 0 },
      snapshot: {
        meta: { index: 0, term: 0, conf: { voters: byEntry ? [] : [...this.voters], learners: [] } },
        data: encodeApplied([]),
      },
      entries: byEntry && founder ? [bootstrapEntry(this.voters)] : [],
    });
    const node: HarnessNode = {
      id,
      raft: null,
      disk,
      applied: [],
      appliedIndex: 0,
      appliedTerms: new Map(),
      readStates: [],
      failedReads: [],
      snapshotData: encodeApplied([]),
    };
    this.nodes.set(id, node);
    this.start(id);
    return node;
  }

  config(id: NodeId): RaftConfig {
    const rng = this.rng.fork();
    return {
      id,
      electionTicks: this.electionTicks,
      heartbeatTicks: 1,
      randomInt: (n) => rng.int(n),
      preVote: this.opts.preVote ?? true,
      checkQuorum: this.opts.checkQuorum ?? true,
      maxAppendBytes: this.opts.maxAppendBytes ?? 1 << 20,
      maxInflightAppends: 8,
      maxUncommittedBytes: 1 << 24,
      snapshotChunkBytes: this.opts.snapshotChunkBytes ?? 1 << 16,
      ...(this.opts.plantedBugs === undefined ? {} : { plantedBugs: this.opts.plantedBugs }),
    };
  }

  node(id: NodeId): HarnessNode {
    const n = this.nodes.get(id);
    if (n === undefined) throw new Error(`no node ${id}`);
    return n;
  }

  raft(id: NodeId): RaftNode {
    const r = this.node(id).raft;
    if (r === null) throw new Error(`node ${id} is down`);
    return r;
  }

  start(id: NodeId): void {
    const n = this.node(id);
    const { hard, snapshot, entries } = n.disk.load();
    n.raft = new RaftNode(this.config(id), { hardState: hard, snapshot, entries });
    n.applied = decodeApplied(snapshot.data);
    n.appliedIndex = snapshot.meta.index;
    this.process(id);
  }

  crash(id: NodeId): void {
    const n = this.node(id);
    n.raft = null;
    n.disk.crash();
    this.inflight = this.inflight.filter((m) => m.from !== id);
  }

  /** Runs every Ready of a node: persist, queue messages, apply. */
  process(id: NodeId): void {
    const n = this.node(id);
    const raft = n.raft;
    if (raft === null) return;
    while (raft.hasReady()) {
      const rd = raft.ready();
      if (rd.snapshot !== null) {
        n.disk.installSnapshot(rd.snapshot);
        n.applied = decodeApplied(rd.snapshot.data);
        n.appliedIndex = rd.snapshot.meta.index;
      }
      n.disk.writeEntries(rd.entries);
      if (rd.hardState !== null) n.disk.writeHardState(rd.hardState);
      if (rd.mustSync) n.disk.sync();
      this.inflight.push(...rd.messages);
      for (const e of rd.committedEntries) {
        if (e.kind === EntryKind.Normal) n.applied.push(dec.decode(e.data));
        n.appliedIndex = e.index;
        n.appliedTerms.set(e.index, e.term);
      }
      n.readStates.push(...rd.readStates);
      n.failedReads.push(...rd.failedReads);
      raft.advance(rd);
    }
  }

  tick(id: NodeId, times = 1): void {
    for (let i = 0; i < times; i++) {
      const r = this.node(id).raft;
      if (r === null) return;
      r.tick();
      this.process(id);
    }
  }

  /** Ticks one node until it leaves the follower role (starts a pre-vote or vote). */
  timeout(id: NodeId): void {
    for (let i = 0; i < 3 * this.electionTicks; i++) {
      this.tick(id);
      if (this.raft(id).softState().role !== Role.Follower) return;
    }
    throw new Error(`${id} did not campaign`);
  }

  /** Makes `id` leader: it times out and the cluster exchanges messages until quiet. */
  elect(id: NodeId): void {
    this.timeout(id);
    this.stabilize();
    const s = this.raft(id).softState();
    if (s.role !== Role.Leader) throw new Error(`${id} did not become leader (role ${s.role}, term ${s.term})`);
  }

  /** Delivers messages (dropping those on cut links or to down nodes) until none are left. */
  stabilize(maxRounds = 10_000): void {
    for (let round = 0; round < maxRounds && this.inflight.length > 0; round++) {
      const batch = this.inflight;
      this.inflight = [];
      for (const m of batch) this.deliver(m);
    }
  }

  deliver(m: Message): void {
    if (this.cut.has(`${m.from}>${m.to}`)) return;
    const n = this.nodes.get(m.to);
    if (n?.raft === null || n === undefined) return;
    n.raft.step(m);
    this.process(m.to);
  }

  /** Cuts a node off from every other node, both ways. */
  isolate(id: NodeId): void {
    for (const o of this.nodes.keys()) {
      if (o === id) continue;
      this.cut.add(`${id}>${o}`);
      this.cut.add(`${o}>${id}`);
    }
  }

  heal(): void {
    this.cut.clear();
  }

  /** Drops every undelivered message. */
  dropAll(): void {
    this.inflight = [];
  }

  propose(id: NodeId, command: string): ReturnType<RaftNode['propose']> {
    const r = this.raft(id).propose(enc.encode(command));
    this.process(id);
    return r;
  }

  leaders(): NodeId[] {
    return [...this.nodes.values()].filter((n) => n.raft?.softState().role === Role.Leader).map((n) => n.id);
  }

  /** Takes a snapshot of the applied state on a node and compacts its log. */
  compact(id: NodeId, keepTrailing = 0): Snapshot {
    const n = this.node(id);
    const snap = this.raft(id).compact(encodeApplied(n.applied), keepTrailing);
    n.disk.writeSnapshot(snap, this.raft(id).firstIndex());
    n.disk.sync();
    return snap;
  }

  /** The entries a node holds from index 1 (or its first index) to its last. */
  logOf(id: NodeId): Entry[] {
    const r = this.raft(id);
    const st = r.status();
    const out: Entry[] = [];
    for (let i = st.firstIndex; i <= st.lastIndex; i++) {
      const e = r.entryAt(i);
      if (e !== undefined) out.push(e);
    }
    return out;
  }
}

export function encodeApplied(applied: readonly string[]): Uint8Array {
  return enc.encode(JSON.stringify(applied));
}

export function decodeApplied(data: Uint8Array): string[] {
  return JSON.parse(dec.decode(data)) as string[];
}
