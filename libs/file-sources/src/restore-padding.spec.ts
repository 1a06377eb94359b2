import { describe, expect, it } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { restoreToFile, type RestoreBackupFn } from './sources.js';

// The size of the Longhorn-written fixture backup in libs/backupstore/test-data/longhorn-backupstore-lz4: not a
// multiple of 512. The backup engine restores its bytes exactly; the source pads them like a download.
const UNALIGNED = 9_437_307;
const sha512 = (b: Uint8Array) => createHash('sha512').update(b).digest('hex');

describe('restoreToFile of an image whose size is not a multiple of 512', () => {
  it('zero-pads the file to the next multiple of 512, returns the padded SHA-512 and the restored one, and verifies the expected checksum against the restored bytes', async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'restore-pad-'));
    try {
      const bytes = randomBytes(UNALIGNED);
      const restore: RestoreBackupFn = async ({ output, onProgress }) => {
        await fsp.writeFile(output, bytes);
        onProgress(UNALIGNED, UNALIGNED);
        return { size: UNALIGNED, sha512: sha512(bytes) };
      };
      const dest = path.join(dir, 'backing.tmp');
      const progress: number[] = [];
      const r = await restoreToFile(
        {
          backupUrl: 's3://bucket@region/?backingImage=fixture-lz4',
          concurrentLimit: 2,
          credential: {},
          dest,
          signal: new AbortController().signal,
          sink: { setSize: () => undefined, updateProgress: (n) => progress.push(n) },
          expectedChecksum: sha512(bytes),
        },
        restore,
      );
      const stored = await fsp.readFile(dest);
      expect(stored.length).toBe(9_437_696);
      expect(stored.length % 512).toBe(0);
      expect(stored.subarray(0, UNALIGNED).equals(bytes)).toBe(true);
      expect(stored.subarray(UNALIGNED).every((b) => b === 0)).toBe(true);
      expect(r).toMatchObject({ size: 9_437_696, sha512: sha512(stored), virtualSize: 9_437_696, format: 'raw', expectedChecksumVerified: true, unpadded: { size: UNALIGNED, sha512: sha512(bytes) } });
      expect(progress[progress.length - 1]).toBe(9_437_696);
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
  it('takes the padded SHA-512 as the expected checksum too (what recovering an image from its backup asks for), and refuses any other with the stored checksum', async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'restore-pad-'));
    try {
      const bytes = randomBytes(UNALIGNED);
      const padded = Buffer.concat([bytes, Buffer.alloc(9_437_696 - UNALIGNED)]);
      const restore: RestoreBackupFn = async ({ output, onProgress }) => {
        await fsp.writeFile(output, bytes);
        onProgress(UNALIGNED, UNALIGNED);
        return { size: UNALIGNED, sha512: sha512(bytes) };
      };
      const run = (expectedChecksum: string, dest: string) =>
        restoreToFile(
          {
            backupUrl: 's3://bucket@region/?backingImage=fixture-lz4',
            concurrentLimit: 2,
            credential: {},
            dest,
            signal: new AbortController().signal,
            sink: { setSize: () => undefined, updateProgress: () => undefined },
            expectedChecksum,
          },
          restore,
        );
      const r = await run(sha512(padded), path.join(dir, 'a.tmp'));
      expect(r).toMatchObject({ size: 9_437_696, sha512: sha512(padded), expectedChecksumVerified: true, unpadded: { size: UNALIGNED, sha512: sha512(bytes) } });
      const wrong = sha512(Buffer.from('something else'));
      await expect(run(wrong, path.join(dir, 'b.tmp'))).rejects.toThrow(`the expected checksum ${wrong} doesn't match the file actual checksum ${sha512(padded)}`);
      await expect(fsp.stat(path.join(dir, 'b.tmp'))).rejects.toThrow();
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});
