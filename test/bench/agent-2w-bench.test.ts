// The `agent` benchmark's agent-2w server (the agent with 2 workers, one socket each): the load
// generator spreads a target's connections over all of its addresses, and the smoke run of agent
// and agent-2w side by side reports both rows and the agent-2w ÷ agent note. Structure only: no
// wall-clock figure is asserted (docs/targets.md: targets are for benchmarks).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type * as grpc from '@grpc/grpc-js';
import { runAgentBenchDetailed } from '../../bench/agent-rls.js';
import { runJob } from '../../bench/load/loadgen.js';
import type { LoadJob } from '../../bench/load/loadgen-protocol.js';
import { rawRlsService, startRlsServer, stopRlsServer } from '../../bench/servers/rls-grpc.js';

const OK = Buffer.from([0x08, 0x01]);

void describe('bench/load/loadgen: a target with several addresses', () => {
  for (const client of ['raw', 'http2'] as const) {
    void it(`${client}: spreads the connections, and so the requests, over every address`, async () => {
      const dir = mkdtempSync(join(os.tmpdir(), 'cq-loadgen-2w-'));
      const counts = [0, 0];
      const servers: grpc.Server[] = [];
      try {
        for (const i of [0, 1]) {
          const handler: grpc.handleUnaryCall<Buffer, Buffer> = (_call, callback) => {
            counts[i] = (counts[i] ?? 0) + 1;
            callback(null, OK);
          };
          servers.push(await startRlsServer(join(dir, `s.sock${i === 0 ? '' : '.1'}`), handler, rawRlsService()));
        }
        const both = [join(dir, 's.sock'), join(dir, 's.sock.1')];
        // One session asked for, two addresses: raised to one per address.
        const job: LoadJob = {
          targets: [both],
          sliceMs: 50,
          domain: 'bench',
          tenants: 10,
          mode: 'closed',
          concurrency: 8,
          rate: 0,
          sessions: 1,
          client,
          warmupMs: 20,
          measureMs: 200,
          drainTimeoutMs: 1000,
          seed: 3,
          progressEveryMs: 0,
        };
        const [r] = await runJob(job, () => undefined);
        assert.notEqual(r, undefined, 'one result for the one target');
        if (r === undefined) return;
        assert.equal(r.sent, r.ok + r.errors);
        assert.equal(r.errors, 0, r.errorSamples.join('; '));
        assert.equal((counts[0] ?? 0) + (counts[1] ?? 0), r.sent, 'every request reached one of the two servers');
        assert.equal(
          (counts[0] ?? 0) > 0 && (counts[1] ?? 0) > 0,
          true,
          `both addresses got requests: ${counts.join(' / ')}`,
        );
      } finally {
        await Promise.all(servers.map((s) => stopRlsServer(s, 200)));
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }
});

void describe('npm run bench -- agent --smoke, agent and agent-2w beside bare-h2 and bare-h2-2w', () => {
  void it(
    'measures the agent and the bare server with 1 and 2 workers and reports the ratios',
    { timeout: 60_000 },
    async () => {
      const messages: string[] = [];
      const { report, phases, skipped } = await runAgentBenchDetailed({
        smoke: true,
        servers: ['bare-h2', 'bare-h2-2w', 'agent', 'agent-2w'],
        variants: ['unlimited'],
        progress: (m) => messages.push(m),
      });
      assert.deepEqual(skipped, []);
      assert.deepEqual(
        report.rows.map((r) => [r['variant'], r['server']]),
        [
          ['unlimited', 'bare-h2'],
          ['unlimited', 'bare-h2-2w'],
          ['unlimited', 'agent'],
          ['unlimited', 'agent-2w'],
        ],
      );
      for (const p of phases) {
        assert.equal(p.result.sent > 0, true, `${p.server} ${p.mode}: requests were sent`);
        assert.equal(p.result.sent, p.result.ok + p.result.errors);
        assert.equal(p.result.errors, 0, p.result.errorSamples.join('; '));
      }
      const scaling = report.notes.filter((n) => n.startsWith('agent-2w ÷ agent (unlimited, c=16)'));
      assert.equal(scaling.length, 1, report.notes.join('\n'));
      assert.match(
        scaling[0] ?? '',
        /agent-2w ÷ bare-h2-2w \d/,
        'the agent with 2 workers against the bare server with 2',
      );
      assert.match(scaling[0] ?? '', /bare-h2-2w ÷ bare-h2 \d/, "the bare server's own step from 1 to 2 threads");
      const described = report.notes.find((n) => n.startsWith('agent-2w: '));
      assert.match(described ?? '', /2 workers.*\.sock, .*\.sock\.1/, 'agent-2w serves on two sockets');
      const bare2 = report.notes.find((n) => n.startsWith('bare-h2-2w: '));
      assert.match(bare2 ?? '', /2 worker threads.*\.sock, .*\.sock\.1/, 'bare-h2-2w serves on two sockets');
      assert.equal(
        messages.some((m) => m.startsWith('stopped bare-h2, bare-h2-2w, agent, agent-2w')),
        true,
        'every server stopped',
      );
    },
  );
});
