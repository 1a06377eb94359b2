import { isGone, type Datastore, type KubeObject, type ResourceKind, type Stored } from '@bis/datastore';

export type InformerEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'RESYNC';
export type InformerHandler<T extends KubeObject> = (type: InformerEventType, obj: Stored<T>, old?: Stored<T>) => void;

/**
 * One list+watch loop per kind, fanned out to handlers, with a periodic resync that re-delivers every object
 * (Longhorn's informer resync, 30 s). A watch that fails with Gone re-lists; other errors retry after a second.
 * Keeps the last seen object of each name so handlers get the old object on updates.
 */
export class SharedInformers {
  private readonly loops: Promise<void>[] = [];
  private readonly ac = new AbortController();
  private readonly caches = new Map<ResourceKind, Map<string, Stored<KubeObject>>>();
  private readonly handlers = new Map<ResourceKind, InformerHandler<KubeObject>[]>();
  private readonly synced = new Map<ResourceKind, Promise<void>>();
  private started = false;
  private readonly syncedKinds = new Set<ResourceKind>();

  constructor(
    private readonly store: Datastore,
    private readonly namespace: string,
    private readonly resyncMs: number,
    private readonly log: (line: string) => void = () => {},
  ) {}

  on<T extends KubeObject>(kind: ResourceKind<T>, handler: InformerHandler<T>): void {
    if (this.started) throw new Error('handlers must be registered before start()');
    const list = this.handlers.get(kind) ?? [];
    list.push(handler as unknown as InformerHandler<KubeObject>);
    this.handlers.set(kind, list);
  }

  /** One cached object by name (undefined when absent or before the first list). Treat it as read-only. */
  cachedGet<T extends KubeObject>(kind: ResourceKind<T>, name: string): Stored<T> | undefined {
    return this.caches.get(kind)?.get(name) as Stored<T> | undefined;
  }

  /** Whether the first list of a kind completed (its cache is usable). */
  hasSynced(kind: ResourceKind): boolean {
    return this.syncedKinds.has(kind);
  }

  /** The last observed objects of a kind (empty before the first list). Treat them as read-only. */
  cached<T extends KubeObject>(kind: ResourceKind<T>): Stored<T>[] {
    return [...(this.caches.get(kind)?.values() ?? [])] as Stored<T>[];
  }

  start(): void {
    this.started = true;
    for (const kind of this.handlers.keys()) {
      let markSynced!: () => void;
      this.synced.set(kind, new Promise((r) => (markSynced = r)));
      this.loops.push(this.run(kind, markSynced));
    }
  }

  /** Resolves when every kind has been listed once. */
  async waitForSync(): Promise<void> {
    await Promise.all(this.synced.values());
  }

  async stop(): Promise<void> {
    this.ac.abort();
    await Promise.allSettled(this.loops);
  }

  private emit(kind: ResourceKind, type: InformerEventType, obj: Stored<KubeObject>, old?: Stored<KubeObject>): void {
    for (const h of this.handlers.get(kind) ?? []) {
      try {
        h(type, obj, old);
      } catch (err) {
        this.log(`informer handler for ${kind.kind} failed: ${(err as Error).message}`);
      }
    }
  }

  private async run(kind: ResourceKind, markSynced: () => void): Promise<void> {
    const signal = this.ac.signal;
    const cache = new Map<string, Stored<KubeObject>>();
    this.caches.set(kind, cache);
    const resync = setInterval(() => {
      for (const o of cache.values()) this.emit(kind, 'RESYNC', o);
    }, this.resyncMs);
    resync.unref();
    try {
      while (!signal.aborted) {
        try {
          const listed = await this.store.list(kind, { namespace: this.namespace });
          const seen = new Set<string>();
          for (const o of listed.items) {
            seen.add(o.metadata.name);
            const old = cache.get(o.metadata.name);
            cache.set(o.metadata.name, o);
            this.emit(kind, old ? 'MODIFIED' : 'ADDED', o, old);
          }
          for (const [name, o] of [...cache]) {
            if (!seen.has(name)) {
              cache.delete(name);
              this.emit(kind, 'DELETED', o);
            }
          }
          markSynced();
          this.syncedKinds.add(kind);
          for await (const ev of this.store.watch(kind, { namespace: this.namespace, resourceVersion: listed.resourceVersion, signal })) {
            if (ev.type === 'BOOKMARK') continue;
            const name = ev.object.metadata.name;
            const old = cache.get(name);
            if (ev.type === 'DELETED') cache.delete(name);
            else cache.set(name, ev.object);
            this.emit(kind, ev.type, ev.object, old);
          }
        } catch (err) {
          if (signal.aborted) break;
          if (!isGone(err)) this.log(`watch of ${kind.kind} failed: ${(err as Error).message}; retrying`);
          await new Promise((r) => setTimeout(r, isGone(err) ? 0 : 1000));
        }
      }
    } finally {
      clearInterval(resync);
      this.syncedKinds.delete(kind);
      markSynced();
    }
  }
}
