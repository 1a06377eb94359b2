import { describe, expect, it } from '@jest/globals';
import { applyPatch, diffValue, PatchPathError, shareValue, type PatchOp } from './json-patch.js';
import { sameValue } from './json-value.js';

function deepFreeze<T>(v: T): T {
  if (typeof v === 'object' && v !== null && !Object.isFrozen(v)) {
    Object.freeze(v);
    for (const x of Object.values(v)) deepFreeze(x);
  }
  return v;
}

/** A small deterministic PRNG (mulberry32), so that a failing case can be replayed. */
function rng(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const KEYS = ['a', 'b', 'c', 'state', 'files', '__proto__', 'constructor', 'x.y', ''];

function randomValue(r: () => number, depth: number): unknown {
  const p = r();
  if (depth > 3 || p < 0.35) return [null, true, false, 0, -1, 1.5, 'ready', '', 'x'.repeat(3)][Math.floor(r() * 9)];
  if (p < 0.5) return Array.from({ length: Math.floor(r() * 3) }, () => randomValue(r, depth + 1));
  const o: Record<string, unknown> = {};
  for (let i = Math.floor(r() * 4); i > 0; i--) Object.defineProperty(o, KEYS[Math.floor(r() * KEYS.length)]!, { value: randomValue(r, depth + 1), enumerable: true, writable: true, configurable: true });
  return o;
}

/** `v` with a few random changes: members set, added, deleted or set to undefined, at any depth. */
function mutate(r: () => number, v: unknown, depth = 0): unknown {
  if (typeof v !== 'object' || v === null || Array.isArray(v) || r() < 0.2) return r() < 0.5 ? v : randomValue(r, depth);
  const o: Record<string, unknown> = { ...(v as Record<string, unknown>) };
  for (const k of Object.keys(o)) {
    const p = r();
    if (p < 0.15) delete o[k];
    else if (p < 0.2) o[k] = undefined;
    else if (p < 0.5) Object.defineProperty(o, k, { value: mutate(r, o[k], depth + 1), enumerable: true, writable: true, configurable: true });
  }
  if (r() < 0.3) Object.defineProperty(o, KEYS[Math.floor(r() * KEYS.length)]!, { value: randomValue(r, depth + 1), enumerable: true, writable: true, configurable: true });
  return o;
}

const json = (v: unknown): unknown => JSON.parse(JSON.stringify(v) ?? 'null');

describe('shareValue', () => {
  it('returns the previous value itself when the new one equals it, member order and undefined members aside', () => {
    const prev = deepFreeze({ a: 1, b: { c: [1, 2, { d: 'x' }], e: null } });
    expect(shareValue({ b: { e: null, c: [1, 2, { d: 'x' }] }, a: 1, z: undefined }, prev)).toBe(prev);
    expect(shareValue({ a: 1, b: { c: [1, 2, { d: 'x' }], e: null } }, prev)).toBe(prev);
  });

  it('copies what changed and shares every unchanged subtree, allocating nothing for them', () => {
    const files = Object.fromEntries(Array.from({ length: 100 }, (_, i) => [`f${i}`, { state: 'pending', progress: 0 }]));
    const prev = deepFreeze({ spec: { x: 1 }, status: { files } });
    const input = JSON.parse(JSON.stringify(prev)) as typeof prev;
    input.status.files['f7'] = { state: 'ready', progress: 100 };
    const next = shareValue(input, prev);
    expect(next).not.toBe(prev);
    expect(next.spec).toBe(prev.spec);
    expect(next.status).not.toBe(prev.status);
    expect(next.status.files).not.toBe(prev.status.files);
    for (let i = 0; i < 100; i++) if (i !== 7) expect(next.status.files[`f${i}`]).toBe(prev.status.files[`f${i}`]);
    expect(next.status.files['f7']).toEqual({ state: 'ready', progress: 100 });
    // the changed part is a copy: changing the input afterwards does not reach it
    input.status.files['f7']!.state = 'changed';
    expect(next.status.files['f7']!.state).toBe('ready');
    expect(prev.status.files['f7']!.state).toBe('pending');
  });

  it('handles removed members, undefined members, type changes and arrays', () => {
    const prev = deepFreeze({ a: 1, b: 2, c: [{ x: 1 }, { y: 2 }], d: { e: 1 } });
    const fewer = shareValue({ a: 1, c: [{ x: 1 }, { y: 2 }], d: { e: 1 } }, prev);
    expect(fewer).toEqual({ a: 1, c: [{ x: 1 }, { y: 2 }], d: { e: 1 } });
    expect(fewer.c).toBe(prev.c);
    const gone = shareValue({ a: 1, b: undefined, c: prev.c, d: prev.d }, prev);
    expect(json(gone)).toEqual({ a: 1, c: [{ x: 1 }, { y: 2 }], d: { e: 1 } });
    const arr = shareValue({ a: 1, b: 2, c: [{ x: 1 }, { y: 3 }], d: [1] }, prev) as unknown as { c: unknown[]; d: unknown };
    expect(arr.c[0]).toBe(prev.c[0]);
    expect(arr.c[1]).toEqual({ y: 3 });
    expect(arr.d).toEqual([1]);
  });

  it('keeps a member named __proto__ as data, never as the prototype', () => {
    const prev = deepFreeze(JSON.parse('{"files":{"__proto__":{"state":"pending"},"a":{"state":"pending"}}}') as Record<string, Record<string, { state: string }>>);
    const input = JSON.parse('{"files":{"__proto__":{"state":"ready"},"a":{"state":"pending"}}}') as typeof prev;
    const next = shareValue(input, prev);
    expect(Object.getPrototypeOf(next.files)).toBe(Object.prototype);
    expect(Object.keys(next.files!)).toEqual(['__proto__', 'a']);
    expect(JSON.stringify(next)).toBe('{"files":{"__proto__":{"state":"ready"},"a":{"state":"pending"}}}');
    expect(next.files!['a']).toBe(prev.files!['a']);
  });

  it('gives a value JSON-equal to the new one for random changes, and never changes the previous one', () => {
    const r = rng(42);
    for (let i = 0; i < 3000; i++) {
      const prev = deepFreeze(randomValue(r, 0));
      const before = JSON.stringify(prev);
      const input = mutate(r, json(prev));
      const next = shareValue(input, prev);
      expect(json(next)).toEqual(json(input));
      expect(JSON.stringify(prev)).toBe(before);
      if (sameValue(input, prev)) expect(next).toBe(prev);
    }
  });
});

describe('diffValue / applyPatch', () => {
  it('describes a change of one member by its path only', () => {
    const prev = deepFreeze({ metadata: { resourceVersion: '7' }, status: { files: { a: { state: 'pending' }, b: { state: 'pending' } } } });
    const next = { metadata: { resourceVersion: '8' }, status: { files: { a: prev.status.files.a, b: { state: 'ready' } } } };
    expect(diffValue(prev, next)).toEqual([
      [['metadata', 'resourceVersion'], '8'],
      [['status', 'files', 'b', 'state'], 'ready'],
    ]);
    expect(diffValue(prev, { ...next, status: { files: { a: prev.status.files.a } } })).toEqual([
      [['metadata', 'resourceVersion'], '8'],
      [['status', 'files', 'b']],
    ]);
    expect(diffValue(prev, prev)).toEqual([]);
  });

  it('sets arrays and values of another type whole, and keeps null apart from a removed member', () => {
    expect(diffValue({ a: [1, 2], b: 1, c: 1 }, { a: [1, 3], b: { x: 1 }, c: null })).toEqual([
      [['a'], [1, 3]],
      [['b'], { x: 1 }],
      [['c'], null],
    ]);
    expect(applyPatch({ a: 1, c: 1 }, diffValue({ a: 1, c: 1 }, { a: 1, c: null }))).toEqual({ a: 1, c: null });
  });

  it('applies copy-on-write: the base is not changed and untouched subtrees are shared', () => {
    const base = deepFreeze({ s: { files: { a: { state: 'pending' }, b: { state: 'pending' } } }, spec: { x: 1 } });
    const out = applyPatch(base, [[['s', 'files', 'b', 'state'], 'ready'], [['s', 'files', 'c'], { state: 'new' }], [['s', 'files', 'a']]]);
    expect(out).toEqual({ s: { files: { b: { state: 'ready' }, c: { state: 'new' } } }, spec: { x: 1 } });
    expect(out.spec).toBe(base.spec);
    expect(base.s.files.b.state).toBe('pending');
    expect(Object.keys(base.s.files)).toEqual(['a', 'b']);
  });

  it('refuses a path that does not lead through objects', () => {
    expect(() => applyPatch({ a: 1 }, [[['a', 'b'], 2]])).toThrow(PatchPathError);
    expect(() => applyPatch({ a: [1] }, [[['a', '0'], 2]])).toThrow(/patch path \["a","0"\] does not lead through objects/);
    expect(() => applyPatch(5, [[['a'], 2]])).toThrow(PatchPathError);
  });

  it('never sets a prototype through a member named __proto__', () => {
    const out = applyPatch({ a: {} } as Record<string, unknown>, [[['a', '__proto__'], { polluted: true }]] as PatchOp[]);
    // a path through a __proto__ member the value does not have is refused, not followed to Object.prototype
    expect(() => applyPatch({ a: {} }, [[['__proto__', 'x'], 1]])).toThrow(PatchPathError);
    const a = out['a'] as Record<string, unknown>;
    expect(Object.getPrototypeOf(a)).toBe(Object.prototype);
    expect((a as { polluted?: boolean }).polluted).toBeUndefined();
    expect(JSON.stringify(a)).toBe('{"__proto__":{"polluted":true}}');
    expect(({} as { polluted?: boolean }).polluted).toBeUndefined();
  });

  it('round-trips random changes through JSON: applying the diff to the previous value gives the new one', () => {
    const r = rng(7);
    for (let i = 0; i < 3000; i++) {
      const prev = deepFreeze(randomValue(r, 0));
      const next = mutate(r, json(prev));
      const ops = JSON.parse(JSON.stringify(diffValue(prev, next))) as PatchOp[];
      const out = applyPatch(json(prev), ops);
      expect(json(out)).toEqual(json(next));
      if (sameValue(prev, next)) expect(ops).toEqual([]);
    }
  });
});
