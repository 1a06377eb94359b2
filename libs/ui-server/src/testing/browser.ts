import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe } from '@jest/globals';
import { chromium, type BrowserContext } from 'playwright-core';

export const CHROMIUM = process.env['BIS_CHROMIUM'] ?? '/usr/bin/chromium';

/** Why the browser specs cannot run on this machine; undefined when Chromium is there. */
export const browserMissing: string | undefined = existsSync(CHROMIUM)
  ? undefined
  : `${CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium), as .ci/run does, or set BIS_CHROMIUM`;

/** `describe` when Chromium is there; otherwise `describe.skip`, with a warning that names what is missing. */
export function describeWithBrowser(spec: string): typeof describe | typeof describe.skip {
  if (browserMissing === undefined) return describe;
  console.warn(`${spec} skipped: ${browserMissing}`);
  return describe.skip;
}

/** Debian's chromium driven by playwright-core, headless, with a fresh profile that is removed on close. */
export async function launchBrowser(): Promise<{ context: BrowserContext; close(): Promise<void> }> {
  if (browserMissing !== undefined) throw new Error(browserMissing);
  const profile = await mkdtemp(join(tmpdir(), 'bis-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 860 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  return {
    context,
    close: async () => {
      await context.close().catch(() => undefined);
      await rm(profile, { recursive: true, force: true });
    },
  };
}
