// `npm run bench -- frontdoor` on the smallest scale: every target started, driven and answered
// without errors, the report's figures finite. Structure only: no throughput is asserted here.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runFrontDoorBenchDetailed } from '../../bench/frontdoor/frontdoor.js';

void test(
  'frontdoor: upstream, nginx (alone, limit_req, forward-auth over TCP and a Unix socket), bare proxy, gateway',
  { timeout: 120_000 },
  async () => {
    const r = await runFrontDoorBenchDetailed({ smoke: true, seconds: 0.5, connections: 4, progress: () => undefined });
    const expected = [
      'upstream direct',
      ...(r.skipped.length > 0
        ? []
        : [
            'nginx alone',
            'nginx limit_req',
            'nginx + forward-auth (agent)',
            'nginx + forward-auth (agent, unix socket)',
          ]),
      'bare proxy (@fastify/http-proxy)',
      'cellquota gateway',
    ];
    assert.deepEqual(
      r.rows.map((x) => x.target),
      expected,
    );
    for (const row of r.rows) {
      assert.ok(Number.isFinite(row.reqPerSec) && row.reqPerSec > 0, `${row.target}: req/s ${row.reqPerSec}`);
      assert.ok(Number.isFinite(row.p50Ms) && Number.isFinite(row.p99Ms), `${row.target}: latencies`);
      // a reset racing the end of a 0.5 s run may cost one request; more than 1% is a broken target
      assert.ok(
        row.errors <= Math.max(1, 0.01 * row.reqPerSec * 0.5),
        `${row.target}: ${row.errors} errors at ${row.reqPerSec} req/s`,
      );
      assert.equal(row.non2xx, 0, `${row.target}: every request allowed and answered 200`);
    }
    assert.match(
      r.report.notes.join('\n'),
      /forward-auth \/ nginx limit_req = (\d+\.\d+|n\/a).*gateway \/ bare proxy = \d+\.\d+/,
    );
  },
);
