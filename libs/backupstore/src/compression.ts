import { promisify } from 'node:util';
import * as zlib from 'node:zlib';
import { compressFrame, decompressFrame } from 'lz4-napi';
import type { CompressionMethod } from './config.js';
import { BACKUP_BLOCK_SIZE, BackupStoreError, blockChecksumAsync } from './names.js';

const gzipAsync = promisify(zlib.gzip);
const gunzipAsync = promisify(zlib.gunzip);

/**
 * gzip level used for new blocks. Level 1 is about twice as fast as the default (6) for a few percent more space;
 * readers do not care which level wrote a member.
 */
export const GZIP_LEVEL = 1;

const GZIP_MAGIC = Buffer.from([0x1f, 0x8b]);
const LZ4_FRAME_MAGIC = Buffer.from([0x04, 0x22, 0x4d, 0x18]);

/**
 * Compresses one block the way Longhorn stores it: `none` = raw bytes, `gzip` = one gzip member, `lz4` = one LZ4
 * frame (FLG 0x64: independent blocks, content checksum; BD 0x70: 4 MB max block). Runs on the libuv thread pool.
 */
export async function compressBlock(method: CompressionMethod, data: Buffer): Promise<Buffer> {
  switch (method) {
    case 'none':
      return data;
    case 'gzip':
      return gzipAsync(data, { level: GZIP_LEVEL });
    case 'lz4':
      return compressFrame(data, { contentChecksum: true });
  }
}

export type StoredEncoding = 'gzip' | 'lz4' | 'raw';

/** What the bytes of a stored block look like, from their magic number. */
export function sniffEncoding(data: Uint8Array): StoredEncoding {
  if (data.length >= 4 && Buffer.from(data.buffer, data.byteOffset, 4).equals(LZ4_FRAME_MAGIC)) return 'lz4';
  if (data.length >= 2 && Buffer.from(data.buffer, data.byteOffset, 2).equals(GZIP_MAGIC)) return 'gzip';
  return 'raw';
}

async function decode(encoding: StoredEncoding, data: Buffer): Promise<Buffer> {
  switch (encoding) {
    case 'raw':
      return data;
    case 'gzip':
      return gunzipAsync(data, { maxOutputLength: BACKUP_BLOCK_SIZE + 1 });
    case 'lz4':
      return decompressFrame(data);
  }
}

/**
 * Decompresses a stored block and checks it against its name. The method from the config is a hint only: like
 * Longhorn's gzip<->lz4 fallback, the stored bytes are sniffed by magic, and (better than Longhorn) a raw block in a
 * compressed backup, or a compressed block in a `none` backup, is read too. Any block that does not hash to its
 * name fails with Longhorn's message shape, naming the block path.
 */
export async function decompressAndVerifyBlock(
  method: CompressionMethod,
  stored: Buffer,
  expectedChecksum: string,
  blockPathForErrors: string,
): Promise<Buffer> {
  const sniffed = sniffEncoding(stored);
  const order: StoredEncoding[] = [sniffed];
  if (method === 'none' && sniffed !== 'raw') order.push('raw');
  const failures: string[] = [];
  for (const encoding of order) {
    let data: Buffer;
    try {
      data = await decode(encoding, stored);
    } catch (err) {
      failures.push(`${encoding}: ${(err as Error).message}`);
      continue;
    }
    if (data.length > BACKUP_BLOCK_SIZE) {
      failures.push(`${encoding}: block decompresses to more than ${BACKUP_BLOCK_SIZE} bytes`);
      continue;
    }
    if ((await blockChecksumAsync(data)) === expectedChecksum) return data;
    failures.push(`${encoding}: checksum verification failed for block`);
  }
  const last = failures[failures.length - 1] ?? 'unreadable';
  const message = last.endsWith('checksum verification failed for block')
    ? 'checksum verification failed for block'
    : `failed to decompress block (${failures.join('; ')})`;
  throw new BackupStoreError('Corrupt', `decompression verification failed for block ${blockPathForErrors}: ${message}`);
}
