import { describe, it, expect, afterAll } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { availableParallelism } from 'node:os';
import { decodeChain, nativeSha512ChainAvailable } from '@bis/sha512-chain';
import type { ChecksumAlgorithm } from './checksum.js';
import { HashWorker, hashWorkerThreads, stopHashWorkerThreads } from './hash-worker.js';

afterAll(() => stopHashWorkerThreads());

/** `bytes` in a SharedArrayBuffer, as the sinks hand them to the hash worker. */
function shared(bytes: Buffer): SharedArrayBuffer {
  const sab = new SharedArrayBuffer(bytes.length);
  new Uint8Array(sab).set(bytes);
  return sab;
}

const hex = (algorithm: string, ...parts: Buffer[]): string => {
  const h = createHash(algorithm);
  for (const p of parts) h.update(p);
  return h.digest('hex');
};

describe('HashWorker sessions on the shared hashing threads', () => {
  it('keeps the digests of concurrent sessions apart, whichever thread they share', async () => {
    const images = Array.from({ length: 12 }, (_, i) => randomBytes(100_000 + i * 4099));
    const workers = images.map((_, i) => new HashWorker(i % 2 ? ['sha512', 'md5'] : ['sha512']));
    expect(hashWorkerThreads()).toBeLessThanOrEqual(Math.min(availableParallelism(), 8));
    // Interleave the sessions' updates: 7 uneven pieces each, sent round-robin without waiting.
    const pending: Promise<void>[] = [];
    for (let piece = 0; piece < 7; piece++) {
      images.forEach((img, i) => {
        const from = Math.floor((img.length * piece) / 7);
        const to = Math.floor((img.length * (piece + 1)) / 7);
        pending.push(workers[i]!.update(shared(img.subarray(from, to)), 0, to - from));
      });
    }
    await Promise.all(pending);
    const digests = await Promise.all(workers.map((w) => w.digest()));
    images.forEach((img, i) => {
      expect(digests[i]).toEqual(i % 2 ? [hex('sha512', img), hex('md5', img)] : [hex('sha512', img)]);
    });
    await Promise.all(workers.map((w) => w.close()));
  });

  it('serves one session after another on the same thread instead of starting a thread for each', async () => {
    await stopHashWorkerThreads();
    expect(hashWorkerThreads()).toBe(0);
    for (let i = 0; i < 20; i++) {
      const bytes = randomBytes(65536);
      const w = new HashWorker(['sha512']);
      await w.update(shared(bytes), 0, bytes.length);
      expect(await w.digest()).toEqual([hex('sha512', bytes)]);
      await w.close();
      expect(hashWorkerThreads()).toBe(1);
    }
  });

  it('peeks without ending, starts again after digest and after reset', async () => {
    const a = randomBytes(5000);
    const b = randomBytes(7000);
    const w = new HashWorker(['sha256', 'sha1']);
    await w.update(shared(a), 0, a.length);
    expect(await w.peek()).toEqual([hex('sha256', a), hex('sha1', a)]);
    await w.update(shared(b), 0, b.length);
    expect(await w.digest()).toEqual([hex('sha256', a, b), hex('sha1', a, b)]);
    await w.update(shared(b), 0, b.length);
    expect(await w.digest()).toEqual([hex('sha256', b), hex('sha1', b)]);
    await w.update(shared(a), 0, a.length);
    await w.reset();
    await w.update(shared(b), 0, b.length);
    expect(await w.digest()).toEqual([hex('sha256', b), hex('sha1', b)]);
    await w.close();
  });

  const withAddon = nativeSha512ChainAvailable() ? it : it.skip;
  withAddon('returns the SHA-512 chain with the checksum when asked to record it (needs the native addon)', async () => {
    const bytes = randomBytes(3 * 4096 + 100);
    const w = new HashWorker(['sha512'], { chainSegment: 4096 });
    expect(w.recordsChain).toBe(true);
    await w.update(shared(bytes), 0, bytes.length);
    const { digests, chain } = await w.digestWithChain();
    expect(digests).toEqual([hex('sha512', bytes)]);
    const decoded = decodeChain(chain!);
    expect(decoded.checksum).toBe(hex('sha512', bytes));
    expect(decoded.size).toBe(bytes.length);
    await w.close();
  });

  it('fails a session that cannot start with its reason, and its thread goes on serving the others', async () => {
    const good = new HashWorker(['sha512']);
    const bad = new HashWorker(['no-such-digest' as ChecksumAlgorithm]);
    const bytes = randomBytes(1000);
    await expect(bad.update(shared(bytes), 0, bytes.length)).rejects.toThrow(/hashing failed: .*[Dd]igest/);
    await expect(bad.digest()).rejects.toThrow(/hashing failed: .*[Dd]igest/);
    await good.update(shared(bytes), 0, bytes.length);
    expect(await good.digest()).toEqual([hex('sha512', bytes)]);
    await Promise.all([good.close(), bad.close()]);
  });

  it('completes what was sent before close, and refuses what comes after', async () => {
    const bytes = randomBytes(2 << 20);
    const w = new HashWorker(['sha512']);
    const update = w.update(shared(bytes), 0, bytes.length);
    const digest = w.digest();
    await w.close();
    await update;
    expect(await digest).toEqual([hex('sha512', bytes)]);
    await expect(w.update(shared(bytes), 0, 10)).rejects.toThrow('the hash worker is closed');
  });

  it('fails the sessions of a stopped thread, and the next session starts a new one', async () => {
    const bytes = randomBytes(1000);
    const w = new HashWorker(['sha512']);
    await w.update(shared(bytes), 0, bytes.length);
    await stopHashWorkerThreads();
    expect(hashWorkerThreads()).toBe(0);
    await expect(w.digest()).rejects.toThrow('the hash worker was stopped');
    await w.close();
    const next = new HashWorker(['sha512']);
    await next.update(shared(bytes), 0, bytes.length);
    expect(await next.digest()).toEqual([hex('sha512', bytes)]);
    expect(hashWorkerThreads()).toBe(1);
    await next.close();
  });
});
