// deploy/: every file parses; every Kubernetes object has what the API server requires; the
// workloads, Services, policies and monitors fit together; the coordinator and agent workloads have
// the properties the design depends on (quorum-safe disruption, parallel start, restricted pods).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import {
  at,
  deployDir,
  isRecord,
  isWorkload,
  kubectlAvailable,
  kubectlKustomize,
  kustomizationDirs,
  listFiles,
  loadKustomization,
  loadYamlDocs,
  memoryBytes,
  overlayDirs,
  rel,
  render,
  type Container,
  type K8sObject,
  type Labels,
  type Workload,
} from './deploy-fixtures.js';

const DNS1123 = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const PORT_NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

/** Which role each file under deploy/ plays, from the kustomizations that use it. */
function classifyFiles(): { resources: Set<string>; patches: Set<string>; generated: Set<string> } {
  const resources = new Set<string>();
  const patches = new Set<string>();
  const generated = new Set<string>();
  for (const dir of kustomizationDirs()) {
    const k = loadKustomization(dir);
    for (const r of k.resources ?? []) {
      const full = resolve(dir, r);
      if (!basename(full).includes('.')) continue; // a directory (checked by the renderers)
      resources.add(full);
    }
    for (const p of k.patches ?? []) patches.add(resolve(dir, p.path));
    for (const g of k.configMapGenerator ?? []) for (const f of g.files) generated.add(resolve(dir, f));
  }
  return { resources, patches, generated };
}

function resourceObjects(): { file: string; obj: K8sObject }[] {
  const { resources } = classifyFiles();
  return [...resources].sort().flatMap((file) => loadYamlDocs(file).map((obj) => ({ file, obj: obj as K8sObject })));
}

function renderedOverlay(dir: string): K8sObject[] {
  return render(dir);
}

function selects(selector: Labels | undefined, labels: Labels | undefined): boolean {
  if (selector === undefined || Object.keys(selector).length === 0) return false;
  return Object.entries(selector).every(([k, v]) => labels?.[k] === v);
}

function podTemplates(objs: K8sObject[]): Workload[] {
  return objs.filter(isWorkload);
}

function containerPorts(w: Workload): { name?: string; port: number; container: string }[] {
  return w.spec.template.spec.containers.flatMap((c) =>
    (c.ports ?? []).map((p) => ({
      ...(p.name === undefined ? {} : { name: p.name }),
      port: p.containerPort,
      container: c.name,
    })),
  );
}

function cellquotaContainers(w: Workload): Container[] {
  return w.spec.template.spec.containers.filter((c) => c.image.replace(/:.*$/, '').endsWith('cellquota'));
}

void test('every YAML and JSON file under deploy/ parses, and each has a role: manifest, patch, generated config, kustomization or example', () => {
  const { resources, patches, generated } = classifyFiles();
  const files = listFiles(deployDir, (n) => /\.(ya?ml|json)$/.test(n));
  assert.ok(files.length > 20, `expected the deploy files, found ${files.length}`);
  for (const file of files) {
    if (file.endsWith('.json')) {
      assert.doesNotThrow(() => JSON.parse(readFileSync(file, 'utf8')) as unknown, rel(file));
    } else {
      assert.ok(loadYamlDocs(file).length > 0, `${rel(file)} holds no YAML document`);
    }
    const roles = [
      resources.has(file),
      patches.has(file),
      generated.has(file),
      basename(file) === 'kustomization.yaml',
      rel(file).startsWith('deploy/examples/'),
    ].filter(Boolean).length;
    assert.equal(
      roles,
      1,
      `${rel(file)} should have exactly one role (used by a kustomization, or an example), has ${roles}`,
    );
  }
  for (const f of [...resources, ...patches, ...generated])
    assert.ok(files.includes(f), `${rel(f)} is referenced by a kustomization but missing`);
});

void test('every manifest has apiVersion, kind and a valid metadata.name; multi-document files included', () => {
  const objs = resourceObjects();
  assert.ok(objs.length >= 15, `expected the manifests, found ${objs.length}`);
  for (const { file, obj } of objs) {
    const where = `${rel(file)} ${String(obj.kind)}/${String(at(obj, 'metadata', 'name'))}`;
    assert.equal(typeof obj.apiVersion, 'string', `${where}: apiVersion`);
    assert.match(obj.apiVersion, /^([a-z0-9.-]+\/)?v\d+((alpha|beta)\d+)?$/, `${where}: apiVersion`);
    assert.equal(typeof obj.kind, 'string', `${where}: kind`);
    assert.match(obj.kind, /^[A-Z][A-Za-z]+$/, `${where}: kind`);
    assert.ok(isRecord(obj.metadata), `${where}: metadata`);
    assert.equal(typeof obj.metadata.name, 'string', `${where}: metadata.name`);
    assert.ok(
      obj.metadata.name.length <= 63 && DNS1123.test(obj.metadata.name),
      `${where}: metadata.name must be a DNS-1123 name`,
    );
    for (const [k, v] of Object.entries(obj.metadata.labels ?? {}))
      assert.equal(typeof v, 'string', `${where}: label ${k} must be a string`);
  }
});

void test('every kustomization renders as part of an overlay, and the test renderer gives exactly what kubectl kustomize gives', () => {
  const overlays = overlayDirs();
  assert.deepEqual(overlays.map(rel).sort(), [
    'deploy/overlays/one-cell',
    'deploy/overlays/three-cells/ap-south',
    'deploy/overlays/three-cells/eu-west',
    'deploy/overlays/three-cells/us-east',
  ]);
  // Every base kustomization is part of an overlay, so rendering the overlays renders them all.
  const inOverlays = new Set<string>();
  const visit = (dir: string): void => {
    inOverlays.add(dir);
    for (const r of loadKustomization(dir).resources ?? []) if (!basename(r).includes('.')) visit(resolve(dir, r));
  };
  overlays.forEach(visit);
  assert.deepEqual(
    kustomizationDirs()
      .filter((d) => !inOverlays.has(d))
      .map(rel),
    [],
    'kustomizations no overlay uses',
  );
  for (const dir of overlays) assert.ok(render(dir).length > 0, `${rel(dir)} renders nothing`);
  if (!kubectlAvailable()) return; // the comparison needs kubectl
  // Generated ConfigMaps get a content hash suffix from kustomize (unless disabled); the test
  // renderer leaves it out. Everything else must be identical.
  const hashed = kustomizationDirs().flatMap((d) =>
    (loadKustomization(d).configMapGenerator ?? [])
      .filter((g) => g.options?.disableNameSuffixHash !== true)
      .map((g) => g.name),
  );
  const unhash = (objs: K8sObject[]): K8sObject[] => {
    let text = JSON.stringify(objs);
    for (const name of hashed) text = text.replace(new RegExp(`"${name}-[a-z0-9]{10}"`, 'g'), `"${name}"`);
    const out = JSON.parse(text) as K8sObject[];
    return out.sort((a, b) => `${a.kind}/${a.metadata.name}`.localeCompare(`${b.kind}/${b.metadata.name}`));
  };
  for (const dir of overlays)
    assert.deepEqual(
      unhash(render(dir)),
      unhash(kubectlKustomize(dir)),
      `${rel(dir)}: the test renderer differs from kubectl kustomize`,
    );
});

void test('workloads: every container has a name and an image, cellquota containers have args (the image has the ENTRYPOINT), selectors match, mounts and probes point at what exists', () => {
  for (const dir of overlayDirs()) {
    const objs = renderedOverlay(dir);
    const workloads = podTemplates(objs);
    assert.ok(workloads.length > 0, `${rel(dir)}: no workload`);
    for (const w of workloads) {
      const where = `${rel(dir)} ${w.kind}/${w.metadata.name}`;
      const pod = w.spec.template.spec;
      assert.ok(
        selects(w.spec.selector.matchLabels, w.spec.template.metadata.labels),
        `${where}: the selector must match the template's labels`,
      );
      assert.ok(pod.containers.length > 0, `${where}: containers`);
      const volumes = new Set([
        ...(pod.volumes ?? []).map((v) => v.name),
        ...(w.spec.volumeClaimTemplates ?? []).map((v) => v.metadata.name),
      ]);
      for (const c of pod.containers) {
        assert.match(c.name, PORT_NAME, `${where}: container name`);
        assert.ok(typeof c.image === 'string' && c.image.length > 0, `${where}/${c.name}: image`);
        assert.ok(
          !c.image.endsWith(':latest') && c.image.includes(':'),
          `${where}/${c.name}: pin the image tag (${c.image})`,
        );
        for (const p of c.ports ?? []) {
          assert.ok(
            Number.isInteger(p.containerPort) && p.containerPort > 0 && p.containerPort < 65536,
            `${where}/${c.name}: port ${p.containerPort}`,
          );
          if (p.name !== undefined)
            assert.ok(p.name.length <= 15 && PORT_NAME.test(p.name), `${where}/${c.name}: port name ${p.name}`);
        }
        for (const m of c.volumeMounts ?? [])
          assert.ok(volumes.has(m.name), `${where}/${c.name}: mount of unknown volume ${m.name}`);
        const names = new Set(pod.containers.flatMap((x) => (x.ports ?? []).map((p) => p.name)));
        const numbers = new Set(pod.containers.flatMap((x) => (x.ports ?? []).map((p) => p.containerPort)));
        for (const probe of [c.livenessProbe, c.readinessProbe, c.startupProbe]) {
          const port = probe?.httpGet?.port ?? probe?.tcpSocket?.port;
          if (port === undefined) continue;
          assert.ok(
            typeof port === 'string' ? names.has(port) : numbers.has(port),
            `${where}/${c.name}: probe port ${String(port)} is not a container port`,
          );
        }
        for (const v of pod.volumes ?? []) {
          if (v.configMap !== undefined)
            assert.ok(
              objs.some((o) => o.kind === 'ConfigMap' && o.metadata.name === v.configMap?.name),
              `${where}: volume ${v.name} names ConfigMap ${v.configMap.name}, which the overlay does not create`,
            );
        }
      }
      for (const c of cellquotaContainers(w)) {
        assert.equal(c.command, undefined, `${where}/${c.name}: keep the image's ENTRYPOINT (node bin/cellquota.mjs)`);
        assert.ok((c.args ?? []).length > 0, `${where}/${c.name}: args`);
        assert.ok(
          ['coordinator', 'agent'].includes(c.args?.[0] ?? ''),
          `${where}/${c.name}: the first arg is the subcommand`,
        );
      }
    }
  }
});

void test('pods are restricted: non-root, seccomp RuntimeDefault, no privilege escalation, read-only root, all capabilities dropped, no service account token', () => {
  for (const dir of overlayDirs()) {
    for (const w of podTemplates(renderedOverlay(dir))) {
      const where = `${rel(dir)} ${w.kind}/${w.metadata.name}`;
      const pod = w.spec.template.spec;
      assert.equal(pod.securityContext?.runAsNonRoot, true, `${where}: runAsNonRoot`);
      assert.ok((pod.securityContext?.runAsUser ?? 0) > 0, `${where}: a numeric non-root runAsUser`);
      assert.equal(pod.securityContext?.seccompProfile?.type, 'RuntimeDefault', `${where}: seccomp`);
      assert.equal(pod.automountServiceAccountToken, false, `${where}: no API token`);
      for (const c of pod.containers) {
        const sc = c.securityContext;
        assert.equal(sc?.allowPrivilegeEscalation, false, `${where}/${c.name}: allowPrivilegeEscalation`);
        assert.equal(sc?.readOnlyRootFilesystem, true, `${where}/${c.name}: readOnlyRootFilesystem`);
        assert.notEqual(sc?.privileged, true, `${where}/${c.name}: privileged`);
        assert.deepEqual(sc?.capabilities?.drop, ['ALL'], `${where}/${c.name}: drop ALL capabilities`);
        assert.equal(sc?.capabilities?.add, undefined, `${where}/${c.name}: no capability added`);
      }
    }
  }
});

// Measured resident memory (deploy/README.md, "Sizing"): the limits keep ≥ 1.5 × the peak.
const MEASURED_PEAK_MIB = { coordinator: 303, agent: 415 };

void test('memory requests and limits are set, sized from the measured peaks, and the coordinator heap limit fits in its container', () => {
  for (const dir of overlayDirs()) {
    for (const w of podTemplates(renderedOverlay(dir))) {
      for (const c of w.spec.template.spec.containers) {
        const where = `${rel(dir)} ${w.metadata.name}/${c.name}`;
        const req = c.resources?.requests?.['memory'];
        const lim = c.resources?.limits?.['memory'];
        assert.ok(req !== undefined && lim !== undefined, `${where}: memory request and limit`);
        assert.ok(memoryBytes(req) <= memoryBytes(lim), `${where}: request ≤ limit`);
        assert.ok(c.resources?.requests?.['cpu'] !== undefined, `${where}: a CPU request`);
        const measured =
          c.name === 'coordinator'
            ? MEASURED_PEAK_MIB.coordinator
            : c.name === 'agent'
              ? MEASURED_PEAK_MIB.agent
              : null;
        if (measured !== null)
          assert.ok(
            memoryBytes(lim) >= 1.5 * measured * 1024 ** 2,
            `${where}: limit ${lim} under 1.5 × the measured ${measured} MiB`,
          );
        const heap = /--max-old-space-size=(\d+)/.exec(c.env?.find((e) => e.name === 'NODE_OPTIONS')?.value ?? '');
        if (heap !== null)
          assert.ok(
            Number(heap[1]) * 1024 ** 2 <= 0.75 * memoryBytes(lim),
            `${where}: the V8 heap limit leaves room for native memory`,
          );
      }
    }
  }
});

void test('Services, NetworkPolicies, PodDisruptionBudgets and PodMonitors select pods of the overlay and name ports those pods have', () => {
  for (const dir of overlayDirs()) {
    const objs = renderedOverlay(dir);
    const workloads = podTemplates(objs);
    // The StatefulSet controller labels each pod with its name (statefulset.kubernetes.io/pod-name).
    const podsOf = (sel: Labels | undefined): Workload[] => {
      const { ['statefulset.kubernetes.io/pod-name']: podName, ...rest } = sel ?? {};
      return workloads.filter((w) => {
        if (podName === undefined) return selects(sel, w.spec.template.metadata.labels);
        const ordinal = podName.startsWith(`${w.metadata.name}-`)
          ? Number(podName.slice(w.metadata.name.length + 1))
          : NaN;
        return (
          w.kind === 'StatefulSet' &&
          Number.isInteger(ordinal) &&
          ordinal >= 0 &&
          ordinal < (w.spec.replicas ?? 1) &&
          Object.entries(rest).every(([k, v]) => w.spec.template.metadata.labels[k] === v)
        );
      });
    };
    for (const o of objs) {
      const where = `${rel(dir)} ${o.kind}/${o.metadata.name}`;
      if (o.kind === 'Service') {
        const pods = podsOf(at(o, 'spec', 'selector') as Labels | undefined);
        assert.ok(pods.length > 0, `${where}: selects no pod`);
        for (const p of (at(o, 'spec', 'ports') as { port: number; targetPort?: string | number }[] | undefined) ??
          []) {
          const target = p.targetPort ?? p.port;
          assert.ok(
            pods.every((w) =>
              containerPorts(w).some((cp) => (typeof target === 'string' ? cp.name === target : cp.port === target)),
            ),
            `${where}: targetPort ${String(target)} missing on the selected pods`,
          );
        }
      } else if (o.kind === 'NetworkPolicy' || o.kind === 'PodDisruptionBudget' || o.kind === 'PodMonitor') {
        const sel = (
          o.kind === 'NetworkPolicy'
            ? at(o, 'spec', 'podSelector', 'matchLabels')
            : at(o, 'spec', 'selector', 'matchLabels')
        ) as Labels | undefined;
        const pods = podsOf(sel);
        assert.ok(pods.length > 0, `${where}: selects no pod`);
        if (o.kind === 'NetworkPolicy') {
          for (const rule of (at(o, 'spec', 'ingress') as { ports?: { port: number }[] }[] | undefined) ?? []) {
            for (const p of rule.ports ?? [])
              assert.ok(
                pods.every((w) => containerPorts(w).some((cp) => cp.port === p.port)),
                `${where}: port ${p.port} is not a container port`,
              );
          }
        }
        if (o.kind === 'PodMonitor') {
          for (const e of (at(o, 'spec', 'podMetricsEndpoints') as { port: string }[] | undefined) ?? []) {
            assert.ok(
              pods.every((w) => containerPorts(w).some((cp) => cp.name === e.port)),
              `${where}: port ${e.port} missing`,
            );
          }
        }
      }
    }
  }
});

function coordinatorOf(objs: K8sObject[]): Workload {
  const sts = objs.filter(
    (o): o is Workload => o.kind === 'StatefulSet' && o.metadata.name === 'cellquota-coordinator',
  );
  assert.equal(sts.length, 1, 'one coordinator StatefulSet');
  return sts[0] as Workload;
}

void test('the coordinator: 3 replicas started in parallel, a headless Service publishing not-ready pods, a volume each, PDB minAvailable 2, one replica per node, /readyz and /healthz probes', () => {
  for (const dir of overlayDirs()) {
    const objs = renderedOverlay(dir);
    if (!objs.some((o) => o.kind === 'StatefulSet')) continue; // a cell without the coordinator
    const sts = coordinatorOf(objs);
    const where = `${rel(dir)} StatefulSet/cellquota-coordinator`;
    assert.equal(sts.spec.replicas, 3, where);
    assert.equal(
      sts.spec.podManagementPolicy,
      'Parallel',
      `${where}: a replica is Ready only once a quorum elected a leader`,
    );
    const svc = objs.find((o) => o.kind === 'Service' && o.metadata.name === sts.spec.serviceName);
    assert.ok(svc !== undefined, `${where}: serviceName ${String(sts.spec.serviceName)} must exist`);
    assert.equal(at(svc, 'spec', 'clusterIP'), 'None', 'headless');
    assert.equal(at(svc, 'spec', 'publishNotReadyAddresses'), true, 'peers must resolve before anyone is Ready');
    const claim = sts.spec.volumeClaimTemplates?.[0];
    assert.ok(claim !== undefined, `${where}: a PersistentVolumeClaim per replica`);
    const c = sts.spec.template.spec.containers.find((x) => x.name === 'coordinator');
    assert.ok(c !== undefined);
    const dataMount = c.volumeMounts?.find((m) => m.name === claim.metadata.name);
    assert.ok(dataMount !== undefined, `${where}: the claim is mounted`);
    assert.ok((c.args ?? []).includes(`--data-dir=${dataMount.mountPath}`), `${where}: --data-dir on the claim`);
    const pdb = objs.find(
      (o) =>
        o.kind === 'PodDisruptionBudget' &&
        selects(at(o, 'spec', 'selector', 'matchLabels') as Labels, sts.spec.template.metadata.labels),
    );
    assert.ok(pdb !== undefined, `${where}: a PodDisruptionBudget`);
    assert.equal(at(pdb, 'spec', 'minAvailable'), 2);
    const anti = sts.spec.template.spec.affinity?.podAntiAffinity?.requiredDuringSchedulingIgnoredDuringExecution ?? [];
    assert.ok(
      anti.some(
        (t) =>
          t.topologyKey === 'kubernetes.io/hostname' &&
          selects(t.labelSelector?.matchLabels, sts.spec.template.metadata.labels),
      ),
      `${where}: required anti-affinity across nodes`,
    );
    assert.equal(c.readinessProbe?.httpGet?.path, '/readyz');
    assert.equal(c.livenessProbe?.httpGet?.path, '/healthz');
    const adminPort = c.ports?.find((p) => p.name === 'admin')?.containerPort;
    const preStop = (c.lifecycle?.preStop?.exec?.command ?? []).join(' ');
    assert.ok(
      preStop.includes(`ctl --admin http://127.0.0.1:${String(adminPort)} transfer-leadership`),
      `${where}: preStop transfers leadership through the local admin API`,
    );
    assert.ok(
      preStop.includes(`127.0.0.1:${String(adminPort)}/v1/cluster?stale=true`) &&
        preStop.includes('c.leader === c.self'),
      `${where}: preStop acts only on the leader (ctl follows a follower's 307)`,
    );
  }
});

void test('the agent: one replica per cell, never two at once (Recreate), its Envoy sidecar shares the socket directory', () => {
  for (const dir of overlayDirs()) {
    const objs = renderedOverlay(dir);
    const d = objs.find((o): o is Workload => o.kind === 'Deployment' && o.metadata.name === 'cellquota-agent');
    assert.ok(d !== undefined, `${rel(dir)}: every cell runs an agent`);
    assert.equal(d.spec.replicas, 1);
    assert.equal(d.spec.strategy?.type, 'Recreate');
    const agent = d.spec.template.spec.containers.find((c) => c.name === 'agent');
    const envoy = d.spec.template.spec.containers.find((c) => c.name === 'envoy');
    assert.ok(agent !== undefined && envoy !== undefined);
    const sockets = d.spec.template.spec.volumes?.find(
      (v) =>
        v.emptyDir !== undefined &&
        agent.volumeMounts?.some((m) => m.name === v.name && m.mountPath === '/run/cellquota'),
    );
    assert.ok(sockets !== undefined, 'the socket directory is an emptyDir');
    assert.ok(
      envoy.volumeMounts?.some((m) => m.name === sockets.name && m.mountPath === '/run/cellquota'),
      'Envoy mounts the same directory at the same path',
    );
  }
});

interface IngressRule {
  from?: {
    podSelector?: { matchLabels?: Labels };
    namespaceSelector?: { matchLabels?: Labels };
    ipBlock?: { cidr: string };
  }[];
  ports?: { port: number; protocol?: string }[];
}

void test('NetworkPolicies: coordinators admit peers on 7001 (Raft), agents on 7002 (leases) only, peers, admin clients and Prometheus on 8081, nothing else; agents admit their Envoys on the RLS ports and Prometheus', () => {
  const base = renderedOverlay(join(deployDir, 'overlays/one-cell'));
  const np = (name: string): IngressRule[] => {
    const o = base.find((x) => x.kind === 'NetworkPolicy' && x.metadata.name === name);
    assert.ok(o !== undefined, name);
    assert.deepEqual(at(o, 'spec', 'policyTypes'), ['Ingress']);
    return at(o, 'spec', 'ingress') as IngressRule[];
  };
  const component = (r: IngressRule): string[] =>
    (r.from ?? []).map(
      (f) =>
        f.podSelector?.matchLabels?.['app.kubernetes.io/component'] ??
        f.podSelector?.matchLabels?.['cellquota.io/admin-client'] ??
        f.podSelector?.matchLabels?.['app.kubernetes.io/name'] ??
        f.podSelector?.matchLabels?.['cellquota.io/envoy'] ??
        '?',
    );
  const admitted = (rules: IngressRule[], port: number): string[] =>
    rules
      .filter((r) => (r.ports ?? []).some((p) => p.port === port))
      .flatMap(component)
      .sort();
  const coord = np('cellquota-coordinator');
  assert.ok(
    coord.every((r) => (r.from ?? []).length > 0),
    'every coordinator rule names its sources',
  );
  assert.deepEqual([...new Set(coord.flatMap((r) => (r.ports ?? []).map((p) => p.port)))].sort(), [7001, 7002, 8081]);
  assert.deepEqual(admitted(coord, 7001), ['coordinator'], 'the Raft port is closed to the agents');
  assert.deepEqual(admitted(coord, 7002), ['agent'], 'the agents reach the lease port only');
  assert.deepEqual(admitted(coord, 8081), ['coordinator', 'prometheus', 'true']);
  const agent = np('cellquota-agent');
  assert.deepEqual(admitted(agent, 8089), ['true']);
  assert.deepEqual(admitted(agent, 8090), ['true']);
  assert.deepEqual(admitted(agent, 9091), ['prometheus']);
  const euWest = renderedOverlay(join(deployDir, 'overlays/three-cells/eu-west'));
  const remote = (
    at(
      euWest.find((x) => x.kind === 'NetworkPolicy' && x.metadata.name === 'cellquota-coordinator'),
      'spec',
      'ingress',
    ) as IngressRule[]
  ).filter((r) => (r.from ?? []).some((f) => f.ipBlock !== undefined));
  assert.equal(remote.length, 1, 'eu-west admits the remote cells');
  assert.deepEqual(
    remote[0]?.ports?.map((p) => p.port),
    [7002],
    'remote cells reach only the lease port',
  );
});

void test('kustomizations reference only files inside their own tree or other kustomization directories', () => {
  for (const dir of kustomizationDirs()) {
    const k = loadKustomization(dir);
    for (const r of k.resources ?? []) {
      const full = resolve(dir, r);
      if (!basename(full).includes('.'))
        assert.ok(kustomizationDirs().includes(full), `${rel(dir)}: resource ${r} is not a kustomization directory`);
      else
        assert.ok(
          full.startsWith(`${dir}/`),
          `${rel(dir)}: resource file ${r} outside the kustomization root (kustomize's load restrictor)`,
        );
    }
    for (const g of k.configMapGenerator ?? [])
      for (const f of g.files)
        assert.ok(
          resolve(dir, f).startsWith(`${dir}/`),
          `${rel(dir)}: generator file ${f} outside the kustomization root`,
        );
  }
});
