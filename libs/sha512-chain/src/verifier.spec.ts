import { describe, it, expect } from '@jest/globals';
import { Sha512ChainMismatchError } from './errors.js';
import { Sha512ChainRecorder } from './recorder.js';
import { Sha512ChainVerifier } from './verifier.js';
import { type Sha512Chain } from './chain.js';
import { flipped, randomData, referenceSha512 } from './test-support/reference.js';
import { describeImpls } from './test-support/impls.js';

const SEG = 4096;

/** An image of random data with whole-segment holes at `holeSegments`, and its recorded chain. */
async function image(size: number, holeSegments: number[], segmentSize = SEG): Promise<{ bytes: Buffer; chain: Sha512Chain }> {
  const bytes = randomData(size);
  for (const k of holeSegments) bytes.fill(0, k * segmentSize, Math.min((k + 1) * segmentSize, size));
  const rec = new Sha512ChainRecorder(segmentSize);
  await rec.update(bytes);
  return { bytes, chain: rec.finish() };
}

function segmentBytes(v: Sha512ChainVerifier, bytes: Buffer, k: number): Buffer {
  const { offset, length } = v.segmentRange(k);
  return bytes.subarray(offset, offset + length);
}

function shuffled(n: number): number[] {
  const a = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a;
}

describeImpls('Sha512ChainVerifier', (impl) => {
  it.each([SEG * 7 + 1000, SEG * 8, SEG * 2 + 50, 100])(
    'all segments in random order, in parallel, holes as null: complete with the SHA-512 (%i bytes)',
    async (size) => {
      const holes = size > SEG * 3 ? [1, 4] : [];
      const { bytes, chain } = await image(size, holes);
      const v = new Sha512ChainVerifier(chain, { concurrency: 3, impl });
      expect(v.pending()).toEqual(Array.from({ length: chain.states.length }, (_, i) => i));
      await Promise.all(
        shuffled(chain.states.length).map((k) => v.verifySegment(k, holes.includes(k) ? null : segmentBytes(v, bytes, k))),
      );
      expect(v.complete()).toBe(true);
      expect(v.pending()).toEqual([]);
      expect(v.checksum()).toBe(referenceSha512(bytes));
    },
  );

  it('segmentRange and segmentAt', async () => {
    const { chain } = await image(SEG * 2 + 10, []);
    const v = new Sha512ChainVerifier(chain, { impl });
    expect(v.segmentRange(0)).toEqual({ offset: 0, length: SEG });
    expect(v.segmentRange(2)).toEqual({ offset: 2 * SEG, length: 10 });
    expect(v.segmentAt(0)).toBe(0);
    expect(v.segmentAt(SEG - 1)).toBe(0);
    expect(v.segmentAt(SEG)).toBe(1);
    expect(v.segmentAt(2 * SEG + 9)).toBe(2);
    expect(() => v.segmentRange(3)).toThrow(/out of range/);
    expect(() => v.segmentAt(2 * SEG + 10)).toThrow(/outside the image/);
  });

  it('a flipped byte fails with Sha512ChainMismatchError naming the segment', async () => {
    const { bytes, chain } = await image(SEG * 5 + 300, []);
    const v = new Sha512ChainVerifier(chain, { impl });
    for (const at of [SEG * 3 + 17, 5, SEG * 5 + 299, SEG * 5 + 100]) {
      const bad = flipped(bytes, at);
      const k = v.segmentAt(at);
      const err = await v.verifySegment(k, segmentBytes(v, bad, k)).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(Sha512ChainMismatchError);
      const m = err as Sha512ChainMismatchError;
      expect(m.segment).toBe(k);
      expect(m.offset).toBe(k * SEG);
      expect(m.length).toBe(v.segmentRange(k).length);
      expect(m.message).toContain(`segment ${k}`);
      expect(v.pending()).toContain(k);
    }
    expect(v.complete()).toBe(false);
  });

  it('a byte in the last partial block (not covered by any state) is caught by the recorded checksum', async () => {
    const { bytes, chain } = await image(SEG * 2 + 130, []);
    const v = new Sha512ChainVerifier(chain, { impl });
    await expect(v.verifySegment(2, segmentBytes(v, flipped(bytes, SEG * 2 + 129), 2))).rejects.toThrow(/recorded checksum/);
  });

  it('a hole claimed where there is data fails', async () => {
    const { chain } = await image(SEG * 3, []);
    const v = new Sha512ChainVerifier(chain, { impl });
    await expect(v.verifySegment(1, null)).rejects.toBeInstanceOf(Sha512ChainMismatchError);
  });

  it('a wrong recorded state fails the links on both sides of it, not the others', async () => {
    const { bytes, chain } = await image(SEG * 4, []);
    const states = chain.states.map((s) => Buffer.from(s));
    states[1]![10]! ^= 1;
    const v = new Sha512ChainVerifier({ ...chain, states }, { impl });
    const results = await Promise.allSettled([0, 1, 2, 3].map((k) => v.verifySegment(k, segmentBytes(v, bytes, k))));
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'rejected', 'fulfilled']);
    expect(v.pending()).toEqual([1, 2]);
    expect(() => v.checksum()).toThrow(/2 of 4 segments pending/);
  });

  it('a wrong recorded checksum fails the last segment', async () => {
    const { bytes, chain } = await image(SEG * 2, []);
    const v = new Sha512ChainVerifier({ ...chain, checksum: referenceSha512(Buffer.from('other')) }, { impl });
    await v.verifySegment(0, segmentBytes(v, bytes, 0));
    await expect(v.verifySegment(1, segmentBytes(v, bytes, 1))).rejects.toThrow(Sha512ChainMismatchError);
  });

  it('verifying the same segment twice is harmless; a later failure makes it pending again', async () => {
    const { bytes, chain } = await image(SEG * 2, []);
    const v = new Sha512ChainVerifier(chain, { impl });
    await v.verifySegment(0, segmentBytes(v, bytes, 0));
    await v.verifySegment(0, segmentBytes(v, bytes, 0));
    expect(v.pending()).toEqual([1]);
    await v.verifySegment(1, segmentBytes(v, bytes, 1));
    await v.verifySegment(1, segmentBytes(v, bytes, 1));
    expect(v.checksum()).toBe(referenceSha512(bytes));
    await expect(v.verifySegment(0, segmentBytes(v, flipped(bytes, 3), 0))).rejects.toThrow(Sha512ChainMismatchError);
    expect(v.complete()).toBe(false);
    expect(() => v.checksum()).toThrow(/not verified/);
  });

  it('checksum() before complete throws', async () => {
    const { chain } = await image(SEG * 2, []);
    expect(() => new Sha512ChainVerifier(chain, { impl }).checksum()).toThrow(/2 of 2 segments pending \(first: 0\)/);
  });

  it('an empty image is complete at once with the SHA-512 of nothing', async () => {
    const { chain } = await image(0, []);
    const v = new Sha512ChainVerifier(chain, { impl });
    expect(v.complete()).toBe(true);
    expect(v.checksum()).toBe(referenceSha512());
  });

  it('rejects a segment of the wrong length, bad options and malformed chains', async () => {
    const { chain } = await image(SEG * 2, []);
    const v = new Sha512ChainVerifier(chain, { impl });
    await expect(v.verifySegment(0, new Uint8Array(SEG - 1))).rejects.toThrow(/segment 0 is 4096 bytes .* got 4095/);
    expect(() => new Sha512ChainVerifier(chain, { concurrency: 0, impl })).toThrow(/concurrency/);
    expect(() => new Sha512ChainVerifier({ ...chain, states: [] }, { impl })).toThrow(/needs 2/);
    expect(() => new Sha512ChainVerifier({ ...chain, segmentSize: 100 }, { impl })).toThrow(/multiple of 128/);
  });

  it('bounds the hashing jobs by concurrency', async () => {
    const { bytes, chain } = await image(SEG * 16, []);
    const v = new Sha512ChainVerifier(chain, { concurrency: 1, impl });
    await Promise.all(shuffled(16).map((k) => v.verifySegment(k, segmentBytes(v, bytes, k))));
    expect(v.checksum()).toBe(referenceSha512(bytes));
  });
});
