/**
 * Calls `visit` with every key whose value differs between two versions of a map (by `same`), including the keys
 * present in only one of them. Versions from the store share what a write kept: an unchanged map costs one pointer
 * check, and an unchanged entry one call of `same` (which should check identity first).
 */
export function forEachChangedKey<V>(
  a: Readonly<Record<string, V>> | null | undefined,
  b: Readonly<Record<string, V>> | null | undefined,
  same: (x: V, y: V) => boolean,
  visit: (key: string) => void,
): void {
  if (a === b) return;
  const x = a ?? {};
  const y = b ?? {};
  for (const k of Object.keys(y)) if (!Object.prototype.hasOwnProperty.call(x, k) || !same(x[k] as V, y[k] as V)) visit(k);
  for (const k of Object.keys(x)) if (!Object.prototype.hasOwnProperty.call(y, k)) visit(k);
}

/**
 * The keys of one map that is replaced by new versions (a manager's `spec.backingImages`), or of a subset of them, in
 * the map's order (the order they were added). A few keys are sorted by their place, computed once per version of the
 * map, instead of listing every key of the map each time: a manager's spec may list thousands of images, and listing
 * the keys of so large an object sorts them. Versions of store objects are replaced, never changed in place, so a
 * version's order does not change. One instance per map: it keeps the places of the last version only.
 */
export class KeyOrder {
  #version: object | undefined;
  #place = new Map<string, number>();

  keys(map: Readonly<Record<string, unknown>>, subset: 'all' | ReadonlySet<string>): string[] {
    if (subset === 'all') return Object.keys(map);
    const present = [...subset].filter((k) => Object.prototype.hasOwnProperty.call(map, k));
    if (present.length < 2) return present;
    if (this.#version !== map) {
      this.#place = new Map(Object.keys(map).map((k, i) => [k, i]));
      this.#version = map;
    }
    const place = this.#place;
    return present.sort((a, b) => place.get(a)! - place.get(b)!);
  }
}
