import { cloneObject, sameValue, setMember } from './json-value.js';

/**
 * Structural sharing and path patches of JSON values (the objects of the store).
 *
 * A new version of an object shares every subtree that did not change with the version before it
 * ({@link shareValue}), so that comparing, freezing, diffing and keeping both versions cost what changed, not the size
 * of the object. A change is described by {@link PatchOp}s ({@link diffValue}), which {@link applyPatch} applies
 * copy-on-write. The embedded store logs changes of objects this way (a manager listing a thousand files otherwise
 * wrote its whole status, half a megabyte, for each file's change).
 */

/** Sets `value` at `path` (`[path, value]`) or deletes the member at `path` (`[path]`). An empty path is the root. */
export type PatchOp = [path: string[], value: unknown] | [path: string[]];

type JsonObject = Record<string, unknown>;

function isPlainObject(v: unknown): v is JsonObject {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  const proto: unknown = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

const hasOwn = (o: object, k: string): boolean => Object.prototype.hasOwnProperty.call(o, k);

/**
 * `next` as a new value that shares with `prev` every subtree that equals it (as {@link sameValue} compares): `prev`
 * itself when the two are equal, else a copy of `next` (as `cloneObject` copies) whose unchanged members are
 * `prev`'s. Unchanged subtrees allocate nothing. `prev` is never changed and must not be changed later either (the
 * store's committed objects are replaced, never changed in place).
 */
export function shareValue<T>(next: T, prev: unknown): T {
  return share(next, prev) as T;
}

function share(next: unknown, prev: unknown): unknown {
  if (next === prev) return prev;
  if (isPlainObject(next) && isPlainObject(prev)) {
    let out: JsonObject | undefined;
    let n = 0;
    const keys = Object.keys(next);
    for (let i = 0; i < keys.length; i++) {
      const k = keys[i]!;
      const nv = next[k];
      if (nv === undefined) {
        // absent in JSON: equal when prev has no value there either
        if (out === undefined && hasOwn(prev, k) && prev[k] !== undefined) out = startCopy(prev, keys, i);
        continue;
      }
      n++;
      const pv = hasOwn(prev, k) ? prev[k] : undefined;
      const v = pv === undefined ? cloneObject(nv) : share(nv, pv);
      if (out === undefined && v !== pv) out = startCopy(prev, keys, i);
      if (out !== undefined) setMember(out, k, v);
    }
    if (out !== undefined) return out;
    // every member of next equals prev's: equal unless prev has more members
    let m = 0;
    for (const k in prev) if (hasOwn(prev, k) && prev[k] !== undefined) m++;
    if (m === n) return prev;
    const copy: JsonObject = {};
    for (const k of keys) if (next[k] !== undefined) setMember(copy, k, prev[k]);
    return copy;
  }
  if (Array.isArray(next) && Array.isArray(prev)) {
    if (sameValue(next, prev)) return prev;
    return next.map((x, i) => (i < prev.length ? share(x, prev[i]) : cloneObject(x)));
  }
  if ((typeof next !== 'object' || next === null) && (typeof prev !== 'object' || prev === null) && sameValue(next, prev)) return prev;
  return cloneObject(next);
}

/** A new object holding `prev`'s members for `keys[0..upTo)` (those of next found equal so far). */
function startCopy(prev: JsonObject, keys: string[], upTo: number): JsonObject {
  const out: JsonObject = {};
  for (let j = 0; j < upTo; j++) {
    const k = keys[j]!;
    if (hasOwn(prev, k) && prev[k] !== undefined) setMember(out, k, prev[k]);
  }
  return out;
}

/**
 * The operations that turn `prev` into `next` (as JSON: members holding `undefined` are absent). Objects are compared
 * member by member and shared subtrees by reference, so the cost is what changed plus one look at each member of the
 * objects on the way; arrays and scalars that differ are set whole.
 */
export function diffValue(prev: unknown, next: unknown): PatchOp[] {
  const ops: PatchOp[] = [];
  diffInto(prev, next, [], ops);
  return ops;
}

function diffInto(prev: unknown, next: unknown, path: string[], ops: PatchOp[]): void {
  if (prev === next) return;
  if (isPlainObject(prev) && isPlainObject(next)) {
    for (const k of Object.keys(next)) {
      const nv = next[k];
      if (nv === undefined) continue;
      const pv = hasOwn(prev, k) ? prev[k] : undefined;
      if (pv === nv) continue;
      if (pv === undefined) ops.push([[...path, k], nv]);
      else diffInto(pv, nv, [...path, k], ops);
    }
    for (const k of Object.keys(prev)) {
      if (prev[k] !== undefined && (!hasOwn(next, k) || next[k] === undefined)) ops.push([[...path, k]]);
    }
    return;
  }
  if (sameValue(prev, next)) return;
  ops.push([path, next]);
}

/** Thrown by {@link applyPatch} when an operation's path does not lead through objects of the base. */
export class PatchPathError extends Error {
  constructor(path: string[]) {
    super(`patch path ${JSON.stringify(path)} does not lead through objects of the value it is applied to`);
    this.name = 'PatchPathError';
  }
}

/**
 * `base` with `ops` applied, copy-on-write: the objects on the paths of the operations are copied, everything else is
 * shared with `base`, which is not changed. The values set are taken as they are (not copied).
 */
export function applyPatch<T>(base: T, ops: readonly PatchOp[]): T {
  let root: unknown = base;
  const fresh = new Set<unknown>();
  for (const op of ops) {
    const path = op[0];
    if (path.length === 0) {
      if (op.length !== 2) throw new PatchPathError(path);
      root = op[1];
      continue;
    }
    if (!isPlainObject(root)) throw new PatchPathError(path);
    if (!fresh.has(root)) {
      root = { ...root };
      fresh.add(root);
    }
    let parent = root as JsonObject;
    for (let i = 0; i < path.length - 1; i++) {
      const k = path[i]!;
      let child = hasOwn(parent, k) ? parent[k] : undefined;
      if (!isPlainObject(child)) throw new PatchPathError(path);
      if (!fresh.has(child)) {
        child = { ...child };
        fresh.add(child);
        setMember(parent, k, child);
      }
      parent = child as JsonObject;
    }
    const last = path[path.length - 1]!;
    if (op.length === 2) setMember(parent, last, op[1]);
    else delete parent[last];
  }
  return root as T;
}
