// Renders a drill's timeline (chaos/timeline.ts) as a standalone SVG: panels stacked over one time
// axis (seconds since the drill started) — admitted req/s per cell and over every cell against the
// quota and quota + bound, the slices in force and the lease state per cell, the decision latency
// p99, and the coordinator leader — with the faults shaded across every panel. Pure: a string in
// nothing but the timeline, no I/O. Values that are not finite numbers are skipped.
//
// For tests and tools the output carries data attributes: the root <svg> has data-t-min/data-t-max
// (the time axis domain, s) and data-plot-x0/data-plot-x1 (its pixel extent); each panel is a
// <g data-panel="…">; each drawn series has data-series="<panel>:<cell>" (one element per series);
// fault rects have data-t0/data-t1 (s).

import type { Timeline, TimelineEvent, TimelineSample } from './timeline.js';

const WIDTH = 1000;
const MARGIN_LEFT = 84;
const MARGIN_RIGHT = 28;
const PLOT_X0 = MARGIN_LEFT;
const PLOT_X1 = WIDTH - MARGIN_RIGHT;
const FONT = 'DejaVu Sans, Helvetica, Arial, sans-serif';

/** Cell colours; red and orange are kept for errors and degraded answers. */
const CELL_COLOURS = [
  '#1f77b4',
  '#2ca02c',
  '#9467bd',
  '#17becf',
  '#8c564b',
  '#e377c2',
  '#bcbd22',
  '#7f7f7f',
  '#393b79',
  '#637939',
];
const LEADER_COLOURS = ['#a6cee3', '#b2df8a', '#fdbf6f', '#cab2d6', '#ffe680', '#80d4c8', '#f4b6c2', '#d9c3a5'];
const GLOBAL_COLOUR = '#222222';
const ERROR_COLOUR = '#d62728';
const DEGRADED_COLOUR = '#ff7f0e';
const FLOORS_COLOUR = '#f2c14e';
const NO_LEADER_COLOUR = '#cfcfcf';
const GRID_COLOUR = '#e6e6e6';
const AXIS_COLOUR = '#888888';
const TEXT_COLOUR = '#333333';
/** A white outline behind labels drawn over lines, so they stay legible. */
const HALO = 'stroke="#ffffff" stroke-width="3" stroke-linejoin="round" paint-order="stroke"';
const PANEL_GAP = 32;
const P99_TARGET_MS = 1.5;
const P99_CLAMP_MS = 10;

// ---------------------------------------------------------------------------------------------
// Ticks and formatting

/**
 * Round tick values ("nice numbers": 1, 2 or 5 times a power of ten apart) covering [min, max]:
 * the first tick is ≤ min, the last ≥ max, about `count` intervals in between. min > max is
 * swapped; min = max gets a range around it; non-finite input gives [].
 */
export function niceTicks(min: number, max: number, count: number): number[] {
  if (!Number.isFinite(min) || !Number.isFinite(max)) return [];
  let lo = Math.min(min, max);
  let hi = Math.max(min, max);
  if (lo === hi) {
    const pad = lo === 0 ? 1 : Math.abs(lo) * 0.1;
    lo -= lo === 0 ? 0 : pad;
    hi += pad;
  }
  const n = Number.isFinite(count) ? Math.max(1, Math.min(100, Math.round(count))) : 5;
  const span = hi - lo;
  if (!Number.isFinite(span) || span <= 0) return [];
  const rough = span / n;
  const power = 10 ** Math.floor(Math.log10(rough));
  const error = rough / power;
  const factor = error >= Math.sqrt(50) ? 10 : error >= Math.sqrt(10) ? 5 : error >= Math.sqrt(2) ? 2 : 1;
  const step = factor * power;
  if (!(step > 0) || !Number.isFinite(step)) return [];
  const first = Math.floor(lo / step + 1e-9);
  const last = Math.ceil(hi / step - 1e-9);
  if (!Number.isFinite(first) || !Number.isFinite(last) || last - first > 1000) return [];
  const decimals = Math.max(0, Math.round(-Math.log10(power)));
  const ticks: number[] = [];
  for (let k = first; k <= last; k++) {
    const v = Number((k * step).toFixed(Math.min(20, decimals)));
    ticks.push(Object.is(v, -0) ? 0 : v);
  }
  return ticks;
}

function formatTick(v: number, ticks: readonly number[]): string {
  const step = ticks.length >= 2 ? Math.abs((ticks[1] ?? 0) - (ticks[0] ?? 0)) : 1;
  if (step >= 1000 && Math.abs(v) >= 1000) {
    const d = Math.max(0, -Math.floor(Math.log10(step / 1000)));
    return `${(v / 1000).toFixed(d)}k`;
  }
  const d = step > 0 ? Math.max(0, -Math.floor(Math.log10(step) + 1e-9)) : 0;
  return v.toFixed(Math.min(10, d));
}

function formatValue(v: number): string {
  const d = Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2;
  return String(Number(v.toFixed(d)));
}

/** A pixel coordinate: one decimal, never "-0" or NaN. */
function px(v: number): string {
  if (!Number.isFinite(v)) return '0';
  const r = Math.round(v * 10) / 10;
  return Object.is(r, -0) ? '0' : String(r);
}

/** Text for XML content and attribute values: markup escaped, characters XML forbids replaced. */
export function escapeXml(s: string): string {
  return s
    .replace(/[^\t\n\r\u0020-\uD7FF\uE000-\uFFFD\u{10000}-\u{10FFFF}]/gu, '\uFFFD')
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;')
    .replace(/'/g, '&apos;');
}

function truncate(s: string, max: number): string {
  const chars = Array.from(s);
  return chars.length <= max ? s : `${chars.slice(0, Math.max(1, max - 1)).join('')}…`;
}

/** Rough width of a text in px (sans-serif averages a bit under 0.6 em a character). */
function textWidth(s: string, fontSize: number): number {
  return Array.from(s).length * fontSize * 0.6;
}

function finite(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/** An own property of a record (a cell named "__proto__" or "constructor" is still just a key). */
function own<T>(rec: Readonly<Record<string, T>> | null | undefined, key: string): T | undefined {
  if (rec === null || rec === undefined || typeof rec !== 'object') return undefined;
  return Object.prototype.hasOwnProperty.call(rec, key) ? rec[key] : undefined;
}

function clamp(v: number, lo: number, hi: number): number {
  return Math.min(hi, Math.max(lo, v));
}

// ---------------------------------------------------------------------------------------------
// SVG building blocks

function text(x: number, y: number, s: string, attrs: string = ''): string {
  return `<text x="${px(x)}" y="${px(y)}"${attrs === '' ? '' : ` ${attrs}`}>${escapeXml(s)}</text>`;
}

function line(x1: number, y1: number, x2: number, y2: number, attrs: string): string {
  return `<line x1="${px(x1)}" y1="${px(y1)}" x2="${px(x2)}" y2="${px(y2)}" ${attrs}/>`;
}

function rect(x: number, y: number, w: number, h: number, attrs: string): string {
  return `<rect x="${px(x)}" y="${px(y)}" width="${px(Math.max(0, w))}" height="${px(Math.max(0, h))}" ${attrs}/>`;
}

function attr(s: string): string {
  return escapeXml(s);
}

interface YScale {
  readonly top: number;
  readonly bottom: number;
  readonly min: number;
  readonly max: number;
  readonly ticks: readonly number[];
}

function yOf(s: YScale, v: number): number {
  const span = s.max - s.min || 1;
  return s.bottom - ((clamp(v, s.min, s.max) - s.min) / span) * (s.bottom - s.top);
}

function yScale(top: number, bottom: number, dataMax: number, count: number, fixedMax?: number): YScale {
  const hi = fixedMax ?? (dataMax > 0 ? dataMax : 1);
  const ticks = niceTicks(0, hi, count);
  const max = ticks.length > 0 ? (ticks[ticks.length - 1] ?? hi) : hi;
  return { top, bottom, min: 0, max, ticks: ticks.length > 0 ? ticks : [0, max] };
}

// ---------------------------------------------------------------------------------------------
// The chart

interface Prepared {
  readonly samples: readonly TimelineSample[];
  /** Interval start and end of each sample, s. */
  readonly spans: readonly (readonly [number, number])[];
  readonly cells: readonly string[];
  readonly events: readonly TimelineEvent[];
  readonly tMin: number;
  readonly tMax: number;
  readonly xTicks: readonly number[];
}

function arrayOf(v: unknown): readonly unknown[] {
  return Array.isArray(v) ? (v as readonly unknown[]) : [];
}

function isTimed<T extends { readonly t: number }>(v: unknown): v is T {
  return v !== null && typeof v === 'object' && finite((v as { t?: unknown }).t) !== null;
}

function prepare(t: Timeline): Prepared {
  // The timeline may come from JSON: anything that is not a sample or an event at a finite time is skipped.
  const samples = arrayOf(t.samples)
    .filter(isTimed<TimelineSample>)
    .sort((a, b) => a.t - b.t);
  const cells: string[] = [];
  const seen = new Set<string>();
  const addCell = (c: unknown): void => {
    if (typeof c === 'string' && !seen.has(c)) {
      seen.add(c);
      cells.push(c);
    }
  };
  for (const c of arrayOf(t.cells)) addCell(c);
  for (const s of samples) {
    for (const rec of [s.admitted, s.slices, s.leased, s.errors, s.degraded, s.refused] as unknown[]) {
      if (rec !== null && typeof rec === 'object') for (const k of Object.keys(rec)) addCell(k);
    }
  }
  const events = arrayOf(t.events).filter(isTimed<TimelineEvent>);

  const diffs: number[] = [];
  for (let i = 1; i < samples.length; i++) diffs.push(((samples[i]?.t ?? 0) - (samples[i - 1]?.t ?? 0)) / 1000);
  diffs.sort((a, b) => a - b);
  const typical = diffs.length > 0 ? (diffs[Math.floor(diffs.length / 2)] ?? 0.25) : 0.25;
  const spans: [number, number][] = samples.map((s, i) => {
    const end = s.t / 1000;
    const prev = samples[i - 1];
    const start = prev !== undefined ? prev.t / 1000 : Math.max(Math.min(0, end), end - (typical > 0 ? typical : 0.25));
    return [start, end];
  });

  let lo = 0;
  let hi = 0;
  for (const [a, b] of spans) {
    lo = Math.min(lo, a);
    hi = Math.max(hi, b);
  }
  for (const e of events) {
    lo = Math.min(lo, e.t / 1000);
    hi = Math.max(hi, e.t / 1000);
    const end = finite(e.end);
    if (end !== null) hi = Math.max(hi, end / 1000);
  }
  if (hi <= lo) hi = lo + 1;
  const xTicks = niceTicks(lo, hi, 10);
  const tMin = xTicks[0] ?? lo;
  const tMax = xTicks[xTicks.length - 1] ?? hi;
  return { samples, spans, cells, events, tMin, tMax, xTicks };
}

export function renderTimelineSvg(t: Timeline): string {
  const title = typeof t.title === 'string' ? t.title : '';
  const drill = typeof t.drill === 'string' ? t.drill : '';
  const p = prepare(t);
  const quota = finite(t.quota);
  const bound = finite(t.bound);
  const started = typeof t.startedAt === 'string' ? t.startedAt : '';

  const body: string[] = [];
  const head: string[] = [];

  // Title and the drill.
  head.push(text(PLOT_X0, 26, title === '' ? '(untitled drill)' : title, 'font-size="17" font-weight="bold"'));
  const facts = [`drill: ${drill}`];
  if (started !== '') facts.push(`started ${started}`);
  if (quota !== null) facts.push(`quota ${formatValue(quota)} req/s`);
  if (bound !== null) facts.push(`bound ${formatValue(bound)}`);
  facts.push(`${p.samples.length} sample${p.samples.length === 1 ? '' : 's'}`);
  head.push(text(PLOT_X0, 45, facts.join('  ·  '), `font-size="12" fill="${TEXT_COLOUR}"`));
  let y = 52;

  if (p.samples.length === 0) {
    const h = 220;
    head.push(rect(PLOT_X0, y + 16, PLOT_X1 - PLOT_X0, 140, `fill="#fafafa" stroke="${AXIS_COLOUR}" data-empty="1"`));
    head.push(
      text((PLOT_X0 + PLOT_X1) / 2, y + 92, 'no samples', `font-size="16" text-anchor="middle" fill="#777777"`),
    );
    return document(h + y - 40, head.join('\n'), p);
  }

  const colourOf = new Map<string, string>();
  p.cells.forEach((c, i) => colourOf.set(c, CELL_COLOURS[i % CELL_COLOURS.length] ?? '#1f77b4'));

  // Legend (wraps).
  {
    const items: { swatch: (x: number, yy: number) => string; label: string }[] = [];
    for (const c of p.cells) {
      const col = colourOf.get(c) ?? '#000000';
      items.push({
        swatch: (x, yy) => line(x, yy, x + 18, yy, `stroke="${col}" stroke-width="2"`),
        label: truncate(c, 28),
      });
    }
    items.push({
      swatch: (x, yy) => line(x, yy, x + 18, yy, `stroke="${GLOBAL_COLOUR}" stroke-width="3"`),
      label: 'all cells',
    });
    items.push({
      swatch: (x, yy) => line(x, yy, x + 18, yy, 'stroke="#555555" stroke-width="1.5" stroke-dasharray="6 3"'),
      label: 'quota',
    });
    items.push({
      swatch: (x, yy) => line(x, yy, x + 18, yy, `stroke="${ERROR_COLOUR}" stroke-width="1.5" stroke-dasharray="2 3"`),
      label: 'quota + bound',
    });
    items.push({
      swatch: (x, yy) => `<circle cx="${px(x + 9)}" cy="${px(yy)}" r="3" fill="${ERROR_COLOUR}"/>`,
      label: 'errors/s',
    });
    items.push({ swatch: (x, yy) => diamond(x + 9, yy, 3.5, DEGRADED_COLOUR), label: 'degraded/s' });
    items.push({
      swatch: (x, yy) => rect(x, yy - 6, 18, 12, `fill="${ERROR_COLOUR}" fill-opacity="0.15"`),
      label: 'fault',
    });
    items.push({
      swatch: (x, yy) => line(x + 9, yy - 7, x + 9, yy + 7, 'stroke="#2ca02c" stroke-width="2"'),
      label: 'heal',
    });
    items.push({
      swatch: (x, yy) => line(x + 9, yy - 7, x + 9, yy + 7, 'stroke="#999999" stroke-width="1.5"'),
      label: 'note',
    });
    let x = PLOT_X0;
    let row = y + 16;
    const out: string[] = [];
    for (const it of items) {
      const w = 18 + 5 + textWidth(it.label, 11) + 16;
      if (x + w > PLOT_X1 && x > PLOT_X0) {
        x = PLOT_X0;
        row += 18;
      }
      out.push(it.swatch(x, row - 4));
      out.push(text(x + 23, row, it.label, 'font-size="11"'));
      x += w;
    }
    head.push(`<g data-legend="1">${out.join('')}</g>`);
    y = row + 10;
  }

  const xOf = (sec: number): number =>
    PLOT_X0 + ((clamp(sec, p.tMin, p.tMax) - p.tMin) / (p.tMax - p.tMin)) * (PLOT_X1 - PLOT_X0);

  // Event labels at the top, in up to three rows.
  const labelRows: number[] = [];
  const eventLabels: { x: number; row: number; label: string; colour: string }[] = [];
  const sortedEvents = p.events.slice().sort((a, b) => a.t - b.t);
  for (const e of sortedEvents) {
    const label = truncate(typeof e.label === 'string' ? e.label : '', 48);
    if (label === '') continue;
    const w = textWidth(label, 10.5);
    let x = xOf(e.t / 1000) + 3;
    if (x + w > WIDTH - 4) x = Math.max(4, WIDTH - 4 - w);
    let row = labelRows.findIndex((end) => end + 6 <= x);
    if (row < 0) {
      if (labelRows.length < 3) row = labelRows.length;
      else row = labelRows.indexOf(Math.min(...labelRows));
    }
    labelRows[row] = x + w;
    const colour = e.kind === 'fault' ? '#b22222' : e.kind === 'heal' ? '#1e7b1e' : '#666666';
    eventLabels.push({ x, row, label, colour });
  }
  const labelTop = y + 6;
  y = labelTop + labelRows.length * 13 + 6;
  for (const l of eventLabels) {
    head.push(
      text(
        l.x,
        labelTop + 10 + l.row * 13,
        l.label,
        `font-size="10.5" fill="${l.colour}" ${HALO} data-event-label="1"`,
      ),
    );
  }

  const panelsTop = y;
  const xGrid = (top: number, bottom: number): string =>
    p.xTicks.map((v) => line(xOf(v), top, xOf(v), bottom, `stroke="${GRID_COLOUR}" stroke-width="1"`)).join('');
  const xAxis = (bottom: number, labels: boolean): string => {
    const parts = [line(PLOT_X0, bottom, PLOT_X1, bottom, `stroke="${AXIS_COLOUR}"`)];
    for (const v of p.xTicks) {
      const x = xOf(v);
      parts.push(line(x, bottom, x, bottom + 4, `stroke="${AXIS_COLOUR}"`));
      if (labels)
        parts.push(
          text(x, bottom + 14, formatTick(v, p.xTicks), `font-size="10" text-anchor="middle" fill="${TEXT_COLOUR}"`),
        );
    }
    return parts.join('');
  };
  const yAxis = (s: YScale, fmt: (v: number) => string = (v) => formatTick(v, s.ticks)): string => {
    const parts = [line(PLOT_X0, s.top, PLOT_X0, s.bottom, `stroke="${AXIS_COLOUR}"`)];
    for (const v of s.ticks) {
      const yy = yOf(s, v);
      parts.push(line(PLOT_X0, yy, PLOT_X1, yy, `stroke="${GRID_COLOUR}"`));
      parts.push(line(PLOT_X0 - 4, yy, PLOT_X0, yy, `stroke="${AXIS_COLOUR}"`));
      parts.push(text(PLOT_X0 - 7, yy + 3.5, fmt(v), `font-size="10" text-anchor="end" fill="${TEXT_COLOUR}"`));
    }
    return parts.join('');
  };
  const panelTitle = (yy: number, s: string): string =>
    text(PLOT_X0, yy, s, `font-size="12" font-weight="bold" fill="${TEXT_COLOUR}"`);
  const secs = p.samples.map((s) => s.t / 1000);

  // --- Panel 1: admitted ---------------------------------------------------------------------
  {
    const top = y + 18;
    const bottom = top + 210;
    let dataMax = 0;
    for (const s of p.samples) {
      const g = finite(s.global);
      if (g !== null) dataMax = Math.max(dataMax, g);
      for (const c of p.cells) {
        const v = finite(own(s.admitted, c));
        if (v !== null) dataMax = Math.max(dataMax, v);
      }
    }
    if (quota !== null) dataMax = Math.max(dataMax, quota + Math.max(0, bound ?? 0));
    const sc = yScale(top, bottom, dataMax * 1.05, 6);
    const parts: string[] = [panelTitle(top - 7, 'Admitted (req/s)')];
    parts.push(xGrid(top, bottom), yAxis(sc), xAxis(bottom, true));
    if (quota !== null) {
      const yq = yOf(sc, quota);
      parts.push(
        line(PLOT_X0, yq, PLOT_X1, yq, 'stroke="#555555" stroke-width="1.5" stroke-dasharray="6 3" data-line="quota"'),
      );
      parts.push(text(PLOT_X1 - 3, yq + 12, 'quota', 'font-size="10" text-anchor="end" fill="#555555" ' + HALO));
      if (bound !== null) {
        const yb = yOf(sc, quota + bound);
        parts.push(
          line(
            PLOT_X0,
            yb,
            PLOT_X1,
            yb,
            `stroke="${ERROR_COLOUR}" stroke-width="1.5" stroke-dasharray="2 3" data-line="quota-bound"`,
          ),
        );
        parts.push(
          text(PLOT_X1 - 3, yb - 4, 'quota + bound', `font-size="10" text-anchor="end" fill="${ERROR_COLOUR}" ${HALO}`),
        );
      }
    }
    for (const c of p.cells) {
      const pts = p.samples.map((s) => finite(own(s.admitted, c)));
      parts.push(
        polyline(
          secs,
          pts,
          xOf,
          (v) => yOf(sc, v),
          `admitted:${c}`,
          `stroke="${colourOf.get(c) ?? '#000000'}" stroke-width="1.5"`,
        ),
      );
    }
    parts.push(
      polyline(
        secs,
        p.samples.map((s) => finite(s.global)),
        xOf,
        (v) => yOf(sc, v),
        'admitted:*',
        `stroke="${GLOBAL_COLOUR}" stroke-width="2.75"`,
      ),
    );
    // Errors and degraded answers, summed over the cells, as markers where > 0 (above the scale: at the top).
    const markers: string[] = [];
    p.samples.forEach((s, i) => {
      const x = xOf(secs[i] ?? 0);
      const err = sumOver(s.errors, p.cells);
      if (err > 0)
        markers.push(
          `<circle cx="${px(x)}" cy="${px(yOf(sc, err))}" r="2.8" fill="${ERROR_COLOUR}" data-marker="errors"><title>${escapeXml(`${formatValue(secs[i] ?? 0)} s: ${formatValue(err)} errors/s`)}</title></circle>`,
        );
      const deg = sumOver(s.degraded, p.cells);
      if (deg > 0)
        markers.push(
          diamond(
            x,
            yOf(sc, deg),
            3.5,
            DEGRADED_COLOUR,
            `data-marker="degraded"`,
            `${formatValue(secs[i] ?? 0)} s: ${formatValue(deg)} degraded/s`,
          ),
        );
    });
    parts.push(...markers);
    body.push(`<g data-panel="admitted">${parts.join('\n')}</g>`);
    y = bottom + PANEL_GAP;
  }

  // --- Panel 2: slices and lease state ---------------------------------------------------------
  {
    const top = y + 18;
    const bottom = top + 120;
    let dataMax = 0;
    for (const s of p.samples) {
      for (const c of p.cells) {
        const v = finite(own(s.slices, c));
        if (v !== null) dataMax = Math.max(dataMax, v);
      }
    }
    const sc = yScale(top, bottom, dataMax * 1.05, 4);
    const parts: string[] = [panelTitle(top - 7, 'Slices in force (req/s) and lease state per cell')];
    // Lease legend to the right of the title.
    {
      let lx = PLOT_X1 - 250;
      const ly = top - 7;
      parts.push(
        rect(lx, ly - 8, 14, 8, `fill="${CELL_COLOURS[0] ?? '#1f77b4'}" fill-opacity="0.75"`),
        text(lx + 18, ly, 'leased', 'font-size="10"'),
      );
      lx += 62;
      parts.push(rect(lx, ly - 8, 14, 8, `fill="${FLOORS_COLOUR}"`), text(lx + 18, ly, 'on floors', 'font-size="10"'));
      lx += 76;
      parts.push(
        rect(lx, ly - 8, 14, 8, 'fill="#ffffff" stroke="#bbbbbb" stroke-width="0.8"'),
        text(lx + 18, ly, 'unknown', 'font-size="10"'),
      );
    }
    parts.push(xGrid(top, bottom), yAxis(sc), xAxis(bottom, false));
    for (const c of p.cells) {
      const pts = p.samples.map((s) => finite(own(s.slices, c)));
      parts.push(
        pathWithGaps(
          secs,
          pts,
          xOf,
          (v) => yOf(sc, v),
          `slices:${c}`,
          `stroke="${colourOf.get(c) ?? '#000000'}" stroke-width="1.5"`,
        ),
      );
    }
    // One thin band per cell.
    const bandH = 8;
    let by = bottom + 8;
    for (const c of p.cells) {
      const col = colourOf.get(c) ?? '#000000';
      const runs = runsOf(
        p.samples.map((s) => {
          const v = finite(own(s.leased, c));
          return v === null ? 'unknown' : v >= 0.5 ? 'leased' : 'floors';
        }),
        p.spans,
      );
      const segs: string[] = [
        rect(PLOT_X0, by, PLOT_X1 - PLOT_X0, bandH, 'fill="#ffffff" stroke="#dddddd" stroke-width="0.6"'),
      ];
      for (const r of runs) {
        if (r.value === 'unknown') continue;
        const x0 = xOf(r.t0);
        const x1 = xOf(r.t1);
        const fill = r.value === 'leased' ? `fill="${col}" fill-opacity="0.75"` : `fill="${FLOORS_COLOUR}"`;
        segs.push(rect(x0, by, Math.max(0.8, x1 - x0), bandH, `${fill} data-lease="${r.value}"`));
      }
      segs.push(
        text(PLOT_X0 - 7, by + bandH - 0.5, truncate(c, 12), `font-size="9" text-anchor="end" fill="${TEXT_COLOUR}"`),
      );
      parts.push(`<g data-series="${attr(`lease:${c}`)}">${segs.join('')}</g>`);
      by += bandH + 3;
    }
    parts.push(xAxis(by + 1, true));
    body.push(`<g data-panel="slices">${parts.join('\n')}</g>`);
    y = by + 1 + PANEL_GAP;
  }

  // --- Panel 3: decision latency p99 ------------------------------------------------------------
  {
    const top = y + 18;
    const bottom = top + 110;
    let dataMax = 0;
    for (const s of p.samples) {
      const v = finite(s.p99Ms);
      if (v !== null) dataMax = Math.max(dataMax, v);
    }
    const shownMax = Math.min(Math.max(dataMax * 1.05, P99_TARGET_MS * 1.35), P99_CLAMP_MS);
    const sc = yScale(top, bottom, shownMax, 4);
    const clamped = p.samples.some((s) => (finite(s.p99Ms) ?? 0) > sc.max);
    const parts: string[] = [panelTitle(top - 7, 'Decision latency p99 (ms)')];
    if (clamped)
      parts.push(
        text(
          PLOT_X1,
          top - 7,
          `values above ${formatTick(sc.max, sc.ticks)} ms drawn at the top (▲, max ${formatValue(dataMax)} ms)`,
          `font-size="10" text-anchor="end" fill="${ERROR_COLOUR}"`,
        ),
      );
    parts.push(xGrid(top, bottom), yAxis(sc), xAxis(bottom, true));
    const yt = yOf(sc, P99_TARGET_MS);
    parts.push(
      line(
        PLOT_X0,
        yt,
        PLOT_X1,
        yt,
        'stroke="#555555" stroke-width="1.2" stroke-dasharray="6 3" data-line="p99-target"',
      ),
    );
    parts.push(
      text(
        PLOT_X1 - 3,
        yt - 4,
        `target ${P99_TARGET_MS} ms`,
        'font-size="10" text-anchor="end" fill="#555555" ' + HALO,
      ),
    );
    const pts = p.samples.map((s) => finite(s.p99Ms));
    parts.push(pathWithGaps(secs, pts, xOf, (v) => yOf(sc, v), 'p99:*', 'stroke="#5b4a9e" stroke-width="1.5"'));
    p.samples.forEach((s, i) => {
      const v = finite(s.p99Ms);
      if (v === null || v <= sc.max) return;
      const x = xOf(secs[i] ?? 0);
      parts.push(
        `<path d="M${px(x - 4)} ${px(top + 6)} L${px(x)} ${px(top - 1)} L${px(x + 4)} ${px(top + 6)} Z" fill="${ERROR_COLOUR}" data-clamped="1"><title>${escapeXml(`${formatValue(secs[i] ?? 0)} s: p99 ${formatValue(v)} ms`)}</title></path>`,
      );
    });
    body.push(`<g data-panel="p99">${parts.join('\n')}</g>`);
    y = bottom + PANEL_GAP;
  }

  // --- Panel 4: leader --------------------------------------------------------------------------
  {
    const top = y + 18;
    const bottom = top + 24;
    const leaderColour = new Map<string, string>();
    const coords = arrayOf(t.coordinators);
    for (const c of coords)
      if (typeof c === 'string' && !leaderColour.has(c))
        leaderColour.set(c, LEADER_COLOURS[leaderColour.size % LEADER_COLOURS.length] ?? '#a6cee3');
    const parts: string[] = [panelTitle(top - 7, 'Coordinator leader')];
    parts.push(xGrid(top, bottom));
    const runs = runsOf(
      p.samples.map((s) => (typeof s.leader === 'string' ? s.leader : null)),
      p.spans,
    );
    for (const r of runs) {
      let fill = NO_LEADER_COLOUR;
      if (r.value !== null) {
        if (!leaderColour.has(r.value))
          leaderColour.set(r.value, LEADER_COLOURS[leaderColour.size % LEADER_COLOURS.length] ?? '#a6cee3');
        fill = leaderColour.get(r.value) ?? fill;
      }
      const x0 = xOf(r.t0);
      const w = Math.max(0.8, xOf(r.t1) - x0);
      const label = r.value ?? 'no leader';
      parts.push(rect(x0, top, w, bottom - top, `fill="${fill}" data-leader="${attr(r.value ?? '')}"`));
      const shown = truncate(label, 24);
      if (textWidth(shown, 11) + 8 <= w) {
        parts.push(
          text(
            x0 + w / 2,
            top + 16,
            shown,
            `font-size="11" text-anchor="middle" fill="${r.value === null ? '#666666' : '#222222'}"`,
          ),
        );
      }
    }
    parts.push(rect(PLOT_X0, top, PLOT_X1 - PLOT_X0, bottom - top, 'fill="none" stroke="#bbbbbb" stroke-width="0.8"'));
    parts.push(xAxis(bottom, true));
    parts.push(
      text(
        (PLOT_X0 + PLOT_X1) / 2,
        bottom + 30,
        'seconds since the drill started',
        `font-size="11" text-anchor="middle" fill="${TEXT_COLOUR}"`,
      ),
    );
    body.push(`<g data-panel="leader">${parts.join('\n')}</g>`);
    y = bottom + 44;
  }
  const panelsBottom = y - 44 + 4;

  // Events across every panel, over the data (translucent, so the lease and leader bands show them too).
  const shades: string[] = [];
  for (const e of p.events) {
    const t0 = e.t / 1000;
    const x0 = xOf(t0);
    if (e.kind === 'fault') {
      const endMs = finite(e.end);
      const t1 = endMs !== null ? Math.max(t0, endMs / 1000) : p.tMax;
      const x1 = xOf(t1);
      shades.push(
        rect(
          x0,
          panelsTop,
          Math.max(1, x1 - x0),
          panelsBottom - panelsTop,
          `fill="${ERROR_COLOUR}" fill-opacity="0.11" data-event="fault" data-t0="${t0}" data-t1="${t1}"${endMs === null ? ' data-open="1"' : ''}`,
        ),
      );
      shades.push(
        line(x0, labelTop, x0, panelsBottom, `stroke="${ERROR_COLOUR}" stroke-opacity="0.5" stroke-width="1"`),
      );
    } else if (e.kind === 'heal') {
      shades.push(
        line(x0, labelTop, x0, panelsBottom, `stroke="#2ca02c" stroke-width="1.8" data-event="heal" data-t0="${t0}"`),
      );
    } else {
      shades.push(
        line(
          x0,
          labelTop,
          x0,
          panelsBottom,
          `stroke="#999999" stroke-width="1.2" stroke-dasharray="3 2" data-event="note" data-t0="${t0}"`,
        ),
      );
    }
  }

  return document(y, [head.join('\n'), body.join('\n'), `<g data-events="1">${shades.join('\n')}</g>`].join('\n'), p);
}

function document(height: number, content: string, p: Prepared): string {
  const h = Math.ceil(height);
  return [
    '<?xml version="1.0" encoding="UTF-8"?>',
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${h}" viewBox="0 0 ${WIDTH} ${h}" font-family="${FONT}" fill="${TEXT_COLOUR}" data-t-min="${p.tMin}" data-t-max="${p.tMax}" data-plot-x0="${PLOT_X0}" data-plot-x1="${PLOT_X1}">`,
    `<rect x="0" y="0" width="${WIDTH}" height="${h}" fill="#ffffff"/>`,
    content,
    '</svg>',
    '',
  ].join('\n');
}

function diamond(x: number, y: number, r: number, colour: string, attrs: string = '', title?: string): string {
  const d = `M${px(x)} ${px(y - r)} L${px(x + r)} ${px(y)} L${px(x)} ${px(y + r)} L${px(x - r)} ${px(y)} Z`;
  const a = attrs === '' ? '' : ` ${attrs}`;
  return title === undefined
    ? `<path d="${d}" fill="${colour}"${a}/>`
    : `<path d="${d}" fill="${colour}"${a}><title>${escapeXml(title)}</title></path>`;
}

function sumOver(rec: Readonly<Record<string, number>> | undefined, cells: readonly string[]): number {
  let sum = 0;
  for (const c of cells) {
    const v = finite(own(rec, c));
    if (v !== null && v > 0) sum += v;
  }
  return sum;
}

/** One <polyline> through the finite points (non-finite ones skipped); a lone point gets a dot. */
function polyline(
  xs: readonly number[],
  vs: readonly (number | null)[],
  xOf: (s: number) => number,
  yOf: (v: number) => number,
  series: string,
  style: string,
): string {
  const pts: [number, number][] = [];
  vs.forEach((v, i) => {
    const x = xs[i];
    if (v !== null && x !== undefined) pts.push([xOf(x), yOf(v)]);
  });
  if (pts.length === 0) return '';
  if (pts.length === 1) {
    const [x, yy] = pts[0] ?? [0, 0];
    return `<circle cx="${px(x)}" cy="${px(yy)}" r="2.5" ${style.replace('stroke=', 'fill=')} data-series="${attr(series)}"/>`;
  }
  return `<polyline points="${pts.map(([x, yy]) => `${px(x)},${px(yy)}`).join(' ')}" fill="none" stroke-linejoin="round" ${style} data-series="${attr(series)}"/>`;
}

/** One <path> through the points, broken where a value is missing; lone points are drawn as dots. */
function pathWithGaps(
  xs: readonly number[],
  vs: readonly (number | null)[],
  xOf: (s: number) => number,
  yOf: (v: number) => number,
  series: string,
  style: string,
): string {
  const runs: [number, number][][] = [];
  let cur: [number, number][] = [];
  vs.forEach((v, i) => {
    const x = xs[i];
    if (v === null || x === undefined) {
      if (cur.length > 0) runs.push(cur);
      cur = [];
    } else {
      cur.push([xOf(x), yOf(v)]);
    }
  });
  if (cur.length > 0) runs.push(cur);
  if (runs.length === 0) return '';
  const d = runs.map((r) => r.map(([x, yy], i) => `${i === 0 ? 'M' : 'L'}${px(x)} ${px(yy)}`).join(' ')).join(' ');
  // A lone point (a run of one) draws nothing as a path: it gets a dot.
  const fill = /stroke="([^"]*)"/.exec(style)?.[1] ?? '#000000';
  const dots = runs
    .filter((r) => r.length === 1)
    .map(
      (r) =>
        `<circle cx="${px(r[0]?.[0] ?? 0)}" cy="${px(r[0]?.[1] ?? 0)}" r="2.2" fill="${fill}" data-dot-of="${attr(series)}"/>`,
    );
  return `<path d="${d}" fill="none" stroke-linejoin="round" stroke-linecap="round" ${style} data-series="${attr(series)}"/>${dots.join('')}`;
}

/** Consecutive samples with the same value, as time spans. */
function runsOf<T>(
  values: readonly T[],
  spans: readonly (readonly [number, number])[],
): { value: T; t0: number; t1: number }[] {
  const out: { value: T; t0: number; t1: number }[] = [];
  values.forEach((v, i) => {
    const span = spans[i];
    if (span === undefined) return;
    const last = out[out.length - 1];
    if (last !== undefined && last.value === v && Math.abs(last.t1 - span[0]) < 1e-9) last.t1 = span[1];
    else out.push({ value: v, t0: span[0], t1: span[1] });
  });
  return out;
}
