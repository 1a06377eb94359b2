import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp, createReadStream } from 'node:fs';

/**
 * Writes a sparse image: `pattern` is a list of 1 MiB segments, 'd' = random data, 'h' = hole.
 * Returns its SHA-512.
 */
export async function writeSparseImage(file: string, pattern: string): Promise<string> {
  const MiB = 1 << 20;
  const fh = await fsp.open(file, 'w');
  try {
    await fh.truncate(pattern.length * MiB);
    for (let i = 0; i < pattern.length; i++) {
      if (pattern[i] === 'd') await fh.write(randomBytes(MiB), 0, MiB, i * MiB);
    }
  } finally {
    await fh.close();
  }
  return sha512File(file);
}

export async function sha512File(file: string): Promise<string> {
  const h = createHash('sha512');
  for await (const c of createReadStream(file, { highWaterMark: 1 << 20 })) h.update(c as Buffer);
  return h.digest('hex');
}

export async function allocatedBytes(file: string): Promise<number> {
  const st = await fsp.stat(file);
  return st.blocks * 512;
}

export async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ''}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
