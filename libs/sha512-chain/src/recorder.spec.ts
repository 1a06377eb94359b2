import { describe, it, expect } from '@jest/globals';
import { advanceSync, finalizeHex, SHA512_INITIAL_STATE, DEFAULT_CHAIN_SEGMENT } from './state.js';
import { Sha512ChainRecorder } from './recorder.js';
import { chunksOf, MiB, randomData, referenceSha512 } from './test-support/reference.js';

/** The states a chain must record, computed independently by hashing each prefix's whole blocks from the IV. */
function expectedStates(data: Buffer, segmentSize: number): Buffer[] {
  const out: Buffer[] = [];
  for (let end = segmentSize; end - segmentSize < data.length; end += segmentSize) {
    const limit = Math.min(end, data.length);
    out.push(advanceSync(SHA512_INITIAL_STATE, data.subarray(0, limit - (limit % 128))));
  }
  return out;
}

describe('Sha512ChainRecorder', () => {
  it('defaults to 2 MiB segments', () => {
    expect(new Sha512ChainRecorder().segmentSize).toBe(DEFAULT_CHAIN_SEGMENT);
    expect(DEFAULT_CHAIN_SEGMENT).toBe(2 * MiB);
  });

  it.each([0, 1, 127, 128, 129, 4096, 4096 + 1, 4096 * 3 + 200, 4096 * 5])(
    'updateSync in odd chunks: %i bytes, 4 KiB segments',
    (size) => {
      const data = randomData(size);
      const rec = new Sha512ChainRecorder(4096);
      for (const c of chunksOf(data, [1, 127, 300, 5000, 128, 4096])) rec.updateSync(c);
      const chain = rec.finish();
      expect(chain.checksum).toBe(referenceSha512(data));
      expect(chain.size).toBe(size);
      expect(chain.segmentSize).toBe(4096);
      expect(chain.states.length).toBe(Math.ceil(size / 4096));
      expect(chain.states.map((s) => s.toString('hex'))).toEqual(expectedStates(data, 4096).map((s) => s.toString('hex')));
    },
  );

  it('async update and updateZeros, unawaited, keep call order (2 MiB ± 1 pieces, holes)', async () => {
    const a = randomData(2 * MiB - 1);
    const b = randomData(2 * MiB + 1);
    const c = randomData(333);
    const rec = new Sha512ChainRecorder();
    const done = [rec.update(a), rec.updateZeros(3 * MiB + 7), rec.update(b), rec.updateZeros(1), rec.update(c)];
    await Promise.all(done);
    const chain = rec.finish();
    const whole = Buffer.concat([a, Buffer.alloc(3 * MiB + 7), b, Buffer.alloc(1), c]);
    expect(chain.checksum).toBe(referenceSha512(whole));
    expect(chain.states.map((s) => s.toString('hex'))).toEqual(expectedStates(whole, 2 * MiB).map((s) => s.toString('hex')));
    const last = chain.states[chain.states.length - 1]!;
    expect(finalizeHex(last, whole.length, whole.subarray(whole.length - (whole.length % 128)))).toBe(chain.checksum);
  });

  it('checksumSoFar gives the SHA-512 of what was fed so far, and the image goes on', () => {
    const a = randomData(5000);
    const b = randomData(300);
    const rec = new Sha512ChainRecorder(4096);
    expect(rec.checksumSoFar()).toBe(referenceSha512(Buffer.alloc(0)));
    rec.updateSync(a);
    expect(rec.checksumSoFar()).toBe(referenceSha512(a));
    rec.updateSync(b);
    const chain = rec.finish();
    expect(chain.checksum).toBe(referenceSha512(Buffer.concat([a, b])));
    expect(chain.states.map((s) => s.toString('hex'))).toEqual(expectedStates(Buffer.concat([a, b]), 4096).map((s) => s.toString('hex')));
  });

  it('an image that ends exactly on a segment boundary has one state per segment', async () => {
    const data = randomData(3 * 4096);
    const rec = new Sha512ChainRecorder(4096);
    await rec.update(data);
    const chain = rec.finish();
    expect(chain.states.length).toBe(3);
    expect(chain.checksum).toBe(referenceSha512(data));
  });

  it('rejects bad segment sizes, finish twice, and use after finish', async () => {
    expect(() => new Sha512ChainRecorder(1000)).toThrow(/multiple of 128/);
    expect(() => new Sha512ChainRecorder(0)).toThrow(/positive multiple of 128/);
    const rec = new Sha512ChainRecorder(128);
    rec.updateSync(randomData(10));
    rec.finish();
    expect(() => rec.finish()).toThrow(/finished/);
    await expect(rec.update(randomData(1))).rejects.toThrow(/finished/);
    await expect(new Sha512ChainRecorder().updateZeros(-1)).rejects.toThrow(/non-negative/);
  });

  it('refuses finish and updateSync while async updates are running', async () => {
    const rec = new Sha512ChainRecorder();
    const p = rec.update(randomData(MiB));
    expect(() => rec.finish()).toThrow(/still running/);
    expect(() => rec.updateSync(randomData(1))).toThrow(/still running/);
    await p;
    expect(rec.finish().size).toBe(MiB);
  });
});
