import { describe, it, expect } from '@jest/globals';
import { isAllZero } from './zero.js';

describe('isAllZero', () => {
  it('is true for empty and all-zero buffers of any length', () => {
    expect(isAllZero(new Uint8Array(0))).toBe(true);
    for (const n of [1, 7, 8, 4096, 65536, 65537, 1024 * 1024 + 3]) expect(isAllZero(Buffer.alloc(n))).toBe(true);
  });

  it('finds a single non-zero byte anywhere', () => {
    const n = 3 * 65536 + 100;
    for (const at of [0, 1, 4095, 65535, 65536, 100_000, n - 2, n - 1]) {
      const buf = Buffer.alloc(n);
      buf[at] = 0x80;
      expect(isAllZero(buf)).toBe(false);
    }
  });

  it('honours the view of a Uint8Array over a larger buffer', () => {
    const backing = new Uint8Array(10_000);
    backing[0] = 1;
    backing[9999] = 1;
    expect(isAllZero(backing.subarray(1, 9999))).toBe(true);
    expect(isAllZero(backing.subarray(0, 5000))).toBe(false);
    expect(isAllZero(backing.subarray(5000))).toBe(false);
  });
});
