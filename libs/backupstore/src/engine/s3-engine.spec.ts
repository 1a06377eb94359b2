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
      driverOptions: { s3: { maxAttempts: 3 } },
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
