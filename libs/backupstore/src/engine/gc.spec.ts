import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { encodeBackingImageConfig } from '../config.js';
import { FileSystemDriver } from '../drivers/filesystem.js';
import { backingImageConfigPath, blockChecksum, blockPath } from '../names.js';
import { createBackup } from './backup.js';
import { deleteBackup, gcTarget, verifyTarget } from './maintenance.js';
import { BLOCK, FAST_LOCKS, patternBlock, storedBlocks, tempDir, writeImage, type Piece } from '../test-support/images.js';

let work: string;
beforeAll(async () => {
  work = await tempDir();
});
afterAll(async () => {
  await fs.rm(work, { recursive: true, force: true });
});

/** Small deterministic PRNG so that a failing case can be reproduced from its seed. */
function rng(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 0x100000000;
  };
}

describe('garbage collection', () => {
  it('never removes a block a remaining backup references (random sets of images)', async () => {
    for (const seed of [1, 2, 3, 4]) {
      const random = rng(seed);
      const root = path.join(work, `prop-${seed}`);
      const target = `vfs://${root}`;
      const images = new Map<string, number[]>();
      const count = 3 + Math.floor(random() * 3);
      for (let i = 0; i < count; i++) {
        const seeds = Array.from({ length: 1 + Math.floor(random() * 3) }, () => 1 + Math.floor(random() * 6));
        const name = `img-${seed}-${i}`;
        const file = path.join(work, `${name}.raw`);
        await writeImage(file, seeds.map((s) => ({ kind: 'data', seed: s }) as Piece), Math.floor(random() * 3000));
        await createBackup({ target, name, filePath: file, compression: random() < 0.5 ? 'lz4' : 'gzip', lockTiming: FAST_LOCKS });
        images.set(name, seeds);
        await fs.rm(file);
      }
      // An orphan block that no config references: GC must collect it.
      const orphan = Buffer.from(`orphan ${seed}`);
      const driver = new FileSystemDriver(root, target);
      await driver.write(blockPath(blockChecksum(orphan)), orphan);
      for (const name of [...images.keys()]) {
        if (random() < 0.5) continue;
        const r = await deleteBackup(`${target}?backingImage=${name}`, { lockTiming: FAST_LOCKS });
        expect(r).toMatchObject({ configRemoved: true, gc: { swept: true } });
        images.delete(name);
        const want = new Set([...images.values()].flat().map((s) => blockChecksum(patternBlock(s))));
        const have = await storedBlocks(root);
        // Every referenced data block is still there; the only blocks beyond those are short tails of remaining images.
        for (const sum of want) expect(have).toContain(sum);
        expect(have).not.toContain(blockChecksum(orphan));
      }
      const v = await verifyTarget(target, { lockTiming: FAST_LOCKS });
      expect(v).toMatchObject({ ok: true, backups: images.size, problems: [] });
      const gc = await gcTarget(target, { lockTiming: FAST_LOCKS });
      expect(gc.removedBlocks).toEqual([]);
    }
  });

  it('is skipped while any config is in progress or unreadable, and deletes everything once none remain', async () => {
    const root = path.join(work, 'skip');
    const target = `vfs://${root}`;
    const file = path.join(work, 'skip.raw');
    await writeImage(file, [{ kind: 'data', seed: 50 }, { kind: 'data', seed: 51 }]);
    await createBackup({ target, name: 'keep', filePath: file, lockTiming: FAST_LOCKS });
    await createBackup({ target, name: 'gone', filePath: file, lockTiming: FAST_LOCKS });
    const orphan = Buffer.from('orphan');
    const driver = new FileSystemDriver(root, target);
    await driver.write(blockPath(blockChecksum(orphan)), orphan);

    // An in-progress marker of a third backup stops the sweep.
    await driver.write(
      backingImageConfigPath('busy'),
      encodeBackingImageConfig(
        { name: 'busy', size: BLOCK, blockCount: 0, checksum: '', labels: null, compressionMethod: 'lz4', createdTime: 't', completeTime: '', secret: '', secretNamespace: '', blocks: [] },
        true,
      ),
    );
    const dry = await gcTarget(target, { dryRun: true, lockTiming: FAST_LOCKS });
    expect(dry).toMatchObject({ swept: false, skippedReason: 'backing image backup busy is in progress or failed' });
    await driver.remove(backingImageConfigPath('busy'));

    // An empty backup directory (config unreadable) stops it too, as in Longhorn.
    await fs.mkdir(path.join(root, 'backupstore/backing-images/backing-images/empty'), { recursive: true });
    expect((await gcTarget(target, { lockTiming: FAST_LOCKS })).skippedReason).toMatch(/cannot load the config of backing image backup empty/);
    await fs.rmdir(path.join(root, 'backupstore/backing-images/backing-images/empty'));

    const dry2 = await gcTarget(target, { dryRun: true, lockTiming: FAST_LOCKS });
    expect(dry2).toMatchObject({ swept: true, removedBlocks: [blockChecksum(orphan)], totalBlocks: 3 });
    expect(await storedBlocks(root)).toHaveLength(3);

    await deleteBackup(`${target}?backingImage=gone`, { lockTiming: FAST_LOCKS });
    expect(await storedBlocks(root)).toHaveLength(2);
    await deleteBackup(`${target}?backingImage=keep`, { lockTiming: FAST_LOCKS });
    expect(await storedBlocks(root)).toEqual([]);
    // Empty directories are pruned up to backupstore/.
    expect(await fs.readdir(path.join(root, 'backupstore'))).toEqual([]);
  });

  it('skips the sweep when listing fails instead of treating it as "no backups" (Longhorn fault)', async () => {
    const root = path.join(work, 'listfail');
    const target = `vfs://${root}`;
    const file = path.join(work, 'listfail.raw');
    await writeImage(file, [{ kind: 'data', seed: 60 }]);
    await createBackup({ target, name: 'a1', filePath: file, lockTiming: FAST_LOCKS });
    const driver = new FileSystemDriver(root, target);
    const list = driver.list.bind(driver);
    let failNames = true;
    // A store whose listing of backups fails transiently (e.g. a 503 from S3): real files, failing list call.
    driver.list = async (dir, signal) => {
      if (failNames && dir.endsWith('backing-images/backing-images')) throw new Error('503 Slow Down');
      return list(dir, signal);
    };
    const r = await gcTarget(target, { driver, lockTiming: FAST_LOCKS });
    expect(r).toMatchObject({ swept: false, removedBlocks: [] });
    expect(r.skippedReason).toMatch(/listing the backupstore failed: 503 Slow Down/);
    expect(await storedBlocks(root)).toHaveLength(1);
    failNames = false;
    expect((await gcTarget(target, { driver, lockTiming: FAST_LOCKS })).swept).toBe(true);
    expect(await storedBlocks(root)).toHaveLength(1);
  });
});
