// `cellquota gateway` settings: every flag also as CELLQUOTA_<FLAG> or in a --config file
// (shared/cli-config.ts), validated by one zod schema. The decision settings (rules, tenants,
// coordinators, ...) are the agent's and are validated by the agent's own schema when the gateway
// starts its embedded agent; only the proxy's settings are defined here.
import { hostname } from 'node:os';
import { z } from 'zod';
import { ConfigError, parseHostPort, reuseSetting, setting, settingSpecs } from '../../shared/cli-config.js';
import { agentConfigFields } from '../agent-config.js';
import { parseAddressList } from '../../shared/client-address.js';

const hostPort = (what: string) =>
  z.string().transform((v, ctx) => {
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

const addressList = (what: string) =>
  z.union([z.string(), z.array(z.string())]).transform((v, ctx) => {
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
  const h = hostname()
    .toLowerCase()
    .replace(/[^a-z0-9_.-]/g, '-')
    .replace(/^[^a-z0-9]+/, '');
  return `gw-${h === '' ? 'replica' : h}`.slice(0, 63);
}

const agent = agentConfigFields.shape;

/** Every setting of `cellquota gateway`, declared once (shared/cli-config.ts). */
export const gatewayConfigFields = z.object({
  listen: setting(hostPort('--listen'), { help: 'HOST:PORT the gateway serves on', example: '0.0.0.0:8080' }),
  upstream: setting(upstream, {
    help: 'the one app behind the gateway, http://HOST:PORT[/base]',
    example: 'http://127.0.0.1:3000',
  }),
  rules: reuseSetting(agent.rules, {}),
  routes: setting(z.string().min(1).optional(), {
    help: "routes: which descriptors a request produces, Envoy's rate-limit actions",
    defaultHelp: '[{remote_address: <client>}] in domain edge',
    example: '/etc/cellquota/routes.yaml',
  }),
  // Validated by the agent's schema when the gateway starts its embedded agent.
  coordinators: setting(z.union([z.string(), z.array(z.string())]).optional(), {
    help: 'HOST:PORT,... of the coordinators: this replica then leases its share of global quotas like a cell agent',
    example: '127.0.0.1:7001,127.0.0.1:7002',
  }),
  cell: setting(z.string().optional(), {
    help: "this replica's cell id with --coordinators",
    defaultHelp: 'gw-<hostname>',
    example: 'gw-1',
  }),
  trustedProxies: setting(addressList('trusted proxy'), {
    help:
      'addresses and CIDRs (or loopback, private, linklocal) whose X-Forwarded-For / X-Real-IP are believed ' +
      '(none: the peer is the client)',
    default: [],
    example: 'loopback,10.0.0.0/8',
  }),
  health: setting(hostPort('--health'), {
    help: 'HOST:PORT of the probe port: /healthz (the gateway itself, never the app) and /metrics',
    default: '127.0.0.1:9090',
    example: '0.0.0.0:9090',
  }),
  maxConnectionsPerClient: setting(int(0, 1_000_000), {
    help: 'open connections one client address may hold; 0: no cap',
    default: 256,
    example: '64',
  }),
  connectionExempt: setting(addressList('connection exemption'), {
    help: 'addresses and CIDRs exempt from the connection cap, e.g. the proxies in front',
    default: [],
    example: '10.0.0.0/8',
  }),
  upstreamConnections: setting(int(1, 65_536), {
    help: 'keep-alive connections to the upstream',
    default: 128,
    example: '32',
  }),
  upstreamTimeoutMs: setting(int(100, 3_600_000), {
    help: "how long to wait for the upstream's response headers",
    default: 30_000,
    example: '5000',
  }),
  tenants: reuseSetting(agent.tenants, {
    help: "static tiers and tenants for global quotas without coordinators (the agent's --tenants)",
  }),
  unknownTenant: reuseSetting(agent.unknownTenant, {
    help: 'policy for a global key not in the table: deny | allow | tier:NAME',
  }),
  staticShare: reuseSetting(agent.staticShare, {
    help: "this replica's share of every global quota without a coordinator, in (0, 1]",
  }),
  throttleLogIntervalMs: reuseSetting(agent.throttleLogIntervalMs, {
    help: 'interval of the aggregated throttling log lines, per client',
  }),
  tableCapacity: reuseSetting(agent.tableCapacity, { help: 'bucket table capacity in keys' }),
  lagThresholdMs: reuseSetting(agent.lagThresholdMs, {
    help: 'event-loop lag beyond which the gateway counts as overloaded and takes the overload path; 0 disables',
  }),
  overloadPolicy: reuseSetting(agent.overloadPolicy, {
    help:
      'what the overloaded gateway does: bounded (each key admits at most its fail-open allowance, the rest gets ' +
      '429 at once) | open (every request passes undecided; for comparison)',
  }),
  overloadAllowance: reuseSetting(agent.overloadAllowance, {
    help:
      "bounded: each key's fail-open allowance while overloaded, as a multiple of its floor or its rule's rate; " +
      '0: every request gets 429 while overloaded',
  }),
  logLevel: reuseSetting(agent.logLevel, {}),
});

export const GATEWAY_SETTING_SPECS = settingSpecs(gatewayConfigFields);

export const gatewayConfigSchema = gatewayConfigFields.transform((c) => ({ ...c, cell: c.cell ?? defaultCell() }));

export type GatewayConfig = z.output<typeof gatewayConfigSchema>;
export type GatewayConfigInput = z.input<typeof gatewayConfigSchema>;

/** Validates typed settings (tests, embedding). Throws ConfigError. */
export function parseGatewayConfig(input: GatewayConfigInput): GatewayConfig {
  const parsed = gatewayConfigSchema.safeParse(input);
  if (parsed.success) return parsed.data;
  const lines = parsed.error.issues.map((i) => `  ${i.path.map(String).join('.') || '(settings)'}: ${i.message}`);
  throw new ConfigError(`gateway: invalid settings\n${lines.join('\n')}`);
}
