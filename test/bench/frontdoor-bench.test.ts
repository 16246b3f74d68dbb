// `npm run bench -- frontdoor` on the smallest scale: every target started, driven and answered
// without errors, the report's figures finite. Structure only: no throughput is asserted here.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { T, runFrontDoorBenchDetailed } from '../../bench/frontdoor/frontdoor.js';

void test(
  'frontdoor: upstream, nginx (alone, limit_req, forward-auth over TCP and a Unix socket, the ceilings), ' +
    'bare proxy, gateway, in interleaved rounds',
  { timeout: 120_000 },
  async () => {
    const r = await runFrontDoorBenchDetailed({
      smoke: true,
      seconds: 0.5,
      connections: 4,
      rounds: 2,
      progress: () => undefined,
    });
    const expected = [
      T.upstream,
      ...(r.skipped.length > 0 ? [] : [T.nginx, T.limitReq, T.forwardAuth, T.forwardAuthUnix, T.ceiling, T.emptyNode]),
      T.bare,
      T.gateway,
    ];
    assert.deepEqual(
      r.rows.map((x) => x.target),
      expected,
    );
    for (const row of r.rows) {
      assert.equal(row.rounds.length, 2, `${row.target}: one run per round`);
      assert.ok(Number.isFinite(row.reqPerSec) && row.reqPerSec > 0, `${row.target}: req/s ${row.reqPerSec}`);
      assert.ok(Number.isFinite(row.p50Ms) && Number.isFinite(row.p99Ms), `${row.target}: latencies`);
      // a reset racing the end of a 0.5 s run may cost one request; more than 1% is a broken target
      assert.ok(
        row.errors <= Math.max(2, 0.01 * row.reqPerSec * 0.5 * 2),
        `${row.target}: ${row.errors} errors at ${row.reqPerSec} req/s`,
      );
      assert.equal(row.non2xx, 0, `${row.target}: every request allowed and answered 200`);
    }
    const gateway = r.ratios.find((x) => x.name === 'gateway / bare proxy');
    assert.ok(gateway !== undefined && gateway.min > 0 && gateway.min <= gateway.median, 'gateway ratio per round');
    assert.ok(gateway.median <= gateway.max && Number.isFinite(gateway.max));
    assert.match(r.report.notes.join('\n'), /gateway \/ bare proxy = \d+\.\d+ \(per round \d+\.\d+–\d+\.\d+\)/);
  },
);
