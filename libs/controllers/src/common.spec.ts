import { describe, expect, it } from '@jest/globals';
import { onlyProgressDiffers } from './common.js';

describe('onlyProgressDiffers (which monitor writes may wait)', () => {
  const f = (state: string, progress: number, extra: Record<string, unknown> = {}) => ({ state, progress, message: '', sendingReference: 0, ...extra });
  it('is true when files differ only in progress, false for any other change', () => {
    expect(onlyProgressDiffers({ a: f('in-progress', 10) }, { a: f('in-progress', 40) })).toBe(true);
    expect(onlyProgressDiffers({ a: f('in-progress', 10) }, { a: f('ready', 100) })).toBe(false);
    expect(onlyProgressDiffers({ a: f('in-progress', 10) }, { a: f('in-progress', 40, { sendingReference: 1 }) })).toBe(false);
    expect(onlyProgressDiffers({ a: f('in-progress', 10) }, { a: f('in-progress', 10), b: f('pending', 0) })).toBe(false);
    expect(onlyProgressDiffers({ a: f('in-progress', 10), b: f('pending', 0) }, { a: f('in-progress', 10) })).toBe(false);
    expect(onlyProgressDiffers({ a: f('in-progress', 10) }, { b: f('in-progress', 10) })).toBe(false);
  });
});
