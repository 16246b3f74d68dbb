// The commands of the replicated quota ledger: what the coordinator's Raft log carries, one command
// per entry. Every command is validated by the zod schemas below before the ledger looks at it, so
// every replica refuses exactly the same malformed input; the ledger then applies the semantic checks
// (does the tier exist, would the grants break the bound, ...).
//
// Time never comes from the replica's clock: the commands that need it (registerCell,
// reportAndGrant, expireLeases) carry `nowMs`, stamped by the leader when it proposes them.
//
// Encoding: one msgpack document `[version, body]`, plain msgpack (no msgpackr records or shared
// structures), so an entry is self-describing and decodes the same anywhere. Version 1
// (COMMAND_FORMAT_VERSION): the body is the command object. Version 2 (ROUND_FORMAT_VERSION): the
// body is a `reportAndGrant` round in the compact columnar form of round-codec.ts (binary), ~6× smaller
// than the object form; encodeCommand writes every round that way, decodeCommand reads both (logs
// written before keep decoding). Decoding validates with the same schemas either way. Numbers are
// encoded exactly; there is no -0 on the wire, and the ledger stores +0 wherever a -0 could enter.
// Every replica must read format 2 before a leader writes it (an older replica would apply such a
// round as INVALID and diverge): the leader writes format 2 only while every member declared it reads
// it (the peers' COMMAND_FORMAT_HEADER, coordinator-node.ts), format 1 otherwise; see
// docs/quota-model.md, "Upgrades", for the rule that remains (no downgrade once format 2 is written).

import { Packr, Unpackr } from 'msgpackr';
import { z } from 'zod';
import { packRound, RoundCodecError, unpackRound } from './round-codec.js';
import type { QuotaKind } from '../../shared/quota-keys.js';
import { CellquotaError } from '../../shared/errors.js';

// ---- bounds -------------------------------------------------------------------------------------

/** Longest tier name, tenant id, cell id, domain name or client id. */
export const MAX_NAME_LENGTH = 128;
/** The characters of a name: letters, digits and `.`, `_`, `:`, `-`. */
export const NAME_PATTERN = /^[a-zA-Z0-9._:-]+$/;
/** Most tenants the ledger holds. */
export const MAX_TENANTS = 1_000_000;
/** Most tiers the ledger holds. */
export const MAX_TIERS = 1_000;
/** Most domain-wide caps the ledger holds. */
export const MAX_DOMAIN_CAPS = 100;
/** Most cells that may register. */
export const MAX_CELLS = 64;
/** Largest rate (requests per second) of a quota or a grant. */
export const MAX_RATE = 1e9;
/** Largest burst (requests) of a quota or a grant. */
export const MAX_BURST = 1e12;
/** Largest timestamp (ms since the epoch) a command may carry: JavaScript's own Date limit. */
export const MAX_TIME_MS = 8.64e15;
/** Most tenants one putTenants command (one Raft entry) creates or replaces. */
export const MAX_TENANTS_PER_BATCH = 5_000;
/** Most grants, and separately most acknowledgements, in one allocation round. */
export const MAX_ROUND_ITEMS = 1 << 20;
/** The floor fraction of a tier or cap when the command leaves it out. */
export const DEFAULT_FLOOR_FRACTION = 0;
/** Version tag of the encoded form of a command object. */
export const COMMAND_FORMAT_VERSION = 1;
/** Version tag of a reportAndGrant round in the compact form (round-codec.ts). Decoding refuses any other tag. */
export const ROUND_FORMAT_VERSION = 2;
/**
 * The command format that adds retireImplicitTenants (encoded as format 1 objects; an older replica would apply it as
 * INVALID and diverge, so a leader proposes it only while every member declared this format).
 */
export const RETIRE_IMPLICIT_FORMAT = 3;
/**
 * The command format that adds reviveImplicitTenants (format 1 objects, proposed only while every member declared it).
 * A leader winds idle implicit tenants down only at this format too: a wind-down must be cancellable when demand comes
 * back.
 */
export const REVIVE_IMPLICIT_FORMAT = 4;
/**
 * The first command format the log itself raises (raiseCommandFormat, proposed only while every member declared it):
 * the ledger's state carries the format its entries apply at (`Ledger.commandFormat`, in snapshots too), so what an
 * existing command does when applied depends on the log, never on the build. From format 5 on: deleteTenant under
 * tier:NAME winds the tenant down (until reviveImplicitTenants takes it back), putSettings becoming tier:NAME winds
 * down the slices it finds without a tenant record and leaving tier:NAME ends every wind-down, and
 * reviveImplicitTenants re-grants every slice at the tier's definition. Below it (a log never raised) each of them
 * applies exactly as the builds before format 5 applied it (deleteTenant and putSettings as before 4b1f897).
 */
export const TENANT_WIND_DOWN_FORMAT = 5;
/**
 * The command format from which the ledger keeps a tombstone per removed cell id (the highest epoch the cell was
 * issued, in snapshots too): a cell removed and registered again under the same id continues its epochs above it, so
 * epochs only grow for a (key, cell) across that too. Below it (a log never raised) a re-registered cell starts its
 * epochs afresh, exactly as the builds before it did.
 */
export const CELL_TOMBSTONE_FORMAT = 6;
/**
 * The command format that adds dropReleasedSlices: the lease leader drops a cell's slice of a key the cell's agent
 * released (ReportRequest.released, past --max-lease-keys) when the release names the slice's current epoch and its
 * stamped floors are within the cell's floor, so the slices per cell follow the keys the agent holds (before, the
 * ledger counted every slice a cell was ever granted). Proposed only once the log is raised to it; below it the
 * ledger refuses the command (INVALID, nothing changed), as a build without it does.
 */
export const RELEASED_SLICES_FORMAT = 7;
/** The command format a ledger's state is at before any raiseCommandFormat applied. */
export const BASE_COMMAND_FORMAT = 1;
/** The newest command format this build reads and applies (what a replica declares to its peers). */
export const NEWEST_COMMAND_FORMAT = RELEASED_SLICES_FORMAT;

// ---- quota keys ---------------------------------------------------------------------------------

/**
 * A global quota is named by a key: `tenant/<id>` (the tenant's quota: its tier's rate and burst or
 * its overrides), `tier/<name>` (the optional aggregate cap over all tenants of a tier) or
 * `domain/<name>` (the optional domain-wide cap). `/` is not a name character, so keys are
 * unambiguous.
 */
export type { QuotaKey, QuotaKind } from '../../shared/quota-keys.js';
export { domainCapKey, tenantKey, tierCapKey } from '../../shared/quota-keys.js';
export function parseQuotaKey(key: string): { readonly kind: QuotaKind; readonly name: string } | undefined {
  const slash = key.indexOf('/');
  if (slash < 0) return undefined;
  const kind = key.slice(0, slash);
  const name = key.slice(slash + 1);
  if ((kind !== 'tenant' && kind !== 'tier' && kind !== 'domain') || !isName(name)) return undefined;
  return { kind, name };
}
export function isName(s: string): boolean {
  return s.length >= 1 && s.length <= MAX_NAME_LENGTH && NAME_PATTERN.test(s);
}

// ---- schemas ------------------------------------------------------------------------------------

const normalise = (v: number): number => v + 0; // -0 + 0 === +0
export const nameSchema = z
  .string()
  .min(1)
  .max(MAX_NAME_LENGTH)
  .regex(NAME_PATTERN, `a name is 1..${MAX_NAME_LENGTH} characters of [a-zA-Z0-9._:-]`);
/** `tenant/<id>`, `tier/<name>` or `domain/<name>`. */
export const QUOTA_KEY_PATTERN = new RegExp(`^(tenant|tier|domain)/[a-zA-Z0-9._:-]{1,${MAX_NAME_LENGTH}}$`);
/** Validated as a QuotaKey; typed as a plain string (a transform would cost on every grant of a round). */
export const quotaKeySchema = z
  .string()
  .regex(QUOTA_KEY_PATTERN, 'a quota key is tenant/<id>, tier/<name> or domain/<name>');
/** A quota's rate in requests per second: > 0. */
export const rateSchema = z.number().gt(0).max(MAX_RATE);
/** A quota's burst in requests: ≥ 1. */
export const burstSchema = z.number().min(1).max(MAX_BURST);
/** The share of a quota split evenly over the cells as their static floors: 0..1. */
export const floorFractionSchema = z.number().min(0).max(1).transform(normalise);
// The per-grant numbers are not normalised here (a transform per field costs on big rounds): the
// ledger adds 0 where it stores them, which turns -0 into 0.
const grantRateSchema = z.number().min(0).max(MAX_RATE);
const grantBurstSchema = z.number().min(0).max(MAX_BURST);
const timeSchema = z.number().min(0).max(MAX_TIME_MS);
const epochSchema = z.number().int().min(1).max(Number.MAX_SAFE_INTEGER);

/** Optional de-duplication tag: a client numbers its writes 1, 2, 3 ...; a retry reuses the number. */
export const sessionSchema = z.strictObject({
  clientId: nameSchema,
  seq: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER),
});

const session = { session: sessionSchema.optional() };

export const putTierSchema = z.strictObject({
  type: z.literal('putTier'),
  name: nameSchema,
  rate: rateSchema,
  burst: burstSchema,
  floorFraction: floorFractionSchema.optional(),
  ...session,
});
/** Refused (CONFLICT) while any tenant is on the tier. Also removes the tier's cap. */
export const deleteTierSchema = z.strictObject({ type: z.literal('deleteTier'), name: nameSchema, ...session });
/** The aggregate cap over all tenants of a tier. */
export const putTierCapSchema = z.strictObject({
  type: z.literal('putTierCap'),
  tier: nameSchema,
  rate: rateSchema,
  burst: burstSchema,
  floorFraction: floorFractionSchema.optional(),
  ...session,
});
export const deleteTierCapSchema = z.strictObject({ type: z.literal('deleteTierCap'), tier: nameSchema, ...session });
/** The domain-wide cap (all traffic of an Envoy rate-limit domain). */
export const putDomainCapSchema = z.strictObject({
  type: z.literal('putDomainCap'),
  domain: nameSchema,
  rate: rateSchema,
  burst: burstSchema,
  floorFraction: floorFractionSchema.optional(),
  ...session,
});
export const deleteDomainCapSchema = z.strictObject({
  type: z.literal('deleteDomainCap'),
  domain: nameSchema,
  ...session,
});
/** Creates or replaces a tenant; `rate`/`burst` override the tier's (left out: the tier's). */
export const putTenantSchema = z.strictObject({
  type: z.literal('putTenant'),
  id: nameSchema,
  tier: nameSchema,
  rate: rateSchema.optional(),
  burst: burstSchema.optional(),
  ...session,
});
/** One tenant of a putTenants batch: what PUT /v1/tenants/:id takes, with the id. */
export const tenantRecordSchema = z.strictObject({
  id: nameSchema,
  tier: nameSchema,
  rate: rateSchema.optional(),
  burst: burstSchema.optional(),
});
/**
 * Creates or replaces many tenants in one entry (bulk import). Each tenant is applied on its own,
 * in order, as putTenant would: one that fails (its tier does not exist, its window is not valid,
 * the tenant limit is reached) changes nothing and is reported with its position; the others apply.
 * A tenant already stored exactly so is left untouched (its updatedIndex too), so a re-run changes
 * nothing.
 */
export const putTenantsSchema = z.strictObject({
  type: z.literal('putTenants'),
  tenants: z.array(tenantRecordSchema).min(1).max(MAX_TENANTS_PER_BATCH),
  ...session,
});
export const deleteTenantSchema = z.strictObject({ type: z.literal('deleteTenant'), id: nameSchema, ...session });
/** A cell's first contact (idempotent: registering a known cell changes nothing but the clock). */
export const registerCellSchema = z.strictObject({
  type: z.literal('registerCell'),
  cellId: nameSchema,
  nowMs: timeSchema,
  ...session,
});
/**
 * The operator deregisters a cell: no more renewals or grants; dropped, with its slices, and its
 * floor slot freed once its lease has surely expired (at once when it has none).
 */
export const removeCellSchema = z.strictObject({
  type: z.literal('removeCell'),
  cellId: nameSchema,
  nowMs: timeSchema,
  ...session,
});

/** A cell reported in this round; its lease now runs (at least) until `leaseExpiresAtMs`. */
export const leaseRenewalSchema = z.strictObject({ cellId: nameSchema, leaseExpiresAtMs: timeSchema });
/** The cell has applied the grant of this epoch (and the floor delivered with it). */
export const grantAckSchema = z.strictObject({ key: quotaKeySchema, cellId: nameSchema, epoch: epochSchema });
/** A new grant for one quota and one cell; `epoch` must exceed the slice's current epoch. */
export const grantSchema = z.strictObject({
  key: quotaKeySchema,
  cellId: nameSchema,
  rate: grantRateSchema,
  burst: grantBurstSchema,
  epoch: epochSchema,
  leaseExpiresAtMs: timeSchema,
});
/**
 * One allocation round, atomically: acknowledgements first (they may free capacity), then lease
 * renewals, then the changed grants (only the changes: the log grows with changes, not with
 * tenants × cells). Refused as a whole if any grant would break the bound.
 */
export const reportAndGrantSchema = z.strictObject({
  type: z.literal('reportAndGrant'),
  nowMs: timeSchema,
  leases: z.array(leaseRenewalSchema).max(MAX_CELLS).optional(),
  acks: z.array(grantAckSchema).max(MAX_ROUND_ITEMS).optional(),
  grants: z.array(grantSchema).max(MAX_ROUND_ITEMS).optional(),
  ...session,
});
/**
 * What every agent does with a tenant the ledger does not hold: `deny` refuses its checks, `allow`
 * admits them without a tenant level (a domain cap still applies; the ledger counts nothing for it:
 * it has no quota to bound), `tier:NAME` gives it tier NAME's quota — an implicit tenant: the ledger
 * defines `tenant/<id>` as a tenant of NAME without overrides (quotaOf), so its slices are granted,
 * floored, counted and bounded exactly as a tenant's, and agents learn it through the same grants.
 * The tier must exist; it cannot be deleted while the policy names it.
 */
export type UnknownTenantPolicyName = 'deny' | 'allow' | `tier:${string}`;
export const DEFAULT_UNKNOWN_TENANT_POLICY: UnknownTenantPolicyName = 'deny';
export const UNKNOWN_TENANT_POLICY_MESSAGE =
  `deny, allow or tier:NAME (NAME a tier: 1..${MAX_NAME_LENGTH} ` + 'characters of [a-zA-Z0-9._:-])';
/** The tier an unknown-tenant policy names, or null (deny, allow). */
export function unknownTenantTier(p: UnknownTenantPolicyName): string | null {
  return p.startsWith('tier:') ? p.slice(5) : null;
}
export const unknownTenantPolicySchema = z
  .string()
  .refine(
    (s) => s === 'deny' || s === 'allow' || (s.startsWith('tier:') && isName(s.slice(5))),
    UNKNOWN_TENANT_POLICY_MESSAGE,
  )
  .transform((s) => s as UnknownTenantPolicyName);
/** The cluster-wide settings agents follow (only the unknown-tenant policy today). */
export const putSettingsSchema = z.strictObject({
  type: z.literal('putSettings'),
  unknownTenant: unknownTenantPolicySchema,
  ...session,
});
/** Most implicit tenants one retireImplicitTenants or reviveImplicitTenants command names. */
export const MAX_RETIRE_PER_COMMAND = 10_000;
const implicitTenantKeysSchema = z
  .array(quotaKeySchema.refine((k) => k.startsWith('tenant/'), 'a tenant key (tenant/ID)'))
  .min(1)
  .max(MAX_RETIRE_PER_COMMAND);
/**
 * Winds down implicit tenants (unknown-tenant policy tier:NAME) that no cell reported demand for within the
 * coordinator's --implicit-tenant-idle-ms, as a deletion: their slices take zero grants and are dropped once nothing
 * on them is counted. Keys that are not implicit tenants when it applies are left alone. Format 3
 * (RETIRE_IMPLICIT_FORMAT): a leader proposes it only while every member reads format 4 (REVIVE_IMPLICIT_FORMAT), and
 * only for keys whose every slice holder has a live lease (Ledger.retirable).
 */
export const retireImplicitTenantsSchema = z.strictObject({
  type: z.literal('retireImplicitTenants'),
  keys: implicitTenantKeysSchema,
  ...session,
});
/**
 * Takes winding-down tenant keys back as implicit tenants of the policy's tier (demand came back, within
 * --max-implicit-tenants): their quota is the tier's again, its ceiling rebased on what their cells may still use.
 * Keys not winding down when it applies are left alone. Format 4 (REVIVE_IMPLICIT_FORMAT).
 */
export const reviveImplicitTenantsSchema = z.strictObject({
  type: z.literal('reviveImplicitTenants'),
  keys: implicitTenantKeysSchema,
  ...session,
});
/**
 * Raises the command format the ledger applies entries at (Ledger.commandFormat) to `format`; never lowers it (a
 * format at or below the current one changes nothing). The lease leader proposes it once every member of the
 * configuration declared it reads `format`. A replica that cannot apply `format` stops at this entry (it never
 * applies later entries at semantics it does not have). Format 5 (TENANT_WIND_DOWN_FORMAT).
 */
export const raiseCommandFormatSchema = z.strictObject({
  type: z.literal('raiseCommandFormat'),
  format: z.number().int().min(TENANT_WIND_DOWN_FORMAT).max(999_999),
  ...session,
});
/** Most releases one dropReleasedSlices command (one Raft entry) carries: 5,000 releases of the longest keys and cell
 * ids encode to ~1.5 MB (20,000 encoded to 5.9 MB and took 181 ms to decode, in every replica's apply path). */
export const MAX_DROPS_PER_COMMAND = 5_000;
/** One release: `cellId`'s agent holds nothing for `key` and gave back the grant of `epoch`. */
export const sliceReleaseSchema = z.strictObject({ key: quotaKeySchema, cellId: nameSchema, epoch: epochSchema });
/**
 * Drops the slices whose cell's agent released them (ReportRequest.released): a slice goes only if its current epoch is
 * the released one (a grant sent after the release, at a higher epoch, is kept) and its floors (stamped and held) are
 * within the cell's floor for the key, which the ledger counts for a cell without a slice; the cell's epoch mark rises
 * to the dropped epoch. Others are left alone. Format 7 (RELEASED_SLICES_FORMAT): refused below it.
 */
export const dropReleasedSlicesSchema = z.strictObject({
  type: z.literal('dropReleasedSlices'),
  releases: z.array(sliceReleaseSchema).min(1).max(MAX_DROPS_PER_COMMAND),
  ...session,
});
/** Advances the ledger's clock; grants of cells whose lease has surely expired fall back to floors. */
export const expireLeasesSchema = z.strictObject({ type: z.literal('expireLeases'), nowMs: timeSchema, ...session });

export const ledgerCommandSchema = z.discriminatedUnion('type', [
  putTierSchema,
  deleteTierSchema,
  putTierCapSchema,
  deleteTierCapSchema,
  putDomainCapSchema,
  deleteDomainCapSchema,
  putTenantSchema,
  putTenantsSchema,
  deleteTenantSchema,
  registerCellSchema,
  removeCellSchema,
  reportAndGrantSchema,
  expireLeasesSchema,
  putSettingsSchema,
  retireImplicitTenantsSchema,
  reviveImplicitTenantsSchema,
  raiseCommandFormatSchema,
  dropReleasedSlicesSchema,
]);

// ---- types --------------------------------------------------------------------------------------

/** A validated command (what the ledger applies). */
export type LedgerCommand = z.output<typeof ledgerCommandSchema>;
/** What a caller may hand in (before validation and normalisation). */
export type LedgerCommandInput = z.input<typeof ledgerCommandSchema>;
export type SessionTag = z.output<typeof sessionSchema>;
export type PutTierCommand = z.output<typeof putTierSchema>;
export type DeleteTierCommand = z.output<typeof deleteTierSchema>;
export type PutTierCapCommand = z.output<typeof putTierCapSchema>;
export type DeleteTierCapCommand = z.output<typeof deleteTierCapSchema>;
export type PutDomainCapCommand = z.output<typeof putDomainCapSchema>;
export type DeleteDomainCapCommand = z.output<typeof deleteDomainCapSchema>;
export type PutTenantCommand = z.output<typeof putTenantSchema>;
export type PutTenantsCommand = z.output<typeof putTenantsSchema>;
export type TenantRecord = z.output<typeof tenantRecordSchema>;
export type DeleteTenantCommand = z.output<typeof deleteTenantSchema>;
export type RegisterCellCommand = z.output<typeof registerCellSchema>;
export type RemoveCellCommand = z.output<typeof removeCellSchema>;
export type ReportAndGrantCommand = z.output<typeof reportAndGrantSchema>;
export type ExpireLeasesCommand = z.output<typeof expireLeasesSchema>;
export type PutSettingsCommand = z.output<typeof putSettingsSchema>;
export type RetireImplicitTenantsCommand = z.output<typeof retireImplicitTenantsSchema>;
export type ReviveImplicitTenantsCommand = z.output<typeof reviveImplicitTenantsSchema>;
export type RaiseCommandFormatCommand = z.output<typeof raiseCommandFormatSchema>;
export type DropReleasedSlicesCommand = z.output<typeof dropReleasedSlicesSchema>;
export type SliceRelease = z.output<typeof sliceReleaseSchema>;
export type LeaseRenewal = z.output<typeof leaseRenewalSchema>;
export type GrantAck = z.output<typeof grantAckSchema>;
export type Grant = z.output<typeof grantSchema>;

// ---- validation and encoding --------------------------------------------------------------------

export class LedgerCommandError extends CellquotaError {
  readonly code = 'LEDGER_COMMAND_INVALID';
}

export type CommandParse =
  { readonly ok: true; readonly command: LedgerCommand } | { readonly ok: false; readonly message: string };

/** Commands this module produced by validation (zod returns fresh objects), so the ledger need not validate twice. */
const validated = new WeakSet<object>();

/**
 * True if `cmd` is an object returned by parseCommand or decodeCommand. Such objects must not be
 * mutated afterwards: the ledger applies them without validating again.
 */
export function isValidatedCommand(cmd: unknown): cmd is LedgerCommand {
  return typeof cmd === 'object' && cmd !== null && validated.has(cmd);
}

/** Validates (and normalises) a command; never throws. */
export function parseCommand(input: unknown): CommandParse {
  if (isValidatedCommand(input)) return { ok: true, command: input };
  const r = ledgerCommandSchema.safeParse(input);
  if (r.success) {
    validated.add(r.data);
    return { ok: true, command: r.data };
  }
  return { ok: false, message: describeIssues(r.error.issues) };
}

export function describeIssues(
  issues: readonly { readonly path: readonly PropertyKey[]; readonly message: string }[],
): string {
  const shown = issues
    .slice(0, 3)
    .map((i) => `${i.path.length > 0 ? i.path.map(String).join('.') : '(root)'}: ${i.message}`);
  const more = issues.length > 3 ? ` (+${issues.length - 3} more)` : '';
  return `invalid command: ${shown.join('; ')}${more}`;
}

const packr = new Packr({ useRecords: false, moreTypes: false });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, moreTypes: false });

/**
 * Validates and encodes a command for the Raft log. Throws LedgerCommandError if it is invalid.
 * `compactRounds: false` writes a round in format 1 (while some replica does not read format 2).
 */
export function encodeCommand(cmd: LedgerCommandInput, opts: { readonly compactRounds?: boolean } = {}): Uint8Array {
  const p = parseCommand(cmd);
  if (!p.ok) throw new LedgerCommandError(p.message);
  if (p.command.type === 'reportAndGrant' && opts.compactRounds !== false)
    return packr.pack([ROUND_FORMAT_VERSION, packRound(p.command)]);
  return packr.pack([COMMAND_FORMAT_VERSION, p.command]);
}

/**
 * The object form (format 1) of a command, as entries were written before the compact round form (bench baseline,
 * tests).
 */
export function encodeCommandV1(cmd: LedgerCommandInput): Uint8Array {
  const p = parseCommand(cmd);
  if (!p.ok) throw new LedgerCommandError(p.message);
  return packr.pack([COMMAND_FORMAT_VERSION, p.command]);
}

const ROUND_LIMITS = { maxItems: MAX_ROUND_ITEMS, maxCells: MAX_CELLS, maxNameLength: MAX_NAME_LENGTH };

/** Decodes and validates a command from the Raft log. Throws LedgerCommandError if it is not one. */
export function decodeCommand(bytes: Uint8Array): LedgerCommand {
  let doc: unknown;
  try {
    doc = unpackr.unpack(bytes);
  } catch (e) {
    throw new LedgerCommandError(`undecodable command: ${String(e instanceof Error ? e.message : e).slice(0, 200)}`, {
      cause: e,
    });
  }
  if (!Array.isArray(doc) || doc.length !== 2)
    throw new LedgerCommandError('undecodable command: not [version, command]');
  const [version, raw] = doc as [unknown, unknown];
  let body: unknown = raw;
  if (version === ROUND_FORMAT_VERSION) {
    if (!(raw instanceof Uint8Array))
      throw new LedgerCommandError('undecodable command: a format 2 body must be binary');
    try {
      body = { type: 'reportAndGrant', ...unpackRound(raw, ROUND_LIMITS) };
    } catch (e) {
      if (e instanceof RoundCodecError) throw new LedgerCommandError(`undecodable round: ${e.message}`, { cause: e });
      throw e;
    }
  } else if (version !== COMMAND_FORMAT_VERSION)
    throw new LedgerCommandError(`unsupported command format version ${String(version)}`);
  const p = parseCommand(body);
  if (!p.ok) throw new LedgerCommandError(p.message);
  return p.command;
}
