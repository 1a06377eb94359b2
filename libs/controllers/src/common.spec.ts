import { describe, expect, it } from '@jest/globals';
import { canonical, changed, onlyProgressDiffers, sameValue } from './common.js';

describe('sameValue (change detection without canonical strings)', () => {
  const cases: [unknown, unknown][] = [
    [{ a: 1, b: { c: [1, 2] } }, { b: { c: [1, 2] }, a: 1 }],
    [{ a: 1, b: undefined }, { a: 1 }],
    [{ a: null }, { a: undefined }],
    [{ a: null }, {}],
    [[1, undefined], [1, null]],
    [[1, 2], [2, 1]],
    [undefined, null],
    [NaN, null],
    [0, -0],
    ['1', 1],
    [{}, []],
    [{ a: {} }, { a: [] }],
    [{ a: { b: 1 } }, { a: { b: 2 } }],
    [{ a: 'x' }, { a: 'x', b: '' }],
    [{ m: { x: { s: 'ready' } } }, { m: { x: { s: 'ready' }, y: { s: 'ready' } } }],
    [1, { a: 1 }],
  ];
  it.each(cases)('agrees with canonical() for %j vs %j', (a, b) => {
    expect(sameValue(a, b)).toBe(canonical(a) === canonical(b));
    expect(sameValue(b, a)).toBe(canonical(a) === canonical(b));
    expect(changed(a, b)).toBe(canonical(a) !== canonical(b));
  });

  it('compares a copy-on-write edit of a large map by reference for untouched entries', () => {
    const files: Record<string, { state: string; progress: number }> = {};
    for (let i = 0; i < 5000; i++) files[`img-${i}`] = { state: 'ready', progress: 100 };
    const next = { ...files, 'img-42': { state: 'failed', progress: 100 } };
    expect(sameValue(files, { ...files })).toBe(true);
    expect(sameValue(files, next)).toBe(false);
  });
});

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
