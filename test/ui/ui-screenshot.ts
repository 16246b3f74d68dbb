// Takes a screenshot of a running coordinator's live view in headless Chromium (the tests' browser):
//   node --import tsx test/ui/ui-screenshot.ts 'http://127.0.0.1:8081/ui/#tenant=acme' docs/live-view.png [TOKEN]
// The picture in docs/live-view.md comes from it, run against `cellquota dev --demo`.
import { launchBrowser } from './browser.js';

const [url, out, token] = process.argv.slice(2);
if (url === undefined || out === undefined) {
  console.error('usage: ui-screenshot.ts URL OUT.png [TOKEN]');
  process.exit(2);
}
const browser = await launchBrowser(
  token === undefined ? {} : { extraHTTPHeaders: { authorization: `Bearer ${token}` } },
);
try {
  const page = await browser.context.newPage();
  await page.setViewportSize({ width: 1440, height: 900 });
  await page.goto(url);
  // The chart draws once the chosen tenant has history.
  await page.waitForSelector('#chart canvas', { timeout: 30_000 });
  await page.waitForTimeout(Number(process.env['SHOT_DELAY_MS'] ?? 1500));
  await page.screenshot({ path: out });
  console.log(`wrote ${out}`);
} finally {
  await browser.close();
}
