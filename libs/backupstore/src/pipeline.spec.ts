import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { compressFrame } from 'lz4-napi';
import { decodeFrameInto, storedFrameData, writeStoredFrame, writeStoredFrameEnds, xxh32, STORED_FRAME_OVERHEAD } from './lz4-frame.js';
import { ImageHasher } from './image-hash.js';
import { BlockWorkerPool, SlotPool } from './pipeline.js';
import { LONGHORN_LOCK_TIMING, lockTimingFromEnv } from './lock.js';
import { blockChecksum, blockPath } from './names.js';
import { createBackup } from './engine/backup.js';
import { restoreBackup } from './engine/restore.js';
import { BLOCK, FAST_LOCKS, patternBlock, sha512File, tempDir, writeImage, type Piece } from './test-support/images.js';

let work: string;
beforeAll(async () => {
  work = await tempDir();
});
afterAll(async () => {
  await fs.rm(work, { recursive: true, force: true });
});

describe('LZ4 frames with an uncompressed block', () => {
  it('xxh32 matches the reference vectors and lz4_flex content checksums, aligned or not', async () => {
    expect(xxh32(new Uint8Array(0), 0)).toBe(0x02cc5d05);
    expect(xxh32(Buffer.from('a'), 0)).toBe(0x550d7456);
    expect(xxh32(Buffer.from('Nobody inspects the spammish repetition'), 0)).toBe(0xe2293b2f);
    const data = randomBytes(100_003);
    const frame = await compressFrame(data, { contentChecksum: true });
    const recorded = frame.readUInt32LE(frame.length - 4);
    expect(xxh32(data, 0)).toBe(recorded);
    const shifted = Buffer.alloc(data.length + 1);
    data.copy(shifted, 1);
    expect(xxh32(shifted.subarray(1), 0)).toBe(recorded);
  });

  it('writes incompressible data byte for byte as lz4_flex does, and the reference lz4 tool decodes it', async () => {
    const data = randomBytes(BLOCK);
    const ours = Buffer.alloc(BLOCK + STORED_FRAME_OVERHEAD);
    expect(writeStoredFrame(data, ours, 0, xxh32(data, 0))).toBe(ours.length);
    expect(ours.equals(await compressFrame(data, { contentChecksum: true }))).toBe(true);
    expect(execFileSync('lz4', ['-d', '-c'], { input: ours, maxBuffer: 8 << 20 }).equals(data)).toBe(true);
    // The vectored form: header and trailer back to back, data in between.
    const ends = Buffer.alloc(19);
    writeStoredFrameEnds(data.length, ends, 0, xxh32(data, 0));
    expect(Buffer.concat([ends.subarray(0, 11), data, ends.subarray(11)]).equals(ours)).toBe(true);
  });

  it('finds the data of a single uncompressed block and declines everything else', async () => {
    const data = randomBytes(5000);
    const frame = Buffer.alloc(5000 + 19);
    writeStoredFrame(data, frame, 0, xxh32(data, 0));
    expect(storedFrameData(frame)).toEqual([11, 5000]);
    // Trailing bytes, a truncated frame, a compressed block, a bad version: the caller decompresses normally.
    expect(storedFrameData(Buffer.concat([frame, Buffer.from([0])]))).toBeUndefined();
    expect(storedFrameData(frame.subarray(0, frame.length - 1))).toBeUndefined();
    expect(storedFrameData(await compressFrame(patternBlock(3), { contentChecksum: true }))).toBeUndefined();
    const badVersion = Buffer.from(frame);
    badVersion[4] = 0x24;
    expect(storedFrameData(badVersion)).toBeUndefined();
    // Block checksums and no content checksum (FLG 0x70), written by hand: header, block, block checksum, end mark.
    const withBlockSums = Buffer.concat([
      Buffer.from('04224d187070', 'hex'),
      Buffer.from([0x00]),
      Buffer.from([0x88, 0x13, 0x00, 0x80]),
      data,
      Buffer.alloc(4, 0xaa),
      Buffer.alloc(4),
    ]);
    expect(storedFrameData(withBlockSums)).toEqual([11, 5000]);
  });
});

describe('LZ4 frame decoding into a given buffer', () => {
  const mixed = Buffer.concat([patternBlock(9, BLOCK / 2), randomBytes(100_000), Buffer.alloc(300_000), Buffer.from('abc'.repeat(50_000))]);
  const inputs: [string, Buffer][] = [
    ['pattern', patternBlock(4)],
    ['random', randomBytes(BLOCK)],
    ['zeros', Buffer.alloc(BLOCK)],
    ['mixed', mixed.subarray(0, Math.min(mixed.length, BLOCK))],
    ['short', Buffer.from('hello hello hello hello hello')],
    ['one byte', Buffer.from([7])],
  ];

  it.each(inputs)('decodes lz4_flex frames of %s data exactly', async (_what, data) => {
    const frame = await compressFrame(data, { contentChecksum: true });
    const out = Buffer.alloc(BLOCK);
    expect(decodeFrameInto(frame, out)).toBe(data.length);
    expect(out.subarray(0, data.length).equals(data)).toBe(true);
  });

  it('decodes frames of the reference lz4 tool: linked 64 KB blocks, block checksums, content size, levels', () => {
    const data = Buffer.concat([patternBlock(12), randomBytes(4096)]).subarray(0, BLOCK);
    for (const args of [['-B4', '-BD'], ['-B4', '--content-size', '-BX'], ['-9', '-B7'], ['-1', '-B5', '--no-frame-crc']]) {
      const frame = execFileSync('lz4', ['-c', '-z', ...args], { input: data, maxBuffer: 8 << 20 });
      const out = Buffer.alloc(BLOCK);
      expect([args.join(' '), decodeFrameInto(frame, out)]).toEqual([args.join(' '), data.length]);
      expect(out.equals(data)).toBe(true);
    }
  });

  it('declines malformed frames and output that does not fit', async () => {
    const data = patternBlock(13);
    const frame = await compressFrame(data, { contentChecksum: true });
    expect(decodeFrameInto(frame, Buffer.alloc(BLOCK - 1))).toBe(-1);
    expect(decodeFrameInto(frame.subarray(0, frame.length - 5), Buffer.alloc(BLOCK))).toBe(-1);
    expect(decodeFrameInto(Buffer.concat([frame, Buffer.from([1])]), Buffer.alloc(BLOCK))).toBe(-1);
    // Hand-made frames (FLG 0x60: no checksums): 1 literal 'a', a 4-byte match at `offset`, then literal 'b'. (The
    // decoder is more lenient than the reference one about LZ4's end-of-block rules; the output is SHA-checked.)
    const handMade = (offset: number) =>
      Buffer.concat([
        Buffer.from('04224d186070', 'hex'),
        Buffer.from([(xxh32(Buffer.from([0x60, 0x70]), 0) >>> 8) & 0xff]),
        Buffer.from([6, 0, 0, 0, 0x10, 0x61, offset, 0x00, 0x10, 0x62]),
        Buffer.alloc(4),
      ]);
    const out = Buffer.alloc(16);
    expect(decodeFrameInto(handMade(1), out)).toBe(6);
    expect(out.subarray(0, 6).toString()).toBe('aaaaab');
    expect(decodeFrameInto(handMade(5), out)).toBe(-1); // the match starts before the output
    expect(decodeFrameInto(handMade(0), out)).toBe(-1); // offset 0 is invalid
    expect(decodeFrameInto(Buffer.from('not a frame at all'), Buffer.alloc(BLOCK))).toBe(-1);
  });
});

describe('block workers and the image hasher', () => {
  it('name, zero-check and frame blocks in shared slots', async () => {
    const pool = new SlotPool(2);
    const workers = new BlockWorkerPool(pool, 2);
    try {
      const slot = await pool.acquire();
      const random = randomBytes(BLOCK);
      random.copy(slot.data);
      const p = await workers.prepare(slot, BLOCK, true);
      expect(p).toMatchObject({ zero: false, checksum: blockChecksum(random) });
      if (p.zero) throw new Error('unreachable');
      expect(Buffer.concat(p.frame).equals(await compressFrame(random, { contentChecksum: true }))).toBe(true);
      // Compressible data is left to the compressor; gzip/none never get a frame.
      patternBlock(5).copy(slot.data);
      expect(await workers.prepare(slot, BLOCK, true)).toEqual({ zero: false, checksum: blockChecksum(patternBlock(5)), frame: [] });
      random.copy(slot.data);
      expect(await workers.prepare(slot, BLOCK, false)).toMatchObject({ frame: [] });
      slot.data.fill(0, 0, 1000);
      expect(await workers.prepare(slot, 1000, true)).toEqual({ zero: true });
      // Restore side: raw bytes and an uncompressed frame are checked in place; a compressed frame is declined.
      const frame = await compressFrame(random, { contentChecksum: true });
      frame.copy(slot.stored);
      expect(await workers.check(slot, frame.length)).toEqual({ fast: true, decoded: false, checksum: blockChecksum(random), zero: false, dataOffset: 11, dataLength: BLOCK });
      expect(await workers.check(slot, frame.length, false)).toEqual({ fast: true, decoded: false, checksum: '', zero: false, dataOffset: 11, dataLength: BLOCK });
      random.copy(slot.stored);
      expect(await workers.check(slot, 777)).toMatchObject({ fast: true, checksum: blockChecksum(random.subarray(0, 777)), dataOffset: 0 });
      // A compressed frame is decoded into the block area and always named; gzip is left to the caller.
      const packed = await compressFrame(patternBlock(6), { contentChecksum: true });
      packed.copy(slot.stored);
      expect(await workers.check(slot, packed.length, false)).toEqual({
        fast: true, decoded: true, checksum: blockChecksum(patternBlock(6)), zero: false, dataOffset: 0, dataLength: BLOCK,
      });
      expect(slot.data.equals(patternBlock(6))).toBe(true);
      Buffer.from('1f8b0800000000000003', 'hex').copy(slot.stored);
      expect(await workers.check(slot, 10)).toEqual({ fast: false });
    } finally {
      await workers.close();
    }
  });

  it('hashes slots, copied bytes and zero ranges in submission order', async () => {
    const pool = new SlotPool(1);
    const slot = await pool.acquire();
    const a = randomBytes(BLOCK);
    a.copy(slot.data);
    const b = randomBytes(12345);
    const image = new ImageHasher(pool.memory);
    const pending = [image.update(slot.data), image.zeros(3 * BLOCK + 7), image.update(b), image.zeros(0)];
    await Promise.all(pending);
    const expected = createHash('sha512').update(a).update(Buffer.alloc(3 * BLOCK + 7)).update(b).digest('hex');
    expect(await image.digest()).toBe(expected);
    await expect(image.update(b)).rejects.toThrow(/closed/);
  });
});

describe('backup and restore through the pipeline', () => {
  it('stores random blocks as uncompressed LZ4 frames and compressible ones compressed; both restore exactly', async () => {
    const store = path.join(work, 'frames');
    const image = path.join(work, 'frames.img');
    const src = await writeImage(image, [{ kind: 'random' }, { kind: 'data', seed: 11 }, { kind: 'hole' }, { kind: 'zeros' }, { kind: 'random' }], 4321);
    const r = await createBackup({ target: `vfs://${store}`, name: 'frames', filePath: image, compression: 'lz4', concurrency: 2, lockTiming: FAST_LOCKS });
    expect(r).toMatchObject({ sha512: src.sha512, blockCount: 4, zeroBlocks: 1, uploadedBlocks: 4 });
    const bytes = await fs.readFile(image);
    const stored = async (offset: number, length = BLOCK) =>
      fs.readFile(path.join(store, blockPath(blockChecksum(bytes.subarray(offset, offset + length)))));
    const first = await stored(0);
    expect(first.length).toBe(BLOCK + STORED_FRAME_OVERHEAD);
    expect(execFileSync('lz4', ['-d', '-c'], { input: first, maxBuffer: 8 << 20 }).equals(bytes.subarray(0, BLOCK))).toBe(true);
    expect((await stored(BLOCK)).length).toBeLessThan(BLOCK / 2);
    const tail = await stored(5 * BLOCK, 4321);
    expect(execFileSync('lz4', ['-d', '-c'], { input: tail }).equals(bytes.subarray(5 * BLOCK))).toBe(true);
    const out = path.join(work, 'frames.out');
    const restored = await restoreBackup({ backupUrl: r.backupUrl, output: out, concurrency: 2, lockTiming: FAST_LOCKS });
    expect(restored.sha512).toBe(src.sha512);
    expect(await sha512File(out)).toBe(src.sha512);

    // A flipped byte inside an uncompressed frame is caught by the block name, with Longhorn's message.
    const bad = path.join(store, blockPath(blockChecksum(bytes.subarray(0, BLOCK))));
    first[1000] = (first[1000] as number) ^ 0x01;
    await fs.writeFile(bad, first);
    await expect(restoreBackup({ backupUrl: r.backupUrl, output: out + '2', lockTiming: FAST_LOCKS })).rejects.toThrow(
      `decompression verification failed for block ${blockPath(blockChecksum(bytes.subarray(0, BLOCK)))}: `,
    );
    await expect(fs.stat(out + '2')).rejects.toThrow();
    // Without a recorded whole-image checksum every block is verified on the way, with the same message.
    const cfgPath = path.join(store, 'backupstore/backing-images/backing-images/frames/backing-image.cfg');
    await fs.writeFile(cfgPath, (await fs.readFile(cfgPath, 'utf8')).replace(`"Checksum":"${src.sha512}"`, '"Checksum":""'));
    await expect(restoreBackup({ backupUrl: r.backupUrl, output: out + '3', lockTiming: FAST_LOCKS })).rejects.toThrow(
      `decompression verification failed for block ${blockPath(blockChecksum(bytes.subarray(0, BLOCK)))}: `,
    );
  });

  it('hashes the source during the lock check wait, whatever part of the image that covers', async () => {
    const image = path.join(work, 'prehash.img');
    const pieces = Array.from({ length: 20 }, (_, i) => (i % 5 === 2 ? { kind: 'hole' } : i % 5 === 3 ? { kind: 'zeros' } : { kind: 'data', seed: 500 + i })) as Piece[];
    const src = await writeImage(image, pieces, 1000);
    for (const checkWaitMs of [0, 15, 400]) {
      const store = path.join(work, `prehash-${checkWaitMs}`);
      const r = await createBackup({ target: `vfs://${store}`, name: 'pre', filePath: image, concurrency: 2, lockTiming: { ...FAST_LOCKS, checkWaitMs } });
      expect(r).toMatchObject({ sha512: src.sha512, blockCount: 13, zeroBlocks: 4 });
      const out = path.join(work, `prehash-${checkWaitMs}.out`);
      expect((await restoreBackup({ backupUrl: r.backupUrl, output: out, lockTiming: FAST_LOCKS })).sha512).toBe(src.sha512);
    }
  });

  it('a restore can be cancelled, during the lock wait or while blocks flow, and leaves nothing behind', async () => {
    const store = path.join(work, 'cancel');
    const image = path.join(work, 'cancel.img');
    await writeImage(image, Array.from({ length: 24 }, () => ({ kind: 'random' }) as Piece));
    const r = await createBackup({ target: `vfs://${store}`, name: 'cancel', filePath: image, lockTiming: FAST_LOCKS });
    for (const afterMs of [5, 60]) {
      const out = path.join(work, `cancel-${afterMs}.out`);
      const ac = new AbortController();
      const restoring = restoreBackup({ backupUrl: r.backupUrl, output: out, concurrency: 1, lockTiming: { ...FAST_LOCKS, checkWaitMs: 40 }, signal: ac.signal });
      setTimeout(() => ac.abort(new Error('user stop')), afterMs);
      await expect(restoring).rejects.toMatchObject({ code: 'Aborted', message: 'operation cancelled: user stop' });
      await expect(fs.stat(out)).rejects.toThrow();
      expect((await fs.readdir(work)).filter((f) => f.includes('.restore-'))).toEqual([]);
      expect(await fs.readdir(path.join(store, 'backupstore/volumes/22/fc/BACKINGIMAGE/locks')).catch(() => [])).toEqual([]);
    }
  });

  it('a stored block larger than any valid block is refused, not read whole', async () => {
    const store = path.join(work, 'huge');
    const image = path.join(work, 'huge.img');
    await writeImage(image, [{ kind: 'data', seed: 21 }]);
    const r = await createBackup({ target: `vfs://${store}`, name: 'huge', filePath: image, lockTiming: FAST_LOCKS });
    const file = path.join(store, blockPath(blockChecksum(patternBlock(21))));
    await fs.writeFile(file, Buffer.alloc(3 * BLOCK, 1));
    await expect(restoreBackup({ backupUrl: r.backupUrl, output: path.join(work, 'huge.out'), lockTiming: FAST_LOCKS })).rejects.toMatchObject({
      code: 'Corrupt',
      message: expect.stringContaining('more than the 2162688 a stored block can have'),
    });
  });
});

describe('lock timing knob', () => {
  it('defaults to Longhorn and takes each value from the environment, rejecting bad ones by name', () => {
    expect(lockTimingFromEnv({})).toBeUndefined();
    expect(lockTimingFromEnv({ BACKUPSTORE_LOCK_CHECK_WAIT_MS: '' })).toBeUndefined();
    expect(lockTimingFromEnv({ BACKUPSTORE_LOCK_CHECK_WAIT_MS: '25' })).toEqual({ ...LONGHORN_LOCK_TIMING, checkWaitMs: 25 });
    expect(lockTimingFromEnv({ BACKUPSTORE_LOCK_DURATION_MS: '1500', BACKUPSTORE_LOCK_REFRESH_MS: '300', BACKUPSTORE_LOCK_CHECK_WAIT_MS: '0' })).toEqual({
      durationMs: 1500,
      refreshMs: 300,
      checkWaitMs: 0,
    });
    expect(() => lockTimingFromEnv({ BACKUPSTORE_LOCK_DURATION_MS: '-1' })).toThrow('invalid BACKUPSTORE_LOCK_DURATION_MS "-1"');
    expect(() => lockTimingFromEnv({ BACKUPSTORE_LOCK_DURATION_MS: '0' })).toThrow(/locks would expire at once/);
    expect(() => lockTimingFromEnv({ BACKUPSTORE_LOCK_DURATION_MS: '1000' })).toThrow(/refresh interval \(60000 ms\) must be above 0 and below the lock duration \(1000 ms\)/);
  });
});
