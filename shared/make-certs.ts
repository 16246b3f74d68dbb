// Runs scripts/make-certs.sh (the CA and certificates of a local deployment, openssl) from the
// sources or from dist/: `cellquota dev --tls` and the chaos drills' TLS mode use it.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** scripts/make-certs.sh, found walking up from this module. */
export function makeCertsScript(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    const candidate = join(dir, 'scripts', 'make-certs.sh');
    if (existsSync(candidate)) return candidate;
    const parent = dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  throw new Error(`scripts/make-certs.sh not found above ${dirname(fileURLToPath(import.meta.url))}`);
}

export interface LocalPki {
  readonly dir: string;
  readonly ca: string;
  replica(id: string): { readonly cert: string; readonly key: string };
  cell(id: string): { readonly cert: string; readonly key: string };
}

/** Makes (or reuses) the certificates of `replicas` and `cells` in `dir`. Throws with openssl's message. */
export function makeLocalPki(dir: string, replicas: readonly string[], cells: readonly string[]): LocalPki {
  const missing = [...replicas.map((r) => `replica-${r}.pem`), ...cells.map((c) => `cell-${c}.pem`), 'ca.pem'].some(
    (f) => !existsSync(join(dir, f)),
  );
  if (missing)
    execFileSync(makeCertsScript(), [dir, '--replicas', replicas.join(','), '--cells', cells.join(',')], {
      stdio: 'pipe',
    });
  const pair = (name: string): { cert: string; key: string } => ({
    cert: join(dir, `${name}.pem`),
    key: join(dir, `${name}.key`),
  });
  return { dir, ca: join(dir, 'ca.pem'), replica: (id) => pair(`replica-${id}`), cell: (id) => pair(`cell-${id}`) };
}
