// The coordinator's admin API (fastify, JSON). Bodies and parameters are validated with zod; the
// OpenAPI document at /docs/json is generated from the same schemas. Writes are proposed through
// Raft on the leader; a follower answers 307 with the leader's admin URL. Reads are linearizable
// (a ReadIndex barrier) unless `?stale=true`. Retried writes carrying X-Client-Id and
// X-Request-Seq apply once.
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { z } from 'zod';
import { register as defaultRegistry, type Registry } from 'prom-client';
import type { Logger } from '../../shared/logging.js';
import {
  MAX_DOMAIN_CAPS,
  MAX_NAME_LENGTH,
  MAX_TENANTS_PER_BATCH,
  TENANT_WIND_DOWN_FORMAT,
  unknownTenantPolicySchema,
  unknownTenantTier,
  tenantRecordSchema,
} from '../ledger/ledger-commands.js';
import type { LedgerCommandInput } from '../ledger/ledger-commands.js';
import type { Ledger, LedgerResult, LedgerValue } from '../ledger/ledger.js';
import { MAX_PAGE_LIMIT } from '../ledger/ledger.js';
import type { ClusterView } from '../node/coordinator-node.js';
import type { ConfChange, NodeId } from '../raft/index.js';
import { NotLeaderError, RaftRequestError } from '../node/raft-driver.js';
import type { LiveTraffic } from './live-traffic.js';
import { registerUiRoutes } from './ui-routes.js';
import { CellquotaError } from '../../shared/errors.js';
import { SerialQueue } from './serial-queue.js';

/** What the API needs from a coordinator replica. */
export interface AdminBackend {
  cluster(): ClusterView;
  isLeader(): boolean;
  leaderId(): NodeId | null;
  propose(cmd: LedgerCommandInput): Promise<LedgerResult>;
  read<T>(fn: (l: Ledger) => T, stale: boolean): Promise<T>;
  transferLeadership(to: NodeId | null): Promise<NodeId>;
  changeMembership(cc: ConfChange): Promise<void>;
  incarnations(): Record<string, string>;
  recordIncarnation(id: NodeId, incarnation: string | null): Promise<void>;
  failure(): Error | null;
}

export interface AdminServerOptions {
  readonly backend: AdminBackend;
  readonly logger: Logger;
  /** Bearer token required for writes (and reads when authReads). Unset: no auth. */
  readonly token?: string;
  readonly authReads?: boolean;
  /** Admin base URL of each member, e.g. http://127.0.0.1:8082, for redirecting writes. */
  readonly adminUrlOf: (id: NodeId) => string | null;
  readonly bodyLimitBytes?: number;
  readonly registry?: Registry;
  /** Wall clock for the time a cell-facing command carries (default Date.now). */
  readonly now?: () => number;
  /** The leader's traffic from the cells' reports, for the live view (GET /ui/). */
  readonly traffic?: LiveTraffic;
}

/** Stable error codes of the API, with their HTTP status. */
export const adminErrorCodes = {
  INVALID: 400,
  UNAUTHORIZED: 401,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  CONFLICT: 409,
  LIMIT_EXCEEDED: 409,
  QUOTA_EXCEEDED: 409,
  STALE_SESSION: 409,
  PAYLOAD_TOO_LARGE: 413,
  NOT_LEADER: 307,
  NO_LEADER: 503,
  UNAVAILABLE: 503,
  TIMEOUT: 504,
  INTERNAL: 500,
} as const;
export type AdminErrorCode = keyof typeof adminErrorCodes;

class ApiError extends CellquotaError {
  constructor(
    readonly code: AdminErrorCode,
    message: string,
    readonly details?: unknown,
  ) {
    super(message);
  }
}

const nameParam = z
  .string()
  .min(1)
  .max(MAX_NAME_LENGTH)
  .regex(/^[a-zA-Z0-9._:-]+$/, 'letters, digits and . _ : - only');
/** The body of a tier and of a cap (a tier's or a domain's): the same three numbers. */
const quotaBody = z.strictObject({
  rate: z.number().gt(0).describe('tokens per second'),
  burst: z.number().min(1),
  floorFraction: z
    .number()
    .min(0)
    .max(1)
    .optional()
    .describe('share of the quota split evenly over the cells as their static floors'),
});
type QuotaFields = { rate: number; burst: number; floorFraction?: number };
/** A tier's or cap's numbers from its validated body (floorFraction left out when not given). */
function quotaFields(b: z.output<typeof quotaBody>): QuotaFields {
  return {
    rate: b.rate,
    burst: b.burst,
    ...(b.floorFraction === undefined ? {} : { floorFraction: b.floorFraction }),
  };
}
const tenantBody = z.strictObject({
  tier: nameParam,
  rate: z.number().gt(0).optional(),
  burst: z.number().min(1).optional(),
});
/** Largest body of POST /v1/tenants: MAX_TENANTS_PER_BATCH tenants with the longest names and overrides fit. */
export const MAX_TENANT_BATCH_BODY_BYTES = 2 * 1024 * 1024;
/** The items are checked one by one (a bad one is reported, the others apply), so only the array is checked here. */
const tenantBatchBody = z.strictObject({
  tenants: z
    .array(z.unknown())
    .min(1)
    .max(MAX_TENANTS_PER_BATCH)
    .describe(`1..${MAX_TENANTS_PER_BATCH} tenants, each {"id", "tier", "rate"?, "burst"?}`),
});
const settingsBody = z.strictObject({
  unknownTenant: unknownTenantPolicySchema.describe(
    'what every agent does with a tenant the coordinators do not hold: deny (refuse its checks), allow (no ' +
      'tenant level) or tier:NAME (the quota of tier NAME, granted and counted as a tenant of that tier)',
  ),
});
const listQuery = z.strictObject({
  stale: z.enum(['true', 'false']).optional(),
  cursor: z.string().max(256).optional(),
  limit: z.coerce.number().int().min(1).max(MAX_PAGE_LIMIT).optional(),
});
const readQuery = z.strictObject({ stale: z.enum(['true', 'false']).optional() });
const transferBody = z.strictObject({ to: nameParam.optional() }).nullish();
const memberBody = z.strictObject({
  address: z
    .string()
    .min(3)
    .max(300)
    .regex(/^[^\s:]+:\d{1,5}$/, 'HOST:PORT'),
});
// Built once: a zod schema built per request costs ~50 µs (v4 compiles object schemas on first use).
const idParams = z.object({ id: nameParam });
const nameParams = z.object({ name: nameParam });
const incarnationBody = z.strictObject({ incarnation: z.string().regex(/^[0-9a-f]{8,64}$/, 'hex') });
const sessionHeaders = z.object({
  'x-client-id': nameParam.optional(),
  'x-request-seq': z.coerce.number().int().min(1).optional(),
});

function parse<T extends z.ZodType>(schema: T, value: unknown, what: string): z.output<T> {
  const r = schema.safeParse(value);
  if (!r.success) {
    throw new ApiError(
      'INVALID',
      `invalid ${what}`,
      r.error.issues.map((i) => ({ path: i.path.join('.'), message: i.message })),
    );
  }
  return r.data;
}

export async function buildAdminServer(opts: AdminServerOptions): Promise<FastifyInstance> {
  const { backend } = opts;
  const registry = opts.registry ?? defaultRegistry;
  const now = opts.now ?? Date.now;
  const app = Fastify({ logger: false, bodyLimit: opts.bodyLimitBytes ?? 64 * 1024 });
  const log = opts.logger.child({ component: 'admin-api' });

  app.setErrorHandler((err: unknown, req, reply) => {
    if (err instanceof ApiError) return sendError(reply, err);
    const e = err as { statusCode?: number; code?: string; message?: string };
    if (e.code === 'FST_ERR_CTP_BODY_TOO_LARGE' || e.statusCode === 413)
      return sendError(
        reply,
        new ApiError(
          'PAYLOAD_TOO_LARGE',
          `request body over ${req.routeOptions.bodyLimit ?? opts.bodyLimitBytes ?? 64 * 1024} bytes`,
        ),
      );
    if (e.statusCode !== undefined && e.statusCode >= 400 && e.statusCode < 500)
      return sendError(reply, new ApiError('INVALID', e.message ?? 'bad request'));
    if (err instanceof NotLeaderError) return redirectToLeader(req, reply, err.leader);
    if (err instanceof RaftRequestError)
      return sendError(reply, new ApiError(err.code === 'TIMEOUT' ? 'TIMEOUT' : 'UNAVAILABLE', err.message));
    log.error({ err, url: req.url }, 'admin request failed');
    return sendError(reply, new ApiError('INTERNAL', 'internal error'));
  });

  function sendError(reply: FastifyReply, err: ApiError): FastifyReply {
    return reply
      .code(adminErrorCodes[err.code])
      .send({ error: err.code, message: err.message, ...(err.details === undefined ? {} : { details: err.details }) });
  }

  function redirectToLeader(req: FastifyRequest, reply: FastifyReply, leader: NodeId | null): FastifyReply {
    const base = leader === null ? null : opts.adminUrlOf(leader);
    if (leader === null || base === null) {
      return sendError(
        reply,
        new ApiError(
          'NO_LEADER',
          leader === null
            ? 'no leader is known right now; retry shortly'
            : `the leader is ${leader} but its admin URL is unknown (list it in --admin-peers)`,
          { leader },
        ),
      );
    }
    return reply
      .code(307)
      .header('location', `${base}${req.url}`)
      .send({
        error: 'NOT_LEADER',
        message: `writes go to the leader ${leader}`,
        details: { leader, location: `${base}${req.url}` },
      });
  }

  function authorize(req: FastifyRequest, write: boolean): void {
    if (opts.token === undefined || (!write && opts.authReads !== true)) return;
    const h = req.headers.authorization;
    if (h === undefined) throw new ApiError('UNAUTHORIZED', 'missing bearer token (Authorization: Bearer ...)');
    if (h !== `Bearer ${opts.token}`) throw new ApiError('FORBIDDEN', 'wrong bearer token');
  }

  function session(req: FastifyRequest): { session?: { clientId: string; seq: number } } {
    const h = parse(sessionHeaders, req.headers, 'headers');
    const clientId = h['x-client-id'];
    const seq = h['x-request-seq'];
    if (clientId === undefined && seq === undefined) return {};
    if (clientId === undefined || seq === undefined)
      throw new ApiError('INVALID', 'X-Client-Id and X-Request-Seq go together');
    return { session: { clientId, seq } };
  }

  /** Goes on only on the leader; elsewhere the request is redirected to it (RepliedAlready). */
  function onLeader(req: FastifyRequest, reply: FastifyReply): void {
    if (backend.isLeader()) return;
    redirectToLeader(req, reply, backend.leaderId());
    throw new RepliedAlready('redirected to the leader');
  }

  /** A change of the member named in the path, at the address in the body: authorized, parsed, on the leader. */
  function memberChange(req: FastifyRequest, reply: FastifyReply): { id: string; address: string } {
    authorize(req, true);
    const { id } = parse(idParams, req.params, 'path');
    const { address } = parse(memberBody, req.body, 'body');
    onLeader(req, reply);
    return { id, address };
  }

  /** `check`: refusals the leader's own state decides before proposing (it throws an ApiError). */
  // A tenant's deletion is checked against the unknown-tenant policy and then proposed; the policy's change waits
  // until that deletion has applied (and the reverse), so no policy change commits between a check and its entry.
  // On this leader only: a deletion still in flight when leadership moves is either lost with the old term or
  // committed by the new leader before any entry of its own.
  const policyWrites = new SerialQueue();

  async function write(
    req: FastifyRequest,
    reply: FastifyReply,
    cmd: LedgerCommandInput,
    check?: (l: Ledger) => void,
  ): Promise<LedgerValue> {
    authorize(req, true);
    onLeader(req, reply);
    if (check !== undefined) await backend.read(check, true);
    const result = await backend.propose(cmd);
    if (!result.ok) throw new ApiError(result.error.code, result.error.message);
    return result.value;
  }

  async function read<T>(req: FastifyRequest, stale: boolean, fn: (l: Ledger) => T): Promise<T> {
    authorize(req, false);
    try {
      return await backend.read(fn, stale);
    } catch (err) {
      if (err instanceof NotLeaderError)
        throw new ApiError('NO_LEADER', 'no leader could confirm this read; retry, or use ?stale=true', {
          leader: err.leader,
        });
      throw err;
    }
  }

  class RepliedAlready extends CellquotaError {
    readonly code = 'ADMIN_REPLIED';
  }
  const guard =
    <T>(fn: (req: FastifyRequest, reply: FastifyReply) => Promise<T>) =>
    async (req: FastifyRequest, reply: FastifyReply): Promise<T | FastifyReply> => {
      try {
        return await fn(req, reply);
      } catch (err) {
        if (err instanceof RepliedAlready) return reply;
        throw err;
      }
    };

  // ---- cluster -------------------------------------------------------------------------------
  app.get(
    '/v1/cluster',
    guard(async (req) => {
      authorize(req, false);
      const q = parse(readQuery, req.query, 'query');
      // A linearizable status read confirms that the leader named here still leads.
      if (q.stale !== 'true' && backend.leaderId() !== null) await read(req, false, () => null).catch(() => undefined);
      const c = backend.cluster();
      return {
        leader: c.leader,
        term: c.term,
        commitIndex: c.commitIndex,
        appliedIndex: c.appliedIndex,
        self: c.id,
        role: c.role,
        votingRefused: c.votingRefused,
        commandFormat: c.commandFormat,
        members: c.members.map((m) => ({ ...m, adminUrl: opts.adminUrlOf(m.id) })),
      };
    }),
  );
  app.post(
    '/v1/cluster/transfer-leadership',
    guard(async (req, reply) => {
      authorize(req, true);
      const body = parse(transferBody, req.body, 'body');
      if (!backend.isLeader()) return redirectToLeader(req, reply, backend.leaderId());
      const to = await backend.transferLeadership(body?.to ?? null).catch((e: unknown) => {
        throw new ApiError('CONFLICT', e instanceof Error ? e.message : String(e));
      });
      return { transferringTo: to };
    }),
  );
  app.put(
    '/v1/members/:id',
    guard(async (req, reply) => {
      const { id, address } = memberChange(req, reply);
      await membership(backend, { op: 'add-learner', node: id, context: address });
      await waitCaughtUp(backend, id);
      await membership(backend, { op: 'promote', node: id });
      return { member: id, address, voter: true };
    }),
  );
  app.delete(
    '/v1/members/:id',
    guard(async (req, reply) => {
      authorize(req, true);
      const { id } = parse(idParams, req.params, 'path');
      if (!backend.isLeader()) return redirectToLeader(req, reply, backend.leaderId());
      await membership(backend, { op: 'remove', node: id });
      return { removed: id };
    }),
  );
  app.post(
    '/v1/members/:id/replace',
    guard(async (req, reply) => {
      const { id, address } = memberChange(req, reply);
      if (id === backend.leaderId())
        throw new ApiError(
          'CONFLICT',
          `${id} is the leader: transfer leadership first (POST /v1/cluster/transfer-leadership)`,
        );
      await membership(backend, { op: 'remove', node: id });
      // The cluster forgets the old data directory; the new one records itself when it starts.
      await backend.recordIncarnation(id, null);
      await membership(backend, { op: 'add-learner', node: id, context: address });
      await waitCaughtUp(backend, id);
      await membership(backend, { op: 'promote', node: id });
      // Move to a new term, so no vote the lost data directory may have cast can count again.
      const other = backend.cluster().members.find((m) => m.voter && m.id !== id && m.id !== backend.leaderId());
      if (other !== undefined) await backend.transferLeadership(other.id).catch(() => undefined);
      return { replaced: id, address };
    }),
  );

  // ---- internal: member incarnations (wiped-data-directory detection) ---------------------------
  app.get(
    '/v1/internal/incarnations',
    guard(async (req) => {
      authorize(req, false);
      const q = parse(readQuery, req.query, 'query');
      const incarnations = await read(req, q.stale === 'true', () => backend.incarnations());
      return { incarnations };
    }),
  );
  app.put(
    '/v1/internal/incarnations/:id',
    guard(async (req, reply) => {
      const { id } = parse(idParams, req.params, 'path');
      const body = parse(incarnationBody, req.body, 'body');
      if (!backend.isLeader()) return redirectToLeader(req, reply, backend.leaderId());
      const known = backend.incarnations()[id];
      if (known !== undefined && known !== body.incarnation)
        throw new ApiError('CONFLICT', `the cluster knows ${id} with another data directory; replace the member first`);
      await backend.recordIncarnation(id, body.incarnation);
      return { member: id, incarnation: body.incarnation };
    }),
  );

  // ---- tiers ---------------------------------------------------------------------------------
  /** PUT of a tier or a cap: the name from the path, `{rate, burst, floorFraction?}` from the body. */
  function putQuota(path: string, command: (name: string, q: QuotaFields) => LedgerCommandInput): void {
    app.put(
      path,
      guard(async (req, reply) => {
        const { name } = parse(nameParams, req.params, 'path');
        const q = quotaFields(parse(quotaBody, req.body, 'body'));
        return write(req, reply, { ...command(name, q), ...session(req) });
      }),
    );
  }
  /** DELETE of a tier or a cap named in the path: `{deleted: name}`. */
  function deleteNamed(path: string, command: (name: string) => LedgerCommandInput): void {
    app.delete(
      path,
      guard(async (req, reply) => {
        const { name } = parse(nameParams, req.params, 'path');
        await write(req, reply, { ...command(name), ...session(req) });
        return { deleted: name };
      }),
    );
  }
  /** GET of what `fn` reads for the name in the path (undefined: 404 with `missing(name)`). */
  function getNamed<T>(path: string, fn: (l: Ledger, name: string) => T | undefined, missing: (n: string) => string) {
    app.get(
      path,
      guard(async (req) => {
        const { name } = parse(nameParams, req.params, 'path');
        const q = parse(readQuery, req.query, 'query');
        const v = await read(req, q.stale === 'true', (l) => fn(l, name));
        if (v === undefined) throw new ApiError('NOT_FOUND', missing(name));
        return v;
      }),
    );
  }
  putQuota('/v1/tiers/:name', (name, q) => ({ type: 'putTier', name, ...q }));
  getNamed(
    '/v1/tiers/:name',
    (l, name) => l.getTier(name),
    (name) => `no tier '${name}'`,
  );
  app.get(
    '/v1/tiers',
    guard(async (req) => {
      const q = parse(readQuery, req.query, 'query');
      return { tiers: await read(req, q.stale === 'true', (l) => l.listTiers()) };
    }),
  );
  deleteNamed('/v1/tiers/:name', (name) => ({ type: 'deleteTier', name }));

  // ---- caps: a tier's aggregate cap (key tier/<name>) and domain-wide caps (key domain/<name>) ------
  // Built as the tier routes are: the same body, validated here and again by the ledger's schema,
  // which also refuses (400 INVALID, naming MAX_GCRA_WINDOW_S) a window no agent can represent.
  putQuota('/v1/tiers/:name/cap', (tier, q) => ({ type: 'putTierCap', tier, ...q }));
  getNamed(
    '/v1/tiers/:name/cap',
    (l, tier) => {
      const cap = l.getTier(tier)?.cap;
      return cap === undefined || cap === null ? undefined : { tier, ...cap };
    },
    (tier) => `no cap of tier '${tier}' (or no such tier)`,
  );
  deleteNamed('/v1/tiers/:name/cap', (tier) => ({ type: 'deleteTierCap', tier }));
  putQuota('/v1/domains/:name/cap', (domain, q) => ({ type: 'putDomainCap', domain, ...q }));
  getNamed(
    '/v1/domains/:name/cap',
    (l, domain) => l.getDomainCap(domain),
    (d) => `domain '${d}' has no cap`,
  );
  app.get(
    '/v1/domains',
    guard(async (req) => {
      const q = parse(readQuery, req.query, 'query');
      return { domains: await read(req, q.stale === 'true', (l) => l.listDomainCaps()) };
    }),
  );
  deleteNamed('/v1/domains/:name/cap', (domain) => ({ type: 'deleteDomainCap', domain }));

  // ---- tenants -------------------------------------------------------------------------------
  app.put(
    '/v1/tenants/:id',
    guard(async (req, reply) => {
      const { id } = parse(idParams, req.params, 'path');
      const body = parse(tenantBody, req.body, 'body');
      return write(req, reply, {
        type: 'putTenant',
        id,
        tier: body.tier,
        ...(body.rate === undefined ? {} : { rate: body.rate }),
        ...(body.burst === undefined ? {} : { burst: body.burst }),
        ...session(req),
      });
    }),
  );
  app.get(
    '/v1/tenants/:id',
    guard(async (req) => {
      const { id } = parse(idParams, req.params, 'path');
      const q = parse(readQuery, req.query, 'query');
      const t = await read(req, q.stale === 'true', (l) => l.getTenant(id));
      if (t === undefined) throw new ApiError('NOT_FOUND', `no tenant '${id}'`);
      return t;
    }),
  );
  app.get(
    '/v1/tenants',
    guard(async (req) => {
      const q = parse(listQuery, req.query, 'query');
      return read(req, q.stale === 'true', (l) =>
        l.listTenants({
          ...(q.cursor === undefined ? {} : { cursor: q.cursor }),
          ...(q.limit === undefined ? {} : { limit: q.limit }),
        }),
      );
    }),
  );
  // Many tenants in one Raft entry (bulk import, `cellquota ctl tenants import`). Each item is
  // validated on its own: a bad one is reported with its position and changes nothing, the rest apply.
  app.post(
    '/v1/tenants',
    { bodyLimit: MAX_TENANT_BATCH_BODY_BYTES },
    guard(async (req, reply) => {
      authorize(req, true);
      const body = parse(tenantBatchBody, req.body, 'body');
      const failed: { index: number; id: string | null; error: AdminErrorCode; message: string }[] = [];
      const valid: z.output<typeof tenantRecordSchema>[] = [];
      const positions: number[] = [];
      for (const [index, item] of body.tenants.entries()) {
        const r = tenantRecordSchema.safeParse(item);
        if (r.success) {
          valid.push(r.data);
          positions.push(index);
        } else {
          const id =
            typeof item === 'object' && item !== null && typeof (item as { id?: unknown }).id === 'string'
              ? (item as { id: string }).id.slice(0, MAX_NAME_LENGTH)
              : null;
          failed.push({
            index,
            id,
            error: 'INVALID',
            message: r.error.issues
              .slice(0, 3)
              .map((i) => `${i.path.length > 0 ? i.path.join('.') : '(item)'}: ${i.message}`)
              .join('; '),
          });
        }
      }
      let counts = { created: 0, updated: 0, unchanged: 0 };
      if (valid.length > 0) {
        const v = await write(req, reply, { type: 'putTenants', tenants: valid, ...session(req) });
        if (v.kind !== 'tenants') throw new Error(`putTenants answered ${v.kind}`);
        counts = { created: v.created, updated: v.updated, unchanged: v.unchanged };
        for (const f of v.failed)
          failed.push({ index: positions[f.index] ?? -1, id: f.id, error: f.code, message: f.message });
      }
      failed.sort((a, b) => a.index - b.index);
      return { ...counts, failed };
    }),
  );
  app.delete(
    '/v1/tenants/:id',
    guard(async (req, reply) => {
      const { id } = parse(idParams, req.params, 'path');
      await policyWrites.run(() =>
        write(req, reply, { type: 'deleteTenant', id, ...session(req) }, (l) => {
          // Below format 5 the deletion applies as the builds before it applied it: under tier:NAME the tenant's
          // slices became an implicit tenant at once, their old grants counted against the tier's lower quota with
          // no ceiling (the bound broken, the snapshot not restoring). Refused until the log is raised, whether or
          // not the tenant holds slices now: a lease round committed between this check and the deletion can give
          // it its first ones (review). The policy itself cannot change in between: putSettings waits for this
          // deletion (policyWrites).
          if (l.commandFormat < TENANT_WIND_DOWN_FORMAT && unknownTenantTier(l.settings.unknownTenant) !== null)
            throw new ApiError(
              'CONFLICT',
              `the unknown-tenant policy is ${l.settings.unknownTenant}: tenant ${id} can be deleted once the log ` +
                `is at command format ${TENANT_WIND_DOWN_FORMAT} (now ${l.commandFormat}), raised by the leader as ` +
                'soon as every replica runs a build that reads it (GET /v1/cluster)',
            );
        }),
      );
      return { deleted: id };
    }),
  );

  // ---- settings (what every agent follows) ----------------------------------------------------
  app.get(
    '/v1/settings',
    guard(async (req) => {
      const q = parse(readQuery, req.query, 'query');
      return read(req, q.stale === 'true', (l) => l.settings);
    }),
  );
  app.put(
    '/v1/settings',
    guard(async (req, reply) => {
      const body = parse(settingsBody, req.body, 'body');
      const v = await policyWrites.run(() =>
        write(req, reply, { type: 'putSettings', unknownTenant: body.unknownTenant, ...session(req) }),
      );
      return v.kind === 'settings' ? v.settings : v;
    }),
  );

  // ---- cells ---------------------------------------------------------------------------------
  app.get(
    '/v1/cells',
    guard(async (req) => {
      const q = parse(readQuery, req.query, 'query');
      const cells = await read(req, q.stale === 'true', (l) => l.listCells());
      const t = now();
      return {
        cells: cells.map((c) => ({
          id: c.id,
          lastReportAt: iso(c.lastReportAtMs),
          leaseExpiresAt: iso(c.leaseExpiresAtMs),
          leaseLive: c.leaseLive && (c.leaseExpiresAtMs ?? 0) > t,
          slot: c.slot,
          registeredAt: iso(c.registeredAtMs),
          removing: c.removing,
        })),
      };
    }),
  );
  // Deregisters a cell (through Raft): no more leases; dropped with its slices, its floor slot freed,
  // once its lease is over (at once when it has none). It carries the ledger's own time: only the
  // lease service moves that clock (leader-clock.ts), so this can release no lease early.
  app.delete(
    '/v1/cells/:id',
    guard(async (req, reply) => {
      const { id } = parse(z.object({ id: nameParam }), req.params, 'path');
      const nowMs = await read(req, true, (l) => l.nowMs);
      const v = await write(req, reply, { type: 'removeCell', cellId: id, nowMs, ...session(req) });
      if (v.kind !== 'cellRemoved') throw new Error(`removeCell answered ${v.kind}`);
      return { removed: v.id, dropped: v.dropped, leaseExpiresAt: iso(v.leaseExpiresAtMs), freedSlot: v.freedSlot };
    }),
  );

  // ---- operations ----------------------------------------------------------------------------
  app.get('/healthz', (_req, reply) => {
    const f = backend.failure();
    if (f !== null) return sendError(reply, new ApiError('UNAVAILABLE', `raft node stopped: ${f.message}`));
    return reply.send({ ok: true });
  });
  app.get('/readyz', (_req, reply) => {
    const c = backend.cluster();
    const ready = backend.failure() === null && c.leader !== null && !c.votingRefused;
    return reply
      .code(ready ? 200 : 503)
      .send({ ready, leader: c.leader, term: c.term, votingRefused: c.votingRefused });
  });
  app.get('/metrics', async (_req, reply) =>
    reply.header('content-type', registry.contentType).send(await registry.metrics()),
  );
  // ---- the live view -----------------------------------------------------------------------------
  registerUiRoutes(app, {
    backend,
    adminUrlOf: opts.adminUrlOf,
    now,
    ...(opts.token === undefined ? {} : { token: opts.token }),
    ...(opts.traffic === undefined ? {} : { traffic: opts.traffic }),
  });

  const openApi = openApiDocument();
  app.get('/docs/json', (_req, reply) => reply.send(openApi));

  await app.ready();
  return app;
}

async function membership(backend: AdminBackend, cc: ConfChange): Promise<void> {
  try {
    await backend.changeMembership(cc);
  } catch (err) {
    if (err instanceof RaftRequestError && err.code === 'REFUSED') throw new ApiError('CONFLICT', err.message);
    throw err;
  }
}

async function waitCaughtUp(backend: AdminBackend, id: NodeId, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const c = backend.cluster();
    const m = c.members.find((x) => x.id === id);
    if (m?.match !== null && m?.match !== undefined && m.match >= c.commitIndex) return;
    if (Date.now() > deadline)
      throw new ApiError(
        'TIMEOUT',
        `${id} did not catch up within ${timeoutMs} ms; it stays a learner (is it running with --join?)`,
      );
    await new Promise((r) => setTimeout(r, 50));
  }
}

function iso(ms: number | null): string | null {
  return ms === null ? null : new Date(ms).toISOString();
}

function openApiDocument(): Record<string, unknown> {
  const json = (s: z.ZodType): unknown => z.toJSONSchema(s, { io: 'input', unrepresentable: 'any' });
  const error = {
    description: 'error',
    content: {
      'application/json': {
        schema: {
          type: 'object',
          properties: {
            error: { type: 'string', enum: Object.keys(adminErrorCodes) },
            message: { type: 'string' },
            details: {},
          },
          required: ['error', 'message'],
        },
      },
    },
  };
  const ok = { description: 'ok', content: { 'application/json': { schema: { type: 'object' } } } };
  const body = (s: z.ZodType) => ({ required: true, content: { 'application/json': { schema: json(s) } } });
  const responses = {
    200: ok,
    307: error,
    400: error,
    401: error,
    403: error,
    404: error,
    409: error,
    413: error,
    503: error,
  };
  const nameP = (n: string) => ({ name: n, in: 'path', required: true, schema: json(nameParam) });
  const stale = { name: 'stale', in: 'query', required: false, schema: { type: 'string', enum: ['true', 'false'] } };
  /** PUT (quotaBody), GET and DELETE of a tier or a cap named in the path. */
  const quotaPath = (what: string) => ({
    put: {
      description: `${what}; a burst/rate longer than the agents can hold (MAX_GCRA_WINDOW_S) is a 400`,
      parameters: [nameP('name')],
      requestBody: body(quotaBody),
      responses,
    },
    get: { parameters: [nameP('name'), stale], responses },
    delete: { parameters: [nameP('name')], responses },
  });
  return {
    openapi: '3.1.0',
    info: { title: 'cellquota coordinator admin API', version: '1' },
    components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
    paths: {
      '/v1/cluster': { get: { parameters: [stale], responses } },
      '/v1/cluster/transfer-leadership': {
        post: {
          requestBody: {
            required: false,
            content: { 'application/json': { schema: json(z.strictObject({ to: nameParam.optional() })) } },
          },
          responses,
        },
      },
      '/v1/members/{id}': {
        put: { parameters: [nameP('id')], requestBody: body(memberBody), responses },
        delete: { parameters: [nameP('id')], responses },
      },
      '/v1/members/{id}/replace': { post: { parameters: [nameP('id')], requestBody: body(memberBody), responses } },
      '/v1/tiers': { get: { parameters: [stale], responses } },
      '/v1/tiers/{name}': quotaPath('the tier: the quota of each of its tenants'),
      '/v1/tiers/{name}/cap': quotaPath(
        "the tier's aggregate cap: all its tenants together (quota key tier/NAME); the tier must exist",
      ),
      '/v1/domains': { get: { description: 'the domain-wide caps, by domain', parameters: [stale], responses } },
      '/v1/domains/{name}/cap': quotaPath(
        'the domain-wide cap: all global traffic of the Envoy rate-limit domain NAME (quota key domain/NAME); ' +
          `at most ${MAX_DOMAIN_CAPS} domains`,
      ),
      '/v1/tenants': {
        get: {
          parameters: [
            stale,
            { name: 'cursor', in: 'query', schema: { type: 'string' } },
            { name: 'limit', in: 'query', schema: { type: 'integer', minimum: 1, maximum: MAX_PAGE_LIMIT } },
          ],
          responses,
        },
        post: {
          description:
            `creates or replaces up to ${MAX_TENANTS_PER_BATCH} tenants in one Raft entry; ` +
            'each item is checked on its own, a bad one changes nothing and is listed in "failed" ' +
            'with its position; a tenant already stored exactly so is "unchanged". Answers ' +
            '{created, updated, unchanged, failed: [{index, id, error, message}]}',
          requestBody: {
            required: true,
            content: {
              'application/json': {
                schema: {
                  type: 'object',
                  properties: {
                    tenants: {
                      type: 'array',
                      minItems: 1,
                      maxItems: MAX_TENANTS_PER_BATCH,
                      items: json(tenantRecordSchema),
                    },
                  },
                  required: ['tenants'],
                  additionalProperties: false,
                },
              },
            },
          },
          responses,
        },
      },
      '/v1/settings': { get: { parameters: [stale], responses }, put: { requestBody: body(settingsBody), responses } },
      '/v1/tenants/{id}': {
        put: { parameters: [nameP('id')], requestBody: body(tenantBody), responses },
        get: { parameters: [nameP('id'), stale], responses },
        delete: { parameters: [nameP('id')], responses },
      },
      '/v1/cells': { get: { parameters: [stale], responses } },
      '/v1/cells/{id}': {
        delete: {
          description:
            'deregister a cell: no more leases; dropped with its slices ' +
            'and its floor slot freed once its lease is over',
          parameters: [nameP('id')],
          responses,
        },
      },
      '/healthz': { get: { responses } },
      '/readyz': { get: { responses } },
      '/metrics': { get: { responses: { 200: { description: 'Prometheus text format' } } } },
      '/ui/': {
        get: {
          description:
            'the live view (HTML); with a token configured, Authorization: ' +
            'Bearer or the session cookie of POST /ui/login',
          responses: { 200: { description: 'HTML' }, 401: { description: 'the login page' } },
        },
      },
      '/ui/api/state': {
        get: {
          description: "the live view's document: cluster, cells, overshoot, one page of tenants, the chosen tenant",
          parameters: [
            { name: 'q', in: 'query', schema: { type: 'string' } },
            { name: 'page', in: 'query', schema: { type: 'integer' } },
            { name: 'size', in: 'query', schema: { type: 'integer' } },
            { name: 'sort', in: 'query', schema: { type: 'string', enum: ['busy', 'admitted', 'refused', 'id'] } },
            { name: 'tenant', in: 'query', schema: { type: 'string' } },
          ],
          responses,
        },
      },
    },
  };
}
