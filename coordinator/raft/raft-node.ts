// The Raft consensus core: one node's state machine, deterministic and free of I/O.
//
// Drive it like this (see Ready in raft-types.ts for the persistence contract):
//   node.tick()               every tick of the caller's clock
//   node.step(message)        for every message received from a peer
//   node.propose(data)        on the leader, to replicate a command
//   node.readIndex(ctx)       to start a linearizable read
//   if (node.hasReady()) { const rd = node.ready(); persist; send; apply; node.advance(rd); }
//
// Implemented: randomized elections with PreVote and CheckQuorum (and leader-lease vote rejection),
// pipelined and batched replication with per-follower flow control and fast conflict back-off,
// the current-term commit rule with a no-op entry per term, snapshots sent in chunks, leadership
// transfer by TimeoutNow, ReadIndex reads confirmed by a heartbeat round, single-server membership
// changes with learners (one at a time, only after the leader committed an entry of its term).
import { RaftLog, entryBytes } from './raft-log.js';
import { Progress } from './raft-progress.js';
import { assert } from './raft-assert.js';
import { decodeConfEntry, encodeConfChange, validateConfChange, applyConfChangeTo } from './raft-conf.js';
import {
  defaultRaftTuning,
  EntryKind,
  Role,
  type AppendMessage,
  type BootstrapConf,
  type AppendResponse,
  type ConfChange,
  type ConfState,
  type Entry,
  type HardState,
  type HeartbeatMessage,
  type HeartbeatResponse,
  type Message,
  type NodeId,
  type ProposeResult,
  type RaftConfig,
  type RaftInitialState,
  type ReadState,
  type Ready,
  type Snapshot,
  type SnapshotChunkMessage,
  type SnapshotChunkResponse,
  type SoftState,
  type VoteResponse,
} from './raft-types.js';

/** Committed entries handed out per Ready, so one Ready never holds an unbounded batch. */
const MAX_COMMITTED_ENTRIES_PER_READY = 4096;
/** Pending linearizable reads a leader queues before refusing more. */
const MAX_PENDING_READS = 65_536;
/** Largest snapshot a follower assembles from chunks. */
const MAX_SNAPSHOT_BYTES = 1 << 30;
/**
 * Heartbeat responses without any append acknowledged (entries missing) before the leader takes the
 * appends (or the probe) in flight for lost.
 */
const appendIdleHeartbeatsBeforeProbe = 4;
/**
 * Heartbeat responses without new snapshot bytes confirmed before the leader resends from the last confirmed offset.
 */
const snapshotIdleHeartbeatsBeforeResend = 4;

interface PendingRead {
  readonly ctx: string;
  /** Who asked: this node, or a follower that forwarded it. */
  readonly from: NodeId;
  readonly index: number;
  readonly seq: number;
  readonly acks: Set<NodeId>;
}

interface IncomingSnapshot {
  readonly meta: Snapshot['meta'];
  readonly totalBytes: number;
  readonly parts: Uint8Array[];
  received: number;
}

export interface RaftStatus {
  readonly id: NodeId;
  readonly role: Role;
  readonly term: number;
  readonly vote: NodeId | null;
  readonly leader: NodeId | null;
  readonly commit: number;
  readonly applied: number;
  readonly lastIndex: number;
  readonly firstIndex: number;
  readonly snapshotIndex: number;
  readonly conf: ConfState;
  readonly transferee: NodeId | null;
  readonly progress: ReadonlyMap<
    NodeId,
    { match: number; next: number; state: string; recentActive: boolean; isLearner: boolean }
  >;
}

export class RaftNode {
  readonly id: NodeId;
  private readonly cfg: RaftConfig;
  private readonly log: RaftLog;
  private term: number;
  private vote: NodeId | null;
  private leader: NodeId | null = null;
  private role: Role = Role.Follower;
  private voters: Set<NodeId>;
  private learners: Set<NodeId>;
  private readonly progress = new Map<NodeId, Progress>();
  private electionElapsed = 0;
  private heartbeatElapsed = 0;
  private randomizedElectionTicks = 0;
  private readonly votes = new Map<NodeId, boolean>();
  private msgs: Message[] = [];
  private readStates: ReadState[] = [];
  private failedReads: string[] = [];
  /** The hard state last handed out for persisting. */
  private persistedHard: HardState;
  private transferee: NodeId | null = null;
  private transferElapsed = 0;
  private pendingConfIndex = 0;
  private uncommittedBytes = 0;
  private readSeq = 0;
  private pendingReads: PendingRead[] = [];
  private readsAwaitingTermCommit: { ctx: string; from: NodeId }[] = [];
  private incomingSnapshot: IncomingSnapshot | null = null;
  private lastSnapshotReceive: { index: number; receivedBytes: number; totalBytes: number } | null = null;
  private readyOutstanding = false;
  private refuseVotes: boolean;

  constructor(cfg: RaftConfig, initial: RaftInitialState) {
    assert(
      cfg.heartbeatTicks > 0 && cfg.heartbeatTicks < cfg.electionTicks,
      'heartbeatTicks must be in (0, electionTicks)',
    );
    assert(cfg.maxInflightAppends > 0, 'maxInflightAppends must be positive');
    assert(cfg.snapshotChunkBytes > 0, 'snapshotChunkBytes must be positive');
    assert((cfg.maxInflightSnapshotChunks ?? 1) > 0, 'maxInflightSnapshotChunks must be positive');
    this.id = cfg.id;
    this.cfg = cfg;
    this.log = new RaftLog(initial.snapshot, initial.entries, initial.hardState.commit);
    this.term = initial.hardState.term;
    this.vote = initial.hardState.vote;
    this.persistedHard = initial.hardState;
    this.voters = new Set(initial.snapshot.meta.conf.voters);
    this.learners = new Set(initial.snapshot.meta.conf.learners);
    this.refuseVotes = cfg.refuseToVote === true;
    this.resetRandomizedElectionTimeout();
  }

  /** Lets a node that started refusing votes (identity not yet confirmed) vote and campaign, or stops it. */
  setVoting(allowed: boolean): void {
    this.assertNoReadyOutstanding();
    this.refuseVotes = !allowed;
  }

  votingAllowed(): boolean {
    return !this.refuseVotes;
  }

  // ---------------------------------------------------------------------------------------------
  // Inputs

  tick(): void {
    this.assertNoReadyOutstanding();
    if (this.role === Role.Leader) this.tickLeader();
    else this.tickElection();
  }

  step(m: Message): void {
    this.assertNoReadyOutstanding();
    if (m.to !== this.id) return;
    if (m.term > this.term) {
      if (m.type === 'pre-vote' || m.type === 'vote') {
        const forced = m.type === 'vote' && m.transfer;
        const inLease = this.cfg.checkQuorum && this.leader !== null && this.electionElapsed < this.cfg.electionTicks;
        // A node that heard from a live leader recently ignores disruptive campaigns (§9.6 / §4.2.3).
        if (!forced && inLease) return;
      }
      if (m.type === 'pre-vote') {
        // Never change term on a pre-vote: it is a question, not a campaign.
      } else if (m.type === 'pre-vote-resp' && !m.reject) {
        // A granted pre-vote carries the term we would campaign at.
      } else if (m.type === 'append' || m.type === 'heartbeat' || m.type === 'snapshot') {
        this.becomeFollower(m.term, m.from);
      } else {
        this.becomeFollower(m.term, null);
      }
    } else if (m.term < this.term) {
      if ((this.cfg.checkQuorum || this.cfg.preVote) && (m.type === 'append' || m.type === 'heartbeat')) {
        // A stale leader (e.g. one that was paused) learns of the newer term and steps down.
        this.send({
          type: 'append-resp',
          from: this.id,
          to: m.from,
          term: this.term,
          reject: true,
          index: 0,
          hintIndex: 0,
          hintTerm: 0,
        });
      } else if (m.type === 'pre-vote') {
        this.send({ type: 'pre-vote-resp', from: this.id, to: m.from, term: this.term, reject: true });
      }
      return;
    }

    switch (m.type) {
      case 'pre-vote':
      case 'vote':
        this.handleVoteRequest(m.type, m.from, m.term, m.lastIndex, m.lastTerm);
        return;
      case 'pre-vote-resp':
      case 'vote-resp':
        this.handleVoteResponse(m);
        return;
      case 'append':
      case 'heartbeat':
      case 'snapshot':
        assert(this.role !== Role.Leader, `two leaders in term ${this.term}: ${this.id} and ${m.from}`);
        if (this.role !== Role.Follower) this.becomeFollower(this.term, m.from);
        this.leader = m.from;
        this.electionElapsed = 0;
        if (m.type === 'append') this.handleAppend(m);
        else if (m.type === 'heartbeat') this.handleHeartbeat(m);
        else this.handleSnapshotChunk(m);
        return;
      case 'append-resp':
        if (this.role === Role.Leader) this.handleAppendResponse(m);
        return;
      case 'heartbeat-resp':
        if (this.role === Role.Leader) this.handleHeartbeatResponse(m);
        return;
      case 'snapshot-resp':
        if (this.role === Role.Leader) this.handleSnapshotResponse(m);
        return;
      case 'timeout-now':
        if (this.promotable()) this.campaign('vote', true);
        return;
      case 'read-index':
        if (this.role === Role.Leader) this.handleRead(m.ctx, m.from);
        else this.send({ type: 'read-index-resp', from: this.id, to: m.from, term: this.term, ctx: m.ctx, index: -1 });
        return;
      case 'read-index-resp':
        if (m.index >= 0) this.readStates.push({ ctx: m.ctx, index: m.index });
        else this.failedReads.push(m.ctx);
        return;
    }
  }

  /** Replicates an application command. Only the leader accepts; others say who leads. */
  propose(data: Uint8Array): ProposeResult {
    this.assertNoReadyOutstanding();
    return this.appendProposal(EntryKind.Normal, data);
  }

  /** Proposes one membership change; one may be in flight at a time. */
  proposeConfChange(cc: ConfChange): ProposeResult {
    this.assertNoReadyOutstanding();
    if (this.role !== Role.Leader) return { ok: false, reason: 'not-leader', leader: this.leader };
    if (this.pendingConfIndex > this.log.applied) {
      return {
        ok: false,
        reason: 'conf-change-pending',
        leader: this.id,
        detail: `a membership change at index ${this.pendingConfIndex} is not applied yet`,
      };
    }
    if (this.log.term(this.log.committed) !== this.term) {
      // The fix for the single-server change bug: commit an entry of this term first.
      return {
        ok: false,
        reason: 'term-not-committed',
        leader: this.id,
        detail: 'the leader has not committed an entry of its term yet',
      };
    }
    const problem = validateConfChange(this.confState(), cc);
    if (problem !== null) return { ok: false, reason: 'invalid-conf-change', leader: this.id, detail: problem };
    const res = this.appendProposal(EntryKind.Conf, encodeConfChange(cc));
    if (res.ok) this.pendingConfIndex = res.index;
    return res;
  }

  /** Starts a linearizable read; its ReadState (or failure) appears in a later Ready under ctx. */
  readIndex(ctx: string): void {
    this.assertNoReadyOutstanding();
    if (this.role === Role.Leader) this.handleRead(ctx, this.id);
    else if (this.leader !== null)
      this.send({ type: 'read-index', from: this.id, to: this.leader, term: this.term, ctx });
    else this.failedReads.push(ctx);
  }

  /** Hands leadership to `to` (a voter): stops accepting proposals, catches it up, sends TimeoutNow. */
  transferLeadership(to: NodeId): { ok: true } | { ok: false; detail: string } {
    this.assertNoReadyOutstanding();
    if (this.role !== Role.Leader) return { ok: false, detail: `not the leader (leader: ${this.leader ?? 'unknown'})` };
    if (to === this.id) return { ok: true };
    if (!this.voters.has(to)) return { ok: false, detail: `${to} is not a voting member` };
    const pr = this.progress.get(to);
    assert(pr !== undefined, `no progress for voter ${to}`);
    this.transferee = to;
    this.transferElapsed = 0;
    if (pr.match === this.log.lastIndex()) this.sendTimeoutNow(to);
    else this.sendAppend(to, pr);
    return { ok: true };
  }

  /**
   * Takes the application's snapshot at the applied index and compacts the log, keeping up to
   * `keepTrailing` entries below it for followers that lag a little. A leader also keeps the entries
   * after every snapshot it is still sending (up to `maxSnapshotHoldBytes`), so a follower that
   * installs it continues from the log instead of needing a newer snapshot: a transfer that takes
   * longer than the log takes to move on still ends. The log then holds entries from `firstIndex()`
   * on; the caller must have made the snapshot durable and compact its stored log to the same index.
   * `point`: where the snapshot was taken (snapshotPoint(), default now) when it was encoded later,
   * past the log's last snapshot.
   */
  compact(data: Uint8Array, keepTrailing: number, point = this.snapshotPoint()): Snapshot {
    this.assertNoReadyOutstanding();
    const index = point.index;
    assert(index <= this.log.applied, `snapshot at ${index} past applied ${this.log.applied}`);
    const term = this.log.term(index);
    assert(term !== undefined, `no term at snapshot index ${index}`);
    const snapshot: Snapshot = { meta: { index, term, conf: point.conf }, data };
    const firstBefore = this.log.firstIndex();
    const held = this.heldEntriesFrom();
    this.log.compact(snapshot, Math.min(index - keepTrailing + 1, held));
    assert(
      held === Number.POSITIVE_INFINITY || this.log.firstIndex() <= Math.max(firstBefore, held),
      `compaction dropped entries from ${held} that a snapshot transfer holds`,
    );
    return snapshot;
  }

  /** The applied index and membership a snapshot of the state machine taken now stands at. */
  snapshotPoint(): { readonly index: number; readonly conf: ConfState } {
    return { index: this.log.applied, conf: this.confState() };
  }

  /** The first index the log holds after the last compact(); the stored log keeps from here too. */
  firstIndex(): number {
    return this.log.firstIndex();
  }

  /**
   * The first entry a follower receiving one of this leader's held snapshots needs next, or
   * Infinity when there is none or holding the log from there would exceed the bound (the follower
   * then needs a newer snapshot after this one, as without the hold).
   */
  private heldEntriesFrom(): number {
    if (this.role !== Role.Leader) return Number.POSITIVE_INFINITY;
    let from = Number.POSITIVE_INFINITY;
    for (const pr of this.progress.values()) {
      if (pr.state === 'snapshot' && pr.snapshot !== null) from = Math.min(from, pr.snapshotIndex + 1);
    }
    if (from === Number.POSITIVE_INFINITY) return from;
    const bound = this.cfg.maxSnapshotHoldBytes ?? defaultRaftTuning.maxSnapshotHoldBytes;
    return this.log.bytesAfter(from - 1) <= bound ? from : Number.POSITIVE_INFINITY;
  }

  // ---------------------------------------------------------------------------------------------
  // Outputs

  hasReady(): boolean {
    return (
      this.msgs.length > 0 ||
      this.readStates.length > 0 ||
      this.failedReads.length > 0 ||
      this.log.pendingSnapshot !== null ||
      this.log.unstableEntries().length > 0 ||
      this.hardStateChanged() ||
      this.log.nextCommitted(1).length > 0
    );
  }

  ready(): Ready {
    this.assertNoReadyOutstanding();
    const hard = this.currentHardState();
    const changed = this.hardStateChanged();
    const entries = this.log.unstableEntries();
    const rd: Ready = {
      softState: this.softState(),
      hardState: changed ? hard : null,
      entries,
      snapshot: this.log.pendingSnapshot,
      committedEntries: this.log.nextCommitted(MAX_COMMITTED_ENTRIES_PER_READY),
      messages: this.msgs,
      readStates: this.readStates,
      failedReads: this.failedReads,
      mustSync:
        entries.length > 0 ||
        this.log.pendingSnapshot !== null ||
        hard.term !== this.persistedHard.term ||
        hard.vote !== this.persistedHard.vote,
    };
    this.msgs = [];
    this.readStates = [];
    this.failedReads = [];
    this.readyOutstanding = true;
    return rd;
  }

  advance(rd: Ready): void {
    assert(this.readyOutstanding, 'advance() without an outstanding ready()');
    this.readyOutstanding = false;
    if (rd.snapshot !== null && this.log.pendingSnapshot === rd.snapshot) this.log.pendingSnapshot = null;
    const last = rd.entries.at(-1);
    if (last !== undefined) this.log.stableTo(last.index, last.term);
    if (rd.hardState !== null) this.persistedHard = rd.hardState;
    for (const e of rd.committedEntries) {
      if (e.kind === EntryKind.Conf) this.applyConfChange(decodeConfEntry(e.data));
      this.log.appliedTo(e.index);
    }
    if (this.role === Role.Leader) this.maybeCommitAndBroadcast();
  }

  softState(): SoftState {
    return { role: this.role, leader: this.leader, term: this.term };
  }

  status(): RaftStatus {
    const progress = new Map<
      NodeId,
      { match: number; next: number; state: string; recentActive: boolean; isLearner: boolean }
    >();
    for (const [id, pr] of this.progress)
      progress.set(id, {
        match: pr.match,
        next: pr.next,
        state: pr.state,
        recentActive: pr.recentActive,
        isLearner: pr.isLearner,
      });
    return {
      id: this.id,
      role: this.role,
      term: this.term,
      vote: this.vote,
      leader: this.leader,
      commit: this.log.committed,
      applied: this.log.applied,
      lastIndex: this.log.lastIndex(),
      firstIndex: this.log.firstIndex(),
      snapshotIndex: this.log.snapshotMeta().index,
      conf: this.confState(),
      transferee: this.transferee,
      progress,
    };
  }

  /** How far the latest snapshot from the leader has arrived (complete once received = total; null before any). */
  incomingSnapshotProgress(): {
    readonly index: number;
    readonly receivedBytes: number;
    readonly totalBytes: number;
  } | null {
    return this.lastSnapshotReceive;
  }

  /** The entry at index if this node still holds it (for tests and the simulator's checkers). */
  entryAt(index: number): Entry | undefined {
    return this.log.entry(index);
  }

  termAt(index: number): number | undefined {
    return this.log.term(index);
  }

  confState(): ConfState {
    return { voters: [...this.voters].sort(), learners: [...this.learners].sort() };
  }

  // ---------------------------------------------------------------------------------------------
  // Roles

  private becomeFollower(term: number, leader: NodeId | null): void {
    const wasLeader = this.role === Role.Leader;
    if (term > this.term) this.vote = null;
    this.term = term;
    this.role = Role.Follower;
    this.leader = leader;
    this.electionElapsed = 0;
    this.heartbeatElapsed = 0;
    this.transferee = null;
    this.votes.clear();
    this.resetRandomizedElectionTimeout();
    if (wasLeader) {
      this.progress.clear();
      this.failPendingReads();
    }
  }

  private becomePreCandidate(): void {
    this.role = Role.PreCandidate;
    this.leader = null;
    this.votes.clear();
    this.electionElapsed = 0;
    this.resetRandomizedElectionTimeout();
  }

  private becomeCandidate(): void {
    this.term += 1;
    this.vote = this.id;
    this.role = Role.Candidate;
    this.leader = null;
    this.votes.clear();
    this.electionElapsed = 0;
    this.resetRandomizedElectionTimeout();
  }

  private becomeLeader(): void {
    assert(this.role === Role.Candidate, 'only a candidate becomes leader');
    this.role = Role.Leader;
    this.leader = this.id;
    this.electionElapsed = 0;
    this.heartbeatElapsed = 0;
    this.transferee = null;
    this.uncommittedBytes = 0;
    this.progress.clear();
    const next = this.log.lastIndex() + 1;
    for (const id of this.voters) if (id !== this.id) this.progress.set(id, new Progress(next, false));
    for (const id of this.learners) if (id !== this.id) this.progress.set(id, new Progress(next, true));
    // Any membership change still in the log must be applied before another may be proposed.
    this.pendingConfIndex = this.log.lastIndex();
    this.log.appendNew({ term: this.term, index: next, kind: EntryKind.Noop, data: new Uint8Array(0) });
    this.broadcastAppend();
  }

  private campaign(kind: 'pre-vote' | 'vote', transfer = false): void {
    if (kind === 'pre-vote') this.becomePreCandidate();
    else this.becomeCandidate();
    const voteTerm = kind === 'pre-vote' ? this.term + 1 : this.term;
    this.votes.set(this.id, true);
    if (this.countVotes().granted >= this.quorum()) {
      if (kind === 'pre-vote') this.campaign('vote');
      else this.becomeLeader();
      return;
    }
    const lastIndex = this.log.lastIndex();
    const lastTerm = this.log.lastTerm();
    for (const id of this.voters) {
      if (id === this.id) continue;
      if (kind === 'pre-vote')
        this.send({ type: 'pre-vote', from: this.id, to: id, term: voteTerm, lastIndex, lastTerm });
      else this.send({ type: 'vote', from: this.id, to: id, term: voteTerm, lastIndex, lastTerm, transfer });
    }
  }

  private handleVoteRequest(
    kind: 'pre-vote' | 'vote',
    from: NodeId,
    term: number,
    lastIndex: number,
    lastTerm: number,
  ): void {
    const canVote =
      this.vote === from || (this.vote === null && this.leader === null) || (kind === 'pre-vote' && term > this.term);
    const grant = canVote && !this.refuseVotes && this.log.isUpToDate(lastIndex, lastTerm);
    const respType = kind === 'pre-vote' ? 'pre-vote-resp' : 'vote-resp';
    if (grant) {
      if (kind === 'vote') {
        this.vote = from;
        this.electionElapsed = 0;
      }
      this.send({ type: respType, from: this.id, to: from, term, reject: false });
    } else {
      this.send({ type: respType, from: this.id, to: from, term: this.term, reject: true });
    }
  }

  private handleVoteResponse(m: VoteResponse): void {
    const expected = m.type === 'pre-vote-resp' ? Role.PreCandidate : Role.Candidate;
    if (this.role !== expected) return;
    if (m.type === 'vote-resp' && m.term !== this.term) return;
    if (m.type === 'pre-vote-resp' && !m.reject && m.term !== this.term + 1) return;
    if (!this.voters.has(m.from)) return;
    if (!this.votes.has(m.from)) this.votes.set(m.from, !m.reject);
    const { granted, rejected } = this.countVotes();
    if (granted >= this.quorum()) {
      if (m.type === 'pre-vote-resp') this.campaign('vote');
      else this.becomeLeader();
    } else if (rejected >= this.quorum()) {
      this.becomeFollower(this.term, null);
    }
  }

  private countVotes(): { granted: number; rejected: number } {
    let granted = 0;
    let rejected = 0;
    for (const [id, v] of this.votes) {
      if (!this.voters.has(id)) continue;
      if (v) granted++;
      else rejected++;
    }
    return { granted, rejected };
  }

  // ---------------------------------------------------------------------------------------------
  // Ticks

  private tickElection(): void {
    this.electionElapsed++;
    if (this.promotable() && this.electionElapsed >= this.randomizedElectionTicks) {
      this.electionElapsed = 0;
      this.campaign(this.cfg.preVote ? 'pre-vote' : 'vote');
    }
  }

  private tickLeader(): void {
    this.heartbeatElapsed++;
    this.electionElapsed++;
    if (this.electionElapsed >= this.cfg.electionTicks) {
      this.electionElapsed = 0;
      if (this.cfg.checkQuorum) {
        let active = this.voters.has(this.id) ? 1 : 0;
        for (const [id, pr] of this.progress) {
          if (this.voters.has(id) && pr.recentActive) active++;
          pr.recentActive = false;
        }
        if (active < this.quorum()) {
          this.becomeFollower(this.term, null);
          return;
        }
      }
      if (this.transferee !== null) this.transferee = null; // the transfer timed out
    }
    if (this.transferee !== null) {
      this.transferElapsed++;
      if (this.transferElapsed >= this.cfg.electionTicks) this.transferee = null;
    }
    if (this.heartbeatElapsed >= this.cfg.heartbeatTicks) {
      this.heartbeatElapsed = 0;
      this.broadcastHeartbeat(this.pendingReads.at(-1)?.seq ?? 0);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Replication (leader side)

  private appendProposal(kind: EntryKind, data: Uint8Array): ProposeResult {
    if (this.role !== Role.Leader) return { ok: false, reason: 'not-leader', leader: this.leader };
    if (this.transferee !== null) return { ok: false, reason: 'transfer-in-progress', leader: this.id };
    const entry: Entry = { term: this.term, index: this.log.lastIndex() + 1, kind, data };
    const size = entryBytes(entry);
    if (this.uncommittedBytes > 0 && this.uncommittedBytes + size > this.cfg.maxUncommittedBytes) {
      return { ok: false, reason: 'too-many-uncommitted', leader: this.id };
    }
    this.uncommittedBytes += size;
    this.log.appendNew(entry);
    this.broadcastAppend();
    if (this.quorum() === 1) this.maybeCommitAndBroadcast();
    return { ok: true, index: entry.index, term: entry.term };
  }

  private broadcastAppend(): void {
    for (const [id, pr] of this.progress) this.sendAppend(id, pr);
  }

  /** Sends what the follower lacks, as flow control allows. */
  private sendAppend(to: NodeId, pr: Progress, allowEmpty = false): void {
    if (!pr.canSend(this.cfg.maxInflightAppends)) return;
    const prevIndex = pr.next - 1;
    const prevTerm = this.log.term(prevIndex);
    const entries = this.log.slice(pr.next, this.cfg.maxAppendBytes);
    if (prevTerm === undefined || entries === undefined) {
      this.startSnapshot(to, pr);
      return;
    }
    if (entries.length === 0 && pr.state === 'replicate' && !allowEmpty) return;
    const m: AppendMessage = {
      type: 'append',
      from: this.id,
      to,
      term: this.term,
      prevIndex,
      prevTerm,
      entries,
      commit: this.log.committed,
    };
    this.send(m);
    const lastSent = entries.at(-1);
    if (pr.state === 'replicate') {
      if (lastSent !== undefined) {
        pr.next = lastSent.index + 1;
        pr.inflight.push(lastSent.index);
      }
    } else {
      pr.probeSent = true;
    }
  }

  private handleAppendResponse(m: AppendResponse): void {
    const pr = this.progress.get(m.from);
    if (pr === undefined) return;
    pr.recentActive = true;
    pr.appendAckedSinceHeartbeat = true;
    pr.appendIdleHeartbeats = 0;
    if (m.reject) {
      if (m.index === 0 && m.hintIndex === 0) return; // a stale-term notice, handled by the term check
      // Stale rejections: in replicate state one at or below match; in probe one not for next-1.
      if (m.index <= pr.match) return;
      if (pr.state === 'probe' && m.index !== pr.next - 1) return;
      let next = m.hintIndex;
      if (m.hintTerm > 0) {
        const idx = this.log.lastIndexOfTerm(m.hintTerm, m.index);
        if (idx !== undefined) next = idx + 1;
      }
      next = Math.max(pr.match + 1, Math.min(next, m.index));
      pr.becomeProbe();
      pr.next = next;
      this.sendAppend(m.from, pr);
      return;
    }
    const advanced = pr.acknowledge(m.index);
    if (pr.state === 'probe') {
      pr.becomeReplicate();
    } else if (pr.state === 'snapshot' && pr.match >= pr.snapshotIndex) {
      pr.becomeReplicate();
    }
    pr.probeSent = false;
    if (advanced) this.maybeCommitAndBroadcast();
    if (m.from === this.transferee && pr.match === this.log.lastIndex()) this.sendTimeoutNow(m.from);
    this.sendAppend(m.from, pr);
  }

  private maybeCommitAndBroadcast(): void {
    if (!this.maybeCommit()) return;
    // Tell up-to-date followers the new commit index now, rather than at the next heartbeat.
    for (const [id, pr] of this.progress) {
      if (pr.state === 'replicate' && pr.match === this.log.lastIndex()) this.sendAppend(id, pr, true);
    }
  }

  private maybeCommit(): boolean {
    const matches: number[] = [];
    for (const id of this.voters) {
      if (id === this.id) matches.push(this.log.stableIndex);
      else matches.push(this.progress.get(id)?.match ?? 0);
    }
    if (matches.length === 0) return false;
    matches.sort((a, b) => b - a);
    const candidate = matches[this.quorum() - 1] ?? 0;
    if (candidate <= this.log.committed) return false;
    // Figure 8: only entries of the current term are committed by counting replicas.
    if (this.log.term(candidate) !== this.term && this.cfg.plantedBugs?.commitPriorTermByCount !== true) return false;
    const before = this.log.committed;
    const hadTermCommit = this.log.term(before) === this.term;
    this.log.commitTo(candidate);
    for (let i = before + 1; i <= candidate; i++) {
      const e = this.log.entry(i);
      if (e !== undefined && e.term === this.term)
        this.uncommittedBytes = Math.max(0, this.uncommittedBytes - entryBytes(e));
    }
    if (!hadTermCommit && this.log.term(this.log.committed) === this.term) {
      const waiting = this.readsAwaitingTermCommit;
      this.readsAwaitingTermCommit = [];
      for (const r of waiting) this.handleRead(r.ctx, r.from);
    }
    return true;
  }

  private broadcastHeartbeat(readSeq: number): void {
    for (const [id, pr] of this.progress) {
      pr.appendAckedSinceHeartbeat = false;
      const m: HeartbeatMessage = {
        type: 'heartbeat',
        from: this.id,
        to: id,
        term: this.term,
        commit: Math.min(pr.match, this.log.committed),
        readSeq,
      };
      this.send(m);
    }
  }

  private handleHeartbeatResponse(m: HeartbeatResponse): void {
    const pr = this.progress.get(m.from);
    if (pr === undefined) return;
    pr.recentActive = true;
    if (pr.state === 'probe' && pr.probeSent) {
      // A probe unanswered for several heartbeats was lost; one answered late is only slow (a
      // probe carries up to maxAppendBytes, resending it every heartbeat would flood the follower).
      pr.appendIdleHeartbeats++;
      if (pr.appendIdleHeartbeats >= appendIdleHeartbeatsBeforeProbe) {
        pr.probeSent = false;
        pr.appendIdleHeartbeats = 0;
      }
    }
    if (pr.state === 'snapshot') {
      // Nothing confirmed for a while: a chunk or its acknowledgement was lost (or the follower is
      // persisting the last one): send again from the last confirmed offset.
      pr.snapshotIdleHeartbeats++;
      if (pr.snapshotIdleHeartbeats >= snapshotIdleHeartbeatsBeforeResend) pr.rewindSnapshot(pr.snapshotOffset);
      this.sendSnapshotChunks(m.from, pr);
    } else if (pr.match < this.log.lastIndex()) {
      // Nothing acknowledged since the last heartbeat while entries are missing: appends were lost.
      // Only after several heartbeats: a follower that is merely slow (large appends, a loaded
      // machine) acknowledges later than one heartbeat, and falling back to probe would resend
      // the whole window in flight every heartbeat — duplicates that starve its catch-up.
      if (pr.state === 'replicate' && !pr.appendAckedSinceHeartbeat) pr.appendIdleHeartbeats++;
      if (pr.state === 'replicate' && pr.appendIdleHeartbeats >= appendIdleHeartbeatsBeforeProbe) pr.becomeProbe();
      if (pr.state === 'probe') pr.next = Math.min(pr.next, this.log.lastIndex() + 1);
      this.sendAppend(m.from, pr);
    }
    if (m.readSeq > 0 && this.voters.has(m.from)) this.acknowledgeReads(m.from, m.readSeq);
  }

  private sendTimeoutNow(to: NodeId): void {
    this.send({ type: 'timeout-now', from: this.id, to, term: this.term });
  }

  // ---------------------------------------------------------------------------------------------
  // Replication (follower side)

  private handleAppend(m: AppendMessage): void {
    if (m.prevIndex < this.log.committed) {
      // Everything up to commit already matches the leader (Leader Completeness).
      this.replyAppend(m.from, false, this.log.committed);
      return;
    }
    const lastNew = this.log.maybeAppend(m.prevIndex, m.prevTerm, m.entries);
    if (lastNew === undefined) {
      const hint = this.log.conflictHint(m.prevIndex);
      this.send({
        type: 'append-resp',
        from: this.id,
        to: m.from,
        term: this.term,
        reject: true,
        index: m.prevIndex,
        ...hint,
      });
      return;
    }
    this.log.commitTo(Math.min(m.commit, lastNew));
    this.replyAppend(m.from, false, lastNew);
  }

  private replyAppend(to: NodeId, reject: boolean, index: number): void {
    this.send({ type: 'append-resp', from: this.id, to, term: this.term, reject, index, hintIndex: 0, hintTerm: 0 });
  }

  private handleHeartbeat(m: HeartbeatMessage): void {
    this.log.commitTo(Math.min(m.commit, this.log.lastIndex()));
    this.send({ type: 'heartbeat-resp', from: this.id, to: m.from, term: this.term, readSeq: m.readSeq });
  }

  // ---------------------------------------------------------------------------------------------
  // Snapshots

  /**
   * Starts sending the latest snapshot. The progress holds it until the follower confirms it
   * installed it (or leaves snapshot state): compacting again meanwhile does not restart the
   * transfer. That is safe because any snapshot a leader took is of committed state (index ≤
   * applied ≤ commit) and a committed prefix never changes (Leader Completeness / State Machine
   * Safety), so an older one is as valid as the newest; the follower continues from its index with
   * entries the leader holds for it (see compact()).
   */
  private startSnapshot(to: NodeId, pr: Progress): void {
    const snap = this.log.snapshot();
    assert(snap.meta.index <= this.log.committed, `snapshot at ${snap.meta.index} past commit ${this.log.committed}`);
    pr.becomeSnapshot(snap);
    this.sendSnapshotChunks(to, pr);
  }

  /** Sends the held snapshot's next chunks, up to maxInflightSnapshotChunks unconfirmed. */
  private sendSnapshotChunks(to: NodeId, pr: Progress): void {
    if (
      this.cfg.plantedBugs?.restartSnapshotOnCompaction === true &&
      this.log.snapshotMeta().index !== pr.snapshotIndex
    )
      pr.becomeSnapshot(this.log.snapshot());
    const snap = pr.snapshot;
    assert(pr.state === 'snapshot' && snap !== null, `no snapshot held for ${to}`);
    const total = snap.data.byteLength;
    const chunkBytes = this.cfg.snapshotChunkBytes;
    const windowBytes =
      chunkBytes * (this.cfg.maxInflightSnapshotChunks ?? defaultRaftTuning.maxInflightSnapshotChunks);
    if (pr.snapshotSent < pr.snapshotOffset) pr.snapshotSent = pr.snapshotOffset;
    while (!pr.snapshotSentAll && pr.snapshotSent - pr.snapshotOffset < windowBytes) {
      const offset = pr.snapshotSent;
      const end = Math.min(total, offset + chunkBytes);
      const m: SnapshotChunkMessage = {
        type: 'snapshot',
        from: this.id,
        to,
        term: this.term,
        meta: snap.meta,
        offset,
        totalBytes: total,
        chunk: snap.data.subarray(offset, end),
        done: end >= total,
      };
      this.send(m);
      pr.snapshotSent = end;
      if (end >= total) pr.snapshotSentAll = true;
    }
  }

  private handleSnapshotResponse(m: SnapshotChunkResponse): void {
    const pr = this.progress.get(m.from);
    if (pr === undefined) return;
    pr.recentActive = true;
    if (pr.state !== 'snapshot' || pr.snapshot === null || m.snapshotIndex !== pr.snapshotIndex) return;
    const total = pr.snapshot.data.byteLength;
    if (m.nextOffset > pr.snapshotOffset) {
      // More bytes confirmed: the window moves on.
      pr.snapshotOffset = Math.min(m.nextOffset, total);
      pr.snapshotIdleHeartbeats = 0;
    } else if (m.nextOffset < pr.snapshotOffset) {
      // The follower lost what it had assembled (it restarted): start again where it stands.
      pr.rewindSnapshot(m.nextOffset);
    } else {
      return; // a duplicate, or a chunk that came out of order: the idle-heartbeat resend recovers
    }
    this.sendSnapshotChunks(m.from, pr);
  }

  private handleSnapshotChunk(m: SnapshotChunkMessage): void {
    if (m.meta.index <= this.log.committed) {
      // Stale (e.g. it raced with appends that already brought us further): say how far we are.
      this.incomingSnapshot = null;
      this.replyAppend(m.from, false, this.log.committed);
      return;
    }
    if (m.totalBytes > MAX_SNAPSHOT_BYTES) return;
    let inc = this.incomingSnapshot;
    if (m.offset === 0) {
      inc = { meta: m.meta, totalBytes: m.totalBytes, parts: [], received: 0 };
      this.incomingSnapshot = inc;
    } else if (
      inc === null ||
      inc.meta.index !== m.meta.index ||
      inc.meta.term !== m.meta.term ||
      m.offset !== inc.received
    ) {
      const nextOffset =
        inc !== null && inc.meta.index === m.meta.index && inc.meta.term === m.meta.term ? inc.received : 0;
      this.send({
        type: 'snapshot-resp',
        from: this.id,
        to: m.from,
        term: this.term,
        snapshotIndex: m.meta.index,
        nextOffset,
      });
      return;
    }
    inc.parts.push(m.chunk);
    inc.received += m.chunk.byteLength;
    this.lastSnapshotReceive = { index: inc.meta.index, receivedBytes: inc.received, totalBytes: inc.totalBytes };
    if (!m.done) {
      this.send({
        type: 'snapshot-resp',
        from: this.id,
        to: m.from,
        term: this.term,
        snapshotIndex: m.meta.index,
        nextOffset: inc.received,
      });
      return;
    }
    this.incomingSnapshot = null;
    if (inc.received !== inc.totalBytes) return; // malformed: the leader will resend from the start
    const data = new Uint8Array(inc.totalBytes);
    let off = 0;
    for (const p of inc.parts) {
      data.set(p, off);
      off += p.byteLength;
    }
    if (this.log.matchTerm(m.meta.index, m.meta.term)) {
      // We already hold the entry the snapshot ends at: commit up to it and keep our log.
      this.log.commitTo(m.meta.index);
    } else {
      this.log.restore({ meta: m.meta, data });
      this.voters = new Set(m.meta.conf.voters);
      this.learners = new Set(m.meta.conf.learners);
    }
    this.replyAppend(m.from, false, this.log.lastIndex() >= m.meta.index ? m.meta.index : this.log.lastIndex());
  }

  // ---------------------------------------------------------------------------------------------
  // Linearizable reads (ReadIndex)

  private handleRead(ctx: string, from: NodeId): void {
    if (this.transferee !== null || this.pendingReads.length >= MAX_PENDING_READS) {
      this.answerRead(ctx, from, -1);
      return;
    }
    if (this.log.term(this.log.committed) !== this.term) {
      // A new leader learns the commit index only once it commits an entry of its own term.
      this.readsAwaitingTermCommit.push({ ctx, from });
      return;
    }
    if (this.quorum() === 1) {
      this.answerRead(ctx, from, this.log.committed);
      return;
    }
    // A fresh sequence number per read round: an acknowledgement can only confirm rounds sent before it.
    this.readSeq += 1;
    this.pendingReads.push({ ctx, from, index: this.log.committed, seq: this.readSeq, acks: new Set([this.id]) });
    this.broadcastHeartbeat(this.readSeq);
  }

  private acknowledgeReads(from: NodeId, seq: number): void {
    for (const r of this.pendingReads) {
      if (r.seq > seq) break;
      r.acks.add(from);
    }
    while (this.pendingReads.length > 0) {
      const first = this.pendingReads[0];
      if (first === undefined) break;
      let acked = 0;
      for (const id of first.acks) if (this.voters.has(id)) acked++;
      if (acked < this.quorum()) break;
      this.pendingReads.shift();
      this.answerRead(first.ctx, first.from, first.index);
    }
  }

  private answerRead(ctx: string, from: NodeId, index: number): void {
    if (from === this.id) {
      if (index >= 0) this.readStates.push({ ctx, index });
      else this.failedReads.push(ctx);
    } else {
      this.send({ type: 'read-index-resp', from: this.id, to: from, term: this.term, ctx, index });
    }
  }

  private failPendingReads(): void {
    const all = [...this.pendingReads.map((r) => ({ ctx: r.ctx, from: r.from })), ...this.readsAwaitingTermCommit];
    this.pendingReads = [];
    this.readsAwaitingTermCommit = [];
    for (const r of all) this.answerRead(r.ctx, r.from, -1);
  }

  // ---------------------------------------------------------------------------------------------
  // Membership

  private applyConfChange(cc: ConfChange | BootstrapConf): void {
    const next = applyConfChangeTo(this.confState(), cc);
    this.voters = new Set(next.voters);
    this.learners = new Set(next.learners);
    if (this.role !== Role.Leader) return;
    if (!this.voters.has(this.id)) {
      // The leader was removed: it steps down; the remaining voters elect a new leader.
      this.becomeFollower(this.term, null);
      return;
    }
    for (const id of [...this.progress.keys()]) {
      if (!this.voters.has(id) && !this.learners.has(id)) this.progress.delete(id);
    }
    for (const id of [...this.voters, ...this.learners]) {
      if (id === this.id) continue;
      const pr = this.progress.get(id);
      if (pr === undefined) {
        const fresh = new Progress(this.log.lastIndex() + 1, this.learners.has(id));
        this.progress.set(id, fresh);
        this.sendAppend(id, fresh);
      } else {
        pr.isLearner = this.learners.has(id);
      }
    }
    if (this.transferee !== null && !this.voters.has(this.transferee)) this.transferee = null;
    this.maybeCommitAndBroadcast();
  }

  // ---------------------------------------------------------------------------------------------
  // Helpers

  private promotable(): boolean {
    return this.voters.has(this.id) && !this.refuseVotes;
  }

  private quorum(): number {
    return Math.floor(this.voters.size / 2) + 1;
  }

  private send(m: Message): void {
    assert(m.to !== this.id, 'a node never sends to itself');
    this.msgs.push(m);
  }

  private currentHardState(): HardState {
    const vote = this.cfg.plantedBugs?.skipVotePersist === true ? null : this.vote;
    return { term: this.term, vote, commit: this.log.committed };
  }

  private hardStateChanged(): boolean {
    const h = this.currentHardState();
    return (
      h.term !== this.persistedHard.term || h.vote !== this.persistedHard.vote || h.commit !== this.persistedHard.commit
    );
  }

  private resetRandomizedElectionTimeout(): void {
    this.randomizedElectionTicks = this.cfg.electionTicks + this.cfg.randomInt(this.cfg.electionTicks);
  }

  private assertNoReadyOutstanding(): void {
    assert(!this.readyOutstanding, 'the caller must advance() the outstanding Ready first');
  }
}
