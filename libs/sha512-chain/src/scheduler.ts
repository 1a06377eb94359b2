import { availableParallelism } from 'node:os';
import { advanceMany, multiBufferLanes, type Sha512State } from './state.js';
import type { Sha512Impl } from './native.js';

export interface Sha512BatchSchedulerOptions {
  /** Calls into the addon running at the same time (thread-pool jobs); default: the number of cores. */
  concurrency?: number;
  /**
   * With several lanes: how long a job may wait for a full pass before a call starts with fewer, in ms, unless the job
   * says otherwise (default 1). 0 starts jobs as soon as a call slot is free.
   */
  patienceMs?: number;
  /** The SHA-512 implementation (default: `BIS_SHA512_CHAIN_IMPL`, else AVX-512 where the CPU has it). */
  impl?: Sha512Impl;
}

interface Job {
  state: Sha512State;
  data: Uint8Array | null;
  length: number;
  /** `performance.now()` after which the job starts even in a short pass. */
  due: number;
  resolve(state: Sha512State): void;
  reject(err: Error): void;
}

/**
 * Runs independent SHA-512 compressions (a state and a message of whole blocks, to a new state) on the libuv thread
 * pool, several per call when the addon compresses several messages at once (`multiBufferLanes()`: 8 with AVX-512, 4
 * with AVX2).
 *
 * A pass costs the same for one message as for a full pass, so jobs wait for company: a call starts as soon as a call
 * slot is free and either a pass's worth of jobs of one length and one kind (data, or zero messages) wait or one job has waited its
 * patience (1 ms by default; a caller that does not wait on the result, like a receiver that has already answered,
 * can give more). Zero messages are kept apart from data while both can fill passes, because a pass of zeros alone
 * skips the message schedule (about 1.7 times the bytes per second); a job whose patience ran out takes its kind
 * first and fills the pass with the other. With one lane (OpenSSL) every job starts at once, alone, as soon as a call slot is
 * free.
 */
export class Sha512BatchScheduler {
  readonly concurrency: number;
  /** The implementation forced for this scheduler (undefined: the process-wide one). */
  readonly impl: Sha512Impl | undefined;
  /** Messages per call. */
  readonly maxBatch: number;
  /** Default patience of a job, ms (0 with one lane). */
  readonly patienceMs: number;
  /**
   * Calls made into the addon, the messages they carried (so `messages / calls` is the mean batch), and the calls that
   * mixed zero messages with data (a pass whose first job ran out of patience).
   */
  readonly stats = { calls: 0, messages: 0, mixedCalls: 0 };
  readonly #queue: Job[] = [];
  #running = 0;
  #timer: NodeJS.Timeout | undefined;
  #timerDue = Infinity;

  constructor(options: Sha512BatchSchedulerOptions = {}) {
    const concurrency = options.concurrency ?? availableParallelism();
    if (!Number.isSafeInteger(concurrency) || concurrency < 1) {
      throw new RangeError(`concurrency must be a positive integer, got ${String(concurrency)}`);
    }
    this.concurrency = concurrency;
    this.impl = options.impl;
    this.maxBatch = Math.max(1, multiBufferLanes(options.impl));
    const patience = options.patienceMs ?? 1;
    assertPatience(patience);
    this.patienceMs = this.maxBatch > 1 ? patience : 0;
  }

  /**
   * The state after compressing `data` (or `length` zero bytes with `null`) into `state`. `patienceMs` (default: the
   * scheduler's) bounds how long the job waits for a fuller pass.
   */
  advance(state: Sha512State, data: Uint8Array | null, length: number, patienceMs?: number): Promise<Sha512State> {
    if (patienceMs !== undefined) {
      try {
        assertPatience(patienceMs);
      } catch (err) {
        return Promise.reject(err as Error);
      }
    }
    const patience = this.maxBatch > 1 ? (patienceMs ?? this.patienceMs) : 0;
    return new Promise<Sha512State>((resolve, reject) => {
      this.#queue.push({ state, data, length, due: performance.now() + patience, resolve, reject });
      this.#pump();
    });
  }

  /** Jobs waiting for a call. */
  get waiting(): number {
    return this.#queue.length;
  }

  #pump(): void {
    while (this.#queue.length > 0 && this.#running < this.concurrency) {
      let batch = this.#fullPass();
      if (!batch) {
        let due = Infinity;
        let head = 0;
        this.#queue.forEach((j, i) => {
          if (j.due < due) {
            due = j.due;
            head = i;
          }
        });
        const wait = due - performance.now();
        if (wait > 0) {
          this.#wakeAt(due, wait);
          return;
        }
        batch = this.#take(head);
      }
      this.#running++;
      this.stats.calls++;
      this.stats.messages += batch.length;
      if (batch.some((j) => j.data === null) && batch.some((j) => j.data !== null)) this.stats.mixedCalls++;
      advanceMany(
        batch.map((j) => j.state),
        batch.map((j) => j.data),
        batch[0]!.length,
        this.impl,
      ).then(
        (states) => batch.forEach((j, i) => j.resolve(states[i]!)),
        (err: unknown) => batch.forEach((j) => j.reject(err instanceof Error ? err : new Error(String(err)))),
      ).finally(() => {
        this.#running--;
        this.#pump();
      });
    }
  }

  /**
   * A pass's worth of waiting jobs of one length and one kind (data or zeros), oldest first, if there are that many: a pass of
   * zero messages alone skips the message schedule, so zeros are kept apart from data while both can fill a pass.
   * With one lane: the oldest job.
   */
  #fullPass(): Job[] | undefined {
    if (this.maxBatch === 1) return this.#take(0);
    const counts = new Map<string, number>();
    for (const j of this.#queue) {
      const key = `${j.length}:${j.data === null ? 'z' : 'd'}`;
      const n = (counts.get(key) ?? 0) + 1;
      counts.set(key, n);
      if (n === this.maxBatch) {
        return this.#takeWhere((x) => x.length === j.length && (x.data === null) === (j.data === null));
      }
    }
    return undefined;
  }

  /** One timer, for the earliest due job. */
  #wakeAt(due: number, wait: number): void {
    if (this.#timer && this.#timerDue <= due) return;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timerDue = due;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#timerDue = Infinity;
      this.#pump();
    }, Math.ceil(wait));
  }

  /**
   * Up to maxBatch waiting jobs of the length of job `head` (whose patience ran out): its kind (data or zeros) first,
   * then the other kind to fill the pass (a mixed pass costs what a data pass costs).
   */
  #take(head: number): Job[] {
    const h = this.#queue[head]!;
    const zeros = h.data === null;
    const batch = this.#takeWhere((j) => j.length === h.length && (j.data === null) === zeros);
    if (batch.length < this.maxBatch) batch.push(...this.#takeWhere((j) => j.length === h.length, this.maxBatch - batch.length));
    return batch;
  }

  /** Removes and returns up to `max` waiting jobs matching `match`, oldest first. */
  #takeWhere(match: (j: Job) => boolean, max = this.maxBatch): Job[] {
    const batch: Job[] = [];
    const rest: Job[] = [];
    for (const j of this.#queue) (batch.length < max && match(j) ? batch : rest).push(j);
    this.#queue.splice(0, this.#queue.length, ...rest);
    return batch;
  }
}

function assertPatience(ms: number): void {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`patienceMs must be a non-negative number, got ${String(ms)}`);
}

let shared: Sha512BatchScheduler | undefined;

/** The process-wide scheduler (concurrency = cores): verifiers share it, so segments of different files batch too. */
export function sharedSha512Scheduler(): Sha512BatchScheduler {
  shared ??= new Sha512BatchScheduler();
  return shared;
}
