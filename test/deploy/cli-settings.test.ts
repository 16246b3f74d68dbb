// The flags and CELLQUOTA_* variables the manifests give the CLI are accepted by the CLI's own
// settings schema — rendered exactly as the kubelet would start each pod (downward API, $(VAR)
// expansion in env order and in args) — and they wire the pieces together: peer names, ports,
// mounts, sockets, the Envoy endpoints and the static shares of the cells.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { envVarName, loadSettings } from '../../shared/cli-config.js';
import { coordinatorSchema, coordinatorSpecs } from '../../cli/coordinator-command.js';
import { AGENT_SETTING_SPECS, agentConfigSchema, type AgentConfig } from '../../cell-agent/agent-config.js';
import { loadRules } from '../../cell-agent/rules/rules-load.js';
import {
  asArray,
  deployDir,
  at,
  containerArgs,
  descriptorKeys,
  findRateLimitFilter,
  pipePaths,
  containerEnv,
  isWorkload,
  overlayDirs,
  rel,
  render,
  toProcessEnv,
  type Container,
  type K8sObject,
  type PodContext,
  type Workload,
} from './deploy-fixtures.js';

type CoordinatorSettings = ReturnType<typeof coordinatorSchema.parse>;

const ADMIN_SECRET = { 'cellquota-admin': { token: 'a-long-enough-admin-token' } };

function overlay(dir: string): { objects: K8sObject[]; namespace: string } {
  const objects = render(dir);
  const ns =
    objects.find((o) => o.kind === 'Namespace')?.metadata.name ??
    objects.find(isWorkload)?.metadata.namespace ??
    'default';
  return { objects, namespace: ns };
}

function workload(objs: K8sObject[], kind: string, name: string): Workload | undefined {
  return objs.find((o): o is Workload => o.kind === kind && o.metadata.name === name);
}

function container(w: Workload, name: string): Container {
  const c = w.spec.template.spec.containers.find((x) => x.name === name);
  assert.ok(c !== undefined, `${w.metadata.name}: container ${name}`);
  return c;
}

function port(c: Container, name: string): number {
  const p = c.ports?.find((x) => x.name === name)?.containerPort;
  assert.ok(p !== undefined, `${c.name}: port ${name}`);
  return p;
}

/** argv after the subcommand and the environment of a container, as its process sees them. */
function processOf(c: Container, ctx: PodContext, subcommand: string): { argv: string[]; env: NodeJS.ProcessEnv } {
  const env = containerEnv(c, ctx);
  const args = containerArgs(c, env);
  for (const [k, v] of env)
    assert.ok(!v.includes('$('), `env ${k} keeps an unresolved reference: ${v} (defined after what it refers to?)`);
  for (const a of args) assert.ok(!a.includes('$('), `arg keeps an unresolved reference: ${a}`);
  assert.equal(args[0], subcommand);
  return { argv: args.slice(1), env: toProcessEnv(env) };
}

/** CELLQUOTA_* variables the CLI does not know are ignored by loadSettings: a typo would go unnoticed. */
function assertKnownVariables(c: Container, flags: readonly { flag: string }[], where: string): void {
  const known = new Set([...flags.map((s) => envVarName(s.flag)), 'CELLQUOTA_CONFIG']);
  for (const e of c.env ?? [])
    if (e.name.startsWith('CELLQUOTA_'))
      assert.ok(known.has(e.name), `${where}: ${e.name} is not a setting of the CLI`);
}

/** Cells in the overlay's family: one-cell → 1, three-cells/* → 3. */
function cellsOf(dir: string): number {
  return rel(dir).includes('three-cells') ? 3 : 1;
}

void test("the coordinator: every replica's flags and variables pass coordinatorSchema, with and without the admin token; ids, peers and admin URLs name the three pods", () => {
  let checked = 0;
  for (const dir of overlayDirs()) {
    const { objects, namespace } = overlay(dir);
    const sts = workload(objects, 'StatefulSet', 'cellquota-coordinator');
    if (sts === undefined) continue;
    const c = container(sts, 'coordinator');
    assertKnownVariables(c, coordinatorSpecs, rel(dir));
    const replicas = sts.spec.replicas ?? 1;
    const pods = Array.from({ length: replicas }, (_, i) => `${sts.metadata.name}-${i}`);
    const host = (pod: string): string => `${pod}.${String(sts.spec.serviceName)}.${namespace}.svc.cluster.local`;
    for (const [i, podName] of pods.entries()) {
      for (const secrets of [ADMIN_SECRET, {}]) {
        const where = `${rel(dir)} pod ${podName}${Object.keys(secrets).length === 0 ? ' (no admin Secret)' : ''}`;
        const { argv, env } = processOf(c, { podName, namespace, secrets }, 'coordinator');
        let s: CoordinatorSettings;
        try {
          s = loadSettings('cellquota coordinator', coordinatorSpecs, coordinatorSchema, argv, env);
        } catch (err) {
          assert.fail(`${where}: ${err instanceof Error ? err.message : String(err)}`);
        }
        assert.equal(s.id, podName, `${where}: the id is the pod name`);
        assert.deepEqual([...s.peers.keys()], pods, `${where}: --peers lists every replica`);
        for (const p of pods) assert.equal(s.peers.get(p), `${host(p)}:${port(c, 'grpc')}`, `${where}: peer ${p}`);
        assert.ok(s.adminPeers !== undefined, `${where}: --admin-peers`);
        for (const p of pods)
          assert.equal(s.adminPeers.get(p), `http://${host(p)}:${port(c, 'admin')}`, `${where}: admin URL of ${p}`);
        assert.equal(s.admin, `0.0.0.0:${port(c, 'admin')}`, `${where}: the admin API listens on the pod IP too`);
        assert.equal(s.floorCells, cellsOf(dir), `${where}: floors split over the overlay's cells`);
        assert.equal(
          s.adminToken,
          Object.keys(secrets).length === 0 ? undefined : ADMIN_SECRET['cellquota-admin'].token,
        );
        assert.equal(s.authReads, false, `${where}: --auth-reads would block the replicas' incarnation checks`);
      }
      if (i === 0) checked++;
    }
  }
  assert.equal(checked, 2, 'one-cell and three-cells/eu-west run the coordinator');
});

interface AgentWiring {
  dir: string;
  config: AgentConfig;
  deployment: Workload;
  agent: Container;
  envoyYaml: unknown;
  objects: K8sObject[];
}

function agentWirings(): AgentWiring[] {
  return overlayDirs().map((dir) => {
    const { objects, namespace } = overlay(dir);
    const d = workload(objects, 'Deployment', 'cellquota-agent');
    assert.ok(d !== undefined, `${rel(dir)}: agent Deployment`);
    const agent = container(d, 'agent');
    assertKnownVariables(agent, AGENT_SETTING_SPECS, rel(dir));
    const { argv, env } = processOf(agent, { podName: 'cellquota-agent-7d9f8-abcde', namespace }, 'agent');
    let config: AgentConfig;
    try {
      config = loadSettings('cellquota agent', AGENT_SETTING_SPECS, agentConfigSchema, argv, env);
    } catch (err) {
      assert.fail(`${rel(dir)}: ${err instanceof Error ? err.message : String(err)}`);
    }
    const envoyVolume = d.spec.template.spec.volumes?.find(
      (v) => v.name === container(d, 'envoy').volumeMounts?.find((m) => m.mountPath === '/etc/envoy')?.name,
    );
    const cm = objects.find((o) => o.kind === 'ConfigMap' && o.metadata.name === envoyVolume?.configMap?.name);
    const envoyText = at(cm, 'data', 'envoy.yaml');
    assert.equal(typeof envoyText, 'string', `${rel(dir)}: the Envoy ConfigMap holds envoy.yaml`);
    return { dir, config, deployment: d, agent, envoyYaml: parseYaml(envoyText as string) as unknown, objects };
  });
}

void test('the agent: its flags and variables pass agentConfigSchema in every overlay; cell ids are distinct; every quota comes from the coordinators (no tenants file, static share or unknown-tenant policy)', () => {
  const wirings = agentWirings();
  const expected: Record<string, string> = {
    'deploy/overlays/one-cell': 'main',
    'deploy/overlays/three-cells/eu-west': 'eu-west',
    'deploy/overlays/three-cells/us-east': 'us-east',
    'deploy/overlays/three-cells/ap-south': 'ap-south',
  };
  for (const w of wirings) assert.equal(w.config.cell, expected[rel(w.dir)], `${rel(w.dir)}: cell id`);
  const three = wirings.filter((w) => rel(w.dir).includes('three-cells'));
  assert.equal(new Set(three.map((w) => w.config.cell)).size, 3);
  for (const w of wirings) {
    assert.ok(w.config.coordinators.length > 0, `${rel(w.dir)}: the agent leases from the coordinators`);
    assert.equal(w.config.tenants, undefined, `${rel(w.dir)}: no --tenants file beside the coordinators`);
  }
});

/** The coordinators' gRPC addresses (their --peers) in the overlay that runs them. */
function coordinatorPeers(dir: string): string[] {
  const { objects, namespace } = overlay(dir);
  const sts = workload(objects, 'StatefulSet', 'cellquota-coordinator');
  assert.ok(sts !== undefined, `${rel(dir)} runs the coordinator`);
  const { argv, env } = processOf(
    container(sts, 'coordinator'),
    { podName: `${sts.metadata.name}-0`, namespace, secrets: ADMIN_SECRET },
    'coordinator',
  );
  const s = loadSettings('cellquota coordinator', coordinatorSpecs, coordinatorSchema, argv, env);
  // With --lease-listen the agents reach the peer hosts at the lease port (what a follower names).
  const leasePort = s.leaseListen === undefined ? null : /:(\d+)$/.exec(s.leaseListen)?.[1];
  return [...s.peers.values()].map((a) =>
    leasePort === null || leasePort === undefined ? a : a.replace(/:\d+$/, `:${leasePort}`),
  );
}

void test('the agent reaches the coordinators at their --peers hosts on the --lease-listen port — in the same cluster, and from the remote cells through hostAliases (the leader hint is a peer address)', () => {
  for (const w of agentWirings()) {
    const where = rel(w.dir);
    const hosts = w.config.coordinators.map((c) => `${c.host}:${c.port}`);
    const home =
      workload(w.objects, 'StatefulSet', 'cellquota-coordinator') !== undefined ? w.dir : join(w.dir, '..', 'eu-west');
    assert.deepEqual(
      hosts,
      coordinatorPeers(home),
      `${where}: --coordinators = the coordinators' --peers hosts at their lease port`,
    );
    if (home !== w.dir) {
      const aliases = w.deployment.spec.template.spec.hostAliases ?? [];
      for (const c of w.config.coordinators) {
        const a = aliases.find((x) => x.hostnames.includes(c.host));
        assert.ok(
          a !== undefined && /^\d+\.\d+\.\d+\.\d+$/.test(a.ip),
          `${where}: ${c.host} is mapped to its load balancer by hostAliases`,
        );
      }
      assert.equal(
        new Set(aliases.map((a) => a.ip)).size,
        w.config.coordinators.length,
        `${where}: one address per replica`,
      );
    }
  }
});

void test("TLS by default: each agent's certificate (cert-manager CSI) names its cell and is where --tls-* point; each replica's names the pod", () => {
  for (const w of agentWirings()) {
    const where = rel(w.dir);
    const vol = (w.deployment.spec.template.spec.volumes ?? []).find((v) => v.name === 'lease-tls') as
      { csi?: { volumeAttributes?: Record<string, string> } } | undefined;
    assert.equal(
      vol?.csi?.volumeAttributes?.['csi.cert-manager.io/uri-sans'],
      `urn:cellquota:cell:${w.config.cell}`,
      `${where}: the certificate names cell ${w.config.cell}`,
    );
    const mount = w.agent.volumeMounts?.find((m) => m.name === 'lease-tls');
    assert.ok(
      mount !== undefined &&
        w.config.tlsCert?.startsWith(`${mount.mountPath}/`) === true &&
        w.config.tlsCa?.startsWith(`${mount.mountPath}/`) === true,
      `${where}: --tls-* on the mounted certificate`,
    );
  }
  const { objects } = overlay(join(deployDir, 'overlays/one-cell'));
  const sts = workload(objects, 'StatefulSet', 'cellquota-coordinator');
  const vol = (sts?.spec.template.spec.volumes ?? []).find((v) => v.name === 'tls') as
    { csi?: { volumeAttributes?: Record<string, string> } } | undefined;
  assert.equal(vol?.csi?.volumeAttributes?.['csi.cert-manager.io/uri-sans'], 'urn:cellquota:replica:${POD_NAME}');
  assert.ok(
    objects.some(
      (o) => o.kind === 'Issuer' && o.metadata.name === vol?.csi?.volumeAttributes?.['csi.cert-manager.io/issuer-name'],
    ),
    'the Issuer is part of the overlay',
  );
});

void test("the agent's endpoints: sockets on the emptyDir Envoy shares, one TCP port per worker in the pod and the Service, the HTTP port Prometheus and the probes use", () => {
  for (const w of agentWirings()) {
    const where = rel(w.dir);
    const { config, agent, deployment, objects } = w;
    assert.ok(
      config.rlsSocket !== undefined && config.rlsListen !== undefined && config.http !== undefined,
      `${where}: socket, TCP and HTTP`,
    );
    const socketMount = agent.volumeMounts?.find((m) => config.rlsSocket?.startsWith(`${m.mountPath}/`));
    assert.ok(socketMount !== undefined, `${where}: the socket lives on a mounted volume`);
    assert.ok(
      deployment.spec.template.spec.volumes?.find((v) => v.name === socketMount.name)?.emptyDir !== undefined,
      `${where}: an emptyDir`,
    );
    const listen = config.rlsListen;
    const workerPorts = Array.from({ length: config.workers }, (_, i) => listen.port + i);
    const ports = (agent.ports ?? []).map((p) => p.containerPort);
    for (const p of workerPorts) assert.ok(ports.includes(p), `${where}: worker port ${p} is a container port`);
    const svc = objects.find((o) => o.kind === 'Service' && o.metadata.name === 'cellquota-agent');
    const svcPorts = asArray(at(svc, 'spec', 'ports')).map((p) => at(p, 'port'));
    assert.deepEqual(svcPorts, workerPorts, `${where}: the Service exposes one port per worker`);
    assert.equal(listen.host, '0.0.0.0');
    assert.equal(config.http.port, port(agent, 'http-agent'));
    assert.equal(agent.readinessProbe?.httpGet?.port, 'http-agent');
    // The Envoy sidecar lists every worker's socket: <socket>, <socket>.1, ...
    const pipes = pipePaths(w.envoyYaml);
    assert.deepEqual(
      pipes,
      Array.from({ length: config.workers }, (_, i) => (i === 0 ? config.rlsSocket : `${config.rlsSocket}.${i}`)),
      `${where}: Envoy's endpoints = the agent's sockets`,
    );
    // The overload guard answers before Envoy gives up.
    const timeout = at(findRateLimitFilter(w.envoyYaml), 'typed_config', 'timeout');
    assert.equal(typeof timeout, 'string');
    assert.ok(
      config.lagThresholdMs > 0 && config.lagThresholdMs <= parseFloat(timeout as string) * 1000,
      `${where}: --lag-threshold-ms ${config.lagThresholdMs} must not exceed Envoy's timeout ${String(timeout)}`,
    );
  }
});

void test("the agent's rules load with the agent's own loader; the rules cover what Envoy sends", async () => {
  for (const w of agentWirings()) {
    const where = rel(w.dir);
    const { config, agent, deployment, objects } = w;
    const mountOf = (path: string): { cm: K8sObject; file: string } => {
      const m = agent.volumeMounts?.find((x) => path === x.mountPath || path.startsWith(`${x.mountPath}/`));
      assert.ok(m !== undefined, `${where}: ${path} is on a mount`);
      const cmName = deployment.spec.template.spec.volumes?.find((v) => v.name === m.name)?.configMap?.name;
      const cm = objects.find((o) => o.kind === 'ConfigMap' && o.metadata.name === cmName);
      assert.ok(cm !== undefined, `${where}: ${path} comes from a ConfigMap`);
      return { cm, file: path === m.mountPath ? '' : path.slice(m.mountPath.length + 1) };
    };
    const rules = mountOf(config.rules);
    assert.equal(
      rules.file,
      '',
      `${where}: --rules names the mounted directory (a ConfigMap update swaps its ..data link, which the agent watches)`,
    );
    const dir = mkdtempSync(join(tmpdir(), 'cq-deploy-rules-'));
    try {
      for (const [name, text] of Object.entries(at(rules.cm, 'data') as Record<string, string>))
        writeFileSync(join(dir, name), text);
      const ruleSet = await loadRules(dir);
      const domain = at(findRateLimitFilter(w.envoyYaml), 'typed_config', 'domain');
      assert.ok(
        typeof domain === 'string' && ruleSet.domains.has(domain),
        `${where}: the rules define Envoy's domain ${String(domain)}`,
      );
      const keys = new Set(ruleSet.rules.map((r) => r.key));
      for (const k of descriptorKeys(w.envoyYaml))
        assert.ok(keys.has(k), `${where}: Envoy sends descriptor key ${k}, which no rule matches`);
      assert.ok(
        ruleSet.rules.some((r) => r.global && r.key === 'tenant'),
        `${where}: the tenant's global quota`,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
});

void test('service links are off: Kubernetes would otherwise inject CELLQUOTA_<SERVICE>_* variables into the pods, and none may shadow a setting', () => {
  const settingVars = new Set([...coordinatorSpecs, ...AGENT_SETTING_SPECS].map((s) => envVarName(s.flag)));
  for (const dir of overlayDirs()) {
    const { objects } = overlay(dir);
    for (const w of objects.filter(isWorkload))
      assert.equal(
        w.spec.template.spec.enableServiceLinks,
        false,
        `${rel(dir)} ${w.metadata.name}: enableServiceLinks`,
      );
    for (const svc of objects.filter((o) => o.kind === 'Service')) {
      const prefix = svc.metadata.name.toUpperCase().replace(/-/g, '_');
      const injected = [`${prefix}_SERVICE_HOST`, `${prefix}_SERVICE_PORT`, `${prefix}_PORT`];
      for (const v of injected)
        assert.ok(!settingVars.has(v), `${rel(dir)}: Service ${svc.metadata.name} would inject ${v}`);
    }
  }
});
