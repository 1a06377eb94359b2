import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { CreateOptions, Datastore, SharedReads } from '../datastore.js';
import { ConflictError, InvalidError, NotFoundError } from '../errors.js';
import type { DeleteOptions, KubeObject, ListOptions, ListResult, ResourceKind, Stored, WatchEvent, WatchOptions } from '../types.js';
import { acquireLock, releaseLock } from './dir-lock.js';
import { GarbageCollector } from './garbage-collector.js';
import { GroupCommit, type CommitStats } from './group-commit.js';
import type { LogBatchInfo, LogRecord } from './log-file.js';
import { ObjectTable } from './object-table.js';
import {
  clone,
  inputKeyOf,
  kindKeyOf,
  kindOfKey,
  objKey,
  prepareCreate,
  prepareStatusUpdate,
  prepareUpdate,
  selectorOrInvalid,
  type WriteAnswer,
  type AnyStored,
} from './object-rules.js';
import { WatchHistory, type WatchSource } from './watch-history.js';
import { WriteAheadLog, type CompactionSnapshot } from './write-ahead-log.js';

export type { CommitStats } from './group-commit.js';

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
  /**
   * Deep-freeze every committed object, so that a reader that changes an object it got shared (`listShared`,
   * `getShared`, a `shared` watch) throws instead of changing the store's state (tests; costs a pass over each
   * object written). Default: on when the environment has `BIS_DATASTORE_FREEZE=1` (the workspace's jest sets it).
   */
  freezeCommitted?: boolean;
}


/**
 * The embedded datastore: all objects in memory, every change appended to an fdatasync'ed JSON-lines log under
 * `dataDir`. One process owns a data directory at a time (`LOCK` file with its pid, `dir-lock.ts`).
 *
 * This class composes the parts and implements the `Datastore` API with them:
 * - `object-rules.ts`: keys, validation, and what a create / update / status update makes of the input (pure);
 * - `object-table.ts`: the committed state (what get/list/watch read) and the staged state writes are validated against;
 * - `group-commit.ts`: staging, batches sharing one fdatasync, applying durable batches, rolling back failed ones;
 * - `write-ahead-log.ts`: the log (replay at open, append, cut-back, compaction);
 * - `watch-history.ts`: the bounded event history, watch resumption and 410 Gone;
 * - `garbage-collector.ts`: finalizers, propagation policies and ownerReferences.
 *
 * A write is validated and staged synchronously, then acknowledged when its batch is durable; readers never see an
 * unacknowledged change and never wait for a sync. resourceVersion order = log order = watch event order. A
 * rejection caused by a staged change of the same object (Conflict, AlreadyExists, NotFound …) is delivered after
 * that change's batch settles, so a client that re-reads and retries sees the state it conflicted with.
 */
export class EmbeddedDatastore implements Datastore, SharedReads {
  private readonly table = new ObjectTable();
  private readonly history: WatchHistory;
  private readonly commit: GroupCommit;
  private readonly gc: GarbageCollector;
  private closing: Promise<void> | undefined;
  private closed = false;
  private readonly now: () => Date;
  private readonly watchSource: WatchSource = {
    rv: () => this.table.rv,
    closed: () => this.closed,
    matching: (k, namespace, sel) => this.table.matching(k, namespace, sel),
  };

  private constructor(
    private readonly dir: string,
    private readonly wal: WriteAheadLog,
    opts: EmbeddedDatastoreOptions,
  ) {
    this.now = opts.now ?? (() => new Date());
    this.history = new WatchHistory(Math.max(1, opts.historyLimit ?? 1000), Math.max(1, opts.historyMaxBytes ?? 16 * 1024 * 1024));
    this.commit = new GroupCommit(this.table, wal, this.history, opts.freezeCommitted ?? process.env['BIS_DATASTORE_FREEZE'] === '1');
    this.gc = new GarbageCollector({
      table: this.table,
      stage: (k, type, object, prevLabels, answer) => this.commit.stage(k, type, object, prevLabels, answer),
      now: () => this.now(),
      closing: () => this.closing !== undefined,
      failed: () => this.wal.failure !== undefined,
    });
  }

  static async open(opts: EmbeddedDatastoreOptions): Promise<EmbeddedDatastore> {
    const dir = path.resolve(opts.dataDir);
    await fsp.mkdir(dir, { recursive: true });
    await acquireLock(dir, opts.lockWaitMs ?? 15_000);
    try {
      const { wal, records } = await WriteAheadLog.open(dir, { compactAfterEvents: opts.compactAfterEvents ?? 5000, beforeLogSync: opts.beforeLogSync });
      const store = new EmbeddedDatastore(dir, wal, opts);
      store.replay(wal, records);
      if (wal.compactionDue) await wal.compact(() => store.snapshot());
      store.gc.schedule();
      return store;
    } catch (err) {
      await releaseLock(dir);
      throw err;
    }
  }

  private replay(wal: WriteAheadLog, records: LogRecord[]): void {
    wal.replay(records, {
      header: (rv) => {
        this.table.rv = rv;
      },
      history: (ev, size) => this.history.push(ev, size),
      object: (k, o) => this.table.loadObject(k, o),
      event: (ev, size) => this.commit.applyCommitted(ev, size),
      current: (key) => this.table.get(key),
    });
    this.history.trim();
    this.table.dropStaged();
  }

  private snapshot(): CompactionSnapshot {
    return { rv: this.table.rv, history: this.history.entries, objects: this.table.committed() };
  }

  /** The latest committed resourceVersion. */
  get resourceVersion(): string {
    return String(this.table.rv);
  }

  /** Commit pipeline counters (batches = fdatasyncs of change batches). */
  get commitStats(): CommitStats {
    return this.commit.commitStats;
  }

  /** Events kept for watch resumption and the length of their JSON (diagnostics and tests). */
  get historyStats(): { events: number; bytes: number; oldestResourceVersion: string | undefined } {
    return this.history.stats;
  }

  // ---------------------------------------------------------------- reads (committed state only, never wait for a sync)

  async get<T extends KubeObject>(kind: ResourceKind<T>, name: string, namespace?: string): Promise<Stored<T>> {
    const o = this.table.get(objKey(kindKeyOf(kind), kind.namespaced ? namespace : undefined, name));
    if (!o) throw new NotFoundError(kind, name);
    return clone(o) as Stored<T>;
  }

  async list<T extends KubeObject>(kind: ResourceKind<T>, opts: ListOptions = {}): Promise<ListResult<T>> {
    const sel = selectorOrInvalid(kind, opts.labelSelector);
    const items = this.table.matching(kindKeyOf(kind), kind.namespaced ? opts.namespace : undefined, sel);
    return { items: items.map((o) => clone(o) as Stored<T>), resourceVersion: String(this.table.rv) };
  }

  /** {@link SharedReads}: `get` without the copy (the committed object is replaced on write, never changed). */
  getShared<T extends KubeObject>(kind: ResourceKind<T>, name: string, namespace?: string): Stored<T> {
    const o = this.table.get(objKey(kindKeyOf(kind), kind.namespaced ? namespace : undefined, name));
    if (!o) throw new NotFoundError(kind, name);
    return o as Stored<T>;
  }

  /** {@link SharedReads}: `list` without the copies (the committed objects are replaced on write, never changed). */
  listShared<T extends KubeObject>(kind: ResourceKind<T>, opts: ListOptions = {}): { items: readonly Stored<T>[]; resourceVersion: string } {
    const sel = selectorOrInvalid(kind, opts.labelSelector);
    const items = this.table.matching(kindKeyOf(kind), kind.namespaced ? opts.namespace : undefined, sel) as Stored<T>[];
    return { items, resourceVersion: String(this.table.rv) };
  }

  watch<T extends KubeObject>(kind: ResourceKind<T>, opts: WatchOptions = {}): AsyncIterable<WatchEvent<T>> {
    return { [Symbol.asyncIterator]: () => this.history.watch(this.watchSource, kind, opts)[Symbol.asyncIterator]() };
  }

  // ---------------------------------------------------------------- writes (validated and staged synchronously)

  create<T extends KubeObject>(kind: ResourceKind<T>, input: T, opts: CreateOptions = {}): Promise<Stored<T>> {
    return this.write(inputKeyOf(kind, input), () => {
      const { key, object } = prepareCreate(kind, input, opts, this.now(), (k) => this.table.view(k) !== undefined);
      const stored = this.commit.stage(kindOfKey(key), 'ADDED', object);
      // A dependent created after its owner was deleted must be collected.
      if (object.metadata.ownerReferences?.length) this.gc.schedule();
      return stored;
    });
  }

  update<T extends KubeObject>(kind: ResourceKind<T>, input: T): Promise<Stored<T>> {
    return this.#update(kind, input, 'copy');
  }

  /** {@link SharedReads}: `update` answering with the committed object itself. */
  updateShared<T extends KubeObject>(kind: ResourceKind<T>, input: T): Promise<Stored<T>> {
    return this.#update(kind, input, 'shared');
  }

  #update<T extends KubeObject>(kind: ResourceKind<T>, input: T, answer: WriteAnswer): Promise<Stored<T>> {
    return this.write(inputKeyOf(kind, input), () => {
      const { key, cur } = this.forWrite(kind, input);
      const next = prepareUpdate(kind, cur, input);
      return next ? this.gc.writeOrFinish(key, next, cur, answer) : this.table.settled(key, cur, answer);
    });
  }

  updateStatus<T extends KubeObject>(kind: ResourceKind<T>, input: T): Promise<Stored<T>> {
    return this.#updateStatus(kind, input, 'copy');
  }

  /** {@link SharedReads}: `updateStatus` answering with the committed object itself. */
  updateStatusShared<T extends KubeObject>(kind: ResourceKind<T>, input: T): Promise<Stored<T>> {
    return this.#updateStatus(kind, input, 'shared');
  }

  #updateStatus<T extends KubeObject>(kind: ResourceKind<T>, input: T, answer: WriteAnswer): Promise<Stored<T>> {
    return this.write(inputKeyOf(kind, input), () => {
      const { key, cur } = this.forWrite(kind, input);
      const next = prepareStatusUpdate(cur, input);
      return next
        ? this.commit.stage(kindOfKey(key), 'MODIFIED', next, cur.metadata.labels ?? {}, answer)
        : this.table.settled(key, cur, answer);
    });
  }

  delete<T extends KubeObject>(kind: ResourceKind<T>, name: string, namespace?: string, opts: DeleteOptions = {}): Promise<Stored<T>> {
    const key = objKey(kindKeyOf(kind), kind.namespaced ? namespace : undefined, name);
    return this.write(key, () => {
      const cur = this.table.view(key);
      if (!cur) throw new NotFoundError(kind, name);
      const pre = opts.preconditions;
      if (pre?.uid && pre.uid !== cur.metadata.uid) {
        throw new ConflictError(kind, name, `Precondition failed: UID in precondition: ${pre.uid}, UID in object meta: ${cur.metadata.uid}`);
      }
      if (pre?.resourceVersion && pre.resourceVersion !== cur.metadata.resourceVersion) {
        throw new ConflictError(kind, name, `Precondition failed: ResourceVersion in precondition: ${pre.resourceVersion}, ResourceVersion in object meta: ${cur.metadata.resourceVersion}`);
      }
      const result = this.gc.deleteByKey(key, opts.propagationPolicy ?? 'Background');
      this.gc.schedule();
      return result;
    });
  }

  /** Waits for every staged change to be durable, ends every watch and releases the directory. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      await this.commit.drain();
      this.closed = true;
      this.history.notify();
      await this.wal.close();
      await releaseLock(this.dir);
    })();
    return this.closing;
  }

  // ---------------------------------------------------------------- internals

  /**
   * Runs a write: `fn` validates against the staged state and stages synchronously, then waits for durability.
   * A rejection caused by a staged change of the same object is delivered after that change's batch settles.
   */
  private write<T extends KubeObject>(key: string | undefined, fn: () => Promise<AnyStored>): Promise<Stored<T>> {
    try {
      if (this.closing) throw new Error('datastore is closed');
      if (this.wal.failure) throw this.wal.failure;
      return fn() as Promise<Stored<T>>;
    } catch (err) {
      const pending = key === undefined ? undefined : this.table.pendingDone(key);
      if (pending) {
        const fail = (): never => {
          throw err;
        };
        return pending.then(fail, fail);
      }
      return Promise.reject(err);
    }
  }

  /** The current (staged) object `input` names, after its uid / resourceVersion preconditions. */
  private forWrite(kind: ResourceKind, input: KubeObject): { key: string; cur: AnyStored } {
    const name = input?.metadata?.name;
    if (!name) throw new InvalidError(kind, '', [{ field: 'metadata.name', message: 'Required value: name is required' }]);
    const key = objKey(kindKeyOf(kind), kind.namespaced ? input.metadata.namespace : undefined, name);
    const cur = this.table.view(key);
    if (!cur) throw new NotFoundError(kind, name);
    if (input.metadata.uid && input.metadata.uid !== cur.metadata.uid) {
      throw new ConflictError(kind, name, `Precondition failed: UID in precondition: ${input.metadata.uid}, UID in object meta: ${cur.metadata.uid}`);
    }
    if (input.metadata.resourceVersion && input.metadata.resourceVersion !== cur.metadata.resourceVersion) throw new ConflictError(kind, name);
    return { key, cur };
  }
}
