import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { FileSourceProvider } from '@bis/file-sources/core';
import { SyncService } from './sync-service.js';
import { backingFilePath } from './layout.js';

const sha512 = (b: Uint8Array) => createHash('sha512').update(b).digest('hex');

let dir: string;
beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sync-pad-'));
});
afterEach(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

describe('a restore that zero-padded the image', () => {
  it('keeps both checksums: the file info carries the unpadded size and SHA-512, and a log line names both', async () => {
    const restored = randomBytes(1000);
    const padded = Buffer.concat([restored, Buffer.alloc(24)]);
    const unsupported = async (): Promise<never> => {
      throw new Error('not used');
    };
    // what the real restore source does (libs/file-sources restoreToFile): the padded file, both results
    const sources: FileSourceProvider = {
      download: unsupported,
      upload: unsupported,
      clone: unsupported,
      restore: async (req) => {
        await fsp.writeFile(req.dest, padded);
        req.sink.setSize(padded.length);
        req.sink.updateProgress(padded.length);
        return { size: padded.length, sha512: sha512(padded), virtualSize: padded.length, format: 'raw', unpadded: { size: 1000, sha512: sha512(restored) } };
      },
    };
    const logs: string[] = [];
    const svc = new SyncService({ diskPath: dir, monitorIntervalMs: 0, sources, log: (m) => logs.push(m) });
    try {
      const filePath = backingFilePath(dir, 'img', 'u1');
      await svc.restoreFromBackupURL({ filePath, uuid: 'u1', diskUUID: 'd1', backupUrl: 'vfs:///b?backingImage=img', concurrentLimit: 1, credential: {} });
      await svc.settled(filePath);
      const info = svc.get(filePath);
      expect(info.state).toBe('ready');
      expect(info.message).toBe('');
      expect(info.currentChecksum).toBe(sha512(padded));
      expect(info).toMatchObject({ size: 1024, unpaddedSize: 1000, unpaddedChecksum: sha512(restored) });
      expect(logs).toContain(`${filePath}: restored image was 1000 bytes (SHA-512 ${sha512(restored)}), zero-padded to 1024 bytes (SHA-512 ${sha512(padded)})`);
    } finally {
      await svc.close();
    }
  });
});
