import { statfs } from 'node:fs/promises';
import { dirname } from 'node:path';
import { SourceError } from './errors.js';

/** Default of the `backing-image-max-size` setting: 2 TiB. */
export const DEFAULT_MAX_IMAGE_SIZE = 2 * 1024 ** 4;

/** What bounds the size of an image a source writes. */
export interface SizeLimitPolicy {
  /** The `backing-image-max-size` setting, in bytes (default 2 TiB). */
  maxImageSize?: number;
  /** Bytes of the destination disk kept free (the disk's `storageReserved`); default 0. */
  reservedBytes?: number;
}

/** The limit in force for one destination: at most `bytes` bytes may be written, because of `why`. */
export interface SizeLimit {
  bytes: number;
  why: string;
}

/** An image (as stored: after decompression) or a declared size goes past the {@link SizeLimit}. */
export class SizeLimitError extends SourceError {
  override readonly name = 'SizeLimitError';
  /** HTTP status for APIs that report it (413 Content Too Large). */
  readonly statusCode = 413;
  constructor(readonly limit: SizeLimit, message: string) {
    super(message);
  }

  /** The image grew past the limit while it was being written. */
  static exceeded(limit: SizeLimit): SizeLimitError {
    return new SizeLimitError(limit, `the image is larger than the limit of ${limit.bytes} bytes (${limit.why}): stopped, and the partial file was removed`);
  }

  /** A size announced before any byte was written (an upload's declared size, a Content-Length) is too large. */
  static declared(limit: SizeLimit, what: string, size: number): SizeLimitError {
    return new SizeLimitError(limit, `${what} of ${size} bytes is larger than the limit of ${limit.bytes} bytes (${limit.why})`);
  }
}

/**
 * The limit for an image written to `dest`: the free space of the filesystem holding `dest` (statfs, blocks
 * available to unprivileged users) less `reservedBytes`, and at most `maxImageSize`. `alreadyWritten` bytes of `dest`
 * that the image keeps (a resumed upload) count as available: they are already taken from the free space.
 */
export async function imageSizeLimit(dest: string, policy: SizeLimitPolicy = {}, alreadyWritten = 0): Promise<SizeLimit> {
  const max = policy.maxImageSize ?? DEFAULT_MAX_IMAGE_SIZE;
  const reserved = Math.max(0, policy.reservedBytes ?? 0);
  const fs = await statfs(dirname(dest));
  const free = fs.bavail * fs.bsize;
  const byDisk = Math.max(0, free - reserved) + alreadyWritten;
  if (byDisk < max) {
    return { bytes: byDisk, why: `the free space of the destination disk, ${free} bytes, less its reserve of ${reserved} bytes` };
  }
  return { bytes: max, why: 'the backing-image-max-size setting' };
}
