// The data the Raft core exchanges with its caller. The core is a deterministic state machine:
// messages, ticks, proposals and read requests go in; a Ready comes out that says what to persist,
// what to send (only after persisting), what to apply and which reads are confirmed. Nothing here
// does I/O; the same code runs in production and in the seeded simulator.

export type NodeId = string;

export const EntryKind = {
  /** An application command. */
  Normal: 0,
  /** A membership change (data is an encoded ConfChange). */
  Conf: 1,
  /** The empty entry a new leader appends to commit its term. */
  Noop: 2,
} as const;
export type EntryKind = (typeof EntryKind)[keyof typeof EntryKind];

export interface Entry {
  readonly term: number;
  readonly index: number;
  readonly kind: EntryKind;
  readonly data: Uint8Array;
}

/** What must be durable before any message that depends on it is sent. */
export interface HardState {
  readonly term: number;
  readonly vote: NodeId | null;
  readonly commit: number;
}

/** Voting members and non-voting learners (learners replicate but never count towards a quorum). */
export interface ConfState {
  readonly voters: readonly NodeId[];
  readonly learners: readonly NodeId[];
}

export interface SnapshotMeta {
  readonly index: number;
  readonly term: number;
  readonly conf: ConfState;
}

export interface Snapshot {
  readonly meta: SnapshotMeta;
  /** The application's serialized state machine at meta.index. */
  readonly data: Uint8Array;
}

export type ConfChangeOp = 'add-learner' | 'promote' | 'remove';

export interface ConfChange {
  readonly op: ConfChangeOp;
  readonly node: NodeId;
  /** Opaque to Raft: e.g. the new node's address, for the transport to learn on apply. */
  readonly context?: string;
}

/**
 * The first entry of a bootstrapped cluster's log (index 1, term 1, committed): the initial
 * voters. Every founding member writes the identical entry, so a member that joins later learns
 * the starting configuration by replaying the log like any other entry.
 */
export interface BootstrapConf {
  readonly op: 'bootstrap';
  readonly voters: readonly NodeId[];
}

export const Role = {
  Follower: 'follower',
  PreCandidate: 'pre-candidate',
  Candidate: 'candidate',
  Leader: 'leader',
} as const;
export type Role = (typeof Role)[keyof typeof Role];

interface MessageBase {
  readonly from: NodeId;
  readonly to: NodeId;
  readonly term: number;
}

export interface PreVoteMessage extends MessageBase {
  readonly type: 'pre-vote';
  readonly lastIndex: number;
  readonly lastTerm: number;
}
export interface VoteMessage extends MessageBase {
  readonly type: 'vote';
  readonly lastIndex: number;
  readonly lastTerm: number;
  /** Set when campaigning on a leadership transfer: voters skip their leader-lease check. */
  readonly transfer: boolean;
}
export interface VoteResponse extends MessageBase {
  readonly type: 'pre-vote-resp' | 'vote-resp';
  readonly reject: boolean;
}
export interface AppendMessage extends MessageBase {
  readonly type: 'append';
  readonly prevIndex: number;
  readonly prevTerm: number;
  readonly entries: readonly Entry[];
  readonly commit: number;
}
export interface AppendResponse extends MessageBase {
  readonly type: 'append-resp';
  readonly reject: boolean;
  /** On success: the highest index now known to match the leader's. On reject: the probed prevIndex. */
  readonly index: number;
  /** On reject: the follower's hint where the logs may diverge (fast back-off). */
  readonly hintIndex: number;
  readonly hintTerm: number;
}
export interface HeartbeatMessage extends MessageBase {
  readonly type: 'heartbeat';
  readonly commit: number;
  /** The leader's read round this heartbeat confirms (0: none). */
  readonly readSeq: number;
}
export interface HeartbeatResponse extends MessageBase {
  readonly type: 'heartbeat-resp';
  readonly readSeq: number;
}
export interface SnapshotChunkMessage extends MessageBase {
  readonly type: 'snapshot';
  readonly meta: SnapshotMeta;
  readonly offset: number;
  readonly totalBytes: number;
  readonly chunk: Uint8Array;
  readonly done: boolean;
}
export interface SnapshotChunkResponse extends MessageBase {
  readonly type: 'snapshot-resp';
  readonly snapshotIndex: number;
  /** The next offset the follower expects (all bytes below it received). */
  readonly nextOffset: number;
}
export interface TimeoutNowMessage extends MessageBase {
  readonly type: 'timeout-now';
}
export interface ReadIndexMessage extends MessageBase {
  readonly type: 'read-index';
  readonly ctx: string;
}
export interface ReadIndexResponse extends MessageBase {
  readonly type: 'read-index-resp';
  readonly ctx: string;
  /** -1 when the leader could not serve it (no longer leader, transfer in progress). */
  readonly index: number;
}

export type Message =
  | PreVoteMessage
  | VoteMessage
  | VoteResponse
  | AppendMessage
  | AppendResponse
  | HeartbeatMessage
  | HeartbeatResponse
  | SnapshotChunkMessage
  | SnapshotChunkResponse
  | TimeoutNowMessage
  | ReadIndexMessage
  | ReadIndexResponse;

export type MessageType = Message['type'];

/** A confirmed linearizable read: serve it once the state machine has applied `index`. */
export interface ReadState {
  readonly ctx: string;
  readonly index: number;
}

export interface SoftState {
  readonly role: Role;
  readonly leader: NodeId | null;
  readonly term: number;
}

/**
 * What the caller must do, in this order:
 *  1. persist `snapshot` (if any), then `entries` (dropping any stored entries at or above
 *     entries[0].index), then `hardState` (if any) — as one atomic batch, synced when `mustSync`;
 *  2. only then send `messages` — except that a leader may send the messages for which
 *     `sendBeforePersist` is true while its own write is in flight (Raft thesis §10.2.1: the
 *     leader counts itself towards a commit only once its entries are durable);
 *  3. restore the state machine from `snapshot` (if any), then apply `committedEntries` in order and
 *     serve `readStates` whose index has been applied;
 *  4. call `advance(ready)`. No other call may be made on the node between `ready()` and `advance()`.
 */
export interface Ready {
  readonly softState: SoftState;
  readonly hardState: HardState | null;
  readonly entries: readonly Entry[];
  readonly snapshot: Snapshot | null;
  readonly committedEntries: readonly Entry[];
  readonly messages: readonly Message[];
  readonly readStates: readonly ReadState[];
  /** Reads the node could not serve (lost leadership, no leader known): fail them, the client may retry. */
  readonly failedReads: readonly string[];
  readonly mustSync: boolean;
}

export type ProposeResult =
  | { readonly ok: true; readonly index: number; readonly term: number }
  | { readonly ok: false; readonly reason: 'not-leader'; readonly leader: NodeId | null }
  | { readonly ok: false; readonly reason: 'transfer-in-progress'; readonly leader: NodeId }
  | { readonly ok: false; readonly reason: 'too-many-uncommitted'; readonly leader: NodeId }
  | {
      readonly ok: false;
      readonly reason: 'conf-change-pending' | 'invalid-conf-change' | 'term-not-committed';
      readonly leader: NodeId;
      readonly detail: string;
    };

/** Test-only switches that plant known bugs, so tests can show the simulator's checkers catch them. */
export interface PlantedBugs {
  /** Commit entries of earlier terms by counting replicas (breaks Figure 8 of the Raft paper). */
  readonly commitPriorTermByCount?: boolean;
  /** Leave the vote out of the persisted hard state (a restarted node may vote twice in a term). */
  readonly skipVotePersist?: boolean;
  /**
   * Restart a snapshot transfer with the newer snapshot whenever the leader compacts mid-transfer (the old
   * behaviour).
   */
  readonly restartSnapshotOnCompaction?: boolean;
}

export interface RaftConfig {
  readonly id: NodeId;
  /** Ticks without hearing from a leader before a follower campaigns; randomized in [E, 2E). */
  readonly electionTicks: number;
  /** Ticks between a leader's heartbeats; must be well below electionTicks. */
  readonly heartbeatTicks: number;
  /** Randomness source: an integer in [0, n). Seeded by the caller. */
  readonly randomInt: (n: number) => number;
  readonly preVote: boolean;
  readonly checkQuorum: boolean;
  /** Upper bound on the entry bytes in one append message. */
  readonly maxAppendBytes: number;
  /** Append messages in flight per follower before the leader waits for acknowledgements. */
  readonly maxInflightAppends: number;
  /** Bytes of proposed but uncommitted entries past which proposals are refused. */
  readonly maxUncommittedBytes: number;
  /** Bytes per InstallSnapshot chunk. */
  readonly snapshotChunkBytes: number;
  /** Snapshot chunks a leader sends ahead of the follower's confirmations. Default in defaultRaftTuning. */
  readonly maxInflightSnapshotChunks?: number;
  /**
   * Bytes of log a leader keeps after a snapshot it is still sending, so the follower continues from
   * the log once it installed it (see RaftNode.compact). Default in defaultRaftTuning.
   */
  readonly maxSnapshotHoldBytes?: number;
  /** A node that must not vote or campaign (e.g. its data directory was found wiped). */
  readonly refuseToVote?: boolean;
  readonly plantedBugs?: PlantedBugs;
}

/** The state a node starts from: what its storage holds (a new node: a conf-only snapshot at index 0). */
export interface RaftInitialState {
  readonly hardState: HardState;
  readonly snapshot: Snapshot;
  /** Entries after snapshot.meta.index, in order, contiguous. */
  readonly entries: readonly Entry[];
}

export const defaultRaftTuning = {
  electionTicks: 10,
  heartbeatTicks: 1,
  preVote: true,
  checkQuorum: true,
  maxAppendBytes: 1 << 20,
  maxInflightAppends: 16,
  maxUncommittedBytes: 64 << 20,
  snapshotChunkBytes: 256 << 10,
  maxInflightSnapshotChunks: 4,
  maxSnapshotHoldBytes: 64 << 20,
} as const;

/**
 * Messages a leader may send before its Ready is durable: replication and heartbeats carry its
 * log, which it counts for commitment only after persisting. Votes and acknowledgements must wait.
 */
export function sendBeforePersist(m: Message): boolean {
  return m.type === 'append' || m.type === 'heartbeat' || m.type === 'snapshot';
}
