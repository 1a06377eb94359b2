import { assertChain, type Sha512Chain } from './chain.js';
import { Sha512ChainMismatchError } from './errors.js';
import { Sha512BatchScheduler, sharedSha512Scheduler } from './scheduler.js';
import type { Sha512Impl } from './native.js';
import {
  finalizeHex,
  initialState,
  requireAddon,
  SHA512_BLOCK,
  sameState,
  type Sha512State,
} from './state.js';

export interface Sha512ChainVerifierOptions {
  /**
   * Thread-pool calls at the same time for this verifier alone. Default: none of its own; the verifier uses the
   * process-wide scheduler (as many calls as cores, shared by every verifier, so segments of different files are
   * compressed together eight at a time with AVX-512).
   */
  concurrency?: number;
  /**
   * How long a segment may wait for a full eight-segment pass, ms (default: the scheduler's, 1 ms). A caller that
   * keeps enough segments in flight and does not wait on each one (a receiver that answers before the check ends,
   * a restore with a window of blocks) gets fuller passes, so less CPU per byte, with more.
   */
  patienceMs?: number;
  /**
   * Forces the SHA-512 implementation (`avx512` or `openssl`), with a scheduler of this verifier's own. Default: the
   * process-wide choice (`BIS_SHA512_CHAIN_IMPL`, else AVX-512 where the CPU has it).
   */
  impl?: Sha512Impl;
}

/**
 * Checks the links of a `Sha512Chain` segment by segment, in any order and in parallel. A link holds when the
 * segment's bytes, compressed from the previous recorded state (the SHA-512 IV for segment 0), give the segment's
 * recorded state; the last segment must in addition finalize to the recorded checksum. When every link holds, the
 * checksum is exactly the SHA-512 of the verified bytes: the recorded states need no trust.
 */
export class Sha512ChainVerifier {
  private readonly chain: Sha512Chain;
  private readonly scheduler: Sha512BatchScheduler;
  private readonly patienceMs: number | undefined;
  private readonly verified: Uint8Array;
  private verifiedCount = 0;
  private computed: string | undefined;
  private readonly iv: Sha512State = initialState();

  constructor(chain: Sha512Chain, options: Sha512ChainVerifierOptions = {}) {
    requireAddon();
    assertChain(chain);
    this.scheduler =
      options.concurrency === undefined && options.impl === undefined
        ? sharedSha512Scheduler()
        : new Sha512BatchScheduler({ concurrency: options.concurrency, impl: options.impl });
    if (options.patienceMs !== undefined && !(Number.isFinite(options.patienceMs) && options.patienceMs >= 0)) {
      throw new RangeError(`patienceMs must be a non-negative number, got ${String(options.patienceMs)}`);
    }
    this.patienceMs = options.patienceMs;
    this.chain = chain;
    this.verified = new Uint8Array(chain.states.length);
    if (chain.size === 0) this.computed = finalizeHex(this.iv, 0);
  }

  /** Number of segments. */
  get segments(): number {
    return this.chain.states.length;
  }

  /** Where segment `index` lies in the image. */
  segmentRange(index: number): { offset: number; length: number } {
    if (!Number.isSafeInteger(index) || index < 0 || index >= this.chain.states.length) {
      throw new RangeError(`segment index ${String(index)} is out of range (the chain has ${this.chain.states.length} segments)`);
    }
    const offset = index * this.chain.segmentSize;
    return { offset, length: Math.min(this.chain.segmentSize, this.chain.size - offset) };
  }

  /** The segment holding byte `offset`. */
  segmentAt(offset: number): number {
    if (!Number.isSafeInteger(offset) || offset < 0 || offset >= this.chain.size) {
      throw new RangeError(`offset ${String(offset)} is outside the image (size ${this.chain.size})`);
    }
    return Math.floor(offset / this.chain.segmentSize);
  }

  /**
   * Verifies segment `index` from its bytes (`data`, exactly the segment's length) or, with `null`, as all zeros (a
   * hole). Rejects with `Sha512ChainMismatchError` when the link does not hold; the segment is then pending again.
   * Verifying a segment twice is harmless. Do not change `data` until the promise settles.
   */
  async verifySegment(index: number, data: Uint8Array | null): Promise<void> {
    const { offset, length } = this.segmentRange(index);
    if (data !== null) {
      if (!(data instanceof Uint8Array)) throw new TypeError('segment data must be a Uint8Array or null');
      if (data.length !== length) {
        throw new RangeError(`segment ${index} is ${length} bytes (offset ${offset}), got ${data.length} bytes`);
      }
    }
    const whole = length - (length % SHA512_BLOCK);
    const previous = index === 0 ? this.iv : this.chain.states[index - 1]!;
    const state = await this.scheduler.advance(previous, data === null ? null : data.subarray(0, whole), whole, this.patienceMs);
    if (!sameState(state, this.chain.states[index]!)) {
      this.forget(index);
      throw new Sha512ChainMismatchError(
        index,
        offset,
        length,
        data === null
          ? 'the segment is not all zeros, or the recorded state is wrong'
          : 'its bytes do not lead from the previous recorded state to its recorded state',
      );
    }
    if (index === this.chain.states.length - 1) {
      const tail = data === null ? new Uint8Array(length - whole) : data.subarray(whole);
      const checksum = finalizeHex(state, this.chain.size, tail);
      if (checksum !== this.chain.checksum) {
        this.forget(index);
        throw new Sha512ChainMismatchError(
          index,
          offset,
          length,
          `the last segment finalizes to ${checksum}, not to the recorded checksum ${this.chain.checksum}`,
        );
      }
      this.computed = checksum;
    }
    if (this.verified[index] === 0) {
      this.verified[index] = 1;
      this.verifiedCount++;
    }
  }

  /** Segments not verified yet, ascending. */
  pending(): number[] {
    const out: number[] = [];
    for (let i = 0; i < this.verified.length; i++) if (this.verified[i] === 0) out.push(i);
    return out;
  }

  /** True when every segment is verified. */
  complete(): boolean {
    return this.verifiedCount === this.verified.length;
  }

  /** The SHA-512 (hex) of the image, computed from the verified links; only when `complete()`. */
  checksum(): string {
    if (!this.complete() || this.computed === undefined) {
      const pending = this.pending();
      throw new Error(
        `the chain is not verified yet: ${pending.length} of ${this.verified.length} segments pending (first: ${pending[0]})`,
      );
    }
    return this.computed;
  }

  private forget(index: number): void {
    if (this.verified[index] === 1) {
      this.verified[index] = 0;
      this.verifiedCount--;
    }
    if (index === this.verified.length - 1) this.computed = undefined;
  }
}
