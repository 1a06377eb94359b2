import { describe, it, expect } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BackupTracker, parseLabels, type BackupRunner } from './backups.js';
import { toBackingImageResponse } from './convert.js';
import { checkDiskConfig } from './disk-config.js';

/** Polls `condition` until it holds (each poll after one macrotask turn); fails naming `what` after `timeoutMs`. */
async function until(what: string, condition: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe('manager helpers', () => {
  it('maps a sync record to the gRPC response like Longhorn', () => {
    const r = toBackingImageResponse({
      diskUUID: 'd', expectedChecksum: 'e', filePath: '/data/backing-images/my-img-u1/backing', uuid: 'u1', size: 1024,
      virtualSize: 2048, realSize: 512, state: 'ready', progress: 100, processedSize: 1024, modificationTime: 't',
      currentChecksum: 'c', message: '', sendingReference: 2,
    });
    expect(r.spec).toEqual({ name: 'my-img', uuid: 'u1', size: 1024, checksum: 'e', virtualSize: 2048, realSize: 512 });
    expect(r.status).toEqual({ state: 'ready', errorMsg: '', sendingReference: 2, senderManagerAddress: '', progress: 100, checksum: 'c' });
  });

  it('tracks backups: validation, newest status per name, errors', async () => {
    const t = new BackupTracker();
    let finish!: (v: { backupUrl: string }) => void;
    const runner: BackupRunner = { createBackup: (req) => { req.onProgress(42); return new Promise((r) => (finish = r)); } };
    const req = { name: 'img', uuid: 'u', checksum: '', backupTarget: 's3://b@r/', labels: ['a=b'], credential: {}, compressionMethod: 'lz4', concurrentLimit: 2, parameters: {} };
    await expect(t.start(runner, { ...req, backupTarget: '' }, '/f', 'c')).rejects.toThrow('missing input parameter');
    await expect(t.start(runner, { ...req, name: '-bad' }, '/f', 'c')).rejects.toThrow('longer than 64');
    await t.start(runner, req, '/f', 'c');
    expect(t.status('img')).toEqual({ progress: 42, backupUrl: '', error: '', state: 'in_progress' });
    await expect(t.start(runner, req, '/f', 'c')).rejects.toThrow('already in progress');
    finish({ backupUrl: 's3://b@r/?backingImage=img' });
    await until('the backup to complete', () => t.status('img')?.state !== 'in_progress');
    expect(t.status('img')).toMatchObject({ progress: 100, state: 'complete', backupUrl: 's3://b@r/?backingImage=img' });
    await t.start({ createBackup: async () => { throw new Error('boom'); } }, req, '/f', 'c');
    await until('the failing backup to end', () => t.status('img')?.state !== 'in_progress');
    expect(t.status('img')).toMatchObject({ state: 'error', error: 'boom' });
    expect(t.status('other')).toBeUndefined();
    expect(() => parseLabels(['novalue'])).toThrow('invalid label');
  });

  it('checks longhorn-disk.cfg', async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'disk-cfg-'));
    try {
      await expect(checkDiskConfig(dir)).rejects.toThrow('cannot read the disk config file');
      await fsp.writeFile(path.join(dir, 'longhorn-disk.cfg'), '{"diskUUID":"abc"}');
      expect(await checkDiskConfig(dir)).toBe('abc');
      expect(await checkDiskConfig(dir, 'abc')).toBe('abc');
      await expect(checkDiskConfig(dir, 'xyz')).rejects.toThrow("invalid input disk UUID xyz which doesn't match disk UUID abc");
      await fsp.writeFile(path.join(dir, 'longhorn-disk.cfg'), '{}');
      await expect(checkDiskConfig(dir)).rejects.toThrow('no diskUUID');
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});
