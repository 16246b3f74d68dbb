// The agent's settings: every flag of `cellquota agent`, also settable as CELLQUOTA_<FLAG> or in a
// config file (shared/cli-config.ts), validated by one zod schema. The schema takes the raw strings
// of flags and variables as well as typed values (config files, tests), and produces AgentConfig.
import { z } from 'zod';
import { ConfigError, parseHostPort } from '../shared/cli-config.js';
import type { SettingSpec } from '../shared/cli-config.js';
import { logLevels } from '../shared/logging.js';
import { DEFAULT_REQUEST_BOUNDS } from './decide/request-check.js';
import { parseUnknownTenantPolicy } from './decide/quotas.js';
import { RLS_SERVER_KINDS } from './rls/rls-common.js';
import { DEFAULT_OVERLOAD, MAX_OVERLOAD_ALLOWANCE, OVERLOAD_POLICIES } from './decide/overload.js';
import type { UnknownTenantPolicy } from './decide/quotas.js';
import { parseTrustedProxies } from '../shared/client-address.js';
import { DENY_STATUSES } from './front-door/forward-auth.js';
import type { DenyStatus } from './front-door/forward-auth.js';

export const AGENT_SETTING_SPECS: readonly SettingSpec[] = Object.freeze([
  { flag: 'cell', description: 'this cell\'s id, e.g. eu-west (required)' },
  { flag: 'rules', description: 'rules: a YAML file or a directory of them, envoyproxy/ratelimit format (required; hot-reloaded)' },
  { flag: 'rls-socket', description: 'Unix socket for the RLS gRPC server; worker i > 0 serves on <path>.<i>' },
  { flag: 'rls-listen', description: 'HOST:PORT for the RLS gRPC server over TCP; worker i serves on PORT+i (port 0: any free port each)' },
  { flag: 'http', description: 'HOST:PORT (or PORT alone: 127.0.0.1, loopback only) for the HTTP API (/v1/check, /v1/forward-auth, /metrics, /healthz); it has no authentication, so give a non-loopback host only on a trusted network' },
  { flag: 'coordinators', description: 'HOST:PORT,... (or ID=HOST:PORT,...) of the coordinators\' gRPC (peer) addresses; any one is enough to find the leader. With ids, the agent reaches the leader at its own address for that id rather than the address the coordinators know each other by (proxies, per-replica load balancers). Without it the agent runs alone on static slices' },
  { flag: 'tls-ca', description: 'CA of the coordinators\' certificates: the lease client speaks TLS to them' },
  { flag: 'tls-cert', description: 'this cell\'s client certificate (PEM) for mutual TLS; must name --cell (URI urn:cellquota:cell:<id>, or the CN)' },
  { flag: 'tls-key', description: 'the key of --tls-cert (PEM)' },
  { flag: 'tls-server-name', description: 'the name expected in the coordinators\' certificate when it is not the host dialled' },
  { flag: 'lease-token-file', description: 'a file holding this cell\'s bearer token for the lease service (instead of, or besides, a certificate)' },
  { flag: 'workers', description: 'gRPC serving threads, all sharing one bucket table (default 1; 0: no RLS server, the HTTP API only)' },
  { flag: 'rls-server', description: 'the RLS gRPC server: lean (gRPC framing on node:http2) | grpc-js (the previous server, kept for comparison) (default lean)' },
  { flag: 'socket-mode', description: 'permission bits of the Unix sockets, octal (default 0660)' },
  { flag: 'socket-owner', description: 'owner of the Unix sockets as UID[:GID] (numeric; needs the privilege to chown)' },
  { flag: 'tenants', description: 'static tiers and tenants (YAML: tiers, tenants, domainCap) for the global quotas of an agent running alone; refused with --coordinators (they hold every quota)' },
  { flag: 'unknown-tenant', description: 'alone: policy for a tenant not in the table: deny | allow | tier:NAME (default deny); refused with --coordinators (PUT /v1/settings sets it there)' },
  { flag: 'static-share', description: 'alone: this cell\'s share of every global quota, in (0, 1] (default 1); refused with --coordinators (the coordinator grants slices and floors)' },
  { flag: 'merge-domains', description: 'merge rule files that name the same domain into one (envoyproxy/ratelimit MERGE_DOMAIN_CONFIG); a descriptor defined in two of them is still an error naming both files. Default: two files of one domain are refused', boolean: true },
  { flag: 'response-headers', description: 'add RateLimit-Limit/-Remaining/-Reset to responses (envoyproxy/ratelimit LIMIT_RESPONSE_HEADERS_ENABLED)', boolean: true },
  { flag: 'log-level', description: `log level: ${logLevels.join(' | ')} (default info)` },
  { flag: 'table-capacity', description: 'bucket table capacity in keys, fixed shared memory of about 50 bytes per key (default 1000000)' },
  { flag: 'table-full', description: 'when the bucket table has no slot for a new key: open (pass, counted) | closed (refuse) (default open)' },
  { flag: 'velocity-capacity', description: 'global quotas tracked in the 500 ms velocity window (default 65536)' },
  { flag: 'lag-threshold-ms', description: 'event-loop lag beyond which a serving thread counts as overloaded and takes the overload path (--overload-policy); 0 disables (default 10)' },
  { flag: 'overload-policy', description: 'what an overloaded serving thread answers: bounded (each quota key admits at most its fail-open allowance, the rest is refused at once) | open (every check OK without deciding, the behaviour before; for comparison) (default bounded)' },
  { flag: 'overload-allowance', description: `bounded: each key's fail-open allowance while overloaded, as a multiple of its floor (global quota) or its rule's rate (local), one second deep; 0: refuse everything while overloaded, before decoding (default 1, at most ${MAX_OVERLOAD_ALLOWANCE})` },
  { flag: 'throttle-log-interval-ms', description: 'interval of the aggregated throttling log lines (default 10000)' },
  { flag: 'max-descriptors', description: `descriptors per request (default ${DEFAULT_REQUEST_BOUNDS.maxDescriptors})` },
  { flag: 'max-entries', description: `entries per descriptor (default ${DEFAULT_REQUEST_BOUNDS.maxEntries})` },
  { flag: 'max-key-length', description: `length of an entry key (default ${DEFAULT_REQUEST_BOUNDS.maxKeyLength})` },
  { flag: 'max-value-length', description: `length of an entry value (default ${DEFAULT_REQUEST_BOUNDS.maxValueLength})` },
  { flag: 'max-domain-length', description: `length of the domain (default ${DEFAULT_REQUEST_BOUNDS.maxDomainLength})` },
  { flag: 'max-message-bytes', description: 'largest gRPC request message in bytes (default 1048576)' },
  { flag: 'http-body-limit', description: 'largest HTTP request body in bytes (default 65536)' },
  { flag: 'routes', description: 'forward-auth routes: YAML mapping forwarded requests to descriptors with Envoy\'s rate-limit actions (default: [{remote_address: <client>}] in domain edge)' },
  { flag: 'trusted-proxies', description: 'addresses and CIDRs (comma-separated, or loopback, private, linklocal) whose X-Forwarded-For / X-Real-IP forward-auth believes (default loopback)' },
  { flag: 'forward-auth-deny-status', description: 'status of a forward-auth refusal: 429 | 401 | 403 (nginx auth_request passes only 401/403; default 429)' },
  { flag: 'rules-debounce-ms', description: 'quiet time after a rules file change before reloading (default 200)' },
]);

const hostPort = z.union([z.string(), z.object({ host: z.string().min(1), port: z.number().int().min(0).max(65535) })]).transform((v, ctx) => {
  if (typeof v !== 'string') return { host: v.host, port: v.port };
  const parsed = parseHostPort(v.trim());
  if (parsed === null) {
    ctx.addIssue({ code: 'custom', message: `'${v}' is not HOST:PORT with a port in 0..65535` });
    return z.NEVER;
  }
  return parsed;
});

const COORDINATOR_ID = /^[a-z0-9][a-z0-9-]{0,62}$/;

/** One configured coordinator: its gRPC address and, when given as ID=HOST:PORT, its replica id. */
export interface CoordinatorAddress {
  readonly host: string;
  readonly port: number;
  readonly id?: string;
}

const coordinators = z.union([z.string(), z.array(z.string())]).transform((v, ctx) => {
  const items = (typeof v === 'string' ? v.split(',') : v).map((s) => s.trim()).filter((s) => s !== '');
  const out: CoordinatorAddress[] = [];
  const ids = new Set<string>();
  for (const item of items) {
    const eq = item.indexOf('=');
    const id = eq < 0 ? undefined : item.slice(0, eq);
    if (id !== undefined && !COORDINATOR_ID.test(id)) {
      ctx.addIssue({ code: 'custom', message: `'${item}': the replica id before '=' must be lowercase letters, digits and dashes (as in the coordinators' --peers)` });
      return z.NEVER;
    }
    if (id !== undefined && ids.has(id)) {
      ctx.addIssue({ code: 'custom', message: `replica id '${id}' is listed twice` });
      return z.NEVER;
    }
    const parsed = parseHostPort(eq < 0 ? item : item.slice(eq + 1));
    if (parsed === null || parsed.port === 0) {
      ctx.addIssue({ code: 'custom', message: `'${item}' is not HOST:PORT (or ID=HOST:PORT) with a port in 1..65535` });
      return z.NEVER;
    }
    if (id !== undefined) ids.add(id);
    out.push(id === undefined ? parsed : { ...parsed, id });
  }
  return out;
});

const addressList = z.union([z.string(), z.array(z.string())]).transform((v, ctx) => {
  const items = (typeof v === 'string' ? v.split(',') : v).map((s) => s.trim()).filter((s) => s !== '');
  try {
    return parseTrustedProxies(items);
  } catch (error) {
    ctx.addIssue({ code: 'custom', message: error instanceof Error ? error.message : String(error) });
    return z.NEVER;
  }
});

const denyStatus = z.union([z.number(), z.string()]).transform((v, ctx): DenyStatus => {
  const n = Number(v);
  const allowed: readonly number[] = DENY_STATUSES;
  if (!allowed.includes(n)) {
    ctx.addIssue({ code: 'custom', message: `'${v}' is not one of ${DENY_STATUSES.join(', ')}` });
    return z.NEVER;
  }
  return n as DenyStatus;
});

const boolish = z.union([z.boolean(), z.enum(['true', 'false', '1', '0'])]).transform((v) => v === true || v === 'true' || v === '1');

const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);

const socketMode = z.union([z.string(), z.number().int()]).transform((v, ctx) => {
  const text = String(v).trim();
  if (!/^0?[0-7]{3,4}$/.test(text) && !/^0o[0-7]{3,4}$/.test(text)) {
    ctx.addIssue({ code: 'custom', message: `'${text}' is not an octal mode such as 0660` });
    return z.NEVER;
  }
  const mode = parseInt(text.replace(/^0o/, ''), 8);
  if (mode > 0o7777) {
    ctx.addIssue({ code: 'custom', message: `'${text}' is out of range` });
    return z.NEVER;
  }
  return mode;
});

const socketOwner = z.string().transform((v, ctx) => {
  const m = /^(\d+)(?::(\d+))?$/.exec(v.trim());
  if (m === null) {
    ctx.addIssue({ code: 'custom', message: `'${v}' is not UID[:GID] (numeric ids)` });
    return z.NEVER;
  }
  return { uid: Number(m[1]), gid: m[2] === undefined ? undefined : Number(m[2]) };
});

const unknownTenant = z.union([
  z.string(),
  z.object({ kind: z.enum(['deny', 'allow']) }),
  z.object({ kind: z.literal('tier'), tier: z.string().min(1) }),
]).transform((v, ctx): UnknownTenantPolicy => {
  if (typeof v !== 'string') return v.kind === 'tier' ? { kind: 'tier', tier: (v as { tier: string }).tier } : { kind: v.kind };
  const policy = parseUnknownTenantPolicy(v.trim());
  if (policy === null) {
    ctx.addIssue({ code: 'custom', message: `'${v}' is not deny, allow or tier:NAME` });
    return z.NEVER;
  }
  return policy;
});

/** The settings' fields alone (for callers that pick some, e.g. the embedded limiter's options). */
export const agentConfigFields = z.object({
  cell: z.string({ error: 'required: this cell\'s id' }).regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/, 'letters, digits, _ . - (at most 63, starting with a letter or digit)'),
  rules: z.string({ error: 'required: a rules file or directory' }).min(1),
  rlsSocket: z.string().min(1).optional(),
  rlsListen: hostPort.optional(),
  // A port alone binds loopback: the HTTP API has no authentication.
  http: z.preprocess((v) => (typeof v === 'number' || (typeof v === 'string' && /^\d{1,5}$/.test(v.trim())) ? `127.0.0.1:${String(v).trim()}` : v), hostPort).optional(),
  coordinators: coordinators.default([]),
  tlsCa: z.string().min(1).optional(),
  tlsCert: z.string().min(1).optional(),
  tlsKey: z.string().min(1).optional(),
  tlsServerName: z.string().min(1).max(253).optional(),
  leaseTokenFile: z.string().min(1).optional(),
  workers: int(0, 64).default(1),
  rlsServer: z.enum(RLS_SERVER_KINDS).default('lean'),
  socketMode: socketMode.default(0o660),
  socketOwner: socketOwner.optional(),
  tenants: z.string().min(1).optional(),
  unknownTenant: unknownTenant.optional(),
  staticShare: z.coerce.number().gt(0, 'must be > 0').max(1).optional(),
  responseHeaders: boolish.default(false),
  mergeDomains: boolish.default(false),
  logLevel: z.enum(logLevels).default('info'),
  tableCapacity: int(1, 50_000_000).default(1_000_000),
  tableFull: z.enum(['open', 'closed']).default('open'),
  velocityCapacity: int(16, 16_000_000).default(65_536),
  lagThresholdMs: z.coerce.number().min(0).max(60_000).default(10),
  overloadPolicy: z.enum(OVERLOAD_POLICIES).default(DEFAULT_OVERLOAD.policy),
  overloadAllowance: z.coerce.number().min(0).max(MAX_OVERLOAD_ALLOWANCE).default(DEFAULT_OVERLOAD.allowance),
  throttleLogIntervalMs: int(100, 3_600_000).default(10_000),
  maxDescriptors: int(1, 4096).default(DEFAULT_REQUEST_BOUNDS.maxDescriptors),
  maxEntries: int(1, 1024).default(DEFAULT_REQUEST_BOUNDS.maxEntries),
  maxKeyLength: int(1, 65_536).default(DEFAULT_REQUEST_BOUNDS.maxKeyLength),
  maxValueLength: int(1, 1_048_576).default(DEFAULT_REQUEST_BOUNDS.maxValueLength),
  maxDomainLength: int(1, 65_536).default(DEFAULT_REQUEST_BOUNDS.maxDomainLength),
  maxMessageBytes: int(1024, 64 * 1024 * 1024).default(1024 * 1024),
  httpBodyLimit: int(1024, 64 * 1024 * 1024).default(64 * 1024),
  rulesDebounceMs: int(0, 60_000).default(200),
  routes: z.string().min(1).optional(),
  trustedProxies: addressList.prefault(['loopback']),
  forwardAuthDenyStatus: denyStatus.default(429),
});

/**
 * One source of truth: with coordinators every tier, tenant, floor and the unknown-tenant policy come
 * from the ledger; a file or setting repeating them could only disagree with it. (The agent and the
 * embedded limiter both apply this.)
 */
export function refuseLocalQuotasWithCoordinators(
  c: { readonly coordinators: readonly unknown[]; readonly tenants?: unknown; readonly staticShare?: unknown; readonly unknownTenant?: unknown },
  ctx: z.RefinementCtx, what: string,
): void {
  if (c.coordinators.length === 0) return;
  const why = `not ${what}: the coordinators hold every tier, tenant, floor and the unknown-tenant policy (admin API)`;
  if (c.tenants !== undefined) ctx.addIssue({ code: 'custom', path: ['tenants'], message: why });
  if (c.staticShare !== undefined) ctx.addIssue({ code: 'custom', path: ['staticShare'], message: why });
  if (c.unknownTenant !== undefined) ctx.addIssue({ code: 'custom', path: ['unknownTenant'], message: why });
}

/** The lease client's credentials go together and need coordinators (agent and embedded limiter). */
export function checkLeaseCredentialSettings(
  c: { readonly coordinators: readonly unknown[]; readonly tlsCa?: string | undefined; readonly tlsCert?: string | undefined; readonly tlsKey?: string | undefined; readonly leaseTokenFile?: string | undefined },
  ctx: z.RefinementCtx,
): void {
  if ((c.tlsCert === undefined) !== (c.tlsKey === undefined)) ctx.addIssue({ code: 'custom', path: ['tlsCert'], message: '--tls-cert and --tls-key go together' });
  if (c.tlsCert !== undefined && c.tlsCa === undefined) ctx.addIssue({ code: 'custom', path: ['tlsCa'], message: '--tls-cert needs --tls-ca (the CA of the coordinators\' certificates)' });
  if (c.coordinators.length === 0 && (c.tlsCa !== undefined || c.leaseTokenFile !== undefined)) ctx.addIssue({ code: 'custom', path: ['coordinators'], message: '--tls-* and --lease-token-file are for the coordinators: give --coordinators' });
}

export const agentConfigSchema = agentConfigFields.superRefine((c, ctx) => {
  refuseLocalQuotasWithCoordinators(c, ctx, 'with --coordinators');
  checkLeaseCredentialSettings(c, ctx);
  if (c.workers > 0 && c.rlsSocket === undefined && c.rlsListen === undefined && c.http === undefined) {
    ctx.addIssue({ code: 'custom', path: ['rlsSocket'], message: 'nothing to serve: give --rls-socket, --rls-listen or --http' });
  }
  if (c.workers === 0 && (c.rlsSocket !== undefined || c.rlsListen !== undefined)) {
    ctx.addIssue({ code: 'custom', path: ['workers'], message: '--workers 0 serves no RLS: drop --rls-socket and --rls-listen, or give at least one worker' });
  }
  if ((c.rlsSocket !== undefined || c.rlsListen !== undefined) && c.rlsListen !== undefined && c.rlsListen.port !== 0 && c.rlsListen.port + c.workers - 1 > 65535) {
    ctx.addIssue({ code: 'custom', path: ['rlsListen'], message: `ports ${c.rlsListen.port}..${c.rlsListen.port + c.workers - 1} for ${c.workers} workers exceed 65535` });
  }
}).transform((c) => ({ ...c, staticShare: c.staticShare ?? 1, unknownTenant: c.unknownTenant ?? ({ kind: 'deny' }) }));

export type AgentConfig = z.output<typeof agentConfigSchema>;
export type AgentConfigInput = z.input<typeof agentConfigSchema>;

/** Validates typed settings (tests, embedding). Throws ConfigError. */
export function parseAgentConfig(input: AgentConfigInput): AgentConfig {
  const parsed = agentConfigSchema.safeParse(input);
  if (parsed.success) return parsed.data;
  const lines = parsed.error.issues.map((i) => `  ${i.path.map(String).join('.') || '(settings)'}: ${i.message}`);
  throw new ConfigError(`agent: invalid settings\n${lines.join('\n')}`);
}
