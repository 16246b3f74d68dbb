// The `agent` benchmark's lean-transport server (the agent's lean RLS server with a constant answer
// instead of the decision): a grpc-js client gets what the real agent answers a fresh tenant of the
// same rules, and a request that does not decode gets INVALID_ARGUMENT as from the agent; the smoke run beside
// bare-h2 and the agent reports where the agent's time goes. Structure only: no wall-clock figure is
// asserted (docs/targets.md: targets are for benchmarks).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { runAgentBenchDetailed } from '../../bench/agent-rls.js';
import { UNLIMITED_PER_SECOND } from '../../bench/servers/bench-rules.js';
import { start as startAgent } from '../../bench/servers/agent.js';
import { start as startLeanTransport } from '../../bench/servers/lean-transport.js';
import { rawRlsService } from '../../bench/servers/rls-grpc.js';
import { RlsClient, d, grpcError, unixTarget } from '../../testkit/rls-client.js';

const RawRls = grpc.makeGenericClientConstructor(rawRlsService(), 'RawRls');

void describe('bench/servers/lean-transport', () => {
  void it("answers every check with the agent's answer to a fresh tenant, and refuses bytes that do not decode", async () => {
    const dir = mkdtempSync(join(os.tmpdir(), 'cq-lean-transport-'));
    const socket = join(dir, 'rls.sock');
    const agentSocket = join(dir, 'agent.sock');
    const server = await startLeanTransport(socket);
    const agent = await startAgent(agentSocket, { scratchDir: dir });
    const client = new RlsClient(unixTarget(socket));
    const agentClient = new RlsClient(unixTarget(agentSocket));
    const raw = new RawRls(unixTarget(socket), grpc.credentials.createInsecure()) as unknown as grpc.Client & {
      ShouldRateLimit(request: Buffer, callback: (error: grpc.ServiceError | null, response?: Buffer) => void): void;
    };
    try {
      const check = { domain: 'bench', descriptors: [d(['tenant', 'tenant-1'])] };
      // The agent's first answer for a tenant: the bench rule (1e9/s) with one request taken.
      const fromAgent = await agentClient.check(check);
      assert.equal(fromAgent.overall_code, 'OK');
      assert.equal(fromAgent.statuses[0]?.limit_remaining, UNLIMITED_PER_SECOND - 1);
      for (const tenant of ['tenant-1', 'tenant-2', 'tenant-1'])
        assert.deepEqual(await client.check({ domain: 'bench', descriptors: [d(['tenant', tenant])] }), fromAgent);
      // Field 1 (the domain) says 127 bytes follow; 2 do.
      const malformed = await grpcError(
        new Promise((resolve, reject) => {
          raw.ShouldRateLimit(Buffer.from('0a7f0102', 'hex'), (e, r) => (e !== null ? reject(e) : resolve(r)));
        }),
      );
      assert.equal(malformed.code, grpc.status.INVALID_ARGUMENT);
      assert.match(malformed.details, /^malformed RateLimitRequest: /);
    } finally {
      client.close();
      agentClient.close();
      raw.close();
      await Promise.all([server.stop(), agent.stop()]);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

void describe('npm run bench -- agent --smoke, lean-transport beside bare-h2 and the agent', () => {
  void it("reports where the agent's time goes: transport against decision", { timeout: 60_000 }, async () => {
    const { report, phases, skipped } = await runAgentBenchDetailed({
      smoke: true,
      servers: ['bare-h2', 'lean-transport', 'agent'],
      variants: ['unlimited'],
      progress: () => undefined,
    });
    assert.deepEqual(skipped, []);
    assert.deepEqual(
      report.rows.map((r) => [r['variant'], r['server']]),
      [
        ['unlimited', 'bare-h2'],
        ['unlimited', 'lean-transport'],
        ['unlimited', 'agent'],
      ],
    );
    for (const p of phases) {
      assert.equal(p.result.sent > 0, true, `${p.server} ${p.mode}: requests were sent`);
      assert.equal(p.result.sent, p.result.ok + p.result.errors);
      assert.equal(p.result.errors, 0, p.result.errorSamples.join('; '));
      assert.equal(p.result.overLimit, 0, `${p.server}: nothing refused in the unlimited variant`);
    }
    const where = report.notes.filter((n) => n.startsWith("where the agent's time goes (unlimited, c=16)"));
    assert.equal(where.length, 1, report.notes.join('\n'));
    assert.match(where[0] ?? '', /lean-transport ÷ bare-h2 \d+\.\d\d \(the agent's transport and decoding\)/);
    assert.match(where[0] ?? '', /agent ÷ lean-transport \d+\.\d\d \(the decision and the answer's encoding\)/);
    assert.match(where[0] ?? '', /server CPU µs a check: bare-h2 \d+\.\d, lean-transport \d+\.\d, agent \d+\.\d/);
    const described = report.notes.find((n) => n.startsWith('lean-transport: '));
    assert.match(described ?? '', /in a worker thread with the agent's young generation \(\d+ MiB\)/);
  });
});
