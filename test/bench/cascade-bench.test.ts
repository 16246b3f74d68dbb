// The `cascade` benchmark (bench/cascade.ts) run as its smoke variant: a row per system and step,
// the step's figures present and finite wherever it ran, every request accounted for, and the
// verdict lines computed. No wall-clock figure is asserted (docs/targets.md: targets are for benchmarks).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { STEP_NAMES, SYSTEMS, runCascadeBenchDetailed } from '../../bench/cascade.js';
import { findRedisServer } from '../../testkit/processes/redis-server.js';

const NUMERIC = [
  'requests',
  'p50 ms',
  'p99 ms',
  'p99.9 ms',
  'max ms',
  'errors %',
  'over 20 ms %',
  'refused %',
  'admitted %',
  'degraded %',
  'allowed/s per tenant',
];
const LATENCY = new Set(['p50 ms', 'p99 ms', 'p99.9 ms', 'max ms']);

void describe('npm run bench -- cascade --smoke', () => {
  void it(
    'reports every step for both systems, with finite figures where a step ran',
    { timeout: 180_000 },
    async () => {
      const messages: string[] = [];
      const { report, results, skipped } = await runCascadeBenchDetailed({
        smoke: true,
        progress: (m) => messages.push(m),
      });

      assert.equal(report.name, 'cascade');
      assert.equal(typeof report.title, 'string');
      assert.equal(
        report.notes.every((n) => typeof n === 'string'),
        true,
        'notes are strings',
      );
      assert.equal(report.notes.length > 0, true, 'there are notes');

      // One row per (system, step), in order.
      const expected = SYSTEMS.flatMap((s) =>
        STEP_NAMES.map((step) => [s === 'redis' ? 'rlf-redis' : 'cellquota', step]),
      );
      assert.deepEqual(
        report.rows.map((r) => [r['system'], r['step']]),
        expected,
      );
      assert.deepEqual(
        results.map((r) => [r.system, r.step]),
        SYSTEMS.flatMap((s) => STEP_NAMES.map((step) => [s, step])),
      );

      // The Redis side runs when redis-server is installed; cellquota always does.
      const redisInstalled = findRedisServer() !== null;
      assert.deepEqual(
        skipped.map((s) => s.system),
        redisInstalled ? [] : ['redis'],
        JSON.stringify(skipped),
      );

      for (const [i, r] of results.entries()) {
        const row = report.rows[i];
        assert.notEqual(row, undefined, `row ${i}`);
        if (row === undefined) continue;
        const label = `${r.system} · ${r.step}`;
        const shouldRun = r.system === 'cellquota' || redisInstalled;
        assert.equal(r.measure !== null, shouldRun, `${label} ran: ${r.note}`);
        const m = r.measure;
        if (m === null) {
          assert.equal(typeof row['lease / notes'], 'string');
          continue;
        }
        // Every request scheduled in the window has exactly one outcome.
        assert.equal(m.sent > 0, true, `${label}: requests were sent`);
        assert.equal(
          m.allowedInTime + m.refusedInTime + m.errors + m.late + m.unanswered,
          m.sent,
          `${label}: outcomes add up`,
        );
        assert.equal(m.allowed + m.refused, m.allowedInTime + m.refusedInTime + m.late, `${label}: decisions add up`);
        assert.equal(
          m.allowedByTenant.reduce((a, b) => a + b, 0),
          m.allowed,
          `${label}: per-tenant counts add up`,
        );
        for (const col of NUMERIC) {
          const v: number | string | undefined = row[col];
          // A step without a single answer (a stopped store) has no latency to report.
          if (LATENCY.has(col) && m.latency === null) {
            assert.equal(v, '—', `${label}: ${col}`);
            continue;
          }
          assert.equal(typeof v, 'number', `${label}: ${col} is a number (${String(v)})`);
          assert.equal(Number.isFinite(v), true, `${label}: ${col} is finite (${String(v)})`);
        }
        if (m.latency !== null) {
          const l = m.latency;
          assert.equal(
            l.p50 <= l.p99 && l.p99 <= l.p999 && l.p999 <= l.max,
            true,
            `${label}: percentiles ordered ${JSON.stringify(l)}`,
          );
        }
        if (r.system === 'cellquota') assert.equal(r.leaseStates.length > 0, true, `${label}: lease state sampled`);
      }
      // cellquota's baseline answers (the agent serves from memory).
      const cqBase = results.find((r) => r.system === 'cellquota' && r.step === 'baseline')?.measure;
      assert.equal(
        cqBase !== null && cqBase !== undefined && cqBase.latency !== null,
        true,
        'cellquota baseline answered',
      );

      // A verdict line per system, computed from the figures.
      for (const s of ['cellquota', ...(redisInstalled ? ['rlf-redis'] : [])]) {
        assert.equal(
          report.notes.some((n) => n.startsWith(`${s}: meets the fault target`)),
          true,
          `verdict for ${s}`,
        );
      }
      assert.equal(
        messages.some((m) => m.includes('cellquota: stopping its processes')),
        true,
        'cellquota stopped',
      );
    },
  );
});
