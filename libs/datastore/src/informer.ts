import type { Datastore } from './datastore.js';
import { isGone } from './errors.js';
import { compileSelector } from './label-selector.js';
import type { KubeObject, LabelSelector, ResourceKind, Stored } from './types.js';

export interface InformerHandler<T extends KubeObject> {
  onAdd?(obj: Stored<T>): void;
  /** Also called with old === new on each resync. */
  onUpdate?(oldObj: Stored<T>, newObj: Stored<T>): void;
  onDelete?(obj: Stored<T>): void;
}

export interface InformerOptions<T extends KubeObject> {
  store: Datastore;
  kind: ResourceKind<T>;
  namespace?: string;
  labelSelector?: LabelSelector;
  /** Re-deliver every cached object to the handlers at this interval (Longhorn: 30 s). 0 = never. */
  resyncMs?: number;
  /** Delay before re-watching after a failed watch. Default 500 ms. */
  retryDelayMs?: number;
  /** Receives watch/list errors (the informer keeps retrying). */
  onError?: (err: unknown) => void;
}

/** `namespace/name`, or `name` for cluster-scoped objects (client-go's MetaNamespaceKeyFunc). */
export function objectKey(obj: KubeObject): string {
  return obj.metadata.namespace ? `${obj.metadata.namespace}/${obj.metadata.name}` : obj.metadata.name;
}
export function splitKey(key: string): { namespace?: string; name: string } {
  const i = key.indexOf('/');
  return i < 0 ? { name: key } : { namespace: key.slice(0, i), name: key.slice(i + 1) };
}

/**
 * A cache of one kind kept current by list + watch. It resumes the watch from the last seen
 * resourceVersion after an interruption and re-lists on 410 Gone, delivering the differences to its handlers.
 */
export class Informer<T extends KubeObject> {
  private readonly cache = new Map<string, Stored<T>>();
  private readonly handlers: InformerHandler<T>[] = [];
  private synced = false;
  private syncWaiters: (() => void)[] = [];
  private running = false;
  constructor(private readonly opts: InformerOptions<T>) {}

  get kind(): ResourceKind<T> {
    return this.opts.kind;
  }
  addHandler(h: InformerHandler<T>): void {
    this.handlers.push(h);
    if (this.synced) for (const o of this.cache.values()) h.onAdd?.(o);
  }
  hasSynced(): boolean {
    return this.synced;
  }
  waitForSync(signal?: AbortSignal): Promise<void> {
    if (this.synced) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const onAbort = (): void => reject(signal?.reason ?? new Error('aborted'));
      signal?.addEventListener('abort', onAbort, { once: true });
      this.syncWaiters.push(() => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      });
    });
  }
  get(name: string, namespace?: string): Stored<T> | undefined {
    const o = this.cache.get(namespace ? `${namespace}/${name}` : name);
    return o ? structuredClone(o) : undefined;
  }
  list(selector?: LabelSelector): Stored<T>[] {
    const sel = compileSelector(selector);
    return [...this.cache.values()].filter((o) => sel.matches(o.metadata.labels)).map((o) => structuredClone(o));
  }

  /** Runs until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    if (this.running) throw new Error('informer is already running');
    this.running = true;
    const resync = this.opts.resyncMs
      ? setInterval(() => {
          for (const o of this.cache.values()) for (const h of this.handlers) h.onUpdate?.(o, o);
        }, this.opts.resyncMs)
      : undefined;
    try {
      let rv: string | undefined;
      while (!signal.aborted) {
        try {
          if (rv === undefined) rv = await this.relist();
          for await (const ev of this.opts.store.watch(this.opts.kind, {
            namespace: this.opts.namespace,
            labelSelector: this.opts.labelSelector,
            resourceVersion: rv,
            signal,
          })) {
            rv = ev.object.metadata.resourceVersion;
            if (ev.type === 'BOOKMARK') continue;
            this.apply(ev.type, ev.object);
          }
        } catch (err) {
          if (signal.aborted) break;
          if (isGone(err)) rv = undefined;
          this.opts.onError?.(err);
          await sleep(this.opts.retryDelayMs ?? 500, signal);
        }
      }
    } finally {
      if (resync) clearInterval(resync);
      this.running = false;
    }
  }

  private async relist(): Promise<string> {
    const { items, resourceVersion } = await this.opts.store.list(this.opts.kind, { namespace: this.opts.namespace, labelSelector: this.opts.labelSelector });
    const seen = new Set<string>();
    for (const o of items) {
      seen.add(objectKey(o));
      this.apply('ADDED', o);
    }
    for (const [key, o] of [...this.cache]) if (!seen.has(key)) this.apply('DELETED', o);
    if (!this.synced) {
      this.synced = true;
      for (const w of this.syncWaiters.splice(0)) w();
    }
    return resourceVersion;
  }

  private apply(type: 'ADDED' | 'MODIFIED' | 'DELETED', obj: Stored<T>): void {
    const key = objectKey(obj);
    const old = this.cache.get(key);
    if (type === 'DELETED') {
      if (!old) return;
      this.cache.delete(key);
      for (const h of this.handlers) h.onDelete?.(obj);
      return;
    }
    if (old && old.metadata.resourceVersion === obj.metadata.resourceVersion) return;
    this.cache.set(key, obj);
    for (const h of this.handlers) {
      if (old) h.onUpdate?.(old, obj);
      else h.onAdd?.(obj);
    }
  }
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done(): void {
      clearTimeout(t);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}
