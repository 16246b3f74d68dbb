// The `tenant-import` benchmark as its smoke variant: ctl tenants import and the one-PUT-per-tenant
// baseline both run end to end against real coordinators, every tenant is accounted for, the re-run
// changes nothing, and the target is evaluated in the notes. No figure is compared with a threshold.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runTenantImportBench } from '../../bench/tenant-import.js';

void test('npm run bench -- tenant-import --smoke: import, re-import and the PUT baseline side by side', async () => {
  const messages: string[] = [];
  const r = await runTenantImportBench({
    smoke: true,
    tenants: 3_000,
    putTenants: 300,
    progress: (m) => messages.push(m),
  });
  assert.equal(r.name, 'tenant-import');
  assert.equal(r.rows.length, 3);
  for (const row of r.rows) {
    for (const col of ['tenants', 's', 'tenants/s'])
      assert.equal(typeof row[col] === 'number' && Number.isFinite(row[col]), true, `${col} in ${JSON.stringify(row)}`);
    assert.equal(row['failed'], 0, JSON.stringify(row));
    assert.match(String(row['÷ one PUT each']), /^\d+\.\d\d$/);
  }
  assert.match(String(r.rows[1]?.['outcome']), /^3000 created, 0 updated, 0 unchanged in 2 entries$/);
  assert.match(String(r.rows[2]?.['outcome']), /^0 created, 0 updated, 3000 unchanged$/);
  assert.match(r.notes.find((n) => n.startsWith('Target')) ?? '', / — (met|NOT met)/);
  assert.equal(messages.includes('stopped cellquota ×3'), true);
});
