import { CustomObjectsApi, KubeConfig, Watch } from '@kubernetes/client-node';
import {
  ConflictError,
  GoneError,
  InvalidError,
  StatusError,
  groupOf,
  isConflict,
  type CreateOptions,
  type Datastore,
  type DeleteOptions,
  type KubeObject,
  type LabelSelector,
  type ListOptions,
  type ListResult,
  type ResourceKind,
  type Stored,
  type WatchEvent,
  type WatchOptions,
} from '@bis/datastore';
import { ApiAccess, type ApiVerb } from './api-access.js';
import { isApiException, statusToError } from './status-errors.js';
import { WireFormat } from './wire-format.js';

export interface KubeDatastoreOptions {
  kubeConfig: KubeConfig;
  /** Namespace for namespaced objects that do not name one (Longhorn: `longhorn-system`). */
  defaultNamespace?: string;
  /** Calls allowed (defaults to `API_RESOURCE_USES`). */
  access?: ApiAccess;
  /** Retries of an unconditional update (no resourceVersion given) when the object changes in between. Default 5. */
  unconditionalUpdateRetries?: number;
  /** Consecutive failed watch re-connects before the watch fails. Default 5. */
  watchReconnectAttempts?: number;
  /**
   * The serialisation of objects to and from the API server (default: the Longhorn kinds of `@bis/crd-types`, empty
   * optional strings omitted on write and read back as empty; see {@link WireFormat}).
   */
  wireFormat?: WireFormat;
}

/** Converts a datastore label selector to the query-string syntax of the Kubernetes API. */
export function selectorToString(sel: LabelSelector | undefined): string | undefined {
  if (sel === undefined) return undefined;
  if (typeof sel === 'string') return sel || undefined;
  const terms: string[] = [];
  for (const [k, v] of Object.entries(sel.matchLabels ?? {})) terms.push(`${k}=${v}`);
  for (const r of sel.matchExpressions ?? []) {
    if (r.operator === 'Exists') terms.push(r.key);
    else if (r.operator === 'DoesNotExist') terms.push(`!${r.key}`);
    else terms.push(`${r.key} ${r.operator === 'In' ? 'in' : 'notin'} (${(r.values ?? []).join(',')})`);
  }
  return terms.length ? terms.join(',') : undefined;
}

/** What a DELETE of a custom resource answers when the object is gone at once. */
type DeleteStatus = { kind: 'Status'; status?: string; message?: string; details?: { name?: string; uid?: string } };
type RawEvent = { type: string; object: Record<string, unknown> };
type QueueItem = { event: RawEvent } | { end: unknown };

/**
 * The datastore on a Kubernetes API server, through @kubernetes/client-node's CustomObjectsApi and Watch.
 * Same semantics as the embedded store: optimistic concurrency (resourceVersion, 409 Conflict), the status
 * subresource (`updateStatus` -> PUT .../status), finalizers and deletionTimestamp (the API server's), 410 Gone for
 * watches from a compacted resourceVersion, and BOOKMARK events. Only kinds in an API group (CRDs) are supported.
 */
export class KubeDatastore implements Datastore {
  private readonly api: CustomObjectsApi;
  private readonly watcher: Watch;
  private readonly access: ApiAccess;
  private readonly defaultNamespace: string | undefined;
  private readonly updateRetries: number;
  private readonly reconnects: number;
  private readonly wire: WireFormat;
  private readonly open = new Set<AbortController>();
  private closed = false;

  constructor(opts: KubeDatastoreOptions) {
    this.api = opts.kubeConfig.makeApiClient(CustomObjectsApi);
    this.watcher = new Watch(opts.kubeConfig);
    this.access = opts.access ?? new ApiAccess();
    this.defaultNamespace = opts.defaultNamespace;
    this.updateRetries = opts.unconditionalUpdateRetries ?? 5;
    this.reconnects = opts.watchReconnectAttempts ?? 5;
    this.wire = opts.wireFormat ?? new WireFormat();
  }

  /** An object as the API server answered it, as the code reads it. */
  private read<T>(kind: ResourceKind, obj: T): T {
    return this.wire.fromWire(obj, kind);
  }

  private target(kind: ResourceKind, verb: ApiVerb, sub = ''): { group: string; version: string; plural: string } {
    const group = groupOf(kind.apiVersion);
    if (!group) throw new Error(`KubeDatastore stores custom resources only; ${kind.kind} (${kind.apiVersion}) has no API group`);
    this.access.require(group, kind.plural + sub, verb);
    return { group, version: kind.apiVersion.slice(group.length + 1), plural: kind.plural };
  }

  private ns(kind: ResourceKind, namespace: string | undefined, name: string): string | undefined {
    if (!kind.namespaced) return undefined;
    const ns = namespace || this.defaultNamespace;
    if (!ns) throw new InvalidError(kind, name, [{ field: 'metadata.namespace', message: 'Required value' }]);
    return ns;
  }

  private async call<R>(kind: ResourceKind, name: string, fn: () => Promise<R>): Promise<R> {
    if (this.closed) throw new Error('datastore is closed');
    try {
      return await fn();
    } catch (err) {
      if (isApiException(err)) throw statusToError(kind, name, err.code, err.body);
      throw err;
    }
  }

  async get<T extends KubeObject>(kind: ResourceKind<T>, name: string, namespace?: string): Promise<Stored<T>> {
    const t = this.target(kind, 'get');
    const ns = this.ns(kind, namespace, name);
    const got = (await this.call(kind, name, () =>
      ns === undefined ? this.api.getClusterCustomObject({ ...t, name }) : this.api.getNamespacedCustomObject({ ...t, namespace: ns, name }),
    )) as Stored<T>;
    return this.read(kind, got);
  }

  async list<T extends KubeObject>(kind: ResourceKind<T>, opts: ListOptions = {}): Promise<ListResult<T>> {
    const t = this.target(kind, 'list');
    const labelSelector = selectorToString(opts.labelSelector);
    const ns = kind.namespaced ? opts.namespace : undefined;
    const res = (await this.call(kind, '', () =>
      !kind.namespaced
        ? this.api.listClusterCustomObject({ ...t, labelSelector })
        : ns === undefined
          ? this.api.listCustomObjectForAllNamespaces({ ...t, labelSelector })
          : this.api.listNamespacedCustomObject({ ...t, namespace: ns, labelSelector }),
    ).catch((err: unknown) => {
      // The API server's parse error does not quote the selector ("unable to parse requirement: ..."): name it.
      if (labelSelector && err instanceof StatusError && err.code === 400) {
        throw new StatusError('BadRequest', 400, `invalid label selector "${labelSelector}": ${err.message}`);
      }
      throw err;
    })) as { items?: Stored<T>[]; metadata?: { resourceVersion?: string } };
    const items = (res.items ?? []).map((o) => this.read(kind, { ...o, apiVersion: o.apiVersion ?? kind.apiVersion, kind: o.kind ?? kind.kind }));
    return { items, resourceVersion: res.metadata?.resourceVersion ?? '' };
  }

  /**
   * POST. The API server drops `status` on create when the kind has a status subresource; with `keepStatus` the
   * given status is written right after through the status subresource (one resourceVersion later).
   */
  async create<T extends KubeObject>(kind: ResourceKind<T>, obj: T, opts?: CreateOptions): Promise<Stored<T>> {
    const t = this.target(kind, 'create');
    const name = obj.metadata?.name ?? '';
    const ns = this.ns(kind, obj.metadata?.namespace, name);
    const body = this.wire.toWire({ ...obj, metadata: { ...obj.metadata, ...(ns ? { namespace: ns } : {}) } }, kind);
    const created = this.read(kind, (await this.call(kind, name, () =>
      ns === undefined ? this.api.createClusterCustomObject({ ...t, body }) : this.api.createNamespacedCustomObject({ ...t, namespace: ns, body }),
    )) as Stored<T>);
    const status = (obj as { status?: unknown }).status;
    if (opts?.keepStatus && kind.statusSubresource && status !== undefined) {
      return this.updateStatus(kind, { ...created, status } as T);
    }
    return created;
  }

  update<T extends KubeObject>(kind: ResourceKind<T>, obj: T): Promise<Stored<T>> {
    return this.replace(kind, obj, '');
  }

  updateStatus<T extends KubeObject>(kind: ResourceKind<T>, obj: T): Promise<Stored<T>> {
    return this.replace(kind, obj, kind.statusSubresource ? '/status' : '');
  }

  /**
   * PUT. The API server refuses a custom-resource update without resourceVersion, while the datastore contract
   * makes an empty resourceVersion mean "unconditional": read the current version and retry on conflict.
   */
  private async replace<T extends KubeObject>(kind: ResourceKind<T>, obj: T, sub: '' | '/status'): Promise<Stored<T>> {
    const t = this.target(kind, 'update', sub);
    const name = obj.metadata?.name;
    if (!name) throw new InvalidError(kind, '', [{ field: 'metadata.name', message: 'Required value: name is required' }]);
    const ns = this.ns(kind, obj.metadata.namespace, name);
    const conditional = !!obj.metadata.resourceVersion;
    for (let attempt = 0; ; attempt++) {
      let body: T = obj;
      if (!conditional) {
        const cur = await this.get(kind, name, ns);
        if (obj.metadata.uid && obj.metadata.uid !== cur.metadata.uid) {
          throw new ConflictError(kind, name, `Precondition failed: UID in precondition: ${obj.metadata.uid}, UID in object meta: ${cur.metadata.uid}`);
        }
        body = { ...obj, metadata: { ...obj.metadata, resourceVersion: cur.metadata.resourceVersion } };
      }
      const withNs = this.wire.toWire({ ...body, metadata: { ...body.metadata, ...(ns ? { namespace: ns } : {}) } }, kind);
      try {
        return this.read(kind, (await this.call(kind, name, () => {
          if (ns === undefined) {
            return sub ? this.api.replaceClusterCustomObjectStatus({ ...t, name, body: withNs }) : this.api.replaceClusterCustomObject({ ...t, name, body: withNs });
          }
          return sub
            ? this.api.replaceNamespacedCustomObjectStatus({ ...t, namespace: ns, name, body: withNs })
            : this.api.replaceNamespacedCustomObject({ ...t, namespace: ns, name, body: withNs });
        })) as Stored<T>);
      } catch (err) {
        if (conditional || !isConflict(err) || attempt >= this.updateRetries) throw err;
      }
    }
  }

  async delete<T extends KubeObject>(kind: ResourceKind<T>, name: string, namespace?: string, opts: DeleteOptions = {}): Promise<Stored<T>> {
    const t = this.target(kind, 'delete');
    const ns = this.ns(kind, namespace, name);
    const body = { apiVersion: 'v1', kind: 'DeleteOptions', propagationPolicy: opts.propagationPolicy ?? 'Background', ...(opts.preconditions ? { preconditions: opts.preconditions } : {}) };
    const res = (await this.call(kind, name, () =>
      ns === undefined
        ? this.api.deleteClusterCustomObject({ ...t, name, propagationPolicy: body.propagationPolicy, body })
        : this.api.deleteNamespacedCustomObject({ ...t, namespace: ns, name, propagationPolicy: body.propagationPolicy, body }),
    )) as Stored<T> | DeleteStatus;
    if ((res as { kind?: string }).kind === 'Status') {
      // The API server answers an immediate deletion of a custom resource with a `Status` (Success + details), not
      // the object (its registry does not return deleted objects for CRs): report the object as it is identified.
      const st = res as DeleteStatus;
      if (st.status !== 'Success') {
        throw new StatusError('InternalError', 500, `delete of ${kind.plural} "${name}": ${st.message ?? st.status ?? 'unexpected Status'}`);
      }
      return {
        apiVersion: kind.apiVersion,
        kind: kind.kind,
        metadata: { name: st.details?.name ?? name, ...(ns ? { namespace: ns } : {}), ...(st.details?.uid ? { uid: st.details.uid } : {}) },
      } as unknown as Stored<T>;
    }
    return this.read(kind, res as Stored<T>);
  }

  watch<T extends KubeObject>(kind: ResourceKind<T>, opts: WatchOptions = {}): AsyncIterable<WatchEvent<T>> {
    return { [Symbol.asyncIterator]: () => this.watchEvents(kind, opts)[Symbol.asyncIterator]() };
  }

  private collectionPath(kind: ResourceKind, namespace: string | undefined): string {
    const group = groupOf(kind.apiVersion);
    return namespace === undefined ? `/apis/${kind.apiVersion}/${kind.plural}` : `/apis/${group}/${kind.apiVersion.slice(group.length + 1)}/namespaces/${encodeURIComponent(namespace)}/${kind.plural}`;
  }

  /**
   * List+watch. Without a resourceVersion the current objects are delivered as ADDED (from a list) and the watch
   * starts at the list's version. A watch the server ends (timeout, API server restart) is re-opened from the last
   * seen version (events or bookmarks); a 410 there is reported as GoneError, after which the caller re-lists.
   */
  private async *watchEvents<T extends KubeObject>(kind: ResourceKind<T>, opts: WatchOptions): AsyncGenerator<WatchEvent<T>> {
    this.target(kind, 'watch');
    const ns = kind.namespaced ? opts.namespace : undefined;
    const labelSelector = selectorToString(opts.labelSelector);
    let rv = opts.resourceVersion;
    if (rv === undefined || rv === '' || rv === '0') {
      const listed = await this.list(kind, { namespace: ns, labelSelector: opts.labelSelector });
      rv = listed.resourceVersion;
      for (const o of listed.items) {
        if (opts.signal?.aborted || this.closed) return;
        yield { type: 'ADDED', object: o };
      }
    }
    const path = this.collectionPath(kind, ns);
    let failures = 0;
    let lastDelivered = Date.now();
    while (!opts.signal?.aborted && !this.closed) {
      const queue: QueueItem[] = [];
      let wake: (() => void) | undefined;
      const push = (item: QueueItem): void => {
        queue.push(item);
        wake?.();
      };
      const ac = new AbortController();
      this.open.add(ac);
      const onAbort = (): void => ac.abort();
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      let serverController: AbortController | undefined;
      try {
        serverController = await this.watcher.watch(
          path,
          { resourceVersion: rv, labelSelector, allowWatchBookmarks: true },
          (type: string, object: Record<string, unknown>) => push({ event: { type, object } }),
          (err: unknown) => push({ end: err ?? null }),
        );
        ac.signal.addEventListener('abort', () => serverController?.abort(), { once: true });
        if (ac.signal.aborted) serverController.abort();
        for (;;) {
          if (!queue.length) {
            const waitMs = opts.bookmarkIntervalMs ? Math.max(0, opts.bookmarkIntervalMs - (Date.now() - lastDelivered)) : undefined;
            const got = await new Promise<boolean>((resolve) => {
              const t = waitMs !== undefined ? setTimeout(() => resolve(false), waitMs) : undefined;
              const done = (): void => {
                if (t) clearTimeout(t);
                ac.signal.removeEventListener('abort', done);
                resolve(true);
              };
              wake = done;
              ac.signal.addEventListener('abort', done, { once: true });
            });
            wake = undefined;
            if (ac.signal.aborted) return;
            if (!got && opts.bookmarkIntervalMs) {
              // No traffic for the requested interval: tell the caller the version it is current at.
              lastDelivered = Date.now();
              yield bookmark<T>(kind, rv ?? '');
            }
            continue;
          }
          const item = queue.shift() as QueueItem;
          if ('end' in item) {
            if (ac.signal.aborted) return;
            if (item.end) {
              const code = (item.end as { statusCode?: number }).statusCode;
              if (code === 410) throw new GoneError(rv ?? '', '?');
              if (code !== undefined) throw new StatusError(code === 400 ? 'BadRequest' : 'InternalError', code, `watch ${path}: HTTP ${code}`);
              if (++failures > this.reconnects) throw item.end;
              await new Promise((r) => setTimeout(r, Math.min(1000, 50 * 2 ** failures)));
            }
            break; // re-open from rv
          }
          const ev = item.event;
          if (ev.type === 'ERROR') {
            const st = ev.object as { code?: number };
            throw statusToError(kind, '', st.code ?? 500, st);
          }
          failures = 0;
          const meta = (ev.object.metadata ?? {}) as { resourceVersion?: string };
          if (meta.resourceVersion) rv = meta.resourceVersion;
          if (ev.type === 'BOOKMARK') {
            if (!opts.bookmarkIntervalMs) continue;
            lastDelivered = Date.now();
            yield bookmark<T>(kind, rv ?? '');
            continue;
          }
          if (ev.type !== 'ADDED' && ev.type !== 'MODIFIED' && ev.type !== 'DELETED') continue;
          lastDelivered = Date.now();
          yield { type: ev.type, object: this.read(kind, ev.object as unknown as Stored<T>) };
        }
      } finally {
        opts.signal?.removeEventListener('abort', onAbort);
        ac.abort();
        serverController?.abort();
        this.open.delete(ac);
      }
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const ac of this.open) ac.abort();
    this.open.clear();
  }
}

function bookmark<T extends KubeObject>(kind: ResourceKind<T>, resourceVersion: string): WatchEvent<T> {
  return { type: 'BOOKMARK', object: { apiVersion: kind.apiVersion, kind: kind.kind, metadata: { name: '', resourceVersion } } as unknown as Stored<T> };
}

/**
 * A KubeConfig for an API endpoint and bearer token (tests, or a manager outside the cluster). client-node refuses
 * plain `http:` unless skipTLSVerify is set, so it is set for `http:` endpoints (there is no TLS to verify).
 */
export function kubeConfigFor(server: string, token: string, skipTLSVerify = server.startsWith('http:')): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'bis', server, skipTLSVerify }],
    users: [{ name: 'bis', token }],
    contexts: [{ name: 'bis', cluster: 'bis', user: 'bis' }],
    currentContext: 'bis',
  });
  return kc;
}
