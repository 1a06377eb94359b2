/**
 * The web UI end to end against the real system: `controller-manager standalone` (the built app, run as a child
 * process with a fresh data directory: embedded store, controllers, manager and data-source processes, REST API and
 * the built apps/ui/dist served at `/`), images from a loopback HTTP server, driven in headless Chromium.
 * With BIS_SCREENSHOTS=<dir> it also captures each page (`npm run screenshots`).
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { it, expect, beforeAll, afterAll } from '@jest/globals';
import type { Page } from 'playwright-core';
import { startFileServer } from '@bis/api-client/test-support';
import { describeWithBrowser, launchBrowser } from '@bis/ui-server/testing';
import { expectAttr, expectCount, expectDisabled, expectText, expectTextContaining, expectVisible, eventually } from './test-support/expect-eventually.js';
import { startStandaloneProcess, type StandaloneProcess } from './test-support/standalone-process.js';

const SHOTS = process.env['BIS_SCREENSHOTS'] ? resolve(process.env['BIS_WORKSPACE_ROOT'] ?? process.cwd(), process.env['BIS_SCREENSHOTS']) : undefined;

describeWithBrowser('ui.spec.ts')('web UI in headless Chromium against controller-manager standalone', () => {
  let sys: StandaloneProcess;
  let files: { url: string; close(): Promise<void> };
  let browser: Awaited<ReturnType<typeof launchBrowser>>;
  let page: Page;
  let dir: string;
  // Multiples of 512 bytes: the system zero-pads other sizes, and the SHA-512 covers the stored (padded) file.
  const image = randomBytes(6 << 20);
  const sha512 = createHash('sha512').update(image).digest('hex');
  const small = image.subarray(0, 2 << 20);
  const smallSha512 = createHash('sha512').update(small).digest('hex');
  const uploaded = randomBytes(24 << 20);
  const uploadedSha512 = createHash('sha512').update(uploaded).digest('hex');
  const shot = async (name: string): Promise<void> => {
    if (!SHOTS) return;
    await mkdir(SHOTS, { recursive: true });
    await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
  };
  const row = (name: string) => page.locator(`#images tr[data-name="${name}"]`);
  const readyDisks = () => page.locator('#disks tbody tr[data-disk]', { has: page.locator('[data-state=ready]') });
  /** Marks the loaded document; `expectSameDocument` fails if the page was reloaded since (live updates only). */
  const markDocument = () => page.evaluate(() => ((globalThis as unknown as { bisMark: number }).bisMark = 1));
  const expectSameDocument = async () => expect(await page.evaluate(() => (globalThis as unknown as { bisMark?: number }).bisMark)).toBe(1);

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'ui-e2e-'));
    files = await startFileServer({ '/images/ubuntu-24.04-minimal.raw': image, '/images/debian-12.raw': small });
    sys = await startStandaloneProcess({ disks: 3, allowSourceHosts: '127.0.0.1' });
    browser = await launchBrowser();
    page = await browser.context.newPage();
    page.setDefaultTimeout(60_000);
  }, 90_000);
  afterAll(async () => {
    await browser?.close();
    await sys?.stop();
    await files?.close();
    await rm(dir, { recursive: true, force: true });
  }, 60_000);

  it('serves the UI at / and keeps the REST API JSON at /v1; the empty list is live', async () => {
    const v1 = await fetch(`${sys.url}/v1`);
    expect(v1.headers.get('content-type')).toContain('application/json');
    expect(((await v1.json()) as { id: string }).id).toBe('v1');
    await page.goto(`${sys.url}/`);
    await expectText(page.locator('#live'), '● live');
    await page.locator('#images td.empty', { hasText: 'No backing images yet.' }).waitFor();
  });

  it('shows validation errors inline and creates an image from a URL that reaches ready without a reload', async () => {
    await page.click('#create-link');
    // Min copies starts from the setting the API applies to a request without one (3 here: 3 disks), not from 1.
    const setting = (await (await fetch(`${sys.url}/v1/settings/default-min-number-of-backing-image-copies`)).json()) as { value: string };
    expect(setting.value).toBe('3');
    await eventually(async () => expect(await page.inputValue('input[name=minCopies]')).toBe(setting.value), 30_000);
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
    await markDocument();
    await page.click('#create-submit');
    await page.waitForURL(/#\/images\/ubuntu-minimal$/);
    // The copies become ready through the websocket stream alone (at least the 2 requested).
    await eventually(async () => expect(await readyDisks().count()).toBeGreaterThanOrEqual(2), 60_000);
    await expectText(page.locator('#current-checksum'), sha512);
    await expectSameDocument();
  }, 90_000);

  it('uploads a file through the REST proxy with a progress bar, then the image is ready', async () => {
    const path = join(dir, 'cirros.img');
    await writeFile(path, uploaded);
    await page.goto(`${sys.url}/#/create`);
    await page.fill('input[name=name]', 'cirros-upload');
    await page.selectOption('select[name=sourceType]', 'upload');
    await page.setInputFiles('input[name=file]', path);
    await expectTextContaining(page.locator('[data-field=file] .hint'), 'cirros.img, 24.0 MiB');
    await markDocument();
    await page.click('#create-submit');
    await page.locator('#upload-panel [role=progressbar]').waitFor();
    await expectTextContaining(page.locator('#upload-panel h2'), 'Uploading cirros.img to cirros-upload');
    await page.waitForURL(/#\/images\/cirros-upload$/);
    await page.locator('#disks [data-state=ready]').first().waitFor();
    await expectText(page.locator('#current-checksum'), uploadedSha512);
    await expectSameDocument();
  }, 90_000);

  it('reports a bad checksum: the copy fails with both checksums and the list shows the all-failed icon', async () => {
    const wrong = 'e'.repeat(128);
    await page.goto(`${sys.url}/#/create`);
    await page.fill('input[name=name]', 'debian-bad-sum');
    await page.fill('input[name=url]', `${files.url}/images/debian-12.raw`);
    await page.fill('input[name=checksum]', wrong);
    await page.click('#create-submit');
    await page.waitForURL(/#\/images\/debian-bad-sum$/);
    // The data source's copy fails, then (Longhorn's BIDS flow) turns failed-and-cleanup once its file is removed;
    // how long `failed` stays visible depends on timing, so either state shows the failure.
    await page.locator('#disks [data-state=failed], #disks [data-state=failed-and-cleanup]').first().waitFor();
    await expectAttr(page.locator('#disks [data-message]'), 'data-message', new RegExp(`the expected checksum ${wrong} doesn't match the file actual checksum ${smallSha512}`));
    // The reason is text on the page (not only an icon's tooltip): in the copies table and in the events.
    await expectTextContaining(page.locator('#disks td.message').first(), `the expected checksum ${wrong} doesn't match`);
    const failedEvent = page.locator('#events tr[data-type=Warning][data-reason=Failed]').first();
    await failedEvent.waitFor();
    await expectTextContaining(failedEvent.locator('td.message'), `the expected checksum ${wrong} doesn't match the file actual checksum ${smallSha512}`);
    await expectVisible(page.locator('#events tr[data-reason=Create]'));
    await shot('detail-failed');
    await page.goto(`${sys.url}/#/`);
    await expectVisible(row('debian-bad-sum').locator('[data-icon=all-failed]'));
    // The list says why under the state.
    await expectTextContaining(row('debian-bad-sum').locator('[data-reason]'), "doesn't match");
  }, 90_000);

  it('opens the detail page: cleanup is refused below minimum copies, accepted after lowering them', async () => {
    await page.goto(`${sys.url}/#/`);
    await row('ubuntu-minimal').locator('a').click();
    await page.waitForURL(/#\/images\/ubuntu-minimal$/);
    await eventually(async () => expect(await readyDisks().count()).toBeGreaterThanOrEqual(2), 30_000);
    await expectText(page.locator('dl.props dd').nth(1), 'download');
    await shot('detail');
    await expectDisabled(page.locator('#cleanup-disks')); // nothing selected yet
    const ready = await readyDisks().evaluateAll((rows) => rows.map((r) => r.getAttribute('data-disk')!));
    for (const disk of ready) await page.locator(`#disks tr[data-disk="${disk}"] input[type=checkbox]`).check();
    await page.click('#cleanup-disks');
    await expectTextContaining(page.locator('.alert'), 'failed to do cleanup since there will be no enough ready files for HA after the deletion');
    expect(await readyDisks().count()).toBe(ready.length); // nothing was removed
    await page.fill('#min-copies', '1');
    await page.click('#update-min-copies');
    await expectText(page.locator('.notice'), 'Minimum copies set to 1.');
    const keep = ready[0]!;
    await page.locator(`#disks tr[data-disk="${keep}"] input[type=checkbox]`).uncheck(); // the refused selection stays
    for (const disk of ready.slice(1)) await page.locator(`#disks tr[data-disk="${disk}"] input[type=checkbox]`).check();
    await page.click('#cleanup-disks');
    await expectTextContaining(page.locator('.notice'), 'Cleaning up');
    await eventually(async () => expect(await page.locator('#disks tbody tr[data-disk]').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-disk')))).toEqual([keep]), 30_000);
  }, 90_000);

  it('backs up, deletes in a batch, and restores from the backups page', async () => {
    page.setDefaultTimeout(30_000); // each step fails on its own, well within the test's timeout
    await page.click('#backup');
    await expectText(page.locator('.notice'), 'Backup of ubuntu-minimal started.');
    await page.goto(`${sys.url}/#/backups`);
    await expectText(page.locator('#targets [data-target=default] .badge'), 'available');
    const bk = page.locator('#backups tr[data-backup^="ubuntu-minimal-"]');
    await bk.locator('[data-state=Completed]').waitFor({ timeout: 40_000 });
    await expectDisabled(bk.locator('button.restore')); // the image still exists

    await page.goto(`${sys.url}/#/`);
    await shot('list');
    await row('ubuntu-minimal').locator('input[type=checkbox]').check();
    await row('debian-bad-sum').locator('input[type=checkbox]').check();
    await page.click('#delete-selected');
    await page.click('#confirm-delete');
    for (const name of ['ubuntu-minimal', 'debian-bad-sum']) {
      await eventually(async () => expect(await row(name).count()).toBe(0), 40_000).catch(async (err: Error) => {
        const api = await (await fetch(`${sys.url}/v1/backingimages/${name}`)).text();
        throw new Error(`${name} was not deleted: row "${await row(name).textContent()}", API ${api}\n${err.message}`);
      });
    }

    await page.goto(`${sys.url}/#/backups`);
    await bk.locator('button.restore').click();
    await expectTextContaining(page.locator('.notice'), 'Restoring ubuntu-minimal');
    await shot('backups');
    await page.goto(`${sys.url}/#/images/ubuntu-minimal`);
    await page.locator('#disks [data-state=ready]').first().waitFor();
    await expectText(page.locator('#current-checksum'), sha512);
    await expectText(page.locator('dl.props dd').nth(1), 'restore');
  }, 240_000);
  it('the targets view shows each target with its message; an edit is saved and shown', async () => {
    // A secret without access keys (secrets are set through the API or bictl; the UI only names them).
    const put = await fetch(`${sys.url}/v1/secrets/no-keys`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ data: { AWS_ENDPOINTS: 'http://127.0.0.1:9' } }) });
    expect(put.status).toBe(200);
    await page.goto(`${sys.url}/#/`);
    await page.click('header nav a[href="#/targets"]');
    const t = page.locator('#target-list tr[data-target=default]');
    await expectText(t.locator('.badge'), 'available');
    const original = { url: (await t.locator('.url').textContent())!, poll: (await t.locator('.poll').textContent())! };
    expect(original.url).toMatch(/^vfs:\/\//);
    const edit = async (url: string, secret: string, poll: string): Promise<void> => {
      await t.locator('button.edit').click();
      const f = page.locator('tr[data-edit=default] form');
      await f.locator('input[name=url]').fill(url);
      await f.locator('input[name=secret]').fill(secret);
      await f.locator('input[name=pollInterval]').fill(poll);
      await f.locator('button.save').click();
      await expectText(page.locator('.notice'), 'Saved backup target default.');
    };
    await edit('s3://bis-bucket@us-east-1/', 'no-keys', '3s');
    await expectText(t.locator('.url'), 's3://bis-bucket@us-east-1/');
    await expectText(t.locator('.secret'), 'no-keys');
    await expectText(t.locator('.poll'), '3s');
    await expectText(t.locator('.badge'), 'unavailable');
    await expectTextContaining(t.locator('.message'), 'missing AWS_ACCESS_KEY_ID');
    await shot('targets');
    await edit(original.url, '', original.poll);
    await expectText(t.locator('.secret'), '—');
    await expectText(t.locator('.badge'), 'available');
  }, 90_000);
});
