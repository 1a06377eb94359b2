import { describe, it, expect } from '@jest/globals';
import { formatGoTime } from './go-time.js';
import { decodeSyncingFileConfig, encodeSyncingFileConfig } from './backing-cfg.js';
import { PortAllocator, parsePortRange } from './port-allocator.js';
import { IntervalSet, subtractRanges } from './ssync/interval-set.js';
import { backingFilePath, backingImageNameFromPath, dataSourceFilePath } from './layout.js';
import { decodeFileId, encodeFileId } from './sync-api.js';
import { defaultRequestTimeoutMs } from './ssync/sender.js';

describe('Go time.Time.String() formatting', () => {
  it('formats nanoseconds with trailing zeros removed, and no fraction when zero', () => {
    const base = BigInt(Date.UTC(2026, 10, 22, 8, 55, 15)) * 1_000_000n;
    expect(formatGoTime(base + 81_534_682n)).toBe('2026-11-22 08:55:15.081534682 +0000 UTC');
    expect(formatGoTime(base + 500_000_000n)).toBe('2026-11-22 08:55:15.5 +0000 UTC');
    expect(formatGoTime(base)).toBe('2026-11-22 08:55:15 +0000 UTC');
    expect(formatGoTime(base + 1_000n)).toBe('2026-11-22 08:55:15.000001 +0000 UTC');
  });
});

describe('backing.cfg', () => {
  it("writes Longhorn's keys in Longhorn's order and reads a v1.3.x file without virtualSize/realSize", () => {
    const text = encodeSyncingFileConfig({
      modificationTime: 't',
      currentChecksum: 'c',
      expectedChecksum: '',
      realSize: 3,
      virtualSize: 2,
      size: 1,
      uuid: 'u',
      name: '/data/backing-images/i-u/backing',
    });
    expect(text).toBe(
      '{"name":"/data/backing-images/i-u/backing","uuid":"u","size":1,"virtualSize":2,"realSize":3,"expectedChecksum":"","currentChecksum":"c","modificationTime":"t"}',
    );
    const old = decodeSyncingFileConfig(
      '{"name":"/data/backing-images/img1-u1234/backing","uuid":"u1234","size":8388608,"expectedChecksum":"","currentChecksum":"3bc4","modificationTime":"2026-11-22 08:55:15.081534682 +0000 UTC"}',
    );
    expect(old).toMatchObject({ size: 8388608, virtualSize: 0, realSize: 0, currentChecksum: '3bc4' });
    expect(() => decodeSyncingFileConfig('{"size":"big"}')).toThrow('size must be an integer');
    expect(() => decodeSyncingFileConfig('nope')).toThrow('invalid config');
  });
});

describe('PortAllocator', () => {
  it('allocates round-robin, releases exactly one port, and reports exhaustion', () => {
    const p = new PortAllocator(parsePortRange('30001-30003'));
    expect([p.allocate(), p.allocate()]).toEqual([30001, 30002]);
    p.release(30001);
    expect(p.allocate()).toBe(30003);
    expect(p.allocate()).toBe(30001);
    expect(() => p.allocate()).toThrow('cannot find an empty port range');
    p.release(30003);
    expect(p.isAllocated(30002)).toBe(true);
    expect(p.inUse).toBe(2);
    expect(() => p.release(30003)).toThrow('not allocated');
    expect(p.allocate()).toBe(30003);
    expect(() => parsePortRange('31000-30001')).toThrow('invalid port range');
    expect(() => parsePortRange('x')).toThrow('invalid port range');
  });

  it('never leaks the top port of the range (Longhorn released port+1)', () => {
    const p = new PortAllocator({ min: 10, max: 11 });
    for (let i = 0; i < 10; i++) {
      const a = p.allocate();
      p.release(a);
    }
    expect(p.inUse).toBe(0);
  });
});

describe('IntervalSet', () => {
  it('merges ranges and answers coverage', () => {
    const s = new IntervalSet();
    s.add(10, 20);
    s.add(0, 5);
    s.add(5, 10);
    s.add(30, 40);
    expect(s.intervals).toEqual([[0, 20], [30, 40]]);
    expect(s.covers(0, 20)).toBe(true);
    expect(s.covers(0, 21)).toBe(false);
    s.add(15, 35);
    expect(s.intervals).toEqual([[0, 40]]);
    expect(s.covered).toBe(40);
  });
  it('clips the ranges within a window and subtracts one set of ranges from another', () => {
    const s = new IntervalSet();
    s.add(0, 10);
    s.add(20, 30);
    s.add(40, 50);
    expect(s.within(5, 45)).toEqual([[5, 10], [20, 30], [40, 45]]);
    expect(s.within(10, 20)).toEqual([]);
    expect(s.within(25, 26)).toEqual([[25, 26]]);
    expect(s.within(60, 70)).toEqual([]);
    expect(subtractRanges([[0, 10], [20, 30]], [[2, 4], [8, 22], [25, 26]])).toEqual([[0, 2], [4, 8], [22, 25], [26, 30]]);
    expect(subtractRanges([[0, 10]], [])).toEqual([[0, 10]]);
    expect(subtractRanges([[0, 10]], [[0, 10]])).toEqual([]);
    expect(subtractRanges([[5, 10]], [[0, 6], [9, 20]])).toEqual([[6, 9]]);
  });
});

describe('layout and ids', () => {
  it('builds Longhorn paths and recovers names', () => {
    expect(backingFilePath('/d', 'img-a', 'u1')).toBe('/d/backing-images/img-a-u1/backing');
    expect(dataSourceFilePath('/d', 'img', 'u1')).toBe('/d/tmp/img-u1');
    expect(backingImageNameFromPath('/d/backing-images/img-a-u1/backing', 'u1')).toBe('img-a');
  });
  it('decodes QueryEscape and PathEscape ids alike', () => {
    expect(decodeFileId('%2Fdata%2Fbacking-images%2Fa+b-u%2Fbacking')).toBe('/data/backing-images/a b-u/backing');
    expect(decodeFileId('%2Fdata%2Fa%20b')).toBe('/data/a b');
    expect(decodeFileId(encodeFileId('/x/a b/c'))).toBe('/x/a b/c');
  });
  it('scales the per-request timeout with the body size (longhorn#6536)', () => {
    expect(defaultRequestTimeoutMs(0)).toBe(10_000);
    expect(defaultRequestTimeoutMs(2 << 20)).toBe(14_000);
    expect(defaultRequestTimeoutMs(64 << 20)).toBeGreaterThan(100_000);
  });
});
