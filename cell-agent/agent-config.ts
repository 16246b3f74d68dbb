// The agent's settings: every flag of `cellquota agent`, also settable as CELLQUOTA_<FLAG> or in a
// config file (shared/cli-config.ts), validated by one zod schema. The schema takes the raw strings
// of flags and variables as well as typed values (config files, tests), and produces AgentConfig.
import { z } from 'zod';
import { ConfigError, parseHostPort, setting, settingSpecs } from '../shared/cli-config.js';
import { logLevels } from '../shared/logging.js';
import { DEFAULT_REQUEST_BOUNDS } from './decide/request-check.js';
import { DEFAULT_RULES_WATCH_DEBOUNCE_MS } from './rules/rules-load.js';
import { DEFAULT_LAG_THRESHOLD_MS } from './observe/lag-guard.js';
import { DEFAULT_MAX_LEASE_KEYS } from './lease/held-keys.js';
import { parseUnknownTenantPolicy } from './decide/quota-file.js';
import { RLS_SERVER_KINDS } from './rls/rls-common.js';
import { DEFAULT_OVERLOAD, MAX_OVERLOAD_ALLOWANCE, OVERLOAD_POLICIES } from './decide/overload.js';
import type { UnknownTenantPolicy } from './decide/quotas.js';
import { MAX_THREADS } from './buckets/bucket-table.js';
import { parseTrustedProxies } from '../shared/client-address.js';
import { DENY_STATUSES } from './front-door/forward-auth.js';
import type { DenyStatus } from './front-door/forward-auth.js';

const hostPort = z
  .union([z.string(), z.object({ host: z.string().min(1), port: z.number().int().min(0).max(65535) })])
  .transform((v, ctx) => {
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
      ctx.addIssue({
        code: 'custom',
        message:
          `'${item}': the replica id before '=' must be lowercase letters, ` +
          "digits and dashes (as in the coordinators' --peers)",
      });
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

const boolish = z
  .union([z.boolean(), z.enum(['true', 'false', '1', '0'])])
  .transform((v) => v === true || v === 'true' || v === '1');

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

const unknownTenant = z
  .union([
    z.string(),
    z.object({ kind: z.enum(['deny', 'allow']) }),
    z.object({ kind: z.literal('tier'), tier: z.string().min(1) }),
  ])
  .transform((v, ctx): UnknownTenantPolicy => {
    if (typeof v !== 'string')
      return v.kind === 'tier' ? { kind: 'tier', tier: (v as { tier: string }).tier } : { kind: v.kind };
    const policy = parseUnknownTenantPolicy(v.trim());
    if (policy === null) {
      ctx.addIssue({ code: 'custom', message: `'${v}' is not deny, allow or tier:NAME` });
      return z.NEVER;
    }
    return policy;
  });

/** The unknown-tenant policy and the static share of an agent running alone, when not given. */
/** What the agent's start-up line and banner say about where its global quotas come from. */
export const AGENT_ALONE_NOTE = 'no coordinators: global quotas run on static slices (--tenants × --static-share)';
export const AGENT_COORDINATED_NOTE =
  'tiers, tenants and floors come from the coordinator leader: a global key is refused until its first grant, ' +
  'then runs on its grant, or on the floor stamped on it once its lease ends';
export const DEFAULT_UNKNOWN_TENANT = 'deny';
export const DEFAULT_STATIC_SHARE = 1;
const defaultUnknownTenant = ((): UnknownTenantPolicy => {
  const p = parseUnknownTenantPolicy(DEFAULT_UNKNOWN_TENANT);
  if (p === null) throw new Error(`DEFAULT_UNKNOWN_TENANT '${DEFAULT_UNKNOWN_TENANT}' is not a policy`);
  return p;
})();
/** A serving thread's young generation by default (cell-agent/README.md, "Memory of an idle agent"). */
export const DEFAULT_WORKER_YOUNG_GENERATION_MB = 6;
/** Largest gRPC request message and HTTP request body by default, in bytes. */
export const DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024;
export const DEFAULT_HTTP_BODY_LIMIT = 64 * 1024;

/**
 * Every setting of `cellquota agent`, declared once (shared/cli-config.ts); also the fields callers
 * pick some of (the embedded limiter's options, the gateway).
 */
export const agentConfigFields = z.object({
  cell: setting(
    z
      .string({ error: "required: this cell's id" })
      .regex(
        /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/,
        'letters, digits, _ . - (at most 63, starting with a letter or digit)',
      ),
    { help: "this cell's id, e.g. eu-west", example: 'eu-west' },
  ),
  rules: setting(z.string({ error: 'required: a rules file or directory' }).min(1), {
    help: 'rules: a YAML file or a directory of them, envoyproxy/ratelimit format (hot-reloaded)',
    example: '/etc/ratelimit/config',
  }),
  rlsSocket: setting(z.string().min(1).optional(), {
    help: 'Unix socket for the RLS gRPC server; worker i > 0 serves on <path>.<i>',
    example: '/run/ratelimit.sock',
  }),
  rlsListen: setting(hostPort.optional(), {
    help: 'HOST:PORT for the RLS gRPC server over TCP; worker i serves on PORT+i (port 0: any free port each)',
    example: '127.0.0.1:8089',
  }),
  // A port alone binds loopback: the HTTP API has no authentication.
  http: setting(
    z
      .preprocess(
        (v) =>
          typeof v === 'number' || (typeof v === 'string' && /^\d{1,5}$/.test(v.trim()))
            ? `127.0.0.1:${String(v).trim()}`
            : v,
        hostPort,
      )
      .optional(),
    {
      help:
        'HOST:PORT (or PORT alone: 127.0.0.1, loopback only) for the HTTP API (/v1/check, /v1/forward-auth, ' +
        '/metrics, /healthz); it has no authentication, so give a non-loopback host only on a trusted network',
      example: '127.0.0.1:9091',
    },
  ),
  coordinators: setting(coordinators, {
    help:
      "HOST:PORT,... (or ID=HOST:PORT,...) of the coordinators' gRPC (peer) addresses; any " +
      'one is enough to find the leader. With ids, the agent reaches the leader at its own ' +
      'address for that id rather than the address the coordinators know each other by (proxies, ' +
      'per-replica load balancers). Without it the agent runs alone on static slices',
    default: [],
    example: 'n1=127.0.0.1:7001,n2=127.0.0.1:7002',
  }),
  tlsCa: setting(z.string().min(1).optional(), {
    help: "CA of the coordinators' certificates: the lease client speaks TLS to them",
    example: '/etc/cellquota/ca.pem',
  }),
  tlsCert: setting(z.string().min(1).optional(), {
    help:
      "this cell's client certificate (PEM) for mutual TLS; must " +
      'name --cell (URI urn:cellquota:cell:<id>, or the CN)',
    example: '/etc/cellquota/cell.pem',
  }),
  tlsKey: setting(z.string().min(1).optional(), {
    help: 'the key of --tls-cert (PEM)',
    example: '/etc/cellquota/cell-key.pem',
  }),
  tlsServerName: setting(z.string().min(1).max(253).optional(), {
    help: "the name expected in the coordinators' certificate when it is not the host dialled",
    example: 'coordinator.cellquota',
  }),
  leaseTokenFile: setting(z.string().min(1).optional(), {
    help: "a file holding this cell's bearer token for the lease service (instead of, or besides, a certificate)",
    example: '/run/secrets/lease-token',
  }),
  // One bucket-table thread record each, beside the main thread's (review: 64 workers left the last
  // one unable to attach).
  workers: setting(int(0, MAX_THREADS - 1), {
    help: 'gRPC serving threads, all sharing one bucket table (0: no RLS server, the HTTP API only)',
    default: 1,
    example: '4',
  }),
  workerYoungGenerationMb: setting(int(0, 1024), {
    help:
      "each serving thread's V8 young generation in MiB (three semi-spaces: 6 is 2 MiB ones; " +
      "0: V8's default, up to 48): what an idle agent keeps resident against how often the thread scavenges",
    default: DEFAULT_WORKER_YOUNG_GENERATION_MB,
    example: '12',
  }),
  rlsServer: setting(z.enum(RLS_SERVER_KINDS), {
    help: 'the RLS gRPC server: lean (gRPC framing on node:http2) | grpc-js (the previous server, kept for comparison)',
    default: 'lean',
    example: 'grpc-js',
  }),
  forwardAuthSocket: setting(z.string().min(1).optional(), {
    help:
      'a Unix socket answering /v1/forward-auth only, beside --http (nginx: upstream { server unix:PATH; }): ' +
      'a subrequest over it costs nginx and the agent less CPU than over TCP loopback; mode --socket-mode',
    example: '/run/cellquota/forward-auth.sock',
  }),
  socketMode: setting(socketMode, {
    help: 'permission bits of the Unix sockets, octal',
    default: '0660',
    example: '0600',
  }),
  socketOwner: setting(socketOwner.optional(), {
    help: 'owner of the Unix sockets as UID[:GID] (numeric; needs the privilege to chown)',
    example: '101:101',
  }),
  tenants: setting(z.string().min(1).optional(), {
    help:
      'static tiers and tenants (YAML: tiers, tenants, domainCap) for the global quotas of an agent running ' +
      'alone; refused with --coordinators (they hold every quota)',
    example: '/etc/cellquota/tenants.yaml',
  }),
  unknownTenant: setting(unknownTenant.optional(), {
    help:
      'alone: policy for a tenant not in the table: deny | allow | tier:NAME; ' +
      'refused with --coordinators (PUT /v1/settings sets it there)',
    defaultHelp: DEFAULT_UNKNOWN_TENANT,
    example: 'tier:free',
  }),
  staticShare: setting(z.coerce.number().gt(0, 'must be > 0').max(1).optional(), {
    help:
      "alone: this cell's share of every global quota, in (0, 1]; refused " +
      'with --coordinators (the coordinator grants slices and floors)',
    defaultHelp: String(DEFAULT_STATIC_SHARE),
    example: '0.5',
  }),
  responseHeaders: setting(boolish, {
    help: 'add RateLimit-Limit/-Remaining/-Reset to responses (envoyproxy/ratelimit LIMIT_RESPONSE_HEADERS_ENABLED)',
    default: false,
    example: 'true',
  }),
  mergeDomains: setting(boolish, {
    help:
      'merge rule files that name the same domain into one (envoyproxy/ratelimit ' +
      'MERGE_DOMAIN_CONFIG); a descriptor defined in two of them is still an error ' +
      'naming both files. Without it two files of one domain are refused',
    default: false,
    example: 'true',
  }),
  logLevel: setting(z.enum(logLevels), {
    help: `log level: ${logLevels.join(' | ')}`,
    default: 'info',
    example: 'debug',
  }),
  tableCapacity: setting(int(1, 50_000_000), {
    help: 'bucket table capacity in keys, fixed shared memory of about 50 bytes per key',
    default: 1_000_000,
    example: '200000',
  }),
  tableFull: setting(z.enum(['open', 'closed']), {
    help: 'when the bucket table has no slot for a new key: open (pass, counted) | closed (refuse)',
    default: 'open',
    example: 'closed',
  }),
  velocityCapacity: setting(int(16, 16_000_000), {
    help: 'global quotas tracked in the 500 ms velocity window',
    default: 65_536,
    example: '4096',
  }),
  maxLeaseKeys: setting(int(1, 50_000_000), {
    help:
      'with --coordinators: the most quota keys a grant is held for (each costs an override entry in every ' +
      'thread); past it the keys no check asked about for longest are evicted, released to the leader and ' +
      'refused until their grant is back (a check asks for it again)',
    default: DEFAULT_MAX_LEASE_KEYS,
    example: '100000',
  }),
  lagThresholdMs: setting(z.coerce.number().min(0).max(60_000), {
    help:
      'event-loop lag beyond which a serving thread counts as overloaded and takes the overload path ' +
      '(--overload-policy); 0 disables',
    default: DEFAULT_LAG_THRESHOLD_MS,
    example: '25',
  }),
  overloadPolicy: setting(z.enum(OVERLOAD_POLICIES), {
    help:
      'what an overloaded serving thread answers: bounded (each quota key admits ' +
      'at most its fail-open allowance, the rest is refused at once) | open (every ' +
      'check OK without deciding, the behaviour before; for comparison)',
    default: DEFAULT_OVERLOAD.policy,
    example: 'open',
  }),
  overloadAllowance: setting(z.coerce.number().min(0).max(MAX_OVERLOAD_ALLOWANCE), {
    help:
      "bounded: each key's fail-open allowance while overloaded, as a multiple of its " +
      "floor (global quota) or its rule's rate (local), one second deep; 0: refuse everything " +
      `while overloaded, before decoding (at most ${MAX_OVERLOAD_ALLOWANCE})`,
    default: DEFAULT_OVERLOAD.allowance,
    example: '2',
  }),
  throttleLogIntervalMs: setting(int(100, 3_600_000), {
    help: 'interval of the aggregated throttling log lines',
    default: 10_000,
    example: '60000',
  }),
  maxDescriptors: setting(int(1, 4096), {
    help: 'descriptors per request',
    default: DEFAULT_REQUEST_BOUNDS.maxDescriptors,
    example: '8',
  }),
  maxEntries: setting(int(1, 1024), {
    help: 'entries per descriptor',
    default: DEFAULT_REQUEST_BOUNDS.maxEntries,
    example: '8',
  }),
  maxKeyLength: setting(int(1, 65_536), {
    help: 'length of an entry key',
    default: DEFAULT_REQUEST_BOUNDS.maxKeyLength,
    example: '64',
  }),
  maxValueLength: setting(int(1, 1_048_576), {
    help: 'length of an entry value',
    default: DEFAULT_REQUEST_BOUNDS.maxValueLength,
    example: '512',
  }),
  maxDomainLength: setting(int(1, 65_536), {
    help: 'length of the domain',
    default: DEFAULT_REQUEST_BOUNDS.maxDomainLength,
    example: '64',
  }),
  maxMessageBytes: setting(int(1024, 64 * 1024 * 1024), {
    help: 'largest gRPC request message in bytes',
    default: DEFAULT_MAX_MESSAGE_BYTES,
    example: '65536',
  }),
  httpBodyLimit: setting(int(1024, 64 * 1024 * 1024), {
    help: 'largest HTTP request body in bytes',
    default: DEFAULT_HTTP_BODY_LIMIT,
    example: '16384',
  }),
  rulesDebounceMs: setting(int(0, 60_000), {
    help: 'quiet time after a rules file change before reloading',
    default: DEFAULT_RULES_WATCH_DEBOUNCE_MS,
    example: '1000',
  }),
  routes: setting(z.string().min(1).optional(), {
    help: "forward-auth routes: YAML mapping forwarded requests to descriptors with Envoy's rate-limit actions",
    defaultHelp: '[{remote_address: <client>}] in domain edge',
    example: '/etc/cellquota/routes.yaml',
  }),
  trustedProxies: setting(addressList, {
    help:
      'addresses and CIDRs (comma-separated, or loopback, private, linklocal) ' +
      'whose X-Forwarded-For / X-Real-IP forward-auth believes',
    default: ['loopback'],
    example: '10.0.0.0/8,loopback',
  }),
  forwardAuthDenyStatus: setting(denyStatus, {
    help: 'status of a forward-auth refusal: 429 | 401 | 403 (nginx auth_request passes only 401/403)',
    default: 429,
    example: '403',
  }),
});

export const AGENT_SETTING_SPECS = settingSpecs(agentConfigFields);

/**
 * One source of truth: with coordinators every tier, tenant, floor and the unknown-tenant policy come
 * from the ledger; a file or setting repeating them could only disagree with it. (The agent and the
 * embedded limiter both apply this.)
 */
export function refuseLocalQuotasWithCoordinators(
  c: {
    readonly coordinators: readonly unknown[];
    readonly tenants?: unknown;
    readonly staticShare?: unknown;
    readonly unknownTenant?: unknown;
  },
  ctx: z.RefinementCtx,
  what: string,
): void {
  if (c.coordinators.length === 0) return;
  const why = `not ${what}: the coordinators hold every tier, tenant, floor and the unknown-tenant policy (admin API)`;
  if (c.tenants !== undefined) ctx.addIssue({ code: 'custom', path: ['tenants'], message: why });
  if (c.staticShare !== undefined) ctx.addIssue({ code: 'custom', path: ['staticShare'], message: why });
  if (c.unknownTenant !== undefined) ctx.addIssue({ code: 'custom', path: ['unknownTenant'], message: why });
}

/** The lease client's credentials go together and need coordinators (agent and embedded limiter). */
export function checkLeaseCredentialSettings(
  c: {
    readonly coordinators: readonly unknown[];
    readonly tlsCa?: string | undefined;
    readonly tlsCert?: string | undefined;
    readonly tlsKey?: string | undefined;
    readonly leaseTokenFile?: string | undefined;
  },
  ctx: z.RefinementCtx,
): void {
  if ((c.tlsCert === undefined) !== (c.tlsKey === undefined))
    ctx.addIssue({ code: 'custom', path: ['tlsCert'], message: '--tls-cert and --tls-key go together' });
  if (c.tlsCert !== undefined && c.tlsCa === undefined)
    ctx.addIssue({
      code: 'custom',
      path: ['tlsCa'],
      message: "--tls-cert needs --tls-ca (the CA of the coordinators' certificates)",
    });
  if (c.coordinators.length === 0 && (c.tlsCa !== undefined || c.leaseTokenFile !== undefined))
    ctx.addIssue({
      code: 'custom',
      path: ['coordinators'],
      message: '--tls-* and --lease-token-file are for the coordinators: give --coordinators',
    });
}

export const agentConfigSchema = agentConfigFields
  .superRefine((c, ctx) => {
    refuseLocalQuotasWithCoordinators(c, ctx, 'with --coordinators');
    checkLeaseCredentialSettings(c, ctx);
    if (c.workers > 0 && c.rlsSocket === undefined && c.rlsListen === undefined && c.http === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['rlsSocket'],
        message: 'nothing to serve: give --rls-socket, --rls-listen or --http',
      });
    }
    if (c.forwardAuthSocket !== undefined && c.http === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['forwardAuthSocket'],
        message: '--forward-auth-socket serves beside the HTTP API: give --http too (its /metrics and /healthz)',
      });
    }
    if (c.workers === 0 && (c.rlsSocket !== undefined || c.rlsListen !== undefined)) {
      ctx.addIssue({
        code: 'custom',
        path: ['workers'],
        message: '--workers 0 serves no RLS: drop --rls-socket and --rls-listen, or give at least one worker',
      });
    }
    if (
      (c.rlsSocket !== undefined || c.rlsListen !== undefined) &&
      c.rlsListen !== undefined &&
      c.rlsListen.port !== 0 &&
      c.rlsListen.port + c.workers - 1 > 65535
    ) {
      ctx.addIssue({
        code: 'custom',
        path: ['rlsListen'],
        message: `ports ${c.rlsListen.port}..${c.rlsListen.port + c.workers - 1} for ${c.workers} workers exceed 65535`,
      });
    }
  })
  .transform((c) => ({
    ...c,
    staticShare: c.staticShare ?? DEFAULT_STATIC_SHARE,
    unknownTenant: c.unknownTenant ?? defaultUnknownTenant,
  }));

export type AgentConfig = z.output<typeof agentConfigSchema>;
export type AgentConfigInput = z.input<typeof agentConfigSchema>;

/** Validates typed settings (tests, embedding). Throws ConfigError. */
export function parseAgentConfig(input: AgentConfigInput): AgentConfig {
  const parsed = agentConfigSchema.safeParse(input);
  if (parsed.success) return parsed.data;
  const lines = parsed.error.issues.map((i) => `  ${i.path.map(String).join('.') || '(settings)'}: ${i.message}`);
  throw new ConfigError(`agent: invalid settings\n${lines.join('\n')}`);
}
