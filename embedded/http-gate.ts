// What the fastify plugin and the express middleware share: from an HTTP request to a decision and
// the response headers. The client address is shared/client-address.ts (the same rules as the
// agent's forward-auth): the socket peer, or behind trusted proxies the rightmost untrusted
// X-Forwarded-For entry; IPv6 grouped by /64; IPv4-mapped IPv6 as IPv4.
//
// Headers (draft-ietf-httpapi-ratelimit-headers-10): `RateLimit-Policy` lists every policy the
// request met as `"name";q=<limit>;w=<window s>` and `RateLimit` their state as
// `"name";r=<remaining>;t=<reset s>` (Structured Field Lists of Strings with Integer parameters);
// `legacy` sends the older RateLimit-Limit / -Remaining / -Reset of the tightest policy instead.
// A refusal adds `Retry-After` (whole seconds, from when the refused hits would pass).
import type { IncomingHttpHeaders } from 'node:http';
import { z } from 'zod';
import { clientAddress, parseAddressList, parseTrustedProxies } from '../shared/client-address.js';
import type { AddressSet } from '../shared/client-address.js';
import type { Descriptor, LimitDecision, Limiter, PolicyStatus } from './limiter.js';
import { LimiterInputError, countersOf, createLimiter } from './limiter.js';
import type { LimiterLogger, LimiterOptions } from './options.js';
import { limiterOptionsOf, parseWith } from './options.js';

export type { Descriptor, LimitDecision, Limiter, PolicyStatus } from './limiter.js';

export type HeaderMode = 'draft-10' | 'legacy' | 'both' | 'none';

/** Options of the HTTP integrations (beside the limiter's own), for a request type `Req`. */
export interface HttpOptions<Req> {
  /** Addresses and CIDRs (IPv4, IPv6) of proxies allowed to say who the client is (X-Forwarded-For). */
  readonly trustedProxies?: readonly string[];
  /** IPv6 clients are grouped by this prefix (default 64; 128: every address on its own). */
  readonly ipv6Prefix?: number;
  /** Clients (addresses, CIDRs) never limited. */
  readonly allowList?: readonly string[];
  /** The descriptors of a request; default `[[{ key: 'remote_address', value: client }]]`. */
  readonly descriptors?: (request: Req, client: string) => readonly Descriptor[];
  /** Which rate-limit headers to send (default 'draft-10'). */
  readonly headers?: HeaderMode;
  /** Send them on admitted responses too (default true); a refusal always carries them (unless 'none'). */
  readonly headersOnAllowed?: boolean;
  /** Status of a refusal (default 429). */
  readonly statusCode?: number;
}

const NAME = /^[\x20-\x7e]{1,128}$/;

export const httpOptionsSchema = z.object({
  trustedProxies: z.array(z.string()).max(1024).default([]),
  ipv6Prefix: z.number().int().min(0).max(128).default(64),
  allowList: z.array(z.string()).max(1024).default([]),
  descriptors: z
    .custom<(request: unknown, client: string) => readonly Descriptor[]>(
      (v) => typeof v === 'function',
      'a function (request, client) => descriptors',
    )
    .optional(),
  headers: z.enum(['draft-10', 'legacy', 'both', 'none']).default('draft-10'),
  headersOnAllowed: z.boolean().default(true),
  statusCode: z.number().int().min(400).max(599).default(429),
});

/** What the gate answers a request. */
export interface GateResult {
  /** null: not checked (allow-listed), or refused before a decision (descriptors over the bounds). */
  readonly decision: LimitDecision | null;
  /** Refuse the request (its status, Retry-After and rate-limit headers are already set). */
  readonly refused: boolean;
}

/** Sets one response header on `target` (fastify: reply.header; express: res.setHeader). */
export type HeaderSetter<T> = (target: T, name: string, value: string) => void;

export const FAIL_OPEN_HEADER = 'x-ratelimit-fail-open';

/** Logs at most one line a second for a kind of failure, with the number suppressed since. */
export class RateLimitedLog {
  private last = 0;
  private suppressed = 0;
  constructor(private readonly logger: LimiterLogger) {}

  error(fields: Record<string, unknown>, msg: string): void {
    const now = Date.now();
    if (now - this.last < 1000) {
      this.suppressed++;
      return;
    }
    this.logger.error({ ...fields, suppressed: this.suppressed }, msg);
    this.last = now;
    this.suppressed = 0;
  }
}

const NOT_CHECKED: GateResult = Object.freeze({ decision: null, refused: false });
const REFUSED_UNCHECKED: GateResult = Object.freeze({ decision: null, refused: true });

/**
 * What the gate knows of a connection's peer. An untrusted peer is the client of every request on
 * its connection (the headers are not read), so the key, the allow-list answer and the default
 * descriptors are worked out once per connection; a trusted one speaks for many clients, so its
 * requests are resolved one by one.
 */
interface PeerEntry {
  readonly peer: string | undefined;
  /** null: the peer is a trusted proxy (resolve each request from its headers). */
  readonly client: string | null;
  readonly allowed: boolean;
  /** The default descriptors of `client` (null with a `descriptors` option). */
  readonly descriptors: readonly Descriptor[] | null;
}

const TRUSTED_PEER = (peer: string | undefined): PeerEntry => ({
  peer,
  client: null,
  allowed: false,
  descriptors: null,
});

export class HttpGate<Req> {
  readonly statusCode: number;
  private readonly trusted: AddressSet;
  private readonly allow: AddressSet | null;
  private readonly ipv6Prefix: number;
  private readonly descriptors: ((request: Req, client: string) => readonly Descriptor[]) | null;
  private readonly onAllowed: boolean;
  private readonly errors: RateLimitedLog;
  private readonly format: RateLimitFormat;
  /** By connection (the socket object): what its peer resolves to. */
  private readonly peers = new WeakMap<object, PeerEntry>();

  constructor(
    readonly limiter: Limiter,
    options: HttpOptions<Req>,
    logger: LimiterLogger,
    what: string,
    /** The request's headers, read only when the peer is a trusted proxy. */
    private readonly headersOf: (request: Req) => IncomingHttpHeaders,
  ) {
    const o = parseWith(httpOptionsSchema, pick(options), what);
    this.trusted = parseTrustedProxies(o.trustedProxies);
    this.allow = o.allowList.length === 0 ? null : parseAddressList(o.allowList, 'allow-list');
    this.ipv6Prefix = o.ipv6Prefix;
    this.descriptors = (o.descriptors as ((request: Req, client: string) => readonly Descriptor[]) | undefined) ?? null;
    this.format = new RateLimitFormat(o.headers);
    this.onAllowed = o.headersOnAllowed && o.headers !== 'none';
    this.statusCode = o.statusCode;
    this.errors = new RateLimitedLog(logger);
  }

  /**
   * Decides `request`, which arrived on `socket`, and sets the rate-limit headers (Retry-After on a
   * refusal) on `target` through `set`.
   */
  decide<T>(request: Req, socket: object, target: T, set: HeaderSetter<T>): GateResult {
    const peer = (socket as { remoteAddress?: string }).remoteAddress;
    let entry = this.peers.get(socket);
    if (entry === undefined || entry.peer !== peer) {
      entry = this.peerEntry(peer);
      // A closed socket has no address any more: its (last) requests are resolved without caching.
      if (peer !== undefined) this.peers.set(socket, entry);
    }
    let client: string;
    let descriptors: readonly Descriptor[] | null = entry.descriptors;
    if (entry.client !== null) {
      if (entry.allowed) return NOT_CHECKED;
      client = entry.client;
    } else {
      const headers = this.headersOf(request);
      const forwardedFor = headers['x-forwarded-for'];
      const realIp = headers['x-real-ip'];
      client = clientAddress({ peer, forwardedFor, realIp, trusted: this.trusted, ipv6Prefix: this.ipv6Prefix });
      if (this.allow !== null) {
        const exact =
          this.ipv6Prefix === 128 || !client.includes(':')
            ? client
            : clientAddress({ peer, forwardedFor, realIp, trusted: this.trusted, ipv6Prefix: 128 });
        if (this.allow.has(exact)) return NOT_CHECKED;
      }
    }
    let decision: LimitDecision;
    try {
      descriptors ??= this.descriptors === null ? defaultDescriptors(client) : this.descriptors(request, client);
      decision = this.limiter.check({ descriptors });
    } catch (error) {
      if (error instanceof LimiterInputError) {
        // Descriptors over the request bounds come from the request itself (a header copied into a
        // value): refusing them keeps a client from buying its way out of the limit with a long header.
        const c = countersOf(this.limiter);
        if (c !== undefined) c.invalidOutside++;
        this.errors.error(
          { limiter: this.limiter.name, error: error.message },
          'cellquota: descriptors over the request bounds; request refused',
        );
        set(target, 'retry-after', '1');
        return REFUSED_UNCHECKED;
      }
      const c = countersOf(this.limiter);
      if (c !== undefined) c.failOpenOutside++;
      this.errors.error(
        { limiter: this.limiter.name, err: error },
        'cellquota: building the descriptors failed; request let through (fail-open)',
      );
      set(target, FAIL_OPEN_HEADER, 'true');
      return NOT_CHECKED;
    }
    if (decision.failOpen) {
      set(target, FAIL_OPEN_HEADER, 'true');
      return { decision, refused: false };
    }
    const refused = !decision.allowed;
    if (refused || this.onAllowed) this.format.write(decision.policies, target, set);
    if (refused) set(target, 'retry-after', String(decision.retryAfterSeconds));
    return { decision, refused };
  }

  private peerEntry(peer: string | undefined): PeerEntry {
    if (peer !== undefined && this.trusted.entries.length > 0 && this.trusted.has(peer)) return TRUSTED_PEER(peer);
    // Not trusted (or no address): the headers do not count, the peer is the client.
    const client = clientAddress({ peer, trusted: this.trusted, ipv6Prefix: this.ipv6Prefix });
    let allowed = false;
    if (this.allow !== null) {
      const exact =
        this.ipv6Prefix === 128 || !client.includes(':')
          ? client
          : clientAddress({ peer, trusted: this.trusted, ipv6Prefix: 128 });
      allowed = this.allow.has(exact);
    }
    return {
      peer,
      client,
      allowed,
      descriptors: this.descriptors === null ? defaultDescriptors(client) : null,
    };
  }
}

/** The default: one descriptor, the client address (built per connection, or per request of a trusted proxy). */
export function defaultDescriptors(client: string): readonly Descriptor[] {
  return [[{ key: 'remote_address', value: client }]];
}

function pick<Req>(o: HttpOptions<Req>): Record<string, unknown> {
  const { trustedProxies, ipv6Prefix, allowList, descriptors, headers, headersOnAllowed, statusCode } = o;
  return { trustedProxies, ipv6Prefix, allowList, descriptors, headers, headersOnAllowed, statusCode };
}

// ---- headers ------------------------------------------------------------------------------------
// Serialized here rather than through a structured-fields library: the values are fixed templates
// (a String and Integer parameters), and the policy names are cleaned to what sf-string allows. The
// tests parse every header with the structured-headers package.

/** A policy name as an sf-string: printable ASCII, `"` and `\` escaped; anything else becomes `_`. */
export function sfString(name: string): string {
  const clean = NAME.test(name) ? name : name.slice(0, 128).replace(/[^\x20-\x7e]/g, '_') || 'policy';
  return `"${clean.replace(/[\\"]/g, '\\$&')}"`;
}

/** The headers for the policies a request met, in `mode`. */
export function rateLimitHeaders(policies: readonly PolicyStatus[], mode: HeaderMode): [string, string][] {
  const out: [string, string][] = [];
  new RateLimitFormat(mode).write(policies, out, pushHeader);
  return out;
}

function pushHeader(out: [string, string][], name: string, value: string): void {
  out.push([name, value]);
}

/**
 * A policy's sf-string and its `RateLimit-Policy` member, kept while its limit and window stay; and
 * its last `RateLimit` member with the `r` and `t` it was written for. A client well under its limit
 * meets a full bucket request after request (the same `r`, the same `t`): then the member is the
 * string written for the previous request, not formatted again (two numbers printed and joined,
 * which setHeader then flattens to check it).
 */
class PolicyText {
  readonly policy: string;
  private remaining = -1;
  private reset = -1;
  private member = '';

  constructor(
    readonly limit: number,
    readonly windowSeconds: number,
    readonly id: string,
  ) {
    this.policy = `${id};q=${limit};w=${windowSeconds}`;
  }

  /** The `RateLimit` member for `p`'s remaining hits and reset. */
  state(p: PolicyStatus): string {
    if (p.remaining !== this.remaining || p.resetSeconds !== this.reset) {
      this.remaining = p.remaining;
      this.reset = p.resetSeconds;
      this.member = `${this.id};r=${p.remaining};t=${p.resetSeconds}`;
    }
    return this.member;
  }
}

/** Policy names remembered (rule names and tiers: few); past this the memory starts over. */
const MAX_POLICY_TEXTS = 1024;

/**
 * Writes the rate-limit headers of a decision. A policy's name and its RateLimit-Policy member
 * change only with the rules or a new grant, so they are formatted once and kept; per request
 * only `r` and `t` are written into the RateLimit value, and only when they changed.
 */
class RateLimitFormat {
  private readonly texts = new Map<string, PolicyText>();
  private readonly draft: boolean;
  private readonly legacy: boolean;

  constructor(mode: HeaderMode) {
    this.draft = mode === 'draft-10' || mode === 'both';
    this.legacy = mode === 'legacy' || mode === 'both';
  }

  write<T>(policies: readonly PolicyStatus[], target: T, set: HeaderSetter<T>): void {
    const n = policies.length;
    if (n === 0) return;
    if (this.draft) {
      const first = policies[0] as PolicyStatus;
      if (n === 1) {
        const t = this.text(first.name, first);
        set(target, 'ratelimit-policy', t.policy);
        set(target, 'ratelimit', t.state(first));
      } else {
        let policy = '';
        let state = '';
        const seen = new Set<string>();
        for (const p of policies) {
          let name = p.name;
          for (let k = 2; seen.has(name); k++) name = `${p.name}#${k}`;
          seen.add(name);
          const t = this.text(name, p);
          policy += policy === '' ? t.policy : `, ${t.policy}`;
          state += state === '' ? t.state(p) : `, ${t.state(p)}`;
        }
        set(target, 'ratelimit-policy', policy);
        set(target, 'ratelimit', state);
      }
    }
    if (this.legacy) {
      // envoyproxy/ratelimit's choice: the first refused policy, else the one with the fewest remaining.
      let chosen = policies[0] as PolicyStatus;
      for (const p of policies) {
        if (p.overLimit) {
          chosen = p;
          break;
        }
        if (p.remaining < chosen.remaining) chosen = p;
      }
      set(target, 'ratelimit-limit', String(chosen.limit));
      set(target, 'ratelimit-remaining', String(chosen.remaining));
      set(target, 'ratelimit-reset', String(chosen.resetSeconds));
    }
  }

  /** The sf-string of `name` and its policy member for `p`'s limit and window. */
  private text(name: string, p: PolicyStatus): PolicyText {
    const known = this.texts.get(name);
    if (known !== undefined && known.limit === p.limit && known.windowSeconds === p.windowSeconds) return known;
    const t = new PolicyText(p.limit, p.windowSeconds, known?.id ?? sfString(name));
    if (known === undefined && this.texts.size >= MAX_POLICY_TEXTS) this.texts.clear();
    this.texts.set(name, t);
    return t;
  }
}

/** What both middlewares take: the limiter's options (unless `limiter` is given), the HTTP options, the refusal. */
export type GateOptions<Req> = (LimiterOptions | { readonly limiter: Limiter; readonly logger?: LimiterLogger }) &
  HttpOptions<Req> & {
    /** The body of a refusal: a value (sent as JSON unless a string) or a function of the request and decision. */
    readonly body?: unknown;
  };

/** The limiter given as `limiter`, or one started from the options (`own`: the middleware closes it). */
export async function limiterOf<Req>(
  options: GateOptions<Req>,
  logger: LimiterLogger,
): Promise<{ readonly limiter: Limiter; readonly own: boolean }> {
  if ('limiter' in options) return { limiter: options.limiter, own: false };
  return { limiter: await createLimiter(limiterOptionsOf(options, logger)), own: true };
}

/** What a refusal answers: `body` (a value, or a function of the request and the decision), else the default. */
export function refusalPayload<Req>(body: unknown, request: Req, decision: LimitDecision | null): unknown {
  if (typeof body === 'function') return (body as (q: Req, d: LimitDecision | null) => unknown)(request, decision);
  return body ?? defaultRefusalBody(decision);
}

/** The default refusal body (JSON). */
export function defaultRefusalBody(decision: LimitDecision | null): {
  statusCode: number;
  error: string;
  message: string;
  retryAfterSeconds: number;
} {
  const after = decision?.retryAfterSeconds ?? 1;
  return {
    statusCode: 429,
    error: 'Too Many Requests',
    message: `rate limit exceeded, retry in ${after} s`,
    retryAfterSeconds: after,
  };
}
