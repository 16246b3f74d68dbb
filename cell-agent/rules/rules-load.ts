// Reading rules from disk: one YAML file, or every `*.yaml` / `*.yml` file of a directory (not
// recursive; names starting with `.` skipped, so editors' temporary files and a Kubernetes
// ConfigMap's `..data` entries are ignored; symlinks followed; sorted by name, byte order). Each file
// is read with a size bound, decoded as UTF-8, parsed and validated (rules-schema.ts); then all are
// compiled together (rules-compile.ts). The only module of cell-agent/rules that does I/O.
//
// watchRules keeps a RuleSet current: it watches the directory (for a file, the directory holding
// it, since editors and ConfigMap updates replace files rather than write them in place), waits for
// events to settle (debounce), reloads, and hands over the new RuleSet only if it compiled and its
// sources changed. A reload that fails is reported with the RuleSet still in force, which stays in
// force — as envoyproxy/ratelimit keeps its previous config when a reload fails.
import { createHash } from 'node:crypto';
import { statSync, watch } from 'node:fs';
import type { FSWatcher } from 'node:fs';
import { open, readdir, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { compileRules } from './rules-compile.js';
import type { RuleSet } from './rules-compile.js';
import { RULES_ERROR_CODES, RulesError, isRulesError } from './rules-errors.js';
import { MAX_RULES_FILE_BYTES, parseRulesYaml } from './rules-schema.js';
import type { RulesFile } from './rules-schema.js';

/** Rules files read from one directory. */
export const MAX_RULES_DIRECTORY_FILES = 256;
/** Default quiet time after the last file-system event before a reload. */
export const DEFAULT_RULES_WATCH_DEBOUNCE_MS = 200;

export interface LoadRulesOptions {
  /** Merge files that name the same domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG). Default false. */
  readonly mergeDomains?: boolean | undefined;
  /** Bound on one file's size; default and ceiling MAX_RULES_FILE_BYTES. */
  readonly maxFileBytes?: number | undefined;
}

export interface WatchRulesOptions extends LoadRulesOptions {
  /** Default DEFAULT_RULES_WATCH_DEBOUNCE_MS. */
  readonly debounceMs?: number | undefined;
  /**
   * The RuleSet already in force (typically from loadRules at start-up). Without it the watcher
   * loads once at once and reports the result through onChange or onError.
   */
  readonly initial?: RuleSet | undefined;
}

/** Loads a rules file or a directory of them. Throws RulesError. */
export async function loadRules(path: string, options: LoadRulesOptions = {}): Promise<RuleSet> {
  const maxBytes = Math.min(options.maxFileBytes ?? MAX_RULES_FILE_BYTES, MAX_RULES_FILE_BYTES);
  const files = await listRulesFiles(path);
  const hash = createHash('sha256');
  const parsed: RulesFile[] = [];
  for (const file of files) {
    const bytes = await readBounded(file, maxBytes);
    hash.update(`${file}\0${bytes.length}\0`).update(bytes);
    parsed.push(parseRulesYaml(decodeUtf8(bytes, file), file));
  }
  return compileRules(parsed, { mergeDomains: options.mergeDomains, fingerprint: hash.digest('hex') });
}

/** The files loadRules would read for `path`, in order. Throws RulesError. */
export async function listRulesFiles(path: string): Promise<string[]> {
  const info = await stat(path).catch((error: unknown) => {
    throw readFailed(path, error);
  });
  if (info.isFile()) return [path];
  if (!info.isDirectory()) {
    throw new RulesError(RULES_ERROR_CODES.READ_FAILED, path, 'cannot read rules: not a file or a directory');
  }
  const names = await readdir(path).catch((error: unknown) => {
    throw readFailed(path, error);
  });
  const candidates = names
    .filter((name) => !name.startsWith('.') && (name.endsWith('.yaml') || name.endsWith('.yml')))
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const files: string[] = [];
  for (const name of candidates) {
    const file = join(path, name);
    const entry = await stat(file).catch((error: unknown) => {
      throw readFailed(file, error);
    });
    if (!entry.isFile()) continue;
    files.push(file);
    if (files.length > MAX_RULES_DIRECTORY_FILES) {
      throw new RulesError(
        RULES_ERROR_CODES.TOO_MANY_FILES,
        path,
        `more than ${MAX_RULES_DIRECTORY_FILES} rules files in the directory`,
      );
    }
  }
  if (files.length === 0) {
    throw new RulesError(RULES_ERROR_CODES.NO_FILES, path, 'no rules files (*.yaml, *.yml) in the directory');
  }
  return files;
}

/**
 * Watches `path` and calls onChange with each new RuleSet that loads; on a failed reload calls
 * onError with the error and the RuleSet still in force (null if none has loaded yet). Returns a
 * function that stops watching. Neither the watcher nor its timers keep the process alive. An
 * exception thrown by onChange is reported to onError like a failed reload.
 */
export function watchRules(
  path: string,
  onChange: (ruleSet: RuleSet) => void,
  onError: (error: RulesError, lastGood: RuleSet | null) => void,
  options: WatchRulesOptions = {},
): () => void {
  const debounceMs = options.debounceMs ?? DEFAULT_RULES_WATCH_DEBOUNCE_MS;
  let lastGood: RuleSet | null = options.initial ?? null;
  let closed = false;
  let timer: NodeJS.Timeout | null = null;
  let loading = false;
  let again = false;

  const report = (error: unknown): void => {
    if (closed) return;
    const rulesError = isRulesError(error)
      ? error
      : new RulesError(
          RULES_ERROR_CODES.INTERNAL,
          path,
          `unexpected error while reloading rules: ${String(error)}`,
          undefined,
          { cause: error },
        );
    onError(rulesError, lastGood);
  };

  const reload = async (): Promise<void> => {
    if (loading) {
      again = true;
      return;
    }
    loading = true;
    try {
      const ruleSet = await loadRules(path, options);
      if (closed || (lastGood !== null && ruleSet.fingerprint !== null && ruleSet.fingerprint === lastGood.fingerprint))
        return;
      onChange(ruleSet);
      // Only once the caller has taken it: if onChange threw, the same sources are offered again next time.
      lastGood = ruleSet;
    } catch (error) {
      report(error);
    } finally {
      loading = false;
      if (again && !closed) {
        again = false;
        schedule();
      }
    }
  };

  const schedule = (): void => {
    if (closed) return;
    if (timer !== null) clearTimeout(timer);
    timer = setTimeout(() => {
      timer = null;
      void reload();
    }, debounceMs);
    timer.unref();
  };

  // A file is watched through its directory; a directory is watched itself.
  let isDirectory: boolean;
  let watcher: FSWatcher;
  try {
    isDirectory = statSync(path).isDirectory();
    watcher = watch(isDirectory ? path : dirname(path), { persistent: false });
  } catch (error) {
    throw new RulesError(RULES_ERROR_CODES.WATCH_FAILED, path, `cannot watch rules: ${errorText(error)}`, undefined, {
      cause: error,
    });
  }
  const watchedDir = isDirectory ? path : dirname(path);
  const onlyName = isDirectory ? null : basename(path);
  watcher.on('change', (_event: string, filename: string | Buffer | null) => {
    const name = filename === null ? null : filename.toString();
    // For a file: its own name, a rename onto it, or a ConfigMap's `..data` swap; for a directory: anything.
    if (onlyName !== null && name !== null && name !== onlyName && !name.startsWith('..')) return;
    schedule();
  });
  watcher.on('error', (error: unknown) => {
    report(
      new RulesError(
        RULES_ERROR_CODES.WATCH_FAILED,
        watchedDir,
        `rules watcher failed: ${errorText(error)}`,
        undefined,
        { cause: error },
      ),
    );
  });

  if (lastGood === null) void reload();

  return () => {
    if (closed) return;
    closed = true;
    if (timer !== null) clearTimeout(timer);
    timer = null;
    watcher.close();
  };
}

// ---- Helpers ------------------------------------------------------------------------------------

const READ_CHUNK_BYTES = 64 * 1024;

/** Reads a whole file, failing as soon as it proves larger than `maxBytes` (also if it grows meanwhile). */
async function readBounded(file: string, maxBytes: number): Promise<Buffer> {
  const handle = await open(file, 'r').catch((error: unknown) => {
    throw readFailed(file, error);
  });
  try {
    const info = await handle.stat();
    if (info.size > maxBytes) throw tooLarge(file, maxBytes);
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      const chunk = Buffer.allocUnsafe(READ_CHUNK_BYTES);
      const { bytesRead } = await handle.read(chunk, 0, chunk.length, null);
      if (bytesRead === 0) break;
      total += bytesRead;
      if (total > maxBytes) throw tooLarge(file, maxBytes);
      chunks.push(chunk.subarray(0, bytesRead));
    }
    return Buffer.concat(chunks, total);
  } catch (error) {
    throw isRulesError(error) ? error : readFailed(file, error);
  } finally {
    await handle.close();
  }
}

function decodeUtf8(bytes: Buffer, file: string): string {
  try {
    // fatal: invalid UTF-8 is an error, not U+FFFD; a leading BOM is dropped.
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw new RulesError(RULES_ERROR_CODES.YAML_INVALID, file, 'error loading config file: not valid UTF-8');
  }
}

function tooLarge(file: string, maxBytes: number): RulesError {
  return new RulesError(RULES_ERROR_CODES.FILE_TOO_LARGE, file, `file is larger than ${maxBytes} bytes`);
}

function readFailed(file: string, error: unknown): RulesError {
  return new RulesError(RULES_ERROR_CODES.READ_FAILED, file, `cannot read rules: ${errorText(error)}`, undefined, {
    cause: error,
  });
}

function errorText(error: unknown): string {
  // Node's system errors already start with their code: "ENOENT: no such file or directory, open 'x'".
  return error instanceof Error ? error.message : String(error);
}
