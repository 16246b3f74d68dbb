// Bulk tenants (issue 20): `cellquota ctl tenants import FILE` against a three-replica cluster on
// loopback, side by side in the same run with what it replaces — one `PUT /v1/tenants/:id` per
// tenant from 64 concurrent keep-alive clients (what test/ui/ui-load-measure.ts did before). Then
// the same import again (every tenant comes back unchanged: the re-run is idempotent and cheap).
// The target (docs/targets.md): ≥ 20,000 tenants/s.
import os from 'node:os';
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { CoordinatorCluster } from '../testkit/coordinator-cluster.js';
import type { BenchReport } from './bench-report.js';

const TARGET_PER_SECOND = 20_000;
const PUT_CLIENTS = 64;
const cliPath = resolve(import.meta.dirname, '../cli/main.ts');

export interface TenantImportBenchOptions {
  readonly smoke: boolean;
  readonly progress: (msg: string) => void;
  /** Tenants imported from the file (default 200,000; smoke 5,000). */
  readonly tenants?: number;
  /** Tenants written one PUT each for the baseline (default 20,000; smoke 1,000). */
  readonly putTenants?: number;
}

interface ImportRun {
  readonly records: number;
  readonly created: number;
  readonly updated: number;
  readonly unchanged: number;
  readonly failedCount: number;
  readonly batches: number;
  readonly seconds: number;
  readonly perSecond: number;
  /** Including the command's own start (node + tsx). */
  readonly wallSeconds: number;
}

function runImport(adminUrls: string, file: string): Promise<ImportRun> {
  const t0 = performance.now();
  return new Promise((ok, fail) => {
    const p = spawn(
      process.execPath,
      ['--import', 'tsx', cliPath, 'ctl', '--admin', adminUrls, '--json', 'tenants', 'import', file],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    let err = '';
    p.stdout.on('data', (b: Buffer) => (out += b.toString()));
    p.stderr.on('data', (b: Buffer) => (err += b.toString()));
    p.on('exit', (code) => {
      if (code !== 0) return fail(new Error(`tenants import exited ${String(code)}: ${err.slice(-1000)}`));
      try {
        ok({ ...(JSON.parse(out) as Omit<ImportRun, 'wallSeconds'>), wallSeconds: (performance.now() - t0) / 1000 });
      } catch (e) {
        fail(new Error(`tenants import printed no summary: ${out.slice(0, 500)}`, { cause: e }));
      }
    });
  });
}

async function putEach(adminUrl: string, count: number, prefix: string): Promise<{ seconds: number; errors: number }> {
  let next = 0;
  let errors = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: PUT_CLIENTS }, async () => {
      while (next < count) {
        const i = next++;
        const r = await fetch(`${adminUrl}/v1/tenants/${prefix}-${i}`, {
          method: 'PUT',
          headers: { 'content-type': 'application/json' },
          body: '{"tier":"bench"}',
        });
        await r.arrayBuffer();
        if (r.status !== 200) errors++;
      }
    }),
  );
  return { seconds: (performance.now() - t0) / 1000, errors };
}

export async function runTenantImportBench(opts: TenantImportBenchOptions): Promise<BenchReport> {
  const { smoke, progress } = opts;
  const tenants = opts.tenants ?? (smoke ? 5_000 : 200_000);
  const putTenants = opts.putTenants ?? (smoke ? 1_000 : 20_000);
  const loadBefore = os.loadavg()[0] ?? 0;
  progress('starting 3 cellquota coordinators');
  const c = await CoordinatorCluster.create(['n1', 'n2', 'n3']);
  try {
    c.startAll();
    await c.waitForLeader(60_000);
    const tier = await c.write('PUT', '/v1/tiers/bench', { rate: 100, burst: 200 });
    if (tier.status !== 200) throw new Error(`PUT /v1/tiers/bench: ${tier.status} ${JSON.stringify(tier.body)}`);
    const leader = await c.waitForLeader();
    const adminUrls = [...c.replicas.keys()].map((id) => c.adminUrl(id)).join(',');
    const file = join(c.root, 'tenants.jsonl');
    writeFileSync(
      file,
      Array.from({ length: tenants }, (_, i) => `{"id":"import-${i}","tier":"bench"}`).join('\n') + '\n',
    );

    progress(`baseline: ${putTenants.toLocaleString('en-US')} tenants, one PUT each, ${PUT_CLIENTS} clients`);
    const put = await putEach(c.adminUrl(leader), putTenants, 'put');
    const putRate = putTenants / put.seconds;
    progress(`  ${Math.round(putRate)} tenants/s`);
    progress(`ctl tenants import: ${tenants.toLocaleString('en-US')} tenants`);
    const first = await runImport(adminUrls, file);
    progress(`  ${first.perSecond} tenants/s (${first.created} created, ${first.failedCount} failed)`);
    progress('ctl tenants import again (every tenant unchanged)');
    const again = await runImport(adminUrls, file);
    progress(`  ${again.perSecond} tenants/s (${again.unchanged} unchanged)`);

    const row = (
      measurement: string,
      n: number,
      seconds: number,
      wall: number | '',
      errors: number,
      outcome: string,
    ): Record<string, number | string> => ({
      measurement,
      tenants: n,
      s: Math.round(seconds * 100) / 100,
      'tenants/s': Math.round(n / seconds),
      "wall s (with the command's start)": wall === '' ? '' : Math.round(wall * 100) / 100,
      '÷ one PUT each': (n / seconds / putRate).toFixed(2),
      failed: errors,
      outcome,
    });
    const rows = [
      row(
        `one PUT /v1/tenants/:id per tenant, ${PUT_CLIENTS} clients (baseline)`,
        putTenants,
        put.seconds,
        '',
        put.errors,
        `${putTenants - put.errors} written`,
      ),
      row(
        'ctl tenants import (JSON lines, batches of 2,000, 4 in flight)',
        first.records,
        first.seconds,
        first.wallSeconds,
        first.failedCount,
        `${first.created} created, ${first.updated} updated, ${first.unchanged} unchanged in ${first.batches} entries`,
      ),
      row(
        'ctl tenants import, the same file again',
        again.records,
        again.seconds,
        again.wallSeconds,
        again.failedCount,
        `${again.created} created, ${again.updated} updated, ${again.unchanged} unchanged`,
      ),
    ];
    const met = first.perSecond >= TARGET_PER_SECOND;
    return {
      name: 'tenant-import',
      title: `Bulk tenants: ctl tenants import vs one PUT per tenant, 3 coordinators on loopback${smoke ? ' (smoke)' : ''}`,
      rows,
      notes: [
        `3 coordinator processes (node + tsx) on loopback, LevelDB with fsync; the import is \`cellquota ctl tenants import\` run as a process (tenants/s from its own clock; the wall time adds the process start), to the admin URLs of all three (a follower answers 307 to the leader); the baseline writes to the leader directly with Node's fetch (keep-alive), ${PUT_CLIENTS} requests in flight.`,
        `Target "tenants imported at ≥ ${TARGET_PER_SECOND.toLocaleString('en-US')}/s": ${first.perSecond.toLocaleString('en-US')}/s — ${met ? 'met' : 'NOT met'}${smoke ? ' (smoke size: indicative)' : ''}.`,
        `Machine load (1-min load average, ${os.cpus().length} CPUs): ${loadBefore.toFixed(2)} before, ${(os.loadavg()[0] ?? 0).toFixed(2)} after.`,
      ],
    };
  } finally {
    await c.cleanup();
    progress('stopped cellquota ×3');
  }
}
