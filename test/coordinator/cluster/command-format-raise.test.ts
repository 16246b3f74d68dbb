// The log's command format is raised by the leader only once every member declares it reads it: three real
// coordinator processes, one started with --command-format 4 (as a replica of the build before format 5 declares
// itself) holds the raise back; restarted at its build's format, the raise applies on every replica at one index.
// A replica pinned below the log's format afterwards refuses to go on (LEDGER_FORMAT_UNSUPPORTED) rather than diverge.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CoordinatorCluster } from '../../../testkit/coordinator-cluster.js';
import { waitFor } from '../../../testkit/wait.js';
import { NEWEST_COMMAND_FORMAT, TENANT_WIND_DOWN_FORMAT } from '../../../coordinator/ledger/ledger-commands.js';

const ids = ['n1', 'n2', 'n3'];
// The build before format 5 (not NEWEST - 1: n3 elected raises the log to its own format, and from format 5 on the
// deletion below is allowed, so with NEWEST - 1 ≥ 5 the 409 depended on which replica won the first election).
const OLDER = String(TENANT_WIND_DOWN_FORMAT - 1);

interface FormatView {
  commandFormat: { log: number; raisedAtIndex: number };
  members: { id: string; commandFormat: number | null }[];
  leader: string | null;
}

async function view(c: CoordinatorCluster, id: string): Promise<FormatView> {
  return (await c.http(id, 'GET', '/v1/cluster?stale=true')).body as unknown as FormatView;
}

void test('a member declaring an older command format holds the raise back; once every member declares it, it applies on every replica at the same index', async () => {
  const c = await CoordinatorCluster.create(ids);
  try {
    c.start('n1');
    c.start('n2');
    c.start('n3', { env: { CELLQUOTA_COMMAND_FORMAT: OLDER } });
    // The leader has heard every member's declaration and decided to wait (its log line), and the log stays below
    // the newest format on every replica while a write goes through.
    await waitFor(
      'the leader has every declaration',
      async () => {
        const v = await view(c, await c.waitForLeader(60_000));
        const declared = new Map(v.members.map((m) => [m.id, m.commandFormat]));
        return declared.get('n3') === Number(OLDER) && ids.every((id) => declared.get(id) !== null);
      },
      { timeoutMs: 60_000 },
    );
    await waitFor(
      'a leader holds the raise back',
      async () => {
        if (
          ['n1', 'n2'].some((id) =>
            c.replica(id).output.includes('the command format is raised once every member declared it reads it'),
          )
        )
          return true;
        // n3 elected raises the log to its own format (every member reads it), which is right but not what this
        // test looks at: it hands leadership to n1, which then waits for n3.
        if ((await c.waitForLeader(60_000)) === 'n3')
          await c.write('POST', '/v1/cluster/transfer-leadership', { to: 'n1' });
        return false;
      },
      { timeoutMs: 60_000 },
    );
    assert.equal((await c.write('PUT', '/v1/tiers/gold', { rate: 100, burst: 100 })).status, 200);
    for (const id of ids) {
      const v = await view(c, id);
      // At the base format unless n3 was elected meanwhile and raised it to its own (older) format.
      assert.ok(v.commandFormat.log <= Number(OLDER), `${id} is not raised: ${JSON.stringify(v.commandFormat)}`);
    }
    // Below format 5 a tenant is not deleted under a tier:NAME policy (its old semantics break the bound), whether
    // or not it holds slices yet; deleted at once under another policy.
    assert.equal((await c.write('PUT', '/v1/tenants/acme', { tier: 'gold' })).status, 200);
    assert.equal((await c.write('PUT', '/v1/settings', { unknownTenant: 'tier:gold' })).status, 200);
    const refused = await c.write('DELETE', '/v1/tenants/acme');
    assert.equal(refused.status, 409, JSON.stringify(refused.body));
    assert.match(JSON.stringify(refused.body), /command format 5 \(now \d\)/);
    assert.equal((await c.write('PUT', '/v1/settings', { unknownTenant: 'deny' })).status, 200);
    assert.equal((await c.write('DELETE', '/v1/tenants/acme')).status, 200);

    // n3 restarted at its build's newest format: the leader raises the log, every replica applies it at one index.
    await c.kill('n3', 'SIGTERM');
    c.start('n3');
    const raised = await waitFor(
      'every replica at the newest format',
      async () => {
        const vs = await Promise.all(ids.map((id) => view(c, id).catch(() => null)));
        return vs.every((v) => v?.commandFormat.log === NEWEST_COMMAND_FORMAT) ? vs : null;
      },
      { timeoutMs: 60_000 },
    );
    const at = new Set(raised.map((v) => v?.commandFormat.raisedAtIndex));
    assert.equal(at.size, 1, `raised at one index on every replica: ${[...at].join(', ')}`);
    assert.ok([...at][0] !== 0);

    // Pinned below the log's format now, a replica stops at the raise (it replays its log) with a clear error.
    const follower = (await c.waitForLeader(60_000)) === 'n2' ? 'n1' : 'n2';
    await c.kill(follower, 'SIGTERM');
    c.start(follower, { env: { CELLQUOTA_COMMAND_FORMAT: OLDER } });
    const r = c.replica(follower);
    await waitFor(`${follower} stops`, () => r.proc === null, {
      timeoutMs: 30_000,
      context: () => r.output.slice(-2000),
    });
    assert.match(r.output, /LEDGER_FORMAT_UNSUPPORTED/);
    assert.match(r.output, new RegExp(`raises the command format to ${NEWEST_COMMAND_FORMAT}`));
  } finally {
    await c.cleanup();
  }
});
