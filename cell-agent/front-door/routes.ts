// The front door's routes file (`--routes`): which descriptors a forwarded request produces, in
// Envoy's rate-limit action vocabulary, so a route written for Envoy's `rate_limits` reads the same
// here. Pure except loadRoutes (one file read).
//
//   domain: edge                          # default edge
//   routes:                               # first match wins; no match: the request is not limited
//     - match: {prefix: /api/, hosts: [api.example.com, "*.example.org"], methods: [POST]}
//       rate_limits:                      # each entry is one descriptor
//         - actions:
//             - remote_address: {}                                    # remote_address=<client>
//             - request_headers: {header_name: x-api-key, descriptor_key: api_key, skip_if_absent: true}
//             - generic_key: {descriptor_value: api, descriptor_key: route}
//             - header_value_match:
//                 descriptor_value: writes
//                 headers: [{name: ":method", exact_match: POST}]
//     - match: {prefix: /}
//       rate_limits: [{actions: [{remote_address: {}}]}]
//
// As in Envoy, a descriptor whose action cannot produce its entry (a header absent without
// skip_if_absent, a header_value_match that does not match) is left out of the request; an entry
// skipped with skip_if_absent just drops that entry. Header names in matchers may be the pseudo
// headers `:method`, `:path` and `:authority` (the forwarded method, URI and host). Without a
// routes file every request is `[{remote_address: <client>}]` in domain `edge`.
import { readFile } from 'node:fs/promises';
import { LineCounter, parseDocument } from 'yaml';
import { z } from 'zod';
import type { RlsDescriptor, RlsRequest } from '../messages/rls-messages.js';
import { CellquotaError } from '../../shared/errors.js';

/** The domain when none is given, and of the default route. */
export const DEFAULT_FRONT_DOOR_DOMAIN = 'edge';
/** Bounds: a routes file is configuration, these only stop a mistake from becoming a crash. */
export const MAX_ROUTES_FILE_BYTES = 1024 * 1024;
export const MAX_ROUTES = 1024;
export const MAX_ROUTE_RATE_LIMITS = 64;
export const MAX_ACTIONS = 16;
export const MAX_HEADER_MATCHERS = 16;
const MAX_STRING_LENGTH = 1024;

// ---- Schema -------------------------------------------------------------------------------------

const str = z.string().min(1, 'must not be empty').max(MAX_STRING_LENGTH, `at most ${MAX_STRING_LENGTH} characters`);
const headerName = str
  .regex(
    /^(:method|:path|:authority|[!#$%&'*+.^_`|~0-9A-Za-z-]+)$/,
    'not an HTTP header name (or :method, :path, :authority)',
  )
  .transform((s) => s.toLowerCase());

const regex = z.strictObject({ regex: z.string().max(MAX_STRING_LENGTH) }).transform((v, ctx) => {
  try {
    return new RegExp(`^(?:${v.regex})$`);
  } catch (error) {
    ctx.addIssue({ code: 'custom', message: `bad regex: ${error instanceof Error ? error.message : String(error)}` });
    return z.NEVER;
  }
});

const headerMatcher = z
  .strictObject({
    name: headerName,
    exact_match: z.string().max(MAX_STRING_LENGTH).optional(),
    prefix_match: z.string().max(MAX_STRING_LENGTH).optional(),
    suffix_match: z.string().max(MAX_STRING_LENGTH).optional(),
    contains_match: z.string().max(MAX_STRING_LENGTH).optional(),
    present_match: z.boolean().optional(),
    safe_regex_match: regex.optional(),
    invert_match: z.boolean().default(false),
  })
  .superRefine((m, ctx) => {
    const kinds = [
      'exact_match',
      'prefix_match',
      'suffix_match',
      'contains_match',
      'present_match',
      'safe_regex_match',
    ].filter((k) => m[k as keyof typeof m] !== undefined);
    if (kinds.length > 1)
      ctx.addIssue({
        code: 'custom',
        message:
          'one of exact_match, prefix_match, suffix_match, contains_match, ' +
          `present_match, safe_regex_match; got ${kinds.join(', ')}`,
      });
  });
export type HeaderMatcher = z.output<typeof headerMatcher>;

const headerMatchers = z.array(headerMatcher).min(1, 'at least one header matcher').max(MAX_HEADER_MATCHERS);

const ACTION_NAMES = ['remote_address', 'generic_key', 'request_headers', 'header_value_match'] as const;
// One object with the four actions as optional keys (exactly one given) rather than a union, so an
// error inside an action is reported at its own field, not as "no branch matched".
const action = z
  .strictObject(
    {
      remote_address: z.strictObject({}).optional(),
      generic_key: z.strictObject({ descriptor_value: str, descriptor_key: str.default('generic_key') }).optional(),
      request_headers: z
        .strictObject({ header_name: headerName, descriptor_key: str, skip_if_absent: z.boolean().default(false) })
        .optional(),
      header_value_match: z
        .strictObject({
          descriptor_value: str,
          descriptor_key: str.default('header_match'),
          expect_match: z.boolean().default(true),
          headers: headerMatchers,
        })
        .optional(),
    },
    {
      error: (iss) =>
        iss.code === 'unrecognized_keys'
          ? `unknown action ${iss.keys.map((k) => `'${k}'`).join(', ')}: an action is one of ` +
            `${ACTION_NAMES.join(', ')} (Envoy's rate-limit actions)`
          : undefined,
    },
  )
  .superRefine((a, ctx) => {
    const given = ACTION_NAMES.filter((k) => a[k] !== undefined);
    if (given.length !== 1)
      ctx.addIssue({
        code: 'custom',
        message:
          `an action is exactly one of ${ACTION_NAMES.join(', ')}; got ` +
          `${given.length === 0 ? 'none' : given.join(', ')}`,
      });
  });
export type RouteAction = z.output<typeof action>;

const hostPattern = str
  .regex(/^(\*\.)?[A-Za-z0-9.-]+(:\d{1,5})?$/, 'a host name, optionally *.suffix')
  .transform((s) => s.toLowerCase());
const method = str.regex(/^[A-Za-z]+$/, 'an HTTP method').transform((s) => s.toUpperCase());

const routeMatch = z
  .strictObject({
    prefix: str.startsWith('/', 'a path starting with /').optional(),
    path: str.startsWith('/', 'a path starting with /').optional(),
    hosts: z.array(hostPattern).min(1).max(64).optional(),
    methods: z.array(method).min(1).max(16).optional(),
    headers: headerMatchers.optional(),
  })
  .refine((m) => m.prefix === undefined || m.path === undefined, 'prefix and path exclude each other');

const route = z.strictObject({
  match: routeMatch.default({}),
  rate_limits: z
    .array(z.strictObject({ actions: z.array(action).min(1, 'at least one action').max(MAX_ACTIONS) }))
    .max(MAX_ROUTE_RATE_LIMITS),
});

export const routesFileSchema = z.strictObject({
  domain: str.default(DEFAULT_FRONT_DOOR_DOMAIN),
  routes: z.array(route).min(1, 'at least one route').max(MAX_ROUTES),
});
export type RoutesFile = z.output<typeof routesFileSchema>;
export type RoutesFileInput = z.input<typeof routesFileSchema>;

/** A routes file that does not parse or validate; the message names the file, line and column. */
export class RoutesError extends CellquotaError {
  readonly code = 'ROUTES_INVALID';
}

/** Validates a routes object (from YAML, JSON or code). Throws RoutesError; `file` names the source. */
export function parseRoutes(input: unknown, file = 'routes'): Routes {
  const parsed = routesFileSchema.safeParse(input);
  if (!parsed.success) throw new RoutesError(formatIssues(file, parsed.error.issues, () => null));
  return compileRoutes(parsed.data);
}

/** Parses routes YAML (or JSON) text. Throws RoutesError with file:line:col of each problem. */
export function parseRoutesText(text: string, file: string): Routes {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, uniqueKeys: true, prettyErrors: false });
  if (doc.errors.length > 0) {
    const e = doc.errors[0];
    const pos = e?.linePos?.[0] ?? (e === undefined ? undefined : lineCounter.linePos(e.pos[0]));
    throw new RoutesError(
      `${file}${pos === undefined ? '' : `:${pos.line}:${pos.col}`}: invalid YAML: ` +
        `${e?.message.split('\n')[0] ?? 'unknown error'}`,
    );
  }
  const parsed = routesFileSchema.safeParse(doc.toJS({ maxAliasCount: 1000 }));
  if (!parsed.success) {
    throw new RoutesError(
      formatIssues(file, parsed.error.issues, (path) => {
        for (let n = path.length; n >= 0; n--) {
          const node = doc.getIn(path.slice(0, n), true) as { range?: [number, number, number] } | undefined;
          if (node?.range !== undefined) return lineCounter.linePos(node.range[0]);
        }
        return null;
      }),
    );
  }
  return compileRoutes(parsed.data);
}

/** Reads and parses a routes file. Throws RoutesError. */
export async function loadRoutes(file: string): Promise<Routes> {
  let text: string;
  try {
    const bytes = await readFile(file);
    if (bytes.length > MAX_ROUTES_FILE_BYTES)
      throw new RoutesError(`${file}: routes file is ${bytes.length} bytes (at most ${MAX_ROUTES_FILE_BYTES})`);
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch (error) {
    if (error instanceof RoutesError) throw error;
    throw new RoutesError(`${file}: cannot read routes: ${error instanceof Error ? error.message : String(error)}`);
  }
  return parseRoutesText(text, file);
}

function formatIssues(
  file: string,
  issues: readonly z.core.$ZodIssue[],
  posOf: (path: (string | number)[]) => { line: number; col: number } | null,
): string {
  const lines = issues.slice(0, 10).map((i) => {
    const path = i.path.filter((p): p is string | number => typeof p !== 'symbol');
    const pos = posOf(path);
    const where = path.length === 0 ? '(top level)' : path.join('.');
    return `${file}${pos === null ? '' : `:${pos.line}:${pos.col}`}: ${where}: ${i.message}`;
  });
  if (issues.length > 10) lines.push(`… and ${issues.length - 10} more`);
  return lines.join('\n');
}

// ---- Matching -----------------------------------------------------------------------------------

/** What the front door knows of a request it is asked about. */
export interface ForwardedRequest {
  /** The grouping key from shared/client-address.ts. */
  readonly client: string;
  /** Upper case, e.g. GET. */
  readonly method: string;
  /** Lower case, without a trailing dot; may carry :port. */
  readonly host: string;
  /** Path and query, starting with /. */
  readonly uri: string;
  /** Lower-case header name → value (several values joined with ", "). */
  header(name: string): string | undefined;
}

/** Compiled routes: one forwarded request → the RLS request to decide. */
export interface Routes {
  readonly domain: string;
  /** The RLS request for `req` (no descriptors: no route applies, the request is not limited). */
  requestFor(req: ForwardedRequest): RlsRequest;
}

/** The routes when no file is given: every request is `[{remote_address: <client>}]` in `edge`. */
export const DEFAULT_ROUTES: Routes = Object.freeze({
  domain: DEFAULT_FRONT_DOOR_DOMAIN,
  requestFor: (req: ForwardedRequest): RlsRequest => ({
    domain: DEFAULT_FRONT_DOOR_DOMAIN,
    hitsAddend: 0,
    descriptors: [{ entries: [{ key: 'remote_address', value: req.client }], hitsAddend: null, limit: null }],
  }),
});

export function compileRoutes(file: RoutesFile): Routes {
  const domain = file.domain;
  const routes = file.routes;
  return Object.freeze({
    domain,
    requestFor(req: ForwardedRequest): RlsRequest {
      const r = routes.find((candidate) => routeMatches(candidate.match, req));
      const descriptors: RlsDescriptor[] = [];
      if (r !== undefined) {
        for (const rl of r.rate_limits) {
          const d = descriptorFor(rl.actions, req);
          if (d !== null) descriptors.push(d);
        }
      }
      return { domain, hitsAddend: 0, descriptors };
    },
  });
}

type Match = RoutesFile['routes'][number]['match'];

function pathOf(uri: string): string {
  const q = uri.indexOf('?');
  return q < 0 ? uri : uri.slice(0, q);
}

function routeMatches(m: Match, req: ForwardedRequest): boolean {
  const path = pathOf(req.uri);
  if (m.prefix !== undefined && !path.startsWith(m.prefix)) return false;
  if (m.path !== undefined && path !== m.path) return false;
  if (m.methods !== undefined && !m.methods.includes(req.method)) return false;
  if (m.hosts !== undefined && !m.hosts.some((h) => hostMatches(h, req.host))) return false;
  if (m.headers !== undefined && !m.headers.every((h) => headerMatches(h, req))) return false;
  return true;
}

function hostMatches(pattern: string, host: string): boolean {
  const hostNoPort = pattern.includes(':') ? host : host.replace(/:\d+$/, '');
  if (pattern.startsWith('*.')) return hostNoPort.endsWith(pattern.slice(1)) && hostNoPort.length > pattern.length - 1;
  return hostNoPort === pattern;
}

function headerValue(name: string, req: ForwardedRequest): string | undefined {
  if (name === ':method') return req.method;
  if (name === ':path') return req.uri;
  if (name === ':authority') return req.host;
  return req.header(name);
}

function headerMatches(m: HeaderMatcher, req: ForwardedRequest): boolean {
  const v = headerValue(m.name, req);
  let ok: boolean;
  if (m.present_match !== undefined) ok = (v !== undefined) === m.present_match;
  else if (v === undefined) ok = false;
  else if (m.exact_match !== undefined) ok = v === m.exact_match;
  else if (m.prefix_match !== undefined) ok = v.startsWith(m.prefix_match);
  else if (m.suffix_match !== undefined) ok = v.endsWith(m.suffix_match);
  else if (m.contains_match !== undefined) ok = v.includes(m.contains_match);
  else if (m.safe_regex_match !== undefined) ok = m.safe_regex_match.test(v);
  else ok = true; // a name alone: the header is present (Envoy's default)
  return m.invert_match ? !ok : ok;
}

function descriptorFor(actions: readonly RouteAction[], req: ForwardedRequest): RlsDescriptor | null {
  const entries: { key: string; value: string }[] = [];
  for (const a of actions) {
    if (a.remote_address !== undefined) entries.push({ key: 'remote_address', value: req.client });
    else if (a.generic_key !== undefined)
      entries.push({ key: a.generic_key.descriptor_key, value: a.generic_key.descriptor_value });
    else if (a.request_headers !== undefined) {
      const v = headerValue(a.request_headers.header_name, req);
      if (v === undefined) {
        if (a.request_headers.skip_if_absent) continue;
        return null;
      }
      entries.push({ key: a.request_headers.descriptor_key, value: v });
    } else if (a.header_value_match !== undefined) {
      const hv = a.header_value_match;
      if (hv.headers.every((h) => headerMatches(h, req)) !== hv.expect_match) return null;
      entries.push({ key: hv.descriptor_key, value: hv.descriptor_value });
    }
  }
  return entries.length === 0 ? null : { entries, hitsAddend: null, limit: null };
}
