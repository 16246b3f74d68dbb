import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { niceTicks, renderTimelineSvg } from '../../chaos/timeline-chart.js';
import type { Timeline, TimelineSample } from '../../chaos/timeline.js';

// ---------------------------------------------------------------------------------------------
// A tiny XML well-formedness checker: tags balance, one root, attributes quoted and unique,
// entity references known, no stray '<' or '&' in text or attribute values.

interface XmlElement {
  readonly name: string;
  readonly attrs: ReadonlyMap<string, string>;
  readonly selfClosing: boolean;
}

const ENTITY = /&(?:amp|lt|gt|quot|apos|#[0-9]+|#x[0-9a-fA-F]+);/y;

function checkEntities(s: string, where: string): void {
  for (let i = s.indexOf('&'); i >= 0; i = s.indexOf('&', i + 1)) {
    ENTITY.lastIndex = i;
    assert.equal(ENTITY.test(s), true, `bad entity reference in ${where}: ${JSON.stringify(s.slice(i, i + 12))}`);
  }
}

function decode(s: string): string {
  return s.replace(/&(amp|lt|gt|quot|apos|#[0-9]+|#x[0-9a-fA-F]+);/g, (_m, e: string) => {
    if (e === 'amp') return '&';
    if (e === 'lt') return '<';
    if (e === 'gt') return '>';
    if (e === 'quot') return '"';
    if (e === 'apos') return "'";
    return String.fromCodePoint(e.startsWith('#x') ? parseInt(e.slice(2), 16) : parseInt(e.slice(1), 10));
  });
}

/** Checks the document and returns its elements in document order (attribute values decoded). */
function parseXml(doc: string): XmlElement[] {
  const elements: XmlElement[] = [];
  const stack: string[] = [];
  let roots = 0;
  let i = 0;
  if (doc.startsWith('<?xml')) {
    const end = doc.indexOf('?>');
    assert.notEqual(end, -1, 'unterminated XML declaration');
    i = end + 2;
  }
  while (i < doc.length) {
    const lt = doc.indexOf('<', i);
    const textPart = doc.slice(i, lt < 0 ? doc.length : lt);
    checkEntities(textPart, 'text');
    if (stack.length === 0)
      assert.equal(textPart.trim(), '', `text outside the root element: ${JSON.stringify(textPart.slice(0, 40))}`);
    if (lt < 0) break;
    if (doc.startsWith('<!--', lt)) {
      const end = doc.indexOf('-->', lt + 4);
      assert.notEqual(end, -1, 'unterminated comment');
      i = end + 3;
      continue;
    }
    const gt = doc.indexOf('>', lt);
    assert.notEqual(gt, -1, 'unterminated tag');
    const tag = doc.slice(lt + 1, gt);
    assert.equal(tag.includes('<'), false, `'<' inside a tag: ${tag.slice(0, 60)}`);
    if (tag.startsWith('/')) {
      const name = tag.slice(1).trim();
      assert.equal(stack.pop(), name, `closing </${name}> does not match`);
    } else {
      const selfClosing = tag.endsWith('/');
      const inner = selfClosing ? tag.slice(0, -1) : tag;
      const m = /^([A-Za-z_][\w:.-]*)/.exec(inner);
      assert.notEqual(m, null, `bad tag name: ${inner.slice(0, 40)}`);
      const name = m?.[1] ?? '';
      const rest = inner.slice(name.length);
      const attrs = new Map<string, string>();
      const attrRe = /\s+([A-Za-z_:][\w:.-]*)="([^"<]*)"/y;
      let pos = 0;
      while (pos < rest.length) {
        if (/^\s*$/.test(rest.slice(pos))) break;
        attrRe.lastIndex = pos;
        const a = attrRe.exec(rest);
        assert.notEqual(a, null, `bad attribute syntax in <${name}>: ${JSON.stringify(rest.slice(pos, pos + 40))}`);
        const key = a?.[1] ?? '';
        const raw = a?.[2] ?? '';
        assert.equal(attrs.has(key), false, `duplicate attribute ${key} in <${name}>`);
        checkEntities(raw, `attribute ${key}`);
        attrs.set(key, decode(raw));
        pos = attrRe.lastIndex;
      }
      if (stack.length === 0) roots++;
      elements.push({ name, attrs, selfClosing });
      if (!selfClosing) stack.push(name);
    }
    i = gt + 1;
  }
  assert.deepEqual(stack, [], 'unclosed elements');
  assert.equal(roots, 1, 'exactly one root element');
  return elements;
}

// ---------------------------------------------------------------------------------------------
// Timelines

const CELLS = ['eu-west-1', 'us-east-2', 'ap-south-1'];

function sample(t: number, over: Partial<TimelineSample> = {}): TimelineSample {
  return {
    t,
    admitted: {},
    refused: {},
    errors: {},
    degraded: {},
    global: 0,
    p99Ms: null,
    slices: {},
    leased: {},
    leader: null,
    ...over,
  };
}

/** 3 cells, 120 samples at 250 ms, a partition of one cell from 10 s to 20 s, leader n1 → none → n2. */
function drillTimeline(cells: readonly string[] = CELLS): Timeline {
  const samples: TimelineSample[] = [];
  const quota = 1000;
  for (let i = 1; i <= 120; i++) {
    const t = i * 250;
    const sec = t / 1000;
    const inFault = sec > 10 && sec <= 20;
    // Object.fromEntries makes own properties even for a cell named "__proto__" (as JSON.parse does).
    const perCell = <T>(f: (c: string, k: number, cut: boolean) => T): Record<string, T> =>
      Object.fromEntries(cells.map((c, k) => [c, f(c, k, inFault && k === cells.length - 1)]));
    const base = quota / cells.length;
    const admitted = perCell((_c, k, cut) =>
      cut ? 60 + 10 * Math.sin(i) : base * (0.97 + 0.05 * Math.sin(i / 3 + k)),
    );
    const refused = perCell((_c, k) => 40 + 5 * k);
    const errors = perCell((_c, _k, cut) => (cut && sec < 13 ? 25 : 0));
    const degraded = perCell((_c, _k, cut) => (cut && sec >= 13 ? 40 : 0));
    const slices = perCell<number | null>((_c, _k, cut) =>
      cut && sec < 11 ? null : cut ? 60 : inFault ? (quota - 60) / (cells.length - 1) : base,
    );
    const leased = perCell<number | null>((_c, _k, cut) => (cut && sec < 11 ? null : cut ? 0 : 1));
    const global = Object.values(admitted).reduce((a, b) => a + b, 0);
    const leader = sec < 12 ? 'n1' : sec < 15 ? null : 'n2';
    const p99Ms = i === 45 ? 4000 : i === 50 ? null : 0.6 + 0.3 * Math.abs(Math.sin(i / 5)) + (inFault ? 0.8 : 0);
    samples.push({ t, admitted, refused, errors, degraded, global, p99Ms, slices, leased, leader });
  }
  return {
    drill: 'partition-one-cell',
    title: 'Partition one cell from the coordinators',
    quota,
    bound: 100,
    cells,
    coordinators: ['n1', 'n2', 'n3'],
    startedAt: '2024-05-01T12:00:00.000Z',
    samples,
    events: [
      { t: 5000, kind: 'note', label: 'load at 1.3× quota' },
      { t: 10000, end: 20000, kind: 'fault', label: `partition ${cells[cells.length - 1] ?? ''} ↔ coordinators` },
      { t: 12000, kind: 'fault', end: 14500, label: 'kill -9 leader n1' },
      { t: 20000, kind: 'heal', label: 'heal partition' },
    ],
  };
}

function seriesCount(elements: readonly XmlElement[], series: string): number {
  return elements.filter((e) => e.attrs.get('data-series') === series).length;
}

function num(e: XmlElement | undefined, key: string): number {
  const v = e?.attrs.get(key);
  assert.notEqual(v, undefined, `attribute ${key} missing`);
  return Number(v);
}

// ---------------------------------------------------------------------------------------------

void test('a drill timeline renders as well-formed SVG with one series per cell per panel', () => {
  const t = drillTimeline();
  const svg = renderTimelineSvg(t);
  const els = parseXml(svg);
  assert.equal(els[0]?.name, 'svg');
  assert.equal(els[0]?.attrs.get('xmlns'), 'http://www.w3.org/2000/svg');
  assert.equal(/NaN|Infinity|undefined/.test(svg), false, 'no NaN/Infinity/undefined in the output');
  for (const c of CELLS) {
    assert.equal(seriesCount(els, `admitted:${c}`), 1, `admitted:${c}`);
    assert.equal(seriesCount(els, `slices:${c}`), 1, `slices:${c}`);
    assert.equal(seriesCount(els, `lease:${c}`), 1, `lease:${c}`);
  }
  assert.equal(seriesCount(els, 'admitted:*'), 1);
  assert.equal(seriesCount(els, 'p99:*'), 1);
  const admitted = els.find((e) => e.attrs.get('data-series') === `admitted:${CELLS[0] ?? ''}`);
  assert.equal(admitted?.name, 'polyline');
  assert.equal((admitted?.attrs.get('points') ?? '').trim().split(/\s+/).length, 120, 'one point per sample');
  // Titles, labels and lines.
  assert.equal(svg.includes('Partition one cell from the coordinators'), true);
  assert.equal(svg.includes('partition-one-cell'), true);
  assert.equal(/>quota</.test(svg), true, 'quota label');
  assert.equal(/>quota \+ bound</.test(svg), true, 'quota + bound label');
  assert.equal(els.filter((e) => e.attrs.get('data-line') === 'quota').length, 1);
  assert.equal(els.filter((e) => e.attrs.get('data-line') === 'quota-bound').length, 1);
  assert.equal(els.filter((e) => e.attrs.get('data-line') === 'p99-target').length, 1);
  // Markers: errors 10.25–12.75 s (11 samples), degraded 13–20 s (29 samples), the 4 s p99 clamped once.
  assert.equal(els.filter((e) => e.attrs.get('data-marker') === 'errors').length, 11);
  assert.equal(els.filter((e) => e.attrs.get('data-marker') === 'degraded').length, 29);
  assert.equal(els.filter((e) => e.attrs.get('data-clamped') === '1').length, 1);
  // The slices of the cut cell have a gap (two subpaths), lease states both appear.
  const cut = els.find((e) => e.attrs.get('data-series') === `slices:${CELLS[2] ?? ''}`);
  assert.equal((cut?.attrs.get('d') ?? '').split('M').length - 1, 2, 'a gap where the slice is unknown');
  assert.equal(
    els.some((e) => e.attrs.get('data-lease') === 'floors'),
    true,
  );
  assert.equal(
    els.some((e) => e.attrs.get('data-lease') === 'leased'),
    true,
  );
});

void test('the fault rect spans 10 s to 20 s on the time axis', () => {
  const els = parseXml(renderTimelineSvg(drillTimeline()));
  const root = els[0];
  const tMin = num(root, 'data-t-min');
  const tMax = num(root, 'data-t-max');
  const x0 = num(root, 'data-plot-x0');
  const x1 = num(root, 'data-plot-x1');
  assert.equal(tMin <= 0, true, `axis starts at or before 0 (${tMin})`);
  assert.equal(tMax >= 30, true, `axis covers the last sample (${tMax})`);
  const xOf = (s: number): number => x0 + ((s - tMin) / (tMax - tMin)) * (x1 - x0);
  const faults = els.filter((e) => e.name === 'rect' && e.attrs.get('data-event') === 'fault');
  assert.equal(faults.length, 2);
  const f = faults.find((e) => e.attrs.get('data-t0') === '10');
  assert.notEqual(f, undefined, 'a fault rect from 10 s');
  assert.equal(num(f, 'data-t1'), 20);
  assert.equal(Math.abs(num(f, 'x') - xOf(10)) <= 0.1, true, `x ${num(f, 'x')} vs ${xOf(10)}`);
  assert.equal(
    Math.abs(num(f, 'width') - (xOf(20) - xOf(10))) <= 0.2,
    true,
    `width ${num(f, 'width')} vs ${xOf(20) - xOf(10)}`,
  );
  // The x axis labels are at the positions of their values.
  const heal = els.find((e) => e.attrs.get('data-event') === 'heal');
  assert.equal(Math.abs(num(heal, 'x1') - xOf(20)) <= 0.1, true);
});

void test('the leader band shows n1, then no leader, then n2', () => {
  const svg = renderTimelineSvg(drillTimeline());
  const els = parseXml(svg);
  const leaders = els.filter((e) => e.attrs.has('data-leader')).map((e) => e.attrs.get('data-leader'));
  assert.deepEqual(leaders, ['n1', '', 'n2']);
  assert.equal(/>n1<\/text>/.test(svg), true, 'n1 written in its segment');
  assert.equal(/>n2<\/text>/.test(svg), true, 'n2 written in its segment');
});

void test('cell names with markup and odd characters are escaped', () => {
  const odd = ['a<b&"c"', "it's > x", '__proto__', 'ctl\u0001\uD800z', 'ünï ☃'];
  const svg = renderTimelineSvg(drillTimeline(odd));
  const els = parseXml(svg);
  assert.equal(svg.includes('a&lt;b&amp;&quot;c&quot;'), true, 'escaped in text');
  assert.equal(svg.includes('a<b'), false, 'no raw markup');
  assert.equal(svg.includes('\u0001'), false, 'no control characters');
  assert.equal(seriesCount(els, 'admitted:a<b&"c"'), 1, 'attribute value decodes to the name');
  assert.equal(seriesCount(els, "admitted:it's > x"), 1);
  assert.equal(seriesCount(els, 'admitted:__proto__'), 1);
  assert.equal(seriesCount(els, 'admitted:ünï ☃'), 1);
  const title = renderTimelineSvg({ ...drillTimeline(), title: '<script>&</script>', drill: 'x"y' });
  parseXml(title);
  assert.equal(title.includes('&lt;script&gt;&amp;&lt;/script&gt;'), true);
});

void test('niceTicks gives round, evenly spaced numbers covering the range', () => {
  assert.deepEqual(niceTicks(0, 100, 5), [0, 20, 40, 60, 80, 100]);
  assert.deepEqual(niceTicks(0, 1, 5), [0, 0.2, 0.4, 0.6, 0.8, 1]);
  assert.deepEqual(niceTicks(0, 30, 6), [0, 5, 10, 15, 20, 25, 30]);
  const cases: [number, number, number][] = [
    [0, 29.75, 10],
    [-3.7, 12.2, 4],
    [0.001, 0.0137, 5],
    [1234, 98765, 7],
    [0, 1100, 6],
    [-50, -2, 5],
    [0, 4000, 4],
    [7, 7.5, 3],
  ];
  for (const [lo, hi, n] of cases) {
    const ticks = niceTicks(lo, hi, n);
    const desc = `niceTicks(${lo}, ${hi}, ${n}) = ${JSON.stringify(ticks)}`;
    assert.equal(ticks.length >= 2, true, desc);
    assert.equal((ticks[0] ?? Infinity) <= lo, true, desc);
    assert.equal((ticks[ticks.length - 1] ?? -Infinity) >= hi, true, desc);
    assert.equal(ticks.length - 1 <= n * 2.5 && ticks.length - 1 >= n / 2.5, true, desc);
    const step = (ticks[1] ?? 0) - (ticks[0] ?? 0);
    const mant = step / 10 ** Math.floor(Math.log10(step) + 1e-9);
    assert.equal(
      [1, 2, 5, 10].some((m) => Math.abs(mant - m) < 1e-6),
      true,
      `step ${step}: ${desc}`,
    );
    for (let k = 1; k < ticks.length; k++) {
      assert.equal(Math.abs((ticks[k] ?? 0) - (ticks[k - 1] ?? 0) - step) < step * 1e-6, true, desc);
      assert.equal(String(ticks[k]).length <= 12, true, `no floating-point noise: ${desc}`);
    }
  }
  const same = niceTicks(5, 5, 5);
  assert.equal(
    same.length >= 2 && (same[0] ?? 9) <= 5 && (same[same.length - 1] ?? 0) >= 5,
    true,
    JSON.stringify(same),
  );
  assert.deepEqual(niceTicks(10, 0, 5), niceTicks(0, 10, 5));
  assert.deepEqual(niceTicks(Number.NaN, 1, 5), []);
  assert.deepEqual(niceTicks(0, Infinity, 5), []);
});

void test('an empty timeline renders a frame saying "no samples"', () => {
  const svg = renderTimelineSvg({ ...drillTimeline(), samples: [], events: [] });
  const els = parseXml(svg);
  assert.equal(els[0]?.name, 'svg');
  assert.equal(svg.includes('no samples'), true);
  assert.equal(svg.includes('partition-one-cell'), true);
  const bare = renderTimelineSvg({
    drill: '',
    title: '',
    quota: 0,
    bound: 0,
    cells: [],
    coordinators: [],
    startedAt: '',
    samples: [],
    events: [],
  });
  parseXml(bare);
  assert.equal(bare.includes('no samples'), true);
});

void test('one sample, and NaN/Infinity values, render without NaN in the output', () => {
  const one = renderTimelineSvg({
    ...drillTimeline(),
    samples: [
      sample(250, { admitted: { a: 10 }, global: 10, p99Ms: 0.9, slices: { a: 500 }, leased: { a: 1 }, leader: 'n1' }),
    ],
    events: [{ t: 0, kind: 'fault', label: 'open-ended fault' }],
    cells: ['a'],
  });
  const els = parseXml(one);
  assert.equal(/NaN|Infinity/.test(one), false);
  assert.equal(seriesCount(els, 'admitted:a'), 1, 'a lone point is still drawn');
  assert.equal(seriesCount(els, 'slices:a'), 1);
  const open = els.find((e) => e.attrs.get('data-event') === 'fault');
  assert.equal(open?.attrs.get('data-open'), '1');

  const bad = drillTimeline();
  const samples = bad.samples.map((s, i) =>
    i % 7 === 0
      ? {
          ...s,
          global: Number.NaN,
          p99Ms: Infinity,
          admitted: { ...s.admitted, [CELLS[0] ?? '']: -Infinity },
          slices: { ...s.slices, [CELLS[1] ?? '']: Number.NaN },
        }
      : s,
  );
  samples.push(sample(Number.NaN), sample(Infinity));
  const svg = renderTimelineSvg({
    ...bad,
    quota: Number.NaN,
    samples,
    events: [...bad.events, { t: Number.NaN, kind: 'note', label: 'lost' }],
  });
  const els2 = parseXml(svg);
  assert.equal(/NaN|Infinity/.test(svg), false, 'non-finite values are skipped');
  assert.equal(seriesCount(els2, `admitted:${CELLS[0] ?? ''}`), 1);
  assert.equal(svg.includes('>lost<'), false, 'an event at NaN is skipped');
});

void test('render an example (TIMELINE_CHART_OUT=path writes it for a look)', () => {
  const out = process.env['TIMELINE_CHART_OUT'];
  const svg = renderTimelineSvg(drillTimeline());
  if (out !== undefined && out !== '') writeFileSync(out, svg);
  assert.equal(svg.length > 1000, true);
});
