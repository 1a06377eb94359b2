/** A byte range of a file: `[offset, offset + length)`. */
export interface Extent {
  offset: number;
  length: number;
}

/** Where a file holds data and where it has holes, as seen by one backend. */
export interface FileLayout {
  /** File size in bytes (st_size). */
  size: number;
  /** Data extents: sorted, non-overlapping, adjacent ones merged, all within `[0, size)`. */
  data: Extent[];
  /** Holes: the complement of `data` within `[0, size)`, same ordering rules. */
  holes: Extent[];
  /** The backend that produced this layout. */
  backend: ExtentBackend;
}

/**
 * - `seek-data`: the native addon asks the filesystem (lseek SEEK_DATA / SEEK_HOLE); extents are filesystem-block
 *   granular, and allocated blocks count as data even when they hold zeros.
 * - `zero-scan`: reads the whole file and reports every all-zero 4 KiB block as a hole; it cannot tell an allocated
 *   zero block from a hole.
 */
export type ExtentBackend = 'seek-data' | 'zero-scan';

/** Checks that `n` is a non-negative safe integer; throws a RangeError naming `what` otherwise. */
export function assertByteCount(n: number, what: string): void {
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new RangeError(`${what} must be a non-negative safe integer, got ${String(n)}`);
  }
}

/**
 * Sorts extents, drops empty ones and merges overlapping or adjacent ones. Returns a new array; the input is not
 * changed.
 */
export function mergeExtents(extents: readonly Extent[]): Extent[] {
  const sorted = extents
    .filter((e) => e.length > 0)
    .map((e) => {
      assertByteCount(e.offset, 'extent offset');
      assertByteCount(e.length, 'extent length');
      return { offset: e.offset, length: e.length };
    })
    .sort((a, b) => a.offset - b.offset);
  const merged: Extent[] = [];
  for (const e of sorted) {
    const last = merged[merged.length - 1];
    if (last && e.offset <= last.offset + last.length) {
      last.length = Math.max(last.offset + last.length, e.offset + e.length) - last.offset;
    } else {
      merged.push(e);
    }
  }
  return merged;
}

/** The holes of a file of `size` bytes whose data extents are `data` (sorted, merged, within `[0, size)`). */
export function complementExtents(data: readonly Extent[], size: number): Extent[] {
  const holes: Extent[] = [];
  let pos = 0;
  for (const e of data) {
    if (e.offset > pos) holes.push({ offset: pos, length: e.offset - pos });
    pos = Math.max(pos, e.offset + e.length);
  }
  if (pos < size) holes.push({ offset: pos, length: size - pos });
  return holes;
}

/** Appends `[offset, offset + length)` to a sorted extent list, merging it with the last extent when adjacent. */
export function appendExtent(list: Extent[], offset: number, length: number): void {
  if (length <= 0) return;
  const last = list[list.length - 1];
  if (last && last.offset + last.length === offset) last.length += length;
  else list.push({ offset, length });
}
