import { open, type FileHandle } from 'node:fs/promises';
import { setImmediate as yieldToEventLoop } from 'node:timers/promises';
import { appendExtent, complementExtents, type Extent, type ExtentBackend, type FileLayout } from './extent.js';
import { nativeAddon, nativeAddonStatus, type BlockMappingAddon } from './native.js';
import { isAllZero } from './zero.js';

/** The zero-scan backend reports holes at this granularity (bytes). */
export const ZERO_SCAN_GRANULARITY = 4096;
/** The zero-scan backend reads the file in chunks of this size (bytes). */
export const ZERO_SCAN_READ_SIZE = 1024 * 1024;
/** The seek-data backend yields to the event loop (and checks the abort signal) after this many extents. */
const SEEK_EXTENTS_PER_TURN = 1024;

export interface LayoutOptions {
  /** Force a backend. `seek-data` fails if the native addon is not loaded. Default: the best available. */
  backend?: ExtentBackend;
  /** Cancels the scan; the promise then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Called as the scan advances: bytes of the file examined so far, and the file size. */
  onProgress?: (scanned: number, size: number) => void;
}

/** Which backend `getFileLayout` uses when none is requested. */
export function extentBackend(): ExtentBackend {
  return nativeAddon() ? 'seek-data' : 'zero-scan';
}

/** Reads where `path` holds data and where it has holes. */
export async function getFileLayout(path: string, opts: LayoutOptions = {}): Promise<FileLayout> {
  opts.signal?.throwIfAborted();
  const requested = opts.backend;
  if (requested !== undefined && requested !== 'seek-data' && requested !== 'zero-scan') {
    throw new TypeError(`unknown extent backend "${String(requested)}" (expected "seek-data" or "zero-scan")`);
  }
  const addon = nativeAddon();
  if (requested === 'seek-data' && !addon) {
    throw new Error(`extent backend "seek-data" is not available: ${nativeAddonStatus()}`);
  }
  const fh = await open(path, 'r');
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw new Error(`cannot map extents of ${path}: not a regular file`);
    const size = st.size;
    let data: Extent[];
    let backend: ExtentBackend;
    if (addon && requested !== 'zero-scan') {
      data = await seekDataExtents(addon, fh, path, size, opts);
      backend = 'seek-data';
    } else {
      data = await zeroScanExtents(fh, path, size, opts);
      backend = 'zero-scan';
    }
    opts.onProgress?.(size, size);
    return { size, data, holes: complementExtents(data, size), backend };
  } finally {
    await fh.close();
  }
}

/** The data extents of `path` (see `getFileLayout`). */
export async function getDataExtents(path: string, opts: LayoutOptions = {}): Promise<Extent[]> {
  return (await getFileLayout(path, opts)).data;
}

async function seekDataExtents(
  addon: BlockMappingAddon,
  fh: FileHandle,
  path: string,
  size: number,
  opts: LayoutOptions,
): Promise<Extent[]> {
  const data: Extent[] = [];
  let pos = 0;
  let turns = 0;
  try {
    while (pos < size) {
      const start = addon.seekData(fh.fd, pos);
      if (start < 0 || start >= size) break;
      const holeAt = addon.seekHole(fh.fd, start);
      const end = holeAt < 0 || holeAt > size ? size : holeAt;
      if (end <= start) break; // the file shrank under us; what is left is a hole
      appendExtent(data, start, end - start);
      pos = end;
      if (++turns % SEEK_EXTENTS_PER_TURN === 0) {
        opts.onProgress?.(pos, size);
        await yieldToEventLoop();
        opts.signal?.throwIfAborted();
      }
    }
  } catch (err) {
    if (err instanceof Error && 'syscall' in err) {
      throw new Error(`cannot map extents of ${path}: ${err.message}`, { cause: err });
    }
    throw err;
  }
  return data;
}

async function zeroScanExtents(fh: FileHandle, path: string, size: number, opts: LayoutOptions): Promise<Extent[]> {
  const data: Extent[] = [];
  const buf = Buffer.allocUnsafe(ZERO_SCAN_READ_SIZE);
  for (let chunkStart = 0; chunkStart < size; chunkStart += ZERO_SCAN_READ_SIZE) {
    opts.signal?.throwIfAborted();
    const want = Math.min(ZERO_SCAN_READ_SIZE, size - chunkStart);
    let got = 0;
    while (got < want) {
      const { bytesRead } = await fh.read(buf, got, want - got, chunkStart + got);
      if (bytesRead === 0) {
        throw new Error(
          `cannot map extents of ${path}: the file ended at ${chunkStart + got} bytes while scanning, ` +
            `but its size was ${size} when the scan began`,
        );
      }
      got += bytesRead;
    }
    const chunk = buf.subarray(0, want);
    if (!isAllZero(chunk)) {
      for (let off = 0; off < want; off += ZERO_SCAN_GRANULARITY) {
        const len = Math.min(ZERO_SCAN_GRANULARITY, want - off);
        if (!isAllZero(chunk.subarray(off, off + len))) appendExtent(data, chunkStart + off, len);
      }
    }
    opts.onProgress?.(chunkStart + want, size);
  }
  return data;
}
