import { describe, expect, it } from '@jest/globals';
import { forEachChangedKey, KeyOrder } from './map-diff.js';

describe('KeyOrder', () => {
  const order = new KeyOrder();
  const keysInOrder = (map: Record<string, string>, subset: 'all' | ReadonlySet<string>) => order.keys(map, subset);
  it('gives all keys in insertion order, or those of a subset that the map has, in the same order', () => {
    const map: Record<string, string> = {};
    for (const k of ['img-9', 'img-10', 'b', 'a', 'img-1']) map[k] = `u-${k}`;
    expect(keysInOrder(map, 'all')).toEqual(['img-9', 'img-10', 'b', 'a', 'img-1']);
    expect(keysInOrder(map, new Set(['img-1', 'a', 'img-9', 'missing']))).toEqual(['img-9', 'a', 'img-1']);
    expect(keysInOrder(map, new Set(['missing']))).toEqual([]);
    expect(keysInOrder(map, new Set(['b']))).toEqual(['b']);
    // a new version of the map (the store replaces objects) has its own order
    const next = { c: 'u-c', ...map };
    expect(keysInOrder(next, new Set(['a', 'c']))).toEqual(['c', 'a']);
    expect(keysInOrder(map, new Set(['a', 'c', 'img-10']))).toEqual(['img-10', 'a']);
  });
});

describe('forEachChangedKey', () => {
  it('visits the keys added, removed or whose value differs, and nothing for the same map', () => {
    const shared = { state: 'ready' };
    const a = { x: shared, y: { state: 'pending' }, gone: shared };
    const b = { x: shared, y: { state: 'ready' }, added: shared };
    const seen: string[] = [];
    forEachChangedKey(a, b, (p, q) => p === q || p.state === q.state, (k) => seen.push(k));
    expect(seen.sort()).toEqual(['added', 'gone', 'y']);
    forEachChangedKey(a, a, () => false, (k) => seen.push(k));
    expect(seen).toHaveLength(3);
    forEachChangedKey(undefined, { k: shared }, () => true, (k) => seen.push(k));
    expect(seen).toContain('k');
  });
});
