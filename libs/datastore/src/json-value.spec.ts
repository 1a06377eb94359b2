import { describe, expect, it } from '@jest/globals';
import { cloneObject, sameValue } from './json-value.js';

describe('cloneObject', () => {
  it('copies JSON data deeply: equal, and no object or array is shared with the source', () => {
    const src: {
      metadata: { name: string; labels: Record<string, string>; ownerReferences: { kind: string; name: string }[] };
      spec: { backingImages: Record<string, string>; size: number; neg: number; ok: boolean; none: null; nested: unknown[][] };
      status: { gone?: string };
    } = {
      metadata: { name: 'bim-1', labels: { a: 'b' }, ownerReferences: [{ kind: 'Node', name: 'n1' }] },
      spec: { backingImages: { 'bi-1': 'u1' }, size: 0, neg: -0, ok: true, none: null, nested: [[1, 2], [{ x: 'y' }]] },
      status: { gone: undefined },
    };
    const out = cloneObject(src);
    expect(out).toStrictEqual(src);
    expect(Object.keys(out.status)).toEqual(['gone']);
    expect(Object.is(out.spec.neg, -0)).toBe(true);
    out.metadata.labels.a = 'changed';
    out.metadata.ownerReferences[0]!.name = 'changed';
    out.spec.nested[0]!.push(3);
    (out.spec.nested[1]![0] as { x: string }).x = 'changed';
    out.spec.backingImages['bi-2'] = 'u2';
    expect(src.metadata.labels.a).toBe('b');
    expect(src.metadata.ownerReferences[0]!.name).toBe('n1');
    expect(src.spec.nested).toEqual([[1, 2], [{ x: 'y' }]]);
    expect(src.spec.backingImages).toEqual({ 'bi-1': 'u1' });
  });

  it('keeps a member named __proto__ (as JSON.parse makes it) as a member, not as the prototype of the copy', () => {
    const src = JSON.parse('{"params":{"__proto__":{"polluted":true},"url":"u"},"flag":{"__proto__":true}}') as Record<string, Record<string, unknown>>;
    const out = cloneObject(src);
    expect(Object.getPrototypeOf(out['params'])).toBe(Object.prototype);
    expect((out['params'] as { polluted?: boolean }).polluted).toBeUndefined();
    expect(JSON.stringify(out)).toBe(JSON.stringify(src));
  });

  it('copies what is not plain JSON data as structuredClone does', () => {
    const when = new Date('2026-01-02T03:04:05Z');
    const src = { when, map: new Map([['k', { v: 1 }]]), bytes: new Uint8Array([1, 2, 3]), bare: Object.assign(Object.create(null) as object, { a: 1 }) };
    const out = cloneObject(src);
    expect(Object.prototype.toString.call(out.when)).toBe('[object Date]'); // structuredClone's realm may differ from the test's
    expect(out.when).not.toBe(when);
    expect(out.when.getTime()).toBe(when.getTime());
    expect(out.map.get('k')).toEqual({ v: 1 });
    expect(out.map.get('k')).not.toBe(src.map.get('k'));
    expect([...out.bytes]).toEqual([1, 2, 3]);
    expect(out.bytes).not.toBe(src.bytes);
    expect(out.bare).toEqual({ a: 1 });
    expect(out.bare).not.toBe(src.bare);
  });

  it('refuses a function as structuredClone does', () => {
    expect(() => cloneObject({ f: () => 1 })).toThrow(/could not be cloned/);
  });

  it('copies a cycle (past the recursion bound, through structuredClone) instead of overflowing the stack', () => {
    type Node = { name: string; next?: Node };
    const a: Node = { name: 'a' };
    a.next = a;
    const out = cloneObject(a);
    let n: Node | undefined = out;
    for (let i = 0; i < 500 && n; i++) n = n.next;
    expect(n?.name).toBe('a');
    expect(out).not.toBe(a);
  });
});

/** The oracle: stable JSON (key order independent), compared as strings. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}


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
  });

  it('compares a copy-on-write edit of a large map by reference for untouched entries', () => {
    const files: Record<string, { state: string; progress: number }> = {};
    for (let i = 0; i < 5000; i++) files[`img-${i}`] = { state: 'ready', progress: 100 };
    const next = { ...files, 'img-42': { state: 'failed', progress: 100 } };
    expect(sameValue(files, { ...files })).toBe(true);
    expect(sameValue(files, next)).toBe(false);
  });
});
