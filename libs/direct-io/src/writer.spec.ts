import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { constants as fsConstants, promises as fsp } from 'node:fs';
import { randomBytes } from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import { alignedBuffer, DIRECT_IO_ALIGNMENT, DirectFileWriter, directIoSupported, isAlignedView } from './index.js';

let dir: string;
/** Whether the temp directory's filesystem takes O_DIRECT (ext4 and xfs do; tmpfs before Linux 6.6 does not). */
const directSupported = await directIoSupported(os.tmpdir());
if (!directSupported) console.warn(`direct-io writer.spec: O_DIRECT tests skipped: ${os.tmpdir()} has no O_DIRECT`);
const itDirect = directSupported ? it : it.skip;

beforeAll(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'direct-io-'));
});
afterAll(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

async function target(name: string, size: number): Promise<{ file: string; fh: fsp.FileHandle }> {
  const file = path.join(dir, name);
  const fh = await fsp.open(file, 'w+');
  await fh.truncate(size);
  return { file, fh };
}

describe('alignedBuffer', () => {
  it('is zero-filled and of the asked size', () => {
    const b = alignedBuffer(3 * DIRECT_IO_ALIGNMENT + 5);
    expect(b.length).toBe(3 * DIRECT_IO_ALIGNMENT + 5);
    expect(b.every((x) => x === 0)).toBe(true);
  });

  itDirect(`is accepted by an O_DIRECT write where an unaligned start is refused${directSupported ? '' : " (skipped: the temp directory's filesystem has no O_DIRECT)"}`, async () => {
    const b = alignedBuffer(3 * DIRECT_IO_ALIGNMENT + 5);
    const { file, fh } = await target('aligned', 2 * DIRECT_IO_ALIGNMENT);
    await fh.close();
    const d = await fsp.open(file, fsConstants.O_WRONLY | fsConstants.O_DIRECT);
    try {
      b.fill(7);
      // an unaligned start is refused, the aligned buffer is taken
      await expect(d.write(b, 16, DIRECT_IO_ALIGNMENT, 0)).rejects.toMatchObject({ code: 'EINVAL' });
      expect((await d.write(b, 0, DIRECT_IO_ALIGNMENT, DIRECT_IO_ALIGNMENT)).bytesWritten).toBe(DIRECT_IO_ALIGNMENT);
    } finally {
      await d.close();
    }
    const back = await fsp.readFile(file);
    expect(back.subarray(0, DIRECT_IO_ALIGNMENT).every((x) => x === 0)).toBe(true);
    expect(back.subarray(DIRECT_IO_ALIGNMENT).every((x) => x === 7)).toBe(true);
  });

  it('knows its aligned views, shared ones too', () => {
    const b = alignedBuffer(3 * DIRECT_IO_ALIGNMENT);
    expect(isAlignedView(b)).toBe(true);
    expect(isAlignedView(b.subarray(DIRECT_IO_ALIGNMENT))).toBe(true);
    expect(isAlignedView(b.subarray(16))).toBe(false);
    expect(isAlignedView(Buffer.alloc(DIRECT_IO_ALIGNMENT))).toBe(false);
    const s = alignedBuffer(DIRECT_IO_ALIGNMENT, { shared: true });
    expect(s.buffer).toBeInstanceOf(SharedArrayBuffer);
    expect(isAlignedView(s)).toBe(true);
  });

  it('rejects a bad size', () => {
    expect(() => alignedBuffer(0)).toThrow(/positive integer/);
    expect(() => alignedBuffer(1.5)).toThrow(/positive integer/);
  });
});

describe('DirectFileWriter', () => {
  it('writes any offsets and lengths exactly: aligned middles direct, heads and tails buffered', async () => {
    const size = 8 << 20;
    const { file, fh } = await target('mixed', size);
    const model = Buffer.alloc(size);
    const w = await DirectFileWriter.open(file, fh, { stagingSize: 64 * 1024 });
    expect(w.direct).toBe(directSupported);
    const writes: Array<[number, number]> = [
      [0, 2 << 20], // aligned, several staging pieces
      [(2 << 20) + 100, 300_001], // unaligned head and tail
      [5 << 20, 4096], // one aligned unit
      [(6 << 20) + 1, 10], // inside one unit: all buffered
      [size - 777, 777], // short last piece
      [(2 << 20) + 50_000, 70_000], // overlaps an earlier write: the later one wins
    ];
    await Promise.all(
      writes.map(([at, n]) => {
        const data = randomBytes(n);
        data.copy(model, at);
        return w.write(data, at);
      }),
    );
    await w.close();
    await fh.sync();
    await fh.close();
    expect((await fsp.readFile(file)).equals(model)).toBe(true);
    const total = writes.reduce((s, [, n]) => s + n, 0);
    expect(w.stats.directBytes + w.stats.bufferedBytes).toBe(total);
    if (directSupported) {
      // the whole first write; 4096-aligned middles of the second (294 912) and last (65 536); the one unit
      expect(w.stats.directBytes).toBe((2 << 20) + 294_912 + 4096 + 65_536);
    } else {
      expect(w.stats.directBytes).toBe(0);
    }
  });

  it('writes an aligned buffer without copying it, and copies anything else', async () => {
    const { file, fh } = await target('zero-copy', 1 << 20);
    const w = await DirectFileWriter.open(file, fh);
    const aligned = alignedBuffer(256 * 1024);
    aligned.fill(3);
    await w.write(aligned, 0);
    await w.write(Buffer.alloc(256 * 1024, 4), 256 * 1024);
    await w.close();
    await fh.close();
    const back = await fsp.readFile(file);
    expect(back[0]).toBe(3);
    expect(back[300 * 1024]).toBe(4);
    expect(w.stats.zeroCopyBytes).toBe(directSupported ? 256 * 1024 : 0);
    expect(w.stats.directBytes).toBe(directSupported ? 512 * 1024 : 0);
  });

  it('a direct write replaces what the page cache held for the range', async () => {
    const { file, fh } = await target('coherent', 1 << 20);
    await fh.write(Buffer.alloc(1 << 20, 1), 0, 1 << 20, 0);
    expect((await fsp.readFile(file))[4096]).toBe(1); // now in the page cache
    const w = await DirectFileWriter.open(file, fh);
    await w.write(Buffer.alloc(64 * 1024, 2), 0);
    await w.close();
    const back = await fsp.readFile(file);
    expect(back[4096]).toBe(2);
    expect(back[64 * 1024]).toBe(1);
    await fh.close();
  });

  it('with direct: false every byte goes through the buffered handle', async () => {
    const { file, fh } = await target('buffered', 1 << 20);
    const w = await DirectFileWriter.open(file, fh, { direct: false });
    expect(w.direct).toBe(false);
    const data = randomBytes(1 << 20);
    await w.write(data, 0);
    await w.close();
    await fh.close();
    expect(w.stats).toEqual({ directBytes: 0, bufferedBytes: 1 << 20, zeroCopyBytes: 0 });
    expect((await fsp.readFile(file)).equals(data)).toBe(true);
  });

  it('rejects bad options and positions, and a failed write does not stop the next', async () => {
    const { file, fh } = await target('bad', 1 << 16);
    await expect(DirectFileWriter.open(file, fh, { stagingSize: 1000 })).rejects.toThrow(/stagingSize must be a positive multiple of 4096, got 1000/);
    const w = await DirectFileWriter.open(file, fh);
    await expect(w.write(Buffer.alloc(10), -1)).rejects.toThrow(/write position must be a non-negative integer, got -1/);
    await w.write(Buffer.alloc(10, 9), 5);
    await w.close();
    await fh.close();
    expect((await fsp.readFile(file))[5]).toBe(9);
  });
});
