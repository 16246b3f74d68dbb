// `cellquota ctl tenants import FILE`: reads tenants from a JSON-lines or CSV file and sends them to
// the admin API's POST /v1/tenants in batches (one Raft entry each), a few batches in flight at once.
// Lines that cannot be read (not JSON, a bad CSV row, too long, an id seen earlier in the file) are
// reported here with their line number and never sent; the coordinator checks every tenant it gets
// on its own (the schema is the ledger's, one source) and reports the ones it refused, which change
// nothing. A tenant already stored exactly so comes back "unchanged": re-running an import is safe
// and changes nothing.
import { createReadStream, statSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { parse as parseCsv, type CsvError } from 'csv-parse';
import { CellquotaError } from '../shared/errors.js';

export type ImportFormat = 'jsonl' | 'csv';

/** Tenants per request (one Raft entry) unless --batch says otherwise; at most the API's MAX_TENANTS_PER_BATCH. */
export const DEFAULT_IMPORT_BATCH = 2_000;
/** Requests in flight at once unless --parallel says otherwise. */
export const DEFAULT_IMPORT_PARALLEL = 4;
/** Longest line (JSON lines) or record (CSV) read, in bytes: a tenant is far shorter. */
export const MAX_IMPORT_LINE_BYTES = 4_096;
/** Failures kept with their details (the rest are counted). */
export const MAX_REPORTED_FAILURES = 10_000;
/** The CSV columns; the header row names them, `id` and `tier` required. */
const CSV_COLUMNS = ['id', 'tier', 'rate', 'burst'] as const;

/** What POST /v1/tenants answers. */
export interface BatchAnswer {
  readonly created: number;
  readonly updated: number;
  readonly unchanged: number;
  readonly failed: readonly {
    readonly index: number;
    readonly id: string | null;
    readonly error: string;
    readonly message: string;
  }[];
}

export interface ImportFailure {
  /** 1-based line of the file (CSV: the line the record starts on). */
  readonly line: number;
  readonly id: string | null;
  readonly error: string;
  readonly message: string;
}

export interface ImportProgress {
  /** Records read from the file so far (blank lines not counted). */
  readonly read: number;
  /** Records the coordinator has answered for, plus those refused while reading. */
  readonly done: number;
  readonly failed: number;
  readonly bytesRead: number;
  readonly totalBytes: number;
  readonly elapsedMs: number;
}

export interface ImportSummary {
  readonly file: string;
  readonly format: ImportFormat;
  readonly records: number;
  readonly created: number;
  readonly updated: number;
  readonly unchanged: number;
  readonly failedCount: number;
  /** The first MAX_REPORTED_FAILURES failures, in line order. */
  readonly failed: readonly ImportFailure[];
  readonly batches: number;
  readonly seconds: number;
  readonly perSecond: number;
}

export interface ImportOptions {
  readonly file: string;
  readonly format: ImportFormat;
  readonly batch: number;
  readonly parallel: number;
  /** Sends one batch on lane `lane` (0..parallel-1; a lane has one request in flight at a time). */
  readonly send: (lane: number, tenants: readonly unknown[]) => Promise<BatchAnswer>;
  readonly onProgress?: (p: ImportProgress) => void;
  readonly progressEveryMs?: number;
}

/** The format a file name implies: .csv is CSV, .jsonl/.ndjson/.json is JSON lines. */
export function formatOfFile(file: string): ImportFormat | undefined {
  const lower = file.toLowerCase();
  if (lower.endsWith('.csv')) return 'csv';
  if (lower.endsWith('.jsonl') || lower.endsWith('.ndjson') || lower.endsWith('.json')) return 'jsonl';
  return undefined;
}

/** A file-level problem (unreadable file, bad CSV header): nothing more is sent. */
export class ImportFileError extends CellquotaError {
  readonly code = 'IMPORT_FILE_INVALID';
}

type Record_ =
  | { readonly line: number; readonly tenant: Record<string, unknown>; readonly id: string | null }
  | { readonly line: number; readonly failure: ImportFailure };

export async function importTenants(opts: ImportOptions): Promise<ImportSummary> {
  let totalBytes: number;
  try {
    totalBytes = statSync(opts.file).size;
  } catch (err) {
    throw new ImportFileError(`cannot read ${opts.file}: ${err instanceof Error ? err.message : String(err)}`);
  }
  const started = performance.now();
  const stream = createReadStream(opts.file);
  const streamFailure: { error: Error | null } = { error: null };
  stream.on('error', (err) => (streamFailure.error = err));
  const records = opts.format === 'csv' ? readCsv(stream) : readJsonLines(stream);

  let read = 0;
  let done = 0;
  let created = 0;
  let updated = 0;
  let unchanged = 0;
  let failedCount = 0;
  let batches = 0;
  const failed: ImportFailure[] = [];
  const fail = (f: ImportFailure): void => {
    failedCount++;
    if (failed.length < MAX_REPORTED_FAILURES) failed.push(f);
  };
  const seen = new Map<string, number>();
  const progress = (): void =>
    opts.onProgress?.({
      read,
      done,
      failed: failedCount,
      bytesRead: stream.bytesRead,
      totalBytes,
      elapsedMs: performance.now() - started,
    });
  const timer = opts.onProgress === undefined ? null : setInterval(progress, opts.progressEveryMs ?? 1000);

  // Lanes: each has at most one batch in flight; a full batch waits for a free lane.
  const freeLanes: number[] = Array.from({ length: opts.parallel }, (_, i) => i);
  const inFlight = new Set<Promise<void>>();
  // Set by a failed request (closures write it, so it lives in an object TypeScript does not narrow).
  const stop: { error: Error | null } = { error: null };
  const dispatch = async (batch: { line: number; tenant: unknown }[]): Promise<void> => {
    while (freeLanes.length === 0) await Promise.race(inFlight);
    if (stop.error !== null) return;
    const lane = freeLanes.pop() ?? 0;
    batches++;
    const p: Promise<void> = opts
      .send(
        lane,
        batch.map((b) => b.tenant),
      )
      .then((answer) => {
        created += answer.created;
        updated += answer.updated;
        unchanged += answer.unchanged;
        for (const f of answer.failed) {
          const line = batch[f.index]?.line ?? 0;
          fail({ line, id: f.id, error: f.error, message: f.message });
        }
        done += batch.length;
      })
      .catch((err: unknown) => {
        stop.error ??= err instanceof Error ? err : new Error(String(err));
      })
      .finally(() => {
        freeLanes.push(lane);
        inFlight.delete(p);
      });
    inFlight.add(p);
  };

  try {
    let batch: { line: number; tenant: unknown }[] = [];
    for await (const r of records) {
      if (stop.error !== null) break;
      read++;
      if ('failure' in r) {
        fail(r.failure);
        done++;
        continue;
      }
      if (r.id !== null) {
        const first = seen.get(r.id);
        if (first !== undefined) {
          fail({
            line: r.line,
            id: r.id,
            error: 'DUPLICATE',
            message: `tenant ${r.id} is already on line ${first} of this file (each tenant once per import)`,
          });
          done++;
          continue;
        }
        seen.set(r.id, r.line);
      }
      batch.push({ line: r.line, tenant: r.tenant });
      if (batch.length >= opts.batch) {
        await dispatch(batch);
        batch = [];
      }
    }
    if (batch.length > 0 && stop.error === null) await dispatch(batch);
    await Promise.all([...inFlight]);
  } finally {
    if (timer !== null) clearInterval(timer);
    stream.destroy();
  }
  if (streamFailure.error !== null)
    throw new ImportFileError(`reading ${opts.file} failed: ${streamFailure.error.message}`);
  if (stop.error !== null) throw stop.error;
  progress();
  failed.sort((a, b) => a.line - b.line);
  const seconds = (performance.now() - started) / 1000;
  return {
    file: opts.file,
    format: opts.format,
    records: read,
    created,
    updated,
    unchanged,
    failedCount,
    failed,
    batches,
    seconds,
    perSecond: Math.round(read / Math.max(seconds, 1e-3)),
  };
}

function idOf(v: Record<string, unknown>): string | null {
  return typeof v['id'] === 'string' ? v['id'] : null;
}

async function* readJsonLines(stream: NodeJS.ReadableStream): AsyncGenerator<Record_> {
  const rl = createInterface({ input: stream, crlfDelay: Infinity });
  let line = 0;
  for await (const raw of rl) {
    line++;
    const text = raw.trim();
    if (text.length === 0) continue;
    if (Buffer.byteLength(text) > MAX_IMPORT_LINE_BYTES) {
      yield {
        line,
        failure: { line, id: null, error: 'INVALID', message: `line longer than ${MAX_IMPORT_LINE_BYTES} bytes` },
      };
      continue;
    }
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch (err) {
      yield {
        line,
        failure: {
          line,
          id: null,
          error: 'INVALID',
          message: `not JSON: ${err instanceof Error ? err.message : String(err)}`,
        },
      };
      continue;
    }
    if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) {
      yield {
        line,
        failure: { line, id: null, error: 'INVALID', message: 'not a JSON object like {"id": "acme", "tier": "gold"}' },
      };
      continue;
    }
    const tenant = doc as Record<string, unknown>;
    yield { line, tenant, id: idOf(tenant) };
  }
}

async function* readCsv(stream: NodeJS.ReadableStream): AsyncGenerator<Record_> {
  const skipped: Record_[] = [];
  const header: { error: ImportFileError | null } = { error: null };
  const parser = parseCsv({
    bom: true,
    trim: true,
    skip_empty_lines: true,
    max_record_size: MAX_IMPORT_LINE_BYTES,
    skip_records_with_error: true,
    info: true,
    columns: (row: string[]) => {
      const names = row.map((h) => h.toLowerCase());
      const unknown = names.filter((n) => !(CSV_COLUMNS as readonly string[]).includes(n));
      const missing = ['id', 'tier'].filter((n) => !names.includes(n));
      if (unknown.length > 0 || missing.length > 0 || new Set(names).size !== names.length) {
        header.error = new ImportFileError(
          `the CSV header must name the columns ${CSV_COLUMNS.join(', ')} ` +
            `(id and tier required, each once); got: ${row.join(',')}`,
        );
        throw header.error;
      }
      return names;
    },
    on_skip: (err: CsvError | undefined) => {
      const line =
        typeof (err as { lines?: unknown } | undefined)?.lines === 'number'
          ? (err as unknown as { lines: number }).lines
          : 0;
      skipped.push({
        line,
        failure: { line, id: null, error: 'INVALID', message: `bad CSV record: ${err?.message ?? 'unreadable'}` },
      });
      return undefined;
    },
  });
  stream.pipe(parser);
  try {
    for await (const item of parser as AsyncIterable<{ record: Record<string, string>; info: { lines: number } }>) {
      while (skipped.length > 0) yield skipped.shift() as Record_;
      const tenant: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(item.record)) {
        if (v === '') continue;
        if (k === 'rate' || k === 'burst') {
          const n = Number(v);
          tenant[k] = Number.isFinite(n) ? n : v; // a non-number is sent as is: the coordinator names it
        } else tenant[k] = v;
      }
      yield { line: item.info.lines, tenant, id: idOf(tenant) };
    }
  } catch (err) {
    if (header.error !== null) throw header.error;
    throw new ImportFileError(`reading the CSV failed: ${err instanceof Error ? err.message : String(err)}`);
  }
  while (skipped.length > 0) yield skipped.shift() as Record_;
}
