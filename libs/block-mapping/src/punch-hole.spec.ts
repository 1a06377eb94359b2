import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { mkdir, readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { getFileLayout } from './layout.js';
import { punchHole, punchHoleWithFallocateTool, PunchHoleError } from './punch-hole.js';
import { allocatedBytes, createSparseFile, makeTempDir, noise, removeTempDir } from './test-support/sparse-files.js';

const MiB = 1024 * 1024;

let dir: string;
beforeAll(async () => {
  dir = await makeTempDir();
});
afterAll(async () => {
  await removeTempDir(dir);
});

const implementations = [
  ['punchHole (native addon)', punchHole],
  ['punchHoleWithFallocateTool (util-linux fallback)', punchHoleWithFallocateTool],
] as const;

describe.each(implementations)('%s', (name, punch) => {
  const slug = name.split(' ')[0];

  it('deallocates the range (st_blocks drops), keeps the size and the bytes outside the range', async () => {
    const file = path.join(dir, `${slug}-full`);
    const bytes = noise(8 * MiB, 3);
    await createSparseFile(file, bytes.length, [{ offset: 0, data: bytes }]);
    const before = await allocatedBytes(file);
    expect(before).toBeGreaterThanOrEqual(8 * MiB);

    await punch(file, MiB, 2 * MiB);

    const after = await allocatedBytes(file);
    expect(before - after).toBe(2 * MiB);
    expect((await stat(file)).size).toBe(8 * MiB);
    const content = await readFile(file);
    expect(content.subarray(0, MiB).equals(bytes.subarray(0, MiB))).toBe(true);
    expect(content.subarray(MiB, 3 * MiB).equals(Buffer.alloc(2 * MiB))).toBe(true);
    expect(content.subarray(3 * MiB).equals(bytes.subarray(3 * MiB))).toBe(true);
    const layout = await getFileLayout(file, { backend: 'seek-data' });
    expect(layout.holes).toEqual([{ offset: MiB, length: 2 * MiB }]);
  });

  it('zeroes a range that is not block-aligned and frees only the whole blocks inside it', async () => {
    const file = path.join(dir, `${slug}-unaligned`);
    const bytes = noise(64 * 1024, 5);
    await createSparseFile(file, bytes.length, [{ offset: 0, data: bytes }]);
    const before = await allocatedBytes(file);
    await punch(file, 1000, 3 * 4096 + 500); // [1000, 13788): only [4096, 12288) is whole blocks
    expect(before - (await allocatedBytes(file))).toBe(2 * 4096);
    const content = await readFile(file);
    expect(content.length).toBe(bytes.length);
    expect(content.subarray(0, 1000).equals(bytes.subarray(0, 1000))).toBe(true);
    expect(content.subarray(1000, 13788).equals(Buffer.alloc(12788))).toBe(true);
    expect(content.subarray(13788).equals(bytes.subarray(13788))).toBe(true);
  });

  it('a range past the end of the file keeps the size', async () => {
    const file = path.join(dir, `${slug}-past-end`);
    await createSparseFile(file, 10_000, [{ offset: 0, data: noise(10_000) }]);
    await punch(file, 8192, MiB);
    expect((await stat(file)).size).toBe(10_000);
    const content = await readFile(file);
    expect(content.subarray(8192).equals(Buffer.alloc(10_000 - 8192))).toBe(true);
  });

  it('length 0 is a no-op; bad arguments and a missing file are clear errors that write nothing', async () => {
    const file = path.join(dir, `${slug}-args`);
    const bytes = noise(8192);
    await createSparseFile(file, 8192, [{ offset: 0, data: bytes }]);
    await punch(file, 0, 0);
    await expect(punch(file, -1, 10)).rejects.toThrow(/offset must be a non-negative safe integer/);
    await expect(punch(file, 0, Number.NaN)).rejects.toThrow(/length must be a non-negative safe integer/);
    expect((await readFile(file)).equals(bytes)).toBe(true);
    await expect(punch(path.join(dir, 'no-such-file'), 0, 4096)).rejects.toThrow(/no-such-file/);
  });
});

describe('punchHole errors', () => {
  it('refuses a directory, naming the path', async () => {
    const sub = path.join(dir, 'not-a-file');
    await mkdir(sub);
    await expect(punchHole(sub, 0, 4096)).rejects.toThrow(/not-a-file/);
  });

  it('the fallback reports a failing fallocate tool as a PunchHoleError naming the file and range', async () => {
    const sub = path.join(dir, 'dir-for-tool');
    await mkdir(sub);
    const err = await punchHoleWithFallocateTool(sub, 4096, 4096).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PunchHoleError);
    expect((err as Error).message).toMatch(/cannot punch a hole in .*dir-for-tool at \[4096, 8192\): .*fallocate --punch-hole failed/);
  });
});
