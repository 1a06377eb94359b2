import { createHash, randomBytes } from 'node:crypto';

export const MiB = 1024 * 1024;

/** SHA-512 (hex) of the concatenation of `parts` with node:crypto, the reference every test compares against. */
export function referenceSha512(...parts: Uint8Array[]): string {
  const h = createHash('sha512');
  for (const p of parts) h.update(p);
  return h.digest('hex');
}

/** `n` random bytes. */
export function randomData(n: number): Buffer {
  return randomBytes(n);
}

/** Splits `data` into pieces of the given sizes (cycled) to feed a recorder in odd chunks. */
export function* chunksOf(data: Buffer, sizes: readonly number[]): Generator<Buffer> {
  let pos = 0;
  let i = 0;
  while (pos < data.length) {
    const n = Math.min(sizes[i++ % sizes.length]!, data.length - pos);
    yield data.subarray(pos, pos + n);
    pos += n;
  }
}

/** A copy of `buf` with the byte at `at` flipped. */
export function flipped(buf: Buffer, at: number): Buffer {
  const copy = Buffer.from(buf);
  copy[at] = copy[at]! ^ 0xff;
  return copy;
}
