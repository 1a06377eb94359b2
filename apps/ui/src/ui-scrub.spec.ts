/**
 * The disks' background scrub in the web UI, against `controller-manager standalone` (the built app as a child
 * process, one disk) in headless Chromium: before a pass the copy's disk says so; after the manager restarted with a
 * 2 s scrub interval (a daemon flag) has verified the ready copy, the detail page shows `scrub: ok … ago` under the disk.
 */
import { randomBytes } from 'node:crypto';
import { readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import type { Page } from 'playwright-core';
import { BisClient } from '@bis/api-client';
import { startFileServer } from '@bis/api-client/test-support';
import { launchBrowser } from '@bis/ui-server/testing';
import { eventually, expectAttr, expectTextContaining } from './test-support/expect-eventually.js';
import { startStandaloneProcess, type StandaloneProcess } from './test-support/standalone-process.js';

describe('web UI: each disk shows its last scrub', () => {
  let sys: StandaloneProcess;
  let files: { url: string; close(): Promise<void> };
  let browser: Awaited<ReturnType<typeof launchBrowser>>;
  let page: Page;

  beforeAll(async () => {
    files = await startFileServer({ '/images/tiny.raw': randomBytes(1 << 20) });
    sys = await startStandaloneProcess({ disks: 1, allowSourceHosts: '127.0.0.1' });
    browser = await launchBrowser();
    page = await browser.context.newPage();
    page.setDefaultTimeout(60_000);
  }, 90_000);
  afterAll(async () => {
    await browser?.close();
    await sys?.stop();
    await files?.close();
  }, 60_000);

  /** The pid the system recorded for its manager process (under <data-dir>/processes). */
  async function managerPid(): Promise<number | undefined> {
    const dir = join(sys.dataDir, 'processes');
    for (const f of await readdir(dir).catch(() => [] as string[])) {
      const rec = JSON.parse(await readFile(join(dir, f), 'utf8').catch(() => '{}')) as { name?: string; pid?: number };
      if (rec.name?.startsWith('bim-') && rec.pid) return rec.pid;
    }
    return undefined;
  }

  it('shows "not yet" before the first pass, then "ok … ago" after the scrub verified the ready copy', async () => {
    const api = new BisClient({ server: sys.url });
    await api.createBackingImage({ name: 'tiny', sourceType: 'download', parameters: { url: `${files.url}/images/tiny.raw` }, minNumberOfCopies: 1 });
    await page.goto(`${sys.url}/#/images/tiny`);
    await page.locator('#disks [data-state=ready]').first().waitFor();
    // the default interval is 7 days: no pass yet
    await expectAttr(page.locator('#disks [data-scrub]'), 'data-scrub', /^none$/);
    await expectTextContaining(page.locator('#disks .scrub'), 'scrub: not yet');

    // the scrub interval is a flag of the manager: set it, then end the manager; the system starts it again with it
    const res = await fetch(`${sys.url}/v1/settings/backing-image-scrub-interval`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ value: '2' }) });
    expect(res.status).toBe(200);
    const pid = await managerPid();
    expect(pid).toBeDefined();
    process.kill(pid!, 'SIGKILL');
    await eventually(async () => {
      const again = await managerPid();
      expect(again !== undefined && again !== pid).toBe(true);
    }, 60_000);

    // a pass 2 s after the manager's start; the page reads the node list every 5 s
    await eventually(async () => expect(await page.locator('#disks [data-scrub]').first().getAttribute('data-scrub')).toBe('ok'), 90_000);
    await expectTextContaining(page.locator('#disks .scrub'), 'scrub: ok');
    expect(await page.locator('#disks .scrub').first().textContent()).toMatch(/^scrub: ok \d+[smhd] ago$/);
    await expectAttr(page.locator('#disks .scrub'), 'title', /copies verified/);
    // what the page shows comes from the node list of the REST API
    const [node] = await api.listNodes();
    const disk = Object.values(node!.disks)[0]!;
    expect(disk.scrub?.lastScrubResult).toBe('ok');
    expect(disk.scrub?.lastScrubFiles).toBeGreaterThanOrEqual(1);
  }, 180_000);
});
