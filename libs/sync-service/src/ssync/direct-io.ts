import { constants as fsConstants, promises as fsp, writeSync } from 'node:fs';
import path from 'node:path';

/**
 * File offsets and lengths of direct writes are multiples of this (the largest logical block size of common devices;
 * a smaller one divides it).
 */
export const DIRECT_IO_BLOCK = 4096;

const O_DIRECT: number = typeof fsConstants.O_DIRECT === 'number' ? fsConstants.O_DIRECT : 0;

/**
 * Writes of whole aligned blocks with `O_DIRECT` into one file: the bytes go from the caller's buffer to the device
 * without being copied into the page cache, and no dirty pages are left for the `fsync` at close to wait for.
 * (Longhorn's receiver writes with direct I/O too.)
 *
 * `O_DIRECT` needs buffers at addresses the device accepts, and JavaScript cannot see addresses: `alignedBuffer`
 * over-allocates and finds the usable start by probing, with a one-block direct write of each candidate start into a
 * scratch file in the target's directory that is unlinked as soon as it is created (an unaligned buffer is refused
 * with EINVAL, an aligned one is written). Reads cannot serve as the probe: a direct read of a hole is answered
 * without any alignment check.
 */
export class DirectWriter {
  #usable = true;
  #target: fsp.FileHandle | undefined;
  /** Memory handed out by `alignedBuffer`, with the aligned start found in it. */
  readonly #alignedStarts = new WeakMap<ArrayBufferLike, number>();

  private constructor(readonly probe: fsp.FileHandle) {}

  /**
   * Prepares direct writes into files of `dir`. Undefined when the platform or the filesystem has no direct I/O
   * (tmpfs refuses `O_DIRECT` with EINVAL), the directory cannot take the probe file, or no aligned buffer start is
   * found.
   */
  static async start(dir: string): Promise<DirectWriter | undefined> {
    if (O_DIRECT === 0) return undefined;
    const probePath = path.join(dir, `.direct-io-probe-${process.pid}-${Math.random().toString(36).slice(2)}`);
    let probe: fsp.FileHandle | undefined;
    try {
      probe = await fsp.open(probePath, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL | O_DIRECT, 0o600);
      await fsp.unlink(probePath);
      const w = new DirectWriter(probe);
      if (w.#alignedStart(new ArrayBuffer(2 * DIRECT_IO_BLOCK)) === undefined) {
        await probe.close();
        return undefined;
      }
      return w;
    } catch (err) {
      await probe?.close().catch(() => undefined);
      await fsp.unlink(probePath).catch(() => undefined);
      // no direct I/O here (EINVAL on tmpfs), or the directory is not usable: the receiver writes buffered, and reports
      // a missing directory when the sender opens the file
      void err;
      return undefined;
    }
  }

  /** Whether direct writes are used (false before `openTarget`, and for good after the filesystem refused one). */
  get usable(): boolean {
    return this.#usable && this.#target !== undefined;
  }

  /** Opens the (existing) target file for direct writes; without it, `canWrite` is false. */
  async openTarget(filePath: string): Promise<void> {
    if (this.#target) return;
    try {
      this.#target = await fsp.open(filePath, fsConstants.O_WRONLY | O_DIRECT);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'EINVAL' && code !== 'EOPNOTSUPP' && code !== 'ENOTSUP') throw err;
      this.#usable = false;
    }
  }

  /** The first offset of `memory` at which a direct write is accepted; undefined when there is none. */
  #alignedStart(memory: ArrayBufferLike): number | undefined {
    // array buffers are at least 16-byte aligned: one of these starts is 4096-aligned
    for (let k = 0; k + DIRECT_IO_BLOCK <= memory.byteLength && k < DIRECT_IO_BLOCK; k += 16) {
      try {
        writeSync(this.probe.fd, new Uint8Array(memory, k, DIRECT_IO_BLOCK), 0, DIRECT_IO_BLOCK, 0);
        return k;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EINVAL') throw err;
      }
    }
    return undefined;
  }

  /**
   * A buffer of `size` bytes at an address direct writes accept (plain memory, or shared memory with `shared`). When no
   * aligned start is found the buffer is still returned; `canWrite` is then false for it.
   */
  alignedBuffer(size: number, shared = false): Buffer {
    const memory = shared ? new SharedArrayBuffer(size + DIRECT_IO_BLOCK) : new ArrayBuffer(size + DIRECT_IO_BLOCK);
    const k = this.#alignedStart(memory);
    if (k === undefined) return Buffer.from(memory, 0, size);
    this.#alignedStarts.set(memory, k);
    return Buffer.from(memory, k, size);
  }

  /** Whether `length` bytes of `buf` (from its start) may go to `position` with a direct write. */
  canWrite(buf: Buffer, length: number, position: number): boolean {
    const start = this.#alignedStarts.get(buf.buffer);
    return (
      this.usable &&
      start !== undefined &&
      buf.byteOffset >= start &&
      (buf.byteOffset - start) % DIRECT_IO_BLOCK === 0 &&
      length > 0 &&
      length <= buf.length &&
      position % DIRECT_IO_BLOCK === 0 &&
      length % DIRECT_IO_BLOCK === 0
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
      if (n === 0 || n % DIRECT_IO_BLOCK !== 0) {
        this.#usable = false;
        return off;
      }
    }
    return off;
  }

  async close(): Promise<void> {
    const target = this.#target;
    this.#target = undefined;
    await Promise.allSettled([target?.close(), this.probe.close()]);
  }
}
