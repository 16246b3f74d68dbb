// The leader's view of one follower's replication: how far it matches, what to send next, and the
// flow-control state. Probe: one append at a time until the follower's position is found.
// Replicate: appends are pipelined up to a window of in-flight messages. Snapshot: the follower is
// behind the compacted log and receives the snapshot in chunks: the leader keeps the snapshot it
// started sending (compacting again mid-transfer does not restart it) and a window of chunks in flight.
import type { Snapshot } from './raft-types.js';

export type ProgressState = 'probe' | 'replicate' | 'snapshot';

export class Progress {
  match = 0;
  next: number;
  state: ProgressState = 'probe';
  /** In probe state: an append is out and unanswered (cleared on any response or heartbeat). */
  probeSent = false;
  /** Last index of each append in flight, oldest first (replicate state). */
  readonly inflight: number[] = [];
  /** Heard from in the current check-quorum period. */
  recentActive = false;
  /** An append response arrived since the last heartbeat was sent. */
  appendAckedSinceHeartbeat = false;
  /** Heartbeat responses in a row with entries missing and no append acknowledged meanwhile. */
  appendIdleHeartbeats = 0;
  /** Snapshot transfer: which snapshot and how many bytes the follower has confirmed. */
  snapshotIndex = 0;
  snapshotOffset = 0;
  /** The snapshot being sent, held until the transfer ends (null outside snapshot state). */
  snapshot: Snapshot | null = null;
  /** Offset of the next chunk to send (≥ snapshotOffset); the chunks in between are in flight. */
  snapshotSent = 0;
  /** The last chunk (done) has been sent and not rewound since. */
  snapshotSentAll = false;
  /** Heartbeat responses since the follower last confirmed new snapshot bytes. */
  snapshotIdleHeartbeats = 0;
  isLearner: boolean;

  constructor(next: number, isLearner: boolean) {
    this.next = next;
    this.isLearner = isLearner;
  }

  becomeProbe(): void {
    this.releaseSnapshot();
    this.appendIdleHeartbeats = 0;
    this.state = 'probe';
    this.probeSent = false;
    this.inflight.length = 0;
    this.next = Math.max(this.next, this.match + 1);
  }

  becomeReplicate(): void {
    this.releaseSnapshot();
    this.state = 'replicate';
    this.probeSent = false;
    this.inflight.length = 0;
    this.next = this.match + 1;
  }

  becomeSnapshot(snapshot: Snapshot): void {
    this.state = 'snapshot';
    this.probeSent = false;
    this.inflight.length = 0;
    this.snapshot = snapshot;
    this.snapshotIndex = snapshot.meta.index;
    this.snapshotOffset = 0;
    this.snapshotSent = 0;
    this.snapshotSentAll = false;
    this.snapshotIdleHeartbeats = 0;
  }

  /** Sends again from the last confirmed offset (chunks or their acknowledgements were lost). */
  rewindSnapshot(to: number): void {
    this.snapshotOffset = to;
    this.snapshotSent = to;
    this.snapshotSentAll = false;
    this.snapshotIdleHeartbeats = 0;
  }

  private releaseSnapshot(): void {
    this.snapshot = null;
    this.snapshotSent = 0;
    this.snapshotSentAll = false;
    this.snapshotIdleHeartbeats = 0;
  }

  /** Records an acknowledgement up to index. Returns true if match advanced. */
  acknowledge(index: number): boolean {
    let advanced = false;
    if (index > this.match) {
      this.match = index;
      advanced = true;
    }
    if (this.next < index + 1) this.next = index + 1;
    while (this.inflight.length > 0 && (this.inflight[0] ?? 0) <= index) this.inflight.shift();
    return advanced;
  }

  canSend(maxInflight: number): boolean {
    switch (this.state) {
      case 'probe':
        return !this.probeSent;
      case 'replicate':
        return this.inflight.length < maxInflight;
      case 'snapshot':
        return false;
    }
  }
}
