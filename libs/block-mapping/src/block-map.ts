import { open } from 'node:fs/promises';
import { assertByteCount, type Extent } from './extent.js';
import { getFileLayout } from './layout.js';

/** Longhorn's backing-image block size: 2 MiB (`DEFAULT_BLOCK_SIZE`). */
export const BLOCK_SIZE = 2 * 1024 * 1024;

/** One block of a file to copy: `size` is the block size, except for a short last block. */
export interface BlockMapping {
  offset: number;
  size: number;
}

/**
 * Longhorn's block-mapping rule (BIM `CreateBackupBackingImageMappings`): a block `[k*blockSize, (k+1)*blockSize)`
 * is included when it touches any byte of any data extent; blocks holding no data at all are skipped. Mappings are
 * sorted by offset, each once; every mapping has `blockSize` bytes except the last block of the file, which is
 * `fileSize - offset` bytes. Extent bytes at or beyond `fileSize` are ignored.
 */
export function mapBlocks(data: readonly Extent[], fileSize: number, blockSize: number = BLOCK_SIZE): BlockMapping[] {
  assertByteCount(fileSize, 'fileSize');
  if (!Number.isSafeInteger(blockSize) || blockSize <= 0) {
    throw new RangeError(`blockSize must be a positive safe integer, got ${String(blockSize)}`);
  }
  const sorted = [...data].sort((a, b) => a.offset - b.offset);
  const mappings: BlockMapping[] = [];
  let nextFree = 0; // first block index not yet emitted
  for (const e of sorted) {
    assertByteCount(e.offset, 'extent offset');
    assertByteCount(e.length, 'extent length');
    const end = Math.min(e.offset + e.length, fileSize);
    if (e.length === 0 || e.offset >= end) continue;
    const first = Math.max(Math.floor(e.offset / blockSize), nextFree);
    const last = Math.floor((end - 1) / blockSize);
    for (let k = first; k <= last; k++) {
      const offset = k * blockSize;
      mappings.push({ offset, size: Math.min(blockSize, fileSize - offset) });
    }
    nextFree = Math.max(nextFree, last + 1);
  }
  return mappings;
}

export interface IterateBlocksOptions {
  /** Block size for the mapping when `mappings` is not given. Default BLOCK_SIZE. */
  blockSize?: number;
  /** The blocks to read. Default: `mapBlocks` of the file's data extents (`getFileLayout`). */
  mappings?: readonly BlockMapping[];
  /** Stops the iteration: the next step throws the signal's reason and the file is closed. */
  signal?: AbortSignal;
}

/**
 * Reads the mapped blocks of `path` in order. Each yielded `data` is a fresh Buffer of exactly `size` bytes that the
 * consumer may keep. Holes inside a block read as zeros. Only one block is held at a time by the generator.
 */
export async function* iterateBlocks(
  path: string,
  opts: IterateBlocksOptions = {},
): AsyncGenerator<{ offset: number; size: number; data: Buffer }> {
  const { signal } = opts;
  signal?.throwIfAborted();
  let mappings = opts.mappings;
  if (!mappings) {
    const layout = await getFileLayout(path, { signal });
    mappings = mapBlocks(layout.data, layout.size, opts.blockSize ?? BLOCK_SIZE);
  }
  const fh = await open(path, 'r');
  try {
    const { size: fileSize } = await fh.stat();
    for (const m of mappings) {
      signal?.throwIfAborted();
      assertByteCount(m.offset, 'mapping offset');
      assertByteCount(m.size, 'mapping size');
      if (m.offset + m.size > fileSize) {
        throw new RangeError(
          `block [${m.offset}, ${m.offset + m.size}) lies beyond the end of ${path} (size ${fileSize})`,
        );
      }
      const data = Buffer.allocUnsafe(m.size);
      let got = 0;
      while (got < m.size) {
        const { bytesRead } = await fh.read(data, got, m.size - got, m.offset + got);
        if (bytesRead === 0) {
          throw new Error(`${path} ended at ${m.offset + got} bytes while reading block at ${m.offset}`);
        }
        got += bytesRead;
      }
      yield { offset: m.offset, size: m.size, data };
    }
  } finally {
    await fh.close();
  }
}
