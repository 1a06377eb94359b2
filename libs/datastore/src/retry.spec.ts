import { describe, expect, it } from '@jest/globals';
import { formatRetryDelay, isPermanentError, PermanentError, RETRY_BOUNDS, retryDelay, seededRandom } from './retry.js';

describe('retry policy', () => {
  it('doubles from the initial delay up to the cap, and stays there', () => {
    const b = { initialMs: 1000, maxMs: 10_000, jitter: 0 };
    expect([0, 1, 2, 3, 4, 5, 6, 50, 5000].map((n) => retryDelay(b, n))).toEqual([0, 1000, 2000, 4000, 8000, 10_000, 10_000, 10_000, 10_000]);
  });

  it('jitter spreads each delay over [d·(1−jitter), d], reproducibly for a seed', () => {
    const b = RETRY_BOUNDS.file;
    const a = Array.from({ length: 8 }, (_, i) => retryDelay(b, i + 1, seededRandom(42)));
    const again = Array.from({ length: 8 }, (_, i) => retryDelay(b, i + 1, seededRandom(42)));
    expect(a).toEqual(again);
    const rnd = seededRandom(1);
    const seen = new Set<number>();
    for (let n = 1; n <= 200; n++) {
      const d = retryDelay(b, n, rnd);
      const nominal = Math.min(b.maxMs, b.initialMs * 2 ** (n - 1));
      expect(d).toBeGreaterThanOrEqual(Math.floor(nominal * (1 - b.jitter)));
      expect(d).toBeLessThanOrEqual(nominal);
      seen.add(d);
    }
    // not one value: keys that failed together do not retry together
    expect(seen.size).toBeGreaterThan(50);
  });

  it('the random source extremes give the bounds', () => {
    const b = { initialMs: 100, maxMs: 1000, jitter: 0.2 };
    expect(retryDelay(b, 1, () => 0)).toBe(100);
    expect(retryDelay(b, 1, () => 0.999999)).toBe(80);
    expect(retryDelay(b, 10, () => 0)).toBe(1000);
  });

  it('documents the bounds in use', () => {
    expect(RETRY_BOUNDS.file).toMatchObject({ initialMs: 60_000, maxMs: 300_000 });
    expect(RETRY_BOUNDS.reconcile).toMatchObject({ initialMs: 5, maxMs: 300_000 });
    expect(RETRY_BOUNDS.managerRestart).toMatchObject({ initialMs: 1000, maxMs: 120_000 });
  });

  it('permanent errors are recognised; delays read as operators read them', () => {
    expect(isPermanentError(new PermanentError('x'))).toBe(true);
    expect(isPermanentError(new Error('x'))).toBe(false);
    expect(formatRetryDelay(40_000)).toBe('40 s');
    expect(formatRetryDelay(125_000)).toBe('2 min 5 s');
    expect(formatRetryDelay(300_000)).toBe('5 min');
    expect(formatRetryDelay(250)).toBe('250 ms');
  });
});
