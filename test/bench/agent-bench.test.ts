// The `agent` benchmark's harness, run as its smoke variant against the ceiling server only: the
// report has the shape bench/run.ts prints and writes, and the load generator accounts for every
// request it sent. No wall-clock figure is asserted (docs/targets.md: targets are for benchmarks).
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import * as protoLoader from '@grpc/proto-loader';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { runAgentBenchDetailed } from '../../bench/agent-rls.js';
import { runJob } from '../../bench/load/loadgen.js';
import type { LoadJob } from '../../bench/load/loadgen-protocol.js';
import { rawRlsService, startRlsServer, stopRlsServer } from '../../bench/servers/rls-grpc.js';
import {
  CODE_OK,
  CODE_OVER_LIMIT,
  DEGRADED_FLAG,
  DEGRADED_HEADER,
  decodeOverallCode,
  decodeResponse,
  encodeRateLimitRequest,
  grpcFrame,
  tenantFrames,
} from '../../testkit/load/rls-wire.js';
import { isLimitedTenant, rulesYaml } from '../../bench/servers/bench-rules.js';

const PROTO_ROOT = fileURLToPath(new URL('../../proto/', import.meta.url));

function rlsMethod(): protoLoader.MethodDefinition<object, object> {
  const pkg = protoLoader.loadSync('envoy/service/ratelimit/v3/rls.proto', {
    includeDirs: [PROTO_ROOT],
    keepCase: false,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const svc = pkg['envoy.service.ratelimit.v3.RateLimitService'] as
    Record<string, protoLoader.MethodDefinition<object, object>> | undefined;
  const m = svc?.['ShouldRateLimit'];
  assert.ok(m !== undefined);
  return m;
}

void describe('testkit/load/rls-wire', () => {
  void it('encodes the RateLimitRequest a protobuf decoder reads back', () => {
    const m = rlsMethod();
    const bytes = encodeRateLimitRequest('bench', [[{ key: 'tenant', value: 'tenant-42' }]]);
    assert.deepEqual(m.requestDeserialize(Buffer.from(bytes)), {
      domain: 'bench',
      descriptors: [{ entries: [{ key: 'tenant', value: 'tenant-42' }], limit: null, hitsAddend: null }],
      hitsAddend: 0,
    });
    const frames = tenantFrames('bench', 3);
    assert.equal(frames.length, 3);
    const f = frames[2];
    assert.ok(f !== undefined);
    assert.equal(f[0], 0);
    assert.equal(f.readUInt32BE(1), f.length - 5);
    assert.equal(
      (m.requestDeserialize(f.subarray(5)) as { descriptors: { entries: { value: string }[] }[] }).descriptors[0]
        ?.entries[0]?.value,
      'tenant-2',
    );
  });

  void it('reads overall_code from a response, whatever the other fields, and rejects broken bodies', () => {
    const m = rlsMethod();
    const ok = grpcFrame(
      m.responseSerialize({
        overallCode: 'OK',
        statuses: [{ code: 'OK', limitRemaining: 300, currentLimit: { requestsPerUnit: 5, unit: 'HOUR', name: 'x' } }],
      }),
    );
    const over = grpcFrame(
      m.responseSerialize({
        overallCode: 'OVER_LIMIT',
        rawBody: Buffer.from('no'),
        responseHeadersToAdd: [{ key: 'a', value: 'b' }],
      }),
    );
    assert.equal(decodeOverallCode(ok), CODE_OK);
    assert.equal(decodeOverallCode(over), CODE_OVER_LIMIT);
    assert.equal(decodeOverallCode(grpcFrame(new Uint8Array(0))), 0);
    assert.equal(decodeOverallCode(ok.subarray(0, ok.length - 1)), -1);
    assert.equal(decodeOverallCode(Buffer.from([1, 0, 0, 0, 0])), -1);
    assert.equal(decodeResponse(ok), CODE_OK, 'not degraded');
    const degraded = grpcFrame(
      m.responseSerialize({
        overallCode: 'OK',
        responseHeadersToAdd: [
          { key: 'x', value: 'y' },
          { key: DEGRADED_HEADER, value: 'true' },
        ],
      }),
    );
    assert.equal(decodeResponse(degraded), CODE_OK | DEGRADED_FLAG);
    assert.equal(decodeOverallCode(degraded), CODE_OK);
  });
});

void void describe('bench/load/loadgen', () => {
  // A server that answers OK, OVER_LIMIT, a gRPC error, or nothing at all, in turn.
  const OK = Buffer.from([0x08, 0x01]);
  const OVER = Buffer.from([0x08, 0x02]);
  for (const client of ['raw', 'http2'] as const) {
    void it(`${client}: counts every request once — sent = ok + errors, also for errors and unanswered requests`, async () => {
      const dir = mkdtempSync(join(os.tmpdir(), 'cq-loadgen-'));
      const target = join(dir, 's.sock');
      let n = 0;
      const handler: grpc.handleUnaryCall<Buffer, Buffer> = (_call, callback) => {
        const k = n++ % 8;
        if (k === 7) return; // never answered: counted as an error after the drain
        if (k === 6) callback({ code: grpc.status.UNAVAILABLE, details: 'nope' });
        else callback(null, k % 2 === 0 ? OK : OVER);
      };
      const server = await startRlsServer(target, handler, rawRlsService());
      try {
        const job: LoadJob = {
          targets: [target],
          sliceMs: 50,
          domain: 'bench',
          tenants: 10,
          mode: 'closed',
          concurrency: 16,
          rate: 0,
          sessions: 2,
          client,
          warmupMs: 20,
          measureMs: 150,
          drainTimeoutMs: 300,
          seed: 7,
          progressEveryMs: 0,
        };
        const [r] = await runJob(job, () => undefined);
        assert.ok(r !== undefined);
        assert.ok(r.sent > 16);
        assert.equal(r.sent, r.ok + r.errors);
        assert.equal(r.ok, r.allowed + r.overLimit + r.unknownCode);
        assert.equal(r.unknownCode, 0);
        assert.ok(r.allowed > 0 && r.overLimit > 0 && r.errors > 0);
        assert.ok(
          r.errorSamples.some((e) => e.includes('unanswered after the 300 ms drain')),
          r.errorSamples.join('; '),
        );
        const [paced] = await runJob({ ...job, mode: 'paced', rate: 400 }, () => undefined);
        assert.ok(paced !== undefined);
        assert.equal(paced.sent, paced.ok + paced.errors);
        assert.ok(paced.latency !== null && paced.latency.samples > 0 && paced.latency.samples <= paced.ok);
        assert.ok(paced.sendLag !== null);
        // Two targets taking turns: each gets its own counts, and they add up too.
        const both = await runJob({ ...job, targets: [target, target], mode: 'paced', rate: 400 }, () => undefined);
        assert.equal(both.length, 2);
        for (const b of both) {
          assert.ok(b.sent > 0);
          assert.equal(b.sent, b.ok + b.errors);
        }
        const bothClosed = await runJob({ ...job, targets: [target, target] }, () => undefined);
        for (const b of bothClosed) {
          assert.equal(b.sent, b.ok + b.errors);
          assert.ok(b.measuredMs > 0 && b.measuredCompletions > 0);
        }
      } finally {
        await stopRlsServer(server, 200);
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }
});

void describe('bench/servers/bench-rules', () => {
  void it('limits half of the tenants in the limited domain only', () => {
    const limited = Array.from({ length: 1000 }, (_, i) => `tenant-${i}`).filter((t) =>
      isLimitedTenant('bench-limited', t),
    );
    assert.equal(limited.length, 500);
    assert.equal(isLimitedTenant('bench', 'tenant-1'), false);
    assert.deepEqual(
      rulesYaml().map((r) => r.file),
      ['bench.yaml', 'bench-small.yaml', 'bench-limited.yaml'],
    );
  });
});

void describe('npm run bench -- agent --smoke, ceiling only', () => {
  void it('reports a row per variant and accounts for every request', async () => {
    const messages: string[] = [];
    const { report, phases, skipped } = await runAgentBenchDetailed({
      smoke: true,
      servers: ['ceiling'],
      progress: (m) => messages.push(m),
    });

    assert.equal(report.name, 'agent');
    assert.equal(typeof report.title, 'string');
    assert.ok(Array.isArray(report.notes) && report.notes.length > 0);
    assert.ok(report.notes.every((n) => typeof n === 'string'));
    assert.deepEqual(skipped, []);
    assert.deepEqual(
      report.rows.map((r) => [r['variant'], r['server']]),
      [
        ['unlimited', 'ceiling'],
        ['limited', 'ceiling'],
      ],
    );
    for (const row of report.rows) {
      for (const v of Object.values(row)) assert.ok(typeof v === 'number' || typeof v === 'string');
      for (const col of [
        'c=16 req/s',
        'peak ÷ ceiling',
        'p50 µs @1000/s',
        'p99 µs',
        'p99.9 µs',
        'p99 ÷ ceiling',
        'refused %',
        'requests',
        'errors',
        'degraded',
      ])
        assert.ok(col in row, `column ${col}`);
      assert.equal(row['peak ÷ ceiling'], '1.00');
      assert.equal(row['refused %'], 0, 'the ceiling refuses nothing');
    }

    // One closed-loop and one paced phase per variant.
    assert.equal(phases.length, 4);
    let total = 0;
    for (const p of phases) {
      const r = p.result;
      assert.ok(r.sent > 0, 'requests were sent');
      assert.equal(r.sent, r.ok + r.errors, `sent = ok + errors (${p.variant} ${p.mode})`);
      assert.equal(r.ok, r.allowed + r.overLimit + r.unknownCode);
      assert.equal(r.errors, 0, r.errorSamples.join('; '));
      assert.equal(r.overLimit, 0);
      assert.equal(r.degraded, 0);
      assert.ok(r.measuredCompletions <= r.ok + r.errors);
      if (p.mode === 'paced') {
        assert.ok(r.latency !== null && r.latency.samples > 0);
        assert.ok(
          r.latency.p50Us <= r.latency.p99Us &&
            r.latency.p99Us <= r.latency.p999Us &&
            r.latency.p999Us <= r.latency.maxUs,
        );
      } else {
        assert.equal(r.latency, null);
      }
      total += r.sent;
    }
    const requests = report.rows.reduce((n, row) => n + Number(row['requests']), 0);
    assert.equal(requests, total, 'the table adds up the phases');
    assert.ok(
      messages.some((m) => m.startsWith('stopped ceiling')),
      'every server stopped',
    );
  });
});
