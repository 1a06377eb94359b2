import { constants as fsConstants, promises as fsp } from 'node:fs';
import { alignedBuffer, DIRECT_IO_ALIGNMENT, isAlignedView } from '@bis/direct-io';

const O_DIRECT: number = typeof fsConstants.O_DIRECT === 'number' ? fsConstants.O_DIRECT : 0;

/**
 * The receiver's direct writes into one file: whole 4 KiB-aligned pieces of page-aligned slabs go with `O_DIRECT`,
 * from the slab to the device without a copy into the page cache, and nothing is left for the `fsync` at close.
 * (Longhorn's receiver writes with direct I/O too.) Slabs come from `@bis/direct-io` `alignedBuffer`; several
 * writes may run at once (the caller bounds them); anything not aligned is the caller's to write buffered.
 */
export class DirectWriter {
  #usable = O_DIRECT !== 0;
  #target: fsp.FileHandle | undefined;

  /** Whether direct writes are used (false before `openTarget`, and for good after the filesystem refused one). */
  get usable(): boolean {
    return this.#usable && this.#target !== undefined;
  }

  /** Opens the (existing) target file for direct writes; where the filesystem refuses `O_DIRECT`, they stay off. */
  async openTarget(filePath: string): Promise<void> {
    if (this.#target || !this.#usable) return;
    try {
      this.#target = await fsp.open(filePath, fsConstants.O_WRONLY | O_DIRECT);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'EINVAL' && code !== 'EOPNOTSUPP' && code !== 'ENOTSUP') throw err;
      this.#usable = false;
    }
  }

  /** A slab of `size` bytes at a page-aligned address (shared memory with `shared`, for a worker thread). */
  alignedBuffer(size: number, shared = false): Buffer {
    return alignedBuffer(size, { shared });
  }

  /** Whether `length` bytes of `buf` (from its start) may go to `position` with a direct write. */
  canWrite(buf: Buffer, length: number, position: number): boolean {
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
   * Writes `length` bytes of `buf` at `position` directly; returns how many were written. Fewer than `length` only when
   * the filesystem refused a direct write (EINVAL) or wrote a partial block: direct writes are then off for good and the
   * caller writes the rest buffered.
   */
  async write(buf: Buffer, length: number, position: number): Promise<number> {
    const target = this.#target;
    if (!target || !this.#usable) return 0;
    let off = 0;
    while (off < length) {
      let n: number;
      try {
        n = (await target.write(buf, off, length - off, position + off)).bytesWritten;
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

  async close(): Promise<void> {
    const target = this.#target;
    this.#target = undefined;
    await target?.close().catch(() => undefined);
  }
}
