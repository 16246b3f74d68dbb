// `cellquota gateway` settings: every flag also as CELLQUOTA_<FLAG> or in a --config file
// (shared/cli-config.ts), validated by one zod schema. The decision settings (rules, tenants,
// coordinators, ...) are the agent's and are validated by the agent's own schema when the gateway
// starts its embedded agent; only the proxy's settings are defined here.
import { hostname } from 'node:os';
import { z } from 'zod';
import { ConfigError, parseHostPort } from '../../shared/cli-config.js';
import type { SettingSpec } from '../../shared/cli-config.js';
import { parseAddressList } from '../../shared/client-address.js';
import { logLevels } from '../../shared/logging.js';

export const GATEWAY_SETTING_SPECS: readonly SettingSpec[] = Object.freeze([
  { flag: 'listen', description: 'HOST:PORT the gateway serves on (required)' },
  { flag: 'upstream', description: 'the one app behind the gateway, http://HOST:PORT[/base] (required)' },
  { flag: 'rules', description: 'rules: a YAML file or a directory of them, envoyproxy/ratelimit format (required; hot-reloaded)' },
  { flag: 'routes', description: 'routes: which descriptors a request produces, Envoy\'s rate-limit actions (default: [{remote_address: <client>}] in domain edge)' },
  { flag: 'coordinators', description: 'HOST:PORT,... of the coordinators: this replica then leases its share of global quotas like a cell agent' },
  { flag: 'cell', description: 'this replica\'s cell id with --coordinators (default gw-<hostname>)' },
  { flag: 'trusted-proxies', description: 'addresses and CIDRs (or loopback, private, linklocal) whose X-Forwarded-For / X-Real-IP are believed (default: none, the peer is the client)' },
  { flag: 'health', description: 'HOST:PORT of the probe port: /healthz (the gateway itself, never the app) and /metrics (default 127.0.0.1:9090)' },
  { flag: 'max-connections-per-client', description: 'open connections one client address may hold; 0: no cap (default 256)' },
  { flag: 'connection-exempt', description: 'addresses and CIDRs exempt from the connection cap, e.g. the proxies in front (default: none)' },
  { flag: 'upstream-connections', description: 'keep-alive connections to the upstream (default 128)' },
  { flag: 'upstream-timeout-ms', description: 'how long to wait for the upstream\'s response headers (default 30000)' },
  { flag: 'tenants', description: 'static tiers and tenants for global quotas without coordinators (the agent\'s --tenants)' },
  { flag: 'unknown-tenant', description: 'policy for a global key not in the table: deny | allow | tier:NAME (default deny)' },
  { flag: 'static-share', description: 'this replica\'s share of every global quota without a coordinator, in (0, 1] (default 1)' },
  { flag: 'throttle-log-interval-ms', description: 'interval of the aggregated throttling log lines, per client (default 10000)' },
  { flag: 'table-capacity', description: 'bucket table capacity in keys (default 1000000)' },
  { flag: 'lag-threshold-ms', description: 'event-loop lag beyond which the gateway counts as overloaded and takes the overload path; 0 disables (default 10)' },
  { flag: 'overload-policy', description: 'what the overloaded gateway does: bounded (each key admits at most its fail-open allowance, the rest gets 429 at once) | open (every request passes undecided; for comparison) (default bounded)' },
  { flag: 'overload-allowance', description: 'bounded: each key\'s fail-open allowance while overloaded, as a multiple of its floor or its rule\'s rate; 0: every request gets 429 while overloaded (default 1)' },
  { flag: 'log-level', description: `log level: ${logLevels.join(' | ')} (default info)` },
]);

const hostPort = (what: string) => z.string().transform((v, ctx) => {
  const parsed = parseHostPort(v.trim());
  if (parsed === null) {
    ctx.addIssue({ code: 'custom', message: `'${v}' is not HOST:PORT with a port in 0..65535 (${what})` });
    return z.NEVER;
  }
  return parsed;
});

const upstream = z.string().transform((v, ctx) => {
  let url: URL;
  try {
    url = new URL(v.trim());
  } catch {
    ctx.addIssue({ code: 'custom', message: `'${v}' is not a URL such as http://127.0.0.1:8080` });
    return z.NEVER;
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    ctx.addIssue({ code: 'custom', message: `'${v}': the upstream is http:// or https://` });
    return z.NEVER;
  }
  if (url.search !== '' || url.hash !== '' || url.username !== '' || url.password !== '') {
    ctx.addIssue({ code: 'custom', message: `'${v}': no query, fragment or credentials in the upstream URL` });
    return z.NEVER;
  }
  return url;
});

const addressList = (what: string) => z.union([z.string(), z.array(z.string())]).transform((v, ctx) => {
  const items = (typeof v === 'string' ? v.split(',') : v).map((s) => s.trim()).filter((s) => s !== '');
  try {
    return parseAddressList(items, what);
  } catch (error) {
    ctx.addIssue({ code: 'custom', message: error instanceof Error ? error.message : String(error) });
    return z.NEVER;
  }
});

const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);

function defaultCell(): string {
  const h = hostname().toLowerCase().replace(/[^a-z0-9_.-]/g, '-').replace(/^[^a-z0-9]+/, '');
  return `gw-${h === '' ? 'replica' : h}`.slice(0, 63);
}

export const gatewayConfigSchema = z.object({
  listen: hostPort('--listen'),
  upstream,
  rules: z.string({ error: 'required: a rules file or directory' }).min(1),
  routes: z.string().min(1).optional(),
  coordinators: z.union([z.string(), z.array(z.string())]).optional(),
  cell: z.string().optional(),
  trustedProxies: addressList('trusted proxy').prefault([]),
  health: hostPort('--health').prefault('127.0.0.1:9090'),
  maxConnectionsPerClient: int(0, 1_000_000).default(256),
  connectionExempt: addressList('connection exemption').prefault([]),
  upstreamConnections: int(1, 65_536).default(128),
  upstreamTimeoutMs: int(100, 3_600_000).default(30_000),
  tenants: z.string().min(1).optional(),
  unknownTenant: z.string().optional(),
  staticShare: z.union([z.string(), z.number()]).optional(),
  throttleLogIntervalMs: int(100, 3_600_000).default(10_000),
  tableCapacity: int(1, 50_000_000).default(1_000_000),
  // Validated by the agent's schema (one definition of their ranges and defaults).
  lagThresholdMs: z.union([z.string(), z.number()]).optional(),
  overloadPolicy: z.string().optional(),
  overloadAllowance: z.union([z.string(), z.number()]).optional(),
  logLevel: z.enum(logLevels).default('info'),
}).transform((c) => ({ ...c, cell: c.cell ?? defaultCell() }));

export type GatewayConfig = z.output<typeof gatewayConfigSchema>;
export type GatewayConfigInput = z.input<typeof gatewayConfigSchema>;

/** Validates typed settings (tests, embedding). Throws ConfigError. */
export function parseGatewayConfig(input: GatewayConfigInput): GatewayConfig {
  const parsed = gatewayConfigSchema.safeParse(input);
  if (parsed.success) return parsed.data;
  const lines = parsed.error.issues.map((i) => `  ${i.path.map(String).join('.') || '(settings)'}: ${i.message}`);
  throw new ConfigError(`gateway: invalid settings\n${lines.join('\n')}`);
}
