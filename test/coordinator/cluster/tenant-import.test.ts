// Bulk tenants: `cellquota ctl tenants import FILE` (JSON lines and CSV) and POST /v1/tenants behind
// it, against a real three-replica cluster. A bad line is reported with its line number and changes
// nothing for that tenant while the others apply; a re-run changes nothing; the API bounds its input.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { request } from 'node:http';
import { writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { CoordinatorCluster } from '../../../testkit/coordinator-cluster.js';

const cli = resolve(import.meta.dirname, '../../../cli/main.ts');

/** A POST whose headers declare `length` bytes of JSON, of which only the first 16 KiB are sent; its answer. */
function declaredBodyRequest(
  baseUrl: string,
  path: string,
  length: number,
  headers: Record<string, string>,
): Promise<{ status: number; text: string }> {
  return new Promise((ok, fail) => {
    const req = request(
      new URL(path, baseUrl),
      { method: 'POST', headers: { ...headers, 'content-type': 'application/json', 'content-length': String(length) } },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (s: string) => (text += s));
        res.on('end', () => {
          req.destroy();
          ok({ status: res.statusCode ?? 0, text });
        });
      },
    );
    req.on('error', fail);
    req.setTimeout(10_000, () => req.destroy(new Error('no answer within 10 s to a body not sent in full')));
    req.write(`{"tenants":[{"id":"big","tier":"gold","pad":"${'x'.repeat(16 * 1024)}`);
  });
}

function run(args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((ok) => {
    const p = spawn(process.execPath, ['--import', 'tsx', cli, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
    p.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
    p.on('exit', (status) => ok({ status, stdout, stderr }));
  });
}

interface Summary {
  records: number;
  created: number;
  updated: number;
  unchanged: number;
  failedCount: number;
  failed: { line: number; id: string | null; error: string; message: string }[];
  batches: number;
}

void test('ctl tenants import: JSON lines and CSV in batches, bad lines reported and skipped, a re-run changes nothing', async () => {
  const c = await CoordinatorCluster.create(['n1', 'n2', 'n3']);
  try {
    c.startAll();
    await c.waitForLeader();
    assert.equal((await c.write('PUT', '/v1/tiers/gold', { rate: 100, burst: 200 })).status, 200);
    assert.equal((await c.write('PUT', '/v1/tenants/kept', { tier: 'gold', rate: 7 })).status, 200);
    const admin = [...c.replicas.keys()].map((id) => c.adminUrl(id)).join(',');

    // 1,000 good tenants, and in between: bad JSON, an unknown tier, a bad rate, a repeated id, an array.
    const lines: string[] = [];
    for (let i = 0; i < 1000; i++)
      lines.push(
        JSON.stringify(
          i % 10 === 0 ? { id: `t-${i}`, tier: 'gold', rate: 50, burst: 60 } : { id: `t-${i}`, tier: 'gold' },
        ),
      );
    lines.splice(10, 0, '{"id": "broken", '); // line 11
    lines.splice(20, 0, '{"id":"orphan","tier":"nope"}'); // line 21
    lines.splice(30, 0, '{"id":"neg","tier":"gold","rate":-1}'); // line 31
    lines.splice(40, 0, '{"id":"t-1","tier":"gold"}'); // line 41: t-1 is on line 2
    lines.splice(50, 0, '', '["t-x","gold"]'); // line 51 blank (skipped), line 52 not an object
    lines.push('{"id":"kept","tier":"gold","rate":8}'); // an existing tenant, replaced
    const jsonl = join(c.root, 'tenants.jsonl');
    writeFileSync(jsonl, lines.join('\n') + '\n');

    const first = await run([
      'ctl',
      '--admin',
      admin,
      '--json',
      'tenants',
      'import',
      jsonl,
      '--batch',
      '300',
      '--parallel',
      '3',
    ]);
    assert.equal(first.status, 1, `exit 1 when lines failed: ${first.stderr}`);
    const s1 = JSON.parse(first.stdout) as Summary;
    assert.equal(s1.records, 1006);
    assert.deepEqual([s1.created, s1.updated, s1.unchanged, s1.failedCount], [1000, 1, 0, 5]);
    assert.deepEqual(
      s1.failed.map((f) => [f.line, f.error]),
      [
        [11, 'INVALID'],
        [21, 'NOT_FOUND'],
        [31, 'INVALID'],
        [41, 'DUPLICATE'],
        [52, 'INVALID'],
      ],
    );
    assert.match(s1.failed[1]?.message ?? '', /tier nope does not exist/);
    assert.match(s1.failed[2]?.message ?? '', /rate/);
    assert.match(s1.failed[3]?.message ?? '', /line 2/);
    assert.equal(s1.batches, 4, '1,001 tenants sent in batches of 300');
    assert.match(first.stderr, /import: [\d,]+ of [\d,]+ records done/, 'progress on stderr');

    // What applied is what the file says; the failed lines changed nothing.
    const leader = await c.waitForLeader();
    const t0 = await c.http(leader, 'GET', '/v1/tenants/t-0');
    assert.deepEqual([t0.status, t0.body['tier'], t0.body['rate'], t0.body['burst']], [200, 'gold', 50, 60]);
    assert.equal((await c.http(leader, 'GET', '/v1/tenants/t-999')).status, 200);
    assert.equal((await c.http(leader, 'GET', '/v1/tenants/orphan')).status, 404);
    assert.equal((await c.http(leader, 'GET', '/v1/tenants/neg')).status, 404);
    assert.equal((await c.http(leader, 'GET', '/v1/tenants/kept')).body['rate'], 8);
    const tier = await c.http(leader, 'GET', '/v1/tiers/gold');
    assert.equal(tier.body['tenantCount'], 1001);
    const before = (await c.http(leader, 'GET', '/v1/tenants/t-5')).body['updatedIndex'];

    // Re-run: everything already stored comes back unchanged and is not touched; a follower replica has it all too.
    const again = await run(['ctl', '--admin', admin, '--json', 'tenants', 'import', jsonl]);
    const s2 = JSON.parse(again.stdout) as Summary;
    assert.deepEqual([s2.created, s2.updated, s2.unchanged, s2.failedCount], [0, 0, 1001, 5]);
    assert.equal(
      (await c.http(leader, 'GET', '/v1/tenants/t-5')).body['updatedIndex'],
      before,
      'an unchanged tenant keeps its index',
    );
    const follower = [...c.replicas.keys()].find((id) => id !== leader) ?? '';
    const onFollower = await c.http(follower, 'GET', '/v1/tiers/gold');
    assert.equal(onFollower.body['tenantCount'], 1001);

    // CSV: a header, quoted fields, empty override cells; a short row and a non-number are reported.
    const csv = join(c.root, 'tenants.csv');
    writeFileSync(
      csv,
      [
        'id,tier,rate,burst',
        'c-1,gold,,',
        '"c-2","gold","30","40"',
        'c-3,gold',
        'c-4,gold,fast,',
        't-0,gold,,',
        '',
      ].join('\r\n'),
    );
    const fromCsv = await run(['ctl', '--admin', admin, '--json', 'tenants', 'import', csv]);
    const s3 = JSON.parse(fromCsv.stdout) as Summary;
    assert.deepEqual([s3.created, s3.updated, s3.unchanged, s3.failedCount], [2, 1, 0, 2], fromCsv.stdout);
    assert.deepEqual(
      s3.failed.map((f) => [f.line, f.error]),
      [
        [4, 'INVALID'],
        [5, 'INVALID'],
      ],
    );
    const c2 = await c.http(leader, 'GET', '/v1/tenants/c-2');
    assert.deepEqual([c2.body['rate'], c2.body['burst']], [30, 40]);
    const t0b = await c.http(leader, 'GET', '/v1/tenants/t-0');
    assert.deepEqual([t0b.body['rate'], t0b.body['burst']], [null, null], "empty cells: the tier's quota");

    // Human output: the summary and the failed lines.
    const human = await run(['ctl', '--admin', admin, 'tenants', 'import', csv]);
    assert.match(human.stdout, /imported 5 records from .* 0 created, 0 updated, 3 unchanged, 2 failed/);
    assert.match(human.stdout, /line 5 \(c-4\): INVALID rate/);
    const header = join(c.root, 'bad-header.csv');
    writeFileSync(header, 'name,tier\nx,gold\n');
    const badHeader = await run(['ctl', '--admin', admin, 'tenants', 'import', header]);
    assert.equal(badHeader.status, 2);
    assert.match(badHeader.stderr, /CSV header must name the columns id, tier, rate, burst/);
    const unknownFormat = await run(['ctl', '--admin', admin, 'tenants', 'import', join(c.root, 'tenants.txt')]);
    assert.equal(unknownFormat.status, 2);
    assert.match(unknownFormat.stderr, /--format jsonl\|csv/);
  } finally {
    await c.cleanup();
  }
});

void test('POST /v1/tenants: a bounded batch, each tenant checked on its own, clear errors', async () => {
  const c = await CoordinatorCluster.create(['n1', 'n2', 'n3']);
  try {
    c.startAll();
    const leader = await c.waitForLeader();
    assert.equal((await c.write('PUT', '/v1/tiers/gold', { rate: 100, burst: 200 })).status, 200);
    const mixed = await c.write('POST', '/v1/tenants', {
      tenants: [
        { id: 'a', tier: 'gold' },
        { id: 'b c', tier: 'gold' },
        'x',
        { id: 'd', tier: 'gold', extra: 1 },
        { id: 'e', tier: 'gold', burst: 5 },
      ],
    });
    assert.equal(mixed.status, 200, JSON.stringify(mixed.body));
    assert.equal(mixed.body['created'], 2);
    const failed = mixed.body['failed'] as { index: number; id: string | null; error: string }[];
    assert.deepEqual(
      failed.map((f) => [f.index, f.id, f.error]),
      [
        [1, 'b c', 'INVALID'],
        [2, null, 'INVALID'],
        [3, 'd', 'INVALID'],
      ],
    );

    const empty = await c.write('POST', '/v1/tenants', { tenants: [] });
    assert.equal(empty.status, 400);
    assert.equal(empty.body['error'], 'INVALID');
    const tooMany = await c.write('POST', '/v1/tenants', {
      tenants: Array.from({ length: 5001 }, (_, i) => ({ id: `x${i}`, tier: 'gold' })),
    });
    assert.equal(tooMany.status, 400);
    assert.match(JSON.stringify(tooMany.body['details']), /5000/);
    // A body over the batch limit is refused from its Content-Length, before it is read; the server then closes the
    // connection, so a client still writing the body may see EPIPE instead of the answer (fetch does, at random): the
    // request here sends the headers and a first part of the body, and reads the answer.
    const huge = await declaredBodyRequest(c.adminUrl(leader), '/v1/tenants', 3 * 1024 * 1024, c.adminAuth());
    assert.equal(huge.status, 413, huge.text);
    assert.equal((JSON.parse(huge.text) as Record<string, unknown>)['error'], 'PAYLOAD_TOO_LARGE');
    assert.equal((await c.http(leader, 'GET', '/v1/tenants/x0')).status, 404, 'refused batches change nothing');

    // A follower points writes at the leader.
    const follower = [...c.replicas.keys()].find((id) => id !== leader) ?? '';
    const redirected = await c.http(follower, 'POST', '/v1/tenants', { tenants: [{ id: 'f', tier: 'gold' }] });
    assert.equal(redirected.status, 307);
  } finally {
    await c.cleanup();
  }
});
