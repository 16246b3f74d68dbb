// How `cellquota ctl` shows documents to people: tables with spaced headers, times as ages from
// now ("3 s ago", "in 2.1 s"), numbers right-aligned. Pure: the caller passes the current time.
// (--json prints the admin API's documents as they are; none of this applies to it.)

/** One column: its header as printed and how a row shows in it. */
export interface Column<R> {
  readonly header: string;
  readonly value: (row: R) => string;
  /** Numbers read best right-aligned. */
  readonly align?: 'left' | 'right';
}

/** What a missing value shows as. */
export const NONE = '-';

export function renderTable<R>(rows: readonly R[], columns: readonly Column<R>[]): string {
  const cells = rows.map((r) => columns.map((c) => c.value(r)));
  const widths = columns.map((c, i) => Math.max(c.header.length, ...cells.map((row) => (row[i] ?? '').length)));
  const line = (vals: readonly string[]): string =>
    vals
      .map((v, i) => (columns[i]?.align === 'right' ? v.padStart(widths[i] ?? 0) : v.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  return [line(columns.map((c) => c.header)), ...cells.map(line)].join('\n');
}

/** A duration in ms as people read it: 850 ms, 2.1 s, 42 s, 12 min, 3.5 h, 4 d. */
export function formatDuration(ms: number): string {
  const a = Math.abs(ms);
  if (a < 1000) return `${Math.round(a)} ms`;
  if (a < 10_000) return `${(a / 1000).toFixed(1)} s`;
  if (a < 60_000) return `${Math.round(a / 1000)} s`;
  if (a < 3_600_000) return `${Math.round(a / 60_000)} min`;
  if (a < 86_400_000) return `${(a / 3_600_000).toFixed(1)} h`;
  return `${Math.round(a / 86_400_000)} d`;
}

/** A point in time (ms since the epoch, or an ISO string) relative to nowMs: "3 s ago", "in 2.1 s". */
export function formatAge(at: number | string | null | undefined, nowMs: number): string {
  if (at === null || at === undefined) return NONE;
  const ms = typeof at === 'number' ? at : Date.parse(at);
  if (!Number.isFinite(ms)) return String(at);
  const d = ms - nowMs;
  if (Math.abs(d) < 50) return 'now';
  return d > 0 ? `in ${formatDuration(d)}` : `${formatDuration(d)} ago`;
}

/** A number, a string as is, yes/no for booleans, NONE for null/undefined. */
export function formatValue(v: unknown): string {
  if (v === null || v === undefined) return NONE;
  if (typeof v === 'boolean') return v ? 'yes' : 'no';
  if (typeof v === 'string') return v;
  if (typeof v === 'number') return String(v);
  return JSON.stringify(v);
}
