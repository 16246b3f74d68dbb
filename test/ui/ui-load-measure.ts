// Measures the live view's weight and load time with many tenants (the figures in docs/live-view.md):
//   node --import tsx test/ui/ui-load-measure.ts http://127.0.0.1:8081 100000 [TOKEN]
// Creates tenants load-0..load-(N-1) in tier 'demo' with `cellquota ctl tenants import` (those
// present come back unchanged), then loads /ui/ in headless Chromium five times and reports the bytes transferred (every response,
// as Chromium counts them) and the time from navigation to the first tenant page drawn.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { launchBrowser } from './browser.js';

const [base, countArg, token] = process.argv.slice(2);
if (base === undefined) {
  console.error('usage: ui-load-measure.ts ADMIN_URL [TENANTS] [TOKEN]');
  process.exit(2);
}
const count = Number(countArg ?? 100_000);
const auth: Record<string, string> = token === undefined ? {} : { authorization: `Bearer ${token}` };
const leader = (await (await fetch(`${base}/v1/cluster?stale=true`, { headers: auth })).json()) as {
  leader: string;
  members: { id: string; adminUrl: string }[];
};
const leaderUrl = leader.members.find((m) => m.id === leader.leader)?.adminUrl ?? base;
const have = (await (await fetch(`${base}/ui/api/state?size=1`, { headers: auth })).json()) as {
  tenants: { total: number };
};
if (have.tenants.total < count) {
  // Through `cellquota ctl tenants import` (batched POST /v1/tenants): tenants already there come back unchanged.
  const dir = mkdtempSync(join(tmpdir(), 'cq-ui-load-'));
  try {
    const file = join(dir, 'tenants.jsonl');
    writeFileSync(file, Array.from({ length: count }, (_, i) => `{"id":"load-${i}","tier":"demo"}`).join('\n') + '\n');
    const cli = resolve(import.meta.dirname, '../../cli/main.ts');
    const r = spawnSync(
      process.execPath,
      [
        '--import',
        'tsx',
        cli,
        'ctl',
        '--admin',
        leaderUrl,
        ...(token === undefined ? [] : ['--token', token]),
        'tenants',
        'import',
        file,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'], encoding: 'utf8' },
    );
    if (r.status !== 0) throw new Error(`tenants import failed (exit ${String(r.status)}): ${r.stdout}`);
    console.log(r.stdout.trim());
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
// Every tenant in the ledger (the load tenants and any others): what the page must show.
const total = (
  (await (await fetch(`${base}/ui/api/state?size=1`, { headers: auth })).json()) as { tenants: { total: number } }
).tenants.total;
const browser = await launchBrowser({ extraHTTPHeaders: auth });
try {
  for (let run = 0; run < 5; run++) {
    const page = await browser.context.newPage();
    const cdp = await browser.context.newCDPSession(page);
    await cdp.send('Network.enable');
    await cdp.send('Network.setCacheDisabled', { cacheDisabled: true });
    let bytes = 0;
    const byUrl = new Map<string, string>();
    cdp.on('Network.responseReceived', (e: { requestId: string; response: { url: string } }) =>
      byUrl.set(e.requestId, e.response.url),
    );
    const sizes: Record<string, number> = {};
    cdp.on('Network.loadingFinished', (e: { requestId: string; encodedDataLength: number }) => {
      bytes += e.encodedDataLength;
      const u = (byUrl.get(e.requestId) ?? '?').replace(/\?.*$/, '').replace(/^.*\//, '') || 'index';
      sizes[u] = (sizes[u] ?? 0) + e.encodedDataLength;
    });
    const t0 = Date.now();
    await page.goto(`${base}/ui/`);
    // Locators, not a function evaluated in the page: the live view's CSP (script-src 'self') forbids eval.
    await page
      .locator('#tenant-count', { hasText: `${total.toLocaleString('en-US')} in the ledger` })
      .waitFor({ timeout: 60_000 });
    await page.locator('#tenants tr').nth(49).waitFor({ timeout: 60_000 });
    const drawnMs = Date.now() - t0;
    const firstBytes = bytes;
    const firstSizes = { ...sizes };
    // One poll's document, for the steady-state traffic.
    const stateBytes = (await (await fetch(`${base}/ui/api/state?page=0&size=50&sort=busy`, { headers: auth })).text())
      .length;
    console.log(
      JSON.stringify({
        run,
        tenants: count,
        drawnMs,
        bytesUntilDrawn: firstBytes,
        perResource: firstSizes,
        stateDocumentBytes: stateBytes,
      }),
    );
    await page.close();
  }
  // The server side of one poll at this size, measured from outside.
  const times: number[] = [];
  for (let i = 0; i < 20; i++) {
    const t = performance.now();
    await (await fetch(`${base}/ui/api/state?page=0&size=50&sort=busy`, { headers: auth })).arrayBuffer();
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  console.log(
    JSON.stringify({ stateRequestMs: { median: Math.round(times[10] ?? 0), p90: Math.round(times[18] ?? 0) } }),
  );
} finally {
  await browser.close();
}
