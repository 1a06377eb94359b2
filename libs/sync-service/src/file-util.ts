import { promises as fsp } from 'node:fs';
import { StreamHasher, type ExpectedChecksum } from '@bis/file-sources/core';
import { formatMtime } from './go-time.js';

const READ_SIZE = 1 << 20;

export interface FileStat {
  size: number;
  /** Go `time.Time.String()` of the mtime. */
  modificationTime: string;
  /** Allocated bytes (`st_blocks × 512`). */
  realSize: number;
  isFile: boolean;
}

export async function statFile(filePath: string): Promise<FileStat> {
  const st = await fsp.stat(filePath, { bigint: true });
  return {
    size: Number(st.size),
    modificationTime: formatMtime(st),
    realSize: Number(st.blocks) * 512,
    isFile: st.isFile(),
  };
}

/** stat that resolves undefined for a missing file. */
export async function statFileIfExists(filePath: string): Promise<FileStat | undefined> {
  try {
    return await statFile(filePath);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

export interface HashFileOptions {
  signal?: AbortSignal;
  expected?: ExpectedChecksum;
  onProgress?: (hashedBytes: number) => void;
}

/**
 * SHA-512 of a whole file in one sequential pass with 1 MiB reads (plus the expected checksum's algorithm when it
 * is not SHA-512). Throws ChecksumMismatchError when an expected checksum is given and does not match.
 */
export async function hashFile(filePath: string, opts: HashFileOptions = {}): Promise<string> {
  const hasher = new StreamHasher(opts.expected);
  const fh = await fsp.open(filePath, 'r');
  try {
    const buf = Buffer.allocUnsafe(READ_SIZE);
    let pos = 0;
    for (;;) {
      opts.signal?.throwIfAborted();
      const { bytesRead } = await fh.read(buf, 0, READ_SIZE, pos);
      if (bytesRead === 0) break;
      hasher.update(buf.subarray(0, bytesRead));
      pos += bytesRead;
      opts.onProgress?.(pos);
    }
  } finally {
    await fh.close();
  }
  return hasher.digest().sha512;
}

/**
 * The image's virtual size: the qcow2 header's size field for a qcow2 image, else the file size
 * (Longhorn asks `qemu-img info`; for raw images that is the file size).
 */
export async function readVirtualSize(filePath: string, fileSize: number): Promise<number> {
  const fh = await fsp.open(filePath, 'r');
  try {
    const buf = Buffer.alloc(32);
    const { bytesRead } = await fh.read(buf, 0, 32, 0);
    if (bytesRead >= 32 && buf.readUInt32BE(0) === 0x514649fb) {
      return Number(buf.readBigUInt64BE(24));
    }
    return fileSize;
  } finally {
    await fh.close();
  }
}

export async function removeFile(filePath: string): Promise<void> {
  await fsp.rm(filePath, { force: true });
}

/** Removes `dir` if it exists and is empty; a directory that holds anything (or is gone) is left as it is. */
export async function removeEmptyDir(dir: string): Promise<void> {
  try {
    await fsp.rmdir(dir);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== 'ENOTEMPTY' && code !== 'EEXIST' && code !== 'ENOENT') throw err;
  }
}
