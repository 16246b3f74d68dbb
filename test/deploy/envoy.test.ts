// The Envoy configs (the agent's sidecar, and the example for Envoys reaching the agent over TCP)
// have what Envoy needs to call the agent (docs/envoy-rls.md §§4–7): the HTTP
// rate-limit filter with its typed_config, a domain, fail-open, a timeout, the V3 transport, a gRPC
// cluster speaking HTTP/2, and routes whose rate_limits actions produce the descriptors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import {
  asArray,
  at,
  deployDir,
  findRateLimitFilter,
  httpFilters,
  isRecord,
  loadYaml,
  render,
  type K8sObject,
} from './deploy-fixtures.js';

const CONFIGS = {
  sidecar: join(deployDir, 'base/agent/envoy.yaml'),
  tcp: join(deployDir, 'examples/envoy-tcp.yaml'),
};

const RATELIMIT_TYPE = 'type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit';
const HCM_TYPE =
  'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager';
const HTTP_OPTIONS = 'envoy.extensions.upstreams.http.v3.HttpProtocolOptions';

/** A protobuf Duration in Envoy's YAML form ("0.005s") in seconds. */
function seconds(d: unknown): number {
  assert.equal(typeof d, 'string', `a duration string, got ${JSON.stringify(d)}`);
  const m = /^(\d+(?:\.\d+)?)s$/.exec(d as string);
  assert.ok(m !== null, `a duration like 0.005s, got ${String(d)}`);
  return Number(m[1]);
}

function clusters(envoy: unknown): Map<string, unknown> {
  return new Map(asArray(at(envoy, 'static_resources', 'clusters')).map((c) => [at(c, 'name') as string, c]));
}

function speaksHttp2(cluster: unknown): boolean {
  if (isRecord(at(cluster, 'http2_protocol_options'))) return true; // the older cluster-level field
  const opts = at(cluster, 'typed_extension_protocol_options', HTTP_OPTIONS);
  return (
    at(opts, '@type') === `type.googleapis.com/${HTTP_OPTIONS}` &&
    isRecord(at(opts, 'explicit_http_config', 'http2_protocol_options'))
  );
}

function routes(envoy: unknown): unknown[] {
  return asArray(at(envoy, 'static_resources', 'listeners')).flatMap((l) =>
    asArray(at(l, 'filter_chains')).flatMap((fc) =>
      asArray(at(fc, 'filters')).flatMap((f) =>
        asArray(at(f, 'typed_config', 'route_config', 'virtual_hosts')).flatMap((vh) => asArray(at(vh, 'routes'))),
      ),
    ),
  );
}

for (const [label, file] of Object.entries(CONFIGS)) {
  void test(`Envoy (${label}): the rate-limit filter — typed_config type, domain, failure_mode_deny false, a short timeout, transport V3, a gRPC cluster with HTTP/2`, () => {
    const envoy = loadYaml(file);
    const rl = findRateLimitFilter(envoy);
    const cfg = at(rl, 'typed_config');
    assert.equal(at(cfg, '@type'), RATELIMIT_TYPE);
    assert.ok(typeof at(cfg, 'domain') === 'string' && (at(cfg, 'domain') as string).length > 0, 'domain');
    assert.equal(at(cfg, 'failure_mode_deny'), false, 'fail open, stated explicitly');
    const timeout = seconds(at(cfg, 'timeout'));
    assert.ok(
      timeout > 0 && timeout < 0.02,
      `timeout ${timeout}s: set, and shorter than Envoy's 20 ms default (0 would mean none)`,
    );
    assert.equal(at(cfg, 'rate_limit_service', 'transport_api_version'), 'V3', 'Envoy rejects anything but V3');
    const clusterName = at(cfg, 'rate_limit_service', 'grpc_service', 'envoy_grpc', 'cluster_name');
    assert.equal(typeof clusterName, 'string');
    const cluster = clusters(envoy).get(clusterName as string);
    assert.ok(cluster !== undefined, `cluster ${String(clusterName)} is defined`);
    assert.ok(speaksHttp2(cluster), `cluster ${String(clusterName)} speaks HTTP/2 (gRPC)`);
    assert.equal(at(cluster, 'load_assignment', 'cluster_name'), clusterName);
    assert.ok(
      asArray(at(cluster, 'load_assignment', 'endpoints')).flatMap((e) => asArray(at(e, 'lb_endpoints'))).length > 0,
      'endpoints',
    );
  });

  void test(`Envoy (${label}): filters in order (rate limit before the router, the router last), HCM typed, routes to defined clusters with tenant and client-address descriptors`, () => {
    const envoy = loadYaml(file);
    for (const l of asArray(at(envoy, 'static_resources', 'listeners'))) {
      assert.ok(at(l, 'address') !== undefined, `listener ${String(at(l, 'name'))}: address`);
      for (const f of asArray(at(l, 'filter_chains')).flatMap((fc) => asArray(at(fc, 'filters')))) {
        assert.equal(at(f, 'typed_config', '@type'), HCM_TYPE);
        const names = asArray(at(f, 'typed_config', 'http_filters')).map((h) => at(h, 'name'));
        assert.equal(names.at(-1), 'envoy.filters.http.router', 'the router is the last HTTP filter');
        const rl = names.indexOf('envoy.filters.http.ratelimit');
        if (rl >= 0) assert.ok(rl < names.length - 1);
      }
    }
    assert.ok(
      httpFilters(envoy).every((h) => typeof at(h, 'typed_config', '@type') === 'string'),
      'every HTTP filter has a typed_config',
    );
    const defined = clusters(envoy);
    const all = routes(envoy);
    for (const r of all) {
      const c = at(r, 'route', 'cluster');
      if (c !== undefined)
        assert.ok(typeof c === 'string' && defined.has(c), `route to undefined cluster ${JSON.stringify(c)}`);
    }
    const actionLists = all
      .flatMap((r) => asArray(at(r, 'route', 'rate_limits')))
      .map((rl) => asArray(at(rl, 'actions')));
    const tenantAction = (a: unknown): boolean =>
      at(a, 'request_headers', 'header_name') === 'x-tenant-id' &&
      at(a, 'request_headers', 'descriptor_key') === 'tenant';
    assert.ok(
      actionLists.some((acts) => acts.length === 1 && tenantAction(acts[0])),
      'a descriptor [tenant] (the global quota)',
    );
    assert.ok(
      actionLists.some((acts) => acts.some(tenantAction) && acts.some((a) => isRecord(at(a, 'remote_address')))),
      'a descriptor [tenant, remote_address] (the per-client limit)',
    );
  });
}

void test('Envoy: both configs use the same domain and timeout; the TCP example reaches the agent Service on one port per worker', () => {
  const sidecar = at(findRateLimitFilter(loadYaml(CONFIGS.sidecar)), 'typed_config');
  const tcp = loadYaml(CONFIGS.tcp);
  const tcpCfg = at(findRateLimitFilter(tcp), 'typed_config');
  assert.equal(at(tcpCfg, 'domain'), at(sidecar, 'domain'));
  assert.equal(at(tcpCfg, 'timeout'), at(sidecar, 'timeout'));
  const objs = render(join(deployDir, 'overlays/one-cell'));
  const svc = objs.find((o: K8sObject) => o.kind === 'Service' && o.metadata.name === 'cellquota-agent');
  assert.ok(svc !== undefined);
  const host = `${svc.metadata.name}.${String(svc.metadata.namespace)}.svc.cluster.local`;
  const ports = asArray(at(svc, 'spec', 'ports')).map((p) => at(p, 'port'));
  const clusterName = at(tcpCfg, 'rate_limit_service', 'grpc_service', 'envoy_grpc', 'cluster_name') as string;
  const endpoints = asArray(at(clusters(tcp).get(clusterName), 'load_assignment', 'endpoints'))
    .flatMap((e) => asArray(at(e, 'lb_endpoints')))
    .map((e) => at(e, 'endpoint', 'address', 'socket_address'));
  assert.deepEqual(
    endpoints.map((a) => at(a, 'address')),
    ports.map(() => host),
  );
  assert.deepEqual(
    endpoints.map((a) => at(a, 'port_value')),
    ports,
  );
});
