/**
 * The web UI end to end: the built app (apps/ui/dist) served by @bis/ui-server next to a live REST API, driven in
 * headless Chromium. With BIS_SCREENSHOTS=<dir> it also captures each page (`npm run screenshots`).
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, it, beforeAll, afterAll } from '@jest/globals';
import type { Page } from 'playwright-core';
import { uiServerPlugin } from '@bis/ui-server';
import { startApiDouble, startFileServer, type ApiDouble } from '@bis/api-client/test-support';
import { launchBrowser } from './test-support/browser.js';
import { expectAttr, expectCount, expectDisabled, expectText, expectTextContaining, expectVisible } from './test-support/expect-eventually.js';

const UI_DIST = resolve(import.meta.dirname, '../dist');
const SHOTS = process.env['BIS_SCREENSHOTS'] ? resolve(process.env['BIS_WORKSPACE_ROOT'] ?? process.cwd(), process.env['BIS_SCREENSHOTS']) : undefined;

describe('web UI in headless Chromium', () => {
  let api: ApiDouble;
  let files: { url: string; close(): Promise<void> };
  let browser: Awaited<ReturnType<typeof launchBrowser>>;
  let page: Page;
  let dir: string;
  const image = randomBytes(6 << 20);
  const sha512 = createHash('sha512').update(image).digest('hex');
  const shot = async (name: string): Promise<void> => {
    if (!SHOTS) return;
    await mkdir(SHOTS, { recursive: true });
    await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
  };
  const row = (name: string) => page.locator(`#images tr[data-name="${name}"]`);

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'ui-e2e-'));
    files = await startFileServer({ '/images/ubuntu-24.04-minimal.raw': image, '/images/debian-12.qcow2': image.subarray(0, 2 << 20) });
    api = await startApiDouble({ disks: 3, stepMs: 300, register: async (app) => app.register(uiServerPlugin, { root: UI_DIST }) });
    browser = await launchBrowser();
    page = await browser.context.newPage();
    page.setDefaultTimeout(15_000);
  }, 60_000);
  afterAll(async () => {
    await browser?.close();
    await api?.close();
    await files?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('shows the empty list with live updates connected', async () => {
    await page.goto(`${api.url}/`);
    await expectText(page.locator('#live'), '● live');
    await page.locator('#images td.empty', { hasText: 'No backing images yet.' }).waitFor();
  });

  it('shows validation errors inline and creates an image from a URL that reaches ready', async () => {
    await page.click('#create-link');
    await page.click('#create-submit');
    await expectText(page.locator('[data-field=name] .error'), 'A name is required.');
    await expectText(page.locator('[data-field=url] .error'), 'A download URL is required.');
    await page.fill('input[name=name]', 'Bad Name');
    await page.fill('input[name=url]', 'ftp://x');
    await page.fill('input[name=checksum]', 'abc');
    await expectTextContaining(page.locator('[data-field=name] .error'), 'lowercase letters');
    await expectText(page.locator('[data-field=url] .error'), 'The URL must start with http:// or https://.');
    await expectTextContaining(page.locator('[data-field=checksum] .error'), 'a sha512 checksum has 128 hex characters, got 3');
    await page.fill('input[name=name]', 'ubuntu-minimal');
    await page.fill('input[name=url]', `${files.url}/images/ubuntu-24.04-minimal.raw`);
    await page.fill('input[name=checksum]', sha512);
    await page.fill('input[name=minCopies]', '2');
    await expectCount(page.locator('.field .error'), 0);
    await shot('create');
    await page.click('#create-submit');
    await page.waitForURL(/#\/images\/ubuntu-minimal$/);
    // Live progress without reloading: some copy is seen in progress, then two are ready.
    await page.locator('#disks [data-state=ready]').nth(1).waitFor();
    await expectText(page.locator('#current-checksum'), sha512);
    await expectCount(page.locator('#disks tbody tr'), 2);
  });

  it('uploads a file with a progress bar and opens its detail page', async () => {
    const path = join(dir, 'cirros.img');
    await writeFile(path, image);
    await page.goto(`${api.url}/#/create`);
    await page.fill('input[name=name]', 'cirros-upload');
    await page.selectOption('select[name=sourceType]', 'upload');
    await page.setInputFiles('input[name=file]', path);
    await expectTextContaining(page.locator('[data-field=file] .hint'), 'cirros.img, 6.00 MiB');
    await page.click('#create-submit');
    await page.locator('#upload-panel [role=progressbar]').waitFor();
    await page.waitForURL(/#\/images\/cirros-upload$/);
    await page.locator('#disks [data-state=ready]').first().waitFor();
    await expectText(page.locator('#current-checksum'), sha512);
  });

  it('reports a bad checksum: the copy fails with the message and the list shows the all-failed icon', async () => {
    await page.goto(`${api.url}/#/create`);
    await page.fill('input[name=name]', 'debian-bad-sum');
    await page.fill('input[name=url]', `${files.url}/images/debian-12.qcow2`);
    await page.fill('input[name=checksum]', `sha256:${'0'.repeat(64)}`);
    await page.click('#create-submit');
    await page.waitForURL(/#\/images\/debian-bad-sum$/);
    const failed = page.locator('#disks [data-state=failed]');
    await failed.waitFor();
    await expectAttr(page.locator('#disks [data-message]'), 'data-message', /the expected checksum 0{64} doesn't match the file actual checksum [0-9a-f]{64}/);
    await page.goto(`${api.url}/#/`);
    await expectVisible(row('debian-bad-sum').locator('[data-icon=all-failed]'));
  });

  it('opens the detail page, updates min copies and cleans up a disk', async () => {
    await page.goto(`${api.url}/#/`);
    await row('ubuntu-minimal').locator('a').click();
    await page.locator('#disks [data-state=ready]').nth(1).waitFor();
    await shot('detail');
    await expectDisabled(page.locator('#cleanup-disks')); // nothing selected yet
    await page.locator('#disks tbody input[type=checkbox]').first().check();
    await page.click('#cleanup-disks');
    await expectTextContaining(page.locator('.alert'), 'no enough ready files for HA');
    await page.fill('#min-copies', '1');
    await page.click('#update-min-copies');
    await expectText(page.locator('.notice'), 'Minimum copies set to 1.');
    await page.locator('#disks tbody input[type=checkbox]').first().check();
    await page.click('#cleanup-disks');
    await expectCount(page.locator('#disks tbody tr'), 1);
  });

  it('backs up, deletes in a batch, and restores from the backups page', async () => {
    await page.click('#backup');
    await expectText(page.locator('.notice'), 'Backup of ubuntu-minimal started.');
    await page.goto(`${api.url}/#/backups`);
    await expectText(page.locator('#targets [data-target=default] .badge'), 'available');
    const bk = page.locator('#backups tr[data-backup^="ubuntu-minimal-"]');
    await bk.locator('[data-state=Completed]').waitFor();
    await expectDisabled(bk.locator('button.restore')); // the image still exists

    await page.goto(`${api.url}/#/`);
    await shot('list');
    await row('ubuntu-minimal').locator('input[type=checkbox]').check();
    await row('debian-bad-sum').locator('input[type=checkbox]').check();
    await page.click('#delete-selected');
    await page.click('#confirm-delete');
    await expectCount(row('ubuntu-minimal'), 0);
    await expectCount(row('debian-bad-sum'), 0);

    await page.goto(`${api.url}/#/backups`);
    await bk.locator('button.restore').click();
    await expectTextContaining(page.locator('.notice'), 'Restoring ubuntu-minimal');
    await shot('backups');
    await page.goto(`${api.url}/#/images/ubuntu-minimal`);
    await page.locator('#disks [data-state=ready]').first().waitFor();
    await expectText(page.locator('#current-checksum'), sha512);
    await expectText(page.locator('dl.props dd').nth(1), 'restore');
  });
});
