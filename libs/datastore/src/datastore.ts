import type { DeleteOptions, KubeObject, ListOptions, ListResult, ResourceKind, Stored, WatchEvent, WatchOptions } from './types.js';

export interface CreateOptions {
  /** Keep the given `status` even when the kind has a status subresource. Default false (Kubernetes drops it). */
  keepStatus?: boolean;
}

/**
 * A store of Kubernetes-style objects with Kubernetes semantics. Implementations: the embedded store
 * (`EmbeddedDatastore`, this lib) and a Kubernetes API server implementation. Every method rejects with a
 * `StatusError` subclass (NotFound, AlreadyExists, Conflict, Gone, Invalid) on the matching condition.
 */
export interface Datastore {
  get<T extends KubeObject>(kind: ResourceKind<T>, name: string, namespace?: string): Promise<Stored<T>>;
  list<T extends KubeObject>(kind: ResourceKind<T>, opts?: ListOptions): Promise<ListResult<T>>;
  /** Events after `opts.resourceVersion` in order; rejects (on first `next()`) with GoneError when that version is no longer kept. */
  watch<T extends KubeObject>(kind: ResourceKind<T>, opts?: WatchOptions): AsyncIterable<WatchEvent<T>>;
  /**
   * AlreadyExists if the name is taken. Sets uid, resourceVersion, generation=1, creationTimestamp.
   * With a status subresource the given `status` is dropped (like Kubernetes) unless `opts.keepStatus` is true:
   * then the object is created with its status in one step (a Kubernetes API server needs create + updateStatus,
   * so there the status appears one resourceVersion later).
   */
  create<T extends KubeObject>(kind: ResourceKind<T>, obj: T, opts?: CreateOptions): Promise<Stored<T>>;
  /**
   * Replaces the object. Conflict when `metadata.resourceVersion` is set and stale (empty = unconditional).
   * With a status subresource the `status` in `obj` is ignored. Any change outside metadata/status bumps generation.
   * Removing the last finalizer of an object with a deletionTimestamp deletes it.
   */
  update<T extends KubeObject>(kind: ResourceKind<T>, obj: T): Promise<Stored<T>>;
  /** Status subresource: only `status` is taken from `obj`. Same Conflict rule as update. */
  updateStatus<T extends KubeObject>(kind: ResourceKind<T>, obj: T): Promise<Stored<T>>;
  /**
   * Deletes the object. With finalizers (or Foreground/Orphan propagation) it only sets deletionTimestamp
   * and returns the object; it disappears when its finalizers are gone. Returns the last state.
   */
  delete<T extends KubeObject>(kind: ResourceKind<T>, name: string, namespace?: string, opts?: DeleteOptions): Promise<Stored<T>>;
  /** Releases files and ends every watch. */
  close(): Promise<void>;
}

/**
 * A store that can hand out its committed objects themselves instead of copies, for readers that only read (the REST
 * lists). A stored object is replaced, never changed, when it is written, so the same object (`===`) in two lists is
 * the same version: a reader may keep what it derived from an object (a rendered reply) for as long as the object
 * lives, in a `WeakMap`. Callers must not change the objects.
 */
export interface SharedReads {
  listShared<T extends KubeObject>(kind: ResourceKind<T>, opts?: ListOptions): { items: readonly Stored<T>[]; resourceVersion: string };
  /** `get` without the copy: the committed object itself (NotFoundError when absent). */
  getShared<T extends KubeObject>(kind: ResourceKind<T>, name: string, namespace?: string): Stored<T>;
  /** `update` that answers with the committed object itself instead of a copy. */
  updateShared<T extends KubeObject>(kind: ResourceKind<T>, input: T): Promise<Stored<T>>;
  /** `updateStatus` that answers with the committed object itself instead of a copy. */
  updateStatusShared<T extends KubeObject>(kind: ResourceKind<T>, input: T): Promise<Stored<T>>;
}

/** `store` as {@link SharedReads} when it offers them (the embedded store does; a Kubernetes API server does not). */
export function sharedReadsOf(store: Datastore): SharedReads | undefined {
  const s = store as Datastore & Partial<SharedReads>;
  return typeof s.listShared === 'function' ? (s as Datastore & SharedReads) : undefined;
}

/**
 * `get` for a caller that only reads the object: the committed object itself where the store shares it
 * ({@link SharedReads}), a copy otherwise. Rejects with NotFoundError like `get`.
 */
export async function getForReading<T extends KubeObject>(store: Datastore, kind: ResourceKind<T>, name: string, namespace?: string): Promise<Stored<T>> {
  const shared = sharedReadsOf(store);
  return shared ? shared.getShared(kind, name, namespace) : store.get(kind, name, namespace);
}

/**
 * `update` for a writer that only reads the answer or ignores it: the answer is the committed object itself where the
 * store shares it ({@link SharedReads}; no copy of a large object per write), a copy otherwise.
 */
export function updateForReading<T extends KubeObject>(store: Datastore, kind: ResourceKind<T>, input: T): Promise<Stored<T>> {
  const shared = sharedReadsOf(store);
  return shared ? shared.updateShared(kind, input) : store.update(kind, input);
}

/** `updateStatus` for a writer that only reads the answer or ignores it (see {@link updateForReading}). */
export function updateStatusForReading<T extends KubeObject>(store: Datastore, kind: ResourceKind<T>, input: T): Promise<Stored<T>> {
  const shared = sharedReadsOf(store);
  return shared ? shared.updateStatusShared(kind, input) : store.updateStatus(kind, input);
}
