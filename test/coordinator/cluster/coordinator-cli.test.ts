// The `cellquota` command itself: bad settings exit 2 with the setting named; the admin token is
// enforced by a real cluster; `cellquota ctl` drives the API with tables and --json; replicas on one
// host without --admin-peers never redirect a write to themselves.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { resolve } from 'node:path';
import { CoordinatorCluster } from '../../../testkit/coordinator-cluster.js';

const cli = resolve(import.meta.dirname, '../../../cli/main.ts');

function run(
  args: string[],
  env: Record<string, string> = {},
): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, ['--import', 'tsx', cli, ...args], {
    encoding: 'utf8',
    env: { ...process.env, ...env },
    timeout: 60_000,
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

void test('cellquota coordinator: a bad value says what and where, and exits 2', () => {
  const badPeers = run(['coordinator', '--id', 'n1', '--peers', 'n1=nohostport', '--data-dir', '/tmp/x']);
  assert.equal(badPeers.status, 2);
  assert.match(badPeers.stderr, /--peers: 'n1=nohostport' is not id=host:port/);
  const notListed = run(['coordinator', '--id', 'n9', '--peers', 'n1=127.0.0.1:1', '--data-dir', '/tmp/x']);
  assert.equal(notListed.status, 2);
  assert.match(notListed.stderr, /--peers: must include this replica's id n9/);
  const fromEnv = run(['coordinator', '--id', 'n1', '--peers', 'n1=127.0.0.1:1', '--data-dir', '/tmp/x'], {
    CELLQUOTA_TICK_MS: 'fast',
  });
  assert.equal(fromEnv.status, 2);
  assert.match(fromEnv.stderr, /CELLQUOTA_TICK_MS/);
  const unknown = run(['coordinator', '--bogus']);
  assert.equal(unknown.status, 2);
  assert.match(unknown.stderr, /unknown flag --bogus/);
  const help = run(['--help']);
  assert.equal(help.status, 0);
  for (const sub of ['coordinator', 'dev', 'ctl']) assert.match(help.stdout, new RegExp(`cellquota ${sub}`));
});

void test('admin token: writes without it get 401, with a wrong one 403, and change nothing; ctl works with it', async () => {
  const token = 'secret-token-123';
  const c = await CoordinatorCluster.create(['n1', 'n2', 'n3'], ['--admin-token', token, '--auth-reads']);
  c.authToken = token;
  try {
    c.startAll();
    const leader = await c.waitForLeader();
    const missing = await c.http(leader, 'PUT', '/v1/tiers/gold', { rate: 1, burst: 1 });
    assert.equal(missing.status, 401);
    assert.equal(missing.body['error'], 'UNAUTHORIZED');
    const wrong = await c.http(
      leader,
      'PUT',
      '/v1/tiers/gold',
      { rate: 1, burst: 1 },
      { authorization: 'Bearer nope' },
    );
    assert.equal(wrong.status, 403);
    assert.equal(
      (await c.http(leader, 'GET', '/v1/tiers/gold')).status,
      401,
      'reads need the token too (--auth-reads)',
    );
    assert.equal(
      (await c.http(leader, 'GET', '/v1/tiers/gold', undefined, { authorization: `Bearer ${token}` })).status,
      404,
      'nothing was written',
    );

    const admin = [...c.replicas.keys()].map((id) => c.adminUrl(id)).join(',');
    const put = run([
      'ctl',
      '--admin',
      admin,
      '--token',
      token,
      'tiers',
      'put',
      'gold',
      '--rate',
      '500',
      '--burst',
      '1000',
      '--floor-fraction',
      '0.5',
    ]);
    assert.equal(put.status, 0, put.stderr);
    const tenant = run(['ctl', '--admin', admin, 'tenants', 'put', 'acme', '--tier', 'gold'], {
      CELLQUOTA_ADMIN_TOKEN: token,
    });
    assert.equal(tenant.status, 0, tenant.stderr);
    const list = run(['ctl', '--admin', admin, '--token', token, '--json', 'tiers', 'list']);
    assert.equal(list.status, 0, list.stderr);
    const doc = JSON.parse(list.stdout) as { tiers: { name: string; rate: number; tenantCount: number }[] };
    assert.deepEqual(
      doc.tiers.map((t) => [t.name, t.rate, t.tenantCount]),
      [['gold', 500, 1]],
    );
    const table = run(['ctl', '--admin', admin, '--token', token, 'cluster']);
    assert.match(table.stdout, /^leader n\d {2}term \d+/m);
    assert.match(table.stdout, /ID\s+ROLE\s+ADDRESS/);
    const missingTenant = run(['ctl', '--admin', admin, '--token', token, 'tenants', 'get', 'nobody']);
    assert.equal(missingTenant.status, 4);
    assert.match(missingTenant.stderr, /404 NOT_FOUND/);
    // The replicas' own calls to each other's admin APIs carry the token: every data directory got recorded.
    const inc = await c.http(leader, 'GET', '/v1/internal/incarnations', undefined, {
      authorization: `Bearer ${token}`,
    });
    assert.equal(Object.keys(inc.body['incarnations'] as object).length, 3, JSON.stringify(inc.body));
    const noAnswer = run(['ctl', '--admin', 'http://127.0.0.1:9', 'cluster']);
    assert.equal(noAnswer.status, 3);
  } finally {
    await c.cleanup();
  }
});

void test('replicas on one host without --admin-peers: a follower answers NO_LEADER naming --admin-peers, never a 307 to itself', async () => {
  const cluster = await CoordinatorCluster.create(['n1', 'n2', 'n3']);
  cluster.listAdminPeers = false;
  try {
    cluster.startAll();
    const leader = await cluster.waitForLeader();
    const follower = [...cluster.replicas.keys()].find((id) => id !== leader) ?? '';
    const r = await cluster.http(follower, 'PUT', '/v1/tiers/gold', { rate: 10, burst: 10 });
    assert.equal(r.status, 503, JSON.stringify(r.body));
    assert.equal(r.body['error'], 'NO_LEADER');
    assert.match(
      String(r.body['message']),
      new RegExp(`the leader is ${leader} but its admin URL is unknown \\(list it in --admin-peers\\)`),
    );
    assert.match(cluster.replica(follower).output, /their admin URLs cannot be derived from --peers/);
    assert.equal((await cluster.http(follower, 'GET', '/v1/tiers/gold')).status, 404, 'nothing was written');
    const direct = await cluster.http(leader, 'PUT', '/v1/tiers/gold', { rate: 10, burst: 10 });
    assert.ok(direct.status === 200 || direct.status === 201, JSON.stringify(direct.body));
  } finally {
    await cluster.cleanup();
  }
});
