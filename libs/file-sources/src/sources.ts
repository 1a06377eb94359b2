import { createReadStream } from 'node:fs';
import { rm, stat } from 'node:fs/promises';
import { assertChecksumMatches, parseExpectedChecksum, StreamHasher } from './checksum.js';
import type { CloneRequest, RestoreRequest, SourceResult, UploadRequest } from './contract.js';
import { SourceCancelledError, SourceError, throwIfAborted } from './errors.js';
import { ImageSink, SECTOR_SIZE } from './image-sink.js';
import { linkedController, pumpOnce, ThrottledProgress } from './download.js';
import { assertSafeQcow2, hasQcow2Magic, QCOW2_HEADER_PROBE_BYTES } from './qcow2.js';
import type { Readable } from 'node:stream';
import type { Sha512Chain } from '@bis/sha512-chain';
import { imageSizeLimit, SizeLimitError, type SizeLimit, type SizeLimitPolicy } from './size-limit.js';
import { READ_NOFOLLOW, UPDATE_NOFOLLOW, openNoFollow } from './no-follow.js';

export interface StreamSettings {
  stallTimeoutMs: number;
  /** Bounds the image written; default: the destination disk's free space, at most 2 TiB. */
  sizeLimit?: SizeLimitPolicy;
}

/**
 * Streams an upload body into `req.dest`. The declared `size` is required: more bytes than declared fail at once,
 * fewer fail at the end. With `offset > 0` the partial file is continued at `offset` (resumable upload).
 */
export async function uploadToFile(req: UploadRequest, s: StreamSettings): Promise<SourceResult> {
  const expected = parseExpectedChecksum(req.expectedChecksum);
  const offset = req.offset ?? 0;
  if (!Number.isSafeInteger(req.size) || req.size <= 0) {
    throw new SourceError(`invalid upload size ${req.size}: a positive number of bytes is required`);
  }
  if (!Number.isSafeInteger(offset) || offset < 0 || offset > req.size) {
    throw new SourceError(`invalid upload offset ${offset} for size ${req.size}`);
  }
  throwIfAborted(req.signal);
  // The declared size is refused before anything is written; the sink enforces the same limit on the bytes.
  const limit = await imageSizeLimit(req.dest, s.sizeLimit, offset);
  if (req.size > limit.bytes) throw SizeLimitError.declared(limit, 'the upload\'s declared size', req.size);
  const sink = offset > 0 ? await ImageSink.resume(req.dest, offset, { expected, limit }) : await ImageSink.create(req.dest, { expected, limit });
  req.sink.setSize(req.size);
  const progress = new ThrottledProgress(req.sink);
  try {
    let received = offset;
    const { ctl, unlink } = linkedController(req.signal);
    const onAbort = (): void => void req.body.destroy();
    ctl.signal.addEventListener('abort', onAbort, { once: true });
    try {
      await pumpOnce(limitBytes(req.body, req.size - offset), sink, s, req.signal, (n) => progress.update((received = offset + n)), ctl);
    } finally {
      ctl.signal.removeEventListener('abort', onAbort);
      unlink();
    }
    progress.flush();
    if (received !== req.size) {
      throw new SourceError(`processed data size ${received} does not match the expected file size ${req.size}`);
    }
    return await sink.finish();
  } catch (e) {
    await sink.discard();
    if (req.signal.aborted) throw new SourceCancelledError(req.signal.reason);
    throw e;
  }
}

async function* limitBytes(body: Readable, max: number): AsyncGenerator<Buffer> {
  let n = 0;
  for await (const chunk of body as AsyncIterable<Buffer>) {
    n += chunk.length;
    if (n > max) throw new SourceError(`the upload has more bytes than the declared size (more than ${max} bytes)`);
    yield chunk;
  }
}

export interface CloneSettings extends StreamSettings {
  /** Performs encrypt/decrypt clones; when absent those fail with a clear error. */
  encryption?: (req: CloneRequest) => Promise<SourceResult>;
}

/** Copies a ready backing file into `req.dest` with sparse writes (encryption `ignore`). */
export async function cloneToFile(req: CloneRequest, s: CloneSettings): Promise<SourceResult> {
  if (req.encryption !== 'ignore') {
    if (!s.encryption) {
      throw new SourceError(`clone with encryption "${req.encryption}" is not available: no LUKS support is configured`);
    }
    return s.encryption(req);
  }
  const expected = parseExpectedChecksum(req.expectedChecksum);
  const st = await stat(req.sourcePath).catch((e: NodeJS.ErrnoException) => {
    throw new SourceError(`cannot clone from ${req.sourcePath}: ${e.code === 'ENOENT' ? 'the source backing file does not exist' : e.message}`);
  });
  if (!st.isFile()) throw new SourceError(`cannot clone from ${req.sourcePath}: not a regular file`);
  throwIfAborted(req.signal);
  const limit = await imageSizeLimit(req.dest, s.sizeLimit);
  if (st.size > limit.bytes) throw SizeLimitError.declared(limit, 'the clone source', st.size);
  const sink = await ImageSink.create(req.dest, { expected, limit });
  req.sink.setSize(st.size);
  const progress = new ThrottledProgress(req.sink);
  try {
    const body = createReadStream(req.sourcePath, { highWaterMark: 1 << 20 });
    const { ctl, unlink } = linkedController(req.signal);
    const onAbort = (): void => void body.destroy();
    ctl.signal.addEventListener('abort', onAbort, { once: true });
    try {
      await pumpOnce(body as AsyncIterable<Buffer>, sink, s, req.signal, (n) => progress.update(n), ctl);
    } finally {
      ctl.signal.removeEventListener('abort', onAbort);
      unlink();
    }
    progress.flush();
    return await sink.finish();
  } catch (e) {
    await sink.discard();
    if (req.signal.aborted) throw new SourceCancelledError(req.signal.reason);
    throw e;
  }
}

/** The backup engine's restore (from `@bis/backupstore`), injected by the composition root. */
export type RestoreBackupFn = (args: {
  backupUrl: string;
  output: string;
  concurrency: number;
  credential: Record<string, string>;
  signal: AbortSignal;
  onProgress: (processed: number, total: number) => void;
  /**
   * Called with the image size the backup declares, after its config is read and before the output is created: a
   * throw stops the restore with that error and nothing is written.
   */
  checkSize: (size: number) => void;
}) => Promise<{ size: number; sha512: string; chain?: Sha512Chain }>;

/** Reads `file` (not following a link at its name) in 1 MiB chunks. */
async function* readNoFollow(file: string): AsyncGenerator<Buffer> {
  const fh = await openNoFollow(file, READ_NOFOLLOW);
  try {
    yield* fh.createReadStream({ highWaterMark: 1 << 20, autoClose: false }) as AsyncIterable<Buffer>;
  } finally {
    await fh.close();
  }
}

/**
 * Restores a backing image from a backup URL through the backup engine, then checks what the engine cannot: the
 * expected checksum (re-reading the file only when it is not SHA-512), the qcow2 header, and 512-byte padding.
 *
 * The image is bounded like every other source ({@link imageSizeLimit}): the size the backup declares is checked
 * before the engine writes anything, and a restore that reports or produces more bytes than the limit is stopped
 * with a {@link SizeLimitError}. On every failure the output is removed.
 */
export async function restoreToFile(req: RestoreRequest, restore: RestoreBackupFn | undefined, s: { sizeLimit?: SizeLimitPolicy } = {}): Promise<SourceResult> {
  if (!restore) throw new SourceError('restore from a backup is not available: no backup engine is configured');
  const expected = parseExpectedChecksum(req.expectedChecksum);
  if (!Number.isSafeInteger(req.concurrentLimit) || req.concurrentLimit < 1) {
    throw new SourceError(`invalid concurrent-limit ${req.concurrentLimit}: it must be a positive integer`);
  }
  throwIfAborted(req.signal);
  const limit: SizeLimit = await imageSizeLimit(req.dest, s.sizeLimit);
  // Stops the engine when it reports more than the limit (an engine that does not call checkSize, or a store whose
  // blocks go past the declared size); the reason is the SizeLimitError, not a cancellation.
  const { ctl, unlink } = linkedController(req.signal);
  let tooLarge: SizeLimitError | undefined;
  const stop = (err: SizeLimitError): never => {
    tooLarge ??= err;
    ctl.abort(err);
    throw err;
  };
  let sizeSet = false;
  try {
    const restored = await restore({
      backupUrl: req.backupUrl,
      output: req.dest,
      concurrency: req.concurrentLimit,
      credential: req.credential,
      signal: ctl.signal,
      checkSize: (size) => {
        if (size > limit.bytes) stop(SizeLimitError.declared(limit, 'the backup\'s declared size', size));
      },
      onProgress: (processed, total) => {
        if (total > limit.bytes || processed > limit.bytes) {
          try {
            stop(total > limit.bytes ? SizeLimitError.declared(limit, 'the backup\'s declared size', total) : SizeLimitError.exceeded(limit));
          } catch {
            return; // the engine sees the abort of its signal
          }
        }
        if (!sizeSet) req.sink.setSize(total);
        sizeSet = true;
        req.sink.updateProgress(Math.min(processed, total));
      },
    });
    const { size } = restored;
    let { sha512 } = restored;
    if (tooLarge) throw tooLarge;
    if (size > limit.bytes) throw SizeLimitError.exceeded(limit);
    throwIfAborted(req.signal);
    const fh = await openNoFollow(req.dest, UPDATE_NOFOLLOW);
    let format: 'raw' | 'qcow2' = 'raw';
    let virtualSize = size;
    try {
      const head = Buffer.alloc(QCOW2_HEADER_PROBE_BYTES);
      const { bytesRead } = await fh.read(head, 0, head.length, 0);
      if (hasQcow2Magic(head.subarray(0, bytesRead))) {
        virtualSize = assertSafeQcow2(head.subarray(0, bytesRead)).virtualSize;
        format = 'qcow2';
      }
      // The restore reproduces the backed-up bytes exactly, so the SHA-512 recorded in the backup (backing-image.cfg
      // `Checksum`) is the restored bytes' checksum; an unaligned image is zero-padded below, like a download.
      // A backup written by Longhorn of an image whose size is not a multiple of 512 bytes (Longhorn's own code
      // allows it): zero-padded like a download (the managers store and sync only multiples of 512, for direct I/O).
      // Through the handle opened without following links, as every write to the image.
      if (size % SECTOR_SIZE !== 0) await fh.truncate(size + ((SECTOR_SIZE - (size % SECTOR_SIZE)) % SECTOR_SIZE));
    } finally {
      await fh.close();
    }
    // The engine hashed what it wrote; a non-SHA-512 expected checksum needs one read of the result (the padding,
    // added above, is not part of what the expected checksum covers).
    if (expected && expected.algorithm !== 'sha512') {
      const h = new StreamHasher(expected);
      let left = size;
      for await (const c of readNoFollow(req.dest)) {
        const part = c.subarray(0, Math.min(c.length, left));
        left -= part.length;
        if (part.length > 0) h.update(part);
      }
      sha512 = h.digest().sha512;
    }
    // The expected checksum was checked on the bytes as restored; the stored file's SHA-512 is that of the padded
    // file, and both are returned. An expected SHA-512 may be either (a restore to recover an image asks for the
    // image's checksum, the padded one).
    const pad = (SECTOR_SIZE - (size % SECTOR_SIZE)) % SECTOR_SIZE;
    if (expected?.algorithm === 'sha512' && pad === 0) assertChecksumMatches(expected, sha512);
    if (pad > 0) {
      const unpadded = { size, sha512 };
      const h = new StreamHasher(undefined);
      for await (const c of readNoFollow(req.dest)) h.update(c);
      const padded = h.digest().sha512;
      if (expected?.algorithm === 'sha512' && expected.value !== sha512) assertChecksumMatches(expected, padded);
      req.sink.updateProgress(size + pad);
      return { size: size + pad, sha512: padded, virtualSize: format === 'raw' ? size + pad : virtualSize, format, unpadded, ...(expected ? { expectedChecksumVerified: true } : {}) };
    }
    req.sink.updateProgress(size);
    // The chain the engine verified every segment against is the restored file's (unpadded, so unchanged) chain.
    const chain = restored.chain && restored.chain.checksum === sha512 && restored.chain.size === size ? restored.chain : undefined;
    return { size, sha512, virtualSize, format, ...(expected ? { expectedChecksumVerified: true } : {}), ...(chain ? { chain } : {}) };
  } catch (e) {
    await rm(req.dest, { force: true });
    if (tooLarge) throw tooLarge;
    if (req.signal.aborted) throw new SourceCancelledError(req.signal.reason);
    throw e;
  } finally {
    unlink();
  }
}
