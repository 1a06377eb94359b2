import { createHash, randomBytes } from 'node:crypto';
import { openAsBlob } from 'node:fs';
import { gunzipSync } from 'node:zlib';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { ApiClientError, BisClient, summariseCopies, type BackingImage } from './index.js';
import { startApiDouble, startFileServer, startFlakyProxy, type ApiDouble } from './test-support/index.js';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const allReady = (n: number) => (bi: BackingImage) => summariseCopies(bi).ready >= n;
const failedCopy = (bi: BackingImage): string | undefined => Object.values(bi.diskFileStatusMap).find((f) => f.state === 'failed')?.message;

describe('BisClient against a live API', () => {
  let api: ApiDouble;
  let files: { url: string; close(): Promise<void> };
  let dir: string;
  const image = randomBytes(3 << 20);
  const sha512 = createHash('sha512').update(image).digest('hex');

  beforeAll(async () => {
    api = await startApiDouble({ disks: 3, stepMs: 20 });
    files = await startFileServer({ '/img.raw': image });
    dir = await mkdtemp(join(tmpdir(), 'api-client-'));
  });
  afterAll(async () => {
    await files.close();
    await api.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('creates an image from a URL, waits for its copies and downloads the same bytes', async () => {
    const c = new BisClient({ server: `${api.url}/v1/` });
    const created = await c.createBackingImage({ name: 'from-url', sourceType: 'download', parameters: { url: `${files.url}/img.raw` }, expectedChecksum: sha512, minNumberOfCopies: 2 });
    expect(created.id).toBe('from-url');
    expect(created.links.self).toBe(`${api.url}/v1/backingimages/from-url`);
    const bi = await c.waitForBackingImage('from-url', allReady(2), { timeoutMs: 10_000, intervalMs: 50, failed: failedCopy });
    expect(bi.currentChecksum).toBe(sha512);
    expect(bi.size).toBe(image.length);
    const res = await c.download('from-url');
    expect(res.headers.get('content-disposition')).toBe('attachment; filename=from-url.gz');
    const got = gunzipSync(Buffer.from(await res.arrayBuffer()));
    expect(createHash('sha512').update(got).digest('hex')).toBe(sha512);
    expect((await c.listBackingImages()).map((b) => b.name)).toContain('from-url');
  });

  it('reports a checksum mismatch as the failed copy message', async () => {
    const c = new BisClient({ server: api.url });
    await c.createBackingImage({ name: 'bad-sum', sourceType: 'download', parameters: { url: `${files.url}/img.raw` }, expectedChecksum: 'a'.repeat(128) });
    await expect(c.waitForBackingImage('bad-sum', allReady(1), { timeoutMs: 10_000, intervalMs: 50, failed: failedCopy })).rejects.toThrow(/expected checksum a+ doesn't match the file actual checksum/);
  });

  it('turns error bodies into typed errors', async () => {
    const c = new BisClient({ server: api.url });
    const nf = await c.getBackingImage('missing').catch((e: unknown) => e);
    expect(nf).toBeInstanceOf(ApiClientError);
    expect((nf as ApiClientError).kind).toBe('not-found');
    expect((nf as ApiClientError).message).toContain('"missing" not found');
    await expect(c.createBackingImage({ name: 'no-url', sourceType: 'download', parameters: {} })).rejects.toThrow('url is required');
    const down = new BisClient({ server: 'http://127.0.0.1:1' });
    const ne = await down.listBackingImages().catch((e: unknown) => e);
    expect((ne as ApiClientError).kind).toBe('network');
    const timeout = await c.waitForBackingImage('from-url', () => false, { timeoutMs: 100, intervalMs: 20 }).catch((e: unknown) => e);
    expect((timeout as ApiClientError).kind).toBe('timeout');
  });

  it('resumes an upload after the connection drops in the middle of a part', async () => {
    const proxy = await startFlakyProxy(api.url, { cutAfterBytes: (1 << 20) + 300_000, cuts: 2 });
    try {
      const path = join(dir, 'up.raw');
      await writeFile(path, image);
      const c = new BisClient({ server: proxy.url });
      await c.createBackingImage({ name: 'uploaded', sourceType: 'upload', parameters: {}, expectedChecksum: sha512 });
      const seen: number[] = [];
      let resumes = 0;
      await c.uploadBackingImage('uploaded', await openAsBlob(path), { partSize: 1 << 20, retryDelayMs: 20, onProgress: (p) => (seen.push(p.offset), (resumes = p.resumes)) });
      expect(proxy.cutsDone()).toBe(2);
      // Each cut forces a resume; on a loaded machine a part can also be answered 409 (the cut part partly landed)
      // or time out, which is one more resume of the same kind, so only the lower bound is exact.
      expect(resumes).toBeGreaterThanOrEqual(2);
      expect(seen.at(-1)).toBe(image.length);
      const bi = await c.waitForBackingImage('uploaded', allReady(1), { timeoutMs: 10_000, intervalMs: 50, failed: failedCopy });
      expect(bi.currentChecksum).toBe(sha512);
    } finally {
      await proxy.close();
    }
  });

  it('stops waiting for an upload server when the caller learns the server failed the upload', async () => {
    const c = new BisClient({ server: api.url });
    // an image with no upload server: the client would wait for one up to readyTimeoutMs (2 min)
    await c.createBackingImage({ name: 'no-upload-server', sourceType: 'download', parameters: { url: `${files.url}/img.raw` } });
    const path = join(dir, 'small.raw');
    await writeFile(path, image.subarray(0, 4096));
    let asked = 0;
    const err = await c
      .uploadBackingImage('no-upload-server', await openAsBlob(path), {
        failure: async () => (++asked >= 2 ? new Error('the upload of backing image no-upload-server failed on the server') : undefined),
      })
      .catch((e: unknown) => e);
    expect((err as Error).message).toBe('the upload of backing image no-upload-server failed on the server');
    expect(asked).toBe(2);
  }, 10_000);

  it('runs the image actions: cleanup guard, min copies, backup, restore, delete', async () => {
    const c = new BisClient({ server: api.url });
    await expect(c.cleanupBackingImage('from-url', Object.keys((await c.getBackingImage('from-url')).diskFileStatusMap))).rejects.toThrow('no enough ready files for HA');
    await c.updateMinNumberOfCopies('from-url', 3);
    const three = await c.waitForBackingImage('from-url', allReady(3), { timeoutMs: 10_000, intervalMs: 50 });
    const disk = Object.keys(three.diskFileStatusMap)[2];
    await expect(c.updateMinNumberOfCopies('from-url', 0)).rejects.toThrow('must larger than 0');
    await c.updateMinNumberOfCopies('from-url', 2);
    const cleaned = await c.cleanupBackingImage('from-url', [disk]);
    expect(Object.keys(cleaned.diskFileStatusMap)).not.toContain(disk);

    await c.backupBackingImage('from-url');
    let backups = await c.listBackups();
    for (let i = 0; i < 100 && !backups.every((b) => b.state === 'Completed'); i++) {
      await new Promise((r) => setTimeout(r, 50));
      backups = await c.listBackups();
    }
    const bk = backups.find((b) => b.backingImageName === 'from-url');
    expect(bk?.state).toBe('Completed');
    await expect(c.restoreBackup(bk!.name)).rejects.toThrow('already exists');
    await c.deleteBackingImage('from-url');
    for (let i = 0; i < 100 && (await c.listBackingImages()).some((b) => b.name === 'from-url'); i++) await new Promise((r) => setTimeout(r, 20));
    await c.restoreBackup(bk!.name);
    const restored = await c.waitForBackingImage('from-url', allReady(1), { timeoutMs: 10_000, intervalMs: 50, failed: failedCopy });
    expect(restored.sourceType).toBe('restore');
    expect(restored.currentChecksum).toBe(sha512);
    await c.deleteBackup(bk!.name);
    expect(await c.listBackups()).toEqual([]);
  });

  it('lists and evicts nodes', async () => {
    const c = new BisClient({ server: api.url });
    const [n] = await c.listNodes();
    expect(Object.values(n.disks).map((d) => d.diskUUID)).toEqual(api.disks);
    const after = await c.evictNode(n.name);
    expect(after.evictionRequested).toBe(true);
    expect(after.allowScheduling).toBe(false);
  });
});
