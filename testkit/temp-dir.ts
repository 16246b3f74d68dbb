// A private temporary directory for one test: files written into it, removed as a whole.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface TempDir {
  readonly path: string;
  file(name: string, text: string): string;
  remove(): void;
}

export function tempDir(prefix = 'cq-test-'): TempDir {
  const path = mkdtempSync(join(tmpdir(), prefix));
  return {
    path,
    file: (name, text) => {
      const p = join(path, name);
      writeFileSync(p, text);
      return p;
    },
    remove: () => rmSync(path, { recursive: true, force: true }),
  };
}
