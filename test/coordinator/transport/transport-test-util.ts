// Helpers for the peer transport tests: message generators (fast-check), a silent logger, a seeded
// random source, polling, and a small cluster of transports on loopback.

import fc from 'fast-check';
import { pino, type Logger } from 'pino';
import type { Entry, EntryKind, Message, NodeId } from '../../../coordinator/raft/raft-types.js';
import { PeerTransport, type PeerTransportOptions } from '../../../coordinator/transport/peer-transport.js';
import { Rng } from '../../../testkit/random.js';

// ---------------------------------------------------------------------------------------------------
// Generators

/** Records with a normal prototype (fast-check may otherwise build null-prototype objects). */
function rec<T>(model: { [K in keyof T]: fc.Arbitrary<T[K]> }): fc.Arbitrary<T> {
  return fc.record(model, { noNullPrototype: true });
}

const nodeIdArb = fc.string({ minLength: 1, maxLength: 12, unit: 'grapheme' });
const numArb = fc.oneof(fc.nat(1000), fc.maxSafeNat());
const smallNat = fc.nat(1 << 24);
const bytesArb = fc.uint8Array({ maxLength: 96 });
const entryArb: fc.Arbitrary<Entry> = rec({
  term: numArb,
  index: numArb,
  kind: fc.constantFrom<EntryKind>(0, 1, 2),
  data: bytesArb,
});
const confArb = rec({
  voters: fc.array(nodeIdArb, { maxLength: 5 }),
  learners: fc.array(nodeIdArb, { maxLength: 3 }),
});

const base = { from: nodeIdArb, to: nodeIdArb, term: numArb };

/** Any well-formed Raft message, of every type. */
export const messageArb: fc.Arbitrary<Message> = fc.oneof(
  rec({ type: fc.constant('pre-vote' as const), ...base, lastIndex: numArb, lastTerm: numArb }),
  rec({ type: fc.constant('vote' as const), ...base, lastIndex: numArb, lastTerm: numArb, transfer: fc.boolean() }),
  rec({ type: fc.constantFrom('pre-vote-resp' as const, 'vote-resp' as const), ...base, reject: fc.boolean() }),
  rec({
    type: fc.constant('append' as const),
    ...base,
    prevIndex: numArb,
    prevTerm: numArb,
    entries: fc.array(entryArb, { maxLength: 8 }),
    commit: numArb,
  }),
  rec({
    type: fc.constant('append-resp' as const),
    ...base,
    reject: fc.boolean(),
    index: numArb,
    hintIndex: numArb,
    hintTerm: numArb,
  }),
  rec({ type: fc.constant('heartbeat' as const), ...base, commit: numArb, readSeq: numArb }),
  rec({ type: fc.constant('heartbeat-resp' as const), ...base, readSeq: numArb }),
  fc
    .tuple(
      rec({ ...base, meta: rec({ index: numArb, term: numArb, conf: confArb }), done: fc.boolean() }),
      smallNat,
      bytesArb,
      smallNat,
    )
    .map(([b, offset, chunk, extra]) => ({
      type: 'snapshot' as const,
      ...b,
      offset,
      totalBytes: offset + chunk.byteLength + extra,
      chunk,
    })),
  rec({ type: fc.constant('snapshot-resp' as const), ...base, snapshotIndex: numArb, nextOffset: numArb }),
  rec({ type: fc.constant('timeout-now' as const), ...base }),
  rec({ type: fc.constant('read-index' as const), ...base, ctx: fc.string({ maxLength: 40, unit: 'grapheme' }) }),
  rec({
    type: fc.constant('read-index-resp' as const),
    ...base,
    ctx: fc.string({ maxLength: 40, unit: 'grapheme' }),
    index: fc.oneof(fc.constant(-1), numArb),
  }),
);

export const MESSAGE_TYPE_COUNT = 13;

// ---------------------------------------------------------------------------------------------------
// Plumbing

export function silentLogger(): Logger {
  return pino({ level: process.env['CELLQUOTA_TEST_LOG'] ?? 'silent' });
}

/** What one node received, per sender, in arrival order. */
export class Inbox {
  readonly bySender = new Map<NodeId, Message[]>();
  batches = 0;

  readonly onMessages = (batch: Message[]): void => {
    this.batches++;
    for (const m of batch) {
      let list = this.bySender.get(m.from);
      if (list === undefined) {
        list = [];
        this.bySender.set(m.from, list);
      }
      list.push(m);
    }
  };

  from(sender: NodeId): Message[] {
    return this.bySender.get(sender) ?? [];
  }

  count(): number {
    let n = 0;
    for (const l of this.bySender.values()) n += l.length;
    return n;
  }
}

export interface TestNode {
  readonly id: NodeId;
  transport: PeerTransport;
  inbox: Inbox;
  port: number;
}

export type NodeOverrides = Partial<Omit<PeerTransportOptions, 'selfId' | 'peers' | 'onMessages' | 'logger'>>;

/**
 * Starts transports for `ids` on 127.0.0.1 port 0, then tells each the others' addresses
 * (exercising setPeers). Returns the nodes and the address map.
 */
export async function startCluster(
  ids: readonly NodeId[],
  overrides: (id: NodeId) => NodeOverrides = () => ({}),
): Promise<{ nodes: Map<NodeId, TestNode>; addresses: Map<NodeId, string> }> {
  const nodes = new Map<NodeId, TestNode>();
  const addresses = new Map<NodeId, string>();
  let seed = 1;
  for (const id of ids) {
    const inbox = new Inbox();
    const transport = new PeerTransport({
      selfId: id,
      clusterId: 'test-cluster',
      listen: '127.0.0.1:0',
      peers: new Map(),
      onMessages: inbox.onMessages,
      logger: silentLogger(),
      random: new Rng(seed++).asRandom(),
      ...overrides(id),
    });
    const { port } = await transport.start();
    nodes.set(id, { id, transport, inbox, port });
    addresses.set(id, `127.0.0.1:${port}`);
  }
  for (const node of nodes.values()) node.transport.setPeers(addresses);
  return { nodes, addresses };
}

export async function stopAll(nodes: Iterable<TestNode>): Promise<void> {
  await Promise.all([...nodes].map((n) => n.transport.stop()));
}

export function heartbeat(from: NodeId, to: NodeId, seq: number): Message {
  return { type: 'heartbeat', from, to, term: 1, commit: seq, readSeq: 0 };
}

export function append(from: NodeId, to: NodeId, seq: number, payloadBytes = 32): Message {
  const data = new Uint8Array(payloadBytes);
  for (let i = 0; i < data.length; i++) data[i] = (seq + i) & 0xff;
  return {
    type: 'append',
    from,
    to,
    term: 1,
    prevIndex: seq,
    prevTerm: 1,
    commit: seq,
    entries: [{ term: 1, index: seq + 1, kind: 0, data }],
  };
}

/** The sequence number a test message carries (commit for heartbeats and appends). */
export function seqOf(m: Message): number {
  if (m.type === 'heartbeat' || m.type === 'append') return m.commit;
  throw new Error(`unexpected ${m.type}`);
}
