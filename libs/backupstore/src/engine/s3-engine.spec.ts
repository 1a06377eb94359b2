import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { S3Driver } from '../drivers/s3.js';
import { blockChecksum, blockPath } from '../names.js';
import { parseTargetUrl, type S3TargetLocation } from '../url.js';
import { createBackup, startBackup } from './backup.js';
import { restoreBackup } from './restore.js';
import { deleteBackup, inspectBackup, listBackingImageBackups, verifyTarget } from './maintenance.js';
import { FAST_LOCKS, patternBlock, sha512File, tempDir, writeImage, type Piece } from '../test-support/images.js';
import { S3_TEST_CREDENTIAL, startS3Server, type S3TestServer } from '../test-support/s3-server.js';
import { startConnectProxy } from '../test-support/connect-proxy.js';
import { bypassesProxy, proxyFor } from '../drivers/proxy.js';

let work: string;
let server: S3TestServer;
let credential: Record<string, string>;
const TARGET = 's3://backups@us-east-1/longhorn/';

beforeAll(async () => {
  work = await tempDir();
  server = await startS3Server(path.join(work, 's3'), 'backups');
  credential = { ...S3_TEST_CREDENTIAL, AWS_ENDPOINTS: server.endpoint };
});
afterAll(async () => {
  await server.stop();
  await fs.rm(work, { recursive: true, force: true });
});

describe('S3 driver', () => {
  it('implements the store primitives against a real S3 server', async () => {
    const d = new S3Driver(parseTargetUrl(TARGET) as S3TargetLocation, credential, { maxAttempts: 2 });
    try {
      expect(d.url).toBe('s3://backups@us-east-1/longhorn');
      expect(await d.list('x')).toEqual([]);
      await d.write('x/a/1.txt', 'one');
      await d.write('x/a/2.txt', Buffer.from('two'));
      await d.write('x/b.txt', 'b');
      expect(await d.list('x')).toEqual(['a', 'b.txt']);
      expect(await d.list('x/a')).toEqual(['1.txt', '2.txt']);
      expect((await d.read('x/a/2.txt')).toString()).toBe('two');
      expect(await d.exists('x/a/1.txt')).toBe(true);
      expect(await d.exists('x/a')).toBe(false);
      expect((await d.modificationTime('x/b.txt')).getTime()).toBeGreaterThan(Date.now() - 60_000);
      await expect(d.read('x/none')).rejects.toMatchObject({ code: 'NotFound' });
      await d.remove('x/a');
      expect(await d.list('x')).toEqual(['b.txt']);
      await d.remove('x/b.txt');
      expect(await d.list('x')).toEqual([]);
    } finally {
      await d.close();
    }
  });

  it('takes its configuration only from the per-call credential', () => {
    const loc = parseTargetUrl(TARGET) as S3TargetLocation;
    expect(() => new S3Driver(loc, {})).toThrow(/missing AWS_ACCESS_KEY_ID/);
    expect(() => new S3Driver(loc, { AWS_ACCESS_KEY_ID: 'x' })).toThrow(/both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY/);
    expect(() => new S3Driver(loc, { ...credential, AWS_CERT: 'nope' })).toThrow(/AWS_CERT does not contain a PEM certificate/);
  });
});

describe.each(['none', 'lz4', 'gzip'] as const)('round trip with %s over S3', (compression) => {
  it('backs up, lists, inspects, verifies, restores and deletes', async () => {
    const name = `s3-${compression}`;
    const image = path.join(work, `${name}.img`);
    const src = await writeImage(image, [{ kind: 'data', seed: 1 }, { kind: 'hole' }, { kind: 'data', seed: 2 }, { kind: 'zeros' }, { kind: 'random' }], 777);
    const r = await createBackup({ target: TARGET, name, filePath: image, compression, concurrency: 3, credential, lockTiming: FAST_LOCKS });
    expect(r).toMatchObject({ backupUrl: `${TARGET}?backingImage=${name}`, sha512: src.sha512, blockCount: 4 });
    const info = await inspectBackup(r.backupUrl, { credential });
    expect(info).toMatchObject({ url: `s3://backups@us-east-1/longhorn?backingImage=${name}`, size: src.size, compressionMethod: compression });
    expect((await listBackingImageBackups(TARGET, { credential })).map((e) => e.name)).toContain(name);
    expect((await verifyTarget(TARGET, { credential, lockTiming: FAST_LOCKS })).ok).toBe(true);
    const out = path.join(work, `${name}.out`);
    const restored = await restoreBackup({ backupUrl: r.backupUrl, output: out, concurrency: 3, credential, lockTiming: FAST_LOCKS });
    expect(restored.sha512).toBe(src.sha512);
    expect(await sha512File(out)).toBe(src.sha512);
    const del = await deleteBackup(r.backupUrl, { credential, lockTiming: FAST_LOCKS });
    expect(del.configRemoved).toBe(true);
    await expect(inspectBackup(r.backupUrl, { credential })).rejects.toThrow(/cannot find .*backing-image.cfg in backupstore/);
  });
});

describe('S3 outage', () => {
  it('a server stopped mid-backup gives a clean failure, and a retry completes', async () => {
    const dir = path.join(work, 's3-outage');
    let s = await startS3Server(dir, 'backups');
    const port = s.port;
    const cred = { ...S3_TEST_CREDENTIAL, AWS_ENDPOINTS: s.endpoint };
    const image = path.join(work, 'outage.img');
    const src = await writeImage(image, Array.from({ length: 16 }, (_, i) => ({ kind: 'data', seed: 300 + i }) as Piece));
    const name = 'outage';
    const op = startBackup({
      target: TARGET, name, filePath: image, compression: 'gzip', concurrency: 1, credential: cred, lockTiming: FAST_LOCKS,
      driverOptions: { s3: { maxAttempts: 3, retryWindowMs: 0 } },
    });
    while (op.status().uploadedBlocks < 3 && op.status().state === 'in_progress') await new Promise((r) => setTimeout(r, 5));
    await s.stop();
    await expect(op.done).rejects.toMatchObject({ code: 'Io', message: expect.stringMatching(/^s3 (put|head) longhorn\/backupstore\/.* failed/) });
    expect(op.status().state).toBe('error');
    const uploadedBefore = op.status().uploadedBlocks;
    expect(uploadedBefore).toBeGreaterThanOrEqual(3);
    expect(uploadedBefore).toBeLessThan(16);

    s = await startS3Server(dir, 'backups', port);
    try {
      // The failed backup could not remove its in-progress marker while the server was down; once it is older
      // than the lock duration the retry takes it over and reuses the blocks that did reach the store.
      await new Promise((r) => setTimeout(r, FAST_LOCKS.durationMs + 200));
      const retry = await createBackup({ target: TARGET, name, filePath: image, compression: 'gzip', concurrency: 2, credential: cred, lockTiming: FAST_LOCKS });
      expect(retry.sha512).toBe(src.sha512);
      expect(retry.reusedBlocks).toBeGreaterThanOrEqual(uploadedBefore);
      expect(retry.uploadedBlocks + retry.reusedBlocks).toBe(16);
      const out = path.join(work, 'outage.out');
      expect((await restoreBackup({ backupUrl: retry.backupUrl, output: out, credential: cred, lockTiming: FAST_LOCKS })).sha512).toBe(src.sha512);
      const d = new S3Driver(parseTargetUrl(TARGET) as S3TargetLocation, cred);
      try {
        expect(await d.exists(blockPath(blockChecksum(patternBlock(300))))).toBe(true);
      } finally {
        await d.close();
      }
    } finally {
      await s.stop();
    }
  });
});

describe('S3 outages within the retry window', () => {
  it('a server stopped mid-backup for a moment and restarted on the same port and directory gives a completed backup', async () => {
    const dir = path.join(work, 's3-blip');
    let s = await startS3Server(dir, 'backups');
    const port = s.port;
    const cred = { ...S3_TEST_CREDENTIAL, AWS_ENDPOINTS: s.endpoint };
    const image = path.join(work, 'blip.img');
    const src = await writeImage(image, Array.from({ length: 16 }, (_, i) => ({ kind: 'data', seed: 500 + i }) as Piece));
    const op = startBackup({
      target: TARGET, name: 'blip', filePath: image, compression: 'gzip', concurrency: 1, credential: cred, lockTiming: FAST_LOCKS,
      driverOptions: { s3: { maxAttempts: 1, retryWindowMs: 60_000 } },
    });
    while (op.status().uploadedBlocks < 3 && op.status().state === 'in_progress') await new Promise((r) => setTimeout(r, 5));
    await s.stop();
    const uploadedAtStop = op.status().uploadedBlocks;
    await new Promise((r) => setTimeout(r, 1500));
    // Nothing can have been written while the server was down.
    expect(op.status().uploadedBlocks).toBe(uploadedAtStop);
    expect(op.status().state).toBe('in_progress');
    s = await startS3Server(dir, 'backups', port);
    try {
      const r = await op.done;
      expect(r.sha512).toBe(src.sha512);
      expect(r.uploadedBlocks + r.reusedBlocks).toBe(16);
      const out = path.join(work, 'blip.out');
      expect((await restoreBackup({ backupUrl: r.backupUrl, output: out, credential: cred, lockTiming: FAST_LOCKS })).sha512).toBe(src.sha512);
    } finally {
      await s.stop();
    }
  });

  it('does not retry what cannot succeed (HTTP 403), and retries network errors only for the window', async () => {
    const wrong = { ...credential, AWS_ACCESS_KEY_ID: 'NOT-A-KEY' };
    await expect(listBackingImageBackups(TARGET, { credential: wrong, driverOptions: { s3: { retryWindowMs: 60_000 } } })).rejects.toMatchObject({
      message: expect.stringMatching(/HTTP 403/),
    });
    const down = { ...S3_TEST_CREDENTIAL, AWS_ENDPOINTS: 'http://127.0.0.1:1' };
    const started = Date.now();
    await expect(listBackingImageBackups(TARGET, { credential: down, driverOptions: { s3: { maxAttempts: 1, retryWindowMs: 700 } } })).rejects.toThrow(/ECONNREFUSED|connect/);
    expect(Date.now() - started).toBeGreaterThanOrEqual(700);
  });
});

describe('S3 through a proxy (HTTP_PROXY / HTTPS_PROXY / NO_PROXY credential keys)', () => {
  // The endpoint's host name does not resolve: only the proxy (which sends every tunnel to s3rver) can reach it.
  const unresolvable = () => `http://s3.invalid:${server.port}`;

  it('backs up and restores through the proxy, with proxy credentials, per call', async () => {
    const proxy = await startConnectProxy(server.port, 'bis:s3cr3t');
    try {
      const authed = proxy.url.replace('http://', 'http://bis:s3cr3t@');
      const cred = { ...S3_TEST_CREDENTIAL, AWS_ENDPOINTS: unresolvable(), HTTP_PROXY: authed, NO_PROXY: 'example.com,10.0.0.0/8' };
      const image = path.join(work, 'proxied.img');
      const src = await writeImage(image, [{ kind: 'data', seed: 61 }, { kind: 'hole' }, { kind: 'random' }], 99);
      const r = await createBackup({ target: TARGET, name: 'proxied', filePath: image, credential: cred, lockTiming: FAST_LOCKS });
      expect(r.sha512).toBe(src.sha512);
      const out = path.join(work, 'proxied.out');
      expect((await restoreBackup({ backupUrl: r.backupUrl, output: out, credential: cred, lockTiming: FAST_LOCKS })).sha512).toBe(src.sha512);
      expect(await sha512File(out)).toBe(src.sha512);
      expect(proxy.tunnels.length).toBeGreaterThan(0);
      expect(new Set(proxy.tunnels)).toEqual(new Set([`s3.invalid:${server.port}`]));
      expect(proxy.authorizations[0]).toBe(`Basic ${Buffer.from('bis:s3cr3t').toString('base64')}`);
      // Another call without the proxy keys in its credential connects directly (nothing is process-wide).
      const before = proxy.tunnels.length;
      expect((await listBackingImageBackups(TARGET, { credential })).map((e) => e.name)).toContain('proxied');
      expect(proxy.tunnels.length).toBe(before);
      // Wrong proxy credentials: a clear failure naming the operation.
      const wrong = { ...cred, HTTP_PROXY: proxy.url.replace('http://', 'http://bis:nope@') };
      await expect(listBackingImageBackups(TARGET, { credential: wrong, driverOptions: { s3: { maxAttempts: 1 } } })).rejects.toMatchObject({
        code: 'Io',
        message: expect.stringMatching(/^s3 list .* failed.*407/),
      });
    } finally {
      await proxy.stop();
    }
  });

  it('NO_PROXY and the loopback rule connect directly; HTTPS_PROXY is not used for http endpoints', async () => {
    const proxy = await startConnectProxy(server.port);
    try {
      const direct = { ...S3_TEST_CREDENTIAL, AWS_ENDPOINTS: unresolvable(), HTTP_PROXY: proxy.url, NO_PROXY: '.invalid' };
      await expect(listBackingImageBackups(TARGET, { credential: direct, driverOptions: { s3: { maxAttempts: 1 } } })).rejects.toThrow(
        /ENOTFOUND|getaddrinfo/,
      );
      const httpsOnly = { ...S3_TEST_CREDENTIAL, AWS_ENDPOINTS: unresolvable(), HTTPS_PROXY: proxy.url };
      await expect(listBackingImageBackups(TARGET, { credential: httpsOnly, driverOptions: { s3: { maxAttempts: 1 } } })).rejects.toThrow(
        /ENOTFOUND|getaddrinfo/,
      );
      // Like Go's httpproxy, loopback endpoints never go through a proxy.
      const loopback = { ...credential, HTTP_PROXY: proxy.url };
      expect(Array.isArray(await listBackingImageBackups(TARGET, { credential: loopback }))).toBe(true);
      expect(proxy.tunnels).toEqual([]);
      await expect(listBackingImageBackups(TARGET, { credential: { ...credential, HTTP_PROXY: 'ftp://x' } })).rejects.toThrow(
        'HTTP_PROXY "ftp://x": only http:// and https:// proxies are supported',
      );
    } finally {
      await proxy.stop();
    }
  });

  it('matches NO_PROXY entries as Go does', () => {
    expect(bypassesProxy('s3.example.com', 443, 'example.com')).toBe(true);
    expect(bypassesProxy('example.com', 443, '.example.com')).toBe(false);
    expect(bypassesProxy('a.example.com', 443, '.example.com')).toBe(true);
    expect(bypassesProxy('notexample.com', 443, 'example.com')).toBe(false);
    expect(bypassesProxy('minio.local', 9000, 'minio.local:9000')).toBe(true);
    expect(bypassesProxy('minio.local', 9001, 'minio.local:9000')).toBe(false);
    expect(bypassesProxy('10.1.2.3', 80, '10.0.0.0/8')).toBe(true);
    expect(bypassesProxy('11.1.2.3', 80, '10.0.0.0/8')).toBe(false);
    expect(bypassesProxy('192.168.1.5', 80, '192.168.1.5')).toBe(true);
    expect(bypassesProxy('anything', 1, ' * ')).toBe(true);
    expect(bypassesProxy('localhost', 80, '')).toBe(true);
    expect(bypassesProxy('127.0.0.1', 80, '')).toBe(true);
    expect(proxyFor(new URL('https://s3.us-east-1.amazonaws.com'), { https_proxy: 'proxy.corp:3128' })?.href).toBe('http://proxy.corp:3128/');
    expect(proxyFor(new URL('http://s3.example.com'), { HTTPS_PROXY: 'http://p:1' })).toBeUndefined();
  });
});
