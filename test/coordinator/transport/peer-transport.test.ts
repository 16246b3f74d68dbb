import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import type { Message } from '../../../coordinator/raft/raft-types.js';
import { encodeFrame } from '../../../coordinator/transport/peer-codec.js';
import {
  CLUSTER_ID_HEADER,
  loadRaftPeerService,
  NODE_ID_HEADER,
  type FrameMessage,
  type StreamSummaryMessage,
} from '../../../coordinator/transport/peer-proto.js';
import {
  backoffDelay,
  defaultBackoff,
  PeerTransport,
  peerServerCredentials,
  peerServerOptions,
  probeAddress,
} from '../../../coordinator/transport/peer-transport.js';
import { append, heartbeat, Inbox, seqOf, silentLogger, startCluster, stopAll } from './transport-test-util.js';
import { Rng } from '../../../testkit/random.js';
import { freePort } from '../../../testkit/ports.js';
import { sleep, waitFor } from '../../../testkit/wait.js';

void test('backoff: exponential, capped near 1 s, jittered by the injected random', () => {
  const lo = () => 0;
  const hi = () => 0.999999;
  assert.equal(backoffDelay(0, lo), 25);
  assert.equal(backoffDelay(0, hi), 50);
  assert.equal(backoffDelay(1, hi), 100);
  assert.equal(backoffDelay(3, hi), 400);
  for (let a = 5; a < 40; a++) {
    assert.ok(backoffDelay(a, hi) <= defaultBackoff.maxMs);
    assert.ok(backoffDelay(a, lo) >= defaultBackoff.maxMs / 2);
  }
  const rnd = new Rng(9).asRandom();
  const delays = Array.from({ length: 50 }, () => backoffDelay(10, rnd));
  assert.ok(new Set(delays).size > 10, 'jitter spreads the delays');
});

void test('three transports exchange batches, one frame per destination per send, in order per sender', async () => {
  const ids = ['n1', 'n2', 'n3'];
  const { nodes } = await startCluster(ids);
  try {
    const rounds = 60;
    for (let r = 1; r <= rounds; r++) {
      for (const node of nodes.values()) {
        const batch: Message[] = [];
        for (const other of ids) {
          if (other === node.id) continue;
          // Three messages per destination per call; the sequence number runs across them.
          batch.push(
            heartbeat(node.id, other, 3 * r),
            append(node.id, other, 3 * r + 1, 64),
            heartbeat(node.id, other, 3 * r + 2),
          );
        }
        node.transport.send(batch);
      }
      if (r % 20 === 0) await sleep(1); // let some of it flow while we keep sending
    }
    const expected = rounds * 3;
    await waitFor('all messages delivered', () => [...nodes.values()].every((n) => n.inbox.count() === 2 * expected), {
      timeoutMs: 8000,
      everyMs: 10,
    });
    for (const node of nodes.values()) {
      for (const sender of ids) {
        if (sender === node.id) continue;
        const seqs = node.inbox.from(sender).map(seqOf);
        assert.deepEqual(
          seqs,
          Array.from({ length: expected }, (_, i) => i + 3),
          `${node.id} got ${sender}'s messages in order`,
        );
        for (const m of node.inbox.from(sender)) assert.equal(m.to, node.id);
      }
      const s = node.transport.stats();
      for (const id of ids) {
        if (id === node.id) continue;
        const p = s.peers[id];
        assert.ok(p !== undefined);
        assert.equal(p.connected, true);
        assert.equal(p.framesSent, rounds, 'one frame per destination per send()');
        assert.equal(p.messagesSent, expected);
        assert.equal(p.framesReceived, rounds);
        assert.equal(p.messagesReceived, expected);
        assert.equal(p.framesDropped, 0);
      }
      assert.equal(s.malformedFrames, 0);
      assert.equal(s.messagesDropped, 0);
      assert.equal(node.inbox.batches, 2 * rounds, 'onMessages is called once per frame');
    }
    // Entry payloads survive the trip.
    const a = nodes
      .get('n2')
      ?.inbox.from('n1')
      .find((m) => m.type === 'append');
    assert.ok(a !== undefined && a.type === 'append');
    assert.deepStrictEqual(
      a.entries[0]?.data,
      (append('n1', 'n2', seqOf(a), 64) as Extract<Message, { type: 'append' }>).entries[0]?.data,
    );
  } finally {
    await stopAll(nodes.values());
  }
});

void test('a stopped peer is reconnected after it restarts, and delivery resumes', async () => {
  const { nodes, addresses } = await startCluster(['n1', 'n2', 'n3']);
  const n1 = nodes.get('n1');
  const n2 = nodes.get('n2');
  const n3 = nodes.get('n3');
  assert.ok(n1 && n2 && n3);
  const all = () => [n1, n2, n3];
  try {
    await waitFor(
      'full mesh connected',
      () => all().every((n) => Object.values(n.transport.stats().peers).every((p) => p.connected)),
      { timeoutMs: 8000, everyMs: 10 },
    );
    n1.transport.send([heartbeat('n1', 'n3', 1)]);
    await waitFor('first message', () => n3.inbox.count() === 1, { timeoutMs: 8000, everyMs: 10 });

    await n3.transport.stop();
    await waitFor(
      'n1 and n2 notice n3 is gone',
      () =>
        n1.transport.stats().peers['n3']?.connected === false && n2.transport.stats().peers['n3']?.connected === false,
      { timeoutMs: 8000, everyMs: 10 },
    );
    // Sent while n3 is down: queued (the queue is far from its bound), delivered after the restart.
    n1.transport.send([heartbeat('n1', 'n3', 2)]);
    n2.transport.send([heartbeat('n2', 'n3', 2)]);
    await sleep(150);

    const inbox = new Inbox();
    const restarted = new PeerTransport({
      selfId: 'n3',
      clusterId: 'test-cluster',
      listen: addresses.get('n3') ?? '',
      peers: addresses,
      onMessages: inbox.onMessages,
      logger: silentLogger(),
      random: new Rng(33).asRandom(),
    });
    await restarted.start();
    n3.transport = restarted;
    n3.inbox = inbox;
    await waitFor(
      'mesh reconnected',
      () => all().every((n) => Object.values(n.transport.stats().peers).every((p) => p.connected)),
      { timeoutMs: 6000, everyMs: 10 },
    );
    n1.transport.send([heartbeat('n1', 'n3', 3)]);
    n2.transport.send([heartbeat('n2', 'n3', 3)]);
    restarted.send([heartbeat('n3', 'n1', 1), heartbeat('n3', 'n2', 1)]);
    await waitFor(
      'delivery resumed both ways',
      () => inbox.count() === 4 && n1.inbox.from('n3').length === 1 && n2.inbox.from('n3').length === 1,
      { timeoutMs: 8000, everyMs: 10 },
    );
    assert.deepEqual(inbox.from('n1').map(seqOf), [2, 3]);
    assert.deepEqual(inbox.from('n2').map(seqOf), [2, 3]);
    assert.ok((n1.transport.stats().peers['n3']?.reconnects ?? 0) >= 1);
    assert.ok((n2.transport.stats().peers['n3']?.reconnects ?? 0) >= 1);
  } finally {
    await stopAll(all());
  }
});

void test("a down peer's queue is bounded in bytes, dropping the oldest frames; the newest arrive once it is up", async () => {
  const port = await freePort();
  const address = `127.0.0.1:${port}`;
  let randomCalls = 0;
  const seeded = new Rng(5).asRandom();
  const sender = new PeerTransport({
    selfId: 'a',
    clusterId: 'test-cluster',
    listen: '127.0.0.1:0',
    peers: new Map([['b', address]]),
    onMessages: () => {},
    logger: silentLogger(),
    maxQueueBytes: 20_000,
    random: () => {
      randomCalls++;
      return seeded();
    },
  });
  await sender.start();
  let receiver: PeerTransport | undefined;
  try {
    const total = 200;
    for (let i = 1; i <= total; i++) sender.send([append('a', 'b', i, 400)]);
    const s = sender.stats().peers['b'];
    assert.ok(s !== undefined);
    assert.equal(s.connected, false);
    assert.ok(s.queuedBytes <= 20_000, `queue bounded: ${s.queuedBytes}`);
    assert.equal(s.framesDropped + s.queuedFrames, total);
    assert.ok(s.framesDropped > 100, `oldest dropped: ${s.framesDropped}`);
    assert.equal(s.messagesDropped, s.framesDropped);
    const kept = s.queuedFrames;
    await waitFor('a few reconnect attempts, jittered with the injected random', () => randomCalls >= 2, {
      timeoutMs: 8000,
      everyMs: 10,
    });

    const inbox = new Inbox();
    receiver = new PeerTransport({
      selfId: 'b',
      clusterId: 'test-cluster',
      listen: address,
      peers: new Map([['a', '127.0.0.1:1']]),
      onMessages: inbox.onMessages,
      logger: silentLogger(),
    });
    await receiver.start();
    await waitFor('queued frames delivered', () => inbox.count() === kept, { timeoutMs: 6000, everyMs: 10 });
    assert.deepEqual(
      inbox.from('a').map(seqOf),
      Array.from({ length: kept }, (_, i) => total - kept + 1 + i),
      'the newest frames, in order',
    );
    assert.ok((sender.stats().peers['b']?.reconnects ?? 0) >= 1);
  } finally {
    await sender.stop();
    await receiver?.stop();
  }
});

void test('streams from another cluster (or to the wrong node) are refused', async () => {
  const { nodes, addresses } = await startCluster(['n1']);
  const n1 = nodes.get('n1');
  assert.ok(n1);
  const n1Address = addresses.get('n1') ?? '';
  const outsider = new PeerTransport({
    selfId: 'n2',
    clusterId: 'other-cluster',
    listen: '127.0.0.1:0',
    peers: new Map([['n1', n1Address]]),
    onMessages: () => {},
    logger: silentLogger(),
    random: new Rng(2).asRandom(),
  });
  // Same cluster, but it believes a different node lives at n1's address.
  const confused = new PeerTransport({
    selfId: 'n5',
    clusterId: 'test-cluster',
    listen: '127.0.0.1:0',
    peers: new Map([['n9', n1Address]]),
    onMessages: () => {},
    logger: silentLogger(),
    random: new Rng(3).asRandom(),
  });
  await outsider.start();
  await confused.start();
  try {
    outsider.send([heartbeat('n2', 'n1', 1)]);
    confused.send([heartbeat('n5', 'n9', 1)]);
    await waitFor(
      'refusal seen on both sides',
      () => n1.transport.stats().refusedStreams >= 1 && (outsider.stats().peers['n1']?.refused ?? 0) >= 1,
      { timeoutMs: 8000, everyMs: 10 },
    );
    await waitFor('identity mismatch seen by the sender', () => (confused.stats().peers['n9']?.refused ?? 0) >= 1, {
      timeoutMs: 8000,
      everyMs: 10,
    });
    await sleep(100);
    assert.equal(n1.inbox.count(), 0, 'nothing from the other cluster or the confused sender was delivered');
    assert.equal(outsider.stats().peers['n1']?.connected, false);
    assert.equal(outsider.stats().peers['n1']?.framesSent, 0, 'frames are held back until a stream is accepted');
    assert.equal(confused.stats().peers['n9']?.connected, false);
  } finally {
    await outsider.stop();
    await confused.stop();
    await stopAll(nodes.values());
  }
});

void test('a 4 MiB snapshot chunk is delivered intact, alongside small messages', async () => {
  const { nodes } = await startCluster(['n1', 'n2']);
  const n1 = nodes.get('n1');
  const n2 = nodes.get('n2');
  assert.ok(n1 && n2);
  try {
    const size = 4 * 1024 * 1024;
    const chunk = new Uint8Array(size);
    for (let i = 0; i < size; i += 4096) chunk[i] = (i / 4096) & 0xff;
    chunk[size - 1] = 0xab;
    const snap: Message = {
      type: 'snapshot',
      from: 'n1',
      to: 'n2',
      term: 4,
      meta: { index: 1000, term: 3, conf: { voters: ['n1', 'n2', 'n3'], learners: [] } },
      offset: 0,
      totalBytes: size,
      chunk,
      done: true,
    };
    n1.transport.send([heartbeat('n1', 'n2', 1), snap]);
    n1.transport.send([heartbeat('n1', 'n2', 2)]);
    await waitFor('snapshot delivered', () => n2.inbox.count() === 3, { timeoutMs: 10_000, everyMs: 10 });
    const got = n2.inbox.from('n1');
    assert.equal(got[0]?.type, 'heartbeat');
    const s = got[1];
    assert.ok(s !== undefined && s.type === 'snapshot');
    assert.equal(s.chunk.byteLength, size);
    assert.ok(Buffer.from(s.chunk).equals(Buffer.from(chunk)), 'chunk bytes equal');
    assert.equal(got[2]?.type, 'heartbeat');
    assert.ok(n1.transport.stats().bytesSent > size);
  } finally {
    await stopAll(nodes.values());
  }
});

void test('malformed and misaddressed frames are dropped and counted; the stream keeps working', async () => {
  const { nodes, addresses } = await startCluster(['n1']);
  const n1 = nodes.get('n1');
  assert.ok(n1);
  const service = loadRaftPeerService();
  const client = new grpc.Client(addresses.get('n1') ?? '', grpc.credentials.createInsecure());
  try {
    const md = new grpc.Metadata();
    md.set(CLUSTER_ID_HEADER, 'test-cluster');
    md.set(NODE_ID_HEADER, 'n7');
    const ended = new Promise<StreamSummaryMessage | undefined>((resolve, reject) => {
      const call = client.makeClientStreamRequest<FrameMessage, StreamSummaryMessage>(
        service.stream.path,
        service.stream.requestSerialize,
        service.stream.responseDeserialize,
        md,
        {},
        (err, value) => (err !== null ? reject(err) : resolve(value)),
      );
      const frames: Uint8Array[] = [
        new Uint8Array([0xc1, 0x00]),
        new Uint8Array(0),
        Buffer.from('definitely not msgpack'),
        encodeFrame([heartbeat('n7', 'n1', 1)]).subarray(0, 5),
        encodeFrame([
          { type: 'heartbeat', from: 'n7', to: 'n1', term: -1, commit: 0, readSeq: 0 } as unknown as Message,
        ]),
        // Misaddressed: claims another sender, or another receiver. Dropped per message.
        encodeFrame([heartbeat('n8', 'n1', 2), heartbeat('n7', 'n2', 3)]),
        encodeFrame([heartbeat('n7', 'n1', 4)]),
      ];
      for (const data of frames) call.write({ data });
      call.end();
    });
    const summary = await ended;
    assert.equal(summary?.framesReceived, 7);
    assert.equal(summary?.messagesReceived, 1);
    const s = n1.transport.stats();
    assert.equal(s.malformedFrames, 5);
    assert.equal(s.misaddressedMessages, 2);
    assert.equal(s.messagesReceived, 1);
    assert.deepEqual(n1.inbox.from('n7').map(seqOf), [4]);
    assert.equal(n1.inbox.count(), 1);
  } finally {
    client.close();
    await stopAll(nodes.values());
  }
});

void test('an onMessages handler that throws is counted, not fatal', async () => {
  let calls = 0;
  const { nodes } = await startCluster(['n1', 'n2']);
  const n1 = nodes.get('n1');
  const n2 = nodes.get('n2');
  assert.ok(n1 && n2);
  await n2.transport.stop();
  const addr = `127.0.0.1:${n2.port}`;
  const thrower = new PeerTransport({
    selfId: 'n2',
    clusterId: 'test-cluster',
    listen: addr,
    peers: new Map([['n1', `127.0.0.1:${n1.port}`]]),
    onMessages: () => {
      calls++;
      if (calls === 1) throw new Error('boom');
    },
    logger: silentLogger(),
  });
  await thrower.start();
  try {
    n1.transport.send([heartbeat('n1', 'n2', 1)]);
    n1.transport.send([heartbeat('n1', 'n2', 2)]);
    await waitFor('both frames handed over', () => calls === 2, { timeoutMs: 6000, everyMs: 10 });
    assert.equal(thrower.stats().handlerErrors, 1);
  } finally {
    await thrower.stop();
    await n1.transport.stop();
  }
});

void test('membership: setPeers adds, re-addresses and removes peers; unknown destinations are counted', async () => {
  const { nodes, addresses } = await startCluster(['n1', 'n2', 'n3']);
  const n1 = nodes.get('n1');
  const n2 = nodes.get('n2');
  const n3 = nodes.get('n3');
  assert.ok(n1 && n2 && n3);
  let n4: PeerTransport | undefined;
  try {
    assert.throws(() => n1.transport.setPeers(new Map([...addresses, ['n9', 'no-port']])), /invalid peers n9=no-port/);
    assert.equal(n1.transport.stats().peers['n9'], undefined, 'a rejected setPeers changes nothing');
    // Remove n3 from n1's view: messages to it are dropped and counted.
    n1.transport.setPeers(new Map([...addresses].filter(([id]) => id !== 'n3')));
    assert.equal(n1.transport.stats().peers['n3'], undefined);
    n1.transport.send([heartbeat('n1', 'n3', 1), heartbeat('n1', 'n2', 1)]);
    assert.equal(n1.transport.stats().messagesDropped, 1);
    await waitFor('n2 still reached', () => n2.inbox.count() === 1, { timeoutMs: 8000, everyMs: 10 });

    // A new node n4 joins; then n2's address "moves" to n4's listener under id n4 and back.
    const inbox4 = new Inbox();
    n4 = new PeerTransport({
      selfId: 'n4',
      clusterId: 'test-cluster',
      listen: '127.0.0.1:0',
      peers: addresses,
      onMessages: inbox4.onMessages,
      logger: silentLogger(),
    });
    const { port } = await n4.start();
    const withN4 = new Map([...addresses, ['n4', `127.0.0.1:${port}`]]);
    n1.transport.setPeers(withN4);
    n1.transport.send([heartbeat('n1', 'n4', 7)]);
    await waitFor('new peer reached', () => inbox4.count() === 1, { timeoutMs: 8000, everyMs: 10 });

    // Re-address n3 (same listener, spelled differently): the link reconnects and keeps working.
    n1.transport.setPeers(new Map([...withN4, ['n3', `localhost:${n3.port}`]]));
    n1.transport.send([heartbeat('n1', 'n3', 2)]);
    await waitFor('re-addressed peer reached', () => n3.inbox.from('n1').length === 1, {
      timeoutMs: 6000,
      everyMs: 10,
    });
    assert.equal(n1.transport.stats().peers['n3']?.address, `localhost:${n3.port}`);

    // Probe answers with identity, cluster and the status hint.
    const probe = await n1.transport.probe('n4');
    assert.deepEqual(probe, { nodeId: 'n4', clusterId: 'test-cluster', termHint: 0, leaderHint: null });
  } finally {
    await n4?.stop();
    await stopAll(nodes.values());
  }
});

void test('probe reports the node id, cluster id and term hint', async () => {
  const { nodes, addresses } = await startCluster(['n1'], () => ({ status: () => ({ term: 17, leader: 'n3' }) }));
  try {
    const r = await probeAddress(addresses.get('n1') ?? '');
    assert.deepEqual(r, { nodeId: 'n1', clusterId: 'test-cluster', termHint: 17, leaderHint: 'n3' });
  } finally {
    await stopAll(nodes.values());
  }
});

void test('the transport can share a gRPC server the caller owns (one port for peers and agents)', async () => {
  const shared = new grpc.Server(peerServerOptions());
  const port = await new Promise<number>((resolve, reject) => {
    shared.bindAsync('127.0.0.1:0', peerServerCredentials(undefined), (err, p) =>
      err !== null ? reject(err) : resolve(p),
    );
  });
  const { nodes, addresses } = await startCluster(['n1']);
  const n1 = nodes.get('n1');
  assert.ok(n1);
  const inbox = new Inbox();
  const n2 = new PeerTransport({
    selfId: 'n2',
    clusterId: 'test-cluster',
    listen: `127.0.0.1:${port}`,
    peers: addresses,
    onMessages: inbox.onMessages,
    logger: silentLogger(),
    server: shared,
  });
  try {
    assert.deepEqual(await n2.start(), { port });
    n1.transport.setPeers(new Map([...addresses, ['n2', `127.0.0.1:${port}`]]));
    n1.transport.send([heartbeat('n1', 'n2', 1)]);
    n2.send([heartbeat('n2', 'n1', 1)]);
    await waitFor('delivery through the shared server', () => inbox.count() === 1 && n1.inbox.count() === 1, {
      timeoutMs: 8000,
      everyMs: 10,
    });
    await n2.stop();
    await assert.rejects(
      probeAddress(`127.0.0.1:${port}`),
      (err: grpc.ServiceError) => err.code === grpc.status.UNIMPLEMENTED,
      'the service is removed, the server stays up',
    );
  } finally {
    await n2.stop();
    await stopAll(nodes.values());
    shared.forceShutdown();
  }
});

void test('command format: each transport learns the newest format its peers read, both ways; an unknown peer is null', async () => {
  const { nodes } = await startCluster(['n1', 'n2', 'n3'], (id) => (id === 'n3' ? {} : { commandFormat: 2 }));
  try {
    const t = (id: string): PeerTransport => {
      const n = nodes.get(id);
      if (n === undefined) throw new Error(id);
      return n.transport;
    };
    assert.equal(t('n1').peerCommandFormat('n9'), null, 'never heard from');
    await waitFor(
      'n1 and n2 declared format 2 to each other',
      () => t('n1').peerCommandFormat('n2') === 2 && t('n2').peerCommandFormat('n1') === 2,
      { timeoutMs: 8000, everyMs: 10 },
    );
    await waitFor(
      'n3 declared the default, format 1',
      () => t('n1').peerCommandFormat('n3') === 1 && t('n3').peerCommandFormat('n1') === 2,
      { timeoutMs: 8000, everyMs: 10 },
    );
  } finally {
    await stopAll(nodes.values());
  }
});
