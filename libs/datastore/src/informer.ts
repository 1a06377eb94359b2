import { cloneObject } from './json-value.js';
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
  /**
   * The cache key: the name alone when the informer watches one namespace (every object it holds is in it, or
   * cluster-scoped), so that a read by name builds no string (the manager reconcile reads two objects per image of its
   * disk); `namespace/name` otherwise.
   */
  private keyOf(obj: KubeObject): string {
    return this.opts.namespace !== undefined ? obj.metadata.name : objectKey(obj);
  }
  private lookup(name: string, namespace: string | undefined): Stored<T> | undefined {
    if (this.opts.namespace === undefined) return this.cache.get(namespace ? `${namespace}/${name}` : name);
    if (namespace !== undefined && namespace !== this.opts.namespace) return undefined;
    return this.cache.get(name);
  }
  get(name: string, namespace?: string): Stored<T> | undefined {
    const o = this.lookup(name, namespace);
    return o ? cloneObject(o) : undefined;
  }
  list(selector?: LabelSelector): Stored<T>[] {
    const sel = compileSelector(selector);
    return [...this.cache.values()].filter((o) => sel.matches(o.metadata.labels)).map((o) => cloneObject(o));
  }
  /**
   * The cached object itself, not a copy: read-only, possibly a little stale (like a client-go lister). For loops over
   * many objects where a copy per read would dominate; writes based on it may conflict and are retried.
   */
  peek(name: string, namespace?: string): Stored<T> | undefined {
    return this.lookup(name, namespace);
  }
  /** Every cached object itself (read-only, see `peek`). */
  peekAll(): Stored<T>[] {
    return [...this.cache.values()];
  }
  /** Number of cached objects. */
  get size(): number {
    return this.cache.size;
  }

  /** Runs until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    if (this.running) throw new Error('informer is already running');
    this.running = true;
    const resync = this.opts.resyncMs
      ? setInterval(() => {
          for (const o of [...this.cache.values()]) for (const h of this.handlers) this.deliver(() => h.onUpdate?.(o, o));
        }, this.opts.resyncMs)
      : undefined;
    resync?.unref();
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
            // the cache and the handlers only read: no copy per event (see WatchOptions.shared)
            shared: true,
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
      seen.add(this.keyOf(o));
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
    const key = this.keyOf(obj);
    const old = this.cache.get(key);
    if (type === 'DELETED') {
      if (!old) return;
      this.cache.delete(key);
      for (const h of this.handlers) this.deliver(() => h.onDelete?.(obj));
      return;
    }
    if (old && old.metadata.resourceVersion === obj.metadata.resourceVersion) return;
    this.cache.set(key, obj);
    for (const h of this.handlers) this.deliver(() => (old ? h.onUpdate?.(old, obj) : h.onAdd?.(obj)));
  }

  /** A failing handler neither stops the others nor the watch: its error goes to `onError`. */
  private deliver(call: () => void): void {
    try {
      call();
    } catch (err) {
      this.opts.onError?.(err);
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

export type SharedInformerEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'RESYNC';
/** Receives every event of one kind; `old` is the previously cached object on MODIFIED. RESYNC re-delivers a cached object. */
export type SharedInformerHandler<T extends KubeObject> = (type: SharedInformerEventType, obj: Stored<T>, old?: Stored<T>) => void;

export interface SharedInformersOptions {
  store: Datastore;
  namespace?: string;
  /** Longhorn: 30 s. 0 = never. */
  resyncMs?: number;
  retryDelayMs?: number;
  onError?: (err: unknown, kind: ResourceKind) => void;
}

/**
 * One `Informer` (one list+watch and one cache) per kind, shared by every controller that registers a handler for
 * that kind (client-go's SharedInformerFactory).
 */
export class SharedInformers {
  private readonly informers = new Map<ResourceKind, Informer<KubeObject>>();
  private ac: AbortController | undefined;
  private loops: Promise<void>[] = [];

  constructor(private readonly opts: SharedInformersOptions) {}

  /** The shared informer of a kind (created on first use). */
  informerFor<T extends KubeObject>(kind: ResourceKind<T>): Informer<T> {
    let inf = this.informers.get(kind as ResourceKind);
    if (!inf) {
      inf = new Informer<KubeObject>({
        store: this.opts.store,
        kind: kind as ResourceKind,
        namespace: this.opts.namespace,
        resyncMs: this.opts.resyncMs,
        retryDelayMs: this.opts.retryDelayMs,
        onError: (err) => this.opts.onError?.(err, kind as ResourceKind),
      });
      this.informers.set(kind as ResourceKind, inf);
      if (this.ac) this.loops.push(inf.run(this.ac.signal));
    }
    return inf as unknown as Informer<T>;
  }

  /** Registers a handler for every event of `kind`. */
  on<T extends KubeObject>(kind: ResourceKind<T>, handler: SharedInformerHandler<T>): void {
    this.informerFor(kind).addHandler({
      onAdd: (o) => handler('ADDED', o),
      onUpdate: (old, o) => (old === o ? handler('RESYNC', o) : handler('MODIFIED', o, old)),
      onDelete: (o) => handler('DELETED', o),
    });
  }

  /** One cached object by name (read-only, see `Informer.peek`); undefined when absent or before the first list. */
  cachedGet<T extends KubeObject>(kind: ResourceKind<T>, name: string): Stored<T> | undefined {
    return this.informerFor(kind).peek(name, this.opts.namespace);
  }
  /** Every cached object of a kind (read-only; empty before the first list). */
  cached<T extends KubeObject>(kind: ResourceKind<T>): Stored<T>[] {
    return this.informerFor(kind).peekAll();
  }
  /** Whether the first list of a kind completed (its cache is usable). */
  hasSynced(kind: ResourceKind): boolean {
    return this.informers.get(kind)?.hasSynced() ?? false;
  }

  /** Starts every informer (and any created later) until `stop`. */
  start(): void {
    if (this.ac) return;
    this.ac = new AbortController();
    this.loops = [...this.informers.values()].map((i) => i.run(this.ac!.signal));
  }
  /** Resolves when every informer has listed once. */
  async waitForSync(signal?: AbortSignal): Promise<void> {
    await Promise.all([...this.informers.values()].map((i) => i.waitForSync(signal)));
  }
  async stop(): Promise<void> {
    this.ac?.abort();
    this.ac = undefined;
    await Promise.allSettled(this.loops);
    this.loops = [];
  }
}
