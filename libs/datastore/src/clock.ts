/** An opaque handle of a timer set through a {@link Clock}. */
export type TimerHandle = object;

/** Time and timers, injectable so that code that waits can be tested without waiting. */
export interface Clock {
  /** Milliseconds, monotone for the clock's lifetime (the epoch is the clock's own). */
  now(): number;
  /** Calls `fn` once, `ms` milliseconds of this clock from now. A pending timer never keeps the process alive. */
  setTimer(fn: () => void, ms: number): TimerHandle;
  clearTimer(handle: TimerHandle): void;
}

/** The process clock: `Date.now` and unref'd `setTimeout`. */
export const systemClock: Clock = {
  now: () => Date.now(),
  setTimer(fn, ms) {
    const t = setTimeout(fn, ms);
    t.unref();
    return t;
  },
  clearTimer(handle) {
    clearTimeout(handle as NodeJS.Timeout);
  },
};

/**
 * A clock that moves only when told to, for tests: `advance(ms)` fires, in time order, every timer due by then
 * (including timers set by the callbacks it fires, when they fall inside the window).
 */
export class ManualClock implements Clock {
  #now: number;
  #seq = 0;
  readonly #timers = new Map<object, { at: number; seq: number; fn: () => void }>();

  constructor(start = 0) {
    this.#now = start;
  }

  now(): number {
    return this.#now;
  }

  setTimer(fn: () => void, ms: number): TimerHandle {
    const handle = {};
    this.#timers.set(handle, { at: this.#now + Math.max(0, ms), seq: this.#seq++, fn });
    return handle;
  }

  clearTimer(handle: TimerHandle): void {
    this.#timers.delete(handle);
  }

  /** Timers set and not yet fired or cleared. */
  get pending(): number {
    return this.#timers.size;
  }

  /** Moves the time forward by `ms`, firing the timers that fall due, in order. */
  advance(ms: number): void {
    const end = this.#now + ms;
    for (;;) {
      let next: [object, { at: number; seq: number; fn: () => void }] | undefined;
      for (const e of this.#timers) {
        if (e[1].at <= end && (!next || e[1].at < next[1].at || (e[1].at === next[1].at && e[1].seq < next[1].seq))) next = e;
      }
      if (!next) break;
      this.#timers.delete(next[0]);
      this.#now = next[1].at;
      next[1].fn();
    }
    this.#now = end;
  }
}
