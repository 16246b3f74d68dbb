// Three real coordinator processes on loopback, started by the tests: election, replication
// through the admin API, kill -9 of the leader, a full-cluster crash and restart, catch-up by
// InstallSnapshot, leadership transfer under write load, replacing a node, bad input, and the
// detection of a wiped data directory.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { CoordinatorCluster } from '../../../testkit/coordinator-cluster.js';
import { waitFor } from '../../../testkit/wait.js';

const ids = ['n1', 'n2', 'n3'];

void test('three processes elect a leader; tiers and tenants written through the API are read back from every node; bad input changes nothing', async () => {
  const c = await CoordinatorCluster.create(ids);
  try {
    c.startAll();
    const leader = await c.waitForLeader();
    assert.equal(
      (await c.write('PUT', '/v1/tiers/gold', { rate: 5000, burst: 10000, floorFraction: 0.3 })).status,
      200,
    );
    assert.equal((await c.write('PUT', '/v1/tenants/acme', { tier: 'gold' })).status, 200);
    for (const id of ids) {
      const tier = await c.http(id, 'GET', '/v1/tiers/gold');
      assert.equal(tier.status, 200, `linearizable read on ${id}: ${JSON.stringify(tier.body)}`);
      assert.equal(tier.body['rate'], 5000);
      const tenant = await c.http(id, 'GET', '/v1/tenants/acme');
      assert.equal(tenant.body['tier'], 'gold', `tenant on ${id}`);
    }
    // A follower redirects writes to the leader's admin URL.
    const follower = ids.find((id) => id !== leader) ?? 'n1';
    const redirected = await c.http(follower, 'PUT', '/v1/tiers/silver', { rate: 10, burst: 10 });
    assert.equal(redirected.status, 307);
    assert.equal(redirected.headers.get('location'), `${c.adminUrl(leader)}/v1/tiers/silver`);

    // Bad input: a clear 4xx, and nothing changes.
    const bad: [string, string, unknown, number, string][] = [
      ['PUT', '/v1/tiers/gold', { rate: -1, burst: 10 }, 400, 'INVALID'],
      ['PUT', '/v1/tiers/gold', { rate: 1, burst: 1, extra: true }, 400, 'INVALID'],
      ['PUT', '/v1/tiers/bad%20name', { rate: 1, burst: 1 }, 400, 'INVALID'],
      ['PUT', '/v1/tenants/acme', { tier: 'no-such-tier' }, 404, 'NOT_FOUND'],
      ['DELETE', '/v1/tiers/gold', undefined, 409, 'CONFLICT'],
      ['PUT', '/v1/tiers/gold', '{not json', 400, 'INVALID'],
      ['PUT', '/v1/tiers/gold', { rate: 1, burst: 1, pad: 'x'.repeat(100_000) }, 413, 'PAYLOAD_TOO_LARGE'],
    ];
    for (const [method, path, body, status, code] of bad) {
      const r = await c.http(leader, method, path, body);
      assert.equal(r.status, status, `${method} ${path}: ${JSON.stringify(r.body).slice(0, 200)}`);
      assert.equal(r.body['error'], code);
      assert.equal(typeof r.body['message'], 'string');
    }
    const after = await c.http(leader, 'GET', '/v1/tiers/gold');
    assert.equal(after.body['rate'], 5000, 'the tier is unchanged');
    assert.equal((await c.http(leader, 'GET', '/v1/tenants/acme')).body['tier'], 'gold');

    // A retried write (same client id and sequence) applies once.
    const h = { 'x-client-id': 'script-1', 'x-request-seq': '1' };
    assert.equal((await c.write('PUT', '/v1/tenants/once', { tier: 'gold' }, h)).status, 200);
    assert.equal(
      (await c.write('DELETE', '/v1/tenants/once', undefined, { 'x-client-id': 'script-1', 'x-request-seq': '2' }))
        .status,
      200,
    );
    const retry = await c.write('PUT', '/v1/tenants/once', { tier: 'gold' }, h);
    assert.equal(retry.status, 409, 'the stale retry of seq 1 is refused, not applied again');
    assert.equal((await c.http(leader, 'GET', '/v1/tenants/once')).status, 404);

    const docs = await c.http(leader, 'GET', '/docs/json');
    assert.ok(
      typeof docs.body['paths'] === 'object' && docs.body['paths'] !== null && '/v1/tenants/{id}' in docs.body['paths'],
      'OpenAPI lists the tenant path',
    );
    const metrics = await fetch(`${c.adminUrl(leader)}/metrics`).then((r) => r.text());
    assert.match(metrics, /cellquota_raft_is_leader 1/);
  } finally {
    await c.cleanup();
  }
});

void test('kill -9 of the leader: a new leader takes writes; kill all three and restart: no acknowledged write is lost', async () => {
  const c = await CoordinatorCluster.create(ids);
  try {
    c.startAll();
    await c.waitForLeader();
    assert.equal((await c.write('PUT', '/v1/tiers/t', { rate: 100, burst: 100 })).status, 200);
    const acked: string[] = [];
    for (let i = 0; i < 20; i++) {
      const r = await c.write('PUT', `/v1/tenants/a${i}`, { tier: 't' });
      if (r.status === 200) acked.push(`a${i}`);
    }
    const leader = await c.waitForLeader();
    await c.kill(leader, 'SIGKILL');
    const survivors = ids.filter((id) => id !== leader);
    const next = await c.waitForLeader(20_000, survivors);
    assert.notEqual(next, leader);
    for (let i = 20; i < 40; i++) {
      const r = await c.write('PUT', `/v1/tenants/a${i}`, { tier: 't' });
      if (r.status === 200) acked.push(`a${i}`);
    }
    assert.ok(acked.length >= 38, `writes acknowledged around the failover: ${acked.length}`);
    // Everything dies at once, then comes back.
    await c.stopAll();
    c.startAll();
    await c.waitForLeader();
    for (const id of ids) {
      await waitFor(
        `${id} to serve reads`,
        async () => (await c.http(id, 'GET', '/v1/tenants?limit=1000')).status === 200,
        { timeoutMs: 20_000, everyMs: 100 },
      );
      const list = await c.http(id, 'GET', '/v1/tenants?limit=1000');
      const have = new Set((list.body['tenants'] as { id: string }[]).map((t) => t.id));
      for (const a of acked) assert.ok(have.has(a), `${id} lost acknowledged tenant ${a}`);
    }
  } finally {
    await c.cleanup();
  }
});

void test('a node that missed many writes catches up through InstallSnapshot after the log was compacted', async () => {
  const c = await CoordinatorCluster.create(ids, ['--snapshot-every', '20']);
  try {
    c.startAll();
    const leader = await c.waitForLeader();
    const lagger = ids.find((id) => id !== leader) ?? 'n3';
    await c.kill(lagger);
    assert.equal((await c.write('PUT', '/v1/tiers/t', { rate: 100, burst: 100 })).status, 200);
    for (let i = 0; i < 80; i++) assert.equal((await c.write('PUT', `/v1/tenants/s${i}`, { tier: 't' })).status, 200);
    c.start(lagger);
    await waitFor(
      `${lagger} to catch up`,
      async () => (await c.http(lagger, 'GET', '/v1/tenants/s79?stale=true')).status === 200,
      { timeoutMs: 30_000, everyMs: 100 },
    );
    assert.match(c.replica(lagger).output, /installed a snapshot from the leader/);
  } finally {
    await c.cleanup();
  }
});

void test('leadership transfer under write load loses nothing; a node replaced with an empty data dir rejoins', async () => {
  const c = await CoordinatorCluster.create(ids);
  try {
    c.startAll();
    await c.waitForLeader();
    assert.equal((await c.write('PUT', '/v1/tiers/t', { rate: 100, burst: 100 })).status, 200);
    const acked: string[] = [];
    let stop = false;
    const writer = (async () => {
      for (let i = 0; !stop && i < 400; i++) {
        const r = await c.write('PUT', `/v1/tenants/w${i}`, { tier: 't' }).catch(() => null);
        if (r?.status === 200) acked.push(`w${i}`);
      }
    })();
    await new Promise((r) => setTimeout(r, 300));
    // A transfer is abandoned if the target cannot catch up within an election timeout (on this
    // small machine, under load, it can happen): ask again, as an operator's script would.
    let target = '';
    for (let attempt = 0; attempt < 3 && target === ''; attempt++) {
      const from = await c.waitForLeader();
      const transfer = await c.http(from, 'POST', '/v1/cluster/transfer-leadership', {});
      assert.equal(transfer.status, 200, JSON.stringify(transfer.body));
      const to = transfer.body['transferringTo'] as string;
      try {
        await waitFor('the transfer', async () => (await c.waitForLeader()) === to, { timeoutMs: 5000, everyMs: 100 });
        target = to;
      } catch {
        // not moved this time
      }
    }
    assert.notEqual(target, '', 'leadership moved');
    await new Promise((r) => setTimeout(r, 300));
    stop = true;
    await writer;
    assert.ok(acked.length > 5, `writes during the transfer: ${acked.length}`);
    const list = await c.http(target, 'GET', '/v1/tenants?limit=1000');
    const have = new Set((list.body['tenants'] as { id: string }[]).map((t) => t.id));
    for (const a of acked) assert.ok(have.has(a), `acknowledged ${a} lost in the transfer`);

    // Replace a follower: its disk is lost, it comes back empty with --join, the API re-adds it.
    const current = await c.waitForLeader();
    const victim = ids.find((id) => id !== current) ?? 'n3';
    await c.kill(victim);
    rmSync(c.replica(victim).dataDir, { recursive: true, force: true });
    c.start(victim, { join: true });
    const replaced = await c.write('POST', `/v1/members/${victim}/replace`, {
      address: `127.0.0.1:${c.replica(victim).peerPort}`,
    });
    assert.equal(replaced.status, 200, JSON.stringify(replaced.body));
    await waitFor(
      `${victim} to hold the data`,
      async () => (await c.http(victim, 'GET', `/v1/tenants/${acked.at(-1) ?? 'w0'}?stale=true`)).status === 200,
      { timeoutMs: 30_000, everyMs: 100 },
    );
    const cluster = await c.http(await c.waitForLeader(), 'GET', '/v1/cluster');
    const member = (cluster.body['members'] as { id: string; voter: boolean }[]).find((m) => m.id === victim);
    assert.equal(member?.voter, true, `${victim} is a voter again`);
  } finally {
    await c.cleanup();
  }
});

void test('a wiped data directory is detected: the node refuses to vote and prints the command that re-adds it', async () => {
  const c = await CoordinatorCluster.create(ids);
  try {
    c.startAll();
    const leader = await c.waitForLeader();
    // Every member's data directory is recorded by the cluster.
    await waitFor(
      'incarnations recorded',
      async () =>
        Object.keys((await c.http(leader, 'GET', '/v1/internal/incarnations')).body['incarnations'] as object)
          .length === 3,
      { timeoutMs: 20_000, everyMs: 100 },
    );
    const victim = ids.find((id) => id !== leader) ?? 'n3';
    await c.kill(victim);
    rmSync(c.replica(victim).dataDir, { recursive: true, force: true });
    c.start(victim); // same flags, empty directory: as after a lost disk
    await waitFor('the refusal', () => Promise.resolve(/must not vote/.test(c.replica(victim).output)), {
      timeoutMs: 20_000,
      everyMs: 100,
    });
    assert.match(
      c.replica(victim).output,
      new RegExp(`cellquota ctl members replace ${victim} --address 127\\.0\\.0\\.1:\\d+`),
    );
    const st = await c.http(victim, 'GET', '/v1/cluster?stale=true');
    assert.equal(st.body['votingRefused'], true);
    assert.equal((await c.http(victim, 'GET', '/readyz')).status, 503);
    // The other two keep the cluster available.
    assert.equal((await c.write('PUT', '/v1/tiers/still', { rate: 1, burst: 1 })).status, 200);
  } finally {
    await c.cleanup();
  }
});
