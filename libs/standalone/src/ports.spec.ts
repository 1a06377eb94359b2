import { describe, expect, it } from '@jest/globals';
import { PortRangeAllocator, ephemeralPortStart } from './ports.js';

describe('PortRangeAllocator', () => {
  it('hands out disjoint ranges below the ephemeral port range and wraps around within it', () => {
    const end = ephemeralPortStart();
    const a = new PortRangeAllocator(50, 10300, 10000); // six slots
    const ranges = Array.from({ length: 6 }, () => a.allocate().split('-').map(Number) as [number, number]);
    for (const [lo, hi] of ranges) {
      expect(hi - lo).toBe(49);
      expect(lo).toBeGreaterThanOrEqual(10000);
      expect(hi).toBeLessThan(10300);
    }
    expect(new Set(ranges.map(([lo]) => lo)).size).toBe(6);
    // The seventh wraps to a range already handed out.
    expect(ranges.map(([lo]) => lo)).toContain(Number(a.allocate().split('-')[0]));
    const d = new PortRangeAllocator();
    for (let i = 0; i < 1000; i++) expect(Number(d.allocate().split('-')[1])).toBeLessThan(end);
  });
});
