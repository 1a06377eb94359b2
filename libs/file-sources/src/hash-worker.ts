import type { Worker } from 'node:worker_threads';
import { startModuleWorker } from '@bis/runtime';
import type { ChecksumAlgorithm } from './checksum.js';
import type { DigestReply, DigestRequest, DigestWorkerData } from './digest-worker.js';

const DIGEST_WORKER = new URL('./digest-worker.js', import.meta.url);

type Reply = DigestReply;
type DistributiveOmit<T, K extends PropertyKey> = T extends unknown ? Omit<T, K> : never;

interface Waiter {
  resolve(r: Reply): void;
  reject(e: Error): void;
}

export interface HashWorkerOptions {
  /**
   * Compute the SHA-512 with a SHA-512 chain recorder that keeps the chaining state every `chainSegment` bytes
   * (`@bis/sha512-chain`; needs its native addon), so that `digestWithChain` returns the chain with the checksum.
   */
  chainSegment?: number;
}

export class HashWorkerError extends Error {
  override readonly name = 'HashWorkerError';
}

/**
 * Hashes a stream of bytes with one or more algorithms on a worker thread, so that hashing (SHA-512 runs at
 * ~600 MB/s per core) overlaps with receiving and writing on the main thread. Bytes are passed as slices of
 * SharedArrayBuffers: the caller must not modify a slice until the promise of its `update` resolves.
 * Updates are hashed in the order they were submitted.
 */
export class HashWorker {
  readonly algorithms: readonly ChecksumAlgorithm[];
  readonly #worker: Worker;
  readonly #waiting = new Map<number, Waiter>();
  #nextId = 0;
  #failure: Error | undefined;
  #closed = false;

  /** Whether `digest` also returns the SHA-512 chain (see {@link HashWorkerOptions.chainSegment}). */
  readonly recordsChain: boolean;

  constructor(algorithms: readonly ChecksumAlgorithm[], options: HashWorkerOptions = {}) {
    this.algorithms = algorithms;
    this.recordsChain = options.chainSegment !== undefined && algorithms.includes('sha512');
    this.#worker = startModuleWorker(DIGEST_WORKER, {
      workerData: {
        algorithms: [...algorithms],
        ...(this.recordsChain ? { chainSegment: options.chainSegment } : {}),
      } satisfies DigestWorkerData,
      // The worker only hashes: a small heap keeps the process's memory low (chain states are kept in compact
      // buffers outside the heap, 64 bytes a segment).
      resourceLimits: { maxOldGenerationSizeMb: 16, maxYoungGenerationSizeMb: 4, codeRangeSizeMb: 8, stackSizeMb: 1 },
    });
    this.#worker.unref();
    this.#worker.on('message', (r: Reply) => {
      const w = this.#waiting.get(r.id);
      if (!w) return;
      this.#waiting.delete(r.id);
      if (this.#waiting.size === 0) this.#worker.unref();
      if (r.error !== undefined) w.reject(new HashWorkerError(`hashing failed: ${r.error}`));
      else w.resolve(r);
    });
    this.#worker.on('error', (e: Error) => this.#fail(new HashWorkerError(`the hash worker failed: ${e.message}`)));
    this.#worker.on('exit', (code) => {
      if (!this.#closed) this.#fail(new HashWorkerError(`the hash worker exited unexpectedly with code ${code}`));
    });
  }

  #fail(e: Error): void {
    this.#failure ??= e;
    for (const w of this.#waiting.values()) w.reject(e);
    this.#waiting.clear();
  }

  #send(message: DistributiveOmit<DigestRequest, 'id'>): Promise<Reply> {
    if (this.#closed) return Promise.reject(new HashWorkerError('the hash worker is closed'));
    if (this.#failure) return Promise.reject(this.#failure);
    const id = this.#nextId++;
    return new Promise<Reply>((resolve, reject) => {
      // Keep the process alive while an answer is due (an idle worker never holds the process open).
      if (this.#waiting.size === 0) this.#worker.ref();
      this.#waiting.set(id, { resolve, reject });
      this.#worker.postMessage({ ...message, id });
    });
  }

  /** Hashes `length` bytes of `buffer` from `offset`. Resolves once they are hashed (the slice may be reused). */
  async update(buffer: SharedArrayBuffer, offset: number, length: number): Promise<void> {
    if (length === 0) return;
    await this.#send({ op: 'update', buffer, offset, length });
  }

  /** Finishes the hashes (hex, in the order of `algorithms`) and starts new ones. */
  async digest(): Promise<string[]> {
    return (await this.digestWithChain()).digests;
  }

  /**
   * `digest`, with the SHA-512 chain of what was hashed when the worker records one (`chain`: the `encodeChain`
   * bytes; decode with `decodeChain` of `@bis/sha512-chain`).
   */
  async digestWithChain(): Promise<{ digests: string[]; chain?: Uint8Array }> {
    const r = await this.#send({ op: 'digest' });
    return { digests: r.digests ?? [], ...(r.chain ? { chain: r.chain } : {}) };
  }

  /** The digests of what was hashed so far (hex, in the order of `algorithms`); hashing goes on. */
  async peek(): Promise<string[]> {
    const r = await this.#send({ op: 'peek' });
    return r.digests ?? [];
  }

  /** Forgets everything hashed so far. */
  async reset(): Promise<void> {
    await this.#send({ op: 'reset' });
  }

  /** Stops the worker thread. Pending operations fail. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#fail(new HashWorkerError('the hash worker is closed'));
    await this.#worker.terminate();
  }
}
