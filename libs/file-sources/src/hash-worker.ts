import { availableParallelism } from 'node:os';
import type { Worker } from 'node:worker_threads';
import { startModuleWorker } from '@bis/runtime';
import type { ChecksumAlgorithm } from './checksum.js';
import type { DigestReply, DigestRequest, DigestSessionOptions } from './digest-worker.js';

const DIGEST_WORKER = new URL('./digest-worker.js', import.meta.url);

type Reply = DigestReply;
type DistributiveOmit<T, K extends PropertyKey> = T extends unknown ? Omit<T, K> : never;
type Request = DistributiveOmit<DigestRequest, 'id' | 'session'>;

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

/** The most hashing threads a process runs; sessions beyond that share them. */
const MAX_THREADS = Math.max(1, Math.min(availableParallelism(), 8));
/** A thread without sessions for this long stops (the next session starts one again). */
const IDLE_STOP_MS = 10_000;

/**
 * One thread of the pool: it hashes for any number of sessions, in the order their requests arrive. Starting a
 * thread costs ~80 ms of CPU (a V8 isolate and the hashing modules), far more than hashing a small image, so threads
 * outlive their sessions and serve the next ones.
 */
class DigestThread {
  readonly #worker: Worker;
  readonly #waiting = new Map<number, Waiter>();
  #nextId = 0;
  #idleTimer: NodeJS.Timeout | undefined;
  #stopping = false;
  failure: Error | undefined;
  sessions = 0;

  constructor(private readonly onGone: (t: DigestThread) => void) {
    this.#worker = startModuleWorker(DIGEST_WORKER, {
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
      this.#fail(
        this.#stopping
          ? new HashWorkerError('the hash worker was stopped')
          : new HashWorkerError(`the hash worker exited unexpectedly with code ${code}`),
      );
    });
  }

  #fail(e: Error): void {
    this.failure ??= e;
    for (const w of this.#waiting.values()) w.reject(this.failure);
    this.#waiting.clear();
    clearTimeout(this.#idleTimer);
    this.onGone(this);
  }

  send(session: number, message: Request): Promise<Reply> {
    if (this.failure) return Promise.reject(this.failure);
    const id = this.#nextId++;
    return new Promise<Reply>((resolve, reject) => {
      // Keep the process alive while an answer is due (an idle worker never holds the process open).
      if (this.#waiting.size === 0) this.#worker.ref();
      this.#waiting.set(id, { resolve, reject });
      this.#worker.postMessage({ ...message, id, session });
    });
  }

  open(): void {
    this.sessions++;
    clearTimeout(this.#idleTimer);
    this.#idleTimer = undefined;
  }

  release(): void {
    this.sessions--;
    if (this.sessions > 0 || this.failure) return;
    this.#idleTimer = setTimeout(() => void this.stop(), IDLE_STOP_MS);
    this.#idleTimer.unref();
  }

  async stop(): Promise<void> {
    if (this.failure) return;
    this.#stopping = true;
    clearTimeout(this.#idleTimer);
    this.onGone(this); // no new session lands on a stopping thread
    await this.#worker.terminate();
  }
}

const threads = new Set<DigestThread>();
let nextSession = 0;

/** The thread for a new session: an idle one, else a new one while there are fewer than {@link MAX_THREADS}, else the least busy. */
function threadForSession(): DigestThread {
  let best: DigestThread | undefined;
  for (const t of threads) if (!best || t.sessions < best.sessions) best = t;
  if (!best || (best.sessions > 0 && threads.size < MAX_THREADS)) {
    best = new DigestThread((t) => threads.delete(t));
    threads.add(best);
  }
  return best;
}

/** The number of hashing threads running now. */
export function hashWorkerThreads(): number {
  return threads.size;
}

/** Stops every hashing thread now (their sessions fail); later sessions start new threads. */
export async function stopHashWorkerThreads(): Promise<void> {
  await Promise.all([...threads].map((t) => t.stop()));
}

/**
 * Hashes a stream of bytes with one or more algorithms on a worker thread, so that hashing (SHA-512 runs at
 * ~600 MB/s per core) overlaps with receiving and writing on the main thread. Bytes are passed as slices of
 * SharedArrayBuffers: the caller must not modify a slice until the promise of its `update` resolves.
 * Updates are hashed in the order they were submitted.
 *
 * Each HashWorker is a session on one thread of a process-wide pool (at most one thread per core): sessions on one
 * thread take turns, and a thread serves session after session instead of being started for each.
 */
export class HashWorker {
  readonly algorithms: readonly ChecksumAlgorithm[];
  readonly #thread: DigestThread;
  readonly #session = nextSession++;
  readonly #opened: Promise<unknown>;
  #failure: Error | undefined;
  #closed = false;

  /** Whether `digest` also returns the SHA-512 chain (see {@link HashWorkerOptions.chainSegment}). */
  readonly recordsChain: boolean;

  constructor(algorithms: readonly ChecksumAlgorithm[], options: HashWorkerOptions = {}) {
    this.algorithms = algorithms;
    this.recordsChain = options.chainSegment !== undefined && algorithms.includes('sha512');
    this.#thread = threadForSession();
    this.#thread.open();
    const sessionOptions: DigestSessionOptions = {
      algorithms: [...algorithms],
      ...(this.recordsChain ? { chainSegment: options.chainSegment } : {}),
    };
    // Requests are answered in order, so the ones sent before `open` is answered still find the session (or fail
    // with the reason the session could not open, kept in #failure).
    this.#opened = this.#thread.send(this.#session, { op: 'open', options: sessionOptions }).catch((e: unknown) => {
      this.#failure ??= e instanceof Error ? e : new HashWorkerError(String(e));
    });
  }

  async #send(message: Request): Promise<Reply> {
    if (this.#closed) throw new HashWorkerError('the hash worker is closed');
    if (this.#failure) throw this.#failure;
    const reply = this.#thread.send(this.#session, message);
    try {
      return await reply;
    } catch (e) {
      await this.#opened;
      throw this.#failure ?? e; // a session that could not open answers with why
    }
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

  /** Ends the session (its thread stays for other sessions). Operations sent before still complete; later ones fail. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#failure ??= new HashWorkerError('the hash worker is closed');
    // The thread answers in order: `close` is answered after every request this session sent before it.
    await this.#thread.send(this.#session, { op: 'close' }).catch(() => undefined);
    this.#thread.release();
  }
}
