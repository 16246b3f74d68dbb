// Real headless Chromium for the live view's tests: Debian's chromium driven by playwright-core, a
// fresh profile per launch. `chromiumPath()` is null when it is not installed (CI installs it).
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext } from 'playwright-core';

export const CHROMIUM = process.env['CHROMIUM'] ?? '/usr/bin/chromium';

export function chromiumPath(): string | null {
  return existsSync(CHROMIUM) ? CHROMIUM : null;
}

export interface Browser {
  readonly context: BrowserContext;
  close(): Promise<void>;
}

export async function launchBrowser(
  opts: { readonly extraHTTPHeaders?: Record<string, string> } = {},
): Promise<Browser> {
  const profile = mkdtempSync(join(tmpdir(), 'cq-chromium-'));
  // launchPersistentContext passes the fresh profile as --user-data-dir.
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    viewport: { width: 1366, height: 768 },
    ...(opts.extraHTTPHeaders === undefined ? {} : { extraHTTPHeaders: opts.extraHTTPHeaders }),
  });
  return {
    context,
    close: async () => {
      await context.close().catch(() => undefined);
      rmSync(profile, { recursive: true, force: true });
    },
  };
}
