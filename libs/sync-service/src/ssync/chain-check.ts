import type { FileHandle } from 'node:fs/promises';
import { Sha512ChainVerifier, type Sha512Chain } from '@bis/sha512-chain';
import { SsyncReceiveError } from './receive-error.js';
import type { ReceivedChainStats } from './receiver-types.js';

/** How long a segment may wait for a full eight-segment pass (ms): nobody waits on it any more. */
const VERIFY_PATIENCE_MS = 20;

/**
 * Verification of a received file against the sender's chain. A segment verified from a request body counts only if
 * no other write touched the segment since that request started; every other segment is read back from the file at
 * close, so the checksum always describes the bytes in the file.
 */
export class ChainCheck {
  readonly verifier: Sha512ChainVerifier;
  readonly stats: ReceivedChainStats;
  /** Writes started per segment, and writes running per segment. */
  readonly #epoch: Uint32Array;
  readonly #active: Uint16Array;
  /** The epoch a segment was verified at (0 = not verified). */
  readonly #verifiedAt: Uint32Array;
  readonly #running = new Set<Promise<void>>();
  #failure: Error | undefined;

  constructor(readonly chain: Sha512Chain) {
    this.verifier = new Sha512ChainVerifier(chain, { patienceMs: VERIFY_PATIENCE_MS });
    const n = chain.states.length;
    this.#epoch = new Uint32Array(n);
    this.#active = new Uint16Array(n);
    this.#verifiedAt = new Uint32Array(n);
    this.stats = { segments: n, inFlight: 0, holes: 0, readBack: 0 };
  }

  get segmentSize(): number {
    return this.chain.segmentSize;
  }

  #segments(begin: number, end: number): [number, number] {
    const s = this.chain.segmentSize;
    return [Math.floor(begin / s), Math.ceil(end / s)];
  }

  /** A write of [begin, end) starts: every segment it touches gets a new epoch and one more running write. */
  beginWrite(begin: number, end: number): void {
    const [a, b] = this.#segments(begin, end);
    for (let i = a; i < b; i++) {
      this.#epoch[i]!++;
      this.#active[i]!++;
    }
  }

  endWrite(begin: number, end: number): void {
    const [a, b] = this.#segments(begin, end);
    for (let i = a; i < b; i++) this.#active[i]!--;
  }

  /** Whether [offset, offset + length) is exactly segment `index`. */
  wholeSegment(offset: number, length: number): number | undefined {
    const s = this.chain.segmentSize;
    if (offset % s !== 0) return undefined;
    const i = offset / s;
    return i < this.chain.states.length && length === Math.min(s, this.chain.size - offset) ? i : undefined;
  }

  /**
   * Verifies segment `index` from `data` (or as zeros with null) while a write of it is running (started with
   * `beginWrite`); rejects with Sha512ChainMismatchError.
   */
  async verifyInFlight(index: number, data: Uint8Array | null): Promise<void> {
    const epoch = this.#epoch[index]!;
    const alone = this.#active[index] === 1;
    await this.verifier.verifySegment(index, data);
    // counted only if this request was the only write of the segment from before the check until after it (another
    // write of the same range, even a finished one, may have landed after ours: the segment is then read back at close)
    if (alone && this.#epoch[index] === epoch && this.#active[index] === 1) {
      this.#verifiedAt[index] = epoch;
      if (data === null) this.stats.holes++;
      else this.stats.inFlight++;
    }
  }

  /** Verifies every hole segment inside [begin, end) in the background (a failure fails the receive at close). */
  verifyHoles(begin: number, end: number): Promise<void> {
    const s = this.chain.segmentSize;
    const jobs: Promise<void>[] = [];
    for (let i = Math.ceil(begin / s); i < this.chain.states.length && i * s < end; i++) {
      const { offset, length } = this.verifier.segmentRange(i);
      if (offset + length > end) break;
      jobs.push(this.verifyInFlight(i, null));
    }
    return Promise.all(jobs).then(() => undefined);
  }

  /** Keeps a background verification; its failure is reported by `finish`. */
  track(p: Promise<void>): void {
    const q = p.catch((err: unknown) => {
      this.#failure ??= err as Error;
    });
    this.#running.add(q);
    // `q` never rejects (the failure is recorded above).
    void q.finally(() => this.#running.delete(q));
  }

  get failure(): Error | undefined {
    return this.#failure;
  }

  /**
   * After the last write: reads back and verifies every segment not verified in flight, then returns the checksum
   * computed from the verified links. Rejects with Sha512ChainMismatchError naming the first bad segment.
   */
  async finish(fh: FileHandle, signal?: AbortSignal): Promise<string> {
    while (this.#running.size > 0) await Promise.all([...this.#running]);
    if (this.#failure) throw this.#failure;
    const todo: number[] = [];
    for (let i = 0; i < this.chain.states.length; i++) {
      if (this.#verifiedAt[i] === 0 || this.#verifiedAt[i] !== this.#epoch[i]) todo.push(i);
    }
    let next = 0;
    const worker = async () => {
      const buf = Buffer.allocUnsafe(this.chain.segmentSize);
      while (next < todo.length) {
        signal?.throwIfAborted();
        const i = todo[next++]!;
        const { offset, length } = this.verifier.segmentRange(i);
        let got = 0;
        while (got < length) {
          const { bytesRead } = await fh.read(buf, got, length - got, offset + got);
          if (bytesRead === 0) throw new SsyncReceiveError(`the received file is shorter than expected at ${offset + got}`);
          got += bytesRead;
        }
        await this.verifier.verifySegment(i, buf.subarray(0, length));
        this.stats.readBack++;
      }
    };
    await Promise.all([worker(), worker()]);
    if (!this.verifier.complete()) {
      const pending = this.verifier.pending();
      throw new SsyncReceiveError(`${pending.length} segments of the SHA-512 chain are not verified (first: ${pending[0]})`);
    }
    return this.verifier.checksum();
  }
}
