/**
 * A rate-limited work queue with client-go semantics: a key is processed by at most one worker at a time, adding a
 * key that is queued is a no-op, adding a key that is being processed re-queues it once the worker is done.
 * The rate limiter is the max of a per-item exponential backoff (5 ms → 1000 s) and a global token bucket
 * (100 qps, burst 1000), like Kubernetes' DefaultControllerRateLimiter.
 */
export interface RateLimiterOptions {
  baseDelayMs?: number;
  maxDelayMs?: number;
  qps?: number;
  burst?: number;
}

export class RateLimiter {
  private readonly failures = new Map<string, number>();
  private tokens: number;
  private lastRefill: number;
  private readonly base: number;
  private readonly max: number;
  private readonly qps: number;
  private readonly burst: number;

  constructor(opts: RateLimiterOptions = {}, private readonly now: () => number = Date.now) {
    this.base = opts.baseDelayMs ?? 5;
    this.max = opts.maxDelayMs ?? 1_000_000;
    this.qps = opts.qps ?? 100;
    this.burst = opts.burst ?? 1000;
    this.tokens = this.burst;
    this.lastRefill = now();
  }

  /** Delay before `key` may be retried; counts one more failure. */
  when(key: string): number {
    const n = this.failures.get(key) ?? 0;
    this.failures.set(key, n + 1);
    const exp = Math.min(this.base * 2 ** n, this.max);
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.lastRefill) / 1000) * this.qps);
    this.lastRefill = t;
    this.tokens -= 1;
    const bucket = this.tokens >= 0 ? 0 : (-this.tokens / this.qps) * 1000;
    return Math.max(exp, bucket);
  }

  numRequeues(key: string): number {
    return this.failures.get(key) ?? 0;
  }

  forget(key: string): void {
    this.failures.delete(key);
  }
}

export class WorkQueue {
  private readonly queue: string[] = [];
  private readonly dirty = new Set<string>();
  private readonly processing = new Set<string>();
  private readonly timers = new Map<string, NodeJS.Timeout>();
  private readonly waiters: ((key: string | undefined) => void)[] = [];
  private shuttingDown = false;
  readonly limiter: RateLimiter;

  constructor(opts: RateLimiterOptions = {}) {
    this.limiter = new RateLimiter(opts);
  }

  get length(): number {
    return this.queue.length;
  }

  add(key: string): void {
    if (this.shuttingDown || this.dirty.has(key)) return;
    this.dirty.add(key);
    if (this.processing.has(key)) return;
    const w = this.waiters.shift();
    if (w) {
      this.dirty.delete(key);
      this.processing.add(key);
      w(key);
    } else this.queue.push(key);
  }

  /** Adds `key` after `ms` (an earlier pending delayed add wins). */
  addAfter(key: string, ms: number): void {
    if (this.shuttingDown) return;
    if (ms <= 0) return this.add(key);
    if (this.timers.has(key)) return;
    const t = setTimeout(() => {
      this.timers.delete(key);
      this.add(key);
    }, ms);
    t.unref();
    this.timers.set(key, t);
  }

  addRateLimited(key: string): void {
    this.addAfter(key, this.limiter.when(key));
  }

  forget(key: string): void {
    this.limiter.forget(key);
  }

  numRequeues(key: string): number {
    return this.limiter.numRequeues(key);
  }

  /** Next key to process, or undefined once shut down. */
  get(): Promise<string | undefined> {
    if (this.shuttingDown) return Promise.resolve(undefined);
    const key = this.queue.shift();
    if (key !== undefined) {
      this.dirty.delete(key);
      this.processing.add(key);
      return Promise.resolve(key);
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  done(key: string): void {
    this.processing.delete(key);
    if (this.dirty.has(key)) {
      this.dirty.delete(key);
      this.add(key);
    }
  }

  shutDown(): void {
    this.shuttingDown = true;
    for (const t of this.timers.values()) clearTimeout(t);
    this.timers.clear();
    for (const w of this.waiters.splice(0)) w(undefined);
  }
}
