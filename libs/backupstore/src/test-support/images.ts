import { createHash, randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { LockTiming } from '../lock.js';

export const MiB = 1024 * 1024;
export const BLOCK = 2 * MiB;

/** Lock timing short enough for tests; the protocol is the same as Longhorn's. */
export const FAST_LOCKS: LockTiming = { durationMs: 1500, refreshMs: 300, checkWaitMs: 30 };

/** The repository root (this file is libs/backupstore/src/test-support/). */
export const REPO_ROOT = path.resolve(new URL('.', import.meta.url).pathname, '../../../..');
export const FIXTURE_STORE = path.join(REPO_ROOT, 'libs/backupstore/test-data/longhorn-backupstore-lz4');

export async function tempDir(prefix = 'bis-backupstore-'): Promise<string> {
  return fs.mkdtemp(path.join(os.tmpdir(), prefix));
}

/** Deterministic bytes from a seed: compressible text mixed with noise, so that lz4 and gzip both do something. */
export function patternBlock(seed: number, size = BLOCK): Buffer {
  const out = Buffer.alloc(size);
  const line = Buffer.from(`block pattern ${seed} `.padEnd(64, '.'));
  for (let o = 0; o < size; o += line.length) line.copy(out, o, 0, Math.min(line.length, size - o));
  let x = (seed * 2654435761) >>> 0 || 1;
  for (let o = 0; o + 4 <= Math.min(4096, size); o += 4) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out.writeUInt32LE(x, o);
  }
  return out;
}

export type Piece = { kind: 'data'; seed: number } | { kind: 'random' } | { kind: 'zeros' } | { kind: 'hole' };

/**
 * Writes an image made of 2 MiB pieces (holes are left unwritten, so the file is sparse), plus `tail` extra bytes of
 * pattern data at the end (a short last block). Returns its size and SHA-512.
 */
export async function writeImage(file: string, pieces: readonly Piece[], tail = 0): Promise<{ size: number; sha512: string }> {
  const size = pieces.length * BLOCK + tail;
  const fh = await fs.open(file, 'w');
  const hash = createHash('sha512');
  try {
    await fh.truncate(size);
    for (const [i, p] of pieces.entries()) {
      let data: Buffer;
      switch (p.kind) {
        case 'data':
          data = patternBlock(p.seed);
          break;
        case 'random':
          data = randomBytes(BLOCK);
          break;
        case 'zeros':
        case 'hole':
          data = Buffer.alloc(BLOCK);
          break;
      }
      if (p.kind !== 'hole') await fh.write(data, 0, BLOCK, i * BLOCK);
      hash.update(data);
    }
    if (tail > 0) {
      const t = patternBlock(9999, tail);
      await fh.write(t, 0, tail, pieces.length * BLOCK);
      hash.update(t);
    }
  } finally {
    await fh.close();
  }
  return { size, sha512: hash.digest('hex') };
}

export async function sha512File(file: string): Promise<string> {
  const hash = createHash('sha512');
  const fh = await fs.open(file, 'r');
  try {
    for await (const chunk of fh.createReadStream({ highWaterMark: MiB })) hash.update(chunk as Buffer);
  } finally {
    await fh.close().catch(() => undefined);
  }
  return hash.digest('hex');
}

/** Every block file under a filesystem store, as checksums. */
export async function storedBlocks(storeRoot: string): Promise<string[]> {
  const dir = path.join(storeRoot, 'backupstore/backing-images/blocks');
  const out: string[] = [];
  const walk = async (d: string): Promise<void> => {
    let entries: import('node:fs').Dirent[];
    try {
      entries = await fs.readdir(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (e.isDirectory()) await walk(path.join(d, e.name));
      else if (e.name.endsWith('.blk')) out.push(e.name.slice(0, -4));
    }
  };
  await walk(dir);
  return out.sort();
}

/** Polls `condition` until it holds; fails naming `what` after `timeoutMs` (a generous bound for a loaded machine). */
export async function waitFor(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** The lock files in a store's lock directory (none when it does not exist). */
export async function lockFiles(storeRoot: string, dir: string): Promise<string[]> {
  return fs.readdir(path.join(storeRoot, dir)).catch(() => []);
}
