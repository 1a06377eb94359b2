import { randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { BACKUPSTORE_BASE, BackupStoreError, throwIfAborted } from '../names.js';
import type { BackupStoreDriver } from './driver.js';

function isErrno(err: unknown, ...codes: string[]): boolean {
  return typeof err === 'object' && err !== null && codes.includes((err as NodeJS.ErrnoException).code ?? '');
}

function ioError(op: string, p: string, err: unknown): BackupStoreError {
  return new BackupStoreError('Io', `${op} ${p}: ${(err as Error).message}`, { cause: err });
}

async function writevFully(fh: fs.FileHandle, pieces: readonly Uint8Array[]): Promise<void> {
  let rest = pieces.filter((b) => b.byteLength > 0);
  while (rest.length > 0) {
    let { bytesWritten } = await fh.writev(rest as Uint8Array[]);
    while (rest.length > 0 && bytesWritten >= (rest[0] as Uint8Array).byteLength) {
      bytesWritten -= (rest[0] as Uint8Array).byteLength;
      rest = rest.slice(1);
    }
    if (bytesWritten > 0 && rest.length > 0) rest = [(rest[0] as Uint8Array).subarray(bytesWritten), ...rest.slice(1)];
  }
}

/** Longhorn's `fsops` over a local (or mounted) directory: the vfs and nfs drivers. */
export class FileSystemDriver implements BackupStoreDriver {
  constructor(
    readonly root: string,
    readonly url: string,
  ) {}

  private resolve(p: string): string {
    const full = path.resolve(this.root, p);
    if (full !== this.root && !full.startsWith(this.root + path.sep)) {
      throw new BackupStoreError('InvalidArgument', `path ${JSON.stringify(p)} escapes the store root`);
    }
    return full;
  }

  async read(p: string, signal?: AbortSignal): Promise<Buffer> {
    throwIfAborted(signal);
    try {
      return await fs.readFile(this.resolve(p), { signal });
    } catch (err) {
      if (isErrno(err, 'ENOENT')) throw new BackupStoreError('NotFound', `cannot find ${p} in backupstore`, { cause: err });
      if (isErrno(err, 'ABORT_ERR') && signal) throwIfAborted(signal);
      throw ioError('read', p, err);
    }
  }

  async readInto(p: string, target: Uint8Array, signal?: AbortSignal): Promise<number> {
    throwIfAborted(signal);
    let fh: fs.FileHandle;
    try {
      fh = await fs.open(this.resolve(p), 'r');
    } catch (err) {
      if (isErrno(err, 'ENOENT')) throw new BackupStoreError('NotFound', `cannot find ${p} in backupstore`, { cause: err });
      throw ioError('read', p, err);
    }
    try {
      const { size } = await fh.stat();
      if (size > target.byteLength) {
        throw new BackupStoreError('Corrupt', `${p} holds ${size} bytes, more than the ${target.byteLength} a stored block can have`);
      }
      let got = 0;
      while (got < size) {
        const { bytesRead } = await fh.read(target, got, size - got, got);
        if (bytesRead === 0) break;
        got += bytesRead;
      }
      if (got !== size) throw new BackupStoreError('Io', `read ${p}: the file shrank from ${size} to ${got} bytes while it was read`);
      return got;
    } catch (err) {
      if (err instanceof BackupStoreError) throw err;
      throw ioError('read', p, err);
    } finally {
      await fh.close().catch(() => undefined); // read-only descriptor: a close error loses nothing
    }
  }

  /** Writes `<dst>.tmp.<nanos>` then renames it over `<dst>`, creating parents with mode 0700. */
  async write(p: string, data: Uint8Array | string | readonly Uint8Array[], signal?: AbortSignal): Promise<void> {
    throwIfAborted(signal);
    const dst = this.resolve(p);
    const tmp = `${dst}.tmp.${process.hrtime.bigint()}${randomBytes(2).toString('hex')}`;
    try {
      await fs.mkdir(path.dirname(dst), { recursive: true, mode: 0o700 });
      const fh = await fs.open(tmp, 'w', 0o600);
      try {
        if (Array.isArray(data)) await writevFully(fh, data as readonly Uint8Array[]);
        else await fh.writeFile(data as Uint8Array | string);
        await fh.sync();
      } finally {
        await fh.close();
      }
      throwIfAborted(signal);
      await fs.rename(tmp, dst);
    } catch (err) {
      await fs.rm(tmp, { force: true }).catch(() => undefined); // best effort: the write error below is what matters
      if (err instanceof BackupStoreError) throw err;
      throw ioError('write', p, err);
    }
  }

  async exists(p: string, _signal?: AbortSignal): Promise<boolean> {
    try {
      const st = await fs.stat(this.resolve(p));
      return !st.isDirectory();
    } catch (err) {
      if (isErrno(err, 'ENOENT', 'ENOTDIR')) return false;
      throw ioError('stat', p, err);
    }
  }

  async list(dir: string, _signal?: AbortSignal): Promise<string[]> {
    try {
      return (await fs.readdir(this.resolve(dir))).sort();
    } catch (err) {
      if (isErrno(err, 'ENOENT')) return [];
      throw ioError('list', dir, err);
    }
  }

  async modificationTime(p: string, _signal?: AbortSignal): Promise<Date> {
    try {
      return (await fs.stat(this.resolve(p))).mtime;
    } catch (err) {
      if (isErrno(err, 'ENOENT')) throw new BackupStoreError('NotFound', `cannot find ${p} in backupstore`, { cause: err });
      throw ioError('stat', p, err);
    }
  }

  /** `RemoveAll`, then removes empty parents upward (at most 10 levels), stopping at `…/backupstore`. */
  async remove(p: string, _signal?: AbortSignal): Promise<void> {
    const full = this.resolve(p);
    try {
      await fs.rm(full, { recursive: true, force: true });
    } catch (err) {
      throw ioError('remove', p, err);
    }
    let dir = path.dirname(full);
    for (let i = 0; i < 10; i++) {
      if (dir === this.root || !dir.startsWith(this.root + path.sep) || dir.endsWith(path.sep + BACKUPSTORE_BASE)) break;
      try {
        await fs.rmdir(dir);
      } catch {
        break; // not empty (or already gone): stop pruning
      }
      dir = path.dirname(dir);
    }
  }

  async close(): Promise<void> {}
}
