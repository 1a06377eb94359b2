/**
 * The parts of the LZ4 frame format the engine handles itself (everything else goes to `lz4-napi`):
 *
 * - writing a frame whose one data block is stored *uncompressed* (block-size high bit set), which is what any LZ4
 *   frame writer (lz4_flex, pierrec/lz4, the reference `lz4` tool) emits for incompressible data, with the same
 *   header Longhorn writes (FLG 0x64: independent blocks + content checksum, BD 0x70: 4 MB blocks) and the xxh32
 *   content checksum;
 * - recognising such a frame when reading, so that its data is used in place instead of being copied by a
 *   decompressor.
 *
 * The functions are self-contained (no imports, no closures) because the block worker threads run their source text.
 */

/** xxHash32 of `data` (the LZ4 frame content checksum and header checksum). */
export function xxh32(data: Uint8Array, seed: number): number {
  const P1 = 2654435761 | 0;
  const P2 = 2246822519 | 0;
  const P3 = 3266489917 | 0;
  const P4 = 668265263;
  const P5 = 374761393;
  const len = data.byteLength;
  const dv = new DataView(data.buffer, data.byteOffset, len);
  let i = 0;
  let h: number;
  if (len >= 16) {
    let v1 = (seed + P1 + P2) | 0;
    let v2 = (seed + P2) | 0;
    let v3 = seed | 0;
    let v4 = (seed - P1) | 0;
    const limit = len - 16;
    // Aligned little-endian input (every slot of the engine's pools) is read as 32-bit words, much faster than DataView.
    const littleEndian = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
    if (littleEndian && (data.byteOffset & 3) === 0) {
      const w = new Int32Array(data.buffer, data.byteOffset, len >>> 2);
      for (let j = 0; i <= limit; i += 16, j += 4) {
        v1 = (v1 + Math.imul(w[j] as number, P2)) | 0;
        v1 = Math.imul((v1 << 13) | (v1 >>> 19), P1);
        v2 = (v2 + Math.imul(w[j + 1] as number, P2)) | 0;
        v2 = Math.imul((v2 << 13) | (v2 >>> 19), P1);
        v3 = (v3 + Math.imul(w[j + 2] as number, P2)) | 0;
        v3 = Math.imul((v3 << 13) | (v3 >>> 19), P1);
        v4 = (v4 + Math.imul(w[j + 3] as number, P2)) | 0;
        v4 = Math.imul((v4 << 13) | (v4 >>> 19), P1);
      }
    }
    for (; i <= limit; i += 16) {
      v1 = (v1 + Math.imul(dv.getUint32(i, true), P2)) | 0;
      v1 = Math.imul((v1 << 13) | (v1 >>> 19), P1);
      v2 = (v2 + Math.imul(dv.getUint32(i + 4, true), P2)) | 0;
      v2 = Math.imul((v2 << 13) | (v2 >>> 19), P1);
      v3 = (v3 + Math.imul(dv.getUint32(i + 8, true), P2)) | 0;
      v3 = Math.imul((v3 << 13) | (v3 >>> 19), P1);
      v4 = (v4 + Math.imul(dv.getUint32(i + 12, true), P2)) | 0;
      v4 = Math.imul((v4 << 13) | (v4 >>> 19), P1);
    }
    h = (((v1 << 1) | (v1 >>> 31)) + ((v2 << 7) | (v2 >>> 25)) + ((v3 << 12) | (v3 >>> 20)) + ((v4 << 18) | (v4 >>> 14))) | 0;
  } else {
    h = (seed + P5) | 0;
  }
  h = (h + len) | 0;
  for (; i + 4 <= len; i += 4) {
    h = (h + Math.imul(dv.getUint32(i, true), P3)) | 0;
    h = Math.imul((h << 17) | (h >>> 15), P4);
  }
  for (; i < len; i++) {
    h = (h + Math.imul(data[i] as number, P5)) | 0;
    h = Math.imul((h << 11) | (h >>> 21), P1);
  }
  h ^= h >>> 15;
  h = Math.imul(h, P2);
  h ^= h >>> 13;
  h = Math.imul(h, P3);
  h ^= h >>> 16;
  return h >>> 0;
}

/** Bytes an uncompressed-block frame adds around `n` bytes of data (`n` > 0): 7 header, 4 block size, 4 end mark, 4 checksum. */
export const STORED_FRAME_OVERHEAD = 19;

/**
 * Writes into `out` (at `outOffset`) an LZ4 frame holding `data` as one uncompressed block, exactly as lz4_flex (and
 * so `lz4-napi`'s `compressFrame`) writes incompressible input: magic, FLG 0x64, BD 0x70, header checksum 0xB9, block
 * size with the high bit set, the data, the end mark and the xxh32 content checksum. Returns the frame's length.
 * `xxh` is `xxh32(data, 0)` (passed in so the caller decides where the function comes from).
 */
export function writeStoredFrame(data: Uint8Array, out: Uint8Array, outOffset: number, xxh: number): number {
  const n = data.byteLength;
  if (n === 0 || n > 4 * 1024 * 1024) throw new RangeError(`an uncompressed LZ4 frame block holds 1 to 4194304 bytes, not ${n}`);
  const dv = new DataView(out.buffer, out.byteOffset + outOffset, n + 19);
  dv.setUint32(0, 0x184d2204, true);
  dv.setUint8(4, 0x64);
  dv.setUint8(5, 0x70);
  dv.setUint8(6, 0xb9);
  dv.setUint32(7, (n | 0x80000000) >>> 0, true);
  out.set(data, outOffset + 11);
  dv.setUint32(11 + n, 0, true);
  dv.setUint32(15 + n, xxh, true);
  return n + 19;
}

/** Header (7) + block size (4) of an uncompressed-block frame, and its end mark (4) + content checksum (4). */
export const STORED_FRAME_HEADER = 11;
export const STORED_FRAME_TRAILER = 8;

/**
 * The same frame as {@link writeStoredFrame} without copying the data: writes the 11-byte header and then the 8-byte
 * trailer back to back into `out` at `outOffset`, for a vectored write of header, data, trailer. Returns 19 + n.
 */
export function writeStoredFrameEnds(n: number, out: Uint8Array, outOffset: number, xxh: number): number {
  if (n === 0 || n > 4 * 1024 * 1024) throw new RangeError(`an uncompressed LZ4 frame block holds 1 to 4194304 bytes, not ${n}`);
  const dv = new DataView(out.buffer, out.byteOffset + outOffset, 19);
  dv.setUint32(0, 0x184d2204, true);
  dv.setUint8(4, 0x64);
  dv.setUint8(5, 0x70);
  dv.setUint8(6, 0xb9);
  dv.setUint32(7, (n | 0x80000000) >>> 0, true);
  dv.setUint32(11, 0, true);
  dv.setUint32(15, xxh, true);
  return n + 19;
}

/**
 * When `frame` is exactly one LZ4 frame whose data is a single uncompressed block (or no block at all), returns
 * `[offset, length]` of the data inside `frame`; otherwise (compressed blocks, several blocks, dictionaries, trailing
 * bytes, a malformed header) returns undefined and the caller decompresses it normally. Neither the header checksum
 * nor the content checksum is checked here: the caller verifies the data against its SHA-512 block name, which is
 * the stronger check.
 */
export function storedFrameData(frame: Uint8Array): [number, number] | undefined {
  const len = frame.byteLength;
  if (len < 11) return undefined;
  const dv = new DataView(frame.buffer, frame.byteOffset, len);
  if (dv.getUint32(0, true) !== 0x184d2204) return undefined;
  const flg = dv.getUint8(4);
  if ((flg & 0xc0) !== 0x40 || (flg & 0x03) !== 0) return undefined; // version 01, no dictionary, reserved bit clear
  const blockChecksums = (flg & 0x10) !== 0;
  const contentSize = (flg & 0x08) !== 0;
  const contentChecksum = (flg & 0x04) !== 0;
  let p = 6 + (contentSize ? 8 : 0) + 1; // FLG BD [content size] HC
  if (p + 4 > len) return undefined;
  const first = dv.getUint32(p, true);
  p += 4;
  if (first === 0) {
    return p + (contentChecksum ? 4 : 0) === len ? [p, 0] : undefined;
  }
  if ((first & 0x80000000) === 0) return undefined; // a compressed block
  const n = first & 0x7fffffff;
  const dataOffset = p;
  p += n + (blockChecksums ? 4 : 0);
  if (p + 4 > len || dv.getUint32(p, true) !== 0) return undefined; // more than one block, or truncated
  p += 4 + (contentChecksum ? 4 : 0);
  return p === len ? [dataOffset, n] : undefined;
}

/**
 * Decodes one whole LZ4 frame (compressed and uncompressed blocks, linked or independent, with or without block and
 * content checksums, which are skipped) into `dst`, returning the number of bytes written. Returns -1 when the input
 * is not exactly one well-formed frame or its content does not fit into `dst`; the caller then falls back to the
 * native decoder (which reports the precise error). Checksums are not verified here: the caller checks the output
 * against its SHA-512 block name.
 */
export function decodeFrameInto(src: Uint8Array, dst: Uint8Array): number {
  const len = src.byteLength;
  if (len < 7) return -1;
  const dv = new DataView(src.buffer, src.byteOffset, len);
  if (dv.getUint32(0, true) !== 0x184d2204) return -1;
  const flg = src[4] as number;
  if ((flg & 0xc0) !== 0x40 || (flg & 0x03) !== 0) return -1;
  const blockChecksums = (flg & 0x10) !== 0;
  const contentChecksum = (flg & 0x04) !== 0;
  let ip = 6 + ((flg & 0x08) !== 0 ? 8 : 0) + 1;
  const cap = dst.byteLength;
  let op = 0;
  for (;;) {
    if (ip + 4 > len) return -1;
    const word = dv.getUint32(ip, true);
    ip += 4;
    if (word === 0) break;
    const size = word & 0x7fffffff;
    const end = ip + size;
    if (end + (blockChecksums ? 4 : 0) > len) return -1;
    if ((word & 0x80000000) !== 0) {
      if (op + size > cap) return -1;
      dst.set(src.subarray(ip, end), op);
      op += size;
    } else {
      while (ip < end) {
        const token = src[ip++] as number;
        let lit = token >>> 4;
        if (lit === 15) {
          let b: number;
          do {
            if (ip >= end) return -1;
            b = src[ip++] as number;
            lit += b;
          } while (b === 255);
        }
        if (ip + lit > end || op + lit > cap) return -1;
        if (lit > 32) dst.set(src.subarray(ip, ip + lit), op);
        else for (let k = 0; k < lit; k++) dst[op + k] = src[ip + k] as number;
        ip += lit;
        op += lit;
        if (ip === end) break; // the last sequence has literals only
        if (ip + 2 > end) return -1;
        const offset = (src[ip] as number) | ((src[ip + 1] as number) << 8);
        ip += 2;
        if (offset === 0 || offset > op) return -1;
        let match = (token & 15) + 4;
        if (match === 19) {
          let b: number;
          do {
            if (ip >= end) return -1;
            b = src[ip++] as number;
            match += b;
          } while (b === 255);
        }
        if (op + match > cap) return -1;
        let from = op - offset;
        if (offset >= match && match > 32) {
          dst.copyWithin(op, from, from + match);
          op += match;
        } else if (offset >= 32) {
          // Overlapping, but in steps of `offset` bytes each copy reads only bytes already written.
          while (match > 0) {
            const n = Math.min(match, offset);
            dst.copyWithin(op, from, from + n);
            op += n;
            from += n;
            match -= n;
          }
        } else {
          for (let k = 0; k < match; k++) dst[op + k] = dst[from + k] as number;
          op += match;
        }
      }
      if (ip !== end) return -1;
    }
    ip = end + (blockChecksums ? 4 : 0);
  }
  if (ip + (contentChecksum ? 4 : 0) !== len) return -1;
  return op;
}
