// The options of the embedded limiter (`createLimiter`), validated with zod. The settings it shares
// with the cell agent (cell id, coordinators, static share, unknown-tenant policy, bucket-table
// sizes) are the agent's own schemas, so a value means the same thing, with the same bounds, in both.
import type { Registry } from 'prom-client';
import { z } from 'zod';
import {
  agentConfigFields,
  checkLeaseCredentialSettings,
  refuseLocalQuotasWithCoordinators,
} from '../cell-agent/agent-config.js';
import type { CoordinatorAddress } from '../cell-agent/agent-config.js';
import type { UnknownTenantPolicy } from '../cell-agent/decide/quotas.js';
import { CellquotaError } from '../shared/errors.js';

/** A rules document in the agent's format (envoyproxy/ratelimit's YAML, as a plain object). */
export interface RulesDocument {
  readonly domain: string;
  readonly descriptors: readonly unknown[];
}

/** The logger the limiter writes to: pino's (fastify's `log` is one), or anything with these methods. */
export interface LimiterLogger {
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
  info(obj: object, msg: string): void;
}

export interface LimiterOptions {
  /** A rules file or directory (YAML), or rules documents as objects, in the agent's format. */
  readonly rules: string | RulesDocument | readonly RulesDocument[];
  /** The rules domain to check in; default: the only domain of the rules. */
  readonly domain?: string;
  /** The name in metrics and logs (label `limiter`); default: the domain. */
  readonly name?: string;
  /** This replica's cell id at the coordinators (required with `coordinators`). */
  readonly cell?: string;
  /** `HOST:PORT,...` (or `ID=HOST:PORT,...`) of the coordinators: the replica then leases its slices
   * of every `global: true` quota like a cell agent. */
  readonly coordinators?: string | readonly string[];
  /** Without coordinators: static tiers and tenants for `global: true` rules (the agent's `--tenants`
   * format), a path or an object. Refused with `coordinators`: they hold every quota. */
  readonly tenants?: string | object;
  /** Without coordinators: this replica's share of every global quota, in (0, 1] (default 1). */
  readonly staticShare?: number;
  /** Without coordinators: `deny` | `allow` | `tier:NAME` for a global value the tenants table does
   * not know (default deny). With coordinators their policy applies (PUT /v1/settings). */
  readonly unknownTenant?: string;
  /** The lease client's credentials, as the agent's --tls-ca, --tls-cert, --tls-key,
   * --tls-server-name and --lease-token-file (paths). */
  readonly tlsCa?: string;
  readonly tlsCert?: string;
  readonly tlsKey?: string;
  readonly tlsServerName?: string;
  readonly leaseTokenFile?: string;
  /** Decide and count, but never refuse: refusals are reported (hook, metrics) and let through. */
  readonly shadow?: boolean;
  /** Live keys in the bucket table (default 100,000); when full, a new key passes or is refused per `tableFull`. */
  readonly tableCapacity?: number;
  readonly tableFull?: 'open' | 'closed';
  /** Reload a rules path when it changes (default false). */
  readonly watchRules?: boolean;
  /** prom-client registry for the limiter's metrics; default: a registry of its own (`limiter.registry`). */
  readonly registry?: Registry;
  readonly logger?: LimiterLogger;
}

/** The embedded default: a tenth of the agent's table (the app's process holds it). */
export const DEFAULT_EMBEDDED_TABLE_CAPACITY = 100_000;

const agent = agentConfigFields.shape;

const rulesDocument = z.looseObject({ domain: z.string(), descriptors: z.array(z.unknown()) });

export const limiterOptionsSchema = z
  .strictObject({
    rules: z.union([z.string().min(1), rulesDocument, z.array(rulesDocument).min(1).max(256)]),
    domain: z.string().min(1).max(256).optional(),
    name: z
      .string()
      .min(1)
      .max(128)
      .regex(/^[A-Za-z0-9_.:-]+$/, 'letters, digits and _ . : -')
      .optional(),
    cell: agent.cell.optional(),
    coordinators: agent.coordinators.default([]),
    tenants: z.union([z.string().min(1), z.looseObject({})]).optional(),
    staticShare: agent.staticShare,
    unknownTenant: agent.unknownTenant,
    tlsCa: agent.tlsCa,
    tlsCert: agent.tlsCert,
    tlsKey: agent.tlsKey,
    tlsServerName: agent.tlsServerName,
    leaseTokenFile: agent.leaseTokenFile,
    shadow: z.boolean().default(false),
    tableCapacity: agent.tableCapacity.default(DEFAULT_EMBEDDED_TABLE_CAPACITY),
    tableFull: agent.tableFull,
    velocityCapacity: agent.velocityCapacity,
    watchRules: z.boolean().default(false),
    registry: z
      .custom<Registry>(
        (v) => typeof v === 'object' && v !== null && typeof (v as Registry).registerMetric === 'function',
        'a prom-client Registry',
      )
      .optional(),
    logger: z
      .custom<LimiterLogger>(
        (v) =>
          typeof v === 'object' &&
          v !== null &&
          ['warn', 'error', 'info'].every((m) => typeof (v as Record<string, unknown>)[m] === 'function'),
        'a logger with warn, error and info',
      )
      .optional(),
  })
  .superRefine((o, ctx) => {
    if (o.coordinators.length > 0 && o.cell === undefined)
      ctx.addIssue({ code: 'custom', path: ['cell'], message: "required with coordinators: this replica's cell id" });
    refuseLocalQuotasWithCoordinators(o, ctx, 'with coordinators');
    checkLeaseCredentialSettings(o, ctx);
    if (o.watchRules && typeof o.rules !== 'string')
      ctx.addIssue({ code: 'custom', path: ['watchRules'], message: 'only a rules path can be watched' });
  });

export interface ParsedLimiterOptions {
  readonly rules: string | readonly RulesDocument[];
  readonly domain: string | undefined;
  readonly name: string | undefined;
  readonly cell: string | undefined;
  readonly coordinators: readonly CoordinatorAddress[];
  readonly tenants: string | object | undefined;
  readonly staticShare: number;
  readonly unknownTenant: UnknownTenantPolicy;
  readonly tlsCa: string | undefined;
  readonly tlsCert: string | undefined;
  readonly tlsKey: string | undefined;
  readonly tlsServerName: string | undefined;
  readonly leaseTokenFile: string | undefined;
  readonly shadow: boolean;
  readonly tableCapacity: number;
  readonly tableFull: 'open' | 'closed';
  readonly velocityCapacity: number;
  readonly watchRules: boolean;
  readonly registry: Registry | undefined;
  readonly logger: LimiterLogger | undefined;
}

/** A bad option: the message names each one. Nothing was started. */
export class LimiterOptionsError extends CellquotaError {
  readonly code = 'CELLQUOTA_OPTIONS_INVALID';
  constructor(message: string) {
    super(message);
    this.name = 'LimiterOptionsError';
  }
}

/** Validates options against `schema` and throws LimiterOptionsError naming every bad one. */
export function parseWith<S extends z.ZodType>(schema: S, input: unknown, what: string): z.output<S> {
  const parsed = schema.safeParse(input);
  if (parsed.success) return parsed.data;
  const lines = parsed.error.issues.map((i) => `  ${i.path.map(String).join('.') || '(options)'}: ${i.message}`);
  throw new LimiterOptionsError(`cellquota ${what}: invalid options\n${lines.join('\n')}`);
}

export function parseLimiterOptions(input: LimiterOptions): ParsedLimiterOptions {
  const o = parseWith(limiterOptionsSchema, input, 'createLimiter');
  return {
    ...o,
    rules: typeof o.rules === 'string' ? o.rules : Array.isArray(o.rules) ? o.rules : [o.rules],
    domain: o.domain,
    name: o.name,
    cell: o.cell,
    tenants: o.tenants,
    staticShare: o.staticShare ?? 1,
    unknownTenant: o.unknownTenant ?? { kind: 'deny' },
    tlsCa: o.tlsCa,
    tlsCert: o.tlsCert,
    tlsKey: o.tlsKey,
    tlsServerName: o.tlsServerName,
    leaseTokenFile: o.leaseTokenFile,
    registry: o.registry,
    logger: o.logger,
  };
}

/**
 * The limiter options among an integration's options (the rest are the HTTP integration's); `logger` defaults to the
 * given one.
 */
export function limiterOptionsOf(o: LimiterOptions, logger: LimiterLogger): LimiterOptions {
  const {
    rules,
    domain,
    name,
    cell,
    coordinators,
    tenants,
    staticShare,
    unknownTenant,
    shadow,
    tableCapacity,
    tableFull,
    watchRules,
    registry,
  } = o;
  const out: Record<string, unknown> = {
    rules,
    domain,
    name,
    cell,
    coordinators,
    tenants,
    staticShare,
    unknownTenant,
    shadow,
    tableCapacity,
    tableFull,
    watchRules,
    registry,
    logger: o.logger ?? logger,
  };
  for (const k of Object.keys(out)) if (out[k] === undefined) delete out[k];
  return out as unknown as LimiterOptions;
}
