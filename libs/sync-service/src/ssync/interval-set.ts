/** A set of half-open byte ranges [start, end), kept sorted and merged. Used to know what a receiver got. */
export class IntervalSet {
  readonly #starts: number[] = [];
  readonly #ends: number[] = [];

  add(start: number, end: number): void {
    if (!(end > start)) return;
    // first interval whose end >= start (may merge)
    let lo = 0;
    let hi = this.#starts.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.#ends[mid]! < start) lo = mid + 1;
      else hi = mid;
    }
    const i = lo;
    let s = start;
    let e = end;
    let j = i;
    while (j < this.#starts.length && this.#starts[j]! <= e) {
      s = Math.min(s, this.#starts[j]!);
      e = Math.max(e, this.#ends[j]!);
      j++;
    }
    this.#starts.splice(i, j - i, s);
    this.#ends.splice(i, j - i, e);
  }

  /** Total bytes covered. */
  get covered(): number {
    let n = 0;
    for (let i = 0; i < this.#starts.length; i++) n += this.#ends[i]! - this.#starts[i]!;
    return n;
  }

  /** Whether [start, end) is entirely covered. */
  covers(start: number, end: number): boolean {
    if (!(end > start)) return true;
    for (let i = 0; i < this.#starts.length; i++) {
      if (this.#starts[i]! <= start && this.#ends[i]! >= end) return true;
    }
    return false;
  }

  /** End of the covered run that starts at 0 (0 when nothing from 0 is covered). */
  get contiguousPrefix(): number {
    return this.#starts.length > 0 && this.#starts[0] === 0 ? this.#ends[0]! : 0;
  }

  get intervals(): Array<[number, number]> {
    return this.#starts.map((s, i) => [s, this.#ends[i]!]);
  }

  /** The covered ranges that meet [start, end), clipped to it, in order. */
  within(start: number, end: number): Array<[number, number]> {
    const out: Array<[number, number]> = [];
    if (!(end > start)) return out;
    let lo = 0;
    let hi = this.#starts.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.#ends[mid]! <= start) lo = mid + 1;
      else hi = mid;
    }
    for (let i = lo; i < this.#starts.length && this.#starts[i]! < end; i++) {
      out.push([Math.max(start, this.#starts[i]!), Math.min(end, this.#ends[i]!)]);
    }
    return out;
  }
}

/** What of `ranges` (sorted, disjoint) `minus` (sorted, disjoint) leaves, in order. */
export function subtractRanges(ranges: ReadonlyArray<readonly [number, number]>, minus: ReadonlyArray<readonly [number, number]>): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  let j = 0;
  for (const [s0, e] of ranges) {
    let s = s0;
    while (j < minus.length && minus[j]![1] <= s) j++;
    let k = j;
    while (s < e && k < minus.length && minus[k]![0] < e) {
      const [ms, me] = minus[k]!;
      if (ms > s) out.push([s, ms]);
      s = Math.max(s, me);
      k++;
    }
    if (s < e) out.push([s, e]);
  }
  return out;
}
