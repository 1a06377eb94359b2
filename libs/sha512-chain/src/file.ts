import { open, type FileHandle } from 'node:fs/promises';
import { availableParallelism } from 'node:os';
import { getFileLayout, type Extent } from '@bis/block-mapping';
import { assertChain, type Sha512Chain } from './chain.js';
import { Sha512ChainMismatchError } from './errors.js';
import { Sha512ChainRecorder } from './recorder.js';
import { DEFAULT_CHAIN_SEGMENT, multiBufferLanes, requireAddon } from './state.js';
import { Sha512ChainVerifier } from './verifier.js';
import type { Sha512Impl } from './native.js';

/** Read size of `computeFileChain` (1 MiB reads hash fastest, see the toolchain notes). */
export const FILE_CHAIN_READ_SIZE = 1024 * 1024;
/** Holes are hashed in pieces of this size, so a huge hole still reports progress and can be cancelled. */
export const FILE_CHAIN_ZERO_STEP = 64 * 1024 * 1024;

export interface ComputeFileChainOptions {
  /** Distance between recorded states; a multiple of 128. Default `DEFAULT_CHAIN_SEGMENT` (2 MiB). */
  segmentSize?: number;
  /** Cancels the pass; the promise then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Bytes of the file hashed so far (absolute). */
  onProgress?: (bytes: number) => void;
}

export interface VerifyFileChainOptions {
  /**
   * Thread-pool hashing calls at the same time. Default: the number of cores. With the addon's AVX-512 path each call
   * compresses up to eight segments, so up to 8 x concurrency segments are read ahead (one segment buffer each).
   */
  concurrency?: number;
  /** Forces the SHA-512 implementation (see `Sha512ChainVerifierOptions.impl`). */
  impl?: Sha512Impl;
  /** Cancels the verification; the promise then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Bytes of the file verified so far (absolute; segments finish out of order). */
  onProgress?: (bytes: number) => void;
}

interface Region {
  offset: number;
  length: number;
  hole: boolean;
}

function regions(data: readonly Extent[], holes: readonly Extent[]): Region[] {
  return [...data.map((e) => ({ ...e, hole: false })), ...holes.map((e) => ({ ...e, hole: true }))].sort(
    (a, b) => a.offset - b.offset,
  );
}

/** Reads exactly `length` bytes at `position` into `buf`; a short file is an error (it changed under us). */
async function readExactly(fh: FileHandle, path: string, buf: Buffer, length: number, position: number): Promise<void> {
  let done = 0;
  while (done < length) {
    const { bytesRead } = await fh.read(buf, done, length - done, position + done);
    if (bytesRead === 0) {
      throw new Error(`${path} ended at ${position + done} bytes while reading ${length} bytes at ${position}: it changed during hashing`);
    }
    done += bytesRead;
  }
}

/**
 * One sequential pass over `path`: its SHA-512 and the chaining state at every segment boundary. Data is read in 1 MiB
 * pieces (the next read overlaps the hashing of the previous one); holes (from `@bis/block-mapping`) are hashed as
 * zeros without reading.
 */
export async function computeFileChain(path: string, options: ComputeFileChainOptions = {}): Promise<Sha512Chain> {
  requireAddon();
  const { signal, onProgress } = options;
  const recorder = new Sha512ChainRecorder(options.segmentSize ?? DEFAULT_CHAIN_SEGMENT);
  signal?.throwIfAborted();
  const layout = await getFileLayout(path, { signal });
  const fh = await open(path, 'r');
  const buffers = [Buffer.allocUnsafe(FILE_CHAIN_READ_SIZE), Buffer.allocUnsafe(FILE_CHAIN_READ_SIZE)];
  let which = 0;
  let hashing: Promise<void> = Promise.resolve();
  let hashed = 0;
  /** Waits for the hashing in flight, then reports it. */
  const settle = async (): Promise<void> => {
    await hashing;
    onProgress?.(hashed);
  };
  try {
    for (const region of regions(layout.data, layout.holes)) {
      let pos = region.offset;
      const end = region.offset + region.length;
      while (pos < end) {
        signal?.throwIfAborted();
        if (region.hole) {
          const n = Math.min(FILE_CHAIN_ZERO_STEP, end - pos);
          await settle();
          hashing = recorder.updateZeros(n).then(() => void (hashed += n));
          pos += n;
          continue;
        }
        const n = Math.min(FILE_CHAIN_READ_SIZE, end - pos);
        const buf = buffers[which]!;
        which ^= 1;
        // The buffer being filled is not the one the hashing in flight uses.
        await readExactly(fh, path, buf, n, pos);
        await settle();
        hashing = recorder.update(buf.subarray(0, n)).then(() => void (hashed += n));
        pos += n;
      }
    }
    await settle();
    signal?.throwIfAborted();
    const after = await fh.stat();
    if (after.size !== layout.size) {
      throw new Error(`${path} changed size during hashing (${layout.size} -> ${after.size} bytes)`);
    }
    return recorder.finish();
  } finally {
    await hashing.catch(() => undefined); // its failure was already thrown, or the result returned; only wait for it to stop
    await fh.close();
  }
}

/**
 * Verifies `path` against `chain`: every segment is read (holes are not read: a segment inside a hole is verified
 * as zeros) and checked independently, `concurrency` at a time. Resolves with the SHA-512 computed from the verified
 * links (equal to `chain.checksum`); rejects with `Sha512ChainMismatchError` naming the first failing segment found.
 * Compare the result with the checksum you trust (e.g. the BackingImage's): the chain itself is not trusted.
 */
export async function verifyFileChain(path: string, chain: Sha512Chain, options: VerifyFileChainOptions = {}): Promise<string> {
  requireAddon();
  assertChain(chain);
  const { signal, onProgress } = options;
  const concurrency = options.concurrency ?? availableParallelism();
  const verifier = new Sha512ChainVerifier(chain, { concurrency, impl: options.impl });
  signal?.throwIfAborted();
  const layout = await getFileLayout(path, { signal });
  if (layout.size !== chain.size) {
    const segment = Math.max(0, Math.min(verifier.segments - 1, Math.floor(Math.min(layout.size, chain.size) / chain.segmentSize)));
    const { offset, length } = verifier.segments > 0 ? verifier.segmentRange(segment) : { offset: 0, length: 0 };
    throw new Sha512ChainMismatchError(segment, offset, length, `${path} has ${layout.size} bytes but the chain describes ${chain.size}`);
  }
  // Segments that lie entirely inside a hole.
  const inHole = new Uint8Array(verifier.segments);
  for (const hole of layout.holes) {
    const first = Math.ceil(hole.offset / chain.segmentSize);
    for (let k = first; k < verifier.segments; k++) {
      const { offset, length } = verifier.segmentRange(k);
      if (offset + length > hole.offset + hole.length) break;
      inHole[k] = 1;
    }
  }
  const fh = await open(path, 'r');
  const stop = new AbortController();
  let next = 0;
  let verifiedBytes = 0;
  const worker = async (): Promise<void> => {
    const buf = Buffer.allocUnsafe(Math.min(chain.segmentSize, chain.size));
    while (!stop.signal.aborted) {
      signal?.throwIfAborted();
      const k = next++;
      if (k >= verifier.segments) return;
      const { offset, length } = verifier.segmentRange(k);
      if (inHole[k]) {
        await verifier.verifySegment(k, null);
      } else {
        await readExactly(fh, path, buf, length, offset);
        await verifier.verifySegment(k, buf.subarray(0, length));
      }
      // segments hashed together finish together: none counts once the caller has cancelled
      signal?.throwIfAborted();
      verifiedBytes += length;
      onProgress?.(verifiedBytes);
    }
  };
  try {
    // enough segments in flight for the addon to compress eight at a time per call (AVX-512)
    const readers = concurrency * Math.max(1, multiBufferLanes(options.impl));
    const workers = Array.from({ length: Math.min(readers, Math.max(1, verifier.segments)) }, () =>
      worker().catch((err: unknown) => {
        stop.abort();
        throw err;
      }),
    );
    const results = await Promise.allSettled(workers);
    signal?.throwIfAborted();
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
    return verifier.checksum();
  } finally {
    await fh.close();
  }
}
