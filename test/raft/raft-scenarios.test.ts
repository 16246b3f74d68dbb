// Named scenarios for the classic hard cases of Raft, driven message by message. Each test names
// the rule of the Raft paper (Ongaro & Ousterhout 2014) or dissertation it checks.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EntryKind, RaftNode, Role, type Message } from '../../coordinator/raft/index.js';
import { Harness } from '../../testkit/raft/raft-harness.js';

const three = ['n1', 'n2', 'n3'];
const five = ['n1', 'n2', 'n3', 'n4', 'n5'];

/** Lets leader-lease timers lapse on the given followers without making them campaign. */
function expireLeases(h: Harness, ids: string[]): void {
  for (const id of ids) {
    for (let i = 0; i < h.electionTicks; i++) {
      h.raft(id).tick();
      if (h.raft(id).softState().role !== Role.Follower) break;
    }
    h.dropAll();
  }
}

void test('§5.2: one leader is elected, it commits a no-op of its term, followers name it', () => {
  const h = new Harness(three);
  h.elect('n1');
  assert.deepEqual(h.leaders(), ['n1']);
  const st = h.raft('n1').status();
  assert.equal(st.commit, 1, 'the no-op of term 1 is committed');
  assert.equal(h.raft('n1').entryAt(1)?.kind, EntryKind.Noop);
  const onFollower = h.propose('n2', 'x');
  assert.deepEqual(onFollower, { ok: false, reason: 'not-leader', leader: 'n1' });
});

void test('§5.3: proposals replicate in batches and every node applies the same sequence', () => {
  const h = new Harness(five);
  h.elect('n1');
  for (let i = 0; i < 50; i++) assert.equal(h.propose('n1', `cmd${i}`).ok, true);
  h.stabilize();
  h.tick('n1');
  h.stabilize();
  const expected = Array.from({ length: 50 }, (_, i) => `cmd${i}`);
  for (const id of five) assert.deepEqual(h.node(id).applied, expected, `applied on ${id}`);
});

void test('§5.4.1: a vote goes only to a candidate whose log is at least as up to date', () => {
  const h = new Harness(three, { preVote: false, checkQuorum: false });
  h.elect('n1');
  h.isolate('n3');
  h.propose('n1', 'a');
  h.stabilize();
  h.heal();
  // n3 lacks entry 2; n1 and n2 must refuse to elect it even at a higher term.
  h.crash('n1');
  h.timeout('n3');
  h.stabilize();
  assert.notEqual(h.raft('n3').softState().role, Role.Leader);
  h.timeout('n2');
  h.stabilize();
  assert.equal(h.raft('n2').softState().role, Role.Leader);
});

void test('Figure 8 (§5.4.2): an entry of an earlier term is not committed by counting replicas', () => {
  const outcome = runFigure8({});
  assert.equal(outcome.n1CommittedA, false, 'n1 must not commit its term-1 entry in term 3 by counting');
  assert.equal(outcome.conflict, null, 'no two nodes applied different entries at one index');
});

void test('Figure 8 with the commit rule broken (planted bug): the checker sees a committed entry overwritten', () => {
  const outcome = runFigure8({ commitPriorTermByCount: true });
  assert.equal(outcome.n1CommittedA, true);
  assert.notEqual(outcome.conflict, null, 'the broken rule must lead to divergent applied entries');
});

/** Ticks a node until it starts a new election (its term grows). */
function campaignAgain(h: Harness, id: string): void {
  const term = h.raft(id).softState().term;
  for (let i = 0; i < 3 * h.electionTicks && h.raft(id).softState().term === term; i++) h.tick(id);
}

/** Delivers, round after round, only the messages that match; drops the rest. */
function deliverOnly(h: Harness, keep: (m: Message) => boolean): void {
  for (let round = 0; round < 100 && h.inflight.length > 0; round++) {
    const batch = h.inflight;
    h.inflight = [];
    for (const m of batch) if (keep(m)) h.deliver(m);
  }
}

function runFigure8(plantedBugs: { commitPriorTermByCount?: boolean }): {
  n1CommittedA: boolean;
  conflict: string | null;
} {
  // One entry per append message, so the leader's old entry can reach a majority before its own.
  const h = new Harness(five, { preVote: false, checkQuorum: false, maxAppendBytes: 1, plantedBugs });
  h.elect('n1'); // term 1; index 1 (no-op) everywhere
  h.tick('n1');
  h.stabilize();
  // (a) n1 replicates A (index 2, term 1) to n2 only, then crashes.
  h.cut.add('n1>n3').add('n1>n4').add('n1>n5');
  h.propose('n1', 'A');
  h.stabilize();
  h.crash('n1');
  h.heal();
  // (b) n5 is elected in term 2 by n3, n4; it appends its no-op at index 2 but crashes before sending.
  h.cut.add('n5>n2');
  h.timeout('n5');
  deliverOnly(h, (m) => m.type === 'vote' || m.type === 'vote-resp');
  assert.equal(h.raft('n5').softState().role, Role.Leader);
  h.dropAll();
  h.crash('n5');
  h.heal();
  // (c) n1 restarts and is elected in term 3 by n2, n3, n4; A reaches n3 before n1's own no-op does.
  h.start('n1');
  for (let attempt = 0; attempt < 5 && h.raft('n1').softState().role !== Role.Leader; attempt++) {
    campaignAgain(h, 'n1');
    // Deliver only the election and the first append round to n3; hold everything after it.
    for (let round = 0; round < 10; round++) {
      const batch = h.inflight;
      h.inflight = [];
      for (const m of batch) {
        // n1's own-term entries may reach n2 but not n3/n4 (appends they would reject still pass).
        const term = h.raft('n1').softState().term;
        const wouldAccept = m.type === 'append' && h.nodes.get(m.to)?.raft?.termAt(m.prevIndex) === m.prevTerm;
        if (m.type === 'append' && m.to !== 'n2' && wouldAccept && m.entries.some((e) => e.term === term)) continue;
        h.deliver(m);
      }
    }
  }
  assert.equal(h.raft('n1').softState().role, Role.Leader);
  const n1CommittedA = h.node('n1').appliedTerms.get(2) === 1;
  // (d) n1 crashes; n5 restarts and, with its term-2 entry, wins term 4 and overwrites index 2.
  h.dropAll();
  h.crash('n1');
  h.start('n5');
  for (let attempt = 0; attempt < 5 && h.raft('n5').softState().role !== Role.Leader; attempt++) {
    campaignAgain(h, 'n5');
    h.stabilize();
  }
  h.tick('n5');
  h.stabilize();
  let conflict: string | null = null;
  const all = [...h.nodes.values()];
  for (const a of all) {
    for (const b of all) {
      for (const [idx, term] of a.appliedTerms) {
        const other = b.appliedTerms.get(idx);
        if (other !== undefined && other !== term)
          conflict = `${a.id} applied ${idx}/${term}, ${b.id} applied ${idx}/${other}`;
      }
    }
  }
  return { n1CommittedA, conflict };
}

void test('a partitioned old leader: its stale proposals never commit, and it steps down (CheckQuorum)', () => {
  const h = new Harness(three);
  h.elect('n1');
  h.isolate('n1');
  const stale = h.propose('n1', 'stale');
  assert.equal(stale.ok, true, 'an isolated leader still accepts locally');
  h.stabilize();
  // CheckQuorum: after an election timeout without hearing a majority, n1 steps down.
  h.tick('n1', 2 * h.electionTicks);
  assert.equal(h.raft('n1').softState().role, Role.Follower);
  expireLeases(h, ['n2', 'n3']);
  h.elect('n2');
  assert.equal(h.propose('n2', 'fresh').ok, true);
  h.stabilize();
  h.heal();
  // The probe n2 sent into the partition was lost: it is resent after a few unanswered heartbeats.
  for (let i = 0; i < 6; i++) {
    h.tick('n2');
    h.stabilize();
  }
  for (const id of three) {
    assert.deepEqual(h.node(id).applied, ['fresh'], `${id} applied only the new leader's write`);
  }
});

void test('PreVote: a node rejoining after a partition does not disrupt a healthy leader', () => {
  const h = new Harness(three);
  h.elect('n1');
  const term = h.raft('n1').softState().term;
  h.isolate('n3');
  h.tick('n3', 10 * h.electionTicks); // it keeps pre-campaigning, alone
  h.stabilize();
  assert.equal(h.raft('n3').softState().term, term, 'pre-votes do not raise the term');
  h.heal();
  h.tick('n3', 3 * h.electionTicks);
  h.tick('n1');
  h.stabilize();
  assert.deepEqual(h.leaders(), ['n1']);
  assert.equal(h.raft('n1').softState().term, term);
  h.propose('n1', 'after');
  h.stabilize();
  h.tick('n1');
  h.stabilize();
  assert.deepEqual(h.node('n3').applied, ['after']);
});

void test('without PreVote the same rejoining node forces an election (what PreVote prevents)', () => {
  const h = new Harness(three, { preVote: false, checkQuorum: false });
  h.elect('n1');
  const term = h.raft('n1').softState().term;
  h.isolate('n3');
  h.tick('n3', 10 * h.electionTicks);
  h.heal();
  h.tick('n3', 3 * h.electionTicks);
  h.stabilize();
  assert.ok(h.raft('n1').softState().term > term, 'the leader was deposed by a higher term');
});

void test('a follower far behind a compacted log catches up by InstallSnapshot in chunks', () => {
  const h = new Harness(three, { snapshotChunkBytes: 64 });
  h.elect('n1');
  h.isolate('n3');
  for (let i = 0; i < 60; i++) h.propose('n1', `w${i}`);
  h.stabilize();
  h.tick('n1');
  h.stabilize();
  const snap = h.compact('n1');
  h.compact('n2');
  assert.ok(snap.data.byteLength > 64 * 3, 'the snapshot needs several chunks');
  h.heal();
  let chunks = 0;
  for (let i = 0; i < 50 && h.node('n3').appliedIndex < snap.meta.index; i++) {
    h.tick('n1');
    for (let round = 0; round < 1000 && h.inflight.length > 0; round++) {
      const batch = h.inflight;
      h.inflight = [];
      for (const m of batch) {
        if (m.type === 'snapshot' && m.to === 'n3') chunks++;
        h.deliver(m);
      }
    }
  }
  assert.ok(chunks >= 3, `snapshot sent in ${chunks} chunks`);
  assert.deepEqual(h.node('n3').applied, h.node('n1').applied);
  h.propose('n1', 'after-snapshot');
  h.stabilize();
  h.tick('n1');
  h.stabilize();
  assert.equal(h.node('n3').applied.at(-1), 'after-snapshot');
});

void test('a stale snapshot racing with appends is ignored by a follower already past it', () => {
  const h = new Harness(three, { snapshotChunkBytes: 1 << 20 });
  h.elect('n1');
  for (let i = 0; i < 5; i++) h.propose('n1', `x${i}`);
  h.stabilize();
  h.tick('n1');
  h.stabilize();
  const snap = h.compact('n1');
  const before = h.node('n2').applied.slice();
  h.raft('n2').step({
    type: 'snapshot',
    from: 'n1',
    to: 'n2',
    term: h.raft('n1').softState().term,
    meta: snap.meta,
    offset: 0,
    totalBytes: snap.data.byteLength,
    chunk: snap.data,
    done: true,
  });
  h.process('n2');
  assert.deepEqual(h.node('n2').applied, before, 'nothing re-applied or lost');
  h.stabilize();
});

void test('leadership transfer under load: nothing acknowledged is lost, proposals pause during it', () => {
  const h = new Harness(three);
  h.elect('n1');
  const accepted: string[] = [];
  for (let i = 0; i < 20; i++) if (h.propose('n1', `before${i}`).ok) accepted.push(`before${i}`);
  assert.equal(h.raft('n1').transferLeadership('n2').ok, true);
  const during = h.propose('n1', 'during');
  assert.equal(during.ok, false);
  assert.equal(during.ok === false && during.reason, 'transfer-in-progress');
  h.stabilize();
  assert.deepEqual(h.leaders(), ['n2']);
  for (let i = 0; i < 5; i++) if (h.propose('n2', `after${i}`).ok) accepted.push(`after${i}`);
  h.stabilize();
  h.tick('n2');
  h.stabilize();
  for (const id of three) assert.deepEqual(h.node(id).applied, accepted, `applied on ${id}`);
});

void test('removing the leader: it steps down once the change commits and the rest elect a leader', () => {
  const h = new Harness(three);
  h.elect('n1');
  h.propose('n1', 'a');
  h.stabilize();
  const res = h.raft('n1').proposeConfChange({ op: 'remove', node: 'n1' });
  h.process('n1');
  assert.equal(res.ok, true);
  h.stabilize();
  h.tick('n1');
  h.stabilize();
  assert.notEqual(h.raft('n1').softState().role, Role.Leader);
  assert.deepEqual(h.raft('n2').confState().voters, ['n2', 'n3']);
  h.crash('n1');
  expireLeases(h, ['n2', 'n3']);
  h.elect('n2');
  assert.equal(h.propose('n2', 'b').ok, true);
  h.stabilize();
  h.tick('n2');
  h.stabilize();
  assert.deepEqual(h.node('n3').applied, ['a', 'b']);
});

void test('replacing a node: a learner catches up, is promoted, then the old voter is removed', () => {
  const h = new Harness(three);
  h.elect('n1');
  for (let i = 0; i < 10; i++) h.propose('n1', `v${i}`);
  h.stabilize();
  const leader = h.raft('n1');
  h.addNode('n4');
  assert.equal(leader.proposeConfChange({ op: 'add-learner', node: 'n4' }).ok, true);
  h.process('n1');
  // One change at a time.
  const second = leader.proposeConfChange({ op: 'remove', node: 'n3' });
  assert.equal(second.ok === false && second.reason, 'conf-change-pending');
  h.stabilize();
  h.tick('n1');
  h.stabilize();
  assert.deepEqual(leader.confState(), { voters: ['n1', 'n2', 'n3'], learners: ['n4'] });
  assert.equal(h.node('n4').applied.length, 10, 'the learner caught up');
  const promote = leader.proposeConfChange({ op: 'promote', node: 'n4' });
  assert.equal(promote.ok, true);
  h.process('n1');
  h.stabilize();
  h.tick('n1');
  h.stabilize();
  assert.equal(leader.proposeConfChange({ op: 'remove', node: 'n3' }).ok, true);
  h.process('n1');
  h.stabilize();
  h.tick('n1');
  h.stabilize();
  assert.deepEqual(leader.confState(), { voters: ['n1', 'n2', 'n4'], learners: [] });
  h.crash('n3');
  // The new configuration commits with n4's vote: stop n2, n1 + n4 are a majority.
  h.crash('n2');
  assert.equal(h.propose('n1', 'with-n4').ok, true);
  h.stabilize();
  assert.equal(h.node('n4').applied.at(-1) === 'with-n4' || h.node('n1').applied.at(-1) === 'with-n4', true);
  h.tick('n1');
  h.stabilize();
  assert.equal(h.node('n1').applied.at(-1), 'with-n4');
});

void test('invalid membership changes are refused with a reason', () => {
  const h = new Harness(three);
  h.elect('n1');
  const r1 = h.raft('n1').proposeConfChange({ op: 'promote', node: 'n2' });
  assert.equal(r1.ok === false && r1.reason, 'invalid-conf-change');
  const r2 = h.raft('n1').proposeConfChange({ op: 'remove', node: 'zz' });
  assert.equal(r2.ok === false && r2.reason, 'invalid-conf-change');
});

void test('ReadIndex: a read is served only after a heartbeat round confirms leadership', () => {
  const h = new Harness(three);
  h.elect('n1');
  h.propose('n1', 'a');
  h.stabilize();
  h.raft('n1').readIndex('r1');
  h.process('n1');
  assert.deepEqual(h.node('n1').readStates, [], 'not confirmed before any acknowledgement');
  h.stabilize();
  assert.deepEqual(h.node('n1').readStates, [{ ctx: 'r1', index: 2 }]);
  // A follower's read goes through the leader.
  h.raft('n3').readIndex('r2');
  h.process('n3');
  h.stabilize();
  assert.deepEqual(h.node('n3').readStates, [{ ctx: 'r2', index: 2 }]);
  // An isolated leader can never confirm a read; on stepping down it fails it.
  h.isolate('n1');
  h.raft('n1').readIndex('r3');
  h.process('n1');
  h.stabilize();
  assert.equal(h.node('n1').readStates.length, 1);
  h.tick('n1', 2 * h.electionTicks);
  assert.deepEqual(h.node('n1').failedReads, ['r3']);
});

void test('§5.3 fast back-off: a follower with a long conflicting suffix is repaired in few round trips', () => {
  const h = new Harness(three, { preVote: false, checkQuorum: false });
  h.elect('n1');
  h.isolate('n1');
  for (let i = 0; i < 100; i++) h.propose('n1', `lost${i}`); // 100 entries of term 1, never committed
  h.crash('n1');
  h.heal();
  h.elect('n2');
  for (let i = 0; i < 5; i++) h.propose('n2', `kept${i}`);
  h.stabilize();
  h.start('n1');
  let rejections = 0;
  for (let i = 0; i < 10; i++) {
    h.tick('n2');
    const batch = h.inflight;
    h.inflight = [];
    for (const m of batch) {
      if (m.type === 'append-resp' && m.reject && m.from === 'n1') rejections++;
      h.deliver(m);
    }
    h.stabilize();
  }
  assert.ok(rejections <= 3, `${rejections} rejected appends`);
  assert.deepEqual(h.node('n1').applied, ['kept0', 'kept1', 'kept2', 'kept3', 'kept4']);
});

void test('persistence contract: a granted vote is in the Ready hard state, marked mustSync, before its reply', () => {
  const h = new Harness(three, { preVote: false });
  const n2 = h.raft('n2');
  n2.step({ type: 'vote', from: 'n1', to: 'n2', term: 1, lastIndex: 0, lastTerm: 0, transfer: false });
  const rd = n2.ready();
  assert.deepEqual(rd.hardState, { term: 1, vote: 'n1', commit: 0 });
  assert.equal(rd.mustSync, true);
  assert.deepEqual(
    rd.messages.map((m) => m.type),
    ['vote-resp'],
  );
  n2.advance(rd);
  assert.throws(() => {
    n2.ready();
    n2.tick();
  }, /advance\(\) the outstanding Ready/);
});

void test('a node that must not vote (wiped data directory) neither votes nor campaigns', () => {
  const h = new Harness(three);
  const cfg = { ...h.config('n3'), refuseToVote: true };
  const n3 = new RaftNode(cfg, {
    hardState: { term: 0, vote: null, commit: 0 },
    snapshot: { meta: { index: 0, term: 0, conf: { voters: three, learners: [] } }, data: new Uint8Array() },
    entries: [],
  });
  for (let i = 0; i < 5 * h.electionTicks; i++) n3.tick();
  assert.equal(n3.softState().role, Role.Follower);
  n3.step({ type: 'vote', from: 'n1', to: 'n3', term: 5, lastIndex: 0, lastTerm: 0, transfer: false });
  const rd = n3.ready();
  assert.deepEqual(
    rd.messages.map((m) => m.type === 'vote-resp' && m.reject),
    [true],
  );
});

void test('bootstrap entry: founders start from an identical committed entry 1; a node joining later learns the whole configuration from the log', () => {
  const h = new Harness(three, { bootstrap: 'entry' });
  for (const id of three)
    assert.deepEqual(h.raft(id).confState(), { voters: three, learners: [] }, `${id} applied the bootstrap entry`);
  h.elect('n1');
  h.propose('n1', 'a');
  h.stabilize();
  // A replacement for n3 joins empty: no voters known, so it can never campaign on its own.
  h.addNode('n4');
  assert.deepEqual(h.raft('n4').confState(), { voters: [], learners: [] });
  h.tick('n4', 5 * h.electionTicks);
  assert.equal(h.raft('n4').softState().role, Role.Follower);
  assert.equal(h.raft('n1').proposeConfChange({ op: 'add-learner', node: 'n4' }).ok, true);
  h.process('n1');
  h.stabilize();
  h.tick('n1');
  h.stabilize();
  assert.deepEqual(
    h.raft('n4').confState(),
    { voters: three, learners: ['n4'] },
    'replaying from index 1 gives the real configuration',
  );
  assert.deepEqual(h.node('n4').applied, ['a']);
});
