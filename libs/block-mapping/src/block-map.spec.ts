import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { BLOCK_SIZE, iterateBlocks, mapBlocks, type BlockMapping } from './block-map.js';
import { getFileLayout } from './layout.js';
import {
  LONGHORN_FIXTURE,
  createLonghornFixtureSource,
  createSparseFile,
  makeTempDir,
  noise,
  removeTempDir,
} from './test-support/sparse-files.js';

const MiB = 1024 * 1024;

describe('mapBlocks (Longhorn rule: a block is included when it touches any data extent)', () => {
  it('uses 2 MiB blocks by default', () => {
    expect(BLOCK_SIZE).toBe(2097152);
  });

  it('no data, no blocks', () => {
    expect(mapBlocks([], 0)).toEqual([]);
    expect(mapBlocks([], 10 * MiB)).toEqual([]);
  });

  it('one byte of data maps its whole block', () => {
    expect(mapBlocks([{ offset: 3 * MiB, length: 1 }], 10 * MiB)).toEqual([{ offset: 2 * MiB, size: BLOCK_SIZE }]);
  });

  it('an extent straddling a boundary maps both blocks; one ending on a boundary does not touch the next', () => {
    expect(mapBlocks([{ offset: 2 * MiB - 1, length: 2 }], 8 * MiB)).toEqual([
      { offset: 0, size: BLOCK_SIZE },
      { offset: 2 * MiB, size: BLOCK_SIZE },
    ]);
    expect(mapBlocks([{ offset: 2 * MiB, length: 2 * MiB }], 8 * MiB)).toEqual([{ offset: 2 * MiB, size: BLOCK_SIZE }]);
  });

  it('emits each block once and in order, for overlapping, adjacent or unsorted extents', () => {
    const data = [
      { offset: 5 * MiB, length: 10 },
      { offset: 0, length: 100 },
      { offset: 50, length: 4 * MiB },
      { offset: 4 * MiB + 1, length: 1 },
    ];
    expect(mapBlocks(data, 8 * MiB).map((m) => m.offset)).toEqual([0, 2 * MiB, 4 * MiB]);
  });

  it('the last block is short; extent bytes past the file size are ignored', () => {
    const size = 4 * MiB + 123;
    expect(mapBlocks([{ offset: 4 * MiB + 100, length: 10 * MiB }], size)).toEqual([{ offset: 4 * MiB, size: 123 }]);
    expect(mapBlocks([{ offset: size, length: 5 }], size)).toEqual([]);
    expect(mapBlocks([{ offset: 0, length: size }], size)).toEqual([
      { offset: 0, size: BLOCK_SIZE },
      { offset: 2 * MiB, size: BLOCK_SIZE },
      { offset: 4 * MiB, size: 123 },
    ]);
  });

  it('takes another block size', () => {
    expect(mapBlocks([{ offset: 4096, length: 1 }, { offset: 9000, length: 1 }], 10_000, 4096)).toEqual([
      { offset: 4096, size: 4096 },
      { offset: 8192, size: 10_000 - 8192 },
    ]);
  });

  it('rejects nonsense arguments', () => {
    expect(() => mapBlocks([], -1)).toThrow(/fileSize must be a non-negative safe integer/);
    expect(() => mapBlocks([], 10, 0)).toThrow(/blockSize must be a positive safe integer/);
    expect(() => mapBlocks([{ offset: -5, length: 10 }], 10)).toThrow(/extent offset/);
    expect(() => mapBlocks([{ offset: 0, length: 1.5 }], 10)).toThrow(/extent length/);
  });

  it("matches the Longhorn fixture's block list (extents from the reference, config from the fixture)", async () => {
    const cfg = JSON.parse(
      await readFile(
        path.join(LONGHORN_FIXTURE, 'backupstore/backing-images/backing-images/fixture-lz4/backing-image.cfg'),
        'utf8',
      ),
    ) as { Size: string; Blocks: Array<{ Offset: number }> };
    const size = Number(cfg.Size);
    expect(size).toBe(9437307);
    const extents = [
      { offset: 0, length: 2097152 },
      { offset: 4194304, length: 8388608 - 4194304 },
      { offset: 8650752, length: 65536 },
      { offset: 9433088, length: 9437307 - 9433088 },
    ];
    const mappings = mapBlocks(extents, size);
    expect(mappings.map((m) => m.offset)).toEqual(cfg.Blocks.map((b) => b.Offset));
    expect(mappings).toEqual([
      { offset: 0, size: BLOCK_SIZE },
      { offset: 4194304, size: BLOCK_SIZE },
      { offset: 6291456, size: BLOCK_SIZE },
      { offset: 8388608, size: 1048699 },
    ]);
  });
});

describe('iterateBlocks', () => {
  let dir: string;
  let fixtureFile: string;
  beforeAll(async () => {
    dir = await makeTempDir();
    fixtureFile = path.join(dir, 'fixture-source');
    await createLonghornFixtureSource(fixtureFile);
  });
  afterAll(async () => {
    await removeTempDir(dir);
  });

  it('yields the mapped blocks of a real sparse file with their exact bytes (holes inside a block read as zeros)', async () => {
    const whole = await readFile(fixtureFile);
    const seen: BlockMapping[] = [];
    for await (const block of iterateBlocks(fixtureFile)) {
      seen.push({ offset: block.offset, size: block.size });
      expect(block.data.length).toBe(block.size);
      expect(block.data.equals(whole.subarray(block.offset, block.offset + block.size))).toBe(true);
    }
    expect(seen).toEqual([
      { offset: 0, size: BLOCK_SIZE },
      { offset: 4194304, size: BLOCK_SIZE },
      { offset: 6291456, size: BLOCK_SIZE },
      { offset: 8388608, size: 1048699 },
    ]);
  });

  it('each yielded buffer stays valid after the next block is read', async () => {
    const blocks = [];
    for await (const block of iterateBlocks(fixtureFile)) blocks.push(block);
    const whole = await readFile(fixtureFile);
    for (const b of blocks) expect(b.data.equals(whole.subarray(b.offset, b.offset + b.size))).toBe(true);
  });

  it('reads given mappings with another block size', async () => {
    const file = path.join(dir, 'small-blocks');
    const bytes = noise(10_000);
    await createSparseFile(file, 10_000, [{ offset: 0, data: bytes }]);
    const layout = await getFileLayout(file);
    const mappings = mapBlocks(layout.data, layout.size, 4096);
    const out: Buffer[] = [];
    for await (const b of iterateBlocks(file, { mappings })) out.push(b.data);
    expect(out.map((b) => b.length)).toEqual([4096, 4096, 10_000 - 8192]);
    expect(Buffer.concat(out).equals(bytes)).toBe(true);
    const viaOption: number[] = [];
    for await (const b of iterateBlocks(file, { blockSize: 4096 })) viaOption.push(b.size);
    expect(viaOption).toEqual([4096, 4096, 10_000 - 8192]);
  });

  it('rejects a mapping that lies beyond the end of the file', async () => {
    const run = async () => {
      for await (const _ of iterateBlocks(fixtureFile, { mappings: [{ offset: 8388608, size: BLOCK_SIZE }] })) {
        // nothing
      }
    };
    await expect(run()).rejects.toThrow(/block \[8388608, 10485760\) lies beyond the end of .* \(size 9437307\)/);
  });

  it('stops with the abort reason when the signal fires between blocks', async () => {
    const ac = new AbortController();
    const offsets: number[] = [];
    const run = async () => {
      for await (const b of iterateBlocks(fixtureFile, { signal: ac.signal })) {
        offsets.push(b.offset);
        ac.abort(new Error('cancelled by test'));
      }
    };
    await expect(run()).rejects.toThrow('cancelled by test');
    expect(offsets).toEqual([0]);
  });

  it('an already-aborted signal yields nothing', async () => {
    const ac = new AbortController();
    ac.abort();
    const gen = iterateBlocks(fixtureFile, { signal: ac.signal });
    await expect(gen.next()).rejects.toMatchObject({ name: 'AbortError' });
  });
});
