// The embedded benchmark's smoke run: every app variant starts in its own process and serves
// autocannon's load (the Redis ones only where redis-server is installed), the paused conditions
// run, and the in-process decision is timed. Figures are reported, not judged (docs/targets.md:
// targets are judged by the full run, side by side).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runEmbeddedBench } from '../../bench/embedded/embedded.js';
import { findRedisServer } from '../../testkit/processes/redis-server.js';

void test(
  'embedded bench smoke: fastify and express with no limiter, the libraries, cellquota local and coordinated',
  { timeout: 300_000 },
  async () => {
    const r = await runEmbeddedBench({ smoke: true, progress: () => undefined });
    assert.equal(r.name, 'embedded');
    const served = r.rows.filter((row) => row['framework'] !== 'in-process');
    const expected = findRedisServer() === null ? 10 : 14;
    assert.equal(
      served.length,
      expected,
      `one row per framework × variant × condition: ${served.map((x) => `${x['framework']} ${x['variant']} ${x['condition']}`).join('; ')}`,
    );
    for (const row of served) {
      // With Redis paused a library may answer nothing at all in the run: then no latency is given.
      const noAnswer = row['condition'] === 'Redis paused' && row['req/s'] === 0;
      for (const col of ['req/s', 'p50 ms', 'p99 ms'])
        assert.ok(
          (typeof row[col] === 'number' && Number.isFinite(row[col])) || (noAnswer && col !== 'req/s'),
          `${col} in ${JSON.stringify(row)}`,
        );
      // With Redis paused the libraries may serve nothing at all (that is the measurement); cellquota
      // must keep serving with its coordinators paused.
      if (row['condition'] !== 'Redis paused')
        assert.ok((row['req/s'] as number) > 0, `served requests: ${JSON.stringify(row)}`);
      if (row['condition'] === 'normal')
        assert.equal(
          row['non2xx'],
          0,
          `nothing refused or failed under limits far above the load: ${JSON.stringify(row)}`,
        );
    }
    const decision = r.rows.filter((row) => row['framework'] === 'in-process');
    assert.equal(decision.length, 4); // 1 and 2 levels, over 256 and 10,000 addresses
    for (const row of decision)
      assert.ok(Number.isFinite(row['ns/check median']) && (row['ns/check median'] as number) > 0);
    assert.ok(r.notes.some((n) => /cellquota local ÷ @fastify\/rate-limit in memory = .*target ≥ 0.95: /.test(n)));
    // Where Redis runs, each framework's coordinated target is given beside its ceiling (no limiter ÷ the library on Redis).
    if (findRedisServer() !== null)
      for (const lib of ['@fastify\\/rate-limit', 'express-rate-limit'])
        assert.ok(
          r.notes.some((n) => new RegExp(`the ceiling of that target, no limiter ÷ ${lib} on Redis = \\d`).test(n)),
          `the ${lib} ceiling note`,
        );
  },
);
