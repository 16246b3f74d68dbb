// The transport warm-up: the serving thread's raw-frame client (shared/h2-raw.ts) against the real
// lean server, on both kinds of socket, past the connection's flow-control window, and against
// nothing at all (a warm-up never fails the start).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { warmUp } from '../../../cell-agent/rls/warm-up.js';
import { sendWarmUpCalls, warmUpTransport } from '../../../cell-agent/rls/warm-up-transport.js';
import { startLeanRlsServer } from '../../../cell-agent/rls/lean-server.js';
import { encodeRateLimitRequest } from '../../../cell-agent/rls/rls-codec.js';
import { frameMessage } from '../../../cell-agent/rls/grpc-wire.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';
import { StaticQuotas } from '../../../cell-agent/decide/quotas.js';
import { parseQuotaFile } from '../../../cell-agent/decide/quota-file.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { DEFAULT_OVERLOAD } from '../../../cell-agent/decide/overload.js';
import { pino } from 'pino';
import { createRootLogger } from '../../../shared/logging.js';

const logger = createRootLogger({ level: 'silent', name: 'test' });
const RULES = `domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: route
    value: "/v1/*"
    rate_limit: {unit: minute, requests_per_unit: 100}
`;

function warmService(): ReturnType<typeof warmUp> {
  const rules = compileRules([parseRulesYaml(RULES, 'api.yaml')]);
  const quotas = new StaticQuotas(parseQuotaFile({ tiers: {}, tenants: {} }), {
    staticShare: 1,
    unknownTenant: { kind: 'deny' },
  });
  return warmUp(
    rules,
    { quotas },
    { bounds: DEFAULT_REQUEST_BOUNDS, responseHeaders: false, tableFull: 'open', staticSlices: true, cell: 'test' },
    DEFAULT_OVERLOAD,
    logger,
    { checks: 50 },
  );
}

for (const where of [
  'beside the served Unix socket',
  'on TCP',
  'on TCP when its Unix socket cannot be bound',
] as const) {
  void test(`the transport warm-up answers every call through the lean server ${where}`, async () => {
    const warm = warmService();
    assert.ok(warm.requests.length >= 2, 'requests made from the rules');
    const dir = mkdtempSync(join(tmpdir(), 'cq-warm-up-'));
    try {
      const served =
        where === 'on TCP'
          ? undefined
          : join(dir, where === 'on TCP when its Unix socket cannot be bound' ? 'missing/rls.sock' : 'rls.sock');
      const lines: string[] = [];
      const captured = pino({ level: 'debug' }, { write: (line: string) => lines.push(line) });
      const out = await warmUpTransport(warm.service, warm.requests, captured, {
        calls: 300,
        concurrency: 16,
        budgetMs: 10_000,
        ...(served === undefined ? {} : { unixBeside: served }),
      });
      assert.equal(out.calls, 300);
      assert.deepEqual(readdirSync(dir), [], 'nothing is left beside the served socket');
      const fellBack = lines.some((l) => l.includes('transport warm-up on 127.0.0.1'));
      assert.equal(fellBack, where === 'on TCP when its Unix socket cannot be bound', lines.join(''));
      const listening = lines.filter((l) => l.includes('rls server listening')).join('');
      assert.match(
        listening,
        where === 'beside the served Unix socket' ? /"unix":"[^"]*\.cq-warm-up-/ : /"tcp":"127\.0\.0\.1:/,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
}

void test('the warm-up client sends 1.6 MB of requests of near the largest frame on one connection', async () => {
  const warm = warmService();
  const dir = mkdtempSync(join(tmpdir(), 'cq-warm-client-'));
  const server = await startLeanRlsServer(
    warm.service,
    { unix: { path: join(dir, 'rls.sock'), mode: 0o600 }, maxMessageBytes: 1 << 20 },
    logger,
  );
  try {
    // Each body near the largest frame (16,384 bytes), far past the 65,535 bytes of a connection's
    // initial window. (node:http2's server opens a larger window than that at once, so this does not
    // show the client waiting for a WINDOW_UPDATE; it shows that long requests arrive whole.)
    const body = frameMessage(
      encodeRateLimitRequest({
        domain: 'api',
        hitsAddend: 0,
        descriptors: [
          { entries: [{ key: 'route', value: `/v1/${'x'.repeat(16_000)}` }], limit: null, hitsAddend: null },
        ],
      }),
    );
    assert.ok(body.length > 16_000 && body.length <= 16_384, `body of ${body.length} bytes`);
    const out = await sendWarmUpCalls({
      target: server.endpoints.unix ?? '',
      bodies: [body],
      calls: 100,
      concurrency: 8,
      budgetMs: 10_000,
    });
    assert.equal(out.error, null);
    assert.equal(out.calls, 100);
  } finally {
    await server.stop(0);
    rmSync(dir, { recursive: true, force: true });
  }
});

void test('a warm-up with nothing listening resolves with the error and no calls', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'cq-warm-client-'));
  try {
    const out = await sendWarmUpCalls({
      target: join(dir, 'nobody.sock'),
      bodies: [Buffer.from([0, 0, 0, 0, 0])],
      calls: 10,
      concurrency: 4,
      budgetMs: 1000,
    });
    assert.equal(out.calls, 0);
    assert.match(String(out.error?.message), /ENOENT/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
