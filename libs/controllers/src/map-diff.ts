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
