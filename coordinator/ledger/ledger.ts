// The replicated quota ledger: the deterministic state machine the coordinator's Raft log drives.
// It owns tiers, tenants, the optional tier and domain caps, cells and the slices (per global quota
// and cell: the granted rate and burst, its epoch, the lease, the floor delivered with it).
//
// Pure: no I/O, no wall clock, no randomness. Time comes inside the commands (stamped by the leader),
// and the ledger's clock `nowMs` is the largest time any applied command carried, so it never runs
// backwards when leadership moves to a node whose clock is behind. Everything that iterates does so
// in a canonical order (cells in registration order, snapshots sorted), so two replicas fed the same
// entries hold byte-identical snapshots, and a replica restored from a snapshot goes on exactly like
// the one that wrote it.
//
// ## What a cell "may be using" (u), and the bound
//
// For a global quota q (rate R, burst B, floor fraction φ) and a registered cell c:
//
//     u_rate(c) = max( floor(q, c),            the floor the cell may fall back to at any moment
//                      heldFloorRate(c),       floors delivered with grants it has not yet acknowledged away
//                      live(c) ? heldRate(c) : 0 )
//
// where `heldRate` is the largest rate of every grant the cell may still hold: the current grant and,
// after a shrink, the older larger ones until the cell acknowledges the current epoch; and `live(c)`
// is "the cell's lease has not surely expired": nowMs < leaseExpiresAtMs + skewMarginMs. (The same for
// burst.) The floor is in the max even while the lease is live because an agent may drop to its
// floors at any moment (its own view of the lease ends first; a restart starts on floors), so a grant
// below the floor is never counted below the floor. Unregistered floor slots are counted at the floor
// too (see "Floors" below). The committed state keeps
//
//     Σ_c u_rate(c) ≤ R   and   Σ_c u_burst(c) ≤ B        (within 1e-9 relative, for float sums)
//
// for every quota, except in the transition after an operator lowers a quota (below).
//
// ## The safety rule as implemented
//
// A reportAndGrant round is applied tentatively (with an undo log): the clock advances, cells whose
// lease has surely expired lose their grants (they are on floors), acknowledgements collapse `held`
// to the acknowledged current grant, leases are renewed, then the new grants are applied — a grant
// raises `held` to max(held, new), it never lowers it, so a shrink frees nothing until it is
// acknowledged or the lease surely expires. Then, for every quota the round touches, Σu must be ≤ the
// quota, or (during a transition, below) the grants must not have raised Σu above what it was just
// before them; otherwise the whole round is rolled back and refused with QUOTA_EXCEEDED, changing
// nothing (not even the clock). Acknowledgements, renewals and the passing of time never raise Σu: a
// renewal cannot revive grants already released, because a lease that surely expired is released
// (grants zeroed, lease cleared) by the very command whose time shows it, before anything else.
//
// ## Floors: over a configured expected cell count, not over the registered cells
//
// A cell's floor for a quota is φ × R / floorCells (and φ × B / floorCells), where `floorCells` is
// the expected number of cells, fixed when the ledger is created (replicated through snapshots). The
// first `floorCells` cells to register take the floor slots; a cell registering beyond them has a
// floor of 0 (it serves global quotas on grants only). Slots nobody has registered yet are counted at
// their floor all the same, so Σ floors = φ × R always, and registering a cell changes nobody's floor.
//
// Why not split over the registered cells: a registration would shrink every other cell's floor, and
// a floor shrink, unlike a grant shrink, cannot be released by lease expiry — the floor is exactly
// what a cut-off agent falls back to, and it keeps the last floor it knew for as long as it is cut
// off. So the old floor would have to stay counted until every cell acknowledged the new one, which a
// partitioned cell may not do for hours; meanwhile the newcomer could get no floor without breaking
// the bound. Reserving the slots up front avoids that, and also covers an agent that has not reached
// a coordinator yet and runs on its static share.
//
// Floors still change when an operator changes a quota (rate, burst, φ). A grant stamps the floor
// current when it is applied (`floorRate`/`floorBurst`; the lease service hands the agent that
// value), and a stamped floor counts (`heldFloor*`) until the cell acknowledges a later grant —
// lease expiry does not release it. Assumed of agents: for a global key an agent admits at most
// max(the floor stamped on the latest grant it applied, its grant while its lease lasts); for a key
// it holds no grant for, at most a static share no larger than the key's current floor.
//
// ## Lowering a quota (and other operator changes)
//
// When a quota's configuration changes and the cells may already be using more than the new limit
// (old grants, old floors), nothing is revoked by fiat: the quota gets a ceiling = max(new limit,
// current Σu). The invariant is then Σu ≤ ceiling; while the ceiling is above the limit, rounds may
// only shrink that quota (Σu may not grow); after every command the ceiling ratchets down to
// max(limit, Σu) as acknowledgements and lease expiries release the old grants, and disappears when
// it reaches the limit.
//
// ## Deleting a tenant or cap
//
// Its slices stay as "retired" slices while anything on them is still counted (a cut-off cell may
// still use a grant or floor of the old incarnation), so re-creating the tenant counts them. A
// retired slice disappears once its grant and held floors are all zero; rounds may send it a zero
// grant (the only grant a key without a quota accepts) to get there.
//
// ## Implicit tenants (unknown-tenant policy tier:NAME)
//
// A `tenant/<id>` key without a tenant record is an implicit tenant of NAME while the policy names it:
// quotaOf gives it NAME's quota, and it holds slices like any tenant. `implicitKeys` (derived) lists
// every tenant key some cell holds a slice of with no tenant record, so the lease leader can bound how
// many there are (--max-implicit-tenants): a key counts from its first slice until its last is dropped.
// retireImplicitTenants winds idle ones down as a deletion: the key joins `retiringImplicit`
// (replicated, in the snapshot), where quotaOf has no quota for it, so its slices take zero grants and
// are dropped once nothing on them is counted; then it leaves the set and may come back as a new
// implicit tenant (epochs above the cell's mark, as a re-created tenant's). The leader proposes it only
// for keys `retirable` now (every slice holder's lease live, so it finishes within one lease), and
// reviveImplicitTenants cancels it when demand comes back: the key leaves the set, has the tier's
// quota again, and its ceiling is rebased on what its cells may still use (held grants and floors are
// kept through a wind-down, so nothing on them is forgotten). A tenant key enters the implicit
// tenants only through the leader's --max-implicit-tenants check — its first slice, or a revival — so
// a deleted tenant's slices under tier:NAME, and those the policy finds when it becomes tier:NAME, wind
// down (they join the set) until revived.
//
// ## Errors and sessions
//
// Every error is deterministic and changes no domain state. A command carrying a session tag
// {clientId, seq} is applied at most once: a retry with the same seq returns the first result
// (errors included) without applying again; an older seq is refused with STALE_SESSION. The session
// table is part of the snapshot.

import { ClientSessions } from '../raft/raft-sessions.js';
import type { SessionEntry } from '../raft/raft-sessions.js';
import { Unpackr } from 'msgpackr';
import { SLICE_FIELDS, encodeSnapshotNow } from './snapshot-encoder.js';
import type { LedgerSnapshotCopy, SnapQuotaRow } from './snapshot-encoder.js';
import { z } from 'zod';
import { MAX_GCRA_WINDOW_S, gcraWindowFits } from '../../shared/gcra-window.js';
import {
  BASE_COMMAND_FORMAT,
  DEFAULT_FLOOR_FRACTION,
  DEFAULT_UNKNOWN_TENANT_POLICY,
  MAX_BURST,
  MAX_CELLS,
  MAX_DOMAIN_CAPS,
  MAX_NAME_LENGTH,
  MAX_RATE,
  MAX_TENANTS,
  MAX_TIERS,
  MAX_TIME_MS,
  NEWEST_COMMAND_FORMAT,
  CELL_TOMBSTONE_FORMAT,
  RELEASED_SLICES_FORMAT,
  TENANT_WIND_DOWN_FORMAT,
  LedgerCommandError,
  decodeCommand,
  describeIssues,
  domainCapKey,
  parseCommand,
  QUOTA_KEY_PATTERN,
  unknownTenantPolicySchema,
  unknownTenantTier,
  tenantKey,
  tierCapKey,
} from './ledger-commands.js';
import type {
  DeleteDomainCapCommand,
  DeleteTenantCommand,
  DeleteTierCapCommand,
  DeleteTierCommand,
  ExpireLeasesCommand,
  LedgerCommand,
  LedgerCommandInput,
  PutDomainCapCommand,
  PutTenantCommand,
  PutTenantsCommand,
  PutTierCapCommand,
  PutSettingsCommand,
  PutTierCommand,
  RegisterCellCommand,
  RemoveCellCommand,
  ReportAndGrantCommand,
  RetireImplicitTenantsCommand,
  ReviveImplicitTenantsCommand,
  RaiseCommandFormatCommand,
  DropReleasedSlicesCommand,
  UnknownTenantPolicyName,
} from './ledger-commands.js';
import { CellquotaError } from '../../shared/errors.js';

// ---- configuration ------------------------------------------------------------------------------

/** Default expected cell count over which floors are split. */
export const DEFAULT_FLOOR_CELLS = 3;
/** Default margin added to a lease before the coordinator treats it as surely expired. */
export const DEFAULT_SKEW_MARGIN_MS = 1_000;
/** Default size of the client session table. */
export const DEFAULT_MAX_SESSIONS = 10_000;
/** Largest skew margin accepted (1 hour). */
export const MAX_SKEW_MARGIN_MS = 3_600_000;
/** Version tag of the snapshot format (of a ledger at BASE_COMMAND_FORMAT). */
export const SNAPSHOT_FORMAT_VERSION = 2;
/**
 * Version tag of the snapshot of a ledger whose log raised the command format (its `settings` carry it): a build from
 * before raiseCommandFormat refuses it rather than restore the state without its format.
 */
export const RAISED_SNAPSHOT_FORMAT_VERSION = 3;
/** Older snapshot formats restore() still reads (v1: no epoch marks, slice versions or settings). */
const READABLE_SNAPSHOT_VERSIONS = [1, 2, 3] as const;
/** Relative tolerance of the bound's float comparisons. */
export const BOUND_TOLERANCE = 1e-9;
/** Most changed keys takeTouchedKeys() lists; beyond, it answers "anything may have changed". */
export const MAX_TOUCHED_KEYS = 200_000;
/** Default and largest page size of listTenants. */
export const DEFAULT_PAGE_LIMIT = 100;
export const MAX_PAGE_LIMIT = 1_000;

/** The replicated configuration: fixed at creation, carried by snapshots. */
export interface LedgerConfig {
  /** Expected number of cells: floors are φ × quota / floorCells (1..MAX_CELLS). */
  readonly floorCells: number;
  /** Added to a lease's expiry before its grants are released (clock-rate drift, delays). */
  readonly skewMarginMs: number;
  /** Size of the client session table (least recently applied evicted first). */
  readonly maxSessions: number;
}

export interface LedgerOptions {
  readonly floorCells?: number;
  readonly skewMarginMs?: number;
  readonly maxSessions?: number;
  /** Check every invariant after every apply and throw LedgerInvariantError (debug / tests). */
  readonly assertInvariants?: boolean;
  /**
   * The newest command format this replica applies (default NEWEST_COMMAND_FORMAT; a replica pinned lower by
   * --command-format): a raiseCommandFormat above it, or a snapshot at a format above it, throws LedgerFormatError.
   */
  readonly maxCommandFormat?: number;
}

// ---- results and views --------------------------------------------------------------------------

export type LedgerErrorCode =
  'INVALID' | 'NOT_FOUND' | 'CONFLICT' | 'LIMIT_EXCEEDED' | 'QUOTA_EXCEEDED' | 'STALE_SESSION';
export const LEDGER_ERROR_CODES: readonly LedgerErrorCode[] = [
  'INVALID',
  'NOT_FOUND',
  'CONFLICT',
  'LIMIT_EXCEEDED',
  'QUOTA_EXCEEDED',
  'STALE_SESSION',
];

export interface LedgerError {
  readonly code: LedgerErrorCode;
  readonly message: string;
}

export interface QuotaConfig {
  readonly rate: number;
  readonly burst: number;
  readonly floorFraction: number;
}

export interface TierView extends QuotaConfig {
  readonly name: string;
  /** The aggregate cap over all tenants of the tier, if any. */
  readonly cap: QuotaConfig | null;
  readonly tenantCount: number;
  /** Log index of the last change. */
  readonly updatedIndex: number;
}

export interface DomainCapView extends QuotaConfig {
  readonly domain: string;
  readonly updatedIndex: number;
}

export interface TenantView {
  readonly id: string;
  readonly tier: string;
  /** Overrides (null: the tier's). */
  readonly rate: number | null;
  readonly burst: number | null;
  /** The tenant's global quota: its overrides, else its tier's. */
  readonly quota: QuotaConfig;
  readonly updatedIndex: number;
}

/** One cell's part of one quota. */
export interface SliceView {
  readonly cellId: string;
  /** The cell's floor slot (null: registered beyond floorCells, no floor). */
  readonly slot: number | null;
  /** 0 while the cell never got a grant for this quota. */
  readonly epoch: number;
  readonly rate: number;
  readonly burst: number;
  readonly leaseExpiresAtMs: number | null;
  /** The floor delivered with the current grant (what the agent falls back to). */
  readonly floorRate: number;
  readonly floorBurst: number;
  /** The cell has acknowledged the current grant: no older grant or floor is still counted. */
  readonly acknowledged: boolean;
  /** What the ledger counts the cell as possibly using (u). */
  readonly countedRate: number;
  readonly countedBurst: number;
  /** The quota definition version the grant was stamped with (0: a deleted quota's wind-down grant). */
  readonly version: number;
}

export interface TenantDetail extends TenantView {
  /** One entry per registered cell, in registration order. */
  readonly slices: SliceView[];
}

export interface CellView {
  readonly id: string;
  readonly slot: number | null;
  readonly registeredAtMs: number;
  readonly lastReportAtMs: number | null;
  /** null: no lease (never granted, or it surely expired and the grants were released). */
  readonly leaseExpiresAtMs: number | null;
  readonly leaseLive: boolean;
  /** Removed by the operator, waiting for its lease to end (then it is dropped and its slot freed). */
  readonly removing: boolean;
}

/** Everything the allocator needs about one quota. */
export interface QuotaState extends QuotaConfig {
  readonly key: string;
  /** The floor of each floor slot. */
  readonly floorRate: number;
  readonly floorBurst: number;
  /** What Σu may not exceed: the quota, or more during a transition after the quota was lowered. */
  readonly ceilingRate: number;
  readonly ceilingBurst: number;
  /** Σu over all cells plus the unregistered floor slots. */
  readonly countedRate: number;
  readonly countedBurst: number;
  /** Floor slots no cell has registered for, counted at the floor. */
  readonly unregisteredSlots: number;
  readonly cells: SliceView[];
}

/** Per-cell columns a quota's slices are read into (`Ledger.readQuotaColumns`), as its SliceViews say them. */
export interface QuotaColumns {
  readonly grantRate: Float64Array;
  readonly grantBurst: Float64Array;
  readonly epoch: Float64Array;
  /** 1: acknowledged (also: no slice). */
  readonly acknowledged: Uint8Array;
  readonly countedRate: Float64Array;
  readonly countedBurst: Float64Array;
}

/** A QuotaState without its cells (`Ledger.readQuotaColumns`). */
export type QuotaFigures = Omit<QuotaState, 'cells' | 'key'>;

export type LedgerValue =
  | { readonly kind: 'tier'; readonly tier: TierView; readonly created: boolean }
  | { readonly kind: 'tierCap'; readonly tier: string; readonly cap: QuotaConfig; readonly created: boolean }
  | { readonly kind: 'domainCap'; readonly cap: DomainCapView; readonly created: boolean }
  | { readonly kind: 'tenant'; readonly tenant: TenantView; readonly created: boolean }
  | {
      readonly kind: 'tenants';
      readonly created: number;
      readonly updated: number;
      /** Already stored exactly so: left untouched. */
      readonly unchanged: number;
      /** The tenants that changed nothing, by position in the batch. */
      readonly failed: TenantBatchFailure[];
    }
  | { readonly kind: 'deleted'; readonly what: 'tier' | 'tierCap' | 'domainCap' | 'tenant'; readonly id: string }
  | { readonly kind: 'cell'; readonly cell: CellView; readonly created: boolean }
  | {
      readonly kind: 'round';
      readonly nowMs: number;
      readonly acked: number;
      readonly ignoredAcks: number;
      readonly renewed: number;
      readonly granted: number;
      /** Cells whose lease surely expired when the clock advanced (their grants were released). */
      readonly expiredCells: string[];
    }
  | { readonly kind: 'expired'; readonly nowMs: number; readonly expiredCells: string[] }
  | {
      readonly kind: 'cellRemoved';
      readonly id: string;
      readonly dropped: boolean;
      readonly leaseExpiresAtMs: number | null;
      readonly freedSlot: number | null;
    }
  | { readonly kind: 'settings'; readonly settings: LedgerSettings }
  | { readonly kind: 'implicitRetired'; readonly retired: number; readonly ignored: number }
  | { readonly kind: 'implicitRevived'; readonly revived: number; readonly ignored: number }
  | { readonly kind: 'commandFormat'; readonly commandFormat: number; readonly raised: boolean }
  | {
      readonly kind: 'slicesDropped';
      /** The releases whose slice was dropped. */
      readonly dropped: number;
      /** The releases left alone: no such slice, another epoch now, or floors above the cell's. */
      readonly kept: number;
    };

/** A tenant of a putTenants batch that was refused (and changed nothing). */
export interface TenantBatchFailure {
  /** Its position in the batch (0-based). */
  readonly index: number;
  readonly id: string;
  readonly code: LedgerErrorCode;
  readonly message: string;
}

/** The cluster-wide settings agents follow. */
export interface LedgerSettings {
  readonly unknownTenant: UnknownTenantPolicyName;
}

/** What an agent needs to know of a quota besides its numbers (sent with every grant). */
export interface QuotaDefinition {
  /** Log index of the last change of anything the agent applies for this key (numbers, floors, parent). */
  readonly version: number;
  /** The enclosing cap a tenant's checks must also pass (`tier/<name>`), or null. */
  readonly parent: string | null;
}

export type LedgerResult =
  { readonly ok: true; readonly value: LedgerValue } | { readonly ok: false; readonly error: LedgerError };

export class LedgerInvariantError extends CellquotaError {
  readonly code = 'LEDGER_INVARIANT';
}

/**
 * The log (a raiseCommandFormat entry) or a snapshot is at a command format this replica does not apply: it stops
 * there rather than apply later entries at semantics it does not have (and diverge from the replicas that do).
 */
export class LedgerFormatError extends CellquotaError {
  readonly code = 'LEDGER_FORMAT_UNSUPPORTED';
}

// ---- internal records ---------------------------------------------------------------------------

interface QuotaRec {
  rate: number;
  burst: number;
  floorFraction: number;
  updatedIndex: number;
}

interface TenantRec {
  tier: string;
  rate: number | null;
  burst: number | null;
  updatedIndex: number;
}

interface CellRec {
  readonly id: string;
  /** Reassigned when a removed cell frees its slot (the earliest-registered cell without one takes it). */
  slot: number | null;
  /** The operator removed the cell (removeCell): no renewals, no grants; dropped once its lease is over. */
  removing: boolean;
  readonly registeredAtMs: number;
  lastReportAtMs: number | null;
  leaseExpiresAtMs: number | null;
  /** The largest epoch of any slice dropped from this cell: a new slice's epochs continue above it,
   * so epochs only grow for a (key, cell), across a delete and re-create. */
  epochMark: number;
}

interface SliceRec {
  epoch: number;
  rate: number;
  burst: number;
  leaseExpiresAtMs: number;
  floorRate: number;
  floorBurst: number;
  /** Largest rate/burst/floors of every grant the cell may still hold (≥ the current ones). */
  heldRate: number;
  heldBurst: number;
  heldFloorRate: number;
  heldFloorBurst: number;
  /** The quota definition version stamped with the current grant (0: a wind-down grant of a deleted quota). */
  version: number;
}

interface Ceiling {
  rate: number;
  burst: number;
}

interface Usage {
  rate: number;
  burst: number;
}

function ok(value: LedgerValue): LedgerResult {
  return { ok: true, value };
}
function fail(code: LedgerErrorCode, message: string): LedgerResult {
  return { ok: false, error: { code, message } };
}
function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
function tolerance(limit: number): number {
  return BOUND_TOLERANCE * Math.max(1, limit);
}
function exceeds(value: number, limit: number): boolean {
  return value > limit + tolerance(limit);
}
/**
 * What a slice counting `counted` is counted as once its current grant is acknowledged (the ledger
 * then holds only that grant and its stamped floor): max(the cell's floor, the stamped floor, the
 * grant), never more than before.
 */
export function countedAfterAck(counted: number, cellFloor: number, stampedFloor: number, grant: number): number {
  return Math.min(counted, Math.max(cellFloor, stampedFloor, grant));
}

function quotaConfig(q: QuotaRec): QuotaConfig {
  return { rate: q.rate, burst: q.burst, floorFraction: q.floorFraction };
}

class Rollback {
  private readonly steps: (() => void)[] = [];
  push(step: () => void): void {
    this.steps.push(step);
  }
  run(): void {
    for (let i = this.steps.length - 1; i >= 0; i--) this.steps[i]?.();
  }
}

// ---- the ledger ---------------------------------------------------------------------------------

export class Ledger {
  readonly config: LedgerConfig;
  private readonly assert: boolean;
  private readonly maxFormat: number;

  private now = 0;
  /** The command format the log raised the state to (raiseCommandFormat): the semantics every entry applies at. */
  private format = BASE_COMMAND_FORMAT;
  /** The log index of the raiseCommandFormat that raised it last (0: never raised). */
  private formatIndex = 0;
  private applied = 0;
  private readonly tiers = new Map<string, QuotaRec>();
  private readonly tierCaps = new Map<string, QuotaRec>();
  private readonly domainCaps = new Map<string, QuotaRec>();
  private readonly tenants = new Map<string, TenantRec>();
  private readonly tierTenantCount = new Map<string, number>();
  private readonly cells = new Map<string, CellRec>();
  /** Cell ids in registration order: every sum over cells runs in this order. */
  private readonly cellOrder: string[] = [];
  /**
   * Per removed and dropped cell id, the highest epoch it was issued (from CELL_TOMBSTONE_FORMAT on): registered
   * again, the cell's epoch mark starts there and the tombstone goes. One number per id the operator removed.
   */
  private readonly cellTombstones = new Map<string, number>();
  private slotsTaken = 0;
  private readonly byKey = new Map<string, Map<string, SliceRec>>();
  private readonly byCell = new Map<string, Map<string, SliceRec>>();
  private readonly ceilings = new Map<string, Ceiling>();
  private sessions: ClientSessions<LedgerResult>;
  /** Sorted tenant ids, rebuilt lazily for listTenants. */
  private sortedTenantIds: string[] | null = null;
  /** The undo log of the command being applied tentatively (reportAndGrant), else null. */
  private txn: Rollback | null = null;
  private unknownTenant: UnknownTenantPolicyName = DEFAULT_UNKNOWN_TENANT_POLICY;
  /** Log index of the last unknown-tenant policy change (the version of implicit tenants' definitions). */
  private unknownTenantIndex = 0;
  /** Log index of the last domain cap change (agents learn the capped domains when it moves). */
  private domainCapsIndex = 0;
  /** Implicit tenants being wound down (retireImplicitTenants): no quota until their last slice is dropped. */
  private readonly retiringImplicit = new Set<string>();
  /** Derived: tenant keys some cell holds a slice of and no tenant record defines (implicit or retired). */
  private readonly implicitKeys = new Set<string>();
  /** Derived, per command: retiring keys whose last slice was dropped (leave retiringImplicit once committed). */
  private emptiedRetiring: string[] = [];
  /**
   * Derived, not replicated (rebuilt by restore): per cell, quota keys whose slice there may hold a
   * grant stamped with an older definition (or a deleted quota's live grant), so the lease rounds
   * re-grant them without scanning every slice. A superset: readers filter with isStale.
   */
  private readonly staleHints = new Map<string, Set<string>>();
  /**
   * Derived, not replicated: quota keys whose allocator inputs (definition, ceiling, slices) changed
   * since the last takeTouchedKeys(), for the incremental lease round. Bounded: past
   * MAX_TOUCHED_KEYS, or after a change to the cells (registration, a lease released), it holds
   * "everything" (touchedAll) until taken; a follower that never takes it stays at that bound.
   */
  private touched = new Set<string>();
  private touchedAll = true;

  constructor(options: LedgerOptions = {}) {
    const floorCells = options.floorCells ?? DEFAULT_FLOOR_CELLS;
    const skewMarginMs = options.skewMarginMs ?? DEFAULT_SKEW_MARGIN_MS;
    const maxSessions = options.maxSessions ?? DEFAULT_MAX_SESSIONS;
    if (!Number.isInteger(floorCells) || floorCells < 1 || floorCells > MAX_CELLS) {
      throw new RangeError(`floorCells must be an integer in 1..${MAX_CELLS}`);
    }
    if (!Number.isFinite(skewMarginMs) || skewMarginMs < 0 || skewMarginMs > MAX_SKEW_MARGIN_MS) {
      throw new RangeError(`skewMarginMs must be in 0..${MAX_SKEW_MARGIN_MS}`);
    }
    if (!Number.isInteger(maxSessions) || maxSessions < 1)
      throw new RangeError('maxSessions must be a positive integer');
    this.config = { floorCells, skewMarginMs: skewMarginMs + 0, maxSessions };
    this.assert = options.assertInvariants ?? false;
    const maxFormat = options.maxCommandFormat ?? NEWEST_COMMAND_FORMAT;
    if (!Number.isInteger(maxFormat) || maxFormat < BASE_COMMAND_FORMAT || maxFormat > NEWEST_COMMAND_FORMAT)
      throw new RangeError(`maxCommandFormat must be an integer in ${BASE_COMMAND_FORMAT}..${NEWEST_COMMAND_FORMAT}`);
    this.maxFormat = maxFormat;
    this.sessions = new ClientSessions<LedgerResult>(maxSessions);
  }

  /** The ledger's clock: the largest `nowMs` any applied command carried. */
  get nowMs(): number {
    return this.now;
  }

  /** The index of the last applied log entry. */
  get appliedIndex(): number {
    return this.applied;
  }

  /**
   * The command format the log raised this state to (BASE_COMMAND_FORMAT until a raiseCommandFormat applied): what
   * every entry does when applied is chosen by it, so replicas of different builds apply one log alike.
   */
  get commandFormat(): number {
    return this.format;
  }

  /** The log index of the entry that raised the command format to commandFormat (0: never raised). */
  get commandFormatIndex(): number {
    return this.formatIndex;
  }

  // ---- applying ---------------------------------------------------------------------------------

  /**
   * Applies the command of log entry `index` (which must exceed every index applied before).
   * Deterministic; an error result changes no domain state (the session table and the applied index
   * still record the entry). With `assertInvariants`, throws LedgerInvariantError if an invariant
   * fails afterwards.
   */
  apply(input: LedgerCommandInput | LedgerCommand, index: number): LedgerResult {
    if (!Number.isSafeInteger(index) || index <= this.applied) {
      throw new RangeError(`log index ${index} must be an integer above the applied index ${this.applied}`);
    }
    const parsed = parseCommand(input);
    const result = parsed.ok ? this.applyValid(parsed.command, index) : fail('INVALID', parsed.message);
    this.applied = index;
    if (this.assert) this.checkInvariants();
    return result;
  }

  /** Decodes and applies an encoded entry; an undecodable entry yields INVALID (and changes nothing). */
  applyEncoded(bytes: Uint8Array, index: number): LedgerResult {
    let decoded: LedgerCommand | LedgerCommandError;
    try {
      decoded = decodeCommand(bytes);
    } catch (e) {
      if (!(e instanceof LedgerCommandError)) throw e;
      decoded = e;
    }
    if (!(decoded instanceof LedgerCommandError)) return this.apply(decoded, index);
    if (!Number.isSafeInteger(index) || index <= this.applied) {
      throw new RangeError(`log index ${index} must be an integer above the applied index ${this.applied}`);
    }
    this.applied = index;
    const result = fail('INVALID', decoded.message);
    if (this.assert) this.checkInvariants();
    return result;
  }

  private applyValid(cmd: LedgerCommand, index: number): LedgerResult {
    const session = cmd.session;
    if (session !== undefined) {
      const check = this.sessions.check(session.clientId, session.seq);
      if (check.kind === 'duplicate') return check.result;
      if (check.kind === 'stale') {
        return fail(
          'STALE_SESSION',
          `request ${session.seq} of client ${session.clientId} is ` +
            `older than its last applied request ${check.lastSeq}`,
        );
      }
    }
    const result = this.dispatch(cmd, index);
    this.settleRetiring();
    if (result.ok) this.ratchetCeilings();
    if (session !== undefined) this.sessions.record(session.clientId, session.seq, result);
    return result;
  }

  private dispatch(cmd: LedgerCommand, index: number): LedgerResult {
    switch (cmd.type) {
      case 'putTier':
        return this.putTier(cmd, index);
      case 'deleteTier':
        return this.deleteTier(cmd);
      case 'putTierCap':
        return this.putTierCap(cmd, index);
      case 'deleteTierCap':
        return this.deleteTierCap(cmd, index);
      case 'putDomainCap':
        return this.putDomainCap(cmd, index);
      case 'deleteDomainCap':
        return this.deleteDomainCap(cmd, index);
      case 'putTenant':
        return this.putTenant(cmd, index);
      case 'putTenants':
        return this.putTenants(cmd, index);
      case 'deleteTenant':
        return this.deleteTenant(cmd);
      case 'registerCell':
        return this.registerCell(cmd);
      case 'removeCell':
        return this.removeCell(cmd);
      case 'reportAndGrant':
        return this.reportAndGrant(cmd);
      case 'expireLeases':
        return this.expireLeases(cmd);
      case 'putSettings':
        return this.putSettings(cmd, index);
      case 'retireImplicitTenants':
        return this.retireImplicitTenants(cmd);
      case 'reviveImplicitTenants':
        return this.reviveImplicitTenants(cmd);
      case 'raiseCommandFormat':
        return this.raiseCommandFormat(cmd, index);
      case 'dropReleasedSlices':
        return this.dropReleasedSlices(cmd);
    }
  }

  private putTier(cmd: PutTierCommand, index: number): LedgerResult {
    const existing = this.tiers.get(cmd.name);
    if (existing === undefined && this.tiers.size >= MAX_TIERS)
      return fail('LIMIT_EXCEEDED', `at most ${MAX_TIERS} tiers`);
    const bad = windowError(`tier ${cmd.name}`, cmd.rate, cmd.burst);
    if (bad !== null) return bad;
    if ((this.tierTenantCount.get(cmd.name) ?? 0) > 0) {
      for (const [id, t] of this.tenants) {
        if (t.tier !== cmd.name || (t.rate === null && t.burst === null)) continue;
        const e = windowError(
          `tenant ${id} (its overrides on tier ${cmd.name})`,
          t.rate ?? cmd.rate,
          t.burst ?? cmd.burst,
        );
        if (e !== null) return e;
      }
    }
    const rec: QuotaRec = {
      rate: cmd.rate,
      burst: cmd.burst,
      floorFraction: cmd.floorFraction ?? DEFAULT_FLOOR_FRACTION,
      updatedIndex: index,
    };
    this.tiers.set(cmd.name, rec);
    if (existing !== undefined) {
      this.touchAll(); // every tenant of the tier changed
      // Every tenant on the tier whose cells hold slices may now be over (or under) its quota, and
      // holds grants stamped with the old definition.
      this.forTenantKeysOfTier(cmd.name, (key) => {
        this.rebaseCeiling(key);
        this.markStale(key);
      });
    }
    return ok({ kind: 'tier', tier: this.tierView(cmd.name, rec), created: existing === undefined });
  }

  private deleteTier(cmd: DeleteTierCommand): LedgerResult {
    if (!this.tiers.has(cmd.name)) return fail('NOT_FOUND', `tier ${cmd.name} does not exist`);
    const users = this.tierTenantCount.get(cmd.name) ?? 0;
    if (users > 0) return fail('CONFLICT', `tier ${cmd.name} is used by ${users} tenant(s); move or delete them first`);
    if (unknownTenantTier(this.unknownTenant) === cmd.name)
      return fail(
        'CONFLICT',
        `tier ${cmd.name} is the unknown-tenant policy's (unknownTenant ${this.unknownTenant}); change the ` +
          'policy first (PUT /v1/settings)',
      );
    this.tiers.delete(cmd.name);
    if (this.tierCaps.delete(cmd.name)) this.retireKey(tierCapKey(cmd.name));
    return ok({ kind: 'deleted', what: 'tier', id: cmd.name });
  }

  private putTierCap(cmd: PutTierCapCommand, index: number): LedgerResult {
    const tier = this.tiers.get(cmd.tier);
    if (tier === undefined) return fail('NOT_FOUND', `tier ${cmd.tier} does not exist`);
    const bad = windowError(`the cap of tier ${cmd.tier}`, cmd.rate, cmd.burst);
    if (bad !== null) return bad;
    const created = !this.tierCaps.has(cmd.tier);
    const rec: QuotaRec = {
      rate: cmd.rate,
      burst: cmd.burst,
      floorFraction: cmd.floorFraction ?? DEFAULT_FLOOR_FRACTION,
      updatedIndex: index,
    };
    this.tierCaps.set(cmd.tier, rec);
    this.rebaseCeiling(tierCapKey(cmd.tier));
    this.markStale(tierCapKey(cmd.tier));
    if (created) this.tierParentChanged(cmd.tier, tier, index);
    return ok({ kind: 'tierCap', tier: cmd.tier, cap: quotaConfig(rec), created });
  }

  private deleteTierCap(cmd: DeleteTierCapCommand, index: number): LedgerResult {
    if (!this.tierCaps.delete(cmd.tier)) return fail('NOT_FOUND', `tier ${cmd.tier} has no cap`);
    this.retireKey(tierCapKey(cmd.tier));
    const tier = this.tiers.get(cmd.tier);
    if (tier !== undefined) this.tierParentChanged(cmd.tier, tier, index);
    return ok({ kind: 'deleted', what: 'tierCap', id: cmd.tier });
  }

  private putDomainCap(cmd: PutDomainCapCommand, index: number): LedgerResult {
    const created = !this.domainCaps.has(cmd.domain);
    if (created && this.domainCaps.size >= MAX_DOMAIN_CAPS)
      return fail('LIMIT_EXCEEDED', `at most ${MAX_DOMAIN_CAPS} domain caps`);
    const bad = windowError(`the cap of domain ${cmd.domain}`, cmd.rate, cmd.burst);
    if (bad !== null) return bad;
    const rec: QuotaRec = {
      rate: cmd.rate,
      burst: cmd.burst,
      floorFraction: cmd.floorFraction ?? DEFAULT_FLOOR_FRACTION,
      updatedIndex: index,
    };
    this.domainCaps.set(cmd.domain, rec);
    this.rebaseCeiling(domainCapKey(cmd.domain));
    this.markStale(domainCapKey(cmd.domain));
    this.domainCapsIndex = index;
    return ok({ kind: 'domainCap', cap: { domain: cmd.domain, ...quotaConfig(rec), updatedIndex: index }, created });
  }

  private deleteDomainCap(cmd: DeleteDomainCapCommand, index: number): LedgerResult {
    if (!this.domainCaps.delete(cmd.domain)) return fail('NOT_FOUND', `domain ${cmd.domain} has no cap`);
    this.retireKey(domainCapKey(cmd.domain));
    this.domainCapsIndex = index;
    return ok({ kind: 'deleted', what: 'domainCap', id: cmd.domain });
  }

  private putTenant(cmd: PutTenantCommand, index: number): LedgerResult {
    const r = this.storeTenant(cmd.id, cmd.tier, cmd.rate ?? null, cmd.burst ?? null, index, false);
    if (!r.ok) return r;
    const rec = this.tenants.get(cmd.id);
    if (rec === undefined) throw new LedgerInvariantError(`tenant ${cmd.id} missing right after it was stored`);
    return ok({ kind: 'tenant', tenant: this.tenantView(cmd.id, rec), created: r.outcome === 'created' });
  }

  private putTenants(cmd: PutTenantsCommand, index: number): LedgerResult {
    let created = 0;
    let updated = 0;
    let unchanged = 0;
    const failed: TenantBatchFailure[] = [];
    for (const [i, t] of cmd.tenants.entries()) {
      const r = this.storeTenant(t.id, t.tier, t.rate ?? null, t.burst ?? null, index, true);
      if (!r.ok) failed.push({ index: i, id: t.id, code: r.error.code, message: r.error.message });
      else if (r.outcome === 'created') created++;
      else if (r.outcome === 'updated') updated++;
      else unchanged++;
    }
    return ok({ kind: 'tenants', created, updated, unchanged, failed });
  }

  /**
   * Creates or replaces one tenant; an error changes nothing. With `keepIdentical`, a tenant already
   * stored with exactly these values is left alone (bulk imports re-run without touching anything).
   */
  private storeTenant(
    id: string,
    tierName: string,
    rate: number | null,
    burst: number | null,
    index: number,
    keepIdentical: boolean,
  ):
    | { readonly ok: true; readonly outcome: 'created' | 'updated' | 'unchanged' }
    | { readonly ok: false; readonly error: LedgerError } {
    const tier = this.tiers.get(tierName);
    if (tier === undefined)
      return { ok: false, error: { code: 'NOT_FOUND', message: `tier ${tierName} does not exist` } };
    const existing = this.tenants.get(id);
    if (
      keepIdentical &&
      existing !== undefined &&
      existing.tier === tierName &&
      existing.rate === rate &&
      existing.burst === burst
    )
      return { ok: true, outcome: 'unchanged' };
    if (existing === undefined && this.tenants.size >= MAX_TENANTS)
      return { ok: false, error: { code: 'LIMIT_EXCEEDED', message: `at most ${MAX_TENANTS} tenants` } };
    const bad = windowError(`tenant ${id}`, rate ?? tier.rate, burst ?? tier.burst);
    if (bad !== null && !bad.ok) return bad;
    if (existing !== undefined) this.addTierUse(existing.tier, -1);
    else this.sortedTenantIds = null;
    const rec: TenantRec = { tier: tierName, rate, burst, updatedIndex: index };
    this.tenants.set(id, rec);
    // An implicit tenant defined now (winding down or not): its slices count under its own quota.
    this.implicitKeys.delete(tenantKey(id));
    this.retiringImplicit.delete(tenantKey(id));
    this.addTierUse(tierName, 1);
    this.rebaseCeiling(tenantKey(id));
    this.markStale(tenantKey(id));
    return { ok: true, outcome: existing === undefined ? 'created' : 'updated' };
  }

  private deleteTenant(cmd: DeleteTenantCommand): LedgerResult {
    const existing = this.tenants.get(cmd.id);
    if (existing === undefined) return fail('NOT_FOUND', `tenant ${cmd.id} does not exist`);
    this.tenants.delete(cmd.id);
    this.sortedTenantIds = null;
    this.addTierUse(existing.tier, -1);
    const key = tenantKey(cmd.id);
    if (this.format < TENANT_WIND_DOWN_FORMAT) {
      // A log not raised to format 5: as every build before it applied the entry (under tier:NAME the key is at once
      // an implicit tenant of NAME, its ceiling gone).
      if (this.byKey.has(key)) this.implicitKeys.add(key);
      this.retireKey(key);
      return ok({ kind: 'deleted', what: 'tenant', id: cmd.id });
    }
    if (this.byKey.has(key)) {
      this.implicitKeys.add(key);
      // Under a tier:NAME policy the key does not become an implicit tenant of NAME by itself (that would bypass
      // --max-implicit-tenants): it winds down like any deleted tenant, and the lease leader takes it back
      // (reviveImplicitTenants, within the bound) if cells still ask for it, with its ceiling rebased then on what
      // they may still use under the old quota.
      if (unknownTenantTier(this.unknownTenant) !== null) this.retiringImplicit.add(key);
    }
    this.retireKey(key);
    return ok({ kind: 'deleted', what: 'tenant', id: cmd.id });
  }

  /**
   * Winds down idle implicit tenants as a deletion (the lease leader proposes it for implicit tenants no cell reported
   * demand for within --implicit-tenant-idle-ms). Keys that are not implicit tenants now (defined since, already
   * winding down, the policy changed) are left alone; the result counts those retired.
   */
  private retireImplicitTenants(cmd: RetireImplicitTenantsCommand): LedgerResult {
    let retired = 0;
    for (const key of cmd.keys) {
      if (!this.isImplicitTenant(key) || !this.byKey.has(key)) continue;
      this.retiringImplicit.add(key);
      this.retireKey(key);
      retired++;
    }
    return ok({ kind: 'implicitRetired', retired, ignored: cmd.keys.length - retired });
  }

  /**
   * Cancels the wind-down of tenant keys cells ask for again (the lease leader proposes it within
   * --max-implicit-tenants): each is an implicit tenant of the policy's tier again. Nothing on its slices was forgotten
   * while it wound down (held grants and floors stay until acknowledged or released), so rebasing the ceiling on what
   * the cells may still use keeps the bound: grants already zeroed and acknowledged count nothing, a cut-off cell's
   * floor counts until it acknowledges. Keys not winding down are left alone.
   */
  private reviveImplicitTenants(cmd: ReviveImplicitTenantsCommand): LedgerResult {
    let revived = 0;
    for (const key of cmd.keys) {
      if (!this.retiringImplicit.delete(key)) continue;
      // From format 5: every slice is re-granted at the tier's definition. A slice may still hold a grant stamped
      // by another definition with a version at or above the tier's (a deleted tenant's, created after the policy
      // changed): without this it was never re-granted, and kept the old tier's parent cap and floors.
      if (this.format >= TENANT_WIND_DOWN_FORMAT) this.unstampSlices(key);
      this.rebaseCeiling(key);
      this.markStale(key);
      revived++;
    }
    return ok({ kind: 'implicitRevived', revived, ignored: cmd.keys.length - revived });
  }

  /** The grants on `key`'s slices count as stamped by no current definition (version 0): each is re-granted. */
  private unstampSlices(key: string): void {
    for (const s of this.byKey.get(key)?.values() ?? []) s.version = 0;
  }

  /**
   * Raises the command format every later entry applies at (never lowers it). A format this replica does not apply
   * stops it here (LedgerFormatError, nothing changed): applying later entries at semantics it lacks would diverge.
   */
  private raiseCommandFormat(cmd: RaiseCommandFormatCommand, index: number): LedgerResult {
    if (cmd.format > this.maxFormat)
      throw new LedgerFormatError(
        `log entry ${index} raises the command format to ${cmd.format}; this replica applies formats up to ` +
          `${this.maxFormat}${this.maxFormat < NEWEST_COMMAND_FORMAT ? ' (--command-format)' : ''}: run a build that ` +
          `reads format ${cmd.format} on it (docs/quota-model.md, "Upgrades")`,
      );
    const raised = cmd.format > this.format;
    if (raised) {
      this.format = cmd.format;
      this.formatIndex = index;
      this.touchAll();
    }
    return ok({ kind: 'commandFormat', commandFormat: this.format, raised });
  }

  /**
   * Drops the slices a cell's agent released (format 7, RELEASED_SLICES_FORMAT; below it INVALID, nothing changed, as
   * a build without the command applies it). The ledger may stop counting a slice only when the cell surely uses
   * nothing on it beyond what the ledger counts for a cell without a slice (its floor slot: floorFraction·quota/
   * floorCells, or 0 beyond floorCells). Why these conditions are enough:
   *
   * - The release is proof that the agent holds nothing: it names the highest epoch the agent took for the key, and is
   *   sent only once every thread removed the key's entry (an eviction past --max-lease-keys), or for a grant the agent
   *   never applied (a full picture's key without demand); the agent refuses grants at or below it while the release
   *   waits. So what the cell may use on the slice is at most the floors a thread may still fall back to.
   * - Epoch: only the slice's current epoch. Epochs only grow for a (key, cell), and answers are built from the
   *   committed ledger, so no grant above the current epoch ever reached the agent: a release of the current epoch
   *   means no grant of this slice is in flight to it that it could still apply (an older one is superseded by the one
   *   it released; the lease client takes one answer at a time). A release of an older epoch (the newer grant is in
   *   flight, or was sent after the release) drops nothing: the newer grant stays counted until acknowledged or the
   *   lease surely expired, as always. The ledger cannot tell a late copy of a release from a fresh one: the lease
   *   leader makes sure none can name an epoch the agent took back (a session never sends a key again at an epoch
   *   released to it, but one epoch higher, and takes releases as drops only TTL + skew margin after it began:
   *   LeaseService, CellSession.releasedEpochs / dropsFromMs).
   * - Floors: a floor stays counted until acknowledged away, lease expiry or not (heldFloor*); the slice goes only if
   *   every floor it still counts is within the cell's floor slot for the key now, which the ledger counts without a
   *   slice, so dropping it never counts the cell below a floor it may fall back to. Held grant rates (a shrink not yet
   *   acknowledged) need no such check: the agent released the key, so it uses no grant of it.
   * - Afterwards: the cell's epoch mark rises to the dropped epoch, so a later slice of the key (the cell asks for it
   *   again: refused, its refusals are demand, and the round grants it as any first grant) starts above every epoch
   *   the agent ever saw for it. Nothing else changes; the command only lowers what is counted (no bound to check).
   */
  private dropReleasedSlices(cmd: DropReleasedSlicesCommand): LedgerResult {
    if (this.format < RELEASED_SLICES_FORMAT)
      return fail(
        'INVALID',
        `dropReleasedSlices is command format ${RELEASED_SLICES_FORMAT}; the log is at format ${this.format}`,
      );
    let dropped = 0;
    for (const r of cmd.releases) {
      const cell = this.cells.get(r.cellId);
      const s = this.byKey.get(r.key)?.get(r.cellId);
      if (cell === undefined || s === undefined || s.epoch !== r.epoch) continue;
      const q = this.quotaOf(r.key);
      const floor = q === undefined ? { rate: 0, burst: 0 } : this.floorOf(q, cell);
      if (s.heldFloorRate > floor.rate || s.heldFloorBurst > floor.burst) continue;
      if (s.epoch > cell.epochMark) cell.epochMark = s.epoch;
      this.removeSlice(r.key, r.cellId);
      this.touch(r.key);
      dropped++;
    }
    return ok({ kind: 'slicesDropped', dropped, kept: cmd.releases.length - dropped });
  }

  /** After each command: retiring implicit tenants whose last slice is gone leave the set. */
  private settleRetiring(): void {
    if (this.emptiedRetiring.length === 0) return;
    for (const key of this.emptiedRetiring) if (!this.byKey.has(key)) this.retiringImplicit.delete(key);
    this.emptiedRetiring = [];
  }

  private putSettings(cmd: PutSettingsCommand, index: number): LedgerResult {
    const tier = unknownTenantTier(cmd.unknownTenant);
    if (tier !== null && !this.tiers.has(tier))
      return fail('NOT_FOUND', `unknownTenant ${cmd.unknownTenant}: tier ${tier} does not exist`);
    if (cmd.unknownTenant === this.unknownTenant) return ok({ kind: 'settings', settings: this.settings });
    const implicitBefore = unknownTenantTier(this.unknownTenant) !== null;
    this.unknownTenant = cmd.unknownTenant;
    this.unknownTenantIndex = index;
    if (implicitBefore || tier !== null) {
      // Every implicit tenant's definition changed (moved to another tier, or is gone): its slices are
      // re-granted at the new one, or wound down like a deleted tenant's. Slices the policy finds without
      // a tenant record when it becomes tier:NAME (deleted tenants, implicit ones of a former tier policy)
      // keep winding down: they become implicit tenants only if the leader revives them (the bound).
      // (Below format 5, as the builds before it: no wind-down set is touched.)
      const windDown = this.format >= TENANT_WIND_DOWN_FORMAT;
      this.touchAll();
      if (tier === null && windDown) this.retiringImplicit.clear();
      for (const key of [...this.byKey.keys()]) {
        if (!key.startsWith('tenant/') || this.tenants.has(key.slice(7))) continue;
        if (tier === null) this.retireKey(key);
        else if (!implicitBefore && windDown) this.retiringImplicit.add(key);
        else {
          this.rebaseCeiling(key);
          this.markStale(key);
        }
      }
    }
    return ok({ kind: 'settings', settings: this.settings });
  }

  private registerCell(cmd: RegisterCellCommand): LedgerResult {
    const existing = this.cells.get(cmd.cellId);
    if (existing === undefined && this.cells.size >= MAX_CELLS) {
      // Removed cells whose lease is over by this command's time leave before it registers.
      const leaving = [...this.cells.values()].filter(
        (c) =>
          c.removing &&
          !(
            c.leaseExpiresAtMs !== null && Math.max(this.now, cmd.nowMs) < c.leaseExpiresAtMs + this.config.skewMarginMs
          ),
      ).length;
      if (this.cells.size - leaving >= MAX_CELLS)
        return fail('LIMIT_EXCEEDED', `at most ${MAX_CELLS} cells: remove one first (cellquota ctl cells remove ID)`);
    }
    this.advanceTime(cmd.nowMs);
    this.dropRemovedCells();
    if (existing !== undefined && this.cells.has(cmd.cellId))
      return ok({ kind: 'cell', cell: this.cellView(existing), created: false });
    const slot = this.slotsTaken < this.config.floorCells ? this.freeSlot() : null;
    if (slot !== null) this.slotsTaken++;
    const rec: CellRec = {
      id: cmd.cellId,
      slot,
      removing: false,
      registeredAtMs: this.now,
      lastReportAtMs: null,
      leaseExpiresAtMs: null,
      // A cell registered again under a removed one's id: epochs continue above every one it was issued.
      epochMark: this.cellTombstones.get(cmd.cellId) ?? 0,
    };
    this.cellTombstones.delete(cmd.cellId);
    this.cells.set(cmd.cellId, rec);
    this.cellOrder.push(cmd.cellId);
    this.touchAll();
    return ok({ kind: 'cell', cell: this.cellView(rec), created: true });
  }

  /** The lowest floor slot no cell holds. */
  private freeSlot(): number {
    const taken = new Set<number>();
    for (const c of this.cells.values()) if (c.slot !== null) taken.add(c.slot);
    for (let i = 0; ; i++) if (!taken.has(i)) return i;
  }

  /**
   * The operator deregisters a cell. It gets no more renewals or grants (the lease service refuses
   * its reports); what it may still be using stays counted until its lease has surely expired; then
   * it is dropped with its slices and its floor slot goes to the earliest-registered cell without
   * one, or back to the free slots (counted at the floor, as always). Run it for a cell whose agents
   * are stopped: a cut-off agent of a removed cell would keep its floor (fail-static) beside the
   * cell that takes the slot.
   */
  private removeCell(cmd: RemoveCellCommand): LedgerResult {
    const c = this.cells.get(cmd.cellId);
    if (c === undefined) return fail('NOT_FOUND', `cell ${cmd.cellId} is not registered`);
    this.advanceTime(cmd.nowMs);
    c.removing = true;
    const slot = c.slot;
    const dropped = this.dropRemovedCells().includes(cmd.cellId);
    return ok({
      kind: 'cellRemoved',
      id: cmd.cellId,
      dropped,
      leaseExpiresAtMs: dropped ? null : c.leaseExpiresAtMs,
      freedSlot: dropped ? slot : null,
    });
  }

  /** Drops every removed cell whose lease is over (never inside a tentative round). Returns their ids. */
  private dropRemovedCells(): string[] {
    if (this.txn !== null) throw new Error('dropRemovedCells inside a tentative round');
    const gone: string[] = [];
    for (const id of [...this.cellOrder]) {
      const c = this.cells.get(id);
      if (c === undefined || !c.removing || this.leaseLive(c)) continue;
      if (this.format >= CELL_TOMBSTONE_FORMAT) {
        let highest = Math.max(c.epochMark, this.cellTombstones.get(id) ?? 0);
        for (const s of this.byCell.get(id)?.values() ?? []) highest = Math.max(highest, s.epoch);
        if (highest > 0) this.cellTombstones.set(id, highest);
      }
      for (const key of [...(this.byCell.get(id)?.keys() ?? [])]) this.removeSlice(key, id);
      this.staleHints.delete(id);
      this.cells.delete(id);
      this.cellOrder.splice(this.cellOrder.indexOf(id), 1);
      if (c.slot !== null) {
        const heir = this.cellOrder.map((x) => this.cells.get(x) as CellRec).find((x) => x.slot === null);
        if (heir !== undefined) heir.slot = c.slot;
        else this.slotsTaken--;
      }
      gone.push(id);
    }
    return gone;
  }

  /** Removed cells still waiting for their lease to end (the lease service then proposes expireLeases). */
  get removedCellsWaiting(): number {
    let n = 0;
    for (const c of this.cells.values()) if (c.removing) n++;
    return n;
  }

  private expireLeases(cmd: ExpireLeasesCommand): LedgerResult {
    const expiredCells = this.advanceTime(cmd.nowMs);
    this.dropRemovedCells();
    return ok({ kind: 'expired', nowMs: this.now, expiredCells });
  }

  private reportAndGrant(cmd: ReportAndGrantCommand): LedgerResult {
    // A removed cell gets no renewal and no grant (a round built before its removal committed).
    const leases = (cmd.leases ?? []).filter((l) => this.cells.get(l.cellId)?.removing !== true);
    const acks = cmd.acks ?? [];
    const grants = (cmd.grants ?? []).filter((g) => this.cells.get(g.cellId)?.removing !== true);

    // 1. Checks that need no tentative state.
    const seenCells = new Set<string>();
    for (const l of leases) {
      if (!this.cells.has(l.cellId)) return fail('NOT_FOUND', `cell ${l.cellId} is not registered`);
      if (seenCells.has(l.cellId)) return fail('INVALID', `cell ${l.cellId} appears twice in leases`);
      seenCells.add(l.cellId);
    }
    // The quotas the grants touch (in first-seen order), each looked up once: a round changes no quota.
    const touched = new Map<string, { readonly q: QuotaRec | undefined; readonly cells: Set<string> }>();
    for (const g of grants) {
      if (!this.cells.has(g.cellId)) return fail('NOT_FOUND', `cell ${g.cellId} is not registered`);
      let t = touched.get(g.key);
      if (t === undefined) touched.set(g.key, (t = { q: this.quotaOf(g.key), cells: new Set() }));
      if (t.cells.has(g.cellId)) return fail('INVALID', `grant for ${g.key} on cell ${g.cellId} appears twice`);
      t.cells.add(g.cellId);
      const slice = this.byKey.get(g.key)?.get(g.cellId);
      if (t.q === undefined && (slice === undefined || g.rate !== 0 || g.burst !== 0)) {
        return fail('NOT_FOUND', `quota ${g.key} does not exist (a deleted quota's slices accept only zero grants)`);
      }
      if (slice !== undefined && g.epoch <= slice.epoch) {
        return fail(
          'CONFLICT',
          `grant epoch ${g.epoch} for ${g.key} on cell ${g.cellId} is not above the current epoch ${slice.epoch}`,
        );
      }
    }

    // 2. Apply tentatively.
    const txn = new Rollback();
    this.txn = txn;
    try {
      const expiredCells = this.advanceTime(cmd.nowMs);
      let acked = 0;
      for (const a of acks) {
        const s = this.byKey.get(a.key)?.get(a.cellId);
        if (s === undefined || a.epoch !== s.epoch) continue;
        acked++;
        this.saveSlice(s);
        s.heldRate = s.rate;
        s.heldBurst = s.burst;
        s.heldFloorRate = s.floorRate;
        s.heldFloorBurst = s.floorBurst;
        this.dropIfRetiredAndEmpty(a.key, a.cellId, s);
      }
      for (const l of leases) {
        const c = this.cells.get(l.cellId);
        if (c === undefined) continue;
        this.saveCell(c);
        c.lastReportAtMs = this.now;
        c.leaseExpiresAtMs =
          c.leaseExpiresAtMs === null ? l.leaseExpiresAtMs + 0 : Math.max(c.leaseExpiresAtMs, l.leaseExpiresAtMs);
      }
      const before = new Map<string, Usage>();
      for (const [key, { q }] of touched) if (q !== undefined) before.set(key, this.usage(key, q));
      for (const g of grants) {
        const q = touched.get(g.key)?.q;
        let s = this.byKey.get(g.key)?.get(g.cellId);
        if (q === undefined && s === undefined) continue; // a retired slice released above
        const cell = this.cells.get(g.cellId);
        if (cell === undefined) continue;
        let epoch = g.epoch;
        if (s === undefined) {
          s = this.createSlice(g.key, g.cellId); // its undo removes it
          // A new slice continues above every epoch this cell ever held for a dropped slice: the
          // agent ignores grants at or below the epoch it holds (a deleted and re-created tenant).
          epoch = Math.max(epoch, cell.epochMark + 1);
        } else this.saveSlice(s);
        const floor = q === undefined ? { rate: 0, burst: 0 } : this.floorOf(q, cell);
        s.epoch = epoch;
        s.version = q === undefined ? 0 : q.updatedIndex;
        s.rate = g.rate + 0; // + 0: never store a -0 (msgpack would turn it into 0 and break exact round trips)
        s.burst = g.burst + 0;
        s.leaseExpiresAtMs = g.leaseExpiresAtMs + 0;
        s.floorRate = floor.rate;
        s.floorBurst = floor.burst;
        s.heldRate = Math.max(s.heldRate, g.rate);
        s.heldBurst = Math.max(s.heldBurst, g.burst);
        s.heldFloorRate = Math.max(s.heldFloorRate, floor.rate);
        s.heldFloorBurst = Math.max(s.heldFloorBurst, floor.burst);
        this.saveCell(cell);
        cell.leaseExpiresAtMs =
          cell.leaseExpiresAtMs === null ? g.leaseExpiresAtMs + 0 : Math.max(cell.leaseExpiresAtMs, g.leaseExpiresAtMs);
        if (q === undefined) this.dropIfRetiredAndEmpty(g.key, g.cellId, s);
      }
      // Grants (or renewals) carrying a lease that has already surely expired: released at once.
      for (const id of this.advanceTime(this.now)) if (!expiredCells.includes(id)) expiredCells.push(id);

      for (const [key, { q }] of touched) {
        const b = before.get(key);
        if (q === undefined || b === undefined) continue;
        const after = this.usage(key, q);
        const c = this.ceilings.get(key);
        const rateBad =
          exceeds(after.rate, q.rate) &&
          (c === undefined || exceeds(after.rate, b.rate) || exceeds(after.rate, c.rate));
        const burstBad =
          exceeds(after.burst, q.burst) &&
          (c === undefined || exceeds(after.burst, b.burst) || exceeds(after.burst, c.burst));
        if (rateBad || burstBad) {
          txn.run();
          const what = rateBad
            ? `rate ${after.rate} over the quota's ${q.rate}`
            : `burst ${after.burst} over the quota's ${q.burst}`;
          const during =
            c === undefined ? '' : ' (the quota was lowered and is still above its limit: only shrinks are accepted)';
          return fail(
            'QUOTA_EXCEEDED',
            `the grants would let the cells use ${what} for ${key}${during}; the round is refused`,
          );
        }
      }
      // Committed from here on: the granted slices carry the current definitions.
      for (const g of grants) {
        this.staleHints.get(g.cellId)?.delete(g.key);
        this.touch(g.key);
      }
      for (const a of acks) this.touch(a.key);
      return ok({
        kind: 'round',
        nowMs: this.now,
        acked,
        ignoredAcks: acks.length - acked,
        renewed: leases.length,
        granted: grants.length,
        expiredCells,
      });
    } catch (e) {
      txn.run();
      throw e;
    } finally {
      this.txn = null;
    }
  }

  // ---- state helpers ----------------------------------------------------------------------------

  /** Moves the clock forward (never back) and releases the grants of every cell whose lease surely expired. */
  private advanceTime(nowMs: number): string[] {
    if (nowMs > this.now) {
      const prev = this.now;
      this.txn?.push(() => {
        this.now = prev;
      });
      this.now = nowMs;
    }
    const expired: string[] = [];
    for (const id of this.cellOrder) {
      const cell = this.cells.get(id);
      if (cell === undefined || cell.leaseExpiresAtMs === null || this.leaseLive(cell)) continue;
      expired.push(id);
      this.saveCell(cell);
      cell.leaseExpiresAtMs = null;
      this.touchAll();
      const slices = this.byCell.get(id);
      if (slices === undefined) continue;
      for (const [key, s] of [...slices]) {
        if (s.rate === 0 && s.burst === 0 && s.heldRate === 0 && s.heldBurst === 0) continue;
        this.saveSlice(s);
        s.rate = 0;
        s.burst = 0;
        s.heldRate = 0;
        s.heldBurst = 0;
        this.dropIfRetiredAndEmpty(key, id, s);
      }
    }
    return expired;
  }

  private leaseLive(cell: CellRec): boolean {
    return cell.leaseExpiresAtMs !== null && this.now < cell.leaseExpiresAtMs + this.config.skewMarginMs;
  }

  private saveSlice(s: SliceRec): void {
    if (this.txn === null) return;
    const copy = { ...s };
    this.txn.push(() => Object.assign(s, copy));
  }

  private saveCell(c: CellRec): void {
    if (this.txn === null) return;
    const lastReportAtMs = c.lastReportAtMs;
    const leaseExpiresAtMs = c.leaseExpiresAtMs;
    const epochMark = c.epochMark;
    this.txn.push(() => {
      c.lastReportAtMs = lastReportAtMs;
      c.leaseExpiresAtMs = leaseExpiresAtMs;
      c.epochMark = epochMark;
    });
  }

  private createSlice(key: string, cellId: string): SliceRec {
    const s: SliceRec = {
      epoch: 0,
      rate: 0,
      burst: 0,
      leaseExpiresAtMs: 0,
      floorRate: 0,
      floorBurst: 0,
      heldRate: 0,
      heldBurst: 0,
      heldFloorRate: 0,
      heldFloorBurst: 0,
      version: 0,
    };
    this.insertSlice(key, cellId, s);
    this.txn?.push(() => this.removeSlice(key, cellId));
    return s;
  }

  private insertSlice(key: string, cellId: string, s: SliceRec): void {
    let k = this.byKey.get(key);
    if (k === undefined) {
      this.byKey.set(key, (k = new Map<string, SliceRec>()));
      if (key.startsWith('tenant/') && !this.tenants.has(key.slice(7))) this.implicitKeys.add(key);
    }
    k.set(cellId, s);
    let c = this.byCell.get(cellId);
    if (c === undefined) this.byCell.set(cellId, (c = new Map<string, SliceRec>()));
    c.set(key, s);
    if (this.isStale(key, s)) this.hint(cellId, key);
  }

  private removeSlice(key: string, cellId: string): void {
    const k = this.byKey.get(key);
    k?.delete(cellId);
    if (k?.size === 0) {
      this.byKey.delete(key);
      this.implicitKeys.delete(key);
      if (this.retiringImplicit.has(key)) this.emptiedRetiring.push(key);
    }
    const c = this.byCell.get(cellId);
    c?.delete(key);
    if (c?.size === 0) this.byCell.delete(cellId);
    const h = this.staleHints.get(cellId);
    h?.delete(key);
    if (h?.size === 0) this.staleHints.delete(cellId);
  }

  private hint(cellId: string, key: string): void {
    let h = this.staleHints.get(cellId);
    if (h === undefined) this.staleHints.set(cellId, (h = new Set<string>()));
    h.add(key);
  }

  /** After a quota's definition changed (or it was deleted): every slice of it needs a new grant. */
  private markStale(key: string): void {
    this.touch(key);
    const slices = this.byKey.get(key);
    if (slices === undefined) return;
    for (const cellId of slices.keys()) this.hint(cellId, key);
  }

  /**
   * The tenant keys of a tier that some cell holds a slice of (implicit tenants of the unknown-tenant policy's tier
   * included).
   */
  private forTenantKeysOfTier(tier: string, fn: (key: string) => void): void {
    const implicit = unknownTenantTier(this.unknownTenant) === tier;
    for (const key of [...this.byKey.keys()]) {
      if (!key.startsWith('tenant/')) continue;
      const t = this.tenants.get(key.slice(7));
      if (t?.tier === tier || (t === undefined && implicit)) fn(key);
    }
  }

  /** A tier cap was created or deleted: its tenants' parent changed, so their definitions did. */
  private tierParentChanged(name: string, tier: QuotaRec, index: number): void {
    tier.updatedIndex = index;
    this.touchAll();
    this.forTenantKeysOfTier(name, (key) => this.markStale(key));
  }

  /**
   * True if the slice's grant is not what the quota's current definition would stamp: an older
   * version, or a deleted quota whose cell has not been sent the zero wind-down grant yet.
   */
  private isStale(key: string, s: SliceRec): boolean {
    const q = this.quotaOf(key);
    if (q === undefined)
      return !(
        s.version === 0 &&
        s.epoch > 0 &&
        s.rate === 0 &&
        s.burst === 0 &&
        s.floorRate === 0 &&
        s.floorBurst === 0
      );
    return s.version < q.updatedIndex;
  }

  /** A slice of a key without a quota is dropped once nothing on it is counted any more. */
  private dropIfRetiredAndEmpty(key: string, cellId: string, s: SliceRec): void {
    if (this.quotaOf(key) !== undefined) return;
    this.touch(key);
    if (!Ledger.holdsNothing(s)) return;
    const cell = this.cells.get(cellId);
    if (cell !== undefined && s.epoch > cell.epochMark) {
      this.saveCell(cell);
      cell.epochMark = s.epoch;
    }
    this.removeSlice(key, cellId);
    this.txn?.push(() => this.insertSlice(key, cellId, s));
  }

  /** Nothing on the slice is counted beyond the cell's current floor: no grant, no held grant or floor. */
  private static holdsNothing(s: SliceRec): boolean {
    return (
      s.rate === 0 &&
      s.burst === 0 &&
      s.heldRate === 0 &&
      s.heldBurst === 0 &&
      s.heldFloorRate === 0 &&
      s.heldFloorBurst === 0
    );
  }

  /** After a quota is deleted: its ceiling goes, and its slices stay only while something on them is counted. */
  private retireKey(key: string): void {
    this.ceilings.delete(key);
    const slices = this.byKey.get(key);
    if (slices === undefined) return;
    for (const [cellId, s] of [...slices]) this.dropIfRetiredAndEmpty(key, cellId, s);
    this.markStale(key);
  }

  private addTierUse(tier: string, delta: number): void {
    const n = (this.tierTenantCount.get(tier) ?? 0) + delta;
    if (n === 0) this.tierTenantCount.delete(tier);
    else this.tierTenantCount.set(tier, n);
  }

  /** After a quota's configuration changed: the ceiling becomes max(limit, what the cells may be using now). */
  private rebaseCeiling(key: string): void {
    this.touch(key);
    const q = this.quotaOf(key);
    if (q === undefined || !this.byKey.has(key)) {
      this.ceilings.delete(key);
      return;
    }
    const u = this.usage(key, q);
    if (exceeds(u.rate, q.rate) || exceeds(u.burst, q.burst)) {
      this.ceilings.set(key, { rate: Math.max(q.rate, u.rate), burst: Math.max(q.burst, u.burst) });
    } else {
      this.ceilings.delete(key);
    }
  }

  /** After every successful command: ceilings ratchet down towards their limits as old grants are released. */
  private ratchetCeilings(): void {
    for (const [key, c] of [...this.ceilings]) {
      const q = this.quotaOf(key);
      if (q === undefined) {
        this.ceilings.delete(key);
        continue;
      }
      const u = this.usage(key, q);
      const rate = Math.max(q.rate, Math.min(c.rate, u.rate));
      const burst = Math.max(q.burst, Math.min(c.burst, u.burst));
      if (!exceeds(rate, q.rate) && !exceeds(burst, q.burst)) this.ceilings.delete(key);
      else {
        c.rate = rate;
        c.burst = burst;
      }
      this.touch(key);
    }
  }

  // ---- change tracking (derived) ----------------------------------------------------------------

  private touch(key: string): void {
    if (this.touchedAll) return;
    this.touched.add(key);
    if (this.touched.size > MAX_TOUCHED_KEYS) this.touchAll();
  }

  private touchAll(): void {
    this.touchedAll = true;
    this.touched = new Set<string>();
  }

  /**
   * The quota keys whose allocator inputs changed since the previous call (a grant, an
   * acknowledgement, a definition, a ceiling, a retired slice), or null when anything may have
   * changed (the first call, a cell registered, a lease released, more than MAX_TOUCHED_KEYS keys).
   * Derived state: reading it changes nothing replicated.
   */
  takeTouchedKeys(): ReadonlySet<string> | null {
    const all = this.touchedAll;
    const keys = this.touched;
    this.touchedAll = false;
    this.touched = new Set<string>();
    return all ? null : keys;
  }

  // ---- quota math -------------------------------------------------------------------------------

  /** The configuration of a global quota, or undefined if it does not exist. */
  getQuota(key: string): QuotaConfig | undefined {
    const q = this.peekQuota(key);
    return q === undefined ? undefined : quotaConfig(q);
  }

  /** True if `key` is an implicit tenant now: no tenant record, the policy tier:NAME, not being wound down. */
  isImplicitTenant(key: string): boolean {
    return key.startsWith('tenant/') && !this.tenants.has(key.slice(7)) && this.quotaOf(key) !== undefined;
  }

  /**
   * How many tenant keys some cell holds a slice of with no tenant record: implicit tenants, those winding down and
   * deleted tenants' slices not yet dropped (each counts until its last slice is gone).
   */
  get implicitTenantCount(): number {
    return this.implicitKeys.size;
  }

  /**
   * Whether a wind-down of implicit tenant `key` (retireImplicitTenants) would finish within one lease: every slice
   * holds nothing, or is on a cell whose lease is live (it gets its zero grant and acknowledges it, or its lease ends).
   * A cell cut off with a floor stamped on its slice would keep the key winding down until it acknowledges — hours,
   * maybe — so the leader does not propose one then (and revives a key whose wind-down got stuck so, on demand).
   */
  retirable(key: string): boolean {
    const slices = this.byKey.get(key);
    if (slices === undefined || !this.isImplicitTenant(key)) return false;
    for (const [cellId, s] of slices) {
      const cell = this.cells.get(cellId);
      if (!(cell !== undefined && this.leaseLive(cell)) && !Ledger.holdsNothing(s)) return false;
    }
    return true;
  }

  /** True if `key` is a tenant key winding down under a tier:NAME policy (revivable by reviveImplicitTenants). */
  isWindingDown(key: string): boolean {
    return this.retiringImplicit.has(key);
  }

  /** The tenant keys winding down under a tier:NAME policy, in no particular order. */
  windingDownKeys(): IterableIterator<string> {
    return this.retiringImplicit.values();
  }

  /** How many tenant keys are winding down under a tier:NAME policy. */
  get windingDownCount(): number {
    return this.retiringImplicit.size;
  }

  /** The implicit tenants holding slices now (not those winding down), in no particular order. */
  *implicitTenantKeys(): IterableIterator<string> {
    for (const key of this.implicitKeys) if (this.isImplicitTenant(key)) yield key;
  }

  /** True if some cell holds a slice of `key`. */
  holdsSlices(key: string): boolean {
    return this.byKey.has(key);
  }

  private quotaOf(key: string): QuotaRec | undefined {
    const q = this.peekQuota(key);
    return q === this.peeked ? { ...q } : q;
  }

  /** Scratch record peekQuota returns for tenants (their quota is derived, not stored). */
  private readonly peeked: QuotaRec = { rate: 0, burst: 0, floorFraction: 0, updatedIndex: 0 };

  /**
   * quotaOf without making an object: a tier or domain cap's own record, or for a tenant the shared
   * `peeked` scratch filled in — read it at once, never keep it (the next call overwrites it).
   */
  private peekQuota(key: string): Readonly<QuotaRec> | undefined {
    // No pattern check needed: only valid names are ever stored, so anything else is simply not found.
    const slash = key.indexOf('/');
    const kind = key.slice(0, slash);
    const name = key.slice(slash + 1);
    if (kind === 'tier') return this.tierCaps.get(name);
    if (kind === 'domain') return this.domainCaps.get(name);
    if (kind !== 'tenant') return undefined;
    return this.peekTenantQuota(key, this.tenants.get(name));
  }

  /** peekQuota of tenant key `key`, whose record (if any) is `t`. */
  private peekTenantQuota(key: string, t: TenantRec | undefined): Readonly<QuotaRec> | undefined {
    const out = this.peeked;
    if (t === undefined) {
      // An implicit tenant (unknownTenant tier:NAME): the tier's quota, versioned by the later of
      // the tier's change and the policy's; none while it is wound down.
      if (this.retiringImplicit.size > 0 && this.retiringImplicit.has(key)) return undefined;
      const implicit = unknownTenantTier(this.unknownTenant);
      const tier = implicit === null ? undefined : this.tiers.get(implicit);
      if (tier === undefined) return undefined;
      out.rate = tier.rate;
      out.burst = tier.burst;
      out.floorFraction = tier.floorFraction;
      out.updatedIndex = Math.max(tier.updatedIndex, this.unknownTenantIndex);
      return out;
    }
    const tier = this.tiers.get(t.tier);
    if (tier === undefined) return undefined;
    out.rate = t.rate ?? tier.rate;
    out.burst = t.burst ?? tier.burst;
    out.floorFraction = tier.floorFraction;
    out.updatedIndex = Math.max(t.updatedIndex, tier.updatedIndex);
    return out;
  }

  private slotFloor(q: QuotaRec): Usage {
    return {
      rate: (q.floorFraction * q.rate) / this.config.floorCells,
      burst: (q.floorFraction * q.burst) / this.config.floorCells,
    };
  }

  private floorOf(q: QuotaRec, cell: CellRec): Usage {
    return cell.slot === null ? { rate: 0, burst: 0 } : this.slotFloor(q);
  }

  private counted(floor: Usage, s: SliceRec | undefined, live: boolean): Usage {
    if (s === undefined) return floor;
    return {
      rate: Math.max(floor.rate, s.heldFloorRate, live ? s.heldRate : 0),
      burst: Math.max(floor.burst, s.heldFloorBurst, live ? s.heldBurst : 0),
    };
  }

  /** Σu: what all cells together may be using of quota `key`, unregistered floor slots included. */
  private usage(key: string, q: QuotaRec): Usage {
    const slices = this.byKey.get(key);
    const slot = this.slotFloor(q);
    let rate = 0;
    let burst = 0;
    for (const id of this.cellOrder) {
      const cell = this.cells.get(id);
      if (cell === undefined) continue;
      // Inlined `counted` (this runs for every touched quota and cell of every round).
      let r = cell.slot === null ? 0 : slot.rate;
      let b = cell.slot === null ? 0 : slot.burst;
      const s = slices?.get(id);
      if (s !== undefined) {
        const live = this.leaseLive(cell);
        r = Math.max(r, s.heldFloorRate, live ? s.heldRate : 0);
        b = Math.max(b, s.heldFloorBurst, live ? s.heldBurst : 0);
      }
      rate += r;
      burst += b;
    }
    const free = this.config.floorCells - this.slotsTaken;
    return { rate: rate + free * slot.rate, burst: burst + free * slot.burst };
  }

  // ---- reads ------------------------------------------------------------------------------------

  getTier(name: string): TierView | undefined {
    const t = this.tiers.get(name);
    return t === undefined ? undefined : this.tierView(name, t);
  }

  listTiers(): TierView[] {
    return [...this.tiers.keys()].sort(cmp).map((n) => this.tierView(n, this.tiers.get(n) as QuotaRec));
  }

  getDomainCap(domain: string): DomainCapView | undefined {
    const c = this.domainCaps.get(domain);
    return c === undefined ? undefined : { domain, ...quotaConfig(c), updatedIndex: c.updatedIndex };
  }

  listDomainCaps(): DomainCapView[] {
    return [...this.domainCaps.keys()].sort(cmp).flatMap((d) => {
      const v = this.getDomainCap(d);
      return v === undefined ? [] : [v];
    });
  }

  getTenant(id: string): TenantDetail | undefined {
    const t = this.tenants.get(id);
    if (t === undefined) return undefined;
    const state = this.getQuotaState(tenantKey(id));
    return { ...this.tenantView(id, t), slices: state?.cells ?? [] };
  }

  get tenantCount(): number {
    return this.tenants.size;
  }

  /** Every tenant id in id order (a shared, cached array: read it, never change it). */
  tenantIds(): readonly string[] {
    this.sortedTenantIds ??= [...this.tenants.keys()].sort(cmp);
    return this.sortedTenantIds;
  }

  /** Tenants in id order, `limit` at a time (1..MAX_PAGE_LIMIT), after `cursor` (the last id of the previous page). */
  listTenants(opts: { readonly cursor?: string; readonly limit?: number } = {}): {
    tenants: TenantView[];
    nextCursor: string | null;
  } {
    const limit = Math.min(MAX_PAGE_LIMIT, Math.max(1, Math.floor(opts.limit ?? DEFAULT_PAGE_LIMIT)));
    this.sortedTenantIds ??= [...this.tenants.keys()].sort(cmp);
    const ids = this.sortedTenantIds;
    let start = 0;
    if (opts.cursor !== undefined) {
      const cursor = opts.cursor;
      let lo = 0;
      let hi = ids.length;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if ((ids[mid] ?? '') <= cursor) lo = mid + 1;
        else hi = mid;
      }
      start = lo;
    }
    const page = ids.slice(start, start + limit);
    const tenants = page.map((id) => this.tenantView(id, this.tenants.get(id) as TenantRec));
    const last = page[page.length - 1];
    return { tenants, nextCursor: start + limit < ids.length && last !== undefined ? last : null };
  }

  getCell(id: string): CellView | undefined {
    const c = this.cells.get(id);
    return c === undefined ? undefined : this.cellView(c);
  }

  /** Cells in registration order. */
  listCells(): CellView[] {
    return this.cellOrder.map((id) => this.cellView(this.cells.get(id) as CellRec));
  }

  /** The cluster-wide settings agents follow. */
  get settings(): LedgerSettings {
    return { unknownTenant: this.unknownTenant };
  }

  /** Domains with a domain-wide cap, sorted, and the log index of the last change to that set or a cap. */
  cappedDomains(): { readonly domains: string[]; readonly version: number } {
    return { domains: [...this.domainCaps.keys()].sort(cmp), version: this.domainCapsIndex };
  }

  /** What an agent applies for a quota key besides the numbers; undefined if the quota does not exist. */
  definition(key: string): QuotaDefinition | undefined {
    if (!key.startsWith('tenant/')) {
      const q = this.peekQuota(key);
      return q === undefined ? undefined : { version: q.updatedIndex, parent: null };
    }
    // A tenant: its record looked up once for the quota and the parent.
    const t = this.tenants.get(key.slice(7));
    const q = this.peekTenantQuota(key, t);
    if (q === undefined) return undefined;
    const tier = t?.tier ?? unknownTenantTier(this.unknownTenant);
    const parent = tier !== null && this.tierCaps.has(tier) ? tierCapKey(tier) : null;
    return { version: q.updatedIndex, parent };
  }

  /** How many slices cell `cellId` holds (retired ones included). */
  cellSliceCount(cellId: string): number {
    return this.byCell.get(cellId)?.size ?? 0;
  }

  /** The quota keys cell `cellId` holds a slice of (unordered; retired keys included). */
  cellSliceKeys(cellId: string): IterableIterator<string> {
    return (this.byCell.get(cellId) ?? new Map<string, SliceRec>()).keys();
  }

  /**
   * The keys whose slice on `cellId` holds a grant stamped with an older definition, or a deleted
   * quota's grant not yet wound down: the lease round sends them a new grant (the same numbers at
   * the current definition, or zero). Sorted.
   */
  staleSliceKeys(cellId: string): string[] {
    const h = this.staleHints.get(cellId);
    if (h === undefined) return [];
    const out: string[] = [];
    for (const key of [...h]) {
      const s = this.byKey.get(key)?.get(cellId);
      if (s !== undefined && this.isStale(key, s)) out.push(key);
      else h.delete(key); // derived state only: pruning a hint changes nothing replicated
    }
    if (h.size === 0) this.staleHints.delete(cellId);
    return out.sort(cmp);
  }

  /** Some cell holds a slice of `key` (retired slices included). */
  hasSlices(key: string): boolean {
    return this.byKey.has(key);
  }

  /** Quotas some cell holds a slice of (the allocator's working set), sorted. Includes retired keys. */
  activeQuotaKeys(): string[] {
    return [...this.byKey.keys()].sort(cmp);
  }

  /** A quota's limits, ceiling, floors and what every cell is counted as using. */
  getQuotaState(key: string): QuotaState | undefined {
    const q = this.quotaOf(key);
    if (q === undefined) return undefined;
    const k = key;
    const slot = this.slotFloor(q);
    const slices = this.byKey.get(k);
    const cells = this.cellOrder.map((id) => this.sliceView(q, this.cells.get(id) as CellRec, slices?.get(id)));
    const u = this.usage(k, q);
    const c = this.ceilings.get(k);
    return {
      key: k,
      ...quotaConfig(q),
      floorRate: slot.rate,
      floorBurst: slot.burst,
      ceilingRate: c?.rate ?? q.rate,
      ceilingBurst: c?.burst ?? q.burst,
      countedRate: u.rate,
      countedBurst: u.burst,
      unregisteredSlots: this.config.floorCells - this.slotsTaken,
      cells,
    };
  }

  /**
   * getQuotaState(key) with its cells written into `cols` at [at, at + cells), in listCells order,
   * instead of one SliceView object each (the lease round reads thousands of quotas a round: the
   * objects cost more than the allocator). Undefined (cols untouched) when `key` has no quota.
   */
  readQuotaColumns(key: string, cols: QuotaColumns, at: number): QuotaFigures | undefined {
    return this.quotaColumnsReader()(key, cols, at);
  }

  /**
   * readQuotaColumns for many keys: the cells (order, floor slots, leases) are read once, when it is
   * made, so use it only until the next command is applied.
   */
  quotaColumnsReader(): (
    key: string,
    cols: QuotaColumns,
    at: number,
    ackedEpochs?: ArrayLike<number>,
  ) => QuotaFigures | undefined {
    const n = this.cellOrder.length;
    const ids = this.cellOrder.slice();
    const slotted = new Uint8Array(n);
    const live = new Uint8Array(n);
    for (let c = 0; c < n; c++) {
      const cell = this.cells.get(ids[c] as string) as CellRec;
      slotted[c] = cell.slot === null ? 0 : 1;
      live[c] = this.leaseLive(cell) ? 1 : 0;
    }
    const free = this.config.floorCells - this.slotsTaken;
    const dropR = new Float64Array(n);
    const dropB = new Float64Array(n);
    // With `ackedEpochs` (per cell, the epoch the same entry acknowledges; 0: none), each slice is
    // counted as after those acknowledgements (countedAfterAck), as AllocatorInputBuilder.addQuotaState does.
    return (key, cols, at, ackedEpochs) => {
      const q = this.peekQuota(key);
      if (q === undefined) return undefined;
      const rate = q.rate;
      const burst = q.burst;
      const floorFraction = q.floorFraction;
      const slotRate = (floorFraction * rate) / this.config.floorCells;
      const slotBurst = (floorFraction * burst) / this.config.floorCells;
      const slices = this.byKey.get(key);
      let sumR = 0;
      let sumB = 0;
      let drops = 0;
      for (let c = 0; c < n; c++) {
        const s = slices?.get(ids[c] as string);
        let r = slotted[c] === 0 ? 0 : slotRate;
        let b = slotted[c] === 0 ? 0 : slotBurst;
        const i = at + c;
        if (s === undefined) {
          cols.grantRate[i] = 0;
          cols.grantBurst[i] = 0;
          cols.epoch[i] = 0;
          cols.acknowledged[i] = 1;
        } else {
          const isLive = live[c] === 1;
          r = Math.max(r, s.heldFloorRate, isLive ? s.heldRate : 0);
          b = Math.max(b, s.heldFloorBurst, isLive ? s.heldBurst : 0);
          cols.grantRate[i] = s.rate;
          cols.grantBurst[i] = s.burst;
          cols.epoch[i] = s.epoch;
          const acked =
            s.heldRate === s.rate &&
            s.heldBurst === s.burst &&
            s.heldFloorRate === s.floorRate &&
            s.heldFloorBurst === s.floorBurst;
          if (!acked && ackedEpochs !== undefined && ackedEpochs[c] === s.epoch) {
            // The totals are taken down by each cell's drop, in cell order, as addQuotaState does.
            const ar = countedAfterAck(r, slotted[c] === 0 ? 0 : slotRate, s.floorRate, s.rate);
            const ab = countedAfterAck(b, slotted[c] === 0 ? 0 : slotBurst, s.floorBurst, s.burst);
            dropR[drops] = r - ar;
            dropB[drops++] = b - ab;
            sumR += r;
            sumB += b;
            r = ar;
            b = ab;
            cols.acknowledged[i] = 1;
            cols.countedRate[i] = r;
            cols.countedBurst[i] = b;
            continue;
          }
          cols.acknowledged[i] = acked ? 1 : 0;
        }
        cols.countedRate[i] = r;
        cols.countedBurst[i] = b;
        sumR += r;
        sumB += b;
      }
      let countedRate = sumR + free * slotRate;
      let countedBurst = sumB + free * slotBurst;
      for (let j = 0; j < drops; j++) {
        countedRate -= dropR[j] as number;
        countedBurst -= dropB[j] as number;
      }
      const ceiling = this.ceilings.get(key);
      return {
        rate,
        burst,
        floorFraction,
        floorRate: slotRate,
        floorBurst: slotBurst,
        ceilingRate: ceiling?.rate ?? rate,
        ceilingBurst: ceiling?.burst ?? burst,
        countedRate,
        countedBurst,
        unregisteredSlots: free,
      };
    };
  }

  /**
   * The slices of `key` by cell, for their epochs (registered cells only: a cell's slices go with
   * it), or undefined if no cell holds one: `sliceEpochs(key)?.get(cellId)?.epoch ?? 0` is
   * `sliceEpoch(key, cellId)` with one lookup of the key for all its cells. A live view: use it only
   * until the next command is applied.
   */
  sliceEpochs(key: string): ReadonlyMap<string, { readonly epoch: number }> | undefined {
    return this.byKey.get(key);
  }

  /** getSlice(key, cellId)?.epoch ?? 0, without making the view. */
  sliceEpoch(key: string, cellId: string): number {
    if (!this.cells.has(cellId)) return 0;
    return this.byKey.get(key)?.get(cellId)?.epoch ?? 0;
  }

  /** One cell's slice of one quota (also of a deleted quota while its retired slice is still counted). */
  getSlice(key: string, cellId: string): SliceView | undefined {
    const cell = this.cells.get(cellId);
    if (cell === undefined) return undefined;
    const q = this.quotaOf(key);
    const s = this.byKey.get(key)?.get(cellId);
    if (q === undefined && s === undefined) return undefined;
    return this.sliceView(q, cell, s);
  }

  private sliceView(q: QuotaRec | undefined, cell: CellRec, s: SliceRec | undefined): SliceView {
    const floor = q === undefined ? { rate: 0, burst: 0 } : this.floorOf(q, cell);
    const u = this.counted(floor, s, this.leaseLive(cell));
    if (s === undefined) {
      return {
        cellId: cell.id,
        slot: cell.slot,
        epoch: 0,
        rate: 0,
        burst: 0,
        leaseExpiresAtMs: null,
        floorRate: floor.rate,
        floorBurst: floor.burst,
        acknowledged: true,
        countedRate: u.rate,
        countedBurst: u.burst,
        version: 0,
      };
    }
    return {
      cellId: cell.id,
      slot: cell.slot,
      epoch: s.epoch,
      rate: s.rate,
      burst: s.burst,
      leaseExpiresAtMs: cell.leaseExpiresAtMs === null ? null : s.leaseExpiresAtMs,
      floorRate: s.floorRate,
      floorBurst: s.floorBurst,
      acknowledged:
        s.heldRate === s.rate &&
        s.heldBurst === s.burst &&
        s.heldFloorRate === s.floorRate &&
        s.heldFloorBurst === s.floorBurst,
      countedRate: u.rate,
      countedBurst: u.burst,
      version: s.version,
    };
  }

  private tierView(name: string, t: QuotaRec): TierView {
    const cap = this.tierCaps.get(name);
    return {
      name,
      ...quotaConfig(t),
      cap: cap === undefined ? null : quotaConfig(cap),
      tenantCount: this.tierTenantCount.get(name) ?? 0,
      updatedIndex: t.updatedIndex,
    };
  }

  private tenantView(id: string, t: TenantRec): TenantView {
    const q = this.quotaOf(tenantKey(id));
    return {
      id,
      tier: t.tier,
      rate: t.rate,
      burst: t.burst,
      quota: q === undefined ? { rate: 0, burst: 0, floorFraction: 0 } : quotaConfig(q),
      updatedIndex: t.updatedIndex,
    };
  }

  private cellView(c: CellRec): CellView {
    return {
      id: c.id,
      slot: c.slot,
      registeredAtMs: c.registeredAtMs,
      lastReportAtMs: c.lastReportAtMs,
      leaseExpiresAtMs: c.leaseExpiresAtMs,
      leaseLive: this.leaseLive(c),
      removing: c.removing,
    };
  }

  // ---- invariants -------------------------------------------------------------------------------

  /** Checks every invariant; throws LedgerInvariantError naming the first one that fails. */
  checkInvariants(): void {
    const bad = (msg: string): never => {
      throw new LedgerInvariantError(msg);
    };
    // Cells and floor slots.
    if (this.cellOrder.length !== this.cells.size || this.cells.size > MAX_CELLS)
      bad('cell order does not match the cells');
    let slots = 0;
    const slotSeen = new Set<number>();
    for (const id of this.cellOrder) {
      const c = this.cells.get(id) ?? bad(`cell ${id} in the order is missing`);
      if (c.slot !== null) {
        if (!Number.isInteger(c.slot) || c.slot < 0 || c.slot >= this.config.floorCells || slotSeen.has(c.slot))
          bad(`cell ${id} has floor slot ${c.slot}: out of range or taken twice`);
        slotSeen.add(c.slot);
        slots++;
      }
    }
    for (const id of this.cellOrder) {
      const c = this.cells.get(id) ?? bad(`cell ${id} in the order is missing`);
      if (c.slot === null && slots < this.config.floorCells) bad(`cell ${id} has no floor slot while slots are free`);
      if (c.leaseExpiresAtMs !== null && !this.leaseLive(c)) bad(`cell ${id}: lease surely expired but not released`);
      if (!Number.isSafeInteger(c.epochMark) || c.epochMark < 0) bad(`cell ${id}: bad epoch mark ${c.epochMark}`);
    }
    if (slots !== this.slotsTaken || slots > this.config.floorCells) bad('floor slot count is wrong');
    for (const [id, epoch] of this.cellTombstones) {
      if (this.cells.has(id)) bad(`cell ${id} is registered and has a tombstone`);
      if (!Number.isSafeInteger(epoch) || epoch < 1) bad(`cell ${id}: bad tombstone epoch ${epoch}`);
    }
    // Implicit tenants: the derived set matches the slices; a winding-down key still has slices and no record.
    for (const key of this.byKey.keys())
      if (key.startsWith('tenant/') && !this.tenants.has(key.slice(7)) && !this.implicitKeys.has(key))
        bad(`implicit tenant ${key} holds slices but is not counted`);
    for (const key of this.implicitKeys)
      if (!this.byKey.has(key) || this.tenants.has(key.slice(7))) bad(`${key} is counted implicit but is not`);
    for (const key of this.retiringImplicit)
      if (!this.byKey.has(key) || this.tenants.has(key.slice(7))) bad(`${key} is winding down but holds no slice`);
    // Tiers, tenants, caps.
    if (this.tiers.size > MAX_TIERS || this.tenants.size > MAX_TENANTS || this.domainCaps.size > MAX_DOMAIN_CAPS)
      bad('a size limit is exceeded');
    const uses = new Map<string, number>();
    for (const [id, t] of this.tenants) {
      if (!this.tiers.has(t.tier)) bad(`tenant ${id} is on missing tier ${t.tier}`);
      uses.set(t.tier, (uses.get(t.tier) ?? 0) + 1);
    }
    if (uses.size !== this.tierTenantCount.size) bad('tier use counts are wrong');
    for (const [tier, n] of uses) if (this.tierTenantCount.get(tier) !== n) bad(`tier ${tier} use count is wrong`);
    for (const tier of this.tierCaps.keys()) if (!this.tiers.has(tier)) bad(`cap of missing tier ${tier}`);
    for (const [name, q] of [...this.tiers, ...this.tierCaps, ...this.domainCaps]) {
      if (!(
        q.rate > 0 &&
        q.rate <= MAX_RATE &&
        q.burst >= 1 &&
        q.burst <= MAX_BURST &&
        q.floorFraction >= 0 &&
        q.floorFraction <= 1
      ))
        bad(`quota ${name} is out of range`);
      if (!gcraWindowFits(q.rate, q.burst)) bad(`quota ${name}: burst/rate beyond the agents' GCRA window`);
    }
    // Slices.
    let count = 0;
    for (const [key, m] of this.byKey) {
      if (m.size === 0) bad(`empty slice map for ${key}`);
      const retired = this.quotaOf(key) === undefined;
      for (const [cellId, s] of m) {
        count++;
        const cell = this.cells.get(cellId) ?? bad(`slice ${key} on unknown cell ${cellId}`);
        if (this.byCell.get(cellId)?.get(key) !== s) bad(`slice ${key}/${cellId} is not indexed by cell`);
        if (!(Number.isSafeInteger(s.epoch) && s.epoch >= 1)) bad(`slice ${key}/${cellId} has epoch ${s.epoch}`);
        if (
          s.heldRate < s.rate ||
          s.heldBurst < s.burst ||
          s.heldFloorRate < s.floorRate ||
          s.heldFloorBurst < s.floorBurst
        )
          bad(`slice ${key}/${cellId} holds less than its current grant`);
        if (cell.leaseExpiresAtMs === null && (s.rate !== 0 || s.burst !== 0 || s.heldRate !== 0 || s.heldBurst !== 0))
          bad(`slice ${key}/${cellId} keeps a grant without a lease`);
        if (
          retired &&
          s.rate === 0 &&
          s.burst === 0 &&
          s.heldRate === 0 &&
          s.heldBurst === 0 &&
          s.heldFloorRate === 0 &&
          s.heldFloorBurst === 0
        )
          bad(`retired slice ${key}/${cellId} should have been dropped`);
      }
    }
    let byCellCount = 0;
    for (const m of this.byCell.values()) byCellCount += m.size;
    if (byCellCount !== count) bad('slice indexes disagree');
    // Ceilings exist only above their limits, for existing quotas.
    for (const [key, c] of this.ceilings) {
      const q = this.quotaOf(key) ?? bad(`ceiling for missing quota ${key}`);
      if (c.rate < q.rate || c.burst < q.burst || (!exceeds(c.rate, q.rate) && !exceeds(c.burst, q.burst)))
        bad(`ceiling of ${key} is not above its limit`);
    }
    // The bound. Quotas no cell holds a slice of are at Σ floors = φ × quota ≤ quota.
    const checkKey = (key: string, q: QuotaRec): void => {
      const u = this.usage(key, q);
      const c = this.ceilings.get(key);
      const cr = c?.rate ?? q.rate;
      const cb = c?.burst ?? q.burst;
      if (exceeds(u.rate, cr)) bad(`quota ${key}: cells may use rate ${u.rate}, over ${cr} (limit ${q.rate})`);
      if (exceeds(u.burst, cb)) bad(`quota ${key}: cells may use burst ${u.burst}, over ${cb} (limit ${q.burst})`);
    };
    for (const key of this.byKey.keys()) {
      const q = this.quotaOf(key);
      if (q !== undefined) checkKey(key, q);
    }
    for (const [tier, q] of this.tierCaps) if (!this.byKey.has(tierCapKey(tier))) checkKey(tierCapKey(tier), q);
    for (const [domain, q] of this.domainCaps)
      if (!this.byKey.has(domainCapKey(domain))) checkKey(domainCapKey(domain), q);
  }

  // ---- snapshots --------------------------------------------------------------------------------

  /** The whole ledger (configuration, clock, applied index, state, client sessions), canonically ordered. */
  snapshot(): Uint8Array {
    return encodeSnapshotNow(this.snapshotCopy());
  }

  /**
   * Every value of the snapshot at the applied index, copied into flat columns (no object per
   * tenant or slice), for encodeSnapshotSteps (snapshot-encoder.ts) to sort and pack later, in
   * steps, while this ledger goes on applying entries: the encoded bytes are those snapshot() gives now.
   */
  snapshotCopy(): LedgerSnapshotCopy {
    const quotaRows = (m: Map<string, QuotaRec>): SnapQuotaRow[] =>
      [...m].map(([n, q]) => [n, q.rate, q.burst, q.floorFraction, q.updatedIndex]);
    const nt = this.tenants.size;
    const tenants = {
      id: new Array<string>(nt),
      tier: new Array<string>(nt),
      rate: new Float64Array(nt),
      burst: new Float64Array(nt),
      updatedIndex: new Float64Array(nt),
    };
    let i = 0;
    for (const [id, t] of this.tenants) {
      tenants.id[i] = id;
      tenants.tier[i] = t.tier;
      tenants.rate[i] = t.rate ?? NaN;
      tenants.burst[i] = t.burst ?? NaN;
      tenants.updatedIndex[i] = t.updatedIndex;
      i++;
    }
    let ns = 0;
    for (const m of this.byKey.values()) ns += m.size;
    const keys: string[] = [];
    const start = new Int32Array(this.byKey.size + 1);
    const cellId = new Array<string>(ns);
    const num = SLICE_FIELDS.map(() => new Float64Array(ns));
    const col = (f: (typeof SLICE_FIELDS)[number]): Float64Array => num[SLICE_FIELDS.indexOf(f)] as Float64Array;
    const epoch = col('epoch');
    const rate = col('rate');
    const burst = col('burst');
    const lease = col('leaseExpiresAtMs');
    const floorRate = col('floorRate');
    const floorBurst = col('floorBurst');
    const heldRate = col('heldRate');
    const heldBurst = col('heldBurst');
    const heldFloorRate = col('heldFloorRate');
    const heldFloorBurst = col('heldFloorBurst');
    const version = col('version');
    let x = 0;
    for (const [key, m] of this.byKey) {
      start[keys.length] = x;
      keys.push(key);
      for (const [id, sl] of m) {
        cellId[x] = id;
        epoch[x] = sl.epoch;
        rate[x] = sl.rate;
        burst[x] = sl.burst;
        lease[x] = sl.leaseExpiresAtMs;
        floorRate[x] = sl.floorRate;
        floorBurst[x] = sl.floorBurst;
        heldRate[x] = sl.heldRate;
        heldBurst[x] = sl.heldBurst;
        heldFloorRate[x] = sl.heldFloorRate;
        heldFloorBurst[x] = sl.heldFloorBurst;
        version[x] = sl.version;
        x++;
      }
    }
    start[keys.length] = x;
    const nc = this.ceilings.size;
    const ceilings = { key: new Array<string>(nc), rate: new Float64Array(nc), burst: new Float64Array(nc) };
    i = 0;
    for (const [k, c] of this.ceilings) {
      ceilings.key[i] = k;
      ceilings.rate[i] = c.rate;
      ceilings.burst[i] = c.burst;
      i++;
    }
    const raised = this.format > BASE_COMMAND_FORMAT;
    return {
      v: raised ? RAISED_SNAPSHOT_FORMAT_VERSION : SNAPSHOT_FORMAT_VERSION,
      config: [this.config.floorCells, this.config.skewMarginMs, this.config.maxSessions],
      nowMs: this.now,
      appliedIndex: this.applied,
      tiers: quotaRows(this.tiers),
      tierCaps: quotaRows(this.tierCaps),
      domainCaps: quotaRows(this.domainCaps),
      tenants,
      cells: this.cellOrder.map((id) => {
        const c = this.cells.get(id) as CellRec;
        // The removal mark only when set, so a ledger that never removed a cell snapshots as before.
        return c.removing
          ? [id, c.slot, c.registeredAtMs, c.lastReportAtMs, c.leaseExpiresAtMs, c.epochMark, true]
          : [id, c.slot, c.registeredAtMs, c.lastReportAtMs, c.leaseExpiresAtMs, c.epochMark];
      }),
      slices: { key: keys, start, cellId, num },
      ceilings,
      sessions: this.sessions.entries().map((e) => [e.clientId, e.seq, e.result]),
      // The command format only once raised, so a ledger whose log never raised it snapshots as before.
      settings: raised
        ? [this.unknownTenant, this.domainCapsIndex, this.unknownTenantIndex, this.format, this.formatIndex]
        : [this.unknownTenant, this.domainCapsIndex, this.unknownTenantIndex],
      // Only when some implicit tenant is winding down, so a ledger that never retired one snapshots as before.
      retiringImplicit: this.retiringImplicit.size > 0 ? [...this.retiringImplicit] : null,
      // Only when some removed cell left one, so a ledger that never dropped a cell at format 6 snapshots as before.
      cellTombstones:
        this.cellTombstones.size > 0
          ? [...this.cellTombstones].sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0))
          : null,
    };
  }

  /** Rebuilds a ledger from `snapshot()` bytes; throws LedgerSnapshotError if they are not a valid ledger. */
  static restore(
    bytes: Uint8Array,
    options: { readonly assertInvariants?: boolean; readonly maxCommandFormat?: number } = {},
  ): Ledger {
    let doc: unknown;
    try {
      doc = snapUnpackr.unpack(bytes);
    } catch (e) {
      throw new LedgerSnapshotError(
        `undecodable snapshot: ${String(e instanceof Error ? e.message : e).slice(0, 200)}`,
        { cause: e },
      );
    }
    const r = snapshotSchema.safeParse(doc);
    if (!r.success)
      throw new LedgerSnapshotError(describeIssues(r.error.issues).replace('invalid command', 'invalid snapshot'));
    const s = r.data;
    const [floorCells, skewMarginMs, maxSessions] = s.config;
    let l: Ledger;
    try {
      l = new Ledger({
        floorCells,
        skewMarginMs,
        maxSessions,
        assertInvariants: options.assertInvariants ?? false,
        ...(options.maxCommandFormat === undefined ? {} : { maxCommandFormat: options.maxCommandFormat }),
      });
    } catch (e) {
      throw new LedgerSnapshotError(`invalid snapshot configuration: ${e instanceof Error ? e.message : String(e)}`, {
        cause: e,
      });
    }
    const format = s.settings?.[3] ?? BASE_COMMAND_FORMAT;
    if ((s.v === RAISED_SNAPSHOT_FORMAT_VERSION) !== (s.settings?.[3] !== undefined))
      throw new LedgerSnapshotError(`invalid snapshot: v ${s.v} with settings of ${s.settings?.length ?? 0} values`);
    if (format > l.maxFormat)
      throw new LedgerFormatError(
        `the snapshot at index ${s.appliedIndex} is at command format ${format}; this replica applies formats up to ` +
          `${l.maxFormat}: run a build that reads format ${format} on it (docs/quota-model.md, "Upgrades")`,
      );
    l.format = format;
    l.formatIndex = s.settings?.[4] ?? 0;
    l.now = s.nowMs;
    l.applied = s.appliedIndex;
    for (const [n, rate, burst, floorFraction, updatedIndex] of s.tiers)
      l.tiers.set(n, { rate, burst, floorFraction, updatedIndex });
    for (const [n, rate, burst, floorFraction, updatedIndex] of s.tierCaps)
      l.tierCaps.set(n, { rate, burst, floorFraction, updatedIndex });
    for (const [n, rate, burst, floorFraction, updatedIndex] of s.domainCaps)
      l.domainCaps.set(n, { rate, burst, floorFraction, updatedIndex });
    for (const [id, tier, rate, burst, updatedIndex] of s.tenants) {
      l.tenants.set(id, { tier, rate, burst, updatedIndex });
      l.addTierUse(tier, 1);
    }
    if (s.settings !== undefined) {
      l.unknownTenant = s.settings[0];
      l.domainCapsIndex = s.settings[1];
      l.unknownTenantIndex = s.settings[2] ?? 0;
    }
    // Before the slices: a winding-down key has no quota, so its slices are hinted stale as they go in.
    for (const key of s.retiringImplicit ?? []) l.retiringImplicit.add(key);
    for (const [id, epoch] of s.cellTombstones ?? []) l.cellTombstones.set(id, epoch);
    for (const [id, slot, registeredAtMs, lastReportAtMs, leaseExpiresAtMs, epochMark, removing] of s.cells) {
      if (l.cells.has(id)) throw new LedgerSnapshotError(`invalid snapshot: cell ${id} twice`);
      l.cells.set(id, {
        id,
        slot,
        removing: removing ?? false,
        registeredAtMs,
        lastReportAtMs,
        leaseExpiresAtMs,
        epochMark: epochMark ?? 0,
      });
      l.cellOrder.push(id);
      if (slot !== null) l.slotsTaken++;
    }
    for (const [
      key,
      cellId,
      epoch,
      rate,
      burst,
      leaseExpiresAtMs,
      floorRate,
      floorBurst,
      heldRate,
      heldBurst,
      heldFloorRate,
      heldFloorBurst,
      version,
    ] of s.slices) {
      l.insertSlice(key, cellId, {
        epoch,
        rate,
        burst,
        leaseExpiresAtMs,
        floorRate,
        floorBurst,
        heldRate,
        heldBurst,
        heldFloorRate,
        heldFloorBurst,
        version: version ?? 0,
      });
    }
    for (const [key, rate, burst] of s.ceilings) l.ceilings.set(key, { rate, burst });
    const entries: SessionEntry<LedgerResult>[] = s.sessions.map(([clientId, seq, result]) => ({
      clientId,
      seq,
      result: result as LedgerResult,
    }));
    l.sessions = ClientSessions.fromEntries(maxSessions, entries);
    try {
      l.checkInvariants();
    } catch (e) {
      if (e instanceof LedgerInvariantError)
        throw new LedgerSnapshotError(`inconsistent snapshot: ${e.message}`, { cause: e });
      throw e;
    }
    return l;
  }
}

export class LedgerSnapshotError extends CellquotaError {
  readonly code = 'LEDGER_SNAPSHOT_INVALID';
}

// ---- snapshot format ----------------------------------------------------------------------------

const snapUnpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, moreTypes: false });

const sName = z.string().min(1).max(MAX_NAME_LENGTH);
const sKey = z.string().regex(QUOTA_KEY_PATTERN);
const sNum = z.number().min(0);
const sIndex = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const sTime = z.number().min(0).max(MAX_TIME_MS);
const sQuota = z.tuple([
  sName,
  z.number().gt(0).max(MAX_RATE),
  z.number().min(1).max(MAX_BURST),
  z.number().min(0).max(1),
  sIndex,
]);
const sResult = z.union([
  z.object({ ok: z.literal(true), value: z.object({ kind: z.string() }).loose() }),
  z.object({ ok: z.literal(false), error: z.object({ code: z.enum(LEDGER_ERROR_CODES), message: z.string() }) }),
]);
const snapshotSchema = z.object({
  v: z.union(READABLE_SNAPSHOT_VERSIONS.map((v) => z.literal(v))),
  config: z.tuple([z.number().int(), z.number(), z.number().int()]),
  nowMs: sTime,
  appliedIndex: sIndex,
  tiers: z.array(sQuota).max(MAX_TIERS),
  tierCaps: z.array(sQuota).max(MAX_TIERS),
  domainCaps: z.array(sQuota).max(MAX_DOMAIN_CAPS),
  tenants: z
    .array(
      z.tuple([
        sName,
        sName,
        z.number().gt(0).max(MAX_RATE).nullable(),
        z.number().min(1).max(MAX_BURST).nullable(),
        sIndex,
      ]),
    )
    .max(MAX_TENANTS),
  cells: z
    .array(
      z.tuple([
        sName,
        z.number().int().min(0).max(MAX_CELLS).nullable(),
        sTime,
        sTime.nullable(),
        sTime.nullable(),
        sIndex.optional(),
        z.boolean().optional(),
      ]),
    )
    .max(MAX_CELLS),
  slices: z.array(
    z.tuple([sKey, sName, sIndex, sNum, sNum, sTime, sNum, sNum, sNum, sNum, sNum, sNum, sIndex.optional()]),
  ),
  ceilings: z.array(z.tuple([sKey, sNum, sNum])),
  sessions: z.array(z.tuple([sName, z.number().int().min(1), sResult])),
  settings: z
    .union([
      z.tuple([unknownTenantPolicySchema, sIndex]),
      z.tuple([unknownTenantPolicySchema, sIndex, sIndex]),
      z.tuple([
        unknownTenantPolicySchema,
        sIndex,
        sIndex,
        z.number().int().min(TENANT_WIND_DOWN_FORMAT).max(999_999),
        sIndex,
      ]),
    ])
    .optional(),
  retiringImplicit: z.array(sKey).max(MAX_TENANTS).optional(),
  cellTombstones: z.array(z.tuple([sName, sIndex])).optional(),
});

/** A quota whose bucket no agent can represent (burst/rate beyond the GCRA window): refused, naming the limit. */
function windowError(what: string, rate: number, burst: number): LedgerResult | null {
  if (gcraWindowFits(rate, burst)) return null;
  return fail(
    'INVALID',
    `${what}: burst/rate = ${(burst / rate).toPrecision(6)} s is longer than the agents' longest GCRA window, ` +
      `${MAX_GCRA_WINDOW_S} s (MAX_GCRA_WINDOW_S): lower the burst or raise the rate`,
  );
}
