import { describe, it, expect, beforeAll } from '@jest/globals';

// This file gets its own module registry: the addon is disabled before the library is first loaded.
describe('without the native addon', () => {
  let lib: typeof import('./state.js') &
    typeof import('./errors.js') &
    typeof import('./recorder.js') &
    typeof import('./verifier.js') &
    typeof import('./chain.js') &
    typeof import('./native.js');
  beforeAll(async () => {
    process.env.BIS_SHA512_CHAIN_NATIVE = '0';
    lib = {
      ...(await import('./state.js')),
      ...(await import('./errors.js')),
      ...(await import('./recorder.js')),
      ...(await import('./verifier.js')),
      ...(await import('./chain.js')),
      ...(await import('./native.js')),
    };
  });

  it('reports it and every hashing function throws Sha512ChainUnavailableError', async () => {
    expect(lib.nativeSha512ChainAvailable()).toBe(false);
    expect(lib.nativeAddonStatus()).toMatch(/disabled by BIS_SHA512_CHAIN_NATIVE=0/);
    const s = lib.SHA512_INITIAL_STATE;
    expect(() => lib.advanceSync(s, new Uint8Array(128))).toThrow(lib.Sha512ChainUnavailableError);
    await expect(lib.advance(s, new Uint8Array(128))).rejects.toThrow(lib.Sha512ChainUnavailableError);
    await expect(lib.advanceZeros(s, 128)).rejects.toThrow(lib.Sha512ChainUnavailableError);
    expect(() => lib.finalizeHex(s, 0)).toThrow(lib.Sha512ChainUnavailableError);
    expect(() => new lib.Sha512ChainRecorder()).toThrow(lib.Sha512ChainUnavailableError);
    const chain = { segmentSize: 128, size: 0, checksum: '0'.repeat(128), states: [] };
    expect(() => new lib.Sha512ChainVerifier(chain)).toThrow(lib.Sha512ChainUnavailableError);
    // The encoding needs no hashing and keeps working.
    expect(lib.decodeChain(lib.encodeChain(chain))).toEqual(chain);
  });
});
