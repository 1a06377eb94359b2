const ZERO_PAGE = Buffer.alloc(64 * 1024);

/**
 * True when every byte of `buf` is zero. Compares 64 KiB slices against a shared zero buffer with `Buffer.compare`
 * (memcmp in C++), after a cheap check of the first and last byte.
 */
export function isAllZero(buf: Uint8Array): boolean {
  const n = buf.byteLength;
  if (n === 0) return true;
  if (buf[0] !== 0 || buf[n - 1] !== 0) return false;
  for (let off = 0; off < n; off += ZERO_PAGE.length) {
    const len = Math.min(ZERO_PAGE.length, n - off);
    if (Buffer.compare(buf.subarray(off, off + len), ZERO_PAGE.subarray(0, len)) !== 0) return false;
  }
  return true;
}
