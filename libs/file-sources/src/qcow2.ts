/** qcow2 header facts needed to accept or refuse an image (QEMU docs/interop/qcow2.txt). */
export interface Qcow2Header {
  version: number;
  /** Guest-visible size in bytes (header field `size`). */
  virtualSize: number;
  clusterBits: number;
  backingFileOffset: number;
  backingFileSize: number;
  incompatibleFeatures: bigint;
}

export const QCOW2_MAGIC = Buffer.from([0x51, 0x46, 0x49, 0xfb]); // "QFI\xfb"
/** Bytes needed to read every field this module looks at (v3 header up to `header_length`). */
export const QCOW2_HEADER_PROBE_BYTES = 104;
const INCOMPAT_EXTERNAL_DATA_FILE = 1n << 2n;

export class UnsafeImageError extends Error {
  override readonly name = 'UnsafeImageError';
}

export function hasQcow2Magic(head: Uint8Array): boolean {
  return head.length >= 4 && Buffer.from(head.buffer, head.byteOffset, 4).equals(QCOW2_MAGIC);
}

/**
 * Parses a qcow2 header. `head` must hold at least {@link QCOW2_HEADER_PROBE_BYTES} bytes (or the whole file when it
 * is shorter, which is then an error). Throws {@link UnsafeImageError} for truncated or unsupported headers.
 */
export function parseQcow2Header(head: Uint8Array): Qcow2Header {
  const b = Buffer.from(head.buffer, head.byteOffset, head.byteLength);
  if (!hasQcow2Magic(b)) throw new UnsafeImageError('not a qcow2 image: missing QFI\\xfb magic');
  if (b.length < 72) throw new UnsafeImageError(`truncated qcow2 header: ${b.length} bytes, at least 72 needed`);
  const version = b.readUInt32BE(4);
  if (version !== 2 && version !== 3) throw new UnsafeImageError(`unsupported qcow2 version ${version}`);
  if (version === 3 && b.length < 104) {
    throw new UnsafeImageError(`truncated qcow2 v3 header: ${b.length} bytes, 104 needed`);
  }
  const size = b.readBigUInt64BE(24);
  if (size > BigInt(Number.MAX_SAFE_INTEGER)) throw new UnsafeImageError(`qcow2 virtual size ${size} is too large`);
  return {
    version,
    backingFileOffset: Number(b.readBigUInt64BE(8)),
    backingFileSize: b.readUInt32BE(16),
    clusterBits: b.readUInt32BE(20),
    virtualSize: Number(size),
    incompatibleFeatures: version === 3 ? b.readBigUInt64BE(72) : 0n,
  };
}

/**
 * Refuses qcow2 images that would make a consumer open other files: a backing file, or an external data file
 * (incompatible feature bit 2). Returns the parsed header otherwise.
 */
export function assertSafeQcow2(head: Uint8Array): Qcow2Header {
  const h = parseQcow2Header(head);
  if (h.backingFileOffset !== 0 || h.backingFileSize !== 0) {
    throw new UnsafeImageError(
      'qcow2 image names a backing file (backing_file_offset/backing_file_size are set); such images are refused',
    );
  }
  if ((h.incompatibleFeatures & INCOMPAT_EXTERNAL_DATA_FILE) !== 0n) {
    throw new UnsafeImageError('qcow2 image uses an external data file (incompatible feature bit 2); such images are refused');
  }
  return h;
}
