// Global quotas of an agent running alone (no --coordinators): a static table of tiers and tenants
// (the agent's `--tenants` YAML), and this cell's static share of each. An agent with coordinators
// takes every definition from them instead (CoordinatedQuotas below): --tenants, --static-share
// and --unknown-tenant are refused there, so a file can never disagree with the ledger.
//
//   tiers:
//     bronze: {rate: 500, burst: 1000}                        # tokens/s and bucket depth, for ALL cells
//     gold:   {rate: 5000, burst: 10000, cap: {rate: 20000, burst: 40000}}   # cap: all gold tenants together
//   tenants:
//     acme: gold                                             # id → tier
//     globex: {tier: bronze, rate: 800, burst: 1600}          # with overrides
//   domainCap: {rate: 50000, burst: 100000}                   # optional: all global traffic of a domain
//
// A `global: true` rule's value is the tenant id (for the key `tenant`, and for any other key marked
// global: the quota is looked up by the value). This cell uses `staticShare` (0 < s ≤ 1) of every
// global quota — tenant, tier cap and domain cap: rate·s and floor(burst·s) — so N cells with shares
// summing to ≤ 1 never admit more than the quota together (docs/quota-model.md "The bound"). Global buckets start
// EMPTY (limitFromRate's default), so a restart never releases an extra burst.
//
// An unknown tenant (not in the table) gets the configured policy: a default tier (its own bucket at
// that tier's slice, plus that tier's cap), deny (always over the limit), or allow (no tenant
// level; the domain cap still applies).
//
// The tenants file's schema and loading are in quota-file.ts (zod, yaml), so a serving thread that
// only decides does not load them.
import { limitFromRate } from '../buckets/gcra.js';
import type { GcraLimit } from '../buckets/gcra.js';
import type { RlsRateLimit } from '../messages/rls-messages.js';
import { planted } from '../../shared/planted-bugs.js';
import { CellquotaError } from '../../shared/errors.js';
import type { QuotaFile, RateBurst, UnknownTenantPolicy } from './quota-file.js';

export type { QuotaFile, RateBurst, UnknownTenantPolicy } from './quota-file.js';

/** Response unit numbers (RateLimitResponse.RateLimit.Unit). */
const UNIT_SECOND = 1;
const UNIT_MINUTE = 2;
const UNIT_HOUR = 3;
const UNIT_DAY = 4;

/** The --unknown-tenant policy's text form (parseUnknownTenantPolicy in quota-file.ts reads it). */
export function formatUnknownTenantPolicy(p: UnknownTenantPolicy): string {
  return p.kind === 'tier' ? `tier:${p.tier}` : p.kind;
}

/** An error in the tenants file or in how the policy refers to it. */
export class QuotaConfigError extends CellquotaError {
  readonly code = 'QUOTA_CONFIG_INVALID';
  constructor(message: string) {
    super(message);
    this.name = 'QuotaConfigError';
  }
}

/** A global quota as this cell enforces it: its slice as a GCRA limit, and what to report. */
export interface QuotaSlice {
  readonly limit: GcraLimit;
  readonly currentLimit: RlsRateLimit;
  /** The slice: rate·share per second and floor(burst·share). */
  readonly rate: number;
  readonly burst: number;
}

export interface TierQuota {
  readonly name: string;
  readonly tenant: QuotaSlice;
  readonly cap: QuotaSlice | null;
}

export type TenantResolution =
  | { readonly kind: 'quota'; readonly tier: TierQuota; readonly tenant: QuotaSlice; readonly known: boolean }
  | { readonly kind: 'deny' }
  | { readonly kind: 'allow' };

export interface StaticQuotaOptions {
  /** This cell's share of every global quota, in (0, 1]. */
  readonly staticShare: number;
  readonly unknownTenant: UnknownTenantPolicy;
}

/** The static tier/tenant table with this cell's slices precomputed. Immutable. */
export class StaticQuotas {
  readonly domainCap: QuotaSlice | null;
  readonly staticShare: number;
  readonly unknownTenant: UnknownTenantPolicy;
  private readonly tiers = new Map<string, TierQuota>();
  private readonly tenants = new Map<string, { tier: TierQuota; tenant: QuotaSlice }>();
  private readonly unknownResolution: TenantResolution;

  constructor(
    readonly file: QuotaFile,
    opts: StaticQuotaOptions,
  ) {
    if (!(opts.staticShare > 0 && opts.staticShare <= 1))
      throw new QuotaConfigError(`static share must be in (0, 1], got ${opts.staticShare}`);
    this.staticShare = opts.staticShare;
    this.unknownTenant = opts.unknownTenant;
    const share = opts.staticShare;
    for (const [name, t] of Object.entries(file.tiers)) {
      this.tiers.set(name, {
        name,
        tenant: sliceOf(t, share, name),
        cap: t.cap === undefined ? null : sliceOf(t.cap, share, `tier-cap:${name}`),
      });
    }
    for (const [id, t] of Object.entries(file.tenants)) {
      const tierName = typeof t === 'string' ? t : t.tier;
      const tier = this.tiers.get(tierName);
      if (tier === undefined) throw new QuotaConfigError(`tenant '${id}': unknown tier '${tierName}'`);
      const own =
        typeof t === 'string' || (t.rate === undefined && t.burst === undefined)
          ? tier.tenant
          : sliceOf(
              { rate: t.rate ?? file.tiers[tierName]?.rate ?? 0, burst: t.burst ?? file.tiers[tierName]?.burst ?? 0 },
              share,
              tierName,
            );
      this.tenants.set(id, { tier, tenant: own });
    }
    this.domainCap = file.domainCap === undefined ? null : sliceOf(file.domainCap, share, 'domain-cap');
    const policy = opts.unknownTenant;
    if (policy.kind === 'tier') {
      const tier = this.tiers.get(policy.tier);
      if (tier === undefined)
        throw new QuotaConfigError(
          `unknown-tenant policy names tier '${policy.tier}', which the tenants file does not define`,
        );
      this.unknownResolution = { kind: 'quota', tier, tenant: tier.tenant, known: false };
    } else {
      this.unknownResolution = policy;
    }
  }

  /** An empty table (no `--tenants`): every tenant is unknown. */
  static empty(opts: StaticQuotaOptions): StaticQuotas {
    return new StaticQuotas({ tiers: {}, tenants: {} }, opts);
  }

  /** A tier by name (its per-tenant slice and cap at this cell's share). */
  tier(name: string): TierQuota | undefined {
    return this.tiers.get(name);
  }

  resolve(tenantId: string): TenantResolution {
    const t = this.tenants.get(tenantId);
    return t === undefined ? this.unknownResolution : { kind: 'quota', tier: t.tier, tenant: t.tenant, known: true };
  }

  /** Slices whose burst rounds down to 0 tokens at this share (they refuse everything): for a start-up warning. */
  zeroSlices(): string[] {
    const out: string[] = [];
    for (const tier of this.tiers.values()) {
      if (tier.tenant.burst < 1 || tier.tenant.rate <= 0) out.push(`tier ${tier.name}`);
      if (tier.cap !== null && (tier.cap.burst < 1 || tier.cap.rate <= 0)) out.push(`tier cap ${tier.name}`);
    }
    if (this.domainCap !== null && (this.domainCap.burst < 1 || this.domainCap.rate <= 0)) out.push('domain cap');
    return out;
  }

  get tenantCount(): number {
    return this.tenants.size;
  }

  get tierCount(): number {
    return this.tiers.size;
  }
}

function sliceOf(q: RateBurst, share: number, name: string): QuotaSlice {
  const rate = q.rate * share;
  const burst = Math.floor(q.burst * share + 1e-9);
  return {
    limit: limitFromRate(rate, burst, { start: 'empty' }),
    currentLimit: reportedLimit(rate, name),
    rate,
    burst,
  };
}

/**
 * current_limit for a rate in tokens/s: the smallest unit (second, minute, hour, day) in which the
 * rate is at least one whole request, rounded down.
 */
export function reportedLimit(ratePerSecond: number, name: string): RlsRateLimit {
  const units: readonly [number, number][] = [
    [UNIT_SECOND, 1],
    [UNIT_MINUTE, 60],
    [UNIT_HOUR, 3600],
    [UNIT_DAY, 86400],
  ];
  for (const [unit, seconds] of units) {
    const perUnit = Math.floor(ratePerSecond * seconds + 1e-9);
    if (perUnit >= 1) return { requestsPerUnit: Math.min(perUnit, 0xffffffff), unit, name };
  }
  return { requestsPerUnit: 0, unit: UNIT_SECOND, name };
}

// ---- with coordinators --------------------------------------------------------------------------

/** A coordinator-defined slice (QuotaOverrides' entries): the numbers, the tenant's cap, unknown or not. */
export interface CoordinatedSlice extends QuotaSlice {
  /** For a tenant: the cap its checks must also pass (`tier/<name>`), or null. */
  readonly parent: string | null;
  /** An unknown tenant the coordinator's policy admits (no tenant level of its own). */
  readonly unknown: boolean;
}

/** A coordinator entry as the deciders read it (lease/quota-overrides.ts computes them from the grants). */
export interface OverrideSlice extends CoordinatedSlice {
  readonly leased: boolean;
  readonly epoch: number | null;
  /**
   * A leased grant's lease generation: in force only while LeaseDeadline.live(lease, now); null: no deadline to
   * check.
   */
  readonly lease: number | null;
  /** What a leased grant decides on once its lease ended (its floor, not leased); null when `lease` is null. */
  readonly floor: OverrideSlice | null;
}

/** What the deciders read of the coordinator's entries (lease/quota-overrides.ts's QuotaOverrides). */
export interface OverrideLookup {
  readonly size: number;
  get(key: string): OverrideSlice | undefined;
}

/** What the deciders read of the lease's end in shared memory (lease/lease-deadline.ts's LeaseDeadline). */
export interface LeaseLiveness {
  /** Whether a grant of lease generation `generation` is in force at `nowNs` (the deciders' clock). */
  live(generation: number, nowNs: bigint): boolean;
}

/** Where CoordinatedQuotas reads the coordinator's definitions (QuotaOverrides). */
export interface CoordinatedLookup {
  get(key: string): CoordinatedSlice | undefined;
}

/** Nothing: every take is refused (a key the coordinator has not granted yet). */
export const PENDING_SLICE: QuotaSlice = Object.freeze({
  limit: limitFromRate(0, 0, { start: 'empty' }),
  currentLimit: { requestsPerUnit: 0, unit: UNIT_SECOND, name: 'pending' },
  rate: 0,
  burst: 0,
});
const NO_TIER: TierQuota = Object.freeze({ name: '', tenant: PENDING_SLICE, cap: null });

/**
 * The quota table of an agent with coordinators: every answer comes from what the coordinator sent
 * (the lease client's entries), nothing from a file.
 *   - a tenant with an entry: its slice (grant or floor) and, when the coordinator names a parent
 *     `tier/<name>`, that tier cap as a second level (its own entry, or refused until granted);
 *   - an unknown tenant the coordinator's policy admits: a limit no traffic reaches (the level
 *     exists so its traffic is still reported, and a tenant created later is learned);
 *   - a tenant with no entry: PENDING_SLICE, refused. Its refusals are reported as demand under
 *     `tenant/<id>`, which is how the coordinator learns the agent needs it: the next answer grants
 *     it (within one report interval and one round). The ledger counts such a cell at its floor
 *     slot, never below what it uses (nothing).
 *   - a domain cap: the `domain/<d>` entry when the coordinator lists the domain as capped (the
 *     decider looks it up; a capped domain not granted yet has a pending zero entry), else none.
 */
export class CoordinatedQuotas extends StaticQuotas {
  /** `staticFallback`: only what the planted bug 'uncounted-static-share' decides on (the quota simulation). */
  constructor(
    private readonly lookup: CoordinatedLookup,
    private readonly staticFallback: StaticQuotas | null = null,
  ) {
    super({ tiers: {}, tenants: {} }, { staticShare: 1, unknownTenant: { kind: 'deny' } });
  }

  override resolve(tenantId: string): TenantResolution {
    const o = this.lookup.get(`tenant/${tenantId}`);
    if (o === undefined && planted['uncounted-static-share'] && this.staticFallback !== null)
      return this.staticFallback.resolve(tenantId);
    if (o === undefined) return { kind: 'quota', tier: NO_TIER, tenant: PENDING_SLICE, known: false };
    if (o.unknown || o.parent === null) return { kind: 'quota', tier: NO_TIER, tenant: o, known: !o.unknown };
    return {
      kind: 'quota',
      tier: { name: o.parent.slice(o.parent.indexOf('/') + 1), tenant: o, cap: PENDING_SLICE },
      tenant: o,
      known: true,
    };
  }
}
