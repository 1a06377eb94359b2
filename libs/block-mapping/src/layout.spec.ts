import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { extentBackend, getDataExtents, getFileLayout } from './layout.js';
import { type ExtentBackend, type FileLayout } from './extent.js';
import {
  createLonghornFixtureSource,
  createSparseFile,
  makeTempDir,
  noise,
  removeTempDir,
} from './test-support/sparse-files.js';

const KiB = 1024;
const MiB = 1024 * KiB;
const BACKENDS: ExtentBackend[] = ['seek-data', 'zero-scan'];

let dir: string;
beforeAll(async () => {
  dir = await makeTempDir();
});
afterAll(async () => {
  await removeTempDir(dir);
});

async function bothLayouts(file: string): Promise<Record<ExtentBackend, FileLayout>> {
  return {
    'seek-data': await getFileLayout(file, { backend: 'seek-data' }),
    'zero-scan': await getFileLayout(file, { backend: 'zero-scan' }),
  };
}

describe('extentBackend', () => {
  it('uses the native SEEK_DATA addon (it is built by npm install)', () => {
    expect(extentBackend()).toBe('seek-data');
  });

  it('is what getFileLayout uses when no backend is requested', async () => {
    const file = path.join(dir, 'default-backend');
    await createSparseFile(file, MiB, [{ offset: 0, data: noise(10) }]);
    expect((await getFileLayout(file)).backend).toBe(extentBackend());
  });
});

describe('getFileLayout on real sparse files, both backends', () => {
  it('empty file: no data, no holes', async () => {
    const file = path.join(dir, 'empty');
    await createSparseFile(file, 0);
    for (const [backend, layout] of Object.entries(await bothLayouts(file))) {
      expect(layout).toEqual({ size: 0, data: [], holes: [], backend });
    }
  });

  it('all-hole file: one hole covering the whole file', async () => {
    const file = path.join(dir, 'all-hole');
    await createSparseFile(file, 16 * MiB + 123);
    for (const [backend, layout] of Object.entries(await bothLayouts(file))) {
      expect(layout).toEqual({
        size: 16 * MiB + 123,
        data: [],
        holes: [{ offset: 0, length: 16 * MiB + 123 }],
        backend,
      });
    }
  });

  it('data at the end of a file whose size is not block-aligned', async () => {
    const size = 5 * MiB + 123;
    const file = path.join(dir, 'data-at-end');
    await createSparseFile(file, size, [{ offset: size - 200, data: noise(200) }]);
    const blockStart = Math.floor((size - 200) / 4096) * 4096;
    for (const layout of Object.values(await bothLayouts(file))) {
      expect(layout.data).toEqual([{ offset: blockStart, length: size - blockStart }]);
      expect(layout.holes).toEqual([{ offset: 0, length: blockStart }]);
    }
  });

  it('data not 4 KiB-aligned is reported as the whole 4 KiB blocks it touches, merged', async () => {
    const file = path.join(dir, 'unaligned');
    await createSparseFile(file, 4 * MiB, [
      { offset: 5000, data: noise(10) }, // block [4096, 8192)
      { offset: 10000, data: noise(5000) }, // blocks [8192, 16384)
      { offset: 3 * MiB - 1, data: noise(2) }, // straddles a 1 MiB read chunk of zero-scan
    ]);
    const expected = [
      { offset: 4096, length: 16384 - 4096 },
      { offset: 3 * MiB - 4096, length: 8192 },
    ];
    for (const layout of Object.values(await bothLayouts(file))) {
      expect(layout.data).toEqual(expected);
      expect(layout.holes).toEqual([
        { offset: 0, length: 4096 },
        { offset: 16384, length: 3 * MiB - 4096 - 16384 },
        { offset: 3 * MiB + 4096, length: MiB - 4096 },
      ]);
    }
  });

  it('many extents: both backends agree when no allocated block is all zeros', async () => {
    const size = 40 * MiB;
    const writes = [];
    for (let i = 0; i < 37; i++) {
      writes.push({ offset: i * 1_048_000 + (i % 3) * 777, data: noise(1 + ((i * 7919) % 200_000), i + 1) });
    }
    const file = path.join(dir, 'many');
    await createSparseFile(file, size, writes);
    const { 'seek-data': seek, 'zero-scan': scan } = await bothLayouts(file);
    expect(seek.data.length).toBeGreaterThan(5);
    expect(scan.data).toEqual(seek.data);
    expect(scan.holes).toEqual(seek.holes);
    // data and holes tile the file exactly, in order
    const tiles = [...seek.data, ...seek.holes].sort((a, b) => a.offset - b.offset);
    let pos = 0;
    for (const t of tiles) {
      expect(t.offset).toBe(pos);
      expect(t.length).toBeGreaterThan(0);
      pos += t.length;
    }
    expect(pos).toBe(size);
    for (const e of seek.data) expect(e.offset % 4096).toBe(0);
  });

  it('allocated all-zero blocks: seek-data reports them as data, zero-scan as holes', async () => {
    const file = path.join(dir, 'allocated-zeros');
    await createSparseFile(file, 4 * MiB, [
      { offset: 0, data: noise(4096) },
      { offset: MiB, data: Buffer.alloc(64 * KiB) },
    ]);
    const { 'seek-data': seek, 'zero-scan': scan } = await bothLayouts(file);
    expect(seek.data).toEqual([
      { offset: 0, length: 4096 },
      { offset: MiB, length: 64 * KiB },
    ]);
    expect(scan.data).toEqual([{ offset: 0, length: 4096 }]);
  });

  it('the Longhorn fixture source: seek-data gives the extents recorded in the reference', async () => {
    const file = path.join(dir, 'fixture-source');
    await createLonghornFixtureSource(file);
    const layout = await getFileLayout(file, { backend: 'seek-data' });
    expect(layout.size).toBe(9437307);
    expect(layout.data.map((e) => [e.offset, e.offset + e.length])).toEqual([
      [0, 2097152],
      [4194304, 8388608],
      [8650752, 8716288],
      [9433088, 9437307],
    ]);
    expect(await getDataExtents(file)).toEqual(layout.data);
  });

  it('reports progress up to the file size', async () => {
    const file = path.join(dir, 'progress');
    await createSparseFile(file, 5 * MiB, [{ offset: 2 * MiB, data: noise(100) }]);
    for (const backend of BACKENDS) {
      const seen: Array<[number, number]> = [];
      await getFileLayout(file, { backend, onProgress: (scanned, size) => seen.push([scanned, size]) });
      expect(seen.length).toBeGreaterThan(0);
      expect(seen[seen.length - 1]).toEqual([5 * MiB, 5 * MiB]);
      for (let i = 1; i < seen.length; i++) expect(seen[i][0]).toBeGreaterThanOrEqual(seen[i - 1][0]);
    }
  });
});

describe('getFileLayout errors and cancellation', () => {
  it('rejects a missing file, a directory and an unknown backend with clear errors', async () => {
    await expect(getFileLayout(path.join(dir, 'missing'))).rejects.toThrow(/ENOENT/);
    const sub = path.join(dir, 'a-directory');
    await mkdir(sub);
    await expect(getFileLayout(sub)).rejects.toThrow(/not a regular file/);
    const file = path.join(dir, 'x');
    await writeFile(file, 'x');
    await expect(getFileLayout(file, { backend: 'fiemap' as ExtentBackend })).rejects.toThrow(
      /unknown extent backend "fiemap"/,
    );
  });

  it('an already-aborted signal rejects before touching the file', async () => {
    const ac = new AbortController();
    ac.abort(new Error('stop now'));
    await expect(getFileLayout(path.join(dir, 'missing'), { signal: ac.signal })).rejects.toThrow('stop now');
  });

  it('zero-scan stops when aborted mid-scan', async () => {
    const file = path.join(dir, 'abort-scan');
    await createSparseFile(file, 64 * MiB);
    const ac = new AbortController();
    let calls = 0;
    const scan = getFileLayout(file, {
      backend: 'zero-scan',
      signal: ac.signal,
      onProgress: () => {
        if (++calls === 2) ac.abort();
      },
    });
    await expect(scan).rejects.toMatchObject({ name: 'AbortError' });
    expect(calls).toBe(2);
  });

  it('seek-data stops when aborted while walking many extents', async () => {
    const file = path.join(dir, 'abort-seek');
    const writes = [];
    for (let i = 0; i < 3000; i++) writes.push({ offset: i * 8192, data: Buffer.from([1]) });
    await createSparseFile(file, 3000 * 8192, writes);
    const ac = new AbortController();
    let calls = 0;
    const scan = getFileLayout(file, {
      backend: 'seek-data',
      signal: ac.signal,
      onProgress: (scanned, size) => {
        calls++;
        if (scanned < size) ac.abort();
      },
    });
    await expect(scan).rejects.toMatchObject({ name: 'AbortError' });
    expect(calls).toBe(1);
    // without the signal the same file maps to 3000 extents
    expect((await getFileLayout(file, { backend: 'seek-data' })).data).toHaveLength(3000);
  });
});
