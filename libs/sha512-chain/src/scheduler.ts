import { availableParallelism } from 'node:os';
import { advanceMany, multiBufferLanes, type Sha512State } from './state.js';

export interface Sha512BatchSchedulerOptions {
  /** Calls into the addon running at the same time (thread-pool jobs); default: the number of cores. */
  concurrency?: number;
  /**
   * With eight lanes: how long fewer than `minBatch` waiting jobs wait for company while nothing runs, in ms
   * (default 1). 0 starts them at once.
   */
  lingerMs?: number;
}

interface Job {
  state: Sha512State;
  data: Uint8Array | null;
  length: number;
  resolve(state: Sha512State): void;
  reject(err: Error): void;
}

/**
 * Runs independent SHA-512 compressions (a state and a message of whole blocks, to a new state) on the libuv thread
 * pool, several per call when the addon can compress eight messages at once (AVX-512, `multiBufferLanes() === 8`).
 *
 * Batching is adaptive. Jobs that arrive while a call runs wait, and start together (up to 8 of one length, zero
 * messages grouped with zero messages first) when a call ends, or in a second concurrent call as soon as half a
 * pass is waiting. Fewer than that, arriving while nothing runs, wait `lingerMs` (1 ms) for company and then start
 * anyway. Without AVX-512 every job starts at once, alone, as soon as a call slot is free.
 */
export class Sha512BatchScheduler {
  readonly concurrency: number;
  /** Messages per call. */
  readonly maxBatch: number;
  /** Waiting jobs needed to start another call while one is running. */
  readonly minBatch: number;
  /** Calls made into the addon, and the messages they carried (so `messages / calls` is the mean batch). */
  readonly stats = { calls: 0, messages: 0 };
  readonly lingerMs: number;
  readonly #queue: Job[] = [];
  #running = 0;
  #linger: NodeJS.Timeout | undefined;

  constructor(options: Sha512BatchSchedulerOptions = {}) {
    const concurrency = options.concurrency ?? availableParallelism();
    if (!Number.isSafeInteger(concurrency) || concurrency < 1) {
      throw new RangeError(`concurrency must be a positive integer, got ${String(concurrency)}`);
    }
    this.concurrency = concurrency;
    this.maxBatch = Math.max(1, multiBufferLanes());
    this.minBatch = this.maxBatch > 1 ? Math.ceil(this.maxBatch / 2) : 1;
    const linger = options.lingerMs ?? 1;
    if (!Number.isFinite(linger) || linger < 0) throw new RangeError(`lingerMs must be a non-negative number, got ${String(linger)}`);
    this.lingerMs = this.maxBatch > 1 ? linger : 0;
  }

  /** The state after compressing `data` (or `length` zero bytes with `null`) into `state`. */
  advance(state: Sha512State, data: Uint8Array | null, length: number): Promise<Sha512State> {
    return new Promise<Sha512State>((resolve, reject) => {
      this.#queue.push({ state, data, length, resolve, reject });
      this.#pump();
    });
  }

  /** Jobs waiting for a call. */
  get waiting(): number {
    return this.#queue.length;
  }

  #pump(force = false): void {
    while (this.#queue.length > 0 && this.#running < this.concurrency) {
      if (this.#queue.length < this.minBatch && !force) {
        // a short batch: while a call runs, wait for it; while none runs, wait a moment for company
        if (this.#running > 0) return;
        if (this.lingerMs > 0) {
          this.#linger ??= setTimeout(() => {
            this.#linger = undefined;
            this.#pump(true);
          }, this.lingerMs);
          return;
        }
      }
      force = false;
      if (this.#linger) {
        clearTimeout(this.#linger);
        this.#linger = undefined;
      }
      const batch = this.#take();
      this.#running++;
      this.stats.calls++;
      this.stats.messages += batch.length;
      advanceMany(
        batch.map((j) => j.state),
        batch.map((j) => j.data),
        batch[0]!.length,
      ).then(
        (states) => batch.forEach((j, i) => j.resolve(states[i]!)),
        (err: unknown) => batch.forEach((j) => j.reject(err instanceof Error ? err : new Error(String(err)))),
      ).finally(() => {
        this.#running--;
        this.#pump();
      });
    }
  }

  /** Up to maxBatch waiting jobs of the head's length: the head's kind (data or zeros) first, then the other. */
  #take(): Job[] {
    const head = this.#queue[0]!;
    const zeros = head.data === null;
    const picked = new Set<number>();
    for (const sameKind of [true, false]) {
      for (let i = 0; i < this.#queue.length && picked.size < this.maxBatch; i++) {
        const j = this.#queue[i]!;
        if (j.length === head.length && (j.data === null) === zeros === sameKind && !picked.has(i)) picked.add(i);
      }
    }
    const batch: Job[] = [];
    const rest: Job[] = [];
    this.#queue.forEach((j, i) => (picked.has(i) ? batch : rest).push(j));
    this.#queue.splice(0, this.#queue.length, ...rest);
    return batch;
  }
}

let shared: Sha512BatchScheduler | undefined;

/** The process-wide scheduler (concurrency = cores): verifiers share it, so segments of different files batch too. */
export function sharedSha512Scheduler(): Sha512BatchScheduler {
  shared ??= new Sha512BatchScheduler();
  return shared;
}
