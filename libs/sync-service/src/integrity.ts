import { createHash } from 'node:crypto';
import { open, type FileHandle } from 'node:fs/promises';
import { Transform, type TransformCallback } from 'node:stream';
import { setTimeout as sleepMs } from 'node:timers/promises';
import type { Sha512Chain } from '@bis/sha512-chain';
import { loadBlockMapping, loadSha512Chain } from './lazy-modules.js';

/**
 * Integrity checks of ready files: the background scrub (a throttled re-verification against the SHA-512 chain) and
 * the verification of bytes while they are served (downloads). See docs/reliability.md "Scrub and verify on use".
 */

/** Time source of the scrub's bandwidth cap; tests inject a virtual one. */
export interface ScrubClock {
  /** Milliseconds, monotonic. */
  now(): number;
  /** Resolves after `ms` milliseconds (rejects with the signal's reason when it aborts). */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

export const systemClock: ScrubClock = {
  now: () => performance.now(),
  sleep: (ms, signal) => sleepMs(ms, undefined, { signal }),
};

/**
 * A token bucket over bytes read: `take(n)` spends n tokens and, when the bucket goes into debt, waits until the rate
 * has paid it back. Over any period of t seconds at most `burst + rate × t` bytes are taken.
 */
export class TokenBucket {
  #tokens: number;
  #last: number;

  constructor(
    readonly bytesPerSecond: number,
    readonly burstBytes: number,
    readonly clock: ScrubClock = systemClock,
  ) {
    if (!(bytesPerSecond > 0)) throw new RangeError(`the bandwidth must be positive, got ${bytesPerSecond}`);
    this.#tokens = burstBytes;
    this.#last = clock.now();
  }

  #refill(): void {
    const now = this.clock.now();
    this.#tokens = Math.min(this.burstBytes, this.#tokens + ((now - this.#last) * this.bytesPerSecond) / 1000);
    this.#last = now;
  }

  async take(bytes: number, signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    this.#refill();
    this.#tokens -= bytes;
    if (this.#tokens < 0) {
      await this.clock.sleep((-this.#tokens * 1000) / this.bytesPerSecond, signal);
      this.#refill();
    }
  }
}

/** A copy's bytes do not match its chain or checksum; `segment` is set when the chain located the damage. */
export class CorruptionError extends Error {
  constructor(
    message: string,
    readonly segment?: { index: number; offset: number; length: number },
  ) {
    super(message);
    this.name = 'CorruptionError';
  }
}

/** `SHA-512 chain mismatch in segment 25 (bytes 52428800-54525951)`: inclusive byte range, as operators read it. */
export function segmentMismatchText(index: number, offset: number, length: number): string {
  return `SHA-512 chain mismatch in segment ${index} (bytes ${offset}-${offset + length - 1})`;
}

/** The error a chain verification threw, as a CorruptionError when it is a mismatch; undefined for other errors. */
export function asCorruption(err: unknown): CorruptionError | undefined {
  if (err instanceof CorruptionError) return err;
  if (err instanceof Error && err.name === 'Sha512ChainMismatchError') {
    const e = err as Error & { segment: number; offset: number; length: number };
    return new CorruptionError(segmentMismatchText(e.segment, e.offset, e.length), { index: e.segment, offset: e.offset, length: e.length });
  }
  return undefined;
}

async function readExactly(fh: FileHandle, path: string, buf: Buffer, length: number, position: number): Promise<void> {
  let done = 0;
  while (done < length) {
    const { bytesRead } = await fh.read(buf, done, length - done, position + done);
    if (bytesRead === 0) throw new Error(`${path} ended at ${position + done} bytes while reading ${length} bytes at ${position}`);
    done += bytesRead;
  }
}

export interface ThrottledVerifyOptions {
  /** Every byte read from the disk is taken from this bucket first (holes are not read and cost nothing). */
  bucket?: TokenBucket;
  signal?: AbortSignal;
  /** Bytes read from the disk so far. */
  onRead?: (bytes: number) => void;
}

/**
 * Verifies `path` against `chain` one segment at a time, in file order, reading each data segment once (segments that
 * lie in a hole are verified as zeros without reading). Resolves with the SHA-512 the verified links give (equal to
 * `chain.checksum`); rejects with a CorruptionError naming the first bad segment.
 */
export async function verifyFileThrottled(path: string, chain: Sha512Chain, opts: ThrottledVerifyOptions = {}): Promise<string> {
  const { Sha512ChainVerifier } = await loadSha512Chain();
  const { getFileLayout } = await loadBlockMapping();
  const { signal, bucket } = opts;
  const verifier = new Sha512ChainVerifier(chain);
  const layout = await getFileLayout(path, { signal });
  if (layout.size !== chain.size) {
    throw new CorruptionError(`the file has ${layout.size} bytes but its SHA-512 chain describes ${chain.size}`);
  }
  const inHole = (offset: number, length: number): boolean =>
    layout.holes.some((h) => h.offset <= offset && offset + length <= h.offset + h.length);
  const fh = await open(path, 'r');
  const buf = Buffer.allocUnsafe(Math.max(1, Math.min(chain.segmentSize, chain.size)));
  let read = 0;
  try {
    for (let k = 0; k < verifier.segments; k++) {
      signal?.throwIfAborted();
      const { offset, length } = verifier.segmentRange(k);
      try {
        if (inHole(offset, length)) {
          await verifier.verifySegment(k, null);
        } else {
          await bucket?.take(length, signal);
          await readExactly(fh, path, buf, length, offset);
          read += length;
          opts.onRead?.(read);
          await verifier.verifySegment(k, buf.subarray(0, length));
        }
      } catch (err) {
        throw asCorruption(err) ?? err;
      }
    }
    return verifier.checksum();
  } finally {
    await fh.close();
  }
}

/**
 * The SHA-512 of `path` in one throttled sequential pass (for a copy that has no usable chain), recording its chain
 * when the addon is available. Holes are read like data (the pass is rare: once, then the chain is stored).
 */
export async function hashFileThrottled(path: string, opts: ThrottledVerifyOptions = {}): Promise<{ sha512: string; chain?: Sha512Chain }> {
  const chainLib = await loadSha512Chain();
  const recorder = chainLib.nativeSha512ChainAvailable() ? new chainLib.Sha512ChainRecorder() : undefined;
  const hash = recorder ? undefined : createHash('sha512');
  const fh = await open(path, 'r');
  const size = (await fh.stat()).size;
  const step = 1 << 20;
  const buf = Buffer.allocUnsafe(step);
  try {
    for (let pos = 0; pos < size; pos += step) {
      opts.signal?.throwIfAborted();
      const n = Math.min(step, size - pos);
      await opts.bucket?.take(n, opts.signal);
      await readExactly(fh, path, buf, n, pos);
      opts.onRead?.(pos + n);
      if (recorder) await recorder.update(buf.subarray(0, n));
      else hash!.update(buf.subarray(0, n));
    }
  } finally {
    await fh.close();
  }
  if (recorder) {
    const chain = recorder.finish();
    return { sha512: chain.checksum, chain };
  }
  return { sha512: hash!.digest('hex') };
}

/**
 * A pass-through that releases each chain segment only after it verified, so a client never receives a byte that
 * failed; on a mismatch it calls `onCorrupt` and errors (the HTTP response is then destroyed: the client sees a
 * truncated transfer). Holds one segment (2 MiB) at a time.
 */
export class ChainVerifyingStream extends Transform {
  readonly #chain: Sha512Chain;
  readonly #onCorrupt: (err: CorruptionError) => void;
  #verifier: Promise<import('@bis/sha512-chain').Sha512ChainVerifier>;
  #segment = 0;
  #fill = 0;
  #buf: Buffer;

  constructor(chain: Sha512Chain, onCorrupt: (err: CorruptionError) => void) {
    super();
    this.#chain = chain;
    this.#onCorrupt = onCorrupt;
    this.#verifier = loadSha512Chain().then((m) => new m.Sha512ChainVerifier(chain));
    this.#buf = Buffer.allocUnsafe(this.#segmentLength(0));
  }

  #segmentLength(k: number): number {
    return Math.max(0, Math.min(this.#chain.segmentSize, this.#chain.size - k * this.#chain.segmentSize));
  }

  async #flushSegment(): Promise<void> {
    const v = await this.#verifier;
    const data = this.#buf.subarray(0, this.#fill);
    try {
      await v.verifySegment(this.#segment, data);
    } catch (err) {
      const c = asCorruption(err);
      if (c) this.#onCorrupt(c);
      throw c ?? err;
    }
    this.push(data);
    this.#segment++;
    this.#fill = 0;
    this.#buf = Buffer.allocUnsafe(Math.max(1, this.#segmentLength(this.#segment)));
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    // Its outcome goes to the stream callback `cb` (success or error).
    void (async () => {
      let pos = 0;
      while (pos < chunk.length) {
        const want = this.#segmentLength(this.#segment) - this.#fill;
        if (want <= 0) throw new CorruptionError(`the file has more bytes than its SHA-512 chain describes (${this.#chain.size})`);
        const n = Math.min(want, chunk.length - pos);
        chunk.copy(this.#buf, this.#fill, pos, pos + n);
        this.#fill += n;
        pos += n;
        if (this.#fill === this.#segmentLength(this.#segment)) await this.#flushSegment();
      }
    })().then(() => cb(), (err: Error) => cb(err));
  }

  override _flush(cb: TransformCallback): void {
    // Its outcome goes to the stream callback `cb` (success or error).
    void (async () => {
      const v = await this.#verifier;
      if (this.#segment < v.segments) {
        const c = new CorruptionError(`the file ended at segment ${this.#segment} of the ${v.segments} its SHA-512 chain describes`);
        this.#onCorrupt(c);
        throw c;
      }
    })().then(() => cb(), (err: Error) => cb(err));
  }
}

/**
 * For a copy without a usable chain: a pass-through that hashes every byte and holds back the last chunk until the
 * whole SHA-512 equals `checksum`; on a mismatch it calls `onCorrupt` and errors instead of completing the body.
 */
export class ChecksumVerifyingStream extends Transform {
  readonly #hash = createHash('sha512');
  #held: Buffer | undefined;

  constructor(
    private readonly checksum: string,
    private readonly onCorrupt: (err: CorruptionError) => void,
  ) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.#hash.update(chunk);
    if (this.#held) this.push(this.#held);
    this.#held = chunk;
    cb();
  }

  override _flush(cb: TransformCallback): void {
    const actual = this.#hash.digest('hex');
    if (actual !== this.checksum) {
      const c = new CorruptionError(`SHA-512 mismatch: the served bytes hash to ${actual}, the copy's checksum is ${this.checksum}`);
      this.onCorrupt(c);
      cb(c);
      return;
    }
    if (this.#held) this.push(this.#held);
    cb();
  }
}
