// Who is speaking on the lease service, and may they speak for the cell they name?
//
// Two ways for an agent to prove its cell, checked on every Report call:
//   - mutual TLS: the call's verified client certificate names the cell (shared/cert-identity.ts:
//     a `urn:cellquota:cell:<id>` URI SAN, or the subject CN of a certificate without cellquota URIs);
//   - a per-cell bearer token (`authorization: Bearer <token>` metadata), for deployments where TLS
//     is terminated in front of the coordinators or the agents have no certificates. The tokens are
//     in a file (`--lease-tokens`): YAML or JSON mapping each cell id to its token, or to
//     `sha256:<hex>` of it so the coordinators need not hold the token itself.
//
// Why a file and not the ledger, although the coordinators are the one source of quota: a token is a
// credential, not a quota. Put in the Raft log it would be copied into every replica's log and
// snapshots on disk, served by admin reads and kept in the history long after a rotation. A file is
// what a Kubernetes Secret, Vault agent or systemd credential mounts; rotating one is replacing the
// file (re-read when its modification time changes, at most every 2 s). One file per deployment,
// the same on every replica, is the single source of the credentials.
//
// A report for cell X is accepted only from X's identity; anything else gets UNAUTHENTICATED (no
// identity at all) or PERMISSION_DENIED (an identity, but not X's) and changes nothing. Without TLS
// and without a token file the service authenticates nobody (the behaviour before this check
// existed; the coordinator logs a warning at start).
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { certNames } from '../../shared/cert-identity.js';
import { isName } from '../ledger/ledger-commands.js';

/** Why a call was refused (the metric's `reason` label). */
export type LeaseRefusal = 'unauthenticated' | 'permission_denied';

export type LeaseAuthResult =
  | { readonly ok: true; readonly identity: string | null }
  | { readonly ok: false; readonly code: grpc.status; readonly reason: LeaseRefusal; readonly details: string };

/** The credentials a call carries, as grpc-js hands them to a server handler. */
export interface LeaseCallCredentials {
  getAuthContext?(): {
    readonly sslPeerCertificate?:
      { readonly subject?: { readonly CN?: string | string[] }; readonly subjectaltname?: string } | undefined;
  } | null;
  readonly metadata: grpc.Metadata;
}

export interface LeaseAuthenticator {
  /** Whether the caller may report for `cellId`. */
  check(call: LeaseCallCredentials, cellId: string): LeaseAuthResult;
  /** What it checks (for the start-up log). */
  describe(): string;
}

const MAX_TOKENS = 10_000;
const RELOAD_CHECK_MS = 2_000;
const tokenFileSchema = z
  .record(z.string().refine(isName, 'a cell id'), z.string().min(16, 'a token has at least 16 characters').max(4096))
  .refine((m) => Object.keys(m).length <= MAX_TOKENS, `at most ${MAX_TOKENS} cells`);

function sha256(text: string): Buffer {
  return createHash('sha256').update(text, 'utf8').digest();
}

/** Parses a token file's text: cell → sha256 of its token. Throws with a clear message. */
export function parseTokenFile(text: string, path: string): Map<string, Buffer> {
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (err) {
    throw new Error(`${path}: not YAML or JSON: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
  const r = tokenFileSchema.safeParse(doc ?? {});
  if (!r.success)
    throw new Error(
      `${path}: expected a mapping of cell id to token (or sha256:<hex>): ${r.error.issues
        .slice(0, 3)
        .map((i) => `${i.path.join('.') || '(file)'}: ${i.message}`)
        .join('; ')}`,
    );
  const out = new Map<string, Buffer>();
  for (const [cell, value] of Object.entries(r.data)) {
    const m = /^sha256:([0-9a-fA-F]{64})$/.exec(value);
    out.set(cell, m !== null ? Buffer.from(m[1] as string, 'hex') : sha256(value));
  }
  return out;
}

/** The per-cell tokens of a file, re-read when the file changes. */
export class TokenFile {
  private tokens: Map<string, Buffer>;
  private mtimeMs: number;
  private checkedAt = 0;

  constructor(
    private readonly path: string,
    private readonly onReload?: (cells: number, error: Error | null) => void,
  ) {
    this.mtimeMs = statSync(path).mtimeMs;
    this.tokens = parseTokenFile(readFileSync(path, 'utf8'), path);
  }

  get size(): number {
    this.refresh();
    return this.tokens.size;
  }

  /** The cell whose token this is, or null. */
  cellOf(token: string): string | null {
    this.refresh();
    const h = sha256(token);
    let found: string | null = null;
    for (const [cell, want] of this.tokens) if (timingSafeEqual(h, want)) found = cell;
    return found;
  }

  private refresh(): void {
    const now = Date.now();
    if (now - this.checkedAt < RELOAD_CHECK_MS) return;
    this.checkedAt = now;
    try {
      const m = statSync(this.path).mtimeMs;
      if (m === this.mtimeMs) return;
      this.tokens = parseTokenFile(readFileSync(this.path, 'utf8'), this.path);
      this.mtimeMs = m;
      this.onReload?.(this.tokens.size, null);
    } catch (err) {
      // Keep the last good tokens: a half-written or broken file must not lock every cell out.
      this.onReload?.(this.tokens.size, err instanceof Error ? err : new Error(String(err)));
    }
  }
}

function bearer(md: grpc.Metadata): string | null {
  const v = md.get('authorization')[0];
  if (typeof v !== 'string') return null;
  const m = /^Bearer\s+(\S{1,4096})$/i.exec(v.trim());
  return m === null ? null : (m[1] as string);
}

export interface LeaseAuthOptions {
  /** Client certificates are verified by the TLS layer (the lease port requires them). */
  readonly certificates: boolean;
  readonly tokens?: TokenFile;
}

/** Checks certificates and/or tokens; null when neither is configured (nobody is authenticated). */
export function createLeaseAuthenticator(opts: LeaseAuthOptions): LeaseAuthenticator | null {
  if (!opts.certificates && opts.tokens === undefined) return null;
  const tokens = opts.tokens;
  return {
    describe: () =>
      [opts.certificates ? 'client certificates' : null, tokens !== undefined ? 'per-cell tokens' : null]
        .filter((s) => s !== null)
        .join(' or '),
    check(call, cellId) {
      const names: string[] = [];
      const peerCert = opts.certificates ? call.getAuthContext?.()?.sslPeerCertificate : undefined;
      for (const n of certNames('cell', peerCert)) names.push(n);
      let how = names.length > 0 ? 'certificate' : '';
      const token = bearer(call.metadata);
      if (token !== null) {
        if (tokens === undefined)
          return {
            ok: false,
            code: grpc.status.UNAUTHENTICATED,
            reason: 'unauthenticated',
            details: 'a bearer token was sent but this coordinator takes no lease tokens (--lease-tokens)',
          };
        const cell = tokens.cellOf(token);
        if (cell === null)
          return {
            ok: false,
            code: grpc.status.UNAUTHENTICATED,
            reason: 'unauthenticated',
            details: 'unknown lease token',
          };
        names.push(cell);
        how = how === '' ? 'token' : `${how} and token`;
      }
      if (names.length === 0) {
        const want = [
          opts.certificates ? 'a client certificate naming the cell' : null,
          tokens !== undefined ? 'a per-cell bearer token' : null,
        ]
          .filter((s) => s !== null)
          .join(' or ');
        const why =
          opts.certificates && peerCert === undefined && tokens === undefined
            ? 'no verified client certificate'
            : opts.certificates
              ? 'the client certificate names no cell'
              : 'no bearer token';
        return {
          ok: false,
          code: grpc.status.UNAUTHENTICATED,
          reason: 'unauthenticated',
          details: `${why}: the lease service needs ${want}`,
        };
      }
      // Every identity the call carries must be the cell's (a token of c2 over a certificate of c1 is refused).
      if (names.some((n) => n !== cellId)) {
        return {
          ok: false,
          code: grpc.status.PERMISSION_DENIED,
          reason: 'permission_denied',
          details:
            `the ${how} names cell ${[...new Set(names)].join(', ')}, ` +
            `not ${cellId}: a cell reports only for itself`,
        };
      }
      return { ok: true, identity: cellId };
    },
  };
}
