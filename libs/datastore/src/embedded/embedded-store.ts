import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import type { CreateOptions, Datastore } from '../datastore.js';
import { AlreadyExistsError, ConflictError, GoneError, InvalidError, NotFoundError, StatusError } from '../errors.js';
import { compileSelector, isValidLabelKey, isValidLabelValue, LabelSelectorError, type CompiledSelector } from '../label-selector.js';
import {
  FOREGROUND_FINALIZER,
  ORPHAN_FINALIZER,
  groupOf,
  type DeleteOptions,
  type KubeObject,
  type ListOptions,
  type ListResult,
  type ResourceKind,
  type Stored,
  type WatchEvent,
  type WatchOptions,
} from '../types.js';
import { LOG_NAME, LogAppender, fsyncDir, readLog, writeCompactedLog, writeLogTemp, type EventRecord, type LogBatchInfo, type LogRecord } from './log-file.js';

export interface EmbeddedDatastoreOptions {
  /** Directory holding `store.log` (created if missing). */
  dataDir: string;
  /** Events kept for watch resumption (across restarts too). Older resourceVersions get 410 Gone. Default 1000. */
  historyLimit?: number;
  /**
   * Upper bound of the history's size, as the length of its events' JSON (about their size in memory): the oldest
   * events are dropped beyond it even when fewer than `historyLimit` are kept (the newest event is always kept).
   * Big objects that change often (a manager's status with one entry per file) would otherwise make the history
   * grow with their size times `historyLimit`. Default 16 MiB.
   */
  historyMaxBytes?: number;
  /** Rewrite the log once this many events were appended since the last compaction. Default 5000. */
  compactAfterEvents?: number;
  /** Clock for creation/deletion timestamps (tests). */
  now?: () => Date;
  /**
   * How long `open` waits for the running owner of the directory's `LOCK` to exit before failing with "in use by
   * process <pid>". A dead owner (also a zombie, or a reused pid) never blocks. Default 15 s.
   */
  lockWaitMs?: number;
  /**
   * Called for every commit batch after its records are written to the log and before its fdatasync. A slow
   * hook holds the batch like a slow disk; a throw fails the batch exactly like an I/O error (fault injection).
   */
  beforeLogSync?: (batch: LogBatchInfo) => void | Promise<void>;
}

/** Counters of the commit pipeline since the store was opened. */
export interface CommitStats {
  /** Batches made durable (one fdatasync each). */
  batches: number;
  /** Changes in those batches. */
  events: number;
  /** Batches that failed (every change in them was rejected and rolled back). */
  failedBatches: number;
}

type AnyStored = Stored<KubeObject>;

/** Changes staged together: one log write, one fdatasync, one acknowledgement. */
interface CommitBatch {
  events: EventRecord[];
  /** Resolves when the batch is durable and applied; rejects when it failed. */
  done: Promise<void>;
  resolve(): void;
  reject(err: Error): void;
}

/** A staged (not yet durable) state of one object: `object` undefined = deleted. */
interface PendingObject {
  object: AnyStored | undefined;
  rv: number;
  batch: CommitBatch;
}

const NAME_RE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

const kindKeyOf = (kind: ResourceKind): string => `${groupOf(kind.apiVersion)}/${kind.kind}`;
const objKey = (k: string, namespace: string | undefined, name: string): string => `${k}|${namespace ?? ''}|${name}`;
const kindOfKey = (key: string): string => key.slice(0, key.indexOf('|'));
const clone = <T>(v: T): T => structuredClone(v);
const k8sTime = (d: Date): string => d.toISOString().replace(/\.\d{3}Z$/, 'Z');

/** Stable JSON for change detection (key order independent). */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

/** Everything except metadata and (optionally) status. */
function bodyOf(o: KubeObject, withStatus: boolean): Record<string, unknown> {
  const { metadata: _m, status, ...rest } = o as KubeObject & Record<string, unknown>;
  return withStatus ? { ...rest, status } : rest;
}

function newBatch(): CommitBatch {
  let resolve!: () => void;
  let reject!: (err: Error) => void;
  const done = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  // Every writer attaches its own handler; this one keeps a batch nobody waits for from being "unhandled".
  done.catch(() => undefined);
  return { events: [], done, resolve, reject };
}

/**
 * The embedded datastore: all objects in memory, every change appended to an fdatasync'ed JSON-lines log under
 * `dataDir` (see `log-file.ts`). One process owns a data directory at a time (`LOCK` file with its pid).
 *
 * Writes (group commit): a write is validated against the latest *staged* state (committed changes plus those
 * waiting for their sync), gets the next resourceVersion and joins the open batch. One batch at a time is
 * written and fdatasync'ed; writes arriving meanwhile form the next batch, so concurrent writers share one
 * fdatasync. A write is acknowledged only when its batch is durable; only then is it applied to the committed
 * state that get/list/watch read, so readers never see an unacknowledged change and never wait for a sync.
 * resourceVersion order = log order = watch event order. A failed batch is cut off the log again; it and every
 * write staged behind it (they were validated against it) are rejected, and the staged state is dropped.
 * The garbage collector for ownerReferences / Foreground / Orphan propagation runs inside the store after changes.
 */
export class EmbeddedDatastore implements Datastore {
  /** Committed (durable) state: what reads and watches see. */
  private readonly objects = new Map<string, AnyStored>();
  private readonly uids = new Map<string, string>();
  private readonly history: EventRecord[] = [];
  /** JSON length of each `history` event (same index) and their sum. */
  private readonly historySizes: number[] = [];
  private historyBytes = 0;
  /** Staged state on top of `objects` / `uids`: what writes are validated against. */
  private readonly pendingObjects = new Map<string, PendingObject>();
  private readonly pendingUids = new Map<string, { key: string | undefined; rv: number }>();
  /** Last durable resourceVersion. */
  private rv = 0;
  /** Last resourceVersion handed out (durable or staged). */
  private stagedRv = 0;
  private openBatch: CommitBatch | undefined;
  private flushing: Promise<void> | undefined;
  /** Set when the log could not be restored after a failed batch: the store refuses writes from then on. */
  private failure: Error | undefined;
  private eventsSinceCompaction = 0;
  private waiters = new Set<() => void>();
  private closing: Promise<void> | undefined;
  private closed = false;
  private gcScheduled = false;
  private readonly stats: CommitStats = { batches: 0, events: 0, failedBatches: 0 };
  private readonly historyLimit: number;
  private readonly historyMaxBytes: number;
  private readonly compactAfter: number;
  private readonly now: () => Date;
  private readonly beforeLogSync: EmbeddedDatastoreOptions['beforeLogSync'];

  private constructor(
    private readonly dir: string,
    private appender: LogAppender,
    opts: EmbeddedDatastoreOptions,
  ) {
    this.historyLimit = Math.max(1, opts.historyLimit ?? 1000);
    this.historyMaxBytes = Math.max(1, opts.historyMaxBytes ?? 16 * 1024 * 1024);
    this.compactAfter = Math.max(1, opts.compactAfterEvents ?? 5000);
    this.now = opts.now ?? (() => new Date());
    this.beforeLogSync = opts.beforeLogSync;
  }

  static async open(opts: EmbeddedDatastoreOptions): Promise<EmbeddedDatastore> {
    const dir = path.resolve(opts.dataDir);
    await fsp.mkdir(dir, { recursive: true });
    await acquireLock(dir, opts.lockWaitMs ?? 15_000);
    try {
      const records = await readLog(dir);
      if (records.length === 0) await writeCompactedLog(dir, [{ op: 'header', format: 1, rv: 0 }]);
      const store = new EmbeddedDatastore(dir, await LogAppender.open(dir), opts);
      store.load(records);
      if (store.eventsSinceCompaction >= store.compactAfter) await store.compact();
      store.scheduleGc();
      return store;
    } catch (err) {
      await fsp.rm(path.join(dir, 'LOCK'), { force: true });
      throw err;
    }
  }

  /** The latest committed resourceVersion. */
  get resourceVersion(): string {
    return String(this.rv);
  }

  /** Commit pipeline counters (batches = fdatasyncs of change batches). */
  get commitStats(): CommitStats {
    return { ...this.stats };
  }

  private load(records: LogRecord[]): void {
    for (const r of records) {
      switch (r.op) {
        case 'header':
          this.rv = r.rv;
          break;
        case 'hist':
          this.pushHistory(stripOp(r), JSON.stringify(r).length + 1);
          break;
        case 'obj': {
          const o = r.object as AnyStored;
          this.objects.set(objKey(r.k, o.metadata.namespace, o.metadata.name), o);
          this.uids.set(o.metadata.uid, objKey(r.k, o.metadata.namespace, o.metadata.name));
          break;
        }
        case 'ev':
          this.applyEvent(stripOp(r), JSON.stringify(r).length + 1);
          this.eventsSinceCompaction++;
          break;
      }
    }
    this.trimHistory();
    this.stagedRv = this.rv;
  }

  // ---------------------------------------------------------------- staging and group commit

  private applyEvent(ev: EventRecord, size: number): void {
    const o = ev.object as AnyStored;
    const key = objKey(ev.k, o.metadata.namespace, o.metadata.name);
    if (ev.type === 'DELETED') {
      this.objects.delete(key);
      this.uids.delete(o.metadata.uid);
    } else {
      this.objects.set(key, o);
      this.uids.set(o.metadata.uid, key);
    }
    this.rv = ev.rv;
    this.pushHistory(ev, size);
  }

  private pushHistory(ev: EventRecord, size: number): void {
    this.history.push(ev);
    this.historySizes.push(size);
    this.historyBytes += size;
  }

  /** Drops the oldest events beyond `historyLimit` events or `historyMaxBytes` (the newest event always stays). */
  private trimHistory(): void {
    let drop = Math.max(0, this.history.length - this.historyLimit);
    let bytes = this.historyBytes;
    for (let i = 0; i < drop; i++) bytes -= this.historySizes[i];
    while (bytes > this.historyMaxBytes && drop < this.history.length - 1) bytes -= this.historySizes[drop++];
    if (drop === 0) return;
    this.history.splice(0, drop);
    this.historySizes.splice(0, drop);
    this.historyBytes = bytes;
  }

  /** Events kept for watch resumption and the length of their JSON (diagnostics and tests). */
  get historyStats(): { events: number; bytes: number; oldestResourceVersion: string | undefined } {
    return { events: this.history.length, bytes: this.historyBytes, oldestResourceVersion: this.history.length ? String(this.history[0].rv) : undefined };
  }

  /** The object as writes see it: staged state first, then committed. */
  private view(key: string): AnyStored | undefined {
    const p = this.pendingObjects.get(key);
    return p ? p.object : this.objects.get(key);
  }

  private viewHasUid(uid: string): boolean {
    const p = this.pendingUids.get(uid);
    return p ? p.key !== undefined : this.uids.has(uid);
  }

  private *viewEntries(): Generator<[string, AnyStored]> {
    for (const [key, o] of this.objects) if (!this.pendingObjects.has(key)) yield [key, o];
    for (const [key, p] of this.pendingObjects) if (p.object) yield [key, p.object];
  }

  /** `cur` as a write result: when it is still staged, resolves once its batch is durable. */
  private settled(key: string, cur: AnyStored): Promise<AnyStored> {
    // Staged and committed objects are never changed in place, so the copy can be made when it is handed out: a copy
    // made at staging would live through the fdatasync and be promoted to the old generation as garbage.
    const p = this.pendingObjects.get(key);
    return p ? p.batch.done.then(() => clone(cur)) : Promise.resolve(clone(cur));
  }

  private assertWritable(): void {
    if (this.closing) throw new Error('datastore is closed');
    if (this.failure) throw this.failure;
  }

  /**
   * Runs a write: `fn` validates against the staged state and stages synchronously, then waits for durability.
   * A rejection caused by a staged change of the same object (Conflict, AlreadyExists, NotFound …) is delivered
   * after that change's batch settles, so a client that re-reads and retries sees the state it conflicted with
   * (reads show committed state only) instead of spinning against a change that is not yet visible.
   */
  private write<T extends KubeObject>(key: string | undefined, fn: () => Promise<AnyStored>): Promise<Stored<T>> {
    try {
      this.assertWritable();
      return fn() as Promise<Stored<T>>;
    } catch (err) {
      const p = key === undefined ? undefined : this.pendingObjects.get(key);
      if (p) {
        const fail = (): never => {
          throw err;
        };
        return p.batch.done.then(fail, fail);
      }
      return Promise.reject(err);
    }
  }

  /**
   * Stages one change: gives it the next resourceVersion, adds it to the open batch and to the staged state.
   * Resolves with the stored object once the batch is durable and applied.
   */
  private stage(k: string, type: EventRecord['type'], object: AnyStored, prevLabels?: Record<string, string>): Promise<AnyStored> {
    const rv = ++this.stagedRv;
    object.metadata.resourceVersion = String(rv);
    const ev: EventRecord = { rv, k, type, object, ...(prevLabels ? { pl: prevLabels } : {}) };
    const batch = (this.openBatch ??= newBatch());
    batch.events.push(ev);
    const key = objKey(k, object.metadata.namespace, object.metadata.name);
    const deleted = type === 'DELETED';
    this.pendingObjects.set(key, { object: deleted ? undefined : object, rv, batch });
    this.pendingUids.set(object.metadata.uid, { key: deleted ? undefined : key, rv });
    this.scheduleFlush();
    return batch.done.then(() => clone(object));
  }

  private scheduleFlush(): void {
    if (this.flushing) return;
    this.flushing = new Promise<void>((resolve) => {
      // Writers issued in the same synchronous run join the first batch; later ones queue while its sync runs.
      queueMicrotask(() => {
        void this.flushLoop().finally(() => {
          this.flushing = undefined;
          resolve();
          if (this.openBatch) this.scheduleFlush();
        });
      });
    });
  }

  /** Writes and syncs batches one at a time until nothing is staged. */
  private async flushLoop(): Promise<void> {
    while (this.openBatch) {
      const batch = this.openBatch;
      this.openBatch = undefined;
      if (this.failure) {
        this.dropStaged();
        batch.reject(this.failure);
        continue;
      }
      let sizes: number[];
      try {
        sizes = await this.appender.append(
          batch.events.map((ev) => ({ op: 'ev', ...ev })),
          this.beforeLogSync,
        );
      } catch (err) {
        await this.abandon(batch, err);
        continue;
      }
      batch.events.forEach((ev, i) => this.applyEvent(ev, sizes[i]));
      const last = batch.events[batch.events.length - 1].rv;
      for (const [key, p] of this.pendingObjects) if (p.rv <= last) this.pendingObjects.delete(key);
      for (const [uid, p] of this.pendingUids) if (p.rv <= last) this.pendingUids.delete(uid);
      this.trimHistory();
      this.eventsSinceCompaction += batch.events.length;
      this.stats.batches++;
      this.stats.events += batch.events.length;
      const waiters = this.waiters;
      this.waiters = new Set();
      for (const w of waiters) w();
      batch.resolve();
      if (this.eventsSinceCompaction >= this.compactAfter) await this.compactQuietly();
    }
  }

  private dropStaged(): void {
    this.pendingObjects.clear();
    this.pendingUids.clear();
    this.stagedRv = this.rv;
  }

  /**
   * A batch failed: cut it off the log, drop the staged state (the batch and everything staged behind it, which
   * was validated against it) and reject all of those writes. If the log cannot be cut back, the store refuses
   * further writes (reads keep working); reopening it recovers from the log.
   */
  private async abandon(batch: CommitBatch, err: unknown): Promise<void> {
    const behind = this.openBatch;
    this.openBatch = undefined;
    this.dropStaged();
    this.stats.failedBatches++;
    const why = err instanceof Error ? err.message : String(err);
    try {
      await this.appender.rollback();
    } catch (rollbackErr) {
      this.failure = internalError(
        `datastore log ${path.join(this.dir, LOG_NAME)} could not be cut back after a failed write (${why}; then ${rollbackErr instanceof Error ? rollbackErr.message : String(rollbackErr)}); writes are refused until the store is reopened`,
        rollbackErr,
      );
    }
    batch.reject(internalError(`datastore log write failed, the change was not applied: ${why}`, err));
    behind?.reject(internalError(`datastore log write failed for an earlier change this one was validated against, the change was not applied: ${why}`, err));
    // Changes staged during the rollback were validated against the committed state: they stay in `openBatch`.
  }

  private async compactQuietly(): Promise<void> {
    try {
      await this.compact();
    } catch (err) {
      if (this.failure) return;
      // The old log is intact and still appended to; try again after another round of events.
      this.eventsSinceCompaction = 0;
    }
  }

  /** Rewrites the log from the committed state. Called only between batches (no append in flight). */
  private async compact(): Promise<void> {
    const records: LogRecord[] = [{ op: 'header', format: 1, rv: this.rv }];
    for (const h of this.history) records.push({ op: 'hist', ...h });
    for (const [key, o] of this.objects) records.push({ op: 'obj', k: kindOfKey(key), object: o });
    const tmp = await writeLogTemp(this.dir, records);
    try {
      await fsp.rename(tmp, path.join(this.dir, LOG_NAME));
    } catch (err) {
      await fsp.rm(tmp, { force: true });
      throw err;
    }
    // From here on the old file is unlinked: appends must go to the new one.
    try {
      const next = await LogAppender.open(this.dir);
      const old = this.appender;
      this.appender = next;
      await old.close();
      await fsyncDir(this.dir);
    } catch (err) {
      this.failure = internalError(`datastore log compaction of ${this.dir} failed after the rename (${err instanceof Error ? err.message : String(err)}); writes are refused until the store is reopened`, err);
      throw err;
    }
    this.eventsSinceCompaction = 0;
  }

  // ---------------------------------------------------------------- reads (committed state only, never wait for a sync)

  async get<T extends KubeObject>(kind: ResourceKind<T>, name: string, namespace?: string): Promise<Stored<T>> {
    const o = this.objects.get(objKey(kindKeyOf(kind), kind.namespaced ? namespace : undefined, name));
    if (!o) throw new NotFoundError(kind, name);
    return clone(o) as Stored<T>;
  }

  async list<T extends KubeObject>(kind: ResourceKind<T>, opts: ListOptions = {}): Promise<ListResult<T>> {
    const sel = selectorOrInvalid(kind, opts.labelSelector);
    const items = this.matching(kindKeyOf(kind), kind.namespaced ? opts.namespace : undefined, sel);
    return { items: items.map((o) => clone(o) as Stored<T>), resourceVersion: String(this.rv) };
  }

  private matching(k: string, namespace: string | undefined, sel: CompiledSelector): AnyStored[] {
    const prefix = namespace === undefined ? `${k}|` : `${k}|${namespace}|`;
    const out: AnyStored[] = [];
    for (const [key, o] of this.objects) if (key.startsWith(prefix) && sel.matches(o.metadata.labels)) out.push(o);
    return out.sort((a, b) => ((a.metadata.namespace ?? '') + '/' + a.metadata.name).localeCompare((b.metadata.namespace ?? '') + '/' + b.metadata.name));
  }

  watch<T extends KubeObject>(kind: ResourceKind<T>, opts: WatchOptions = {}): AsyncIterable<WatchEvent<T>> {
    return { [Symbol.asyncIterator]: () => this.watchEvents(kind, opts)[Symbol.asyncIterator]() };
  }

  private async *watchEvents<T extends KubeObject>(kind: ResourceKind<T>, opts: WatchOptions): AsyncGenerator<WatchEvent<T>> {
    const sel = selectorOrInvalid(kind, opts.labelSelector);
    const k = kindKeyOf(kind);
    const ns = kind.namespaced ? opts.namespace : undefined;
    const signal = opts.signal;
    let cursor: number;
    if (opts.resourceVersion === undefined || opts.resourceVersion === '' || opts.resourceVersion === '0') {
      const initial = this.matching(k, ns, sel).map((o) => clone(o));
      cursor = this.rv;
      for (const o of initial) yield { type: 'ADDED', object: o as Stored<T> };
    } else {
      if (!/^\d+$/.test(opts.resourceVersion)) {
        throw new StatusError('BadRequest', 400, `invalid resource version "${opts.resourceVersion}"`);
      }
      cursor = Number(opts.resourceVersion);
    }
    let lastSent = Date.now();
    while (!this.closed && !signal?.aborted) {
      const oldest = this.history.length ? this.history[0].rv : this.rv + 1;
      if (cursor < oldest - 1) throw new GoneError(String(cursor), String(oldest - 1));
      let delivered = false;
      for (let i = Math.max(0, cursor + 1 - oldest); i < this.history.length; i++) {
        const ev = this.history[i];
        if (ev.rv <= cursor) continue;
        cursor = ev.rv;
        const out = this.translate<T>(ev, k, ns, sel);
        if (out) {
          delivered = true;
          lastSent = Date.now();
          yield out;
          // History may have been trimmed or grown while suspended: restart the scan from the cursor.
          break;
        }
      }
      if (delivered) continue;
      if (cursor >= this.rv || this.history.length === 0 || this.history[this.history.length - 1].rv <= cursor) {
        const wait = opts.bookmarkIntervalMs ? Math.max(0, opts.bookmarkIntervalMs - (Date.now() - lastSent)) : undefined;
        const woke = await this.waitForChange(wait, signal);
        if (!woke && opts.bookmarkIntervalMs && !this.closed && !signal?.aborted && cursor >= this.rv) {
          lastSent = Date.now();
          yield {
            type: 'BOOKMARK',
            object: { apiVersion: kind.apiVersion, kind: kind.kind, metadata: { name: '', resourceVersion: String(cursor) } } as unknown as Stored<T>,
          };
        }
      }
    }
  }

  private translate<T extends KubeObject>(ev: EventRecord, k: string, ns: string | undefined, sel: CompiledSelector): WatchEvent<T> | undefined {
    if (ev.k !== k) return undefined;
    const o = ev.object as AnyStored;
    if (ns !== undefined && (o.metadata.namespace ?? '') !== ns) return undefined;
    const now = sel.matches(o.metadata.labels);
    if (ev.type === 'MODIFIED' && ev.pl !== undefined) {
      const before = sel.matches(ev.pl);
      if (before && !now) return { type: 'DELETED', object: clone(o) as Stored<T> };
      if (!before && now) return { type: 'ADDED', object: clone(o) as Stored<T> };
    }
    if (!now) return undefined;
    return { type: ev.type, object: clone(o) as Stored<T> };
  }

  /** Resolves true on a committed change, false on timeout/abort/close. */
  private waitForChange(timeoutMs: number | undefined, signal: AbortSignal | undefined): Promise<boolean> {
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const done = (v: boolean): void => {
        if (timer) clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        this.waiters.delete(onChange);
        resolve(v);
      };
      const onChange = (): void => done(true);
      const onAbort = (): void => done(false);
      this.waiters.add(onChange);
      signal?.addEventListener('abort', onAbort, { once: true });
      if (timeoutMs !== undefined) timer = setTimeout(() => done(false), timeoutMs);
    });
  }

  // ---------------------------------------------------------------- writes (validated and staged synchronously)

  create<T extends KubeObject>(kind: ResourceKind<T>, input: T, opts: CreateOptions = {}): Promise<Stored<T>> {
    return this.write(this.inputKey(kind, input), () => {
      const obj = clone(input) as KubeObject;
      obj.apiVersion = obj.apiVersion || kind.apiVersion;
      obj.kind = obj.kind || kind.kind;
      obj.metadata = obj.metadata ?? ({ name: '' } as KubeObject['metadata']);
      const m = obj.metadata;
      if (!m.name && m.generateName) m.name = m.generateName + randomSuffix();
      const causes = validateCommon(kind, obj);
      if (causes.length) throw new InvalidError(kind, m.name ?? '', causes);
      if (!kind.namespaced) delete m.namespace;
      const k = kindKeyOf(kind);
      if (this.view(objKey(k, m.namespace, m.name))) throw new AlreadyExistsError(kind, m.name);
      delete m.generateName;
      delete m.deletionTimestamp;
      delete m.resourceVersion;
      m.uid = randomUUID();
      m.generation = 1;
      m.creationTimestamp = k8sTime(this.now());
      if (kind.statusSubresource && !opts.keepStatus) delete obj.status;
      const stored = this.stage(k, 'ADDED', obj as AnyStored);
      // A dependent created after its owner was deleted must be collected.
      if (m.ownerReferences?.length) this.scheduleGc();
      return stored;
    });
  }

  update<T extends KubeObject>(kind: ResourceKind<T>, input: T): Promise<Stored<T>> {
    return this.write(this.inputKey(kind, input), () => {
      const { key, cur } = this.forWrite(kind, input);
      const obj = clone(input) as KubeObject;
      const causes = validateCommon(kind, obj);
      if (causes.length) throw new InvalidError(kind, cur.metadata.name, causes);
      const next: AnyStored = {
        ...(bodyOf(obj, !kind.statusSubresource) as object),
        apiVersion: cur.apiVersion,
        kind: cur.kind,
        metadata: {
          ...cur.metadata,
          labels: obj.metadata.labels,
          annotations: obj.metadata.annotations,
          finalizers: obj.metadata.finalizers,
          ownerReferences: obj.metadata.ownerReferences,
        },
      } as AnyStored;
      if (kind.statusSubresource && cur.status !== undefined) next.status = clone(cur.status);
      cleanMeta(next);
      if (cur.metadata.deletionTimestamp) {
        const added = (next.metadata.finalizers ?? []).filter((f) => !(cur.metadata.finalizers ?? []).includes(f));
        if (added.length) {
          throw new InvalidError(kind, cur.metadata.name, [
            { field: 'metadata.finalizers', message: `Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers ${JSON.stringify(added)}` },
          ]);
        }
      }
      const bodyChanged = canonical(bodyOf(cur, !kind.statusSubresource)) !== canonical(bodyOf(next, !kind.statusSubresource));
      if (bodyChanged) next.metadata.generation = cur.metadata.generation + 1;
      if (!bodyChanged && canonical(next.metadata) === canonical(cur.metadata)) return this.settled(key, cur);
      return this.writeOrFinish(key, next, cur);
    });
  }

  updateStatus<T extends KubeObject>(kind: ResourceKind<T>, input: T): Promise<Stored<T>> {
    return this.write(this.inputKey(kind, input), () => {
      const { key, cur } = this.forWrite(kind, input);
      const next = clone(cur);
      if (input.status === undefined) delete next.status;
      else next.status = clone(input.status);
      if (canonical(next.status) === canonical(cur.status)) return this.settled(key, cur);
      return this.stage(kindOfKey(key), 'MODIFIED', next, cur.metadata.labels ?? {});
    });
  }

  delete<T extends KubeObject>(kind: ResourceKind<T>, name: string, namespace?: string, opts: DeleteOptions = {}): Promise<Stored<T>> {
    const k = kindKeyOf(kind);
    const key = objKey(k, kind.namespaced ? namespace : undefined, name);
    return this.write(key, () => {
      const cur = this.view(key);
      if (!cur) throw new NotFoundError(kind, name);
      const pre = opts.preconditions;
      if (pre?.uid && pre.uid !== cur.metadata.uid) {
        throw new ConflictError(kind, name, `Precondition failed: UID in precondition: ${pre.uid}, UID in object meta: ${cur.metadata.uid}`);
      }
      if (pre?.resourceVersion && pre.resourceVersion !== cur.metadata.resourceVersion) {
        throw new ConflictError(kind, name, `Precondition failed: ResourceVersion in precondition: ${pre.resourceVersion}, ResourceVersion in object meta: ${cur.metadata.resourceVersion}`);
      }
      const result = this.deleteByKey(key, opts.propagationPolicy ?? 'Background');
      this.scheduleGc();
      return result;
    });
  }

  /** Waits for every staged change to be durable, ends every watch and releases the directory. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      while (this.flushing) await this.flushing;
      this.closed = true;
      for (const w of this.waiters) w();
      this.waiters.clear();
      await this.appender.close();
      await fsp.rm(path.join(this.dir, 'LOCK'), { force: true });
    })();
    return this.closing;
  }

  // ---------------------------------------------------------------- internals (all synchronous against the staged state)

  private inputKey(kind: ResourceKind, input: KubeObject | undefined): string | undefined {
    const m = input?.metadata;
    if (!m?.name) return undefined;
    return objKey(kindKeyOf(kind), kind.namespaced ? m.namespace : undefined, m.name);
  }

  private forWrite(kind: ResourceKind, input: KubeObject): { key: string; cur: AnyStored } {
    const name = input?.metadata?.name;
    if (!name) throw new InvalidError(kind, '', [{ field: 'metadata.name', message: 'Required value: name is required' }]);
    const key = objKey(kindKeyOf(kind), kind.namespaced ? input.metadata.namespace : undefined, name);
    const cur = this.view(key);
    if (!cur) throw new NotFoundError(kind, name);
    if (input.metadata.uid && input.metadata.uid !== cur.metadata.uid) {
      throw new ConflictError(kind, name, `Precondition failed: UID in precondition: ${input.metadata.uid}, UID in object meta: ${cur.metadata.uid}`);
    }
    if (input.metadata.resourceVersion && input.metadata.resourceVersion !== cur.metadata.resourceVersion) throw new ConflictError(kind, name);
    return { key, cur };
  }

  /** Stages a MODIFIED state, or removes the object when it is being deleted and has no finalizers left. */
  private writeOrFinish(key: string, next: AnyStored, cur: AnyStored): Promise<AnyStored> {
    const k = kindOfKey(key);
    if (next.metadata.deletionTimestamp && (next.metadata.finalizers ?? []).length === 0) {
      const r = this.stage(k, 'DELETED', next);
      this.scheduleGc();
      return r;
    }
    const r = this.stage(k, 'MODIFIED', next, cur.metadata.labels ?? {});
    if (next.metadata.deletionTimestamp || canonical(next.metadata.ownerReferences) !== canonical(cur.metadata.ownerReferences)) this.scheduleGc();
    return r;
  }

  private deleteByKey(key: string, policy: 'Foreground' | 'Background' | 'Orphan'): Promise<AnyStored> {
    const cur = this.view(key) as AnyStored;
    if (cur.metadata.deletionTimestamp) return this.settled(key, cur);
    const finalizers = [...(cur.metadata.finalizers ?? [])];
    if (policy === 'Foreground' && !finalizers.includes(FOREGROUND_FINALIZER)) finalizers.push(FOREGROUND_FINALIZER);
    if (policy === 'Orphan' && !finalizers.includes(ORPHAN_FINALIZER)) finalizers.push(ORPHAN_FINALIZER);
    const k = kindOfKey(key);
    if (finalizers.length === 0) return this.stage(k, 'DELETED', clone(cur));
    const next = clone(cur);
    next.metadata.finalizers = finalizers;
    next.metadata.deletionTimestamp = k8sTime(this.now());
    return this.stage(k, 'MODIFIED', next, cur.metadata.labels ?? {});
  }

  private dependentsOf(uid: string): string[] {
    const out: string[] = [];
    for (const [key, o] of this.viewEntries()) if (o.metadata.ownerReferences?.some((r) => r.uid === uid)) out.push(key);
    return out;
  }

  private scheduleGc(): void {
    if (this.gcScheduled || this.closing) return;
    this.gcScheduled = true;
    setImmediate(() => {
      this.gcScheduled = false;
      if (this.closing || this.failure) return;
      // A failed batch rolls the collector's changes back too; they are staged again after the next change.
      this.collectGarbage();
    });
  }

  /** Stages one garbage-collection pass; repeats until nothing changes. */
  private collectGarbage(): void {
    const ignore = (p: Promise<unknown>): void => void p.catch(() => undefined);
    for (let round = 0; round < 1000; round++) {
      let changed = false;
      for (const key of [...this.viewEntries()].map(([key]) => key)) {
        const o = this.view(key);
        if (!o) continue;
        const fin = o.metadata.finalizers ?? [];
        if (o.metadata.deletionTimestamp && fin.includes(ORPHAN_FINALIZER)) {
          for (const dk of this.dependentsOf(o.metadata.uid)) {
            const d = this.view(dk) as AnyStored;
            const next = clone(d);
            next.metadata.ownerReferences = (d.metadata.ownerReferences ?? []).filter((r) => r.uid !== o.metadata.uid);
            cleanMeta(next);
            ignore(this.stage(kindOfKey(dk), 'MODIFIED', next, d.metadata.labels ?? {}));
          }
          this.removeFinalizer(key, ORPHAN_FINALIZER);
          changed = true;
          continue;
        }
        if (o.metadata.deletionTimestamp && fin.includes(FOREGROUND_FINALIZER)) {
          const deps = this.dependentsOf(o.metadata.uid);
          for (const dk of deps) {
            const d = this.view(dk) as AnyStored;
            if (!d.metadata.deletionTimestamp) {
              ignore(this.deleteByKey(dk, this.dependentsOf(d.metadata.uid).length > 0 ? 'Foreground' : 'Background'));
              changed = true;
            }
          }
          const blocking = this.dependentsOf(o.metadata.uid).filter((dk) =>
            (this.view(dk) as AnyStored).metadata.ownerReferences?.some((r) => r.uid === o.metadata.uid && r.blockOwnerDeletion),
          );
          if (blocking.length === 0) {
            this.removeFinalizer(key, FOREGROUND_FINALIZER);
            changed = true;
          }
          continue;
        }
        const refs = o.metadata.ownerReferences ?? [];
        if (refs.length > 0 && !o.metadata.deletionTimestamp && refs.every((r) => !this.viewHasUid(r.uid))) {
          ignore(this.deleteByKey(key, 'Background'));
          changed = true;
        }
      }
      if (!changed) return;
    }
  }

  private removeFinalizer(key: string, finalizer: string): void {
    const cur = this.view(key);
    if (!cur) return;
    const next = clone(cur);
    next.metadata.finalizers = (cur.metadata.finalizers ?? []).filter((f) => f !== finalizer);
    cleanMeta(next);
    void this.writeOrFinish(key, next, cur).catch(() => undefined);
  }
}

function internalError(message: string, cause: unknown): StatusError {
  const err = new StatusError('InternalError', 500, message);
  Object.defineProperty(err, 'cause', { value: cause, enumerable: false, configurable: true, writable: true });
  return err;
}

function stripOp<T extends { op: string }>(r: T): Omit<T, 'op'> {
  const { op: _op, ...rest } = r;
  return rest;
}

function cleanMeta(o: KubeObject): void {
  const m = o.metadata as unknown as Record<string, unknown>;
  for (const f of ['labels', 'annotations', 'finalizers', 'ownerReferences']) {
    const v = m[f];
    if (v === undefined || v === null || (Array.isArray(v) && v.length === 0)) delete m[f];
  }
}

function randomSuffix(): string {
  const alphabet = 'bcdfghjklmnpqrstvwxz2456789';
  return [...randomBytes(5)].map((b) => alphabet[b % alphabet.length]).join('');
}

function selectorOrInvalid(kind: ResourceKind, sel: ListOptions['labelSelector']): CompiledSelector {
  try {
    return compileSelector(sel);
  } catch (err) {
    if (err instanceof LabelSelectorError) throw new StatusError('BadRequest', 400, err.message, { kind: kind.plural });
    throw err;
  }
}

function validateCommon(kind: ResourceKind, obj: KubeObject): { field: string; message: string }[] {
  const causes: { field: string; message: string }[] = [];
  if (obj.apiVersion !== kind.apiVersion) causes.push({ field: 'apiVersion', message: `Invalid value: "${obj.apiVersion}": must be ${kind.apiVersion}` });
  if (obj.kind !== kind.kind) causes.push({ field: 'kind', message: `Invalid value: "${obj.kind}": must be ${kind.kind}` });
  const m = obj.metadata;
  if (!m || typeof m !== 'object') return [...causes, { field: 'metadata', message: 'Required value' }];
  if (!m.name) causes.push({ field: 'metadata.name', message: 'Required value: name or generateName is required' });
  else if (m.name.length > 253 || !NAME_RE.test(m.name)) {
    causes.push({
      field: 'metadata.name',
      message: `Invalid value: "${m.name}": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character`,
    });
  }
  if (kind.namespaced) {
    if (!m.namespace) causes.push({ field: 'metadata.namespace', message: 'Required value' });
    else if (m.namespace.length > 63 || !/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(m.namespace)) {
      causes.push({ field: 'metadata.namespace', message: `Invalid value: "${m.namespace}": a lowercase RFC 1123 label` });
    }
  } else if (m.namespace) {
    causes.push({ field: 'metadata.namespace', message: `Forbidden: not allowed on this type` });
  }
  for (const [key, value] of Object.entries(m.labels ?? {})) {
    if (!isValidLabelKey(key)) causes.push({ field: 'metadata.labels', message: `Invalid value: "${key}": not a valid label key` });
    if (typeof value !== 'string' || !isValidLabelValue(value)) causes.push({ field: 'metadata.labels', message: `Invalid value: "${String(value)}": not a valid label value` });
  }
  for (const [key, value] of Object.entries(m.annotations ?? {})) {
    if (typeof value !== 'string') causes.push({ field: `metadata.annotations[${key}]`, message: 'Invalid value: must be a string' });
  }
  if (m.finalizers !== undefined && (!Array.isArray(m.finalizers) || m.finalizers.some((f) => typeof f !== 'string' || !f))) {
    causes.push({ field: 'metadata.finalizers', message: 'Invalid value: must be a list of non-empty strings' });
  }
  for (const [i, r] of (m.ownerReferences ?? []).entries()) {
    for (const f of ['apiVersion', 'kind', 'name', 'uid'] as const) {
      if (!r || typeof r[f] !== 'string' || !r[f]) causes.push({ field: `metadata.ownerReferences[${i}].${f}`, message: 'Required value' });
    }
  }
  return causes;
}

/**
 * One process per data directory: a `LOCK` file with the owner's pid and start time (`/proc/<pid>/stat`, so that a
 * reused pid is not mistaken for the owner). A lock whose owner is gone — no such process, a zombie, or another
 * process under that pid — is taken over. While the owner still runs (e.g. a restart right after a crash whose
 * process the parent has not reaped yet, or one still shutting down) this waits up to `waitMs` for it to go away.
 */
async function acquireLock(dir: string, waitMs: number): Promise<void> {
  const lock = path.join(dir, 'LOCK');
  const deadline = Date.now() + waitMs;
  for (;;) {
    try {
      const me = procStat(process.pid);
      await fsp.writeFile(lock, `${process.pid}\n${me?.startTime ?? ''}\n`, { flag: 'wx' });
      await fsyncDir(dir);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      const [pidText = '', startTime = ''] = (await fsp.readFile(lock, 'utf8').catch(() => '')).split('\n').map((l) => l.trim());
      const pid = Number(pidText);
      if (pid === process.pid) throw new Error(`datastore directory ${dir} is already open in this process`);
      if (pid > 0 && ownerRunning(pid, startTime)) {
        if (Date.now() >= deadline) {
          throw new Error(`datastore directory ${dir} is in use by process ${pid} (still running after waiting ${waitMs} ms for it to exit)`);
        }
        await new Promise((r) => setTimeout(r, 50));
        continue;
      }
      await fsp.rm(lock, { force: true });
    }
  }
}

/** State and start time of a process from `/proc/<pid>/stat` (undefined when there is none or no /proc). */
function procStat(pid: number): { state: string; startTime: string } | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
    return fields[0] && fields[19] ? { state: fields[0], startTime: fields[19] } : undefined;
  } catch {
    return undefined;
  }
}

/** The lock's owner still runs: the process exists, is not a zombie and (when recorded) started when the owner did. */
function ownerRunning(pid: number, startTime: string): boolean {
  const stat = procStat(pid);
  if (stat) return stat.state !== 'Z' && (startTime === '' || stat.startTime === startTime);
  if (existsSync('/proc/self/stat')) return false;
  try {
    process.kill(pid, 0); // no /proc: existence is all that can be told
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
