// `cellquota ctl`: tiers, caps (a tier's, a domain's), tenants, settings, cells, members and cluster status
// through the admin API.
// Tables for people, --json for scripts. Writes carry a client id and sequence number, so a
// retry after a lost answer applies once; a follower's 307 is followed to the leader.
import { parseArgs } from 'node:util';
import { z } from 'zod';
import { loadSettings, setting, settingSpecs, settingsHelp } from '../shared/cli-config.js';
import { randomBytes } from 'node:crypto';
import { runTop } from './ctl-top.js';
import {
  DEFAULT_IMPORT_BATCH,
  DEFAULT_IMPORT_PARALLEL,
  formatOfFile,
  importTenants,
  ImportFileError,
  type BatchAnswer,
  type ImportFormat,
  type ImportSummary,
} from './ctl-import.js';
import { MAX_TENANTS_PER_BATCH } from '../coordinator/ledger/ledger-commands.js';
import { formatAge, formatValue, renderTable, type Column } from './ctl-format.js';
import { CellquotaError } from '../shared/errors.js';

/** The settings of every `cellquota ctl` command, declared once (shared/cli-config.ts). */
export const ctlFields = z.object({
  admin: setting(z.string().min(1), {
    help: 'admin API URL(s) of the coordinators, comma-separated (HOST:PORT is http://)',
    default: 'http://127.0.0.1:8081',
    example: 'http://10.0.0.1:8081,http://10.0.0.2:8081',
  }),
  token: setting(z.string().min(1).optional(), {
    help: "the coordinators' admin token (--admin-token)",
    env: 'CELLQUOTA_ADMIN_TOKEN',
    example: 'a-long-admin-token',
  }),
  json: setting(z.boolean(), {
    help: "print the admin API's documents as JSON instead of tables",
    default: false,
    example: 'true',
  }),
});

export const CTL_SETTING_SPECS = settingSpecs(ctlFields);

const ctlUsage = `cellquota ctl [--admin URL[,URL...]] [--token TOKEN] [--json] <command>

${settingsHelp(CTL_SETTING_SPECS, { configFile: false })}

  cluster                                        leader, term, commit index, members
  tiers list | get NAME | delete NAME
  tiers put NAME --rate R --burst B [--floor-fraction F]
  tiers cap get NAME | delete NAME
  tiers cap put NAME --rate R --burst B [--floor-fraction F]
                                                 the cap over all tenants of tier NAME together
  domains list                                   the domain-wide caps
  domains cap get NAME | delete NAME
  domains cap put NAME --rate R --burst B [--floor-fraction F]
                                                 the cap over all global traffic of the Envoy
                                                 rate-limit domain NAME
  tenants list [--limit N] [--cursor C] | get ID | delete ID
  tenants put ID --tier NAME [--rate R] [--burst B]
  tenants import FILE [--format jsonl|csv] [--batch N] [--parallel N]
                                                 create or replace many tenants: JSON lines
                                                 ({"id","tier","rate"?,"burst"?} a line) or CSV (a header
                                                 row id,tier[,rate][,burst]); progress on stderr, then a
                                                 summary with every failed line; exit 1 if any failed.
                                                 Re-running it changes nothing (unchanged tenants stay).
  settings [get]                                 the cluster-wide settings every agent follows
  settings set --unknown-tenant POLICY           what agents do with a tenant the coordinators do not
                                                 hold: deny (refuse), allow (no tenant level) or
                                                 tier:NAME (tier NAME's quota, granted and counted as a
                                                 tenant of NAME; the tier must exist and cannot be
                                                 deleted while the policy names it)
  cells [list]                                   cells, floor slot, last report, lease expiry
  cells remove ID                                deregister a cell whose agents are stopped: no more
                                                 leases; dropped with its slices once its lease is over,
                                                 and its floor slot freed for another cell
  members add ID --address HOST:PORT             add a replica (started with --join) and promote it
  members remove ID
  members replace ID --address HOST:PORT         re-add a replica whose data directory was lost
  transfer-leadership [--to ID]                  hand leadership to another replica (before a restart)
  top [--limit N]                                the live view in the terminal, each second: cluster, the
                                                 bound, cells, busiest tenants by admitted and refused; q quits
`;

/** ctl's error codes and the exit status each exits with (README: 1 refused, 2 usage, 3 unreachable, 4 not found). */
const CTL_EXIT_STATUS = { CTL_REQUEST_FAILED: 1, CTL_USAGE: 2, CTL_UNREACHABLE: 3, CTL_NOT_FOUND: 4 } as const;
type CtlErrorCode = keyof typeof CTL_EXIT_STATUS;
type CtlExitStatus = (typeof CTL_EXIT_STATUS)[CtlErrorCode];

class CtlError extends CellquotaError {
  readonly code: CtlErrorCode;
  constructor(
    message: string,
    readonly exitCode: CtlExitStatus,
  ) {
    super(message);
    const code = (Object.keys(CTL_EXIT_STATUS) as CtlErrorCode[]).find((c) => CTL_EXIT_STATUS[c] === exitCode);
    if (code === undefined) throw new Error(`CtlError: no code for exit status ${exitCode}`);
    this.code = code;
  }
}

interface Ctx {
  readonly urls: readonly string[];
  readonly token: string | undefined;
  readonly json: boolean;
  readonly clientId: string;
  seq: number;
}

async function call(ctx: Ctx, method: string, path: string, body?: unknown): Promise<unknown> {
  const write = method !== 'GET';
  const headers: Record<string, string> = { accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (ctx.token !== undefined) headers['authorization'] = `Bearer ${ctx.token}`;
  if (write) {
    ctx.seq += 1;
    headers['x-client-id'] = ctx.clientId;
    headers['x-request-seq'] = String(ctx.seq);
  }
  let lastError = 'no admin URL';
  for (let attempt = 0; attempt < 5; attempt++) {
    for (const base of ctx.urls) {
      let res: Response;
      try {
        // Redirects (a follower pointing at the leader) are followed by hand: fetch would drop the
        // Authorization header on a redirect to another origin.
        let url = `${base.replace(/\/$/, '')}${path}`;
        for (let hop = 0; ; hop++) {
          res = await fetch(url, {
            method,
            headers,
            redirect: 'manual',
            ...(body === undefined ? {} : { body: JSON.stringify(body) }),
            signal: AbortSignal.timeout(15_000),
          });
          const location = res.headers.get('location');
          if (res.status !== 307 || location === null || hop >= 3) break;
          await res.arrayBuffer();
          url = location;
        }
      } catch (err) {
        lastError = `${base}: ${err instanceof Error ? err.message : String(err)}`;
        continue;
      }
      const text = await res.text();
      let doc: unknown;
      try {
        doc = text.length > 0 ? JSON.parse(text) : null;
      } catch {
        doc = { message: text };
      }
      if (res.ok) return doc;
      const err = doc as { error?: string; message?: string; details?: unknown };
      if (res.status === 503 || res.status === 504) {
        lastError = `${base}: ${err.error ?? res.status} ${err.message ?? ''}`;
        continue;
      }
      const details = err.details === undefined ? '' : `\n${JSON.stringify(err.details, null, 2)}`;
      throw new CtlError(
        `${res.status} ${err.error ?? ''}: ${err.message ?? text}${details}`,
        res.status === 404 ? 4 : 1,
      );
    }
    await new Promise((r) => setTimeout(r, 300 * (attempt + 1)));
  }
  throw new CtlError(`no admin endpoint answered: ${lastError}`, 3);
}

function intOption(v: string | undefined, name: string, dflt: number, max: number): number {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > max)
    throw new CtlError(`--${name} must be an integer in 1..${max}, got '${v}'`, 2);
  return n;
}

async function runImport(
  ctx: Ctx,
  file: string,
  values: { format?: string | undefined; batch?: string | undefined; parallel?: string | undefined },
): Promise<ImportSummary> {
  let format: ImportFormat | undefined;
  if (values.format !== undefined) {
    if (values.format !== 'jsonl' && values.format !== 'csv')
      throw new CtlError(`--format must be jsonl or csv, got '${values.format}'`, 2);
    format = values.format;
  } else {
    format = formatOfFile(file);
    if (format === undefined)
      throw new CtlError(
        `cannot tell the format of ${file} from its name (.jsonl, .ndjson, .json or .csv): give --format jsonl|csv`,
        2,
      );
  }
  const batch = intOption(values.batch, 'batch', DEFAULT_IMPORT_BATCH, MAX_TENANTS_PER_BATCH);
  const parallel = intOption(values.parallel, 'parallel', DEFAULT_IMPORT_PARALLEL, 64);
  // One session per lane: a lane's writes are sequential, so its sequence numbers apply in order
  // and a retried batch (same number) applies once.
  const lanes: Ctx[] = Array.from({ length: parallel }, (_, i) => ({
    ...ctx,
    clientId: `${ctx.clientId}-${i}`,
    seq: 0,
  }));
  const fmt = (n: number): string => n.toLocaleString('en-US');
  try {
    return await importTenants({
      file,
      format,
      batch,
      parallel,
      send: async (lane, tenants) =>
        (await call(lanes[lane] ?? ctx, 'POST', '/v1/tenants', { tenants })) as BatchAnswer,
      onProgress: (p) => {
        const pct = p.totalBytes > 0 ? ` (${Math.round((100 * p.bytesRead) / p.totalBytes)}% of the file read)` : '';
        console.error(
          `import: ${fmt(p.done)} of ${fmt(p.read)} records done${pct}, ` +
            `${fmt(Math.round((p.done * 1000) / Math.max(1, p.elapsedMs)))}/s, ${fmt(p.failed)} failed`,
        );
      },
    });
  } catch (err) {
    if (err instanceof ImportFileError) throw new CtlError(err.message, 2);
    if (err instanceof CtlError)
      throw new CtlError(
        `import stopped: ${err.message} (batches answered before this applied; re-run the import to finish, ` +
          'applied tenants come back unchanged)',
        err.exitCode,
      );
    throw err;
  }
}

function describeImport(s: ImportSummary): string {
  const fmt = (n: number): string => n.toLocaleString('en-US');
  const head =
    `imported ${fmt(s.records)} records from ${s.file} in ${s.seconds.toFixed(1)} s (${fmt(s.perSecond)}/s, ` +
    `${fmt(s.batches)} batches): ${fmt(s.created)} created, ${fmt(s.updated)} updated, ${fmt(s.unchanged)} ` +
    `unchanged, ${fmt(s.failedCount)} failed`;
  if (s.failedCount === 0) return head;
  const shown = s.failed
    .slice(0, 50)
    .map((f) => `  line ${f.line}${f.id === null ? '' : ` (${f.id})`}: ${f.error} ${f.message}`);
  const more =
    s.failedCount > shown.length
      ? [`  … and ${fmt(s.failedCount - shown.length)} more (--json lists up to ${fmt(s.failed.length)})`]
      : [];
  return [head, 'failed lines (each changed nothing):', ...shown, ...more].join('\n');
}

type Row = Record<string, unknown>;

/** A column showing field `key` of a row as is (numbers right-aligned). */
function field(header: string, key: string, align: 'left' | 'right' = 'left'): Column<Row> {
  return { header, value: (r) => formatValue(r[key]), align };
}

/** A column showing the time in field `key` (ms since the epoch or ISO) as an age from now. */
function age(header: string, key: string, nowMs: number): Column<Row> {
  return { header, value: (r) => formatAge(r[key] as number | string | null | undefined, nowMs) };
}

interface TenantRow {
  readonly id: string;
  readonly tier: string;
  readonly rate: number | null;
  readonly burst: number | null;
  readonly quota: { readonly rate: number; readonly burst: number };
}

/** Where a tenant's effective quota comes from: its tier, or its own overrides. */
function quotaSource(t: TenantRow): string {
  if (t.rate === null && t.burst === null) return 'tier';
  if (t.rate !== null && t.burst !== null) return 'override';
  return t.rate !== null ? 'rate override' : 'burst override';
}

const memberColumns: readonly Column<Row>[] = [
  field('ID', 'id'),
  field('ROLE', 'role'),
  field('ADDRESS', 'address'),
  field('MATCH INDEX', 'match', 'right'),
  field('REACHABLE', 'reachable'),
];
const tierColumns: readonly Column<Row>[] = [
  field('NAME', 'name'),
  field('RATE /S', 'rate', 'right'),
  field('BURST', 'burst', 'right'),
  field('FLOOR FRACTION', 'floorFraction', 'right'),
  field('TENANTS', 'tenantCount', 'right'),
];
const capColumns = (nameKey: string): readonly Column<Row>[] => [
  field(nameKey === 'tier' ? 'TIER' : 'DOMAIN', nameKey),
  field('RATE /S', 'rate', 'right'),
  field('BURST', 'burst', 'right'),
  field('FLOOR FRACTION', 'floorFraction', 'right'),
];
const tenantColumns: readonly Column<TenantRow>[] = [
  { header: 'ID', value: (t) => t.id },
  { header: 'TIER', value: (t) => t.tier },
  { header: 'RATE /S', value: (t) => formatValue(t.quota.rate), align: 'right' },
  { header: 'BURST', value: (t) => formatValue(t.quota.burst), align: 'right' },
  { header: 'QUOTA FROM', value: quotaSource },
];
const sliceColumns = (nowMs: number): readonly Column<Row>[] => [
  field('CELL', 'cellId'),
  field('RATE /S', 'rate', 'right'),
  field('BURST', 'burst', 'right'),
  field('FLOOR RATE /S', 'floorRate', 'right'),
  field('EPOCH', 'epoch', 'right'),
  age('LEASE EXPIRES', 'leaseExpiresAtMs', nowMs),
  field('ACKNOWLEDGED', 'acknowledged'),
];
const cellColumns = (nowMs: number): readonly Column<Row>[] => [
  field('ID', 'id'),
  field('FLOOR SLOT', 'slot', 'right'),
  age('LAST REPORT', 'lastReportAt', nowMs),
  age('LEASE EXPIRES', 'leaseExpiresAt', nowMs),
  field('LEASE LIVE', 'leaseLive'),
  field('REMOVING', 'removing'),
];

function num(v: string | undefined, name: string): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new CtlError(`--${name} must be a number, got '${v}'`, 2);
  return n;
}

type QuotaFlags = { rate?: string | undefined; burst?: string | undefined; 'floor-fraction'?: string | undefined };

/** The body of a tier or a cap from --rate, --burst and --floor-fraction. */
function quotaFlags(
  values: QuotaFlags,
  need: (v: string | undefined, what: string) => string,
): Record<string, unknown> {
  return {
    rate: num(need(values.rate, '--rate'), 'rate'),
    burst: num(need(values.burst, '--burst'), 'burst'),
    ...(values['floor-fraction'] === undefined
      ? {}
      : { floorFraction: num(values['floor-fraction'], 'floor-fraction') }),
  };
}

/** `tiers cap …` and `domains cap …`: a tier's cap (/v1/tiers/NAME/cap) or a domain's (/v1/domains/NAME/cap). */
async function capCommand(
  ctx: Ctx,
  kind: 'tier' | 'domain',
  [verb, name]: readonly string[],
  values: QuotaFlags,
  out: (doc: unknown, human: () => string) => void,
  need: (v: string | undefined, what: string) => string,
): Promise<number> {
  const path = `/v1/${kind}s/${encodeURIComponent(need(name, `${kind} name`))}/cap`;
  if (verb === 'get') {
    const r = (await call(ctx, 'GET', path)) as Row;
    out(r, () => renderTable([r], capColumns(kind)));
  } else if (verb === 'put') {
    const r = await call(ctx, 'PUT', path, quotaFlags(values, need));
    out(r, () => `the cap of ${kind} ${name ?? ''} saved`);
  } else if (verb === 'delete') {
    const r = await call(ctx, 'DELETE', path);
    out(r, () => `the cap of ${kind} ${name ?? ''} deleted`);
  } else throw new CtlError(`unknown ${kind}s cap command '${verb ?? ''}'\n\n${ctlUsage}`, 2);
  return 0;
}

export async function runCtlCommand(argv: readonly string[], env: NodeJS.ProcessEnv): Promise<number> {
  let parsed;
  try {
    parsed = parseCtlArgs(argv);
  } catch (err) {
    console.error(`cellquota ctl: ${err instanceof Error ? err.message : String(err)}\n\n${ctlUsage}`);
    return 2;
  }
  return runCtl(parsed, env);
}

function parseCtlArgs(argv: readonly string[]) {
  return parseArgs({
    args: [...argv],
    allowPositionals: true,
    strict: true,
    options: {
      admin: { type: 'string' },
      token: { type: 'string' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h', default: false },
      rate: { type: 'string' },
      burst: { type: 'string' },
      'floor-fraction': { type: 'string' },
      tier: { type: 'string' },
      limit: { type: 'string' },
      cursor: { type: 'string' },
      address: { type: 'string' },
      to: { type: 'string' },
      format: { type: 'string' },
      batch: { type: 'string' },
      parallel: { type: 'string' },
      'unknown-tenant': { type: 'string' },
    },
  });
}

async function runCtl(
  { values, positionals }: ReturnType<typeof parseCtlArgs>,
  env: NodeJS.ProcessEnv,
): Promise<number> {
  if (values.help || positionals.length === 0) {
    console.log(ctlUsage);
    return values.help ? 0 : 2;
  }
  // The declared settings from their flags and variables (no config file: CELLQUOTA_CONFIG names
  // the server's, whose settings are not ctl's).
  const { CELLQUOTA_CONFIG: _serverConfig, ...ctlEnv } = env;
  const given = [
    ...(values.admin === undefined ? [] : [`--admin=${values.admin}`]),
    ...(values.token === undefined ? [] : [`--token=${values.token}`]),
    ...(values.json === true ? ['--json'] : []),
  ];
  const settings = loadSettings('cellquota ctl', CTL_SETTING_SPECS, ctlFields, given, ctlEnv);
  const urls = settings.admin
    .split(',')
    .map((u) => u.trim())
    .filter((u) => u.length > 0)
    .map((u) => (u.startsWith('http') ? u : `http://${u}`));
  const ctx: Ctx = {
    urls,
    token: settings.token,
    json: settings.json,
    clientId: `ctl-${randomBytes(6).toString('hex')}`,
    seq: 0,
  };
  const out = (doc: unknown, human: () => string): void =>
    console.log(ctx.json ? JSON.stringify(doc, null, 2) : human());
  const [group, verb, arg] = positionals;
  const need = (v: string | undefined, what: string): string => {
    if (v === undefined || v.length === 0) throw new CtlError(`missing ${what}\n\n${ctlUsage}`, 2);
    return v;
  };
  try {
    switch (group) {
      case 'cluster': {
        const c = (await call(ctx, 'GET', '/v1/cluster')) as {
          leader: string | null;
          term: number;
          commitIndex: number;
          members: Row[];
        };
        out(
          c,
          () =>
            `leader ${c.leader ?? '(none)'}  term ${c.term}  commit ${c.commitIndex}\n\n` +
            renderTable(c.members, memberColumns),
        );
        return 0;
      }
      case 'tiers': {
        if (verb === 'cap') return await capCommand(ctx, 'tier', positionals.slice(2), values, out, need);
        if (verb === 'list' || verb === undefined) {
          const r = (await call(ctx, 'GET', '/v1/tiers')) as { tiers: Record<string, unknown>[] };
          out(r, () => renderTable(r.tiers, tierColumns));
        } else if (verb === 'get') {
          const r = await call(ctx, 'GET', `/v1/tiers/${encodeURIComponent(need(arg, 'tier name'))}`);
          out(r, () => renderTable([r as Row], tierColumns));
        } else if (verb === 'put') {
          const body = quotaFlags(values, need);
          const r = await call(ctx, 'PUT', `/v1/tiers/${encodeURIComponent(need(arg, 'tier name'))}`, body);
          out(r, () => `tier ${need(arg, 'tier name')} saved`);
        } else if (verb === 'delete') {
          const r = await call(ctx, 'DELETE', `/v1/tiers/${encodeURIComponent(need(arg, 'tier name'))}`);
          out(r, () => `tier ${need(arg, 'tier name')} deleted`);
        } else throw new CtlError(`unknown tiers command '${verb}'\n\n${ctlUsage}`, 2);
        return 0;
      }
      case 'domains': {
        if (verb === 'cap') return await capCommand(ctx, 'domain', positionals.slice(2), values, out, need);
        if (verb === 'list' || verb === undefined) {
          const r = (await call(ctx, 'GET', '/v1/domains')) as { domains: Row[] };
          out(r, () => (r.domains.length === 0 ? '(no domain caps)' : renderTable(r.domains, capColumns('domain'))));
        } else throw new CtlError(`unknown domains command '${verb}'\n\n${ctlUsage}`, 2);
        return 0;
      }
      case 'settings': {
        if (verb === 'get' || verb === undefined) {
          const r = (await call(ctx, 'GET', '/v1/settings')) as Record<string, unknown>;
          out(r, () => renderTable([r], [field('UNKNOWN TENANT', 'unknownTenant')]));
        } else if (verb === 'set') {
          const r = (await call(ctx, 'PUT', '/v1/settings', {
            unknownTenant: need(values['unknown-tenant'], '--unknown-tenant'),
          })) as Record<string, unknown>;
          out(r, () => `settings saved: unknownTenant ${String(r['unknownTenant'])}`);
        } else throw new CtlError(`unknown settings command '${verb}'\n\n${ctlUsage}`, 2);
        return 0;
      }
      case 'tenants': {
        if (verb === 'list' || verb === undefined) {
          const q = new URLSearchParams();
          if (values.limit !== undefined) q.set('limit', values.limit);
          if (values.cursor !== undefined) q.set('cursor', values.cursor);
          const r = (await call(ctx, 'GET', `/v1/tenants${q.size > 0 ? `?${q.toString()}` : ''}`)) as {
            tenants: TenantRow[];
            nextCursor: string | null;
          };
          out(
            r,
            () =>
              renderTable(r.tenants, tenantColumns) +
              (r.nextCursor === null ? '' : `\n(more: --cursor ${r.nextCursor})`),
          );
        } else if (verb === 'get') {
          const r = (await call(
            ctx,
            'GET',
            `/v1/tenants/${encodeURIComponent(need(arg, 'tenant id'))}`,
          )) as TenantRow & { slices: Row[] };
          out(
            r,
            () =>
              `tenant ${r.id}  tier ${r.tier}  quota ${r.quota.rate}/s burst ${r.quota.burst} ` +
              `(${quotaSource(r) === 'tier' ? "the tier's" : quotaSource(r)})\n\n` +
              (r.slices.length === 0 ? '(no cells yet)' : renderTable(r.slices, sliceColumns(Date.now()))),
          );
        } else if (verb === 'put') {
          const body = {
            tier: need(values.tier, '--tier'),
            ...(values.rate === undefined ? {} : { rate: num(values.rate, 'rate') }),
            ...(values.burst === undefined ? {} : { burst: num(values.burst, 'burst') }),
          };
          const r = await call(ctx, 'PUT', `/v1/tenants/${encodeURIComponent(need(arg, 'tenant id'))}`, body);
          out(r, () => `tenant ${need(arg, 'tenant id')} saved`);
        } else if (verb === 'delete') {
          const r = await call(ctx, 'DELETE', `/v1/tenants/${encodeURIComponent(need(arg, 'tenant id'))}`);
          out(r, () => `tenant ${need(arg, 'tenant id')} deleted`);
        } else if (verb === 'import') {
          const summary = await runImport(ctx, need(arg, 'file to import'), values);
          out(summary, () => describeImport(summary));
          return summary.failedCount > 0 ? 1 : 0;
        } else throw new CtlError(`unknown tenants command '${verb}'\n\n${ctlUsage}`, 2);
        return 0;
      }
      case 'cells': {
        if (verb === 'list' || verb === undefined) {
          const r = (await call(ctx, 'GET', '/v1/cells')) as { cells: Row[] };
          out(r, () =>
            r.cells.length === 0 ? '(no cells have reported yet)' : renderTable(r.cells, cellColumns(Date.now())),
          );
        } else if (verb === 'remove') {
          const id = need(arg, 'cell id');
          const r = (await call(ctx, 'DELETE', `/v1/cells/${encodeURIComponent(id)}`)) as {
            dropped: boolean;
            leaseExpiresAt: string | null;
            freedSlot: number | null;
          };
          out(r, () =>
            r.dropped
              ? `cell ${id} removed${r.freedSlot === null ? '' : `; floor slot ${r.freedSlot} freed`}`
              : `cell ${id} is being removed: it gets no more leases; it is dropped and its floor slot freed ` +
                'once its lease is over ' +
                `(${r.leaseExpiresAt === null ? 'now' : formatAge(r.leaseExpiresAt, Date.now())}, ` +
                'plus the skew margin)',
          );
        } else
          throw new CtlError(
            `unknown cells command '${verb}'

${ctlUsage}`,
            2,
          );
        return 0;
      }
      case 'members': {
        const id = need(arg, 'member id');
        if (verb === 'add') {
          const r = await call(ctx, 'PUT', `/v1/members/${encodeURIComponent(id)}`, {
            address: need(values.address, '--address'),
          });
          out(r, () => `${id} added and promoted to voter`);
        } else if (verb === 'remove') {
          const r = await call(ctx, 'DELETE', `/v1/members/${encodeURIComponent(id)}`);
          out(r, () => `${id} removed`);
        } else if (verb === 'replace') {
          const r = await call(ctx, 'POST', `/v1/members/${encodeURIComponent(id)}/replace`, {
            address: need(values.address, '--address'),
          });
          out(r, () => `${id} replaced`);
        } else throw new CtlError(`unknown members command '${verb ?? ''}'\n\n${ctlUsage}`, 2);
        return 0;
      }
      case 'top': {
        const rows = num(values.limit, 'limit');
        if (rows !== undefined && !(Number.isInteger(rows) && rows >= 1 && rows <= 20))
          throw new CtlError('--limit must be an integer in 1..20', 2);
        return await runTop({ urls, token: ctx.token, ...(rows === undefined ? {} : { rows }) });
      }
      case 'transfer-leadership': {
        const r = (await call(
          ctx,
          'POST',
          '/v1/cluster/transfer-leadership',
          values.to === undefined ? {} : { to: values.to },
        )) as { transferringTo: string };
        out(r, () => `leadership is moving to ${r.transferringTo}`);
        return 0;
      }
      default:
        throw new CtlError(`unknown ctl command '${group ?? ''}'\n\n${ctlUsage}`, 2);
    }
  } catch (err) {
    if (err instanceof CtlError) {
      console.error(`cellquota ctl: ${err.message}`);
      return err.exitCode;
    }
    throw err;
  }
}
