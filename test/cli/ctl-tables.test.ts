// `cellquota ctl` tables as an operator reads them, against a real coordinator and a real agent:
// spaced column headers, times as ages from now, a tenant's effective quota (its tier's or its
// override, and which); --json prints the admin API's documents unchanged.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { CoordinatorCluster } from '../../testkit/coordinator-cluster.js';
import { freePort } from '../../testkit/ports.js';
import { waitFor } from '../../testkit/wait.js';

const cli = resolve(import.meta.dirname, '../../cli/main.ts');

function ctl(admin: string, ...args: string[]): string {
  const r = spawnSync(process.execPath, ['--import', 'tsx', cli, 'ctl', '--admin', admin, ...args], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  assert.equal(r.status, 0, `ctl ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

/** A table's header and rows: columns are two or more spaces apart, values never hold two spaces. */
function parseTable(text: string): { headers: string[]; rows: Record<string, string>[] } {
  const [head = [], ...lines] = text
    .trimEnd()
    .split('\n')
    .map((l) => l.trim().split(/ {2,}/));
  for (const l of lines) assert.equal(l.length, head.length, `a value in each column: ${l.join(' | ')}`);
  return { headers: head, rows: lines.map((l) => Object.fromEntries(head.map((h, i) => [h, l[i] ?? '']))) };
}

/** "3 s ago" → -3000, "in 2.1 s" → 2100, "850 ms ago" → -850, "now" (within 50 ms) → 0. */
function ageMs(text: string): number {
  if (text === 'now') return 0;
  const m = /^(in )?([\d.]+) (ms|s|min|h|d)( ago)?$/.exec(text);
  assert.ok(m !== null && (m[1] === undefined) !== (m[4] === undefined), `'${text}' is an age`);
  const unit = { ms: 1, s: 1000, min: 60_000, h: 3_600_000, d: 86_400_000 }[m[3] as 'ms'];
  return Number(m[2]) * unit * (m[1] === undefined ? -1 : 1);
}

void test(
  'ctl tables: spaced headers, ages, effective quotas; --json is the API document',
  { timeout: 180_000 },
  async () => {
    const c = await CoordinatorCluster.create(['n1']);
    let agent: ChildProcess | undefined;
    try {
      c.startAll();
      await c.waitForLeader(60_000);
      const admin = c.adminUrl('n1');
      ctl(admin, 'tiers', 'put', 'gold', '--rate', '100', '--burst', '200', '--floor-fraction', '0.5');
      ctl(admin, 'tenants', 'put', 'acme', '--tier', 'gold');
      ctl(admin, 'tenants', 'put', 'beta', '--tier', 'gold', '--rate', '300', '--burst', '600');
      ctl(admin, 'tenants', 'put', 'gamma', '--tier', 'gold', '--rate', '50');

      const tiers = parseTable(ctl(admin, 'tiers', 'list'));
      assert.deepEqual(tiers.headers, ['NAME', 'RATE /S', 'BURST', 'FLOOR FRACTION', 'TENANTS']);
      assert.deepEqual(tiers.rows, [
        { NAME: 'gold', 'RATE /S': '100', BURST: '200', 'FLOOR FRACTION': '0.5', TENANTS: '3' },
      ]);

      const tenants = parseTable(ctl(admin, 'tenants', 'list'));
      assert.deepEqual(tenants.headers, ['ID', 'TIER', 'RATE /S', 'BURST', 'QUOTA FROM']);
      assert.deepEqual(tenants.rows, [
        { ID: 'acme', TIER: 'gold', 'RATE /S': '100', BURST: '200', 'QUOTA FROM': 'tier' },
        { ID: 'beta', TIER: 'gold', 'RATE /S': '300', BURST: '600', 'QUOTA FROM': 'override' },
        { ID: 'gamma', TIER: 'gold', 'RATE /S': '50', BURST: '200', 'QUOTA FROM': 'rate override' },
      ]);
      // --json: the API's document as it is (overrides null where the tier's apply).
      assert.deepEqual(
        JSON.parse(ctl(admin, '--json', 'tenants', 'list')),
        (await c.http('n1', 'GET', '/v1/tenants')).body,
      );

      // A real cell: an agent leasing from the coordinator, asked about acme so it holds a slice.
      const root = c.root;
      writeFileSync(join(root, 'rules.yaml'), 'domain: api\ndescriptors:\n  - key: tenant\n    global: true\n');
      const port = await freePort();
      agent = spawn(
        process.execPath,
        [
          '--import',
          'tsx',
          cli,
          'agent',
          '--cell',
          'eu-west',
          '--rules',
          join(root, 'rules.yaml'),
          '--http',
          `127.0.0.1:${port}`,
          '--workers',
          '0',
          '--coordinators',
          `127.0.0.1:${c.replica('n1').peerPort}`,
        ],
        { stdio: 'ignore' },
      );
      await waitFor(
        'a leased slice of acme',
        async () => {
          await fetch(`http://127.0.0.1:${port}/v1/check`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ domain: 'api', descriptors: [{ entries: [{ key: 'tenant', value: 'acme' }] }] }),
            signal: AbortSignal.timeout(2000),
          }).then(
            (r) => r.arrayBuffer(),
            () => undefined,
          );
          const t = await c.http('n1', 'GET', '/v1/tenants/acme');
          const slices = t.body['slices'] as { epoch: number; leaseExpiresAtMs: number | null }[] | undefined;
          return slices?.some((s) => s.epoch > 0 && s.leaseExpiresAtMs !== null) === true ? true : undefined;
        },
        { timeoutMs: 60_000, everyMs: 100 },
      );

      const cellsJson = JSON.parse(ctl(admin, '--json', 'cells')) as {
        cells: { id: string; lastReportAt: string; leaseExpiresAt: string }[];
      };
      const before = Date.now();
      const cells = parseTable(ctl(admin, 'cells'));
      const after = Date.now();
      assert.deepEqual(cells.headers, ['ID', 'FLOOR SLOT', 'LAST REPORT', 'LEASE EXPIRES', 'LEASE LIVE', 'REMOVING']);
      const row = cells.rows[0];
      assert.ok(row !== undefined && cells.rows.length === 1);
      assert.equal(row['ID'], 'eu-west');
      assert.equal(row['LEASE LIVE'], 'yes');
      assert.equal(row['REMOVING'], 'no');
      const lastReport = ageMs(row['LAST REPORT'] ?? '');
      assert.ok(lastReport <= 0, `the last report is in the past: ${row['LAST REPORT']}`);
      assert.ok(ageMs(row['LEASE EXPIRES'] ?? '') > 0, `the live lease ends in the future: ${row['LEASE EXPIRES']}`);
      // The age is the report's time from now: within the reports since the JSON was read (a report a
      // round, a lease lasting 3 s) and the time the command took.
      const reported = Date.parse(cellsJson.cells[0]?.lastReportAt ?? '');
      assert.ok(
        before + lastReport >= reported - 1000 && after + lastReport <= reported + 5000,
        `${row['LAST REPORT']} vs ${cellsJson.cells[0]?.lastReportAt}`,
      );

      const detail = ctl(admin, 'tenants', 'get', 'acme');
      assert.match(detail, /^tenant acme {2}tier gold {2}quota 100\/s burst 200 \(the tier's\)$/m);
      const slices = parseTable(detail.slice(detail.indexOf('\n\n') + 2));
      assert.deepEqual(slices.headers, [
        'CELL',
        'RATE /S',
        'BURST',
        'FLOOR RATE /S',
        'EPOCH',
        'LEASE EXPIRES',
        'ACKNOWLEDGED',
      ]);
      assert.equal(slices.rows[0]?.['CELL'], 'eu-west');
      ageMs(slices.rows[0]?.['LEASE EXPIRES'] ?? '');
      assert.match(ctl(admin, 'tenants', 'get', 'beta'), /quota 300\/s burst 600 \(override\)/);
    } finally {
      agent?.kill('SIGKILL');
      await c.cleanup();
    }
  },
);
