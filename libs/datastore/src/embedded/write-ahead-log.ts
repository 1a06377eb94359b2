import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { StatusError } from '../errors.js';
import { applyPatch, diffValue, PatchPathError } from '../json-patch.js';
import { LOG_FORMAT, LOG_NAME, LogAppender, StoreLogCorruptError, fsyncDir, readLog, writeCompactedLog, writeLogTemp, type EventRecord, type LogBatchInfo, type LogRecord, type PatchRecord } from './log-file.js';
import type { AnyStored } from './object-rules.js';
import { kindOfKey, objKey } from './object-rules.js';

/** Where a replay of the log puts what it reads. */
export interface ReplayTarget {
  /** The resourceVersion at the last compaction (first record). */
  header(rv: number): void;
  /** A watch-history event kept across compaction (not applied to the state). */
  history(ev: EventRecord, size: number): void;
  /** A live object as of the header's resourceVersion (`k` = its kind key). */
  object(k: string, object: AnyStored): void;
  /** A committed change after the header, in resourceVersion order. */
  event(ev: EventRecord, size: number): void;
  /** The committed object under `key` so far (the base of a `patch` record). */
  current(key: string): AnyStored | undefined;
}

/** The committed state a compaction writes. */
export interface CompactionSnapshot {
  rv: number;
  history: readonly EventRecord[];
  /** Committed objects by key. */
  objects: Iterable<[string, AnyStored]>;
}

export interface WriteAheadLogOptions {
  /** Rewrite the log once this many events were appended since the last compaction. */
  compactAfterEvents: number;
  /** Called for every batch after its records are written and before its fdatasync (see EmbeddedDatastoreOptions). */
  beforeLogSync?: (batch: LogBatchInfo) => void | Promise<void>;
}

/**
 * The write-ahead log of the embedded store (`<dir>/store.log`, format in `log-file.ts`): replay at open, batches
 * appended with one fdatasync each, a failed batch cut off again, and compaction (rewrite from the committed state)
 * once `compactAfterEvents` events were appended. When the log cannot be brought back to a known state (a failed
 * cut-back, a compaction that failed after its rename) it records `failure`; the store then refuses writes until it
 * is reopened.
 */
export class WriteAheadLog {
  /** Set when the log could not be restored after a failure: no write may be appended any more. */
  failure: Error | undefined;
  private eventsSinceCompaction = 0;
  /** The log was written in an older format: the next compaction (due at once) rewrites it in this one. */
  private outdated = false;

  private constructor(
    readonly dir: string,
    private appender: LogAppender,
    private readonly compactAfter: number,
    private readonly beforeLogSync: WriteAheadLogOptions['beforeLogSync'],
  ) {}

  /** Opens the log of `dir` (creating an empty one) and returns it with its records, to be replayed. */
  static async open(dir: string, opts: WriteAheadLogOptions): Promise<{ wal: WriteAheadLog; records: LogRecord[] }> {
    const records = await readLog(dir);
    if (records.length === 0) await writeCompactedLog(dir, [{ op: 'header', format: LOG_FORMAT, rv: 0 }]);
    const wal = new WriteAheadLog(dir, await LogAppender.open(dir), Math.max(1, opts.compactAfterEvents), opts.beforeLogSync);
    // rewritten before anything is appended: a version that reads only format 1 must not find patches behind its header
    wal.outdated = records.length > 0 && records[0].op === 'header' && records[0].format !== LOG_FORMAT;
    return { wal, records };
  }

  /** Feeds `records` (from `open`) to `target` in log order; counts the changes toward the next compaction. */
  replay(records: LogRecord[], target: ReplayTarget): void {
    // the history's last event of each object, the base of its next `histp` record
    const lastHist = new Map<string, EventRecord>();
    const file = path.join(this.dir, LOG_NAME);
    for (let i = 0; i < records.length; i++) {
      const r = records[i]!;
      switch (r.op) {
        case 'header':
          target.header(r.rv);
          break;
        case 'hist': {
          const ev = stripOp(r);
          lastHist.set(keyOf(ev), ev);
          target.history(ev, JSON.stringify(r).length + 1);
          break;
        }
        case 'histp': {
          const key = objKey(r.k, r.ns, r.n);
          const prev = lastHist.get(key);
          if (!prev || prev.rv !== r.base) throw new StoreLogCorruptError(file, i + 1, `history patch of ${key} at resourceVersion ${r.rv} applies to resourceVersion ${r.base}, but the history's last event of it is ${prev ? prev.rv : 'missing'}`);
          const ev = fromPatch(r, prev.object as AnyStored, file, i + 1);
          lastHist.set(key, ev);
          target.history(ev, JSON.stringify(r).length + 1);
          break;
        }
        case 'patch': {
          const key = objKey(r.k, r.ns, r.n);
          const cur = target.current(key);
          if (!cur || cur.metadata.resourceVersion !== String(r.base)) throw new StoreLogCorruptError(file, i + 1, `patch of ${key} at resourceVersion ${r.rv} applies to resourceVersion ${r.base}, but the object is ${cur ? `at ${cur.metadata.resourceVersion}` : 'missing'}`);
          target.event(fromPatch(r, cur, file, i + 1), JSON.stringify(r).length + 1);
          this.eventsSinceCompaction++;
          break;
        }
        case 'obj':
          target.object(r.k, r.object as AnyStored);
          break;
        case 'ev':
          target.event(stripOp(r), JSON.stringify(r).length + 1);
          this.eventsSinceCompaction++;
          break;
      }
    }
  }

  /**
   * Appends one batch of changes: one write, `beforeLogSync`, one fdatasync. Resolves once it is durable with the
   * length of each record's line; on a rejection call `rollback` before appending again.
   */
  async append(events: EventRecord[], bases: readonly (AnyStored | undefined)[] = []): Promise<number[]> {
    const sizes = await this.appender.append(
      events.map((ev, i): LogRecord => {
        const p = patchOf(ev, bases[i]);
        return p ? { op: 'patch', ...p } : { op: 'ev', ...ev };
      }),
      this.beforeLogSync,
    );
    this.eventsSinceCompaction += events.length;
    return sizes;
  }

  /** Cuts a failed batch off the log; if that fails too, sets `failure` (`why`: what failed the batch). */
  async rollback(why: string): Promise<void> {
    try {
      await this.appender.rollback();
    } catch (rollbackErr) {
      this.failure = internalError(
        `datastore log ${path.join(this.dir, LOG_NAME)} could not be cut back after a failed write (${why}; then ${rollbackErr instanceof Error ? rollbackErr.message : String(rollbackErr)}); writes are refused until the store is reopened`,
        rollbackErr,
      );
    }
  }

  /** Enough changes were appended since the last compaction. */
  get compactionDue(): boolean {
    return this.outdated || this.eventsSinceCompaction >= this.compactAfter;
  }

  /** `compact`, keeping the old log on failure (it stays intact and appended to; retried after another round). */
  async compactQuietly(snapshot: () => CompactionSnapshot): Promise<void> {
    try {
      await this.compact(snapshot);
    } catch {
      if (this.failure) return;
      this.eventsSinceCompaction = 0;
    }
  }

  /**
   * Rewrites the log from the committed state (`snapshot` is taken at once). Called only between batches (no append
   * in flight).
   */
  async compact(snapshot: () => CompactionSnapshot): Promise<void> {
    const { rv, history, objects } = snapshot();
    const records: LogRecord[] = [{ op: 'header', format: LOG_FORMAT, rv }];
    const lastHist = new Map<string, EventRecord>();
    for (const h of history) {
      const key = keyOf(h);
      const p = patchOf(h, lastHist.get(key)?.object as AnyStored | undefined);
      records.push(p ? { op: 'histp', ...p } : { op: 'hist', ...h });
      lastHist.set(key, h);
    }
    for (const [key, o] of objects) records.push({ op: 'obj', k: kindOfKey(key), object: o });
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
    this.outdated = false;
  }

  async close(): Promise<void> {
    await this.appender.close();
  }
}

export function internalError(message: string, cause: unknown): StatusError {
  const err = new StatusError('InternalError', 500, message);
  Object.defineProperty(err, 'cause', { value: cause, enumerable: false, configurable: true, writable: true });
  return err;
}

function keyOf(ev: EventRecord): string {
  return objKey(ev.k, ev.object.metadata.namespace, ev.object.metadata.name);
}

/**
 * A MODIFIED change as a patch of `base` (the object's version before it), or undefined when it is written whole: not a
 * MODIFIED change, no base, or a change of the whole value.
 */
function patchOf(ev: EventRecord, base: AnyStored | undefined): PatchRecord | undefined {
  if (ev.type !== 'MODIFIED' || !base) return undefined;
  const ops = diffValue(base, ev.object);
  if (ops.some((op) => op[0].length === 0)) return undefined;
  const m = ev.object.metadata;
  return { rv: ev.rv, k: ev.k, type: 'MODIFIED', ...(m.namespace !== undefined ? { ns: m.namespace } : {}), n: m.name, base: Number(base.metadata.resourceVersion), ops, ...(ev.pl ? { pl: ev.pl } : {}) };
}

/** The change a patch record describes, its object built from `base`. */
function fromPatch(r: PatchRecord, base: AnyStored, file: string, line: number): EventRecord {
  let object: AnyStored;
  try {
    object = applyPatch(base, r.ops);
  } catch (err) {
    if (err instanceof PatchPathError) throw new StoreLogCorruptError(file, line, err.message);
    throw err;
  }
  return { rv: r.rv, k: r.k, type: 'MODIFIED', object, ...(r.pl ? { pl: r.pl } : {}) };
}

function stripOp<T extends { op: string }>(r: T): Omit<T, 'op'> {
  const { op: _op, ...rest } = r;
  return rest;
}
