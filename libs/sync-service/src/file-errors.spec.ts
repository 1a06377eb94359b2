import { describe, it, expect } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { createFileSources } from '@bis/file-sources';
import { describeFileError } from './errors.js';
import { backingFilePath, backingImageDir } from './layout.js';
import { SyncService } from './sync-service.js';

const fsError = (code: string, syscall: string, p: string): NodeJS.ErrnoException =>
  Object.assign(new Error(`${code}: some text, ${syscall} '${p}'`), { code, syscall, path: p });

describe('file-system errors of a sync file say which file of which image and what to do', () => {
  const file = { filePath: '/d/backing-images/img-u1/backing', imageName: 'img' };

  it('names the file being written, the image, and what a missing file means', () => {
    const m = describeFileError(fsError('ENOENT', 'rename', `${file.filePath}.tmp`), file);
    expect(m).toBe(
      'the file being written of backing image img (/d/backing-images/img-u1/backing.tmp) is missing: something outside the system removed it (or its directory) from the disk while it was in use; this copy is lost and has to be made again (ENOENT)',
    );
    expect(m).not.toContain('no such file or directory');
    expect(describeFileError(fsError('ENOSPC', 'write', file.filePath), file)).toMatch(/^the disk of the file of backing image img \(\/d\/backing-images\/img-u1\/backing\) is full: free space/);
    expect(describeFileError(fsError('EACCES', 'open', '/d/x'), file)).toMatch(/^file \/d\/x of backing image img cannot be written or read: permission denied; check the owner and mode/);
    // Not a file-system error: the message stays as it is.
    expect(describeFileError(new Error('checksum mismatch'), file)).toBe('checksum mismatch');
  });

  it('an upload whose directory is removed meanwhile fails with that text in its state', async () => {
    const disk = await fsp.mkdtemp(path.join(os.tmpdir(), 'sync-file-errors-'));
    const sync = new SyncService({ diskPath: disk, sources: createFileSources({}), monitorIntervalMs: 0 });
    try {
      const filePath = backingFilePath(disk, 'img', 'u1');
      const chunk = randomBytes(1 << 20);
      async function* body() {
        yield chunk;
        // Something outside the system removes the image's directory with the file being written.
        await fsp.rm(backingImageDir(disk, 'img', 'u1'), { recursive: true, force: true });
        yield chunk;
      }
      await expect(sync.upload({ filePath, uuid: 'u1', size: 2 << 20, body: Readable.from(body()) })).rejects.toThrow(/backing image img .*is missing: something outside the system removed it/);
      const info = sync.list()[filePath];
      expect(info?.state).toBe('failed');
      expect(info?.message).toMatch(/^failed to process sync file: .* of backing image img .*is missing: .*has to be made again \(ENOENT\)$/);
      expect(info?.message).not.toContain('no such file or directory');
    } finally {
      await sync.close();
      await fsp.rm(disk, { recursive: true, force: true });
    }
  }, 60_000);
});
