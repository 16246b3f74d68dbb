// The `coordinator` benchmark (cellquota vs a 3-member etcd), run as its smoke variant: the report
// has the shape bench/run.ts prints and writes, every phase and failover run is accounted for, and
// no process it started is left behind. No wall-clock figure is asserted (docs/targets.md: targets are
// for benchmarks). Without etcd on PATH the etcd rows are skipped with a note, which is checked too.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { existsSync } from 'node:fs';
import { runCoordinatorBenchDetailed } from '../../bench/coordinator.js';
import { EtcdCluster, findEtcd } from '../../bench/servers/etcd-cluster.js';

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

const etcdBin = findEtcd();

void describe('bench/servers/etcd-cluster', { skip: etcdBin === null ? 'etcd is not on PATH' : false }, () => {
  void it('starts 3 members, finds the leader, restarts a killed member on its data dir, and removes everything on stop', async () => {
    const e = await EtcdCluster.start({ heartbeatMs: 50, electionMs: 500, preVote: true, label: 'test' });
    const pids: number[] = [];
    try {
      pids.push(...e.pids());
      assert.equal(pids.length, 3, 'three members running');
      const leader = await e.waitForLeader();
      assert.equal(
        e.members.some((m) => m.name === leader),
        true,
        `leader ${leader} is a member`,
      );
      const res = await fetch(`${e.member(leader).clientUrl}/v3/kv/put`, {
        method: 'POST',
        body: JSON.stringify({ key: Buffer.from('k').toString('base64'), value: Buffer.from('v').toString('base64') }),
      });
      assert.equal(res.status, 200, await res.text());

      const follower = e.members.find((m) => m.name !== leader);
      assert.notEqual(follower, undefined);
      const name = follower?.name ?? '';
      await e.kill(name);
      assert.equal(e.member(name).proc, null, 'killed');
      e.start(name);
      pids.push(...e.pids());
      await e.waitCaughtUp(name);
      const st = await e.status(name);
      assert.notEqual(st, null, 'the restarted member answers');
      assert.equal((st?.raftAppliedIndex ?? 0) > 0, true, 'and has applied entries');
    } finally {
      await e.stop();
    }
    assert.equal(existsSync(e.root), false, 'data dirs removed');
    assert.deepEqual(pids.filter(alive), [], 'every etcd process exited');
  });
});

void describe('npm run bench -- coordinator --smoke', () => {
  void it('reports a row per system and measurement, with ratios and target notes', async () => {
    const messages: string[] = [];
    const { report, phases, failovers, skipped } = await runCoordinatorBenchDetailed({
      smoke: true,
      progress: (m) => messages.push(m),
    });

    assert.equal(report.name, 'coordinator');
    assert.equal(typeof report.title, 'string');
    assert.equal(
      report.notes.every((n) => typeof n === 'string'),
      true,
      'notes are strings',
    );
    for (const row of report.rows) {
      for (const v of Object.values(row))
        assert.equal(typeof v === 'number' || typeof v === 'string', true, 'cells are numbers or strings');
      for (const col of [
        'system',
        'measurement',
        'n',
        'p50 ms',
        'p99 ms',
        'max ms',
        'writes/s',
        'errors',
        'cq ÷ etcd writes/s',
        'cq ÷ etcd p50',
      ])
        assert.equal(col in row, true, `column ${col}`);
    }
    const withEtcd = etcdBin !== null;
    const systems = withEtcd ? ['cellquota', 'etcd'] : ['cellquota'];
    const failoverSystems = withEtcd ? ['cellquota', 'etcd', 'etcd 50/500'] : ['cellquota'];

    // One phase per (system, client count) in the single smoke round, each with acknowledged writes.
    assert.deepEqual(
      phases.map((p) => `${p.system}/${p.clients}`).sort(),
      [1, 8, 64].flatMap((c) => systems.map((s) => `${s}/${c}`)).sort(),
    );
    for (const p of phases) {
      assert.equal(p.writes > 0, true, `${p.system} ${p.clients}: writes acknowledged`);
      assert.equal(p.errors, 0, p.errorSamples.join('; '));
      assert.equal(p.p50 <= p.p99 && p.p99 <= p.max, true, 'p50 ≤ p99 ≤ max');
    }
    const writeRows = report.rows.filter((r) => String(r['measurement']).startsWith('admin write'));
    assert.deepEqual(
      writeRows.map((r) => `${String(r['system'])}/${String(r['measurement'])}`),
      [1, 8, 64].flatMap((c) => systems.map((s) => `${s}/admin write, ${c} client${c === 1 ? '' : 's'}`)),
    );
    for (const r of writeRows) {
      if (r['system'] === 'etcd') {
        assert.match(String(r['cq ÷ etcd writes/s']), /^\d+\.\d\d$/);
        assert.match(String(r['cq ÷ etcd p50']), /^\d+\.\d\d$/);
      } else {
        assert.equal(r['cq ÷ etcd writes/s'], '');
      }
    }

    // One failover run per system.
    assert.deepEqual(
      failovers.map((f) => f.system),
      failoverSystems,
    );
    for (const f of failovers) {
      assert.equal(f.runs.length, 1, `${f.system}: one run`);
      assert.equal(
        f.runs.every((v) => Number.isFinite(v) && v > 0),
        true,
        `${f.system}: a positive time`,
      );
    }
    const failoverRows = report.rows.filter((r) => String(r['measurement']).startsWith('failover'));
    assert.deepEqual(
      failoverRows.map((r) => r['system']),
      failoverSystems,
    );

    // Target evaluations are in the notes, with a verdict.
    const failoverNote = report.notes.find((n) => n.startsWith('Target "a write acknowledged again'));
    assert.match(failoverNote ?? '', / — (met|NOT met)/);
    const writeNote = report.notes.find((n) => n.startsWith('Target "admin write latency'));
    assert.match(writeNote ?? '', withEtcd ? /overall (met|NOT met)/ : /not evaluated/);
    if (withEtcd) assert.deepEqual(skipped, []);
    else
      assert.equal(
        report.notes.some((n) => n.includes('not found on PATH')),
        true,
        'the skip is noted',
      );
    assert.equal(
      messages.some((m) => m.startsWith('stopped cellquota')),
      true,
      'every server stopped',
    );
  });

  void it('skips the etcd side with a note when asked to (as when etcd is not installed)', async () => {
    const { report, skipped } = await runCoordinatorBenchDetailed({
      smoke: true,
      etcd: false,
      clients: [1],
      failoverRuns: 0,
      progress: () => undefined,
    });
    assert.equal(skipped.length, 1);
    assert.deepEqual(
      report.rows.map((r) => r['system']),
      ['cellquota'],
    );
    assert.equal(
      report.notes.some((n) => n.startsWith('Skipped: ')),
      true,
      'the skip is noted',
    );
  });
});
