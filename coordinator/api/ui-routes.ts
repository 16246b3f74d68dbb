// The live view (GET /ui/) on every coordinator's admin port: a page and its assets, all served by
// the coordinator itself (clusters are often offline: no CDN), and the document it polls
// (GET /ui/api/state, see live-state.ts). The chart library is uPlot, bundled from node_modules.
//
// Auth: when the admin API has a bearer token, every /ui route but the login page and the stylesheet
// needs it — as `Authorization: Bearer …`, or as the session cookie the login form sets (a browser
// cannot add a header to a navigation). The cookie holds an HMAC of the token, never the token; it is
// HttpOnly, SameSite=Strict and scoped to /ui, and any replica with the same token accepts it.
import { createHmac, timingSafeEqual } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { AdminBackend } from './admin-server.js';
import type { LiveTraffic } from './live-traffic.js';
import { buildLiveState, liveQuerySchema, type LiveState } from './live-state.js';

export const UI_SESSION_COOKIE = 'cellquota_ui';
/** Header a replica sets when it forwards the state request to the leader (never forwarded twice). */
export const UI_FORWARDED_HEADER = 'x-cellquota-forwarded';
/** How long a follower waits for the leader's document before building its own without rates. */
export const UI_FORWARD_TIMEOUT_MS = 700;

export interface UiRoutesOptions {
  readonly backend: AdminBackend;
  readonly token?: string;
  readonly adminUrlOf: (id: string) => string | null;
  /** The traffic the leader reconstructs from reports (absent: the page shows no rates). */
  readonly traffic?: LiveTraffic;
  readonly now: () => number;
}

interface Asset {
  readonly body: Buffer;
  readonly type: string;
  readonly public: boolean;
}

/** Finds coordinator/api/ui walking up from this module (works from the sources and from dist/). */
export function findUiDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    for (const candidate of [join(dir, 'ui'), join(dir, 'coordinator', 'api', 'ui')]) {
      if (existsSync(join(candidate, 'index.html'))) return candidate;
    }
    const parent = dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  throw new Error(`coordinator/api/ui/index.html not found above ${dirname(fileURLToPath(import.meta.url))}`);
}

function loadAssets(): Map<string, Asset> {
  const ui = findUiDir();
  const require = createRequire(import.meta.url);
  const uplot = dirname(require.resolve('uplot/dist/uPlot.iife.min.js'));
  const a = new Map<string, Asset>();
  a.set('index.html', { body: readFileSync(join(ui, 'index.html')), type: 'text/html; charset=utf-8', public: false });
  a.set('login.html', { body: readFileSync(join(ui, 'login.html')), type: 'text/html; charset=utf-8', public: true });
  a.set('app.js', { body: readFileSync(join(ui, 'app.js')), type: 'text/javascript; charset=utf-8', public: false });
  a.set('app.css', { body: readFileSync(join(ui, 'app.css')), type: 'text/css; charset=utf-8', public: true });
  a.set('uPlot.iife.min.js', {
    body: readFileSync(join(uplot, 'uPlot.iife.min.js')),
    type: 'text/javascript; charset=utf-8',
    public: false,
  });
  a.set('uPlot.min.css', {
    body: readFileSync(join(uplot, 'uPlot.min.css')),
    type: 'text/css; charset=utf-8',
    public: false,
  });
  return a;
}

const SECURITY_HEADERS = {
  'content-security-policy':
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cache-control': 'no-cache',
} as const;

export function sessionValue(token: string): string {
  return createHmac('sha256', token).update('cellquota-ui-session-v1').digest('base64url');
}

function sameSecret(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

function cookieOf(req: FastifyRequest, name: string): string | undefined {
  const h = req.headers.cookie;
  if (h === undefined) return undefined;
  for (const part of h.split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

export function registerUiRoutes(app: FastifyInstance, opts: UiRoutesOptions): void {
  const assets = loadAssets();
  const session = opts.token === undefined ? null : sessionValue(opts.token);

  const allowed = (req: FastifyRequest): boolean => {
    if (opts.token === undefined || session === null) return true;
    const h = req.headers.authorization;
    if (h !== undefined && sameSecret(h, `Bearer ${opts.token}`)) return true;
    const c = cookieOf(req, UI_SESSION_COOKIE);
    return c !== undefined && sameSecret(c, session);
  };

  const send = (reply: FastifyReply, name: string, status = 200): FastifyReply => {
    const a = assets.get(name);
    if (a === undefined) return reply.code(404).send({ error: 'NOT_FOUND', message: `no asset ${name}` });
    return reply.code(status).headers(SECURITY_HEADERS).type(a.type).send(a.body);
  };

  app.get('/ui', (_req, reply) => reply.redirect('/ui/', 308));
  app.get('/ui/', (req, reply) => (allowed(req) ? send(reply, 'index.html') : send(reply, 'login.html', 401)));
  app.get('/ui/assets/:name', (req, reply) => {
    const name = (req.params as { name: string }).name;
    const a = assets.get(name);
    if (a === undefined || name.endsWith('.html'))
      return reply.code(404).send({ error: 'NOT_FOUND', message: `no asset ${name.slice(0, 100)}` });
    if (!a.public && !allowed(req))
      return reply.code(401).send({ error: 'UNAUTHORIZED', message: 'log in at /ui/ or send Authorization: Bearer …' });
    return send(reply, name);
  });

  app.register((scope, _o, done) => {
    scope.addContentTypeParser(
      'application/x-www-form-urlencoded',
      { parseAs: 'string', bodyLimit: 4096 },
      (_req, body, next) => {
        next(null, new URLSearchParams(typeof body === 'string' ? body : body.toString('utf8')));
      },
    );
    scope.post('/ui/login', (req, reply) => {
      const form = req.body instanceof URLSearchParams ? req.body : new URLSearchParams();
      const token = form.get('token') ?? '';
      if (opts.token === undefined || session === null) return reply.redirect('/ui/', 303);
      if (!sameSecret(`Bearer ${token}`, `Bearer ${opts.token}`)) return send(reply, 'login.html', 403);
      return reply
        .header('set-cookie', `${UI_SESSION_COOKIE}=${session}; Path=/ui; HttpOnly; SameSite=Strict`)
        .redirect('/ui/', 303);
    });
    scope.post('/ui/logout', (_req, reply) =>
      reply
        .header('set-cookie', `${UI_SESSION_COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0`)
        .redirect('/ui/', 303),
    );
    done();
  });

  app.get('/ui/api/state', async (req, reply) => {
    if (!allowed(req))
      return reply.code(401).send({ error: 'UNAUTHORIZED', message: 'log in at /ui/ or send Authorization: Bearer …' });
    const parsed = liveQuerySchema.safeParse(req.query);
    if (!parsed.success)
      return reply.code(400).send({
        error: 'INVALID',
        message: 'invalid query',
        details: parsed.error.issues.map((i) => ({ path: i.path.join('.'), message: i.message })),
      });
    const backend = opts.backend;
    reply.headers({ 'cache-control': 'no-store', 'x-content-type-options': 'nosniff' });
    const leader = backend.leaderId();
    const self = backend.cluster().id;
    let note: string | undefined;
    // The rates live on the leader (it alone receives reports): a follower asks it.
    if (!backend.isLeader() && leader !== null && leader !== self && req.headers[UI_FORWARDED_HEADER] === undefined) {
      const base = opts.adminUrlOf(leader);
      if (base !== null) {
        const qs = new URLSearchParams(
          Object.entries(parsed.data).flatMap(([k, v]) =>
            v === undefined ? [] : [[k, String(v)] as [string, string]],
          ),
        ).toString();
        try {
          const res = await fetch(`${base}/ui/api/state?${qs}`, {
            headers: {
              [UI_FORWARDED_HEADER]: self,
              ...(opts.token === undefined ? {} : { authorization: `Bearer ${opts.token}` }),
            },
            signal: AbortSignal.timeout(UI_FORWARD_TIMEOUT_MS),
          });
          if (res.ok) {
            const doc = (await res.json()) as LiveState;
            return { ...doc, servedBy: self };
          }
          note = `the leader ${leader} answered ${res.status}: no rates`;
        } catch (err) {
          note = `the leader ${leader} did not answer (${err instanceof Error ? err.message : String(err)}): no rates`;
        }
      } else {
        note = `the leader ${leader} has no known admin URL: no rates`;
      }
    } else if (!backend.isLeader()) {
      note =
        leader === null
          ? 'no leader right now: no rates; the ledger as this replica last applied it'
          : 'no rates (forwarded request)';
    }
    const doc = await backend.read(
      (ledger) =>
        buildLiveState(
          {
            cluster: backend.cluster(),
            adminUrlOf: opts.adminUrlOf,
            ledger,
            traffic: backend.isLeader() ? (opts.traffic ?? null) : null,
            nowMs: opts.now(),
            ...(note === undefined ? {} : { note }),
          },
          parsed.data,
        ),
      true,
    );
    return { ...doc, servedBy: self };
  });
}
