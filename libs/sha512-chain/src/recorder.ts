import { assertSegmentSize, type Sha512Chain } from './chain.js';
import {
  advance,
  advanceSync,
  advanceZeros,
  advanceZerosSync,
  DEFAULT_CHAIN_SEGMENT,
  finalizeHex,
  initialState,
  requireAddon,
  SHA512_BLOCK,
  type Sha512State,
} from './state.js';

/** One compression step planned by the recorder: bytes to compress, or a count of zero bytes. */
type Step = Uint8Array | number;

/**
 * Sequential producer of a `Sha512Chain`: feed it the image once, in order (data and holes), and `finish()` gives the
 * SHA-512 plus the chaining state at every segment boundary.
 *
 * `update` / `updateZeros` run the hashing on the libuv thread pool and may be called without waiting (they are applied
 * in call order); the bytes passed to `update` must not change until its promise settles. After a failed update the
 * recorder is unusable. Do not mix `updateSync` with unsettled async updates.
 */
export class Sha512ChainRecorder {
  readonly segmentSize: number;
  private state: Sha512State = initialState();
  /** Bytes compressed into `state` (whole blocks). */
  private compressed = 0;
  /** The bytes of the block being filled (fewer than 128). */
  private readonly partial = Buffer.alloc(SHA512_BLOCK);
  private partialLength = 0;
  private readonly states: Sha512State[] = [];
  private queue: Promise<void> = Promise.resolve();
  private inFlight = 0;
  private failure: unknown;
  private finished = false;

  constructor(segmentSize: number = DEFAULT_CHAIN_SEGMENT) {
    requireAddon();
    assertSegmentSize(segmentSize);
    this.segmentSize = segmentSize;
  }

  /** Bytes fed so far. */
  get size(): number {
    return this.compressed + this.partialLength;
  }

  /** Appends `data`, hashing on the libuv thread pool. */
  update(data: Uint8Array): Promise<void> {
    if (!(data instanceof Uint8Array)) return Promise.reject(new TypeError('data must be a Uint8Array'));
    return this.enqueue(() => this.plan(data));
  }

  /** Appends `length` zero bytes (a hole) without allocating them. */
  updateZeros(length: number): Promise<void> {
    if (!Number.isSafeInteger(length) || length < 0) {
      return Promise.reject(new RangeError(`zero length must be a non-negative safe integer, got ${String(length)}`));
    }
    return this.enqueue(() => this.plan(length));
  }

  /** Appends `data` on the calling thread. */
  updateSync(data: Uint8Array): void {
    if (!(data instanceof Uint8Array)) throw new TypeError('data must be a Uint8Array');
    this.assertUsable();
    if (this.inFlight > 0) throw new Error('updateSync called while asynchronous updates are still running');
    try {
      for (const step of this.plan(data)) {
        this.state = typeof step === 'number' ? advanceZerosSync(this.state, step) : advanceSync(this.state, step);
        this.compressedBlocks(typeof step === 'number' ? step : step.length);
      }
    } catch (err) {
      this.failure = err;
      throw err;
    }
  }

  /**
   * The SHA-512 of the bytes fed so far, without ending the image (updates may follow). Call after every update has
   * settled.
   */
  checksumSoFar(): string {
    this.assertUsable();
    if (this.inFlight > 0) throw new Error('checksumSoFar called while updates are still running');
    return finalizeHex(this.state, this.size, this.partial.subarray(0, this.partialLength));
  }

  /**
   * Removes and returns the states recorded so far (segment boundaries already passed), so that a producer of a long
   * image can keep them compactly; `finish()` then returns only the states recorded after the last call.
   */
  drainStates(): Sha512State[] {
    return this.states.splice(0);
  }

  /** Ends the image and returns its chain. Call after every update has settled. */
  finish(): Sha512Chain {
    this.assertUsable();
    if (this.inFlight > 0) throw new Error('finish called while updates are still running');
    this.finished = true;
    const size = this.size;
    if (size % this.segmentSize !== 0) this.states.push(this.state);
    const checksum = finalizeHex(this.state, size, this.partial.subarray(0, this.partialLength));
    return { segmentSize: this.segmentSize, size, checksum, states: this.states.slice() };
  }

  private assertUsable(): void {
    if (this.finished) throw new Error('the recorder is finished');
    if (this.failure !== undefined) {
      throw new Error(`the recorder failed earlier: ${this.failure instanceof Error ? this.failure.message : String(this.failure)}`);
    }
  }

  private enqueue(makePlan: () => Iterable<Step>): Promise<void> {
    try {
      this.assertUsable();
    } catch (err) {
      return Promise.reject(err);
    }
    this.inFlight++;
    const run = this.queue.then(async () => {
      this.assertUsable();
      try {
        for (const step of makePlan()) {
          this.state = typeof step === 'number' ? await advanceZeros(this.state, step) : await advance(this.state, step);
          this.compressedBlocks(typeof step === 'number' ? step : step.length);
        }
      } catch (err) {
        this.failure ??= err;
        throw err;
      }
    });
    const settled = run.finally(() => {
      this.inFlight--;
    });
    this.queue = settled.catch(() => undefined); // the queue only orders work: each caller gets its own failure through `settled`
    return settled;
  }

  /** Accounts for `length` bytes (whole blocks) just compressed; records the state at a segment boundary. */
  private compressedBlocks(length: number): void {
    this.compressed += length;
    if (length > 0 && this.compressed % this.segmentSize === 0) this.states.push(this.state);
  }

  /**
   * The compression steps for appending `input` (bytes, or a count of zeros): first completing the partial block,
   * then whole blocks cut at segment boundaries, then keeping the remainder as the new partial block. Lazy: each step
   * is planned after the previous one was applied.
   */
  private *plan(input: Uint8Array | number): Generator<Step> {
    const total = typeof input === 'number' ? input : input.length;
    let pos = 0;
    if (this.partialLength > 0) {
      const n = Math.min(SHA512_BLOCK - this.partialLength, total);
      if (typeof input === 'number') this.partial.fill(0, this.partialLength, this.partialLength + n);
      else this.partial.set(input.subarray(0, n), this.partialLength);
      this.partialLength += n;
      pos = n;
      if (this.partialLength < SHA512_BLOCK) return;
      yield this.partial;
      this.partialLength = 0;
    }
    while (total - pos >= SHA512_BLOCK) {
      const wholeBlocks = total - pos - ((total - pos) % SHA512_BLOCK);
      const toBoundary = this.segmentSize - (this.compressed % this.segmentSize);
      const n = Math.min(wholeBlocks, toBoundary);
      yield typeof input === 'number' ? n : input.subarray(pos, pos + n);
      pos += n;
    }
    const rest = total - pos;
    if (rest > 0) {
      if (typeof input === 'number') this.partial.fill(0, 0, rest);
      else this.partial.set(input.subarray(pos), 0);
      this.partialLength = rest;
    }
  }
}
