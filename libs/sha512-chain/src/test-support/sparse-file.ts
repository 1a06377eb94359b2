import { mkdtemp, open, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomData } from './reference.js';

/** A temp dir for one test file; `cleanup()` removes it. */
export async function tempDir(): Promise<{ dir: string; cleanup: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), 'sha512-chain-'));
  return { dir, cleanup: () => rm(dir, { recursive: true, force: true }) };
}

/**
 * Writes a sparse file: truncated to `size` (all hole), then random data written at each `[offset, length]`.
 * Returns the file's bytes as read back (holes read as zeros).
 */
export async function writeSparseFile(path: string, size: number, writes: [number, number][]): Promise<Buffer> {
  const fh = await open(path, 'w');
  try {
    await fh.truncate(size);
    for (const [offset, length] of writes) await fh.write(randomData(length), 0, length, offset);
  } finally {
    await fh.close();
  }
  return readFile(path);
}
