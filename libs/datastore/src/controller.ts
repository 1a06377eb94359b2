import { isConflict } from './errors.js';
import { isPermanentError } from './retry.js';
import { objectKey, type Informer } from './informer.js';
import type { KubeObject, Stored } from './types.js';
import { WorkQueue, type RateLimiterOptions, type WorkQueueMetrics } from './workqueue.js';

export interface ReconcileResult {
  /** Re-add the key after this delay (level-triggered polling, e.g. waiting for a data-plane state). */
  requeueAfterMs?: number;
  /** Re-add the key with rate limiting (counts as a retry). */
  requeue?: boolean;
}

export interface ControllerLogger {
  error(msg: string, err: unknown): void;
}

/** What a controller reports to a metrics collector: its queue's series and each reconcile's duration. */
export interface ControllerMetrics extends WorkQueueMetrics {
  /** One reconcile ended after `seconds`: `success`, `requeue` (asked to be retried) or `error` (threw). */
  reconciled(seconds: number, result: 'success' | 'requeue' | 'error'): void;
}

export interface ControllerOptions {
  name: string;
  /** Reconciles one key (`namespace/name`). Level-triggered: read the current state, converge, return. */
  reconcile(key: string, signal: AbortSignal): Promise<ReconcileResult | void>;
  /** Default 5 (Longhorn). */
  workers?: number;
  rateLimiter?: RateLimiterOptions;
  logger?: ControllerLogger;
  /** Whether a key that failed with this error is not retried and not logged (e.g. NotFound: the object is gone; its next event brings it back). */
  quietDrop?: (err: unknown) => boolean;
  /** Where queue and reconcile metrics go (none by default). */
  metrics?: ControllerMetrics;
}

/**
 * The reconciler loop: informers feed keys into a rate-limited WorkQueue; N workers call `reconcile`.
 * A thrown error re-adds the key with per-item exponential backoff with jitter, capped, for as long as it fails (a key
 * is never dropped for good, as in controller-runtime); a Conflict re-adds it at once without counting (another writer
 * won; re-read and converge). A {@link PermanentError} is logged and not retried: the reconcile that threw it recorded
 * the failure in the object's status (`failed` with the cause), and the object's next change brings the key back.
 */
export class Controller {
  readonly queue: WorkQueue<string>;
  private readonly informers: Informer<KubeObject>[] = [];
  private workers: Promise<void>[] = [];
  private readonly stopper = new AbortController();

  constructor(private readonly opts: ControllerOptions) {
    this.queue = new WorkQueue<string>(opts.rateLimiter);
    if (opts.metrics) this.queue.metrics = opts.metrics;
  }

  /** Enqueue keys from an informer's events; `map` turns an object into the keys to reconcile (default: its own key). */
  watch<T extends KubeObject>(informer: Informer<T>, map: (obj: Stored<T>) => string[] = (o) => [objectKey(o)]): this {
    const enqueue = (o: Stored<T>): void => {
      for (const k of map(o)) this.queue.add(k);
    };
    informer.addHandler({ onAdd: enqueue, onUpdate: (_old, o) => enqueue(o), onDelete: enqueue });
    this.informers.push(informer as unknown as Informer<KubeObject>);
    return this;
  }

  /** Waits for every watched informer to sync, then runs the workers until `signal` aborts; resolves after they finish. */
  async run(signal: AbortSignal): Promise<void> {
    try {
      await Promise.all(this.informers.map((i) => i.waitForSync(signal)));
    } catch {
      this.queue.shutDown();
      return;
    }
    const onAbort = (): void => this.queue.shutDown();
    signal.addEventListener('abort', onAbort, { once: true });
    if (signal.aborted) this.queue.shutDown();
    this.start(signal);
    await Promise.all(this.workers);
    signal.removeEventListener('abort', onAbort);
  }

  /** Starts the workers now (without waiting for informers); `stop` ends them. */
  start(signal: AbortSignal = this.stopper.signal, workers = this.opts.workers ?? 5): void {
    for (let i = 0; i < workers; i++) this.workers.push(this.worker(signal));
  }

  /** Shuts the queue down and waits for the keys being reconciled. */
  async stop(): Promise<void> {
    this.stopper.abort();
    this.queue.shutDown();
    await Promise.allSettled(this.workers);
    this.workers = [];
  }

  private async worker(signal: AbortSignal): Promise<void> {
    for (;;) {
      const key = await this.queue.get();
      if (key === undefined) return;
      const started = performance.now();
      let result: 'success' | 'requeue' | 'error' = 'success';
      try {
        const r = await this.opts.reconcile(key, signal);
        if (r?.requeue) result = 'requeue';
        if (r?.requeue) this.queue.addRateLimited(key);
        else {
          this.queue.forget(key);
          if (r?.requeueAfterMs !== undefined) this.queue.addAfter(key, r.requeueAfterMs);
        }
      } catch (err) {
        result = 'error';
        if (isConflict(err)) {
          // Marked dirty while processing: done() below hands it out again.
          this.queue.add(key);
        } else if (this.opts.quietDrop?.(err)) {
          this.queue.forget(key);
          continue;
        } else if (isPermanentError(err)) {
          this.queue.forget(key);
          this.opts.logger?.error(`${this.opts.name}: reconcile ${key} failed permanently (not retried)`, err);
          continue;
        } else {
          this.queue.addRateLimited(key);
        }
        if (!isConflict(err)) this.opts.logger?.error(`${this.opts.name}: reconcile ${key} failed`, err);
      } finally {
        this.opts.metrics?.reconciled((performance.now() - started) / 1000, result);
        this.queue.done(key);
      }
    }
  }
}
