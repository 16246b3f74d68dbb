// Chaos drill 9: a coordinator whose disk fills (ENOSPC on write) or whose fsync fails (EIO) stops
// serving rather than corrupting. Three real coordinator processes, each started with the
// failing-disk LD_PRELOAD shim (chaos/faults/failing-disk.c) armed for its own data directory and
// its own trigger file; only the replica whose trigger file exists sees the fault. For each mode:
//   1. a follower's disk fails under write load: it exits non-zero with a fatal line naming its
//      data directory and the errno; every write acknowledged with 200 is readable from the two
//      survivors; with the trigger removed and restarted on the same directory it catches up;
//   2. then the leader's: same, and the survivors elect a new leader that takes writes again.
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFailingDisk, failingDiskEnv, type FailingDiskMode } from '../../chaos/faults/failing-disk.js';
import { CoordinatorCluster, type Replica } from '../../testkit/coordinator-cluster.js';
import { exitStorageFailure } from '../../cli/coordinator-command.js';
import { waitFor } from '../../testkit/wait.js';

const ids = ['n1', 'n2', 'n3'];
const noCompiler = spawnSync('cc', ['--version']).error !== undefined;
const shimDir = mkdtempSync(join(tmpdir(), 'cq-failing-disk-'));
const shim = noCompiler ? null : await buildFailingDisk(shimDir);
const skip = noCompiler ? 'no C compiler (`cc`) to build the LD_PRELOAD shim chaos/faults/failing-disk.c' : false;

interface Exit {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
}

function exitOf(r: Replica): Promise<Exit> {
  const proc = r.proc;
  if (proc === null) throw new Error(`${r.id} is not running`);
  return new Promise((ok) => proc.once('exit', (code, signal) => ok({ code, signal })));
}

/** The replica's pino lines at level fatal (60). */
function fatalLines(r: Replica): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of r.output.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const o = JSON.parse(line) as Record<string, unknown>;
      if (o['level'] === 60) out.push(o);
    } catch {
      // not a log line
    }
  }
  return out;
}

const errnoOf: Record<FailingDiskMode, string> = { enospc: 'ENOSPC', 'eio-fsync': 'EIO' };

async function drill(mode: FailingDiskMode): Promise<void> {
  if (shim === null) throw new Error('cc is present but the failing-disk shim did not build (see the warning above)');
  const c = await CoordinatorCluster.create(ids);
  const trigger = (id: string): string => join(c.root, `disk-fails-${id}`);
  const env = (id: string): Record<string, string> => failingDiskEnv(shim, trigger(id), mode, c.replica(id).dataDir);
  const acked: string[] = [];
  let seq = 0;
  /** One tenant write through the leader; remembered only if acknowledged with 200. */
  const writeOne = async (): Promise<number> => {
    const name = `${mode}-t${seq++}`;
    try {
      const r = await c.write('PUT', `/v1/tenants/${name}`, { tier: 'gold' });
      if (r.status === 200) acked.push(name);
      return r.status;
    } catch {
      return 0; // a timeout or a refused connection: not acknowledged
    }
  };
  const lastAcked = (): string => {
    const name = acked.at(-1);
    if (name === undefined) throw new Error('nothing was acknowledged');
    return name;
  };
  /** Every acknowledged write is there, read linearizably on each of `on`. */
  const assertAllAckedReadable = async (on: readonly string[], when: string): Promise<void> => {
    for (const id of on) {
      for (const name of acked) {
        const r = await c.http(id, 'GET', `/v1/tenants/${name}`);
        assert.equal(r.status, 200, `${when}: acknowledged tenant ${name} on ${id}: ${JSON.stringify(r.body)}`);
        assert.equal(r.body['tier'], 'gold', `${when}: tenant ${name} on ${id}`);
      }
    }
  };
  /** Arms the victim's disk fault and keeps writing until it exits; checks how it went. */
  const failDisk = async (victim: string): Promise<void> => {
    const r = c.replica(victim);
    const exited = exitOf(r);
    let exit: Exit | null = null;
    void exited.then((e) => (exit = e));
    writeFileSync(trigger(victim), '');
    const deadline = Date.now() + 15_000;
    while (exit === null && Date.now() < deadline) await writeOne();
    const e = await Promise.race([exited, new Promise<null>((ok) => setTimeout(() => ok(null), 2000))]);
    assert.notEqual(
      e,
      null,
      `${victim} did not exit after its disk failed (${mode}); output tail:\n${r.output.slice(-2000)}`,
    );
    assert.equal(e?.signal, null, `${victim} exited on its own, not by a signal`);
    assert.equal(e?.code, exitStorageFailure, `${victim} exits with EX_IOERR; output tail:\n${r.output.slice(-2000)}`);
    const fatal = fatalLines(r).find((l) => l['dataDir'] === r.dataDir && l['errno'] === errnoOf[mode]);
    assert.notEqual(
      fatal,
      undefined,
      `a fatal line naming ${r.dataDir} and ${errnoOf[mode]}; fatal lines: ${JSON.stringify(fatalLines(r)).slice(0, 2000)}`,
    );
    assert.match(String(fatal?.['msg']), /stops serving/);
  };
  /** Trigger removed, restarted on the same data directory: its stale read shows the last acknowledged write. */
  const recover = async (victim: string): Promise<void> => {
    rmSync(trigger(victim));
    c.start(victim, { env: env(victim) });
    const name = lastAcked();
    await waitFor(
      `${victim} to catch up to ${name}`,
      async () => {
        const r = await c.http(victim, 'GET', `/v1/tenants/${name}?stale=true`);
        return r.status === 200 && r.body['tier'] === 'gold';
      },
      { timeoutMs: 20_000, everyMs: 100 },
    );
    assert.equal(fatalLines(c.replica(victim)).length, 0, `${victim} restarted cleanly`);
  };

  try {
    for (const id of ids) c.start(id, { env: env(id) });
    const leader = await c.waitForLeader();
    assert.equal((await c.write('PUT', '/v1/tiers/gold', { rate: 100, burst: 100 })).status, 200);
    for (let i = 0; i < 5; i++) assert.equal(await writeOne(), 200, 'writes before the fault');

    // 1. A follower's disk fails.
    const follower = ids.find((id) => id !== leader) ?? 'n1';
    await failDisk(follower);
    const survivors1 = ids.filter((id) => id !== follower);
    for (let i = 0; i < 5; i++)
      assert.equal(await writeOne(), 200, 'the majority keeps taking writes without the failed follower');
    await assertAllAckedReadable(survivors1, `${mode}, follower ${follower} down`);
    await recover(follower);

    // 2. The leader's disk fails.
    const leader2 = await c.waitForLeader();
    await failDisk(leader2);
    const survivors2 = ids.filter((id) => id !== leader2);
    const newLeader = await c.waitForLeader(20_000, survivors2);
    assert.notEqual(newLeader, leader2);
    let ok = 0;
    const deadline = Date.now() + 10_000;
    while (ok < 5 && Date.now() < deadline) if ((await writeOne()) === 200) ok++;
    assert.equal(ok, 5, `the new leader ${newLeader} takes writes`);
    await assertAllAckedReadable(survivors2, `${mode}, leader ${leader2} down`);
    await recover(leader2);
    await assertAllAckedReadable(ids, `${mode}, all back`);
  } finally {
    await c.cleanup();
  }
}

void test(
  'failing disk, ENOSPC on write: the replica crash-stops; no acknowledged write is lost; it rejoins after the disk is fixed',
  { skip },
  () => drill('enospc'),
);

void test(
  'failing disk, EIO on fsync: the replica crash-stops; no acknowledged write is lost; it rejoins after the disk is fixed',
  { skip },
  () => drill('eio-fsync'),
);

// The shim's build folder goes whichever tests ran (also under --test-name-pattern).
after(() => rmSync(shimDir, { recursive: true, force: true }));
