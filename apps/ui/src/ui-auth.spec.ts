/**
 * The web UI against `controller-manager standalone --auth-token-file` (the built app as a child process, the built
 * apps/ui/dist at `/`), in headless Chromium: the API answers 401 until the page sends the token, so the page asks
 * for it, refuses a wrong one, then shows the list (REST calls with `authorization: Bearer`, the websocket streams
 * with `access_token`) and keeps working after a reload in the same tab (sessionStorage).
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { it, expect, beforeAll, afterAll } from '@jest/globals';
import type { Page } from 'playwright-core';
import { BisClient } from '@bis/api-client';
import { startFileServer } from '@bis/api-client/test-support';
import { describeWithBrowser, launchBrowser } from '@bis/ui-server/testing';
import { expectText, expectVisible } from './test-support/expect-eventually.js';
import { startStandaloneProcess, type StandaloneProcess } from './test-support/standalone-process.js';

describeWithBrowser('ui-auth.spec.ts')('web UI with a REST token (controller-manager standalone --auth-token-file)', () => {
  const token = randomBytes(32).toString('base64url');
  let dir: string;
  let sys: StandaloneProcess;
  let files: { url: string; close(): Promise<void> };
  let browser: Awaited<ReturnType<typeof launchBrowser>>;
  let page: Page;
  type TabStorage = { sessionStorage: { getItem(k: string): string | null; setItem(k: string, v: string): void } };
  const storedToken = () => page.evaluate(() => (globalThis as unknown as TabStorage).sessionStorage.getItem('bis.api-token'));
  const storeToken = (v: string) => page.evaluate((t) => (globalThis as unknown as TabStorage).sessionStorage.setItem('bis.api-token', t), v);

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'ui-auth-'));
    const tokenFile = join(dir, 'rest-token');
    await writeFile(tokenFile, `${token}\n`, { mode: 0o600 });
    files = await startFileServer({ '/images/tiny.raw': randomBytes(1 << 20) });
    sys = await startStandaloneProcess({ disks: 1, allowSourceHosts: '127.0.0.1', extraArgs: ['--auth-token-file', tokenFile] });
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

  it('asks for the token, refuses a wrong one, shows the live list with the right one and keeps it across a reload', async () => {
    // The API itself: 401 without the token; an image created with it.
    expect((await fetch(`${sys.url}/v1/backingimages`)).status).toBe(401);
    const api = new BisClient({ server: sys.url, token });
    await api.createBackingImage({ name: 'tiny', sourceType: 'download', parameters: { url: `${files.url}/images/tiny.raw` }, minNumberOfCopies: 1 });

    const apiRequests: { url: string; authorization?: string }[] = [];
    page.on('request', (r) => {
      if (new URL(r.url()).pathname.startsWith('/v1/')) apiRequests.push({ url: r.url(), authorization: r.headers()['authorization'] });
    });
    const websockets: string[] = [];
    page.on('websocket', (ws) => websockets.push(ws.url()));

    await page.goto(`${sys.url}/`);
    await expectVisible(page.locator('#token-form'));
    expect(await page.locator('#token-input').getAttribute('type')).toBe('password');
    expect(await page.locator('#images').count()).toBe(0);

    // A wrong token: refused, the form again with an error, nothing stored.
    await page.fill('#token-input', 'not-the-token-0123456789');
    await page.click('#token-submit');
    await expectText(page.locator('#token-error'), 'The token was refused. Check it and try again.');
    await expectVisible(page.locator('#token-form'));
    expect(await storedToken()).toBeNull();

    // The right one: the list, live (the websocket streams carry access_token).
    await page.fill('#token-input', token);
    await page.click('#token-submit');
    await page.locator('#images tr[data-name="tiny"]').waitFor();
    await expectText(page.locator('#live'), '● live');
    expect(await page.locator('#token-form').count()).toBe(0);
    expect(await storedToken()).toBe(token);
    expect(apiRequests.some((r) => r.authorization === `Bearer ${token}` && new URL(r.url).pathname === '/v1/nodes')).toBe(true);
    // The streams that made the page live carry the token in the URL (a browser cannot set their headers).
    expect(websockets.some((u) => new URL(u).pathname === '/v1/ws/500ms/backingimages' && new URL(u).searchParams.get('access_token') === token)).toBe(true);

    // A reload in the same tab: no form, the list again with the stored token.
    apiRequests.length = 0;
    await page.reload();
    await page.locator('#images tr[data-name="tiny"]').waitFor();
    await expectText(page.locator('#live'), '● live');
    expect(await page.locator('#token-form').count()).toBe(0);
    expect(apiRequests.length).toBeGreaterThan(0);
    expect(apiRequests.every((r) => r.authorization === `Bearer ${token}`)).toBe(true);

    // A token that stops working (e.g. replaced on the server) shows the form again, with the error.
    await storeToken('an-old-token-0123456789');
    await page.reload();
    await expectText(page.locator('#token-error'), 'The token was refused. Check it and try again.');
    expect(await storedToken()).toBeNull();
  }, 120_000);
});
