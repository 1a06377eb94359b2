import { open, rm, type FileHandle } from 'node:fs/promises';
import { StreamHasher, type ExpectedChecksum } from './checksum.js';
import { hasQcow2Magic, assertSafeQcow2, QCOW2_HEADER_PROBE_BYTES } from './qcow2.js';
import type { ImageFormat, SourceResult } from './contract.js';

/** Granularity at which all-zero data is skipped (left as a hole) instead of written. */
export const SPARSE_BLOCK_SIZE = 4096;
/** Images are zero-padded to a multiple of this (Longhorn's direct-I/O requirement, longhorn#10536). */
export const SECTOR_SIZE = 512;
const FLUSH_BYTES = 1 << 20;
const ZEROS = Buffer.alloc(SPARSE_BLOCK_SIZE);

export interface ImageSinkOptions {
  expected?: ExpectedChecksum;
  /** Write all-zero blocks too (no holes), e.g. when writing into a block device. */
  writeZeros?: boolean;
}

/**
 * Receives the final bytes of an image in order and, in one pass: hashes them (SHA-512 plus the expected
 * algorithm), inspects the qcow2 header, writes them at their offset while leaving all-zero 4 KiB blocks as holes,
 * and at the end zero-pads the file to a multiple of 512 bytes (hashing the padding too) and truncates it to size.
 */
export class ImageSink {
  #fh: FileHandle | undefined;
  #hasher: StreamHasher;
  #position = 0;
  #pending: Buffer[] = [];
  #pendingStart = 0;
  #pendingLength = 0;
  #head: Buffer[] = [];
  #headLength = 0;
  #headChecked = false;
  #format: ImageFormat = 'raw';
  #virtualSize: number | undefined;

  private constructor(
    readonly dest: string,
    fh: FileHandle,
    private readonly options: ImageSinkOptions,
  ) {
    this.#fh = fh;
    this.#hasher = new StreamHasher(options.expected);
  }

  /** Creates (or truncates) `dest` and returns a sink writing into it. */
  static async create(dest: string, options: ImageSinkOptions = {}): Promise<ImageSink> {
    const fh = await open(dest, 'w', 0o644);
    return new ImageSink(dest, fh, options);
  }

  /**
   * Continues a partial file: keeps its first `offset` bytes (reading them once to hash them; nothing after
   * `offset` is kept) so that the following writes append at `offset`.
   */
  static async resume(dest: string, offset: number, options: ImageSinkOptions = {}): Promise<ImageSink> {
    const fh = await open(dest, 'r+');
    const sink = new ImageSink(dest, fh, options);
    try {
      const { size } = await fh.stat();
      if (size < offset) {
        throw new Error(`cannot resume ${dest} at offset ${offset}: only ${size} bytes were received so far`);
      }
      await fh.truncate(offset);
      const buf = Buffer.allocUnsafe(1 << 20);
      let pos = 0;
      while (pos < offset) {
        const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, offset - pos), pos);
        if (bytesRead === 0) break;
        const part = buf.subarray(0, bytesRead);
        if (!sink.#headChecked) sink.#collectHead(part);
        sink.#hasher.update(part);
        pos += bytesRead;
      }
      sink.#position = pos;
      return sink;
    } catch (e) {
      await fh.close();
      throw e;
    }
  }

  /** Bytes accepted so far. */
  get position(): number {
    return this.#position;
  }

  /** Forgets everything written: truncates the file to 0 and starts the hashes again (a restart from byte 0). */
  async reset(): Promise<void> {
    const fh = this.#requireOpen();
    this.#pending = [];
    this.#pendingLength = 0;
    this.#position = 0;
    this.#head = [];
    this.#headLength = 0;
    this.#headChecked = false;
    this.#format = 'raw';
    this.#virtualSize = undefined;
    this.#hasher = new StreamHasher(this.options.expected);
    await fh.truncate(0);
  }

  /** Accepts the next bytes. Resolves when they are hashed and queued (written once 1 MiB is queued). */
  async write(chunk: Buffer): Promise<void> {
    if (chunk.length === 0) return;
    this.#requireOpen();
    if (!this.#headChecked) this.#collectHead(chunk);
    this.#hasher.update(chunk);
    const start = this.#position;
    this.#position += chunk.length;
    if (this.options.writeZeros) {
      this.#queue(chunk, start);
    } else {
      // Split at absolute 4 KiB boundaries; queue runs of non-zero blocks, skip zero blocks.
      let off = 0;
      let runStart = -1;
      while (off < chunk.length) {
        const abs = start + off;
        const end = Math.min(chunk.length, off + (SPARSE_BLOCK_SIZE - (abs % SPARSE_BLOCK_SIZE)));
        const len = end - off;
        const zero = chunk[off] === 0 && chunk.compare(ZEROS, 0, len, off, end) === 0;
        if (zero) {
          if (runStart >= 0) this.#queue(chunk.subarray(runStart, off), start + runStart);
          runStart = -1;
        } else if (runStart < 0) {
          runStart = off;
        }
        off = end;
      }
      if (runStart >= 0) this.#queue(chunk.subarray(runStart), start + runStart);
    }
    if (this.#pendingLength >= FLUSH_BYTES) await this.#flush();
  }

  #queue(buf: Buffer, at: number): void {
    if (this.#pendingLength > 0 && this.#pendingStart + this.#pendingLength !== at) {
      // Not contiguous with the queued run: it is written by the next flush, in order.
      this.#pendingBreaks.push({ start: this.#pendingStart, buffers: this.#pending });
      this.#pending = [];
      this.#pendingLength = 0;
    }
    if (this.#pendingLength === 0) this.#pendingStart = at;
    this.#pending.push(buf);
    this.#pendingLength += buf.length;
  }

  #pendingBreaks: Array<{ start: number; buffers: Buffer[] }> = [];

  async #flush(): Promise<void> {
    const fh = this.#requireOpen();
    const runs = this.#pendingBreaks;
    this.#pendingBreaks = [];
    if (this.#pendingLength > 0) runs.push({ start: this.#pendingStart, buffers: this.#pending });
    this.#pending = [];
    this.#pendingLength = 0;
    for (const run of runs) {
      let pos = run.start;
      let bufs = run.buffers;
      while (bufs.length > 0) {
        const { bytesWritten } = await fh.writev(bufs, pos);
        pos += bytesWritten;
        bufs = advance(bufs, bytesWritten);
      }
    }
  }

  #collectHead(chunk: Buffer): void {
    const need = QCOW2_HEADER_PROBE_BYTES - this.#headLength;
    const part = chunk.subarray(0, need);
    this.#head.push(Buffer.from(part));
    this.#headLength += part.length;
    if (this.#headLength >= QCOW2_HEADER_PROBE_BYTES) this.#checkHead();
  }

  #checkHead(): void {
    this.#headChecked = true;
    const head = Buffer.concat(this.#head);
    this.#head = [];
    if (hasQcow2Magic(head)) {
      const h = assertSafeQcow2(head);
      this.#format = 'qcow2';
      this.#virtualSize = h.virtualSize;
    }
  }

  /**
   * Writes what is queued, pads to a multiple of 512 bytes, sets the file size, closes the file and checks the
   * expected checksum (throws {@link ChecksumMismatchError}).
   */
  async finish(): Promise<SourceResult> {
    const fh = this.#requireOpen();
    if (!this.#headChecked && this.#headLength > 0) this.#checkHead();
    await this.#flush();
    const pad = (SECTOR_SIZE - (this.#position % SECTOR_SIZE)) % SECTOR_SIZE;
    if (pad > 0) {
      this.#hasher.update(Buffer.alloc(pad));
      this.#position += pad;
    }
    await fh.truncate(this.#position);
    await fh.close();
    this.#fh = undefined;
    const { sha512 } = this.#hasher.digest();
    return {
      size: this.#position,
      sha512,
      virtualSize: this.#format === 'qcow2' ? this.#virtualSize! : this.#position,
      format: this.#format,
    };
  }

  /** Closes the file and removes it (the partial file never survives a failure or cancellation). */
  async discard(): Promise<void> {
    const fh = this.#fh;
    this.#fh = undefined;
    await fh?.close().catch(() => undefined);
    await rm(this.dest, { force: true });
  }

  #requireOpen(): FileHandle {
    if (!this.#fh) throw new Error(`image sink for ${this.dest} is closed`);
    return this.#fh;
  }
}

function advance(bufs: Buffer[], n: number): Buffer[] {
  let i = 0;
  while (i < bufs.length && n >= bufs[i]!.length) n -= bufs[i++]!.length;
  const rest = bufs.slice(i);
  if (n > 0 && rest.length > 0) rest[0] = rest[0]!.subarray(n);
  return rest;
}
