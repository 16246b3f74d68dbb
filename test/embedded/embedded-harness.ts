// What the fastify and express tests share: the seed's layout (a registry limiter for /v2 and
// /auth, an admin limiter for /admin, each a global limit and a per-IP limit that must both pass),
// scaled to per-minute rates so refills never race a test on a busy machine; HTTP requests over
// loopback with a chosen X-Forwarded-For; and the draft-10 headers parsed with structured-headers.
import assert from 'node:assert/strict';
import { parseList } from 'structured-headers';
import type { RulesDocument } from '../../embedded/options.js';

/** Registry: everything together 20/min, each client 5/min. Admin: 10/min together, 3/min each. */
export const REGISTRY_RULES: RulesDocument = {
  domain: 'registry',
  descriptors: [
    { key: 'limiter', value: 'registry', rate_limit: { unit: 'minute', requests_per_unit: 20, name: 'global' } },
    { key: 'remote_address', rate_limit: { unit: 'minute', requests_per_unit: 5, name: 'per-ip' } },
  ],
};
export const ADMIN_RULES: RulesDocument = {
  domain: 'admin',
  descriptors: [
    { key: 'limiter', value: 'admin', rate_limit: { unit: 'minute', requests_per_unit: 10, name: 'global' } },
    { key: 'remote_address', rate_limit: { unit: 'minute', requests_per_unit: 3, name: 'per-ip' } },
  ],
};

/** Both levels: one global descriptor and one per client. */
export function bothLevels(limiter: string): (request: unknown, client: string) => { key: string; value: string }[][] {
  return (_request, client) => [[{ key: 'limiter', value: limiter }], [{ key: 'remote_address', value: client }]];
}

export interface Answer {
  readonly status: number;
  readonly headers: Headers;
  readonly body: string;
}

export async function get(url: string, xff?: string, extra: Record<string, string> = {}): Promise<Answer> {
  const headers: Record<string, string> = { ...extra };
  if (xff !== undefined) headers['x-forwarded-for'] = xff;
  const r = await fetch(url, { headers });
  return { status: r.status, headers: r.headers, body: await r.text() };
}

/** Sends `n` requests in order; returns the statuses. */
export async function statuses(n: number, url: string, xff?: string): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) out.push((await get(url, xff)).status);
  return out;
}

export interface ParsedPolicy {
  readonly name: string;
  readonly q: number;
  readonly w: number;
}
export interface ParsedState {
  readonly name: string;
  readonly r: number;
  readonly t: number;
}

/** RateLimit-Policy and RateLimit parsed as the draft's structured fields (asserting their types). */
export function parseRateLimitHeaders(h: Headers): { policies: ParsedPolicy[]; states: ParsedState[] } {
  const policy = h.get('ratelimit-policy');
  const state = h.get('ratelimit');
  assert.ok(policy !== null && state !== null, 'RateLimit-Policy and RateLimit are present');
  const policies = parseList(policy).map((item) => {
    assert.ok(!Array.isArray(item[0]), 'a policy is an Item, not an Inner List');
    const [name, params] = item as [unknown, Map<string, unknown>];
    assert.equal(typeof name, 'string', 'the policy name is an sf-string');
    const q = params.get('q');
    const w = params.get('w');
    assert.ok(Number.isInteger(q) && (q as number) >= 0, `q is an sf-integer: ${String(q)}`);
    assert.ok(w === undefined || (Number.isInteger(w) && (w as number) > 0), `w is an sf-integer: ${String(w)}`);
    return { name: name as string, q: q as number, w: (w ?? 0) as number };
  });
  const states = parseList(state).map((item) => {
    const [name, params] = item as [unknown, Map<string, unknown>];
    assert.equal(typeof name, 'string');
    const r = params.get('r');
    const t = params.get('t');
    assert.ok(Number.isInteger(r) && (r as number) >= 0, `r is an sf-integer: ${String(r)}`);
    assert.ok(Number.isInteger(t) && (t as number) >= 0, `t is an sf-integer: ${String(t)}`);
    return { name: name as string, r: r as number, t: t as number };
  });
  assert.deepEqual(
    states.map((s) => s.name),
    policies.map((p) => p.name),
    'RateLimit names the same policies as RateLimit-Policy',
  );
  return { policies, states };
}

/** A refusal: 429, Retry-After in whole seconds ≥ 1, and the draft headers. */
export function assertRefused(a: Answer, refusedPolicy: string): void {
  assert.equal(a.status, 429);
  const retry = a.headers.get('retry-after');
  assert.match(retry ?? '', /^[1-9]\d*$/, 'Retry-After is whole seconds');
  const { policies, states } = parseRateLimitHeaders(a.headers);
  const i = policies.findIndex((p) => p.name === refusedPolicy);
  assert.ok(i >= 0, `the ${refusedPolicy} policy is listed: ${policies.map((p) => p.name).join(', ')}`);
  assert.equal(states[i]?.r, 0, `${refusedPolicy} has nothing left`);
  assert.ok((states[i]?.t ?? 0) >= 1);
}

/**
 * The seed's layout driven through a running app whose /v2/*, /auth/* share the registry limiter
 * and /admin/* has its own, both behind trusted proxies 127.0.0.1 and ::1 (this test is the proxy
 * and appends the client to X-Forwarded-For).
 */
export async function seedScenario(base: string): Promise<void> {
  // Per IP, shared by /v2 and /auth: 5 a minute.
  const a = '203.0.113.10';
  const mixed = [
    await get(`${base}/v2/a/manifests/1`, a),
    await get(`${base}/auth/token`, a),
    await get(`${base}/v2/b/blobs/2`, a),
    await get(`${base}/auth/token`, a),
    await get(`${base}/v2/c`, a),
  ];
  assert.deepEqual(
    mixed.map((r) => r.status),
    [200, 200, 200, 200, 200],
  );
  const { policies, states } = parseRateLimitHeaders(mixed[4]?.headers as Headers);
  assert.deepEqual(policies, [
    { name: 'global', q: 20, w: 60 },
    { name: 'per-ip', q: 5, w: 60 },
  ]);
  assert.deepEqual(
    states.map((s) => s.r),
    [15, 0],
  );
  assertRefused(await get(`${base}/auth/token`, a), 'per-ip');
  // A client cannot spoof its way out by prepending: the proxy's entry is the rightmost.
  assertRefused(await get(`${base}/v2/x`, `198.51.100.1, ${a}`), 'per-ip');
  assertRefused(await get(`${base}/v2/x`, `unknown, 10.0.0.1, ${a}`), 'per-ip');
  // The admin limiter is another instance: the same client still has its 3 there.
  assert.deepEqual(await statuses(4, `${base}/admin/users`, a), [200, 200, 200, 429]);
  // Another client has its own per-IP bucket, under the same global one.
  assert.deepEqual(await statuses(2, `${base}/v2/y`, '203.0.113.11'), [200, 200]);
  // Global: 20 a minute for everyone together (5 + 2 used). Fresh clients take the rest…
  let admitted = 7;
  for (let c = 0; admitted < 20; c++) {
    const r = await get(`${base}/v2/z`, `203.0.113.${100 + c}`);
    assert.equal(r.status, 200);
    admitted++;
    if (admitted < 20) {
      assert.equal((await get(`${base}/v2/z`, `203.0.113.${100 + c}`)).status, 200);
      admitted++;
    }
  }
  // …then a client that never sent anything is refused by the global limit (its own is untouched).
  const fresh = await get(`${base}/v2/z`, '192.0.2.77');
  assertRefused(fresh, 'global');
  const after = parseRateLimitHeaders(fresh.headers);
  assert.equal(
    after.states.find((s) => s.name === 'per-ip')?.r,
    5,
    'nothing was taken from the per-IP level of a refused request',
  );
  // Admin traffic is not affected by the registry's global limit.
  assert.equal((await get(`${base}/admin/users`, '192.0.2.77')).status, 200);
}
