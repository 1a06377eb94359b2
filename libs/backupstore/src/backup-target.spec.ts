import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { backupTargetOperations } from './backup-target.js';
import { createBackup } from './engine/backup.js';
import { FAST_LOCKS, tempDir, writeImage } from './test-support/images.js';

let work: string;
beforeAll(async () => {
  work = await tempDir();
});
afterAll(async () => {
  await fs.rm(work, { recursive: true, force: true });
});

describe('backupTargetOperations (what the control plane runs on a backup target)', () => {
  it('lists, inspects and deletes the backups of a vfs target', async () => {
    const root = path.join(work, 'store');
    await fs.mkdir(root);
    const target = `vfs://${root}`;
    const image = path.join(work, 'a.img');
    const src = await writeImage(image, [{ kind: 'data', seed: 1 }], 7);
    await createBackup({ target, name: 'img-a', filePath: image, labels: { app: 'x' }, lockTiming: FAST_LOCKS });

    expect(await backupTargetOperations.listBackingImages(target, {})).toEqual(['img-a']);
    const url = backupTargetOperations.backingImageURL(target, 'img-a');
    expect(url).toBe(`${target}?backingImage=img-a`);
    const info = await backupTargetOperations.inspectBackingImage(url, {});
    expect(info).toMatchObject({ name: 'img-a', url, size: src.size, checksum: src.sha512, labels: { app: 'x' }, compressionMethod: 'lz4', secret: '', secretNamespace: '' });
    expect(info.createdAt).toMatch(/^\d{4}-\d\d-\d\dT/);

    await backupTargetOperations.deleteBackingImage(url, {});
    expect(await backupTargetOperations.listBackingImages(target, {})).toEqual([]);
    await expect(backupTargetOperations.inspectBackingImage(url, {})).rejects.toThrow();
  });
});
