import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { computeFileChain, decodeChain, encodeChain, nativeSha512ChainAvailable } from '@bis/sha512-chain';
import { S3Driver } from '../drivers/s3.js';
import { parseTargetUrl, type S3TargetLocation } from '../url.js';
import { backingImageChainPath, backingImageConfigPath, backingImageDir, blockChecksum, blockPath, BACKING_IMAGES_DIR } from '../names.js';
import { createBackup } from './backup.js';
import { restoreBackup } from './restore.js';
import { deleteBackup, gcTarget, verifyTarget } from './maintenance.js';
import { BLOCK, FAST_LOCKS, FIXTURE_STORE, patternBlock, sha512File, storedBlocks, tempDir, writeImage, type Piece } from '../test-support/images.js';
import { S3_TEST_CREDENTIAL, startS3Server, type S3TestServer } from '../test-support/s3-server.js';

// Holes, repeated data, written zeros, random (stored as an uncompressed LZ4 frame, used in place on restore) and a
// short last block: every kind of segment the chain verifier sees.
const LAYOUT: Piece[] = [
  { kind: 'data', seed: 1 },
  { kind: 'hole' },
  { kind: 'random' },
  { kind: 'data', seed: 1 },
  { kind: 'zeros' },
  { kind: 'random' },
  { kind: 'hole' },
];
const TAIL = 4321;

let work: string;
let server: S3TestServer;
let credential: Record<string, string>;
beforeAll(async () => {
  work = await tempDir();
  server = await startS3Server(path.join(work, 's3'), 'chains');
  credential = { ...S3_TEST_CREDENTIAL, AWS_ENDPOINTS: server.endpoint };
});
afterAll(async () => {
  await server.stop();
  await fs.rm(work, { recursive: true, force: true });
});

let counter = 0;
async function backedUpImage(label: string): Promise<{ root: string; target: string; name: string; url: string; sha512: string; size: number }> {
  const root = path.join(work, `store-${label}`);
  await fs.mkdir(root);
  const target = `vfs://${root}`;
  const image = path.join(work, `${label}.img`);
  const src = await writeImage(image, LAYOUT, TAIL);
  const name = `img-${label}`;
  const r = await createBackup({ target, name, filePath: image, compression: 'lz4', concurrency: 2, lockTiming: FAST_LOCKS });
  expect(r.sha512).toBe(src.sha512);
  return { root, target, name, url: r.backupUrl, sha512: src.sha512, size: src.size };
}

function output(): string {
  return path.join(work, `out-${++counter}.img`);
}

it('the native chain addon is built (the restores below take the chain path only with it)', () => {
  expect(nativeSha512ChainAvailable()).toBe(true);
});

/** Restores `b` into a new output: the sequential whole-image hash must be used and give the backup's checksum. */
async function expectSequentialRestore(b: { url: string; sha512: string }): Promise<void> {
  const out = output();
  const r = await restoreBackup({ backupUrl: b.url, output: out, lockTiming: FAST_LOCKS });
  expect(r).toMatchObject({ sha512: b.sha512, verification: 'sequential' });
  expect(await sha512File(out)).toBe(b.sha512);
}

describe('the SHA-512 chain sidecar over vfs', () => {
  it('is written beside the config with the image checksum and 2 MiB segments, and a restore verifies with it', async () => {
    const b = await backedUpImage('vfs');
    const cfg = JSON.parse(await fs.readFile(path.join(b.root, backingImageConfigPath(b.name)), 'utf8')) as { Checksum: string; Size: string };
    const chain = decodeChain(await fs.readFile(path.join(b.root, backingImageChainPath(b.name))));
    expect(chain).toMatchObject({ segmentSize: BLOCK, size: b.size, checksum: cfg.Checksum });
    expect(Number(cfg.Size)).toBe(b.size);
    expect(chain.states.length).toBe(Math.ceil(b.size / BLOCK));
    expect((await fs.readdir(path.join(b.root, backingImageDir(b.name)))).sort()).toEqual(['backing-image.cfg', 'backing-image.sha512chain']);

    const out = output();
    const progress: number[] = [];
    const r = await restoreBackup({ backupUrl: b.url, output: out, concurrency: 3, lockTiming: FAST_LOCKS, onProgress: (p) => progress.push(p.processedBytes) });
    expect(r).toEqual({
      name: b.name, size: b.size, sha512: b.sha512, blockCount: 5, verification: 'sha512-chain',
      chain: expect.objectContaining({ size: b.size, checksum: b.sha512, segmentSize: 2 * 1024 * 1024 }),
    });
    expect(await sha512File(out)).toBe(b.sha512);
    expect(progress[progress.length - 1]).toBe(b.size);
  });

  it('without the sidecar (older backups) falls back to the sequential whole-image hash', async () => {
    const b = await backedUpImage('absent');
    await fs.rm(path.join(b.root, backingImageChainPath(b.name)));
    await expectSequentialRestore(b);
  });

  it('a backup without the chain (as without the native addon) writes no sidecar and removes a stale one', async () => {
    const b = await backedUpImage('nochain');
    const image = path.join(work, 'nochain.img');
    // A stale in-progress marker with a sidecar beside it, as a crashed attempt leaves them: taken over.
    const dir = path.join(b.root, backingImageDir('again'));
    await fs.mkdir(dir, { recursive: true });
    await fs.copyFile(path.join(b.root, backingImageChainPath(b.name)), path.join(dir, 'backing-image.sha512chain'));
    const cfg = await fs.readFile(path.join(b.root, backingImageConfigPath(b.name)), 'utf8');
    await fs.writeFile(path.join(dir, 'backing-image.cfg'), cfg.replace(/"CompleteTime":"[^"]*"/, '"CompleteTime":""'));
    const old = new Date(Date.now() - 60_000);
    await fs.utimes(path.join(dir, 'backing-image.cfg'), old, old);
    const r = await createBackup({ target: b.target, name: 'again', filePath: image, sha512Chain: false, lockTiming: FAST_LOCKS });
    expect(r.sha512).toBe(b.sha512);
    expect(await fs.readdir(dir)).toEqual(['backing-image.cfg']);
    const restored = await restoreBackup({ backupUrl: r.backupUrl, output: output(), lockTiming: FAST_LOCKS });
    expect(restored).toMatchObject({ sha512: b.sha512, verification: 'sequential' });
  });

  it('with a sidecar that does not decode, or belongs to another image, falls back and restores correctly', async () => {
    const b = await backedUpImage('garbage');
    const sidecar = path.join(b.root, backingImageChainPath(b.name));
    const good = await fs.readFile(sidecar);
    await fs.writeFile(sidecar, Buffer.from('not a chain at all'));
    let r = await restoreBackup({ backupUrl: b.url, output: output(), lockTiming: FAST_LOCKS });
    expect(r).toMatchObject({ sha512: b.sha512, verification: 'sequential' });
    await fs.writeFile(sidecar, good.subarray(0, good.length - 7)); // truncated
    r = await restoreBackup({ backupUrl: b.url, output: output(), lockTiming: FAST_LOCKS });
    expect(r).toMatchObject({ sha512: b.sha512, verification: 'sequential' });
    const other = decodeChain(good);
    await fs.writeFile(sidecar, encodeChain({ ...other, checksum: 'ab'.repeat(64) })); // checksum not the config's
    r = await restoreBackup({ backupUrl: b.url, output: output(), lockTiming: FAST_LOCKS });
    expect(r).toMatchObject({ sha512: b.sha512, verification: 'sequential' });
  });

  it('with a tampered state in the sidecar never reports a wrong ok: the links fail, the sequential hash decides', async () => {
    const b = await backedUpImage('tampered');
    const sidecar = path.join(b.root, backingImageChainPath(b.name));
    const chain = decodeChain(await fs.readFile(sidecar));
    for (const segment of [1, 2]) {
      // Segment 1 is a hole, segment 2 a stored block that matches its name: neither is to blame.
      const states = chain.states.map((s) => Buffer.from(s));
      (states[segment] as Buffer)[5] ^= 0x40;
      await fs.writeFile(sidecar, encodeChain({ ...chain, states }));
      await expectSequentialRestore(b);
    }
  });

  it('a corrupt stored block fails the restore naming the block, and leaves no output', async () => {
    const b = await backedUpImage('badblock');
    // Block 2 is random data, stored as an uncompressed LZ4 frame whose data a chained restore uses in place, without
    // hashing it by its name: only the chain link catches the damage.
    const cfg = JSON.parse(await fs.readFile(path.join(b.root, backingImageConfigPath(b.name)), 'utf8')) as { Blocks: { Offset: number; BlockChecksum: string }[] };
    const entry = cfg.Blocks.find((e) => e.Offset === 2 * BLOCK)!;
    const bad = blockPath(entry.BlockChecksum);
    const file = path.join(b.root, bad);
    const bytes = await fs.readFile(file);
    expect(bytes.readUInt32LE(7) >>> 31).toBe(1); // an uncompressed frame block
    bytes[1000] ^= 0x01;
    await fs.writeFile(file, bytes);
    const out = output();
    await expect(restoreBackup({ backupUrl: b.url, output: out, lockTiming: FAST_LOCKS })).rejects.toThrow(
      `decompression verification failed for block ${bad}`,
    );
    await expect(fs.stat(out)).rejects.toThrow();
    expect((await fs.readdir(work)).filter((f) => f.includes('.restore-'))).toEqual([]);

    // A compressed block (decoded without being named on the chained path) whose bytes change.
    await fs.writeFile(file, Buffer.from(bytes.map((v, i) => (i === 1000 ? v ^ 0x01 : v))));
    const packed = blockPath(cfg.Blocks[0]!.BlockChecksum);
    const packedFile = path.join(b.root, packed);
    const frame = await fs.readFile(packedFile);
    expect(frame.length).toBeLessThan(BLOCK / 2);
    frame[frame.length - 100] ^= 0x20;
    await fs.writeFile(packedFile, frame);
    await expect(restoreBackup({ backupUrl: b.url, output: out, lockTiming: FAST_LOCKS })).rejects.toThrow(
      `decompression verification failed for block ${packed}`,
    );
    await expect(fs.stat(out)).rejects.toThrow();
  });

  it('a block list pointing at another (valid) block fails with the checksum mismatch, never ok', async () => {
    const b = await backedUpImage('blocklist');
    const cfgFile = path.join(b.root, backingImageConfigPath(b.name));
    const text = await fs.readFile(cfgFile, 'utf8');
    const cfg = JSON.parse(text) as { Blocks: { Offset: number; BlockChecksum: string }[] };
    const first = cfg.Blocks[0]!.BlockChecksum;
    const random = cfg.Blocks.find((e) => e.Offset === 2 * BLOCK)!.BlockChecksum;
    // Block 2 now names block 0's (valid, stored) data: every block matches its name, the image does not.
    await fs.writeFile(cfgFile, text.replace(`"Offset":${2 * BLOCK},"BlockChecksum":"${random}"`, `"Offset":${2 * BLOCK},"BlockChecksum":"${first}"`));
    await expect(restoreBackup({ backupUrl: b.url, output: output(), lockTiming: FAST_LOCKS })).rejects.toThrow(
      new RegExp(`restored image ${b.name} has SHA-512 [0-9a-f]{128}, but the backup records ${b.sha512}`),
    );
  });
});

describe('edge sizes', () => {
  it.each([
    ['empty', 0],
    ['shorter than one SHA-512 block', 100],
    ['one block and a partial SHA-512 block', BLOCK + 129],
  ])('an image %s round trips with the chain', async (_label, size) => {
    const root = path.join(work, `store-size-${size}`);
    await fs.mkdir(root);
    const image = path.join(work, `size-${size}.img`);
    const data = Buffer.alloc(size);
    for (let i = 0; i < size; i++) data[i] = (i * 31 + 7) & 0xff;
    await fs.writeFile(image, data);
    const name = `size-${size}`;
    const r = await createBackup({ target: `vfs://${root}`, name, filePath: image, lockTiming: FAST_LOCKS });
    const chain = decodeChain(await fs.readFile(path.join(root, backingImageChainPath(name))));
    expect(chain).toMatchObject({ size, checksum: r.sha512 });
    expect(chain.states.length).toBe(Math.ceil(size / BLOCK));
    const out = output();
    const restored = await restoreBackup({ backupUrl: r.backupUrl, output: out, lockTiming: FAST_LOCKS });
    expect(restored).toMatchObject({ size, sha512: r.sha512, verification: 'sha512-chain' });
    expect((await fs.readFile(out)).equals(data)).toBe(true);
  });
});

describe('removing and collecting', () => {
  it('rm removes the sidecar with the config; gc neither trips over sidecars nor keeps or drops blocks because of them', async () => {
    const root = path.join(work, 'store-gc');
    await fs.mkdir(root);
    const target = `vfs://${root}`;
    const imgA = path.join(work, 'gc-a.img');
    const imgB = path.join(work, 'gc-b.img');
    await writeImage(imgA, [{ kind: 'data', seed: 7 }, { kind: 'data', seed: 8 }]);
    await writeImage(imgB, [{ kind: 'data', seed: 7 }, { kind: 'data', seed: 9 }]);
    const a = await createBackup({ target, name: 'gc-a', filePath: imgA, lockTiming: FAST_LOCKS });
    const b = await createBackup({ target, name: 'gc-b', filePath: imgB, lockTiming: FAST_LOCKS });
    const s = (seed: number) => blockChecksum(patternBlock(seed));
    expect(await storedBlocks(root)).toEqual([s(7), s(8), s(9)].sort());

    const gc = await gcTarget(target, { lockTiming: FAST_LOCKS });
    expect(gc).toMatchObject({ swept: true, removedBlocks: [], referencedBlocks: 3 });

    const del = await deleteBackup(a.backupUrl, { lockTiming: FAST_LOCKS });
    expect(del).toMatchObject({ configRemoved: true, gc: { swept: true, removedBlocks: [s(8)] } });
    await expect(fs.stat(path.join(root, backingImageDir('gc-a')))).rejects.toThrow(); // config, sidecar and directory
    expect(await storedBlocks(root)).toEqual([s(7), s(9)].sort());

    // A directory left with only a sidecar (a crash between the failed backup's two removals) is not a backup:
    // gc neither stops at it nor keeps blocks for it, and removes it.
    await fs.mkdir(path.join(root, backingImageDir('gc-orphan')), { recursive: true });
    await fs.copyFile(path.join(root, backingImageChainPath('gc-b')), path.join(root, backingImageChainPath('gc-orphan')));
    const gc2 = await gcTarget(target, { lockTiming: FAST_LOCKS });
    expect(gc2).toMatchObject({ swept: true, removedBlocks: [], referencedBlocks: 2 });
    expect(await fs.readdir(path.join(root, BACKING_IMAGES_DIR))).toEqual(['gc-b']);
    expect((await verifyTarget(target, { lockTiming: FAST_LOCKS })).ok).toBe(true);

    const out = output();
    const r = await restoreBackup({ backupUrl: b.backupUrl, output: out, lockTiming: FAST_LOCKS });
    expect(r.verification).toBe('sha512-chain');
    // the chain every segment was verified against is returned with the file, and it is the restored file's chain
    expect(r.chain).toMatchObject({ size: r.size, checksum: r.sha512 });
    const recomputed = await computeFileChain(out, { segmentSize: r.chain!.segmentSize });
    expect(recomputed.states.map((x) => x.toString('hex'))).toEqual(r.chain!.states.map((x) => Buffer.from(x).toString('hex')));
    await deleteBackup(b.backupUrl, { lockTiming: FAST_LOCKS });
    expect(await storedBlocks(root)).toEqual([]);
  });
});

describe('the SHA-512 chain sidecar over S3', () => {
  it('round trips with the sidecar on a real S3 server, falls back without it, and rm removes it', async () => {
    const target = 's3://chains@us-east-1/store/';
    const image = path.join(work, 's3.img');
    const src = await writeImage(image, LAYOUT, TAIL);
    const name = 's3-chain';
    const r = await createBackup({ target, name, filePath: image, compression: 'lz4', concurrency: 2, credential, lockTiming: FAST_LOCKS });
    const loc = parseTargetUrl(target) as S3TargetLocation;
    const driver = new S3Driver(loc, credential);
    try {
      const chain = decodeChain(await driver.read(backingImageChainPath(name)));
      expect(chain).toMatchObject({ segmentSize: BLOCK, size: src.size, checksum: src.sha512 });
      expect((await driver.list(backingImageDir(name))).sort()).toEqual(['backing-image.cfg', 'backing-image.sha512chain']);

      const out = output();
      const restored = await restoreBackup({ backupUrl: r.backupUrl, output: out, concurrency: 3, credential, lockTiming: FAST_LOCKS });
      expect(restored).toMatchObject({ sha512: src.sha512, verification: 'sha512-chain' });
      expect(await sha512File(out)).toBe(src.sha512);

      await driver.remove(backingImageChainPath(name));
      const fallback = await restoreBackup({ backupUrl: r.backupUrl, output: output(), credential, lockTiming: FAST_LOCKS });
      expect(fallback).toMatchObject({ sha512: src.sha512, verification: 'sequential' });

      await driver.write(backingImageChainPath(name), encodeChain(chain));
      await deleteBackup(r.backupUrl, { credential, lockTiming: FAST_LOCKS });
      expect(await driver.list(backingImageDir(name))).toEqual([]);
      expect(await driver.exists(backingImageChainPath(name))).toBe(false);
    } finally {
      await driver.close();
    }
  });
});

describe('the Longhorn fixture (no sidecar)', () => {
  it('still restores to its checksum with the sequential hash', async () => {
    const r = await restoreBackup({ backupUrl: `vfs://${FIXTURE_STORE}?backingImage=fixture-lz4`, output: output(), lockTiming: FAST_LOCKS });
    expect(r).toMatchObject({ size: 9437307, verification: 'sequential' });
    expect(r.sha512).toMatch(/^290be67edd2c1bf6/);
  });
});
