import { mkdtemp, open, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository root (four levels above this file: libs/block-mapping/src/test-support). */
export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
/** Longhorn's fixture backupstore, stored in the repository as @bis/backupstore test data (see its README). */
export const LONGHORN_FIXTURE = path.join(REPO_ROOT, 'libs/backupstore/test-data/longhorn-backupstore-lz4');

export async function makeTempDir(): Promise<string> {
  return mkdtemp(path.join(tmpdir(), 'bis-block-mapping-'));
}

export async function removeTempDir(dir: string | undefined): Promise<void> {
  if (dir) await rm(dir, { recursive: true, force: true });
}

/** Deterministic bytes with no zero byte (xorshift32, mapped to 1..255). */
export function noise(length: number, seed = 0x9e3779b9): Buffer {
  const out = Buffer.allocUnsafe(length);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < length; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out[i] = (x % 255) + 1;
  }
  return out;
}

export interface Write {
  offset: number;
  data: Buffer;
}

/** Creates `file` of `size` bytes that is a hole except for `writes`, and fsyncs it. */
export async function createSparseFile(file: string, size: number, writes: Write[] = []): Promise<void> {
  await writeFile(file, '');
  const fh = await open(file, 'r+');
  try {
    await fh.truncate(size);
    for (const w of writes) {
      let done = 0;
      while (done < w.data.length) {
        const { bytesWritten } = await fh.write(w.data, done, w.data.length - done, w.offset + done);
        done += bytesWritten;
      }
    }
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Bytes the filesystem has allocated to `file` (st_blocks * 512). */
export async function allocatedBytes(file: string): Promise<number> {
  return (await stat(file)).blocks * 512;
}

const MiB = 1024 * 1024;

/**
 * The source image of Longhorn's `fixture-lz4` backup (backupstore format §8.1): 9 MiB + 123 bytes;
 * block 0 = 4 KiB noise + text pattern A; block 1 a hole; block 2 = block 0; block 3 written zeros (allocated);
 * block 4 = hole, 64 KiB of pattern B at 8650752, hole, 4219 tail bytes at 9433088.
 */
export async function createLonghornFixtureSource(file: string): Promise<void> {
  const blockA = Buffer.alloc(2 * MiB);
  noise(4096, 42).copy(blockA, 0);
  const patternA = Buffer.from('pattern A: backing image block for the Longhorn fixture\n');
  for (let o = 4096; o < blockA.length; o += patternA.length) patternA.copy(blockA, o);
  const patternB = Buffer.alloc(64 * 1024, Buffer.from('pattern B|'));
  await createSparseFile(file, 9437307, [
    { offset: 0, data: blockA },
    { offset: 4 * MiB, data: blockA },
    { offset: 6 * MiB, data: Buffer.alloc(2 * MiB) },
    { offset: 8650752, data: patternB },
    { offset: 9433088, data: noise(4219, 7) },
  ]);
}
