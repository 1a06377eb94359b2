import type { FileHandle } from 'node:fs/promises';
import type { DirectTarget } from '@bis/direct-io';

/**
 * Direct writes in flight at once. With the writes after the answer, more of them keep the device busy: a Sync of 1 GiB
 * of data took 1.45-1.58 s with 1, about 1.25 s with 2 and 1.03-1.17 s with 6 or 8 (the daemon's thread pool has 8).
 */
const DIRECT_WRITES_IN_FLIGHT = 6;

/**
 * Writes received pieces into the target file: whole 4 KiB-aligned pieces with `O_DIRECT` through `direct` (no copy
 * into the page cache; at most DIRECT_WRITES_IN_FLIGHT at once), the rest buffered through the file handle, one
 * positioned write at a time.
 */
export class PieceWriter {
  /** Data bytes written with direct I/O and through the page cache. */
  readonly stats = { directBytes: 0, bufferedBytes: 0 };
  // One buffered write at a time: concurrent writes into one file contend for its inode lock in the kernel, which
  // costs more CPU (lock spinning) than the writes themselves; a 2 MiB write into the page cache takes well under 1 ms.
  #bufferedChain: Promise<unknown> = Promise.resolve();
  #directRunning = 0;
  readonly #directWaiting: Array<() => void> = [];

  constructor(private readonly direct: DirectTarget | undefined) {}

  /** Writes `length` bytes of `buf` at `position`; resolves when all of them are written. */
  async write(h: FileHandle, buf: Buffer, length: number, position: number): Promise<void> {
    let done = 0;
    const direct = this.direct;
    if (direct?.canWrite(buf, length, position)) {
      done = await this.#writeDirectly(() => direct.write(buf, length, position));
      this.stats.directBytes += done;
    }
    if (done < length) {
      await this.#writeSerially(h, buf.subarray(done), length - done, position + done);
      this.stats.bufferedBytes += length - done;
    }
  }

  #writeSerially(h: FileHandle, buf: Buffer, length: number, position: number): Promise<void> {
    const run = async (): Promise<void> => {
      let off = 0;
      while (off < length) {
        const { bytesWritten } = await h.write(buf, off, length - off, position + off);
        off += bytesWritten;
      }
    };
    const p = this.#bufferedChain.then(run, run);
    this.#bufferedChain = p.catch(() => undefined); // the chain only orders writes: each caller gets its own write's failure through `p`
    return p;
  }

  async #writeDirectly(w: () => Promise<number>): Promise<number> {
    // a finishing write hands its slot to the next waiting one
    if (this.#directRunning >= DIRECT_WRITES_IN_FLIGHT) await new Promise<void>((r) => this.#directWaiting.push(r));
    else this.#directRunning++;
    try {
      return await w();
    } finally {
      const next = this.#directWaiting.shift();
      if (next) next();
      else this.#directRunning--;
    }
  }
}
