import { createWriteStream, promises as fsp, type WriteStream } from 'node:fs';
import path from 'node:path';
import { Writable } from 'node:stream';

export interface RotatingLogOptions {
  /** Rotate when the current file would exceed this size. Default 10 MiB. */
  maxBytes?: number;
  /** Rotated files kept (`file.1` newest … `file.N`). Default 3. */
  maxFiles?: number;
}

/**
 * An append-only log file capped in size: when a write would exceed `maxBytes`, the file is renamed to
 * `.1` (older ones shift up, the oldest is dropped) and a new file is started. Total disk use is bounded by
 * about (maxFiles + 1) × maxBytes.
 */
export class RotatingLogFile extends Writable {
  private out: WriteStream | undefined;
  private size = 0;
  private readonly maxBytes: number;
  private readonly maxFiles: number;

  constructor(
    readonly file: string,
    opts: RotatingLogOptions = {},
  ) {
    super();
    this.maxBytes = Math.max(1024, opts.maxBytes ?? 10 << 20);
    this.maxFiles = Math.max(0, opts.maxFiles ?? 3);
  }

  override _construct(cb: (err?: Error | null) => void): void {
    fsp
      .mkdir(path.dirname(this.file), { recursive: true })
      .then(() => fsp.stat(this.file).then((s) => s.size, () => 0))
      .then(async (size) => {
        this.size = size;
        await this.open();
        cb();
      }, cb);
  }

  private open(): Promise<void> {
    return new Promise((resolve, reject) => {
      const s = createWriteStream(this.file, { flags: 'a' });
      s.once('open', () => {
        s.off('error', reject);
        this.out = s;
        resolve();
      });
      s.once('error', reject);
    });
  }

  private closeCurrent(): Promise<void> {
    const s = this.out;
    this.out = undefined;
    if (!s) return Promise.resolve();
    return new Promise((resolve) => s.end(resolve));
  }

  private async rotate(): Promise<void> {
    await this.closeCurrent();
    if (this.maxFiles === 0) {
      await fsp.rm(this.file, { force: true });
    } else {
      await fsp.rm(`${this.file}.${this.maxFiles}`, { force: true });
      // A missing older file is normal (fewer files than maxFiles so far); rotation goes on with the others.
      for (let i = this.maxFiles - 1; i >= 1; i--) await fsp.rename(`${this.file}.${i}`, `${this.file}.${i + 1}`).catch(() => undefined);
      await fsp.rename(this.file, `${this.file}.1`).catch(() => undefined);
    }
    this.size = 0;
    await this.open();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    // Its outcome goes to the stream callback `cb` (success or error).
    void (async () => {
      let offset = 0;
      while (offset < chunk.length) {
        if (this.size >= this.maxBytes) await this.rotate();
        const room = this.maxBytes - this.size;
        const part = chunk.subarray(offset, offset + room);
        await new Promise<void>((resolve, reject) => (this.out as WriteStream).write(part, (e) => (e ? reject(e) : resolve())));
        this.size += part.length;
        offset += part.length;
      }
    })().then(() => cb(), cb);
  }

  /** The lines that arrived while a write was in flight go to the file in one write (a busy process logs thousands). */
  override _writev(chunks: { chunk: Buffer; encoding: BufferEncoding }[], cb: (err?: Error | null) => void): void {
    this._write(chunks.length === 1 ? chunks[0]!.chunk : Buffer.concat(chunks.map((c) => c.chunk)), chunks[0]!.encoding, cb);
  }

  override _final(cb: (err?: Error | null) => void): void {
    this.closeCurrent().then(() => cb(), cb);
  }
}
