/**
 * At most `limit` holders at once. A release hands its slot straight to the oldest waiter (the slot never becomes free
 * while someone waits), so a caller arriving between a release and the woken waiter's resumption queues behind it
 * instead of slipping in: the limit holds whatever the interleaving of microtasks.
 */
export class Semaphore {
  #holders = 0;
  readonly #waiting: (() => void)[] = [];

  constructor(readonly limit: number) {
    if (!Number.isInteger(limit) || limit < 1) throw new RangeError(`semaphore limit must be a positive integer, got ${limit}`);
  }

  /** Holders now (a woken waiter counts from the moment of the release that handed it the slot). */
  get holders(): number {
    return this.#holders;
  }

  /** Callers waiting for a slot. */
  get waiting(): number {
    return this.#waiting.length;
  }

  /** Resolves once the caller holds a slot; it must call {@link release} exactly once afterwards. */
  acquire(): Promise<void> {
    if (this.#holders < this.limit) {
      this.#holders++;
      return Promise.resolve();
    }
    return new Promise<void>((resolve) => this.#waiting.push(resolve));
  }

  /** Gives up a slot: to the oldest waiter if there is one, otherwise back to the free count. */
  release(): void {
    const next = this.#waiting.shift();
    if (next) next();
    else if (this.#holders > 0) this.#holders--;
    else throw new Error('semaphore released more often than acquired');
  }

  /** Runs `task` holding a slot, and releases it however the task ends. */
  async run<T>(task: () => Promise<T>): Promise<T> {
    await this.acquire();
    try {
      return await task();
    } finally {
      this.release();
    }
  }
}
