// `cellquota ctl top`: the live view in a terminal. Each second it reads the live view's document
// (GET /ui/api/state, from any coordinator: a follower forwards it to the leader) twice — the
// busiest tenants by admitted and by refused rate — and redraws: the cluster, the bound, the cells,
// the two tenant tables. q or Ctrl-C ends it cleanly (the terminal restored, exit status 0); on a
// terminal it draws on the alternate screen, otherwise (a pipe) it prints one frame after another.
import type { LiveState, TenantRow } from '../coordinator/api/live-state.js';

export const TOP_INTERVAL_MS = 1000;

export interface TopOptions {
  readonly urls: readonly string[];
  readonly token: string | undefined;
  /** Tenants per table (default: what fits the terminal, at most 20). */
  readonly rows?: number;
  readonly intervalMs?: number;
  readonly input?: NodeJS.ReadStream;
  readonly output?: NodeJS.WriteStream;
}

const ESC = '\u001b[';

async function fetchState(
  opts: TopOptions,
  sort: 'admitted' | 'refused',
  size: number,
  preferred: number,
): Promise<{ doc: LiveState; index: number }> {
  let last = 'no admin URL';
  for (let i = 0; i < opts.urls.length; i++) {
    const index = (preferred + i) % opts.urls.length;
    const base = (opts.urls[index] ?? '').replace(/\/$/, '');
    try {
      const res = await fetch(`${base}/ui/api/state?sort=${sort}&size=${size}`, {
        headers: {
          accept: 'application/json',
          ...(opts.token === undefined ? {} : { authorization: `Bearer ${opts.token}` }),
        },
        signal: AbortSignal.timeout(Math.max(500, (opts.intervalMs ?? TOP_INTERVAL_MS) * 0.9)),
      });
      if (res.status === 401 || res.status === 403)
        throw new Error(`${base}: ${res.status} (give the admin token: --token or CELLQUOTA_ADMIN_TOKEN)`);
      if (!res.ok) {
        last = `${base}: HTTP ${res.status}`;
        continue;
      }
      return { doc: (await res.json()) as LiveState, index };
    } catch (err) {
      last = err instanceof Error ? err.message : String(err);
      if (/\b40[13]\b/.test(last)) throw err;
    }
  }
  throw new Error(`no coordinator answered: ${last}`);
}

function fmt(x: number | null | undefined, digits = 1): string {
  if (x === null || x === undefined) return '-';
  return Math.abs(x) >= 100 ? Math.round(x).toLocaleString('en-US') : x.toFixed(digits).replace(/\.0+$/, '');
}

function table(head: readonly string[], rows: readonly (readonly string[])[], right: ReadonlySet<number>): string[] {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]): string =>
    cells
      .map((c, i) => (right.has(i) ? c.padStart(widths[i] ?? 0) : c.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  return [line(head), ...rows.map(line)];
}

function tenantRows(rows: readonly TenantRow[]): string[][] {
  return rows.map((r) => [
    r.id,
    r.tier,
    fmt(r.rate),
    fmt(r.admittedPerS),
    fmt(r.refusedPerS),
    r.ratio === null ? '-' : `${r.ratio.toFixed(2)}/${(r.peakRatio ?? 0).toFixed(2)}`,
    r.slices.map((s) => `${s.cellId}:${fmt(s.rate)}${s.source === 'leased' ? `@e${s.epoch}` : ' floor'}`).join(' '),
  ]);
}

/** One frame of text (pure: for the tests and the loop). */
export function renderTop(byAdmitted: LiveState, byRefused: LiveState, nowMs: number, width: number): string {
  const c = byAdmitted.cluster;
  const o = byAdmitted.overshoot;
  const out: string[] = [];
  out.push(
    `cellquota top   leader ${c.leader ?? '(none)'}  term ${c.term}  commit ${c.commitIndex}   built by ` +
      `${byAdmitted.builtBy}   ${new Date(nowMs).toISOString().slice(11, 19)}   q: quit`,
  );
  out.push(
    `members  ${c.members.map((m) => `${m.id} ${m.role}${m.reachable === false ? ' (unreachable)' : ''}`).join(' · ')}`,
  );
  out.push(
    'bound    peak admitted ÷ (rate·1s + burst) over the last minute ' +
      `${o.peakRatio === null ? '-' : o.peakRatio.toFixed(3)}${o.peakQuota === null ? '' : ` (${o.peakQuota})`}   ` +
      `windows over 1: ${o.windowsOver ?? '-'} of ${o.windows ?? '-'}` +
      (byAdmitted.note === null ? '' : `   note: ${byAdmitted.note}`),
  );
  out.push('');
  out.push(
    ...table(
      ['CELL', 'LAST REPORT', 'DECIDES ON', 'FAIL-OPEN/S', 'FAIL-OPEN TOTAL'],
      byAdmitted.cells.map((x) => [
        x.id,
        x.lastReportAt === null ? 'never' : `${((nowMs - x.lastReportAt) / 1000).toFixed(1)} s ago`,
        x.leaseLive ? 'lease' : 'floors',
        fmt(x.failOpenPerS),
        x.failOpenTotal === null ? '-' : String(x.failOpenTotal),
      ]),
      new Set([3, 4]),
    ),
  );
  const head = ['TENANT', 'TIER', 'QUOTA/S', 'ADMITTED/S', 'REFUSED/S', '÷BOUND', 'SLICES'];
  out.push('', `busiest by admitted (${byAdmitted.tenants.total.toLocaleString('en-US')} tenants)`);
  out.push(
    ...table(head, tenantRows(byAdmitted.tenants.rows.filter((r) => (r.admittedPerS ?? 0) > 0)), new Set([2, 3, 4, 5])),
  );
  out.push('', 'busiest by refused');
  out.push(
    ...table(head, tenantRows(byRefused.tenants.rows.filter((r) => (r.refusedPerS ?? 0) > 0)), new Set([2, 3, 4, 5])),
  );
  return out.map((l) => (l.length > width ? l.slice(0, width) : l)).join('\n');
}

/** Runs until q, Ctrl-C (raw terminal or SIGINT) or the input's end; resolves with the exit status. */
export function runTop(opts: TopOptions): Promise<number> {
  const input = opts.input ?? process.stdin;
  const output = opts.output ?? process.stdout;
  const tty = output.isTTY && input.isTTY;
  const interval = opts.intervalMs ?? TOP_INTERVAL_MS;
  let preferred = 0;
  let timer: NodeJS.Timeout | null = null;
  let done = false;
  return new Promise<number>((resolveExit) => {
    const finish = (code: number): void => {
      if (done) return;
      done = true;
      if (timer !== null) clearTimeout(timer);
      input.off('data', onKey);
      process.off('SIGINT', onSigint);
      if (tty) {
        input.setRawMode(false);
        output.write(`${ESC}?25h${ESC}?1049l`);
      }
      input.pause();
      // A paused pipe still holds the event loop open; the command is done with its input.
      (input as { unref?: () => void }).unref?.();
      resolveExit(code);
    };
    const onKey = (b: Buffer | string): void => {
      const s = typeof b === 'string' ? b : b.toString('utf8');
      if (s.includes('q') || s.includes('Q') || s.includes('\u0003')) finish(0);
    };
    const onSigint = (): void => finish(0);
    if (tty) {
      input.setRawMode(true);
      output.write(`${ESC}?1049h${ESC}?25l`);
    }
    input.on('data', onKey);
    input.resume();
    process.on('SIGINT', onSigint);

    const frame = async (): Promise<void> => {
      const started = Date.now();
      const fit = tty ? Math.max(3, Math.floor(((output.rows || 40) - 14) / 2)) : 10;
      const size = Math.min(20, opts.rows ?? fit);
      let text: string;
      try {
        const a = await fetchState(opts, 'admitted', size, preferred);
        preferred = a.index;
        const r = await fetchState(opts, 'refused', size, preferred);
        text = renderTop(a.doc, r.doc, Date.now(), tty ? output.columns || 120 : 200);
      } catch (err) {
        text = `cellquota top: ${err instanceof Error ? err.message : String(err)} (retrying each second; q quits)`;
      }
      if (done) return;
      output.write(tty ? `${ESC}H${ESC}2J${text}` : `${text}\n\n`);
      timer = setTimeout(() => void frame(), Math.max(0, interval - (Date.now() - started)));
    };
    void frame();
  });
}
