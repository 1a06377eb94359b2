import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { getDataExtents } from '@bis/block-mapping';
import { encodeBackingImageConfig, encodeBackupInfo, encodeLockFile } from '../config.js';
import { goIndentTabs } from '../go-json.js';
import { DELETION_LOCK } from '../lock.js';
import { backingImageConfigPath, blockChecksum, blockPath, lockDir } from '../names.js';
import { FileSystemDriver } from '../drivers/filesystem.js';
import { createBackup, startBackup } from './backup.js';
import { restoreBackup } from './restore.js';
import { deleteBackup, gcTarget, inspectBackup, listBackingImageBackups, verifyTarget } from './maintenance.js';
import { BLOCK, FAST_LOCKS, FIXTURE_STORE, lockFiles, patternBlock, sha512File, storedBlocks, tempDir, waitFor, writeImage, type Piece } from '../test-support/images.js';

const FIXTURE_SHA512 =
  '290be67edd2c1bf69fca775bbc4e78914c750470f4ac7cfb1771128c8f9a913f4316ec422371500e608326da74ff91bc17170656a87bc606543b467b5e06e033';

let work: string;
beforeAll(async () => {
  work = await tempDir();
});
afterAll(async () => {
  await fs.rm(work, { recursive: true, force: true });
});

async function freshStore(label: string): Promise<{ root: string; target: string }> {
  const root = path.join(work, `store-${label}`);
  await fs.mkdir(root);
  return { root, target: `vfs://${root}` };
}

describe('the Longhorn fixture', () => {
  it('restores to the SHA-512 in its config, with the skipped block as a hole', async () => {
    const out = path.join(work, 'fixture.img');
    const result = await restoreBackup({
      backupUrl: `vfs://${FIXTURE_STORE}?backingImage=fixture-lz4`,
      output: out,
      lockTiming: FAST_LOCKS,
    });
    expect(result).toEqual({ name: 'fixture-lz4', size: 9437307, sha512: FIXTURE_SHA512, blockCount: 4, verification: 'sequential' });
    expect((await fs.stat(out)).size).toBe(9437307);
    expect(await sha512File(out)).toBe(FIXTURE_SHA512);
    const extents = await getDataExtents(out);
    // [2 MiB, 4 MiB) was never written (skipped hole) and the zero block [6 MiB, 8 MiB) is left as a hole too.
    const covers = (o: number) => extents.some((e) => e.offset <= o && o < e.offset + e.length);
    expect(covers(0)).toBe(true);
    expect(covers(3 * 1024 * 1024)).toBe(false);
    expect(covers(7 * 1024 * 1024)).toBe(false);
    // The fixture directory is untouched: no lock directory left behind.
    await expect(fs.stat(path.join(FIXTURE_STORE, 'backupstore/volumes'))).rejects.toThrow();
  });

  it('inspects and lists like Longhorn', async () => {
    const info = await inspectBackup(`vfs://${FIXTURE_STORE}?backingImage=fixture-lz4`);
    expect(goIndentTabs(encodeBackupInfo(info))).toContain(`"URL": "vfs://${FIXTURE_STORE}?backingImage=fixture-lz4"`);
    expect(info).toMatchObject({ name: 'fixture-lz4', size: 9437307, checksum: FIXTURE_SHA512, compressionMethod: 'lz4', labels: { app: 'fixture' } });
    const list = await listBackingImageBackups(`vfs://${FIXTURE_STORE}`);
    expect(list.map((e) => [e.name, e.state, e.blockCount])).toEqual([['fixture-lz4', 'complete', 4]]);
  });
});

const LAYOUT: Piece[] = [
  { kind: 'data', seed: 1 },
  { kind: 'hole' },
  { kind: 'data', seed: 1 }, // repeated block
  { kind: 'zeros' }, // allocated zeros: skipped as all-zero
  { kind: 'random' },
];

describe.each(['none', 'lz4', 'gzip'] as const)('round trip with %s over vfs', (compression) => {
  it('backs up only data blocks, restores byte-identical sparse output, and is Longhorn-shaped', async () => {
    const { root, target } = await freshStore(`rt-${compression}`);
    const image = path.join(work, `src-${compression}.img`);
    const src = await writeImage(image, LAYOUT, 12345);
    const progress: number[] = [];
    const result = await createBackup({
      target, name: `img-${compression}`, filePath: image, compression, concurrency: 3, labels: { app: 'test', note: 'a<b>&c' },
      lockTiming: FAST_LOCKS, onProgress: (p) => progress.push(p.progress),
    });
    expect(result.backupUrl).toBe(`${target}?backingImage=img-${compression}`);
    expect(result.sha512).toBe(src.sha512);
    // Blocks at 0, 4M (same as 0), 8M (random), 10M (short tail): the hole and the zero block are not listed.
    expect(result.blockCount).toBe(4);
    expect(result.uploadedBlocks).toBe(3);
    expect(result.zeroBlocks).toBe(1);
    expect(progress[progress.length - 1]).toBe(100);
    const cfg = await fs.readFile(path.join(root, backingImageConfigPath(`img-${compression}`)), 'utf8');
    expect(cfg).toMatch(new RegExp(`^\\{"Name":"img-${compression}","Size":"${src.size}","BlockCount":"4","Checksum":"${src.sha512}","Labels":\\{"app":"test","note":"a\\\\u003cb\\\\u003e\\\\u0026c"\\},"CompressionMethod":"${compression}","CreatedTime":"[0-9T:-]+Z","CompleteTime":"[0-9T:-]+Z","Secret":"","SecretNamespace":"","ProcessingBlocks":\\{"Blocks":\\{\\}\\},"Blocks":\\[\\{"Offset":0,`));
    expect(cfg.endsWith(']}')).toBe(true);
    const b0 = blockChecksum(patternBlock(1));
    const stored = await fs.readFile(path.join(root, blockPath(b0)));
    if (compression === 'none') expect(stored.equals(patternBlock(1))).toBe(true);
    else expect(stored.length).toBeLessThan(BLOCK / 2);
    // No lock files, no temp files left.
    await expect(fs.stat(path.join(root, lockDir()))).rejects.toThrow();

    const out = path.join(work, `out-${compression}.img`);
    const restored = await restoreBackup({ backupUrl: result.backupUrl, output: out, concurrency: 3, lockTiming: FAST_LOCKS });
    expect(restored.sha512).toBe(src.sha512);
    expect(await sha512File(out)).toBe(src.sha512);
    const extents = await getDataExtents(out);
    const covers = (o: number) => extents.some((e) => e.offset <= o && o < e.offset + e.length);
    expect(covers(BLOCK + 5)).toBe(false); // hole
    expect(covers(3 * BLOCK + 5)).toBe(false); // zero block left as a hole
    expect(covers(4 * BLOCK + 5)).toBe(true);
    expect((await fs.readdir(work)).filter((f) => f.includes('.restore-'))).toEqual([]);
  });
});

describe('dedup, concurrency and idempotence', () => {
  it('shares blocks between images and uploads each block once when two backups run at once', async () => {
    const { root, target } = await freshStore('dedup');
    const a = path.join(work, 'dedup-a.img');
    const b = path.join(work, 'dedup-b.img');
    await writeImage(a, [{ kind: 'data', seed: 11 }, { kind: 'data', seed: 12 }, { kind: 'data', seed: 13 }]);
    await writeImage(b, [{ kind: 'data', seed: 13 }, { kind: 'data', seed: 12 }, { kind: 'data', seed: 14 }]);
    // Count real writes of block files through the driver both backups share.
    const driver = new FileSystemDriver(root, target);
    const writes: string[] = [];
    const write = driver.write.bind(driver);
    driver.write = async (p, data, signal) => {
      if (p.endsWith('.blk')) writes.push(p);
      return write(p, data, signal);
    };
    const [ra, rb] = await Promise.all([
      createBackup({ target, name: 'dedup-a', filePath: a, concurrency: 2, driver, lockTiming: FAST_LOCKS }),
      createBackup({ target, name: 'dedup-b', filePath: b, concurrency: 2, driver, lockTiming: FAST_LOCKS }),
    ]);
    expect(writes.length).toBe(4);
    expect(new Set(writes).size).toBe(4);
    expect(ra.uploadedBlocks + rb.uploadedBlocks).toBe(4);
    expect(ra.reusedBlocks + rb.reusedBlocks).toBe(2);
    expect(await storedBlocks(root)).toHaveLength(4);

    // A third image made only of known blocks uploads nothing.
    const c = path.join(work, 'dedup-c.img');
    await writeImage(c, [{ kind: 'data', seed: 14 }, { kind: 'data', seed: 11 }]);
    const rc = await createBackup({ target, name: 'dedup-c', filePath: c, lockTiming: FAST_LOCKS });
    expect(rc.uploadedBlocks).toBe(0);
    expect(rc.reusedBlocks).toBe(2);

    // Backing up an existing complete name is a no-op (Longhorn's rule), unless the checksum disagrees.
    const again = await createBackup({ target, name: 'dedup-a', filePath: a, lockTiming: FAST_LOCKS });
    expect(again.alreadyExisted).toBe(true);
    await expect(
      createBackup({ target, name: 'dedup-a', filePath: b, checksum: rb.sha512, lockTiming: FAST_LOCKS }),
    ).rejects.toThrow(/already exists .* with checksum/);
    expect((await verifyTarget(target, { lockTiming: FAST_LOCKS })).ok).toBe(true);
  });

  it('reports status while running and can be cancelled, leaving no marker behind', async () => {
    const { root, target } = await freshStore('cancel');
    const img = path.join(work, 'cancel.img');
    await writeImage(img, Array.from({ length: 32 }, () => ({ kind: 'random' }) as Piece));
    const ac = new AbortController();
    const op = startBackup({
      target, name: 'cancel-me', filePath: img, compression: 'gzip', concurrency: 1, signal: ac.signal, lockTiming: FAST_LOCKS,
    });
    expect(op.status().state).toBe('in_progress');
    await waitFor(() => op.status().uploadedBlocks >= 2 || op.status().state !== 'in_progress', 'the backup to upload two blocks', 60_000);
    ac.abort(new Error('user cancelled'));
    expect(op.status().state).toBe('in_progress');
    await expect(op.done).rejects.toThrow(/operation cancelled: user cancelled/);
    expect(op.status()).toMatchObject({ state: 'error', error: expect.stringContaining('cancelled') });
    await expect(fs.stat(path.join(root, backingImageConfigPath('cancel-me')))).rejects.toThrow();
    await expect(fs.stat(path.join(root, lockDir()))).rejects.toThrow();
  });

  it('takes over a stale in-progress marker but refuses a fresh one', async () => {
    const { root, target } = await freshStore('stale');
    const img = path.join(work, 'stale.img');
    const src = await writeImage(img, [{ kind: 'data', seed: 21 }]);
    const cfg = path.join(root, backingImageConfigPath('stale'));
    await fs.mkdir(path.dirname(cfg), { recursive: true });
    await fs.writeFile(cfg, encodeBackingImageConfig({
      name: 'stale', size: src.size, blockCount: 0, checksum: '', labels: null, compressionMethod: 'lz4',
      createdTime: '2026-01-01T00:00:00Z', completeTime: '', secret: '', secretNamespace: '', blocks: [],
    }, true));
    // a live writer refreshes its marker: refused as soon as a refresh is seen
    const live = setInterval(() => {
      const t = new Date();
      void fs.utimes(cfg, t, t).catch(() => undefined); // the test ends the writer before removing the store
    }, FAST_LOCKS.refreshMs / 2);
    try {
      await expect(createBackup({ target, name: 'stale', filePath: img, lockTiming: FAST_LOCKS })).rejects.toThrow(/still in progress/);
    } finally {
      clearInterval(live);
    }
    // an old marker (a writer that died long ago) is taken over at once
    const old = new Date(Date.now() - 10_000);
    await fs.utimes(cfg, old, old);
    const r = await createBackup({ target, name: 'stale', filePath: img, lockTiming: FAST_LOCKS });
    expect(r.alreadyExisted).toBe(false);
    expect(r.uploadedBlocks).toBe(1);
  });

  it('a young marker that nobody refreshes (its writer was killed) is waited out and taken over, not refused', async () => {
    const { root, target } = await freshStore('dead-writer');
    const img = path.join(work, 'dead-writer.img');
    const src = await writeImage(img, [{ kind: 'data', seed: 22 }]);
    const cfg = path.join(root, backingImageConfigPath('dead-writer'));
    await fs.mkdir(path.dirname(cfg), { recursive: true });
    await fs.writeFile(cfg, encodeBackingImageConfig({
      name: 'dead-writer', size: src.size, blockCount: 0, checksum: '', labels: null, compressionMethod: 'lz4',
      createdTime: '2026-01-01T00:00:00Z', completeTime: '', secret: '', secretNamespace: '', blocks: [],
    }, true));
    const writtenAt = (await fs.stat(cfg)).mtimeMs;
    const r = await createBackup({ target, name: 'dead-writer', filePath: img, lockTiming: FAST_LOCKS });
    expect(r.alreadyExisted).toBe(false);
    expect(r.sha512).toBe(src.sha512);
    // it was taken over only once the marker had gone stale: the new config was written after the lock duration
    expect((await fs.stat(cfg)).mtimeMs - writtenAt).toBeGreaterThan(FAST_LOCKS.durationMs);
  });
});

describe('locks', () => {
  it('a fresh foreign delete lock makes a backup fail at once; an expired one is ignored', async () => {
    const { root, target } = await freshStore('lock');
    const img = path.join(work, 'lock.img');
    await writeImage(img, [{ kind: 'data', seed: 31 }]);
    const lockFile = path.join(root, lockDir(), 'lock-0123456789abcdef.lck');
    await fs.mkdir(path.dirname(lockFile), { recursive: true });
    await fs.writeFile(lockFile, encodeLockFile({ name: 'lock-0123456789abcdef', type: DELETION_LOCK, acquired: true }));
    await expect(createBackup({ target, name: 'locked', filePath: img, lockTiming: FAST_LOCKS })).rejects.toThrow(
      /failed to acquire lock backupstore\/volumes\/22\/fc\/BACKINGIMAGE\/locks\/lock-[0-9a-f]{16}\.lck when performing backup create, please try again later/,
    );
    expect(await fs.readdir(path.dirname(lockFile))).toEqual(['lock-0123456789abcdef.lck']);
    const old = new Date(Date.now() - 10_000);
    await fs.utimes(lockFile, old, old);
    await expect(createBackup({ target, name: 'locked', filePath: img, lockTiming: FAST_LOCKS })).resolves.toMatchObject({ blockCount: 1 });
  });

  it('a restore works during its lock check wait but keeps nothing when a delete holds the lock', async () => {
    const { root, target } = await freshStore('lock-restore');
    const img = path.join(work, 'lock-restore.img');
    const src = await writeImage(img, [{ kind: 'data', seed: 33 }, { kind: 'random' }]);
    const r = await createBackup({ target, name: 'held', filePath: img, lockTiming: FAST_LOCKS });
    // A delete holds the lock and has already swept a block: the restore must report the lock, not the block.
    const lockFile = path.join(root, lockDir(), 'lock-fedcba9876543210.lck');
    await fs.mkdir(path.dirname(lockFile), { recursive: true });
    await fs.writeFile(lockFile, encodeLockFile({ name: 'lock-fedcba9876543210', type: DELETION_LOCK, acquired: true }));
    const swept = path.join(root, blockPath(blockChecksum(patternBlock(33))));
    const kept = await fs.readFile(swept);
    await fs.rm(swept);
    const out = path.join(work, 'lock-restore.out');
    await expect(restoreBackup({ backupUrl: r.backupUrl, output: out, lockTiming: { ...FAST_LOCKS, checkWaitMs: 300 } })).rejects.toThrow(
      /failed to acquire lock .* when performing backup restore, please try again later/,
    );
    await expect(fs.stat(out)).rejects.toThrow();
    expect((await fs.readdir(work)).filter((f) => f.includes('.restore-'))).toEqual([]);
    expect(await fs.readdir(path.dirname(lockFile))).toEqual(['lock-fedcba9876543210.lck']);
    await fs.rm(lockFile);
    await fs.writeFile(swept, kept);

    // A config rewritten during the check wait: the speculative result (which matched the old config) is dropped and
    // the restore runs again from the new config; here the new one records another checksum, so it must fail.
    const cfg = path.join(root, backingImageConfigPath('held'));
    // The rewrite happens once the restore holds its (not yet checked) lock and has started writing its temporary file,
    // well inside a check wait long enough for a loaded machine.
    const restoring = restoreBackup({ backupUrl: r.backupUrl, output: out, lockTiming: { ...FAST_LOCKS, checkWaitMs: 3000 } });
    await waitFor(
      async () => (await lockFiles(root, lockDir())).length === 1 && (await fs.readdir(work)).some((f) => f.includes('.restore-')),
      'the restore to take its lock and start its temporary file',
    );
    const text = await fs.readFile(cfg, 'utf8');
    await fs.writeFile(cfg, text.replace(src.sha512, 'f'.repeat(128)));
    await expect(restoring).rejects.toMatchObject({ code: 'ChecksumMismatch' });
    await expect(fs.stat(out)).rejects.toThrow();
    await fs.writeFile(cfg, text);
    expect((await restoreBackup({ backupUrl: r.backupUrl, output: out, lockTiming: FAST_LOCKS })).sha512).toBe(src.sha512);
    expect(await sha512File(out)).toBe(src.sha512);
  });

  it('a delete conflicts with a running backup, and the other way round', async () => {
    const { root, target } = await freshStore('lock2');
    const img = path.join(work, 'lock2.img');
    await writeImage(img, Array.from({ length: 16 }, () => ({ kind: 'random' }) as Piece));
    await createBackup({ target, name: 'victim', filePath: img, compression: 'none', lockTiming: FAST_LOCKS });
    const timing = { ...FAST_LOCKS, checkWaitMs: 50 };
    // The backup holds an acquired lock while it uploads; a delete started meanwhile must fail.
    const slow = path.join(work, 'lock2-slow.img');
    await writeImage(slow, Array.from({ length: 24 }, () => ({ kind: 'random' }) as Piece));
    const op = startBackup({ target, name: 'running', filePath: slow, compression: 'gzip', concurrency: 1, lockTiming: timing });
    await waitFor(() => op.status().uploadedBlocks >= 1 || op.status().state !== 'in_progress', 'the backup to upload a block');
    await expect(deleteBackup(`${target}?backingImage=victim`, { lockTiming: timing })).rejects.toThrow(/when performing backup delete/);
    await op.done;
    // A delete holding its lock blocks a backup that starts during it.
    const del = deleteBackup(`${target}?backingImage=victim`, { lockTiming: { ...timing, checkWaitMs: 3000 } });
    await waitFor(async () => (await lockFiles(root, lockDir())).length === 1, "the delete's lock file");
    await expect(createBackup({ target, name: 'late', filePath: img, lockTiming: timing })).rejects.toThrow(/failed to acquire lock/);
    await del;
  });
});

describe('corruption', () => {
  it('a corrupt block makes restore fail naming the block, and verify reports it', async () => {
    const { root, target } = await freshStore('corrupt');
    const img = path.join(work, 'corrupt.img');
    await writeImage(img, [{ kind: 'data', seed: 41 }, { kind: 'data', seed: 42 }]);
    const r = await createBackup({ target, name: 'corrupt', filePath: img, lockTiming: FAST_LOCKS });
    const bad = blockPath(blockChecksum(patternBlock(42)));
    const file = path.join(root, bad);
    const bytes = await fs.readFile(file);
    bytes[bytes.length - 20] ^= 0xff;
    await fs.writeFile(file, bytes);
    const out = path.join(work, 'corrupt-out.img');
    await expect(restoreBackup({ backupUrl: r.backupUrl, output: out, lockTiming: FAST_LOCKS })).rejects.toThrow(
      `decompression verification failed for block ${bad}`,
    );
    await expect(fs.stat(out)).rejects.toThrow();
    expect((await fs.readdir(work)).filter((f) => f.includes('.restore-'))).toEqual([]);
    const v = await verifyTarget(target, { lockTiming: FAST_LOCKS });
    expect(v.ok).toBe(false);
    expect(v.problems).toEqual([expect.objectContaining({ path: bad, problem: 'corrupt', backups: ['corrupt'] })]);
    await fs.rm(file);
    const v2 = await verifyTarget(target, { lockTiming: FAST_LOCKS });
    expect(v2.problems[0]).toMatchObject({ problem: 'missing' });
    await expect(restoreBackup({ backupUrl: r.backupUrl, output: out, lockTiming: FAST_LOCKS })).rejects.toThrow(/is missing from the backupstore/);
  });
});
