import { rm, type FileHandle } from 'node:fs/promises';
import { alignedBuffer, DirectFileWriter } from '@bis/direct-io';
import { CREATE_NOFOLLOW, UPDATE_NOFOLLOW, openNoFollow } from './no-follow.js';
import { assertChecksumMatches, type ExpectedChecksum } from './checksum.js';
import { DEFAULT_CHAIN_SEGMENT, decodeChain, nativeSha512ChainAvailable } from '@bis/sha512-chain/record';
import { HashWorker } from './hash-worker.js';
import { hasQcow2Magic, assertSafeQcow2, QCOW2_HEADER_PROBE_BYTES } from './qcow2.js';
import type { ImageFormat, SourceResult } from './contract.js';
import { SizeLimitError, type SizeLimit } from './size-limit.js';

/** Granularity at which all-zero data is skipped (left as a hole) instead of written. */
export const SPARSE_BLOCK_SIZE = 4096;
/** Images are zero-padded to a multiple of this (Longhorn's direct-I/O requirement, longhorn#10536). */
export const SECTOR_SIZE = 512;
/** Bytes are gathered into slabs of this size; a full slab is hashed (worker thread) and written (thread pool). */
export const SLAB_BYTES = 4 << 20;
/** Slabs in flight at most: memory is bounded by SLAB_COUNT × SLAB_BYTES (16 MiB). */
export const SLAB_COUNT = 4;
/** Zero detection looks at this much at once before looking at single 4 KiB blocks. */
const ZERO_PROBE_BYTES = 64 << 10;
const ZEROS = Buffer.alloc(ZERO_PROBE_BYTES);

export interface ImageSinkOptions {
  expected?: ExpectedChecksum;
  /** Write all-zero blocks too (no holes), e.g. when writing into a block device. */
  writeZeros?: boolean;
  /**
   * Most bytes the image may have (before the zero-padding to a multiple of 512): a write that would go past it
   * fails with {@link SizeLimitError} and writes nothing of its chunk.
   */
  limit?: SizeLimit;
  /**
   * Record the file's SHA-512 chain in the same pass (segments of this many bytes; default 2 MiB, Longhorn's block
   * size; `false`: do not). Without the SHA-512 chain addon nothing is recorded.
   */
  chainSegment?: number | false;
}

interface Slab {
  shared: SharedArrayBuffer;
  buf: Buffer;
}

function isZero(buf: Buffer, start: number, end: number): boolean {
  return buf[start] === 0 && buf[end - 1] === 0 && buf.compare(ZEROS, 0, end - start, start, end) === 0;
}

/**
 * The runs of `buf` (which starts at absolute offset `at`) that must be written: all-zero 4 KiB blocks (aligned
 * to absolute offsets) are left out. Whole 64 KiB windows are checked first, so zero regions cost one compare
 * per 64 KiB and data regions cost one byte test per 4 KiB block.
 */
export function dataRuns(buf: Buffer, at: number): Array<[start: number, end: number]> {
  const runs: Array<[number, number]> = [];
  let runStart = -1;
  let off = 0;
  const block = (len: number): void => {
    const end = off + len;
    if (isZero(buf, off, end)) {
      if (runStart >= 0) runs.push([runStart, off]);
      runStart = -1;
    } else if (runStart < 0) {
      runStart = off;
    }
    off = end;
  };
  while (off < buf.length) {
    const abs = at + off;
    const toBlock = SPARSE_BLOCK_SIZE - (abs % SPARSE_BLOCK_SIZE);
    if (toBlock !== SPARSE_BLOCK_SIZE) {
      block(Math.min(toBlock, buf.length - off)); // unaligned head
      continue;
    }
    const window = Math.min(ZERO_PROBE_BYTES, buf.length - off);
    if (window === ZERO_PROBE_BYTES && isZero(buf, off, off + window)) {
      if (runStart >= 0) runs.push([runStart, off]);
      runStart = -1;
      off += window;
      continue;
    }
    const windowEnd = off + window;
    while (off < windowEnd) block(Math.min(SPARSE_BLOCK_SIZE, windowEnd - off));
  }
  if (runStart >= 0) runs.push([runStart, buf.length]);
  return runs;
}

/**
 * Receives the final bytes of an image in order and, in one pass: hashes them (SHA-512 plus the expected
 * algorithm) on a worker thread, inspects the qcow2 header, writes them at their offset with large positioned
 * writes while leaving all-zero 4 KiB blocks as holes, and at the end zero-pads the file to a multiple of 512
 * bytes (hashing the padding too) and truncates it to size. An expected checksum matches either the image as
 * received (before the padding) or the stored file.
 *
 * Bytes are copied into 4 MiB shared slabs; a full slab is handed to the hash worker and to the file system at the
 * same time, and `write` only waits when all slabs are busy, so receiving, hashing and writing overlap.
 */
export class ImageSink {
  #fh: FileHandle | undefined;
  readonly #writer: DirectFileWriter;
  readonly #hasher: HashWorker;
  #position = 0;
  #slab: Slab | undefined;
  #slabFill = 0;
  #slabStart = 0;
  readonly #free: Slab[] = [];
  #allocated = 0;
  readonly #inflight = new Set<Promise<void>>();
  #failure: unknown;
  #head: Buffer[] = [];
  #headLength = 0;
  #headChecked = false;
  #format: ImageFormat = 'raw';
  #virtualSize: number | undefined;
  #padding = false;

  private constructor(
    readonly dest: string,
    fh: FileHandle,
    writer: DirectFileWriter,
    private readonly options: ImageSinkOptions,
  ) {
    this.#fh = fh;
    this.#writer = writer;
    const extra = options.expected && options.expected.algorithm !== 'sha512' ? [options.expected.algorithm] : [];
    const segment = options.chainSegment ?? DEFAULT_CHAIN_SEGMENT;
    this.#hasher = new HashWorker(['sha512', ...extra], segment !== false && nativeSha512ChainAvailable() ? { chainSegment: segment } : {});
  }

  /** Creates (or truncates) `dest` and returns a sink writing into it. A symbolic link at `dest` is refused. */
  static async create(dest: string, options: ImageSinkOptions = {}): Promise<ImageSink> {
    const fh = await openNoFollow(dest, CREATE_NOFOLLOW);
    return new ImageSink(dest, fh, await ImageSink.#directWriter(dest, fh), options);
  }

  /**
   * Continues a partial file: keeps its first `offset` bytes (reading them once to hash them; nothing after
   * `offset` is kept) so that the following writes append at `offset`.
   */
  static async resume(dest: string, offset: number, options: ImageSinkOptions = {}): Promise<ImageSink> {
    const fh = await openNoFollow(dest, UPDATE_NOFOLLOW);
    const sink = new ImageSink(dest, fh, await ImageSink.#directWriter(dest, fh), options);
    try {
      const { size } = await fh.stat();
      if (size < offset) {
        throw new Error(`cannot resume ${dest} at offset ${offset}: only ${size} bytes were received so far`);
      }
      await fh.truncate(offset);
      while (sink.#position < offset) {
        const slab = await sink.#takeSlab();
        const { bytesRead } = await fh.read(slab.buf, 0, Math.min(SLAB_BYTES, offset - sink.#position), sink.#position);
        if (bytesRead === 0) {
          sink.#free.push(slab);
          break;
        }
        if (!sink.#headChecked) sink.#collectHead(slab.buf.subarray(0, bytesRead));
        sink.#slab = slab;
        sink.#slabStart = sink.#position;
        sink.#slabFill = bytesRead;
        sink.#position += bytesRead;
        sink.#dispatch(false);
      }
      await sink.#drain();
      return sink;
    } catch (e) {
      // The partial file stays as it was received (a later resume may still use it).
      while (sink.#inflight.size > 0) await Promise.all(sink.#inflight);
      await sink.#hasher.close();
      await sink.#writer.close();
      sink.#fh = undefined;
      await fh.close();
      throw e;
    }
  }

  /**
   * Data runs go to the file with `O_DIRECT` straight from the slabs (page-aligned shared memory), so the kernel
   * neither copies them into the page cache nor touches new page-cache memory; unaligned heads and tails, and
   * filesystems without direct I/O, are written through `fh`.
   */
  static async #directWriter(dest: string, fh: FileHandle): Promise<DirectFileWriter> {
    try {
      return await DirectFileWriter.open(dest, fh);
    } catch (e) {
      await fh.close().catch(() => undefined); // nothing was written yet
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
    if (this.#slab) this.#free.push(this.#slab);
    this.#slab = undefined;
    this.#slabFill = 0;
    await this.#drain();
    this.#position = 0;
    this.#head = [];
    this.#headLength = 0;
    this.#headChecked = false;
    this.#format = 'raw';
    this.#virtualSize = undefined;
    await this.#hasher.reset();
    await fh.truncate(0);
  }

  /**
   * Accepts the next bytes (copied: the caller may reuse `chunk`). Resolves at once while a slab is free;
   * otherwise when the oldest slab in flight has been hashed and written (backpressure).
   */
  async write(chunk: Buffer): Promise<void> {
    if (chunk.length === 0) return;
    this.#requireOpen();
    this.#throwIfFailed();
    const limit = this.options.limit;
    if (limit && !this.#padding && this.#position + chunk.length > limit.bytes) throw SizeLimitError.exceeded(limit);
    if (!this.#headChecked) this.#collectHead(chunk);
    let off = 0;
    while (off < chunk.length) {
      if (!this.#slab) {
        const slab = await this.#takeSlab();
        this.#throwIfFailed();
        this.#slab = slab;
        this.#slabFill = 0;
        this.#slabStart = this.#position;
      }
      const n = Math.min(chunk.length - off, SLAB_BYTES - this.#slabFill);
      chunk.copy(this.#slab.buf, this.#slabFill, off, off + n);
      this.#slabFill += n;
      this.#position += n;
      off += n;
      if (this.#slabFill === SLAB_BYTES) this.#dispatch(true);
    }
  }

  /**
   * The free part of the current slab (at most `max` bytes), for a socket to read the next bytes straight into;
   * `undefined` when every slab is in flight (wait with {@link whenRoom}). Hand what was read to {@link commitRead}
   * before asking again.
   */
  readRegion(max: number): Buffer | undefined {
    this.#requireOpen();
    if (!this.#slab) {
      const slab = this.#free.pop() ?? this.#allocateSlab();
      if (!slab) return undefined;
      this.#slab = slab;
      this.#slabFill = 0;
      this.#slabStart = this.#position;
    }
    const end = Math.min(SLAB_BYTES, this.#slabFill + Math.max(1, max));
    return this.#slab.buf.subarray(this.#slabFill, end);
  }

  /**
   * Accepts the first `n` bytes of the region {@link readRegion} returned last (they are not copied again). Bytes
   * past the size limit fail with {@link SizeLimitError} and are not taken.
   */
  commitRead(n: number): void {
    this.#requireOpen();
    this.#throwIfFailed();
    if (n <= 0) return;
    const slab = this.#slab;
    if (!slab || this.#slabFill + n > SLAB_BYTES) throw new Error('commitRead without a region to commit');
    const limit = this.options.limit;
    if (limit && !this.#padding && this.#position + n > limit.bytes) throw SizeLimitError.exceeded(limit);
    if (!this.#headChecked) this.#collectHead(slab.buf.subarray(this.#slabFill, this.#slabFill + n));
    this.#slabFill += n;
    this.#position += n;
    if (this.#slabFill === SLAB_BYTES) this.#dispatch(true);
  }

  /** Whether {@link readRegion} has a region to give now. */
  get hasRoom(): boolean {
    return this.#slab !== undefined || this.#free.length > 0 || this.#allocated < SLAB_COUNT;
  }

  /** Resolves once {@link hasRoom} (a slab in flight was hashed and written); rejects when one failed. */
  async whenRoom(): Promise<void> {
    while (!this.hasRoom) await Promise.race(this.#inflight);
    this.#throwIfFailed();
  }

  #allocateSlab(): Slab | undefined {
    if (this.#allocated >= SLAB_COUNT) return undefined;
    this.#allocated++;
    // page-aligned shared memory: the hash worker reads it and direct writes take it without a copy
    const buf = alignedBuffer(SLAB_BYTES, { shared: true });
    return { shared: buf.buffer as SharedArrayBuffer, buf };
  }

  async #takeSlab(): Promise<Slab> {
    for (;;) {
      const free = this.#free.pop();
      if (free) return free;
      const allocated = this.#allocateSlab();
      if (allocated) return allocated;
      await Promise.race(this.#inflight);
    }
  }

  /** Hands the current slab to the hash worker and (when `write`) to the file system; it is free again after both. */
  #dispatch(write: boolean): void {
    const slab = this.#slab!;
    const length = this.#slabFill;
    const start = this.#slabStart;
    this.#slab = undefined;
    this.#slabFill = 0;
    const hashed = this.#hasher.update(slab.shared, 0, length);
    let written: Promise<unknown> = Promise.resolve();
    if (write) {
      const data = slab.buf.subarray(0, length);
      const runs = this.options.writeZeros ? [[0, length] as [number, number]] : dataRuns(data, start);
      written = Promise.all(runs.map(([s, e]) => this.#writer.write(data.subarray(s, e), start + s)));
    }
    const done: Promise<void> = Promise.all([hashed, written]).then(
      () => undefined,
      (e: unknown) => {
        this.#failure ??= e;
      },
    );
    const tracked = done.finally(() => {
      this.#inflight.delete(tracked);
      this.#free.push(slab);
    });
    this.#inflight.add(tracked);
  }

  /** Writes the partial slab and waits until everything in flight is hashed and written. */
  async #drain(): Promise<void> {
    if (this.#slab && this.#slabFill > 0) this.#dispatch(true);
    while (this.#inflight.size > 0) await Promise.all(this.#inflight);
    this.#throwIfFailed();
  }

  #throwIfFailed(): void {
    if (this.#failure !== undefined) throw this.#failure;
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
    const pad = (SECTOR_SIZE - (this.#position % SECTOR_SIZE)) % SECTOR_SIZE;
    // The digests of the image as received, before the padding: an expected checksum published for the original
    // (unaligned) image must still match.
    let asReceived: string[] | undefined;
    if (pad > 0) {
      await this.#drain();
      asReceived = await this.#hasher.peek();
      this.#padding = true; // the padding is not part of the image the limit bounds
      await this.write(Buffer.alloc(pad)); // zeros: hashed, left as a hole, covered by the truncate
    }
    await this.#drain();
    await this.#writer.close();
    await fh.truncate(this.#position);
    await fh.close();
    this.#fh = undefined;
    const {
      digests: [sha512, extra],
      chain,
    } = await this.#hasher.digestWithChain();
    await this.#hasher.close();
    const expected = this.options.expected;
    if (expected) {
      const stored = expected.algorithm === 'sha512' ? sha512! : extra!;
      const received = asReceived && (expected.algorithm === 'sha512' ? asReceived[0] : asReceived[1]);
      if (received === undefined || expected.value !== received) assertChecksumMatches(expected, stored);
    }
    return {
      size: this.#position,
      sha512: sha512!,
      virtualSize: this.#format === 'qcow2' ? this.#virtualSize! : this.#position,
      format: this.#format,
      ...(expected ? { expectedChecksumVerified: true } : {}),
      ...(chain ? { chain: decodeChain(chain) } : {}),
    };
  }

  /** Closes the file and removes it (the partial file never survives a failure or cancellation). */
  async discard(): Promise<void> {
    const fh = this.#fh;
    this.#fh = undefined;
    this.#slab = undefined;
    while (this.#inflight.size > 0) await Promise.all(this.#inflight);
    await this.#hasher.close();
    await this.#writer.close().catch(() => undefined); // the file is removed next
    await fh?.close().catch(() => undefined); // the file is removed next: a close error loses nothing
    await rm(this.dest, { force: true });
  }

  #requireOpen(): FileHandle {
    if (!this.#fh) throw new Error(`image sink for ${this.dest} is closed`);
    return this.#fh;
  }
}
