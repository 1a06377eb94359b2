/**
 * A controller-runtime style work queue: keys are deduplicated while waiting, a key being processed is not
 * handed to a second worker (it is re-queued after `done` if it was added meanwhile), and failed keys are
 * re-added with per-item exponential backoff with jitter combined with a global token bucket (like client-go's
 * `DefaultControllerRateLimiter`: the max of the two; here 5 ms·2^n capped at 5 min (`RETRY_BOUNDS.reconcile`) and
 * 100 qps / burst 1000).
 */
import { systemClock, type Clock, type TimerHandle } from './clock.js';
import { RETRY_BOUNDS, retryDelay, type RandomSource } from './retry.js';

export interface RateLimiterOptions {
  baseDelayMs?: number;
  maxDelayMs?: number;
  /** Jitter fraction of the per-item delay (default `RETRY_BOUNDS.reconcile.jitter`); 0 = none. */
  jitter?: number;
  /** Random source of the jitter (tests pass `seededRandom(n)`). */
  random?: RandomSource;
  /** Global bucket refill rate (tokens per second); 0 disables the bucket. */
  qps?: number;
  burst?: number;
}

export class ItemExponentialRateLimiter<K> {
  private readonly failures = new Map<K, number>();
  private readonly base: number;
  private readonly max: number;
  private readonly jitter: number;
  private readonly random: RandomSource;
  private readonly qps: number;
  private readonly burst: number;
  private tokens: number;
  private last: number;

  constructor(
    opts: RateLimiterOptions = {},
    private readonly now: () => number = () => systemClock.now(),
  ) {
    this.base = opts.baseDelayMs ?? RETRY_BOUNDS.reconcile.initialMs;
    this.max = opts.maxDelayMs ?? RETRY_BOUNDS.reconcile.maxMs;
    this.jitter = opts.jitter ?? RETRY_BOUNDS.reconcile.jitter;
    this.random = opts.random ?? Math.random;
    this.qps = opts.qps ?? 100;
    this.burst = opts.burst ?? 1000;
    this.tokens = this.burst;
    this.last = now();
  }
  /** Delay before the key may be processed again; counts one more failure. */
  when(key: K): number {
    const n = this.failures.get(key) ?? 0;
    this.failures.set(key, n + 1);
    const itemDelay = retryDelay({ initialMs: this.base, maxMs: this.max, jitter: this.jitter }, n + 1, this.random);
    return Math.max(itemDelay, this.bucketDelay());
  }
  private bucketDelay(): number {
    if (this.qps <= 0) return 0;
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.last) / 1000) * this.qps);
    this.last = t;
    this.tokens -= 1;
    return this.tokens >= 0 ? 0 : Math.ceil((-this.tokens / this.qps) * 1000);
  }
  numRequeues(key: K): number {
    return this.failures.get(key) ?? 0;
  }
  forget(key: K): void {
    this.failures.delete(key);
  }
}

/**
 * What a work queue reports to a metrics collector (Prometheus' `workqueue_*` series); injected, so the queue
 * depends on no metrics library.
 */
export interface WorkQueueMetrics {
  /** A key entered the queue (not counted when it was already waiting). */
  added(): void;
  /** Keys waiting now. */
  depth(n: number): void;
  /** A key was re-added with backoff after a failure. */
  retried(): void;
}

/** One in this many keys handed out is a low-priority one while both kinds wait. */
const LOW_SHARE = 8;

export class WorkQueue<K = string> {
  /** Where adds, depth and retries are reported (none by default). */
  metrics?: WorkQueueMetrics;
  private readonly queue: K[] = [];
  /**
   * Waiting keys added at low priority (in order): handed out when no other key waits, and one in every
   * `LOW_SHARE` hand-outs, so that they are never starved.
   */
  private readonly low = new Set<K>();
  private handedOut = 0;
  private readonly dirty = new Set<K>();
  private readonly processing = new Set<K>();
  private readonly delayed = new Map<K, { at: number; timer: TimerHandle }>();
  private readonly getters: ((k: K | undefined) => void)[] = [];
  private readonly drainWaiters: (() => void)[] = [];
  private shuttingDown = false;
  readonly rateLimiter: ItemExponentialRateLimiter<K>;

  /** `clock`: the time and timers of delayed adds and of the rate limiter's token bucket (tests pass a ManualClock). */
  constructor(
    opts: RateLimiterOptions = {},
    private readonly clock: Clock = systemClock,
  ) {
    this.rateLimiter = new ItemExponentialRateLimiter<K>(opts, () => clock.now());
  }

  /**
   * Adds a key unless it is already waiting. `low`: at low priority, behind every other waiting key (controller-
   * runtime's priority queue gives the objects of an initial list and of a resync a low priority: a burst of them does
   * not delay the changes that move work along). A key waiting at low priority that is added again at normal priority
   * moves up.
   */
  add(key: K, low = false): void {
    if (this.shuttingDown) return;
    if (this.dirty.has(key)) {
      if (!low && this.low.delete(key)) this.queue.push(key);
      return;
    }
    this.dirty.add(key);
    this.metrics?.added();
    if (this.processing.has(key)) return;
    const g = this.getters.shift();
    if (g) {
      this.dirty.delete(key);
      this.processing.add(key);
      g(key);
    } else {
      if (low) this.low.add(key);
      else this.queue.push(key);
      this.metrics?.depth(this.length);
    }
  }

  /** Adds the key after `ms`; an earlier pending time wins. */
  addAfter(key: K, ms: number): void {
    if (this.shuttingDown) return;
    if (ms <= 0) return this.add(key);
    const at = this.clock.now() + ms;
    const cur = this.delayed.get(key);
    if (cur && cur.at <= at) return;
    if (cur) this.clock.clearTimer(cur.timer);
    // A pending retry never keeps the process alive on its own (the system clock's timers are unref'd).
    const timer = this.clock.setTimer(() => {
      this.delayed.delete(key);
      this.add(key);
    }, ms);
    this.delayed.set(key, { at, timer });
  }

  /** Re-adds the key after its backoff delay (one more failure counted). */
  addRateLimited(key: K): void {
    this.metrics?.retried();
    this.addAfter(key, this.rateLimiter.when(key));
  }
  /** Clears the failure count of a key (call after a successful reconcile or when giving up). */
  forget(key: K): void {
    this.rateLimiter.forget(key);
  }
  numRequeues(key: K): number {
    return this.rateLimiter.numRequeues(key);
  }

  /** Waits for the next key; `undefined` once the queue is shut down. Call `done(key)` after processing. */
  get(): Promise<K | undefined> {
    const k = this.next();
    if (k !== undefined) {
      this.dirty.delete(k);
      this.processing.add(k);
      this.metrics?.depth(this.length);
      return Promise.resolve(k);
    }
    if (this.shuttingDown) return Promise.resolve(undefined);
    return new Promise((resolve) => this.getters.push(resolve));
  }

  done(key: K): void {
    this.processing.delete(key);
    if (this.dirty.has(key)) {
      this.dirty.delete(key);
      this.add(key);
    }
    if (this.processing.size === 0) for (const w of this.drainWaiters.splice(0)) w();
  }

  /** The next waiting key: the oldest normal one, else (and once in every LOW_SHARE) the oldest low one. */
  private next(): K | undefined {
    const lowFirst = this.low.size > 0 && (this.queue.length === 0 || ++this.handedOut % LOW_SHARE === 0);
    if (lowFirst) {
      const k = this.low.values().next().value as K;
      this.low.delete(k);
      return k;
    }
    return this.queue.shift();
  }

  get length(): number {
    return this.queue.length + this.low.size;
  }
  get isShuttingDown(): boolean {
    return this.shuttingDown;
  }

  /** Stops accepting keys, drops delayed ones, and releases waiting `get()` calls with undefined. */
  shutDown(): void {
    this.shuttingDown = true;
    for (const d of this.delayed.values()) this.clock.clearTimer(d.timer);
    this.delayed.clear();
    this.queue.length = 0;
    this.low.clear();
    this.metrics?.depth(0);
    this.dirty.clear();
    for (const g of this.getters.splice(0)) g(undefined);
  }

  /** Like shutDown, then waits until the keys being processed are done. */
  async shutDownWithDrain(): Promise<void> {
    this.shutDown();
    if (this.processing.size === 0) return;
    await new Promise<void>((r) => this.drainWaiters.push(r));
  }
}
