import { describe, it, expect } from '@jest/globals';
import { advance, advanceSync, advanceZeros, finalizeHex, nativeSha512ChainAvailable, SHA512_INITIAL_STATE } from './state.js';
import { MiB, randomData, referenceSha512 } from './test-support/reference.js';

/** SHA-512 of `data` through the chain primitives: whole blocks with `step`, then finalize with the tail. */
async function viaChain(data: Buffer, step: (s: Buffer, d: Uint8Array) => Buffer | Promise<Buffer>): Promise<string> {
  const whole = data.length - (data.length % 128);
  const state = await step(SHA512_INITIAL_STATE, data.subarray(0, whole));
  return finalizeHex(state, data.length, data.subarray(whole));
}

const SIZES = [0, 1, 127, 128, 129, 255, 256, 1000, 4096 + 17, 2 * MiB - 1, 2 * MiB, 2 * MiB + 1];

describe('chain primitives against node:crypto', () => {
  it('the addon is built (CI builds it with BIS_REQUIRE_NATIVE=1)', () => {
    expect(nativeSha512ChainAvailable()).toBe(true);
  });

  it('SHA512_INITIAL_STATE finalizes to the SHA-512 of the empty string', () => {
    expect(finalizeHex(SHA512_INITIAL_STATE, 0)).toBe(referenceSha512());
    expect(finalizeHex(SHA512_INITIAL_STATE, 0, new Uint8Array(0))).toBe(referenceSha512());
  });

  it('known answers: FIPS 180-4 "abc", and Longhorn\'s block checksum of 2 MiB of zeros', async () => {
    const abc = Buffer.from('abc');
    expect(finalizeHex(SHA512_INITIAL_STATE, 3, abc)).toBe(
      'ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a' +
        '2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f',
    );
    // longhorn-backupstore-format.md §4.2: the first 64 hex characters of SHA-512 over 2 MiB of zeros.
    const zeros = await advanceZeros(SHA512_INITIAL_STATE, 2 * MiB);
    expect(finalizeHex(zeros, 2 * MiB).slice(0, 64)).toBe('731859029215873fdac1c9f2f8bd25a334abf0f3a9e1b057cf2cacc2826d86b0');
  });

  it.each(SIZES)('advanceSync + finalizeHex == createHash for %i bytes', async (size) => {
    const data = randomData(size);
    expect(await viaChain(data, advanceSync)).toBe(referenceSha512(data));
  });

  it.each(SIZES)('advance (thread pool) + finalizeHex == createHash for %i bytes', async (size) => {
    const data = randomData(size);
    expect(await viaChain(data, advance)).toBe(referenceSha512(data));
  });

  it('chaining in several pieces equals one pass (state carries everything but the length)', async () => {
    const data = randomData(3 * MiB + 5 * 128 + 77);
    let state = SHA512_INITIAL_STATE;
    const cuts = [0, 128, 640, MiB, MiB + 128 * 9, 3 * MiB + 5 * 128];
    for (let i = 1; i < cuts.length; i++) {
      state = i % 2 ? await advance(state, data.subarray(cuts[i - 1], cuts[i])) : advanceSync(state, data.subarray(cuts[i - 1], cuts[i]));
    }
    expect(finalizeHex(state, data.length, data.subarray(3 * MiB + 5 * 128))).toBe(referenceSha512(data));
  });

  it.each([0, 128, 128 * 3, 64 * 1024 + 128, 2 * MiB, 5 * MiB + 384])(
    'advanceZeros(%i) equals hashing that many zero bytes',
    async (length) => {
      const state = await advanceZeros(SHA512_INITIAL_STATE, length);
      expect(finalizeHex(state, length)).toBe(referenceSha512(Buffer.alloc(length)));
      expect(state.equals(advanceSync(SHA512_INITIAL_STATE, Buffer.alloc(length)))).toBe(true);
    },
  );

  it('zeros and data mix: data, hole, data, tail', async () => {
    const a = randomData(128 * 7);
    const b = randomData(MiB + 128);
    const tail = randomData(100);
    let s = advanceSync(SHA512_INITIAL_STATE, a);
    s = await advanceZeros(s, 2 * MiB);
    s = await advance(s, b);
    const total = a.length + 2 * MiB + b.length + tail.length;
    expect(finalizeHex(s, total, tail)).toBe(referenceSha512(a, Buffer.alloc(2 * MiB), b, tail));
  });

  it('hashes views into a SharedArrayBuffer (the image sink hashes from shared slabs)', async () => {
    const view = new Uint8Array(new SharedArrayBuffer(8192), 256, 4096 + 100);
    view.set(randomData(view.length));
    expect(await viaChain(Buffer.from(view.buffer, view.byteOffset, view.length), advance)).toBe(referenceSha512(view));
    expect(finalizeHex(await advance(SHA512_INITIAL_STATE, view.subarray(0, 4096)), view.length, view.subarray(4096))).toBe(
      referenceSha512(view),
    );
  });

  it('does not change the input state', async () => {
    const before = Buffer.from(SHA512_INITIAL_STATE);
    await advance(SHA512_INITIAL_STATE, randomData(256));
    advanceSync(SHA512_INITIAL_STATE, randomData(256));
    expect(SHA512_INITIAL_STATE.equals(before)).toBe(true);
  });

  it('rejects lengths that are not whole blocks and malformed states with clear errors', async () => {
    expect(() => advanceSync(SHA512_INITIAL_STATE, new Uint8Array(129))).toThrow(/multiple of 128/);
    await expect(advance(SHA512_INITIAL_STATE, new Uint8Array(100))).rejects.toThrow(/multiple of 128/);
    await expect(advanceZeros(SHA512_INITIAL_STATE, 200)).rejects.toThrow(/multiple of 128/);
    await expect(advanceZeros(SHA512_INITIAL_STATE, -128)).rejects.toThrow(/non-negative/);
    expect(() => advanceSync(Buffer.alloc(63), new Uint8Array(128))).toThrow(/exactly 64 bytes/);
    await expect(advance(Buffer.alloc(65), new Uint8Array(128))).rejects.toThrow(/exactly 64 bytes/);
    expect(() => finalizeHex(SHA512_INITIAL_STATE, 130, new Uint8Array(1))).toThrow(/totalLength % 128 = 2/);
    expect(() => finalizeHex(SHA512_INITIAL_STATE, 1.5)).toThrow(/safe integer/);
    expect(() => advanceSync('nope' as unknown as Buffer, new Uint8Array(128))).toThrow(TypeError);
  });
});
