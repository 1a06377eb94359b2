import type { promises as fsp } from 'node:fs';
import { HashWorker } from '@bis/file-sources/core';
import { nativeSha512ChainAvailable, Sha512ChainRecorder, type Sha512Chain } from '@bis/sha512-chain';

/** The in-order SHA-512 the hasher feeds: a worker thread, or a chain recorder (thread pool) that also keeps states. */
interface SequentialSha512 {
  update(buffer: ArrayBufferLike, offset: number, length: number): Promise<void>;
  /** Whether the hashing happens in another thread that needs the bytes in shared memory. */
  readonly needsSharedMemory: boolean;
  /** SHA-512 (hex) of everything fed since the start or the last reset. */
  digest(): Promise<string>;
  reset(): Promise<void>;
  close(): Promise<void>;
  /** The chain recorded with the last digest, when this hasher records one. */
  readonly chain: Sha512Chain | undefined;
}

class WorkerSha512 implements SequentialSha512 {
  readonly #hashWorker = new HashWorker(['sha512']);
  readonly chain = undefined;
  readonly needsSharedMemory = true;
  update(buffer: ArrayBufferLike, offset: number, length: number): Promise<void> {
    if (!(buffer instanceof SharedArrayBuffer)) return Promise.reject(new TypeError('the hash worker needs shared memory'));
    return this.#hashWorker.update(buffer, offset, length);
  }
  async digest(): Promise<string> {
    const [sha512] = await this.#hashWorker.digest();
    return sha512!;
  }
  reset(): Promise<void> {
    return this.#hashWorker.reset();
  }
  close(): Promise<void> {
    return this.#hashWorker.close();
  }
}

/** SHA-512 on the libuv thread pool with the chaining states recorded in the same pass (`@bis/sha512-chain`). */
class RecordingSha512 implements SequentialSha512 {
  #recorder = new Sha512ChainRecorder();
  #pending = new Set<Promise<void>>();
  chain: Sha512Chain | undefined;
  readonly needsSharedMemory = false;
  update(buffer: ArrayBufferLike, offset: number, length: number): Promise<void> {
    if (length === 0) return Promise.resolve();
    const p = this.#recorder.update(new Uint8Array(buffer, offset, length));
    const settled = p.catch(() => undefined); // the caller gets the failure through `p`; `settled` only tracks completion
    this.#pending.add(settled);
    // `settled` never rejects.
    void settled.finally(() => this.#pending.delete(settled));
    return p;
  }
  async digest(): Promise<string> {
    await Promise.all([...this.#pending]);
    this.chain = this.#recorder.finish();
    return this.chain.checksum;
  }
  async reset(): Promise<void> {
    await Promise.all([...this.#pending]);
    this.#recorder = new Sha512ChainRecorder();
    this.chain = undefined;
  }
  async close(): Promise<void> {
    await Promise.all([...this.#pending]);
  }
}

/** Bytes per slab (one `writeData` body of Longhorn's sender). */
export const RECEIVE_SLAB_SIZE = 2 << 20;
/** Slabs per receiver: bounds the in-order window (memory = slabs × slab size). */
export const RECEIVE_SLABS = 4;

/** A buffer that holds received bytes until they are written and hashed. */
export class Slab {
  /**
   * `buffer` is over shared memory only when a worker thread must see the bytes: copying into shared memory uses V8's
   * slower relaxed (atomic-safe) memmove, so plain memory is used whenever hashing runs on the thread pool instead. It
   * may start anywhere in its memory (an aligned start for direct writes).
   */
  constructor(readonly buffer: Buffer) {}
}

/** Allocates a slab buffer of `size` bytes, over shared memory when `shared`. */
export type SlabAllocator = (size: number, shared: boolean) => Buffer;

const plainSlabMemory: SlabAllocator = (size, shared) => Buffer.from(shared ? new SharedArrayBuffer(size) : new ArrayBuffer(size));

/** What the hasher did, for diagnostics and the benchmark. */
export interface ReceivedHashStats {
  /** Data bytes hashed from memory, in order, while receiving. */
  inOrderBytes: number;
  /** Hole bytes hashed from the shared zero buffer (never read from disk). */
  holeBytes: number;
  /** Data bytes whose slab had to be reused before their turn came: read back from the file. */
  readBackBytes: number;
  /** Whole-file bytes read by the post-pass (only when a range arrived twice and the in-order hash was dropped). */
  postPassBytes: number;
}

interface Piece {
  end: number;
  kind: 'data' | 'hole';
  /** The slab still holding the bytes, or null: read them back from the file. */
  slab: Slab | null;
}

/**
 * Computes the SHA-512 of a file that a receiver writes in ranges arriving out of order from parallel senders,
 * while it is being received: ranges are hashed in file order on a worker thread. Data ranges are hashed from the
 * slab they were written from while the worker keeps up; receiving never waits for hashing: when every slab is taken,
 * the slab of the retained range farthest ahead is reclaimed and that range is read back from the file (the page
 * cache) when its turn comes. Holes are hashed from a shared zero buffer and never read. A range that arrives twice
 * (a retried request) drops the in-order hash: the file is then hashed in one post-pass.
 */
export class ReceivedFileHasher {
  readonly stats: ReceivedHashStats = { inOrderBytes: 0, holeBytes: 0, readBackBytes: 0, postPassBytes: 0 };
  readonly #worker: SequentialSha512 = nativeSha512ChainAvailable() ? new RecordingSha512() : new WorkerSha512();
  readonly #slabSize: number;
  readonly #free: Slab[] = [];
  /** Slabs that may still be allocated: they are made when first needed (a receive that takes the sender's chain a
   * moment after it opens, or a small file, never needs all of them; allocating 12 MiB per receive up front cost the
   * managers most of their garbage-collection time when many small images were synced). */
  #unallocated: number;
  readonly #allocate: SlabAllocator;
  readonly #shared: boolean;
  readonly #waitingForSlab: Array<{ begin: number; resolve: (s: Slab) => void; reject: (e: Error) => void }> = [];
  #stopped: Error | undefined;
  /** Used only to read ranges back from the file and for the post-pass (made when first needed). */
  #readSlabMemo: Slab | undefined;
  readonly #pieces = new Map<number, Piece>();
  /** Written ranges not yet hashed that still hold a slab (candidates for reclaiming), by begin. */
  readonly #retained = new Set<number>();
  /** Ranges being written right now. */
  readonly #inflight = new Map<number, number>();
  /** Zeros that holes are hashed from (made when first needed). */
  #zeroMemo: Buffer | undefined;
  readonly #fh: () => fsp.FileHandle | undefined;
  /** Everything before this offset was submitted to the worker. */
  #next = 0;
  /** Recorded (written) ranges, to detect a range that arrives twice. Kept as begin → end of merged runs. */
  readonly #recorded: Array<[number, number]> = [];
  #valid = true;
  /** Bytes submitted to the worker and not hashed yet, and the most that may be. */
  #queuedBytes = 0;
  readonly #queueLimit: number;
  readonly #outstanding = new Set<Promise<void>>();
  #readingBack = false;
  #failure: Error | undefined;
  #closed = false;

  constructor(opts: { fileHandle: () => fsp.FileHandle | undefined; slabSize?: number; slabs?: number; allocate?: SlabAllocator }) {
    this.#fh = opts.fileHandle;
    this.#slabSize = opts.slabSize ?? RECEIVE_SLAB_SIZE;
    const n = Math.max(2, opts.slabs ?? RECEIVE_SLABS);
    this.#allocate = opts.allocate ?? plainSlabMemory;
    this.#shared = this.#worker.needsSharedMemory;
    this.#unallocated = n;
    this.#queueLimit = 2 * this.#slabSize;
  }

  get slabSize(): number {
    return this.#slabSize;
  }

  /** The SHA-512 chain recorded with the digest (when the chain addon is available). */
  get chain(): Sha512Chain | undefined {
    return this.#worker.chain;
  }

  /** Whether the in-order hash still stands (false after a range arrived twice). */
  get inOrder(): boolean {
    return this.#valid;
  }

  /**
   * A free slab for bytes that go to `begin`. When none is free, the slab of the retained range farthest ahead is
   * reclaimed (that range is read back from the file when its turn comes), so receiving never waits for hashing;
   * only when every slab is being filled or is queued at the worker, the request waits, and a released slab goes to
   * the waiting request nearest the start of the file.
   */
  async acquire(begin: number): Promise<Slab> {
    if (this.#stopped) throw this.#stopped;
    const s = this.#free.pop() ?? this.#newSlab() ?? this.#reclaim();
    if (s) return s;
    return new Promise<Slab>((resolve, reject) => {
      this.#waitingForSlab.push({ begin, resolve, reject });
      this.#waitingForSlab.sort((x, y) => x.begin - y.begin);
    });
  }

  /** One more slab while fewer than the limit were made. */
  #newSlab(): Slab | undefined {
    if (this.#unallocated <= 0) return undefined;
    this.#unallocated--;
    return new Slab(this.#allocate(this.#slabSize, this.#shared));
  }

  get #zero(): Buffer {
    return (this.#zeroMemo ??= plainSlabMemory(this.#slabSize, this.#shared));
  }

  get #readSlab(): Slab {
    return (this.#readSlabMemo ??= new Slab(plainSlabMemory(this.#slabSize, this.#shared)));
  }

  /** Gives back a slab whose bytes are no longer needed. */
  release(s: Slab): void {
    const w = this.#waitingForSlab.shift();
    if (w) w.resolve(s);
    else this.#free.push(s);
  }

  /** Hands retained slabs to waiting requests (a range was recorded while requests waited). */
  #serveWaiters(): void {
    while (this.#waitingForSlab.length > 0) {
      const slab = this.#reclaim();
      if (!slab) return;
      this.#waitingForSlab.shift()!.resolve(slab);
    }
  }

  /** Takes the slab of the retained range farthest ahead; that range will be read back from the file. */
  #reclaim(): Slab | undefined {
    let far = -1;
    for (const b of this.#retained) if (b > far) far = b;
    if (far < 0) return undefined;
    const p = this.#pieces.get(far)!;
    const slab = p.slab!;
    p.slab = null;
    this.#retained.delete(far);
    return slab;
  }

  /**
   * No more slabs are handed out: requests waiting for one fail with `reason` (the receiver is finishing and its
   * connections are closed, so nothing would ever release a slab to them).
   */
  stopAcquiring(reason: Error): void {
    this.#stopped ??= reason;
    for (const w of this.#waitingForSlab.splice(0)) w.reject(this.#stopped);
  }

  /** Call before writing [begin, end): a range written twice, or by two requests at once, drops the in-order hash. */
  beginWrite(begin: number, end: number): void {
    if (end <= begin) return;
    for (const [b, e] of this.#inflight) if (begin < e && b < end) this.#invalidate();
    if (this.#overlapsRecorded(begin, end)) this.#invalidate();
    this.#inflight.set(begin, end);
  }

  /** The write of [begin, end) is over (failed or not). */
  endWrite(begin: number): void {
    this.#inflight.delete(begin);
  }

  /** [begin, end) was written from `slab` (or, when null, is only on disk). The hasher keeps the slab until hashed. */
  dataWritten(begin: number, end: number, slab: Slab | null): void {
    this.#record(begin, end, { end, kind: 'data', slab });
  }

  /** [begin, end) is a hole (zeros) in the file. */
  holeRecorded(begin: number, end: number): void {
    this.#record(begin, end, { end, kind: 'hole', slab: null });
  }

  #record(begin: number, end: number, piece: Piece): void {
    if (end <= begin) {
      if (piece.slab) this.release(piece.slab);
      return;
    }
    this.#addRecorded(begin, end);
    if (!this.#valid || this.#closed) {
      if (piece.slab) this.release(piece.slab);
      return;
    }
    this.#pieces.set(begin, piece);
    if (piece.slab) this.#retained.add(begin);
    this.#pump();
    this.#serveWaiters();
  }

  #invalidate(): void {
    if (!this.#valid) return;
    this.#valid = false;
    for (const [b, p] of this.#pieces) {
      if (p.slab) this.release(p.slab);
      this.#pieces.delete(b);
    }
    this.#retained.clear();
  }

  #overlapsRecorded(begin: number, end: number): boolean {
    if (begin < this.#next) return true;
    for (const [b, e] of this.#recorded) if (begin < e && b < end) return true;
    return false;
  }

  #addRecorded(begin: number, end: number): void {
    const r = this.#recorded;
    r.push([begin, end]);
    if (r.length > 64) {
      r.sort((x, y) => x[0] - y[0]);
      const merged: Array<[number, number]> = [];
      for (const x of r) {
        const last = merged[merged.length - 1];
        if (last && x[0] <= last[1]) last[1] = Math.max(last[1], x[1]);
        else merged.push([x[0], x[1]]);
      }
      r.length = 0;
      r.push(...merged);
    }
  }

  /**
   * Submits, synchronously, the ranges that are next in file order while the worker's queue is short (at most
   * `#queueLimit` bytes), so that the ranges behind stay reclaimable. A range that must be read back from the file is
   * hashed asynchronously; every completion resumes the drain.
   */
  #pump(): void {
    if (this.#readingBack) return;
    while (this.#valid && !this.#closed && !this.#failure && this.#queuedBytes < this.#queueLimit) {
      const begin = this.#next;
      const p = this.#pieces.get(begin);
      if (!p) break;
      this.#pieces.delete(begin);
      this.#retained.delete(begin);
      if (p.kind === 'hole') {
        // one slab's worth of zeros at a time; the rest of the hole stays queued under its new start
        const n = Math.min(this.#slabSize, p.end - begin);
        if (begin + n < p.end) this.#pieces.set(begin + n, p);
        this.#next = begin + n;
        this.#queuedBytes += n;
        this.stats.holeBytes += n;
        this.#track(
          this.#worker.update(this.#zero.buffer, this.#zero.byteOffset, n).finally(() => {
            this.#queuedBytes -= n;
            this.#pump();
          }),
        );
      } else if (p.slab) {
        const slab = p.slab;
        const n = p.end - begin;
        this.#next = p.end;
        this.#queuedBytes += n;
        this.stats.inOrderBytes += n;
        this.#track(
          this.#worker.update(slab.buffer.buffer, slab.buffer.byteOffset, n).finally(() => {
            this.#queuedBytes -= n;
            this.release(slab);
            this.#pump();
          }),
        );
      } else {
        this.#next = p.end;
        this.#readingBack = true;
        this.#track(
          this.#readBack(begin, p.end).finally(() => {
            this.#readingBack = false;
            this.#pump();
          }),
        );
        return;
      }
    }
  }

  /** Keeps a worker operation until it settles (digest waits for all); a failure is recorded, never left unobserved. */
  #track(p: Promise<void>): void {
    const q = p.catch((err: unknown) => {
      this.#failure ??= err as Error;
    });
    this.#outstanding.add(q);
    // `q` never rejects (the failure is recorded above).
    void q.finally(() => this.#outstanding.delete(q));
  }

  async #settled(): Promise<void> {
    while (this.#outstanding.size > 0) await Promise.all([...this.#outstanding]);
  }

  async #readBack(begin: number, end: number): Promise<void> {
    const fh = this.#fh();
    if (!fh) throw new Error('the received file is closed');
    const slab = this.#readSlab;
    for (let off = begin; off < end; ) {
      const n = Math.min(this.#slabSize, end - off);
      await readFully(fh, slab.buffer, n, off);
      await this.#worker.update(slab.buffer.buffer, slab.buffer.byteOffset, n);
      this.stats.readBackBytes += n;
      off += n;
    }
  }

  /**
   * The SHA-512 (hex) of the first `size` bytes of the file, once every range was recorded. Falls back to one
   * post-pass over the file when the in-order hash was dropped or did not reach the end.
   */
  async digest(size: number, signal?: AbortSignal): Promise<string> {
    await this.#settled();
    if (this.#failure) throw this.#failure;
    if (!this.#valid || this.#next !== size) {
      await this.#worker.reset();
      const fh = this.#fh();
      if (!fh) throw new Error('the received file is closed');
      const slab = this.#readSlab;
      for (let off = 0; off < size; ) {
        signal?.throwIfAborted();
        const n = Math.min(this.#slabSize, size - off);
        await readFully(fh, slab.buffer, n, off);
        await this.#worker.update(slab.buffer.buffer, slab.buffer.byteOffset, n);
        this.stats.postPassBytes += n;
        off += n;
      }
    }
    signal?.throwIfAborted();
    return this.#worker.digest();
  }

  /** Stops the worker thread; pending work is dropped. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#worker.close();
    await this.#settled();
  }
}

async function readFully(fh: fsp.FileHandle, buf: Buffer, length: number, position: number): Promise<void> {
  let got = 0;
  while (got < length) {
    const { bytesRead } = await fh.read(buf, got, length - got, position + got);
    if (bytesRead === 0) throw new Error(`the received file is shorter than expected at ${position + got}`);
    got += bytesRead;
  }
}
