import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { open, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { getFileLayout } from '@bis/block-mapping';
import { computeFileChain, FILE_CHAIN_ZERO_STEP, verifyFileChain } from './file.js';
import { decodeChain, encodeChain } from './chain.js';
import { Sha512ChainMismatchError } from './errors.js';
import { Sha512ChainRecorder } from './recorder.js';
import { Sha512ChainVerifier } from './verifier.js';
import { MiB, randomData, referenceSha512 } from './test-support/reference.js';
import { tempDir, writeSparseFile } from './test-support/sparse-file.js';
import { describeImpls } from './test-support/impls.js';

let dir: string;
let cleanup: () => Promise<void>;
beforeAll(async () => {
  ({ dir, cleanup } = await tempDir());
});
afterAll(async () => {
  await cleanup();
});

let n = 0;
const file = (): string => join(dir, `image-${n++}.raw`);

/** 9 MiB + 333 bytes: data, a 3 MiB hole, data not aligned to blocks or segments, a hole, a data tail. */
const SPARSE_SIZE = 9 * MiB + 333;
const SPARSE_WRITES: [number, number][] = [
  [0, 300 * 1024 + 5],
  [4 * MiB + 4096, MiB + 777],
  [9 * MiB - 4096, 4096 + 333],
];

/**
 * Runs `pass` with a signal that its own progress callback aborts once `stop(bytes)` is true; expects the pass to
 * reject with an AbortError and returns the progress it reported.
 */
async function cancelledFromProgress(
  pass: (o: { signal: AbortSignal; onProgress: (bytes: number) => void }) => Promise<unknown>,
  stop: (bytes: number) => boolean,
): Promise<number[]> {
  const ac = new AbortController();
  const seen: number[] = [];
  const run = pass({
    signal: ac.signal,
    onProgress: (b) => {
      seen.push(b);
      if (stop(b)) ac.abort();
    },
  });
  await expect(run).rejects.toMatchObject({ name: 'AbortError' });
  return seen;
}

describeImpls('computeFileChain / verifyFileChain on real sparse files', (impl) => {
  it('the test file really has holes', async () => {
    const path = file();
    await writeSparseFile(path, SPARSE_SIZE, SPARSE_WRITES);
    const layout = await getFileLayout(path);
    expect(layout.holes.reduce((s, h) => s + h.length, 0)).toBeGreaterThan(5 * MiB);
  });

  it.each([undefined, 64 * 1024, 33 * 128])('chain of a sparse file equals createHash of it (segment %s)', async (segmentSize) => {
    const path = file();
    const bytes = await writeSparseFile(path, SPARSE_SIZE, SPARSE_WRITES);
    const progress: number[] = [];
    const chain = await computeFileChain(path, { segmentSize, onProgress: (b) => progress.push(b) });
    expect(chain.checksum).toBe(referenceSha512(bytes));
    expect(chain.size).toBe(SPARSE_SIZE);
    expect(chain.states.length).toBe(Math.ceil(SPARSE_SIZE / (segmentSize ?? 2 * MiB)));
    expect(progress[progress.length - 1]).toBe(SPARSE_SIZE);
    expect(progress.every((b, i) => i === 0 || b >= progress[i - 1]!)).toBe(true);

    for (const concurrency of [1, 2, 4]) {
      const verified: number[] = [];
      const sum = await verifyFileChain(path, decodeChain(encodeChain(chain)), { concurrency, impl, onProgress: (b) => verified.push(b) });
      expect(sum).toBe(referenceSha512(bytes));
      expect(verified[verified.length - 1]).toBe(SPARSE_SIZE);
    }
  });

  it('a file that is one big hole, and an empty file', async () => {
    const hole = file();
    const zeros = await writeSparseFile(hole, 5 * MiB + 1, []);
    const chain = await computeFileChain(hole);
    expect(chain.checksum).toBe(referenceSha512(zeros));
    expect(await verifyFileChain(hole, chain, { impl })).toBe(chain.checksum);

    const empty = file();
    await writeFile(empty, '');
    const e = await computeFileChain(empty);
    expect(e).toEqual({ segmentSize: 2 * MiB, size: 0, checksum: referenceSha512(), states: [] });
    expect(await verifyFileChain(empty, e, { impl })).toBe(referenceSha512());
  });

  it('a dense file equals createHash and agrees with a verifier fed from memory', async () => {
    const path = file();
    const bytes = randomData(4 * MiB + 129);
    await writeFile(path, bytes);
    const chain = await computeFileChain(path);
    expect(chain.checksum).toBe(referenceSha512(bytes));
    const v = new Sha512ChainVerifier(chain, { impl });
    await Promise.all([2, 0, 1].map((k) => v.verifySegment(k, bytes.subarray(k * 2 * MiB, Math.min((k + 1) * 2 * MiB, bytes.length)))));
    expect(v.checksum()).toBe(chain.checksum);
  });

  it('a byte changed on disk (in data, and inside a hole) fails naming its segment', async () => {
    const path = file();
    await writeSparseFile(path, SPARSE_SIZE, SPARSE_WRITES);
    const chain = await computeFileChain(path);
    for (const at of [4 * MiB + 5000, 2 * MiB + 10]) {
      const fh = await open(path, 'r+');
      const one = Buffer.alloc(1);
      await fh.read(one, 0, 1, at);
      await fh.write(Buffer.from([one[0]! ^ 0x5a]), 0, 1, at);
      await fh.close();
      const err = await verifyFileChain(path, chain, { concurrency: 2, impl }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(Sha512ChainMismatchError);
      expect((err as Sha512ChainMismatchError).segment).toBe(Math.floor(at / (2 * MiB)));
      // Put it back: the file verifies again.
      const fh2 = await open(path, 'r+');
      await fh2.write(one, 0, 1, at);
      await fh2.close();
      await expect(verifyFileChain(path, chain, { impl })).resolves.toBe(chain.checksum);
    }
  });

  it('a file of another size fails with a mismatch naming both sizes', async () => {
    const path = file();
    await writeSparseFile(path, 3 * MiB, [[0, 1000]]);
    const chain = await computeFileChain(path);
    const longer = file();
    await writeSparseFile(longer, 3 * MiB + 1, [[0, 1000]]);
    await expect(verifyFileChain(longer, chain, { impl })).rejects.toThrow(/3145729 bytes but the chain describes 3145728/);
    await expect(verifyFileChain(longer, chain, { impl })).rejects.toBeInstanceOf(Sha512ChainMismatchError);
  });

  it('AbortSignal cancels both passes', async () => {
    const path = file();
    await writeFile(path, randomData(8 * MiB));
    await expect(computeFileChain(path, { signal: AbortSignal.abort() })).rejects.toMatchObject({ name: 'AbortError' });
    const seen = await cancelledFromProgress((o) => computeFileChain(path, o), (b) => b > 0);
    expect(seen[seen.length - 1]).toBeLessThan(8 * MiB);

    const chain = await computeFileChain(path);
    await expect(verifyFileChain(path, chain, { impl, signal: AbortSignal.abort() })).rejects.toMatchObject({ name: 'AbortError' });
    const verified = await cancelledFromProgress((o) => verifyFileChain(path, chain, { concurrency: 1, impl, ...o }), () => true);
    expect(verified).toEqual([2 * MiB]);
  });

  it('records the same states as a recorder fed the bytes from memory', async () => {
    const path = file();
    const bytes = await writeSparseFile(path, SPARSE_SIZE, SPARSE_WRITES);
    const fromFile = await computeFileChain(path, { segmentSize: 64 * 1024 });
    const rec = new Sha512ChainRecorder(64 * 1024);
    rec.updateSync(bytes);
    expect(encodeChain(fromFile).equals(encodeChain(rec.finish()))).toBe(true);
  });

  it('cancelling inside a big hole stops between 64 MiB zero steps', async () => {
    const path = file();
    const size = 4 * FILE_CHAIN_ZERO_STEP;
    await writeSparseFile(path, size, [[0, 4096]]);
    const seen = await cancelledFromProgress((o) => computeFileChain(path, o), (b) => b > 4096);
    expect(seen[seen.length - 1]).toBeLessThanOrEqual(4096 + FILE_CHAIN_ZERO_STEP);
  });

  it('bad arguments get clear errors', async () => {
    const path = file();
    await writeFile(path, randomData(1000));
    await expect(computeFileChain(path, { segmentSize: 1000 })).rejects.toThrow(/multiple of 128/);
    await expect(computeFileChain(join(dir, 'missing'))).rejects.toMatchObject({ code: 'ENOENT' });
    const chain = await computeFileChain(path);
    await expect(verifyFileChain(path, chain, { concurrency: 0 })).rejects.toThrow(/concurrency/);
    await expect(verifyFileChain(path, { ...chain, states: [] })).rejects.toThrow(/needs 1/);
  });
});
