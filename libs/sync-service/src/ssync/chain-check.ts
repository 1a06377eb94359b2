import type { FileHandle } from 'node:fs/promises';
import { Sha512ChainVerifier, type Sha512Chain } from '@bis/sha512-chain';
import { SsyncReceiveError } from './receive-error.js';
import type { ReceivedChainStats } from './receiver-types.js';

/** What a final segment holds: all hole, or bytes to read from the file. */
export type SegmentKind = 'hole' | 'data';

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
  /** What a segment verified in flight held: 1 = hole, 2 = data (0 = not verified in flight). */
  readonly #kind: Uint8Array;
  /** Whom to tell when a segment is final (see {@link whenFinal}). */
  readonly #finalWaiters = new Map<number, { resolve: (k: SegmentKind) => void; reject: (e: Error) => void }[]>();
  /** Set when every segment is final (after a successful finish), or the failure that ended the receive. */
  #settled: { ok: true } | { ok: false; err: Error } | undefined;
  /** Bytes of each segment covered by ended writes (overlapping writes count twice: only a hint, see #readEarly). */
  readonly #covered: Float64Array;
  /** The received file, for an early check (set by the receive; undefined until the file is open). */
  #file: (() => FileHandle | undefined) | undefined;
  /** Segments being read back early for a waiting forwarder. */
  readonly #early = new Set<number>();

  constructor(readonly chain: Sha512Chain) {
    this.verifier = new Sha512ChainVerifier(chain, { patienceMs: VERIFY_PATIENCE_MS });
    const n = chain.states.length;
    this.#epoch = new Uint32Array(n);
    this.#active = new Uint16Array(n);
    this.#verifiedAt = new Uint32Array(n);
    this.#kind = new Uint8Array(n);
    this.#covered = new Float64Array(n);
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
    const s = this.chain.segmentSize;
    for (let i = a; i < b; i++) {
      this.#active[i]!--;
      this.#covered[i]! += Math.min(end, (i + 1) * s) - Math.max(begin, i * s);
      if (this.#isFinal(i)) this.#wake(i, this.#kind[i] === 1 ? 'hole' : 'data');
      else if (this.#finalWaiters.has(i)) this.#readEarly(i);
    }
  }

  /** Where the received file is read for an early check of a segment received in pieces (see {@link whenFinal}). */
  setFile(file: () => FileHandle | undefined): void {
    this.#file = file;
  }

  /** Reads segment `i` from `fh` into `buf` (at least a segment long); the segment's bytes. */
  async #readSegment(fh: FileHandle, i: number, buf: Buffer): Promise<Buffer> {
    const { offset, length } = this.verifier.segmentRange(i);
    let got = 0;
    while (got < length) {
      const { bytesRead } = await fh.read(buf, got, length - got, offset + got);
      if (bytesRead === 0) throw new SsyncReceiveError(`the received file is shorter than expected at ${offset + got}`);
      got += bytesRead;
    }
    return buf.subarray(0, length);
  }

  /**
   * A segment received in pieces (data and holes, or unaligned requests) that a forwarder waits for: once its pieces
   * cover it and no write runs, it is read back from the file and verified now rather than at close. A failure here
   * is no verdict (a piece may still be missing where overlapping writes were counted twice): the segment is then
   * checked at close like any other.
   */
  #readEarly(i: number): void {
    const fh = this.#file?.();
    if (!fh || this.#settled || this.#early.has(i) || this.#active[i] !== 0 || this.#covered[i]! < this.verifier.segmentRange(i).length) return;
    const epoch = this.#epoch[i]!;
    this.#early.add(i);
    void (async () => {
      try {
        const data = await this.#readSegment(fh, i, Buffer.allocUnsafe(this.verifier.segmentRange(i).length));
        if (this.#epoch[i] !== epoch || this.#active[i] !== 0) return; // written meanwhile: checked again later
        await this.verifier.verifySegment(i, data);
        if (this.#epoch[i] !== epoch || this.#active[i] !== 0 || this.#settled) return;
        this.#verifiedAt[i] = epoch;
        this.#kind[i] = 2;
        this.stats.readBack++;
        this.#wake(i, 'data');
      } catch {
        // no verdict: the segment is read back and checked at close (a mismatch then fails the receive)
      } finally {
        this.#early.delete(i);
      }
    })();
  }

  /** Verified in flight and no write running or started since: the bytes in the file are the chain's. */
  #isFinal(i: number): boolean {
    return this.#active[i] === 0 && this.#verifiedAt[i] !== 0 && this.#verifiedAt[i] === this.#epoch[i];
  }

  #wake(i: number, kind: SegmentKind): void {
    const waiters = this.#finalWaiters.get(i);
    if (!waiters) return;
    this.#finalWaiters.delete(i);
    for (const w of waiters) w.resolve(kind);
  }

  /**
   * Resolves once segment `index` is in the file and verified against the chain (`hole`: it was received as a hole
   * and is one; `data`: read it from the file), so that a forwarding sender may send it on while the rest is still
   * being received. A segment verified in flight is final when its last write ended; a segment received in pieces
   * once they cover it and it was read back and verified (at the latest when the receive completes). Rejects when the
   * receive fails.
   */
  whenFinal(index: number): Promise<SegmentKind> {
    if (!Number.isSafeInteger(index) || index < 0 || index >= this.chain.states.length) {
      return Promise.reject(new RangeError(`no segment ${index} in a chain of ${this.chain.states.length}`));
    }
    if (this.#settled && !this.#settled.ok) return Promise.reject(this.#settled.err);
    if (this.#isFinal(index)) return Promise.resolve(this.#kind[index] === 1 ? 'hole' : 'data');
    if (this.#settled?.ok) return Promise.resolve('data');
    const waiting = new Promise<SegmentKind>((resolve, reject) => {
      const list = this.#finalWaiters.get(index) ?? [];
      list.push({ resolve, reject });
      this.#finalWaiters.set(index, list);
    });
    this.#readEarly(index);
    return waiting;
  }

  /** The receive ended: every waiter learns the outcome (success: every segment is final, read it from the file). */
  settle(err: Error | undefined): void {
    if (this.#settled) return;
    this.#settled = err ? { ok: false, err } : { ok: true };
    const waiters = [...this.#finalWaiters];
    this.#finalWaiters.clear();
    for (const [i, list] of waiters) {
      for (const w of list) {
        if (err) w.reject(err);
        else w.resolve(this.#isFinal(i) && this.#kind[i] === 1 ? 'hole' : 'data');
      }
    }
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
      this.#kind[index] = data === null ? 1 : 2;
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
    // Buffers as large as the largest segment to read, not the segment size: a small file's receive would otherwise
    // allocate two segments (4 MiB) to verify nothing or a few KiB, and every fresh buffer pushes V8 towards a full
    // garbage collection (one every few receives when many small images were synced).
    let largest = 0;
    for (const i of todo) largest = Math.max(largest, this.verifier.segmentRange(i).length);
    const worker = async () => {
      const buf = Buffer.allocUnsafe(largest);
      while (next < todo.length) {
        signal?.throwIfAborted();
        const i = todo[next++]!;
        await this.verifier.verifySegment(i, await this.#readSegment(fh, i, buf));
        this.stats.readBack++;
      }
    };
    await Promise.all(Array.from({ length: Math.min(2, todo.length) }, worker));
    if (!this.verifier.complete()) {
      const pending = this.verifier.pending();
      throw new SsyncReceiveError(`${pending.length} segments of the SHA-512 chain are not verified (first: ${pending[0]})`);
    }
    return this.verifier.checksum();
  }
}
