// Shared by the deploy tests: reading the YAML under deploy/, rendering the Kustomize overlays (with
// the small renderer below, which covers exactly the Kustomize features deploy/ uses and is checked
// against `kubectl kustomize` where kubectl is installed), and turning a pod template into the argv and environment
// its container's process would see (Kubernetes' $(VAR) expansion, the downward API).
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { basename, dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const deployDir = join(repoRoot, 'deploy');

// ---- Kubernetes object shapes (the subset the tests read) ---------------------------------------

export type Labels = Record<string, string>;

export interface Meta {
  name: string;
  namespace?: string;
  labels?: Labels;
  annotations?: Labels;
}

export interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: Meta;
  [key: string]: unknown;
}

export interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: {
    fieldRef?: { fieldPath: string };
    secretKeyRef?: { name: string; key: string; optional?: boolean };
    configMapKeyRef?: { name: string; key: string; optional?: boolean };
  };
}

export interface ContainerPort {
  name?: string;
  containerPort: number;
  protocol?: string;
}

export interface Probe {
  httpGet?: { path: string; port: string | number };
  tcpSocket?: { port: string | number };
  exec?: { command: string[] };
}

export interface SecurityContext {
  runAsNonRoot?: boolean;
  runAsUser?: number;
  runAsGroup?: number;
  allowPrivilegeEscalation?: boolean;
  readOnlyRootFilesystem?: boolean;
  privileged?: boolean;
  capabilities?: { drop?: string[]; add?: string[] };
  seccompProfile?: { type: string };
}

export interface Container {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  env?: EnvVar[];
  ports?: ContainerPort[];
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  securityContext?: SecurityContext;
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean }[];
  livenessProbe?: Probe;
  readinessProbe?: Probe;
  startupProbe?: Probe;
  lifecycle?: { preStop?: { exec?: { command: string[] } } };
}

export interface Volume {
  name: string;
  emptyDir?: { medium?: string; sizeLimit?: string };
  configMap?: { name: string };
  secret?: { secretName: string };
  persistentVolumeClaim?: { claimName: string };
}

export interface PodSpec {
  containers: Container[];
  initContainers?: Container[];
  volumes?: Volume[];
  securityContext?: SecurityContext & { fsGroup?: number };
  serviceAccountName?: string;
  automountServiceAccountToken?: boolean;
  enableServiceLinks?: boolean;
  hostAliases?: { ip: string; hostnames: string[] }[];
  affinity?: {
    podAntiAffinity?: {
      requiredDuringSchedulingIgnoredDuringExecution?: {
        topologyKey: string;
        labelSelector?: { matchLabels?: Labels };
      }[];
    };
  };
}

export interface Workload extends K8sObject {
  spec: {
    replicas?: number;
    serviceName?: string;
    podManagementPolicy?: string;
    strategy?: { type: string };
    selector: { matchLabels: Labels };
    template: { metadata: { labels: Labels }; spec: PodSpec };
    volumeClaimTemplates?: { metadata: { name: string }; spec: { resources: { requests: { storage: string } } } }[];
  };
}

export function isWorkload(o: K8sObject): o is Workload {
  return ['Deployment', 'StatefulSet', 'DaemonSet'].includes(o.kind);
}

// ---- Small accessors for untyped YAML ------------------------------------------------------------

export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The value at `path` (object keys and array indexes), or undefined. */
export function at(v: unknown, ...path: (string | number)[]): unknown {
  let cur: unknown = v;
  for (const p of path) {
    if (typeof p === 'number') cur = Array.isArray(cur) ? (cur as unknown[])[p] : undefined;
    else cur = isRecord(cur) ? cur[p] : undefined;
  }
  return cur;
}

export function asArray(v: unknown): unknown[] {
  return Array.isArray(v) ? (v as unknown[]) : [];
}

/** Every value in a parsed document, depth first (for "find every expr"). */
export function* walk(v: unknown): Generator<[string, unknown]> {
  if (Array.isArray(v)) {
    for (const item of v as unknown[]) yield* walk(item);
  } else if (isRecord(v)) {
    for (const [k, item] of Object.entries(v)) {
      yield [k, item];
      yield* walk(item);
    }
  }
}

// ---- Files ----------------------------------------------------------------------------------------

export function listFiles(dir: string, test: (name: string) => boolean): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir).sort()) {
    const full = join(dir, name);
    if (statSync(full).isDirectory()) out.push(...listFiles(full, test));
    else if (test(name)) out.push(full);
  }
  return out;
}

export function rel(file: string): string {
  return relative(repoRoot, file);
}

/** Every YAML document of a file (multi-document files included); a syntax error throws. */
export function loadYamlDocs(file: string): unknown[] {
  const docs = parseAllDocuments(readFileSync(file, 'utf8'), { prettyErrors: true });
  if (!Array.isArray(docs)) return [];
  const out: unknown[] = [];
  for (const d of docs) {
    if (d.errors.length > 0) throw new Error(`${rel(file)}: ${d.errors.map((e) => e.message).join('; ')}`);
    const js: unknown = d.toJS();
    if (js !== null && js !== undefined) out.push(js);
  }
  return out;
}

export function loadYaml(file: string): unknown {
  const docs = loadYamlDocs(file);
  if (docs.length !== 1) throw new Error(`${rel(file)}: expected one YAML document, found ${docs.length}`);
  return docs[0];
}

// ---- Kustomize ----------------------------------------------------------------------------------

export interface Kustomization {
  apiVersion?: string;
  kind?: string;
  namespace?: string;
  resources?: string[];
  patches?: { path: string; target?: { group?: string; version?: string; kind: string; name: string } }[];
  images?: { name: string; newName?: string; newTag?: string }[];
  labels?: { pairs: Labels; includeSelectors?: boolean }[];
  configMapGenerator?: {
    name: string;
    files: string[];
    options?: { disableNameSuffixHash?: boolean; labels?: Labels };
  }[];
}

/** The Kustomize fields deploy/ uses; the fallback renderer refuses anything else. */
export const KUSTOMIZATION_FIELDS = [
  'apiVersion',
  'kind',
  'namespace',
  'resources',
  'patches',
  'images',
  'labels',
  'configMapGenerator',
];

export function kustomizationDirs(): string[] {
  return listFiles(deployDir, (n) => n === 'kustomization.yaml').map((f) => dirname(f));
}

export function loadKustomization(dir: string): Kustomization {
  const k: unknown = loadYaml(join(dir, 'kustomization.yaml'));
  if (!isRecord(k)) throw new Error(`${rel(dir)}/kustomization.yaml is not a mapping`);
  for (const key of Object.keys(k)) {
    if (!KUSTOMIZATION_FIELDS.includes(key))
      throw new Error(`${rel(dir)}/kustomization.yaml: field '${key}' is not covered by the test renderer`);
  }
  return k;
}

/** Overlays: kustomizations under deploy/overlays. */
export function overlayDirs(): string[] {
  return kustomizationDirs().filter((d) => rel(d).startsWith('deploy/overlays/'));
}

let kubectlChecked: boolean | null = null;

export function kubectlAvailable(): boolean {
  if (kubectlChecked === null) {
    // DEPLOY_TESTS_WITHOUT_KUBECTL=1 exercises the fallback renderer on a machine that has kubectl.
    if (process.env['DEPLOY_TESTS_WITHOUT_KUBECTL'] === '1') return (kubectlChecked = false);
    const r = spawnSync('kubectl', ['version', '--client'], { encoding: 'utf8', timeout: 10_000 });
    kubectlChecked = r.status === 0;
  }
  return kubectlChecked;
}

/** `kubectl kustomize DIR`, parsed. */
export function kubectlKustomize(dir: string): K8sObject[] {
  const r = spawnSync('kubectl', ['kustomize', dir], {
    encoding: 'utf8',
    timeout: 30_000,
    maxBuffer: 64 * 1024 * 1024,
  });
  if (r.status !== 0) throw new Error(`kubectl kustomize ${rel(dir)} failed: ${r.stderr}`);
  const docs = parseAllDocuments(r.stdout);
  if (!Array.isArray(docs)) return [];
  return docs.map((d) => d.toJS() as unknown).filter((d) => d !== null) as K8sObject[];
}

const CLUSTER_SCOPED = new Set([
  'Namespace',
  'ClusterRole',
  'ClusterRoleBinding',
  'CustomResourceDefinition',
  'PriorityClass',
  'StorageClass',
]);

/**
 * Renders a kustomization the way `kubectl kustomize` does, for the features deploy/ uses:
 * resources (files and directories), labels (metadata only), configMapGenerator (without the hash
 * suffix), strategic-merge patches of workloads (lists merged by `name`, patched entries first, as
 * kustomize orders them), JSON 6902 `add` patches, namespace and images.
 */
export function renderFallback(dir: string): K8sObject[] {
  const k = loadKustomization(dir);
  const objs: K8sObject[] = [];
  for (const r of k.resources ?? []) {
    const full = resolve(dir, r);
    if (statSync(full).isDirectory()) objs.push(...renderFallback(full));
    else objs.push(...(loadYamlDocs(full) as K8sObject[]));
  }
  for (const g of k.configMapGenerator ?? []) {
    const data: Record<string, string> = {};
    for (const f of g.files) data[basename(f)] = readFileSync(resolve(dir, f), 'utf8');
    objs.push({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: g.name, ...(g.options?.labels === undefined ? {} : { labels: { ...g.options.labels } }) },
      data,
    });
  }
  for (const l of k.labels ?? []) {
    for (const o of objs) o.metadata.labels = { ...(o.metadata.labels ?? {}), ...l.pairs };
  }
  for (const p of k.patches ?? []) {
    const patch = loadYaml(resolve(dir, p.path));
    if (Array.isArray(patch)) {
      if (p.target === undefined) throw new Error(`${p.path}: a JSON 6902 patch needs a target`);
      const { kind, name } = p.target;
      const target = objs.find((o) => o.kind === kind && o.metadata.name === name);
      if (target === undefined) throw new Error(`${p.path}: no ${kind} ${name} to patch`);
      for (const op of patch as unknown[]) applyJsonPatchOp(target, op);
    } else {
      const pm = patch as K8sObject;
      const target = objs.find((o) => o.kind === pm.kind && o.metadata.name === pm.metadata.name);
      if (target === undefined) throw new Error(`${p.path}: no ${pm.kind} ${pm.metadata.name} to patch`);
      const merged = strategicMerge(target, pm) as K8sObject;
      objs[objs.indexOf(target)] = merged;
    }
  }
  if (k.namespace !== undefined) {
    for (const o of objs) {
      if (CLUSTER_SCOPED.has(o.kind)) {
        if (o.kind === 'Namespace') o.metadata.name = k.namespace;
      } else {
        o.metadata.namespace = k.namespace;
      }
    }
  }
  for (const img of k.images ?? []) {
    for (const o of objs) {
      if (!isWorkload(o)) continue;
      for (const c of [...o.spec.template.spec.containers, ...(o.spec.template.spec.initContainers ?? [])]) {
        const [name, tag] = splitImage(c.image);
        if (name === img.name)
          c.image = `${img.newName ?? name}${(img.newTag ?? tag) === undefined ? '' : `:${img.newTag ?? tag}`}`;
      }
    }
  }
  return objs;
}

export function splitImage(image: string): [string, string | undefined] {
  const slash = image.lastIndexOf('/');
  const colon = image.lastIndexOf(':');
  return colon > slash ? [image.slice(0, colon), image.slice(colon + 1)] : [image, undefined];
}

function strategicMerge(base: unknown, patch: unknown): unknown {
  if (isRecord(base) && isRecord(patch)) {
    const out: Record<string, unknown> = { ...base };
    for (const [key, value] of Object.entries(patch)) out[key] = key in base ? strategicMerge(base[key], value) : value;
    return out;
  }
  if (
    Array.isArray(base) &&
    Array.isArray(patch) &&
    [...(base as unknown[]), ...(patch as unknown[])].every((e) => isRecord(e) && typeof e['name'] === 'string')
  ) {
    const named = (e: unknown): string => (e as { name: string }).name;
    const patched = (patch as unknown[]).map((p) => {
      const b = (base as unknown[]).find((e) => named(e) === named(p));
      return b === undefined ? p : strategicMerge(b, p);
    });
    const rest = (base as unknown[]).filter((e) => !(patch as unknown[]).some((p) => named(p) === named(e)));
    return [...patched, ...rest];
  }
  return patch;
}

function applyJsonPatchOp(target: K8sObject, op: unknown): void {
  if (!isRecord(op) || op['op'] !== 'add' || typeof op['path'] !== 'string')
    throw new Error(`unsupported JSON patch operation ${JSON.stringify(op)}`);
  const parts = op['path'].split('/').slice(1);
  const last = parts.pop();
  let cur: unknown = target;
  for (const p of parts) cur = at(cur, p);
  if (last === '-' && Array.isArray(cur)) (cur as unknown[]).push(op['value']);
  else if (isRecord(cur) && last !== undefined) cur[last] = op['value'];
  else throw new Error(`JSON patch path ${op['path']} does not exist`);
}

const renderCache = new Map<string, K8sObject[]>();

/**
 * A kustomization rendered by renderFallback (memoized; a fresh copy each call). The tests read
 * this rendering — fast and the same everywhere — and manifests.test.ts checks that it equals
 * `kubectl kustomize` (but for the generated ConfigMaps' hash suffixes) where kubectl is installed.
 */
export function render(dir: string): K8sObject[] {
  let r = renderCache.get(dir);
  if (r === undefined) {
    r = renderFallback(dir);
    renderCache.set(dir, r);
  }
  return structuredClone(r);
}

// ---- A container's process: argv and environment -------------------------------------------------

export interface PodContext {
  readonly podName: string;
  readonly namespace: string;
  readonly podIP?: string;
  /** Values of secretKeyRef variables; a missing optional one is left out, as the kubelet does. */
  readonly secrets?: Record<string, Record<string, string>>;
}

/** Kubernetes' $(VAR) expansion: defined variables are replaced, $$ is a literal $, the rest stays. */
export function expandK8s(text: string, vars: ReadonlyMap<string, string>): string {
  return text.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (m: string, name: string | undefined) =>
    m === '$$' ? '$' : ((name !== undefined ? vars.get(name) : undefined) ?? m),
  );
}

/**
 * The environment of a container as the kubelet builds it: in order, each value expanded with the
 * variables defined before it; fieldRef from the pod context; secretKeyRef from ctx.secrets.
 */
export function containerEnv(c: Container, ctx: PodContext): Map<string, string> {
  const env = new Map<string, string>();
  for (const e of c.env ?? []) {
    if (e.value !== undefined) {
      env.set(e.name, expandK8s(e.value, env));
      continue;
    }
    const from = e.valueFrom;
    if (from?.fieldRef !== undefined) {
      const field = from.fieldRef.fieldPath;
      const v =
        field === 'metadata.name'
          ? ctx.podName
          : field === 'metadata.namespace'
            ? ctx.namespace
            : field === 'status.podIP'
              ? (ctx.podIP ?? '10.0.0.10')
              : undefined;
      if (v === undefined) throw new Error(`env ${e.name}: fieldRef ${field} is not simulated`);
      env.set(e.name, v);
    } else if (from?.secretKeyRef !== undefined) {
      const { name, key, optional } = from.secretKeyRef;
      const v = ctx.secrets?.[name]?.[key];
      if (v !== undefined) env.set(e.name, v);
      else if (optional !== true) throw new Error(`env ${e.name}: secret ${name}/${key} is required`);
    } else if (from?.configMapKeyRef !== undefined) {
      throw new Error(`env ${e.name}: configMapKeyRef is not simulated`);
    } else {
      env.set(e.name, '');
    }
  }
  return env;
}

/** The args of a container after $(VAR) expansion with its environment. */
export function containerArgs(c: Container, env: ReadonlyMap<string, string>): string[] {
  return (c.args ?? []).map((a) => expandK8s(a, env));
}

export function toProcessEnv(env: ReadonlyMap<string, string>): NodeJS.ProcessEnv {
  return Object.fromEntries(env);
}

// ---- Quantities ---------------------------------------------------------------------------------

/** A Kubernetes memory quantity in bytes (Ki/Mi/Gi/Ti, k/M/G or plain bytes). */
export function memoryBytes(q: string): number {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(q);
  if (m === null) throw new Error(`not a memory quantity: ${q}`);
  const unit = m[2] ?? '';
  const mult: Record<string, number> = {
    '': 1,
    Ki: 1024,
    Mi: 1024 ** 2,
    Gi: 1024 ** 3,
    Ti: 1024 ** 4,
    k: 1e3,
    M: 1e6,
    G: 1e9,
    T: 1e12,
  };
  return Number(m[1]) * (mult[unit] ?? NaN);
}

export function fileExists(path: string): boolean {
  return existsSync(path);
}

// ---- Envoy configs --------------------------------------------------------------------------------

/** Every HTTP filter of every listener's HTTP connection manager. */
export function httpFilters(envoy: unknown): unknown[] {
  return asArray(at(envoy, 'static_resources', 'listeners')).flatMap((l) =>
    asArray(at(l, 'filter_chains')).flatMap((fc) =>
      asArray(at(fc, 'filters')).flatMap((f) => asArray(at(f, 'typed_config', 'http_filters'))),
    ),
  );
}

export function findRateLimitFilter(envoy: unknown): unknown {
  const f = httpFilters(envoy).find((hf) => at(hf, 'name') === 'envoy.filters.http.ratelimit');
  if (f === undefined) throw new Error('no envoy.filters.http.ratelimit filter');
  return f;
}

/** The Unix socket paths of every `pipe` address, in order. */
export function pipePaths(envoy: unknown): string[] {
  const out: string[] = [];
  for (const [k, v] of walk(envoy))
    if (k === 'pipe' && typeof at(v, 'path') === 'string') out.push(at(v, 'path') as string);
  return out;
}

/** The descriptor keys the routes' rate_limits actions produce. */
export function descriptorKeys(envoy: unknown): string[] {
  const keys = new Set<string>();
  for (const [k, v] of walk(at(envoy, 'static_resources', 'listeners'))) {
    if (k === 'request_headers' && typeof at(v, 'descriptor_key') === 'string')
      keys.add(at(v, 'descriptor_key') as string);
    if (k === 'remote_address') keys.add('remote_address');
  }
  return [...keys];
}
