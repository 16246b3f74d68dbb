import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  DEFAULT_ROUTES,
  RoutesError,
  loadRoutes,
  parseRoutes,
  parseRoutesText,
} from '../../../cell-agent/front-door/routes.js';
import { loadRules } from '../../../cell-agent/rules/rules-load.js';
import type { ForwardedRequest } from '../../../cell-agent/front-door/routes.js';

function req(
  over: Partial<Omit<ForwardedRequest, 'header'>> & { headers?: Record<string, string> } = {},
): ForwardedRequest {
  const headers = over.headers ?? {};
  return {
    client: over.client ?? '198.51.100.7',
    method: over.method ?? 'GET',
    host: over.host ?? 'api.example.com',
    uri: over.uri ?? '/api/items?x=1',
    header: (n) => headers[n],
  };
}
const entries = (r: ReturnType<typeof DEFAULT_ROUTES.requestFor>): string[][] =>
  r.descriptors.map((d) => d.entries.map((e) => `${e.key}=${e.value}`));

const ROUTES = `
domain: shop
routes:
  - match: {prefix: /api/, hosts: ["*.example.com"], methods: [post, PUT]}
    rate_limits:
      - actions:
          - remote_address: {}
          - generic_key: {descriptor_value: writes}
      - actions:
          - request_headers: {header_name: X-Api-Key, descriptor_key: api_key}
      - actions:
          - header_value_match: {descriptor_value: json, headers: [{name: content-type, prefix_match: application/json}]}
  - match: {path: /login}
    rate_limits:
      - actions:
          - remote_address: {}
          - request_headers: {header_name: x-user, descriptor_key: user, skip_if_absent: true}
  - match: {prefix: /}
    rate_limits:
      - actions: [{header_value_match: {descriptor_value: not-get, expect_match: false, headers: [{name: ":method", exact_match: GET}]}}]
`;

void test('without a routes file: remote_address of the client in domain edge', () => {
  const r = DEFAULT_ROUTES.requestFor(req());
  assert.equal(r.domain, 'edge');
  assert.deepEqual(entries(r), [['remote_address=198.51.100.7']]);
});

void test('Envoy actions: first matching route, one descriptor per rate_limit, unproducible ones left out', () => {
  const routes = parseRoutesText(ROUTES, 'routes.yaml');
  assert.equal(routes.domain, 'shop');
  assert.deepEqual(
    entries(
      routes.requestFor(
        req({ method: 'POST', headers: { 'x-api-key': 'k1', 'content-type': 'application/json; charset=utf-8' } }),
      ),
    ),
    [['remote_address=198.51.100.7', 'generic_key=writes'], ['api_key=k1'], ['header_match=json']],
  );
  // no api key: that descriptor is left out; wrong content type: so is that one
  assert.deepEqual(entries(routes.requestFor(req({ method: 'PUT', headers: { 'content-type': 'text/plain' } }))), [
    ['remote_address=198.51.100.7', 'generic_key=writes'],
  ]);
  // GET on /api/ misses route 1 (methods) and falls through to the catch-all, whose match is inverted
  assert.deepEqual(entries(routes.requestFor(req({ method: 'GET' }))), []);
  assert.deepEqual(entries(routes.requestFor(req({ method: 'DELETE' }))), [['header_match=not-get']]);
  // host patterns: *.example.com does not match example.com itself
  assert.deepEqual(entries(routes.requestFor(req({ method: 'POST', host: 'example.com' }))), [
    ['header_match=not-get'],
  ]);
  assert.deepEqual(entries(routes.requestFor(req({ method: 'POST', host: 'a.example.com:8443' })))[0], [
    'remote_address=198.51.100.7',
    'generic_key=writes',
  ]);
  // exact path; skip_if_absent drops just the entry
  assert.deepEqual(entries(routes.requestFor(req({ uri: '/login?next=/', method: 'GET' }))), [
    ['remote_address=198.51.100.7'],
  ]);
  assert.deepEqual(entries(routes.requestFor(req({ uri: '/login', headers: { 'x-user': 'ann' } }))), [
    ['remote_address=198.51.100.7', 'user=ann'],
  ]);
});

void test('a bad routes file names the file, line, column and the problem', () => {
  const bad = (text: string, pattern: RegExp): void => {
    assert.throws(
      () => parseRoutesText(text, 'r.yaml'),
      (e: unknown) => e instanceof RoutesError && pattern.test(e.message),
      text,
    );
  };
  bad(
    'routes:\n  - match: {prefix: api}\n    rate_limits: []\n',
    /^r\.yaml:2:21: routes\.0\.match\.prefix: a path starting with \//,
  );
  bad(
    'routes:\n  - rate_limits:\n      - actions: [{remote_adress: {}}]\n',
    /^r\.yaml:3:19: routes\.0\.rate_limits\.0\.actions\.0: unknown action .remote_adress.: an action is one of remote_address/,
  );
  bad(
    'routes:\n  - rate_limits: [{actions: [{request_headers: {header_name: "bad header"}}]}]\n',
    /not an HTTP header name/,
  );
  bad(
    'routes: [{rate_limits: [{actions: [{header_value_match: {descriptor_value: x, headers: [{name: a, safe_regex_match: {regex: "("}}]}}]}]}]',
    /bad regex/,
  );
  bad('routes: [{match: {prefix: /a, path: /b}, rate_limits: []}]', /prefix and path exclude each other/);
  bad('domain: edge\nroutes: []\n', /routes: at least one route/);
  bad('routes: [{rate_limits: [], extra: 1}]', /Unrecognized key/);
  bad('routes: [{rate_limits: [{actions: [{}]}]}]', /exactly one of .*got none/);
  bad('routes: [\n', /^r\.yaml(:\d+:\d+)?: invalid YAML/);
  assert.throws(() => parseRoutes({ routes: 'x' }, 'obj'), /RoutesError: obj: routes: .*expected array/);
});

void test('the examples in deploy/examples/front-door load: routes (per visitor on /api/ and /auth/ only) and rules', async () => {
  const dir = fileURLToPath(new URL('../../../deploy/examples/front-door/', import.meta.url));
  const routes = await loadRoutes(join(dir, 'routes.yaml'));
  assert.deepEqual(entries(routes.requestFor(req({ uri: '/api/x' }))), [['remote_address=198.51.100.7']]);
  assert.deepEqual(entries(routes.requestFor(req({ uri: '/auth/login' }))), [['remote_address=198.51.100.7']]);
  assert.deepEqual(entries(routes.requestFor(req({ uri: '/index.html' }))), []);
  const rules = await loadRules(join(dir, 'rules.yaml'));
  assert.deepEqual([...rules.domains.keys()], ['edge']);
});
