import { constants as fsConstants, promises as fsp } from 'node:fs';
import path from 'node:path';
import { DIRECT_IO_ALIGNMENT, isAlignedView } from './aligned.js';

const O_DIRECT: number = typeof fsConstants.O_DIRECT === 'number' ? fsConstants.O_DIRECT : 0;

/** Set to `0` to turn direct writes off (every write then goes through the caller's buffered handle). */
export const DISABLE_DIRECT_IO_ENV = 'BIS_DIRECT_IO';

/**
 * A second descriptor on a file, opened with `O_DIRECT`, for writes of whole 4096-byte blocks from aligned buffers
 * (`alignedBuffer`): the bytes go from the buffer to the device without a copy into the page cache. Anything it does
 * not take is the caller's to write through its buffered handle; the kernel keeps both kinds of write coherent.
 *
 * It is off (`usable` false) before `open`, on platforms without `O_DIRECT`, where the filesystem refuses it (tmpfs
 * before Linux 6.6 answers EINVAL), when `BIS_DIRECT_IO=0`, and for good once a direct write was refused or partial.
 * Several writes may run at once; the caller bounds them.
 */
export class DirectTarget {
  #usable = O_DIRECT !== 0 && process.env[DISABLE_DIRECT_IO_ENV] !== '0';
  #fh: fsp.FileHandle | undefined;

  /** Whether direct writes are in use. */
  get usable(): boolean {
    return this.#usable && this.#fh !== undefined;
  }

  /**
   * Opens the (existing) file for direct writes; where the filesystem refuses `O_DIRECT`, they stay off. A symbolic
   * link at `filePath` is not followed (the open fails with `ELOOP`).
   */
  async open(filePath: string): Promise<void> {
    if (this.#fh || !this.#usable) return;
    try {
      this.#fh = await fsp.open(filePath, fsConstants.O_WRONLY | O_DIRECT | fsConstants.O_NOFOLLOW);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'EINVAL' && code !== 'EOPNOTSUPP' && code !== 'ENOTSUP') throw err;
      this.#usable = false;
    }
  }

  /** Whether `length` bytes of `buf` (from its start) may go to `position` with a direct write. */
  canWrite(buf: Uint8Array, length: number, position: number): boolean {
    return (
      this.usable &&
      isAlignedView(buf) &&
      length > 0 &&
      length <= buf.length &&
      position % DIRECT_IO_ALIGNMENT === 0 &&
      length % DIRECT_IO_ALIGNMENT === 0
    );
  }

  /**
   * Writes `length` bytes of `buf` at `position` directly; returns how many were written. Fewer than `length` only
   * when the filesystem refused a direct write (EINVAL) or wrote a partial block: direct writes are then off for good
   * and the caller writes the rest buffered. Other errors are thrown.
   */
  async write(buf: Uint8Array, length: number, position: number): Promise<number> {
    const fh = this.#fh;
    if (!fh || !this.#usable) return 0;
    let off = 0;
    while (off < length) {
      let n: number;
      try {
        n = (await fh.write(buf, off, length - off, position + off)).bytesWritten;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EINVAL') throw err;
        this.#usable = false;
        return off;
      }
      off += n;
      if (n === 0 || n % DIRECT_IO_ALIGNMENT !== 0) {
        this.#usable = false;
        return off;
      }
    }
    return off;
  }

  /** Closes the direct descriptor (direct writes are off from then on). */
  async close(): Promise<void> {
    const fh = this.#fh;
    this.#fh = undefined;
    await fh?.close().catch(() => undefined); // O_DIRECT writes bypass the page cache: a close error loses no data
  }
}

/**
 * Whether files in directory `dir` can be opened with `O_DIRECT` (ext4 and xfs: yes; tmpfs before Linux 6.6: no):
 * creates a scratch file there, opens it so, and removes it. Other errors (a missing directory) are thrown.
 */
export async function directIoSupported(dir: string): Promise<boolean> {
  if (O_DIRECT === 0) return false;
  const f = path.join(dir, `.o-direct-check-${process.pid}-${Math.random().toString(36).slice(2)}`);
  try {
    await (await fsp.open(f, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL | O_DIRECT, 0o600)).close();
    return true;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EINVAL' || code === 'EOPNOTSUPP' || code === 'ENOTSUP') return false;
    throw err;
  } finally {
    await fsp.rm(f, { force: true });
  }
}
