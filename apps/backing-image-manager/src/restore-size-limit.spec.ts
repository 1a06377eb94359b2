import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createBackup, type LockTiming } from '@bis/backupstore';
import type { RestoreBackupFn, RestoreRequest } from '@bis/file-sources';
import { assembleFileSources } from '@bis/file-sources/source-provider';
import { backupstoreRestore } from './backup-runner.js';

// A restore from a real backupstore (vfs driver on a temp dir) through the manager's composition (the backup
// engine behind the file sources) is bounded like every other source: the backup's declared size is checked against
// the limit before anything is written.

const MiB = 1024 * 1024;
const FAST_LOCKS: LockTiming = { durationMs: 1500, refreshMs: 300, checkWaitMs: 30 };

let work: string;
let store: string;
let disk: string;
let image: Buffer;

beforeEach(async () => {
  work = await fsp.realpath(await fsp.mkdtemp(path.join(os.tmpdir(), 'restore-limit-')));
  store = path.join(work, 'store');
  disk = path.join(work, 'disk');
  await fsp.mkdir(store);
  await fsp.mkdir(path.join(disk, 'tmp'), { recursive: true });
  image = randomBytes(4 * MiB);
  const file = path.join(work, 'image.raw');
  await fsp.writeFile(file, image);
  await createBackup({ target: `vfs://${store}`, name: 'big', filePath: file, lockTiming: FAST_LOCKS });
  await fsp.rm(file);
});

afterEach(async () => {
  await fsp.rm(work, { recursive: true, force: true });
});

function request(progress: number[]): RestoreRequest {
  return {
    backupUrl: `vfs://${store}?backingImage=big`,
    concurrentLimit: 2,
    credential: {},
    dest: path.join(disk, 'tmp', 'big-x.tmp'),
    signal: new AbortController().signal,
    sink: { setSize: () => undefined, updateProgress: (n) => progress.push(n) },
  };
}

describe('restore from a backup store: size limit', () => {
  it('refuses a backup whose declared size is over the limit before writing anything, and leaves no file', async () => {
    const sources = assembleFileSources(
      { restoreBackup: backupstoreRestore({ root: disk, lockTiming: FAST_LOCKS }), sizeLimit: { maxImageSize: 1 * MiB } },
      undefined,
    );
    const progress: number[] = [];
    const err = await sources.restore(request(progress)).catch((e: unknown) => e);
    expect(err).toMatchObject({
      name: 'SizeLimitError',
      statusCode: 413,
      message: `the backup's declared size of ${4 * MiB} bytes is larger than the limit of ${1 * MiB} bytes (the backing-image-max-size setting)`,
    });
    expect(progress).toEqual([]); // the engine did not restore a single block
    expect(await fsp.readdir(path.join(disk, 'tmp'))).toEqual([]);
  });

  it('stops an engine that ignores the declared-size check once it reports more than the limit, and leaves no file', async () => {
    const engine = backupstoreRestore({ root: disk, lockTiming: FAST_LOCKS });
    const ignoresCheck: RestoreBackupFn = (a) => engine({ ...a, checkSize: () => undefined });
    const sources = assembleFileSources({ restoreBackup: ignoresCheck, sizeLimit: { maxImageSize: 1 * MiB } }, undefined);
    const err = await sources.restore(request([])).catch((e: unknown) => e);
    expect(err).toMatchObject({
      name: 'SizeLimitError',
      message: `the backup's declared size of ${4 * MiB} bytes is larger than the limit of ${1 * MiB} bytes (the backing-image-max-size setting)`,
    });
    expect(await fsp.readdir(path.join(disk, 'tmp'))).toEqual([]);
  });

  it('restores a backup within the limit (positive control)', async () => {
    const sources = assembleFileSources(
      { restoreBackup: backupstoreRestore({ root: disk, lockTiming: FAST_LOCKS }), sizeLimit: { maxImageSize: 4 * MiB } },
      undefined,
    );
    const r = await sources.restore(request([]));
    expect(r).toMatchObject({ size: 4 * MiB, sha512: createHash('sha512').update(image).digest('hex') });
    expect(await fsp.readdir(path.join(disk, 'tmp'))).toEqual(['big-x.tmp']);
  });
});
