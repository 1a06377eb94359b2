import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { StatusError } from '../errors.js';
import { LOG_NAME, LogAppender, fsyncDir, readLog, writeCompactedLog, writeLogTemp, type EventRecord, type LogBatchInfo, type LogRecord } from './log-file.js';
import type { AnyStored } from './object-rules.js';
import { kindOfKey } from './object-rules.js';

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

  private constructor(
    readonly dir: string,
    private appender: LogAppender,
    private readonly compactAfter: number,
    private readonly beforeLogSync: WriteAheadLogOptions['beforeLogSync'],
  ) {}

  /** Opens the log of `dir` (creating an empty one) and returns it with its records, to be replayed. */
  static async open(dir: string, opts: WriteAheadLogOptions): Promise<{ wal: WriteAheadLog; records: LogRecord[] }> {
    const records = await readLog(dir);
    if (records.length === 0) await writeCompactedLog(dir, [{ op: 'header', format: 1, rv: 0 }]);
    const wal = new WriteAheadLog(dir, await LogAppender.open(dir), Math.max(1, opts.compactAfterEvents), opts.beforeLogSync);
    return { wal, records };
  }

  /** Feeds `records` (from `open`) to `target` in log order; counts the changes toward the next compaction. */
  replay(records: LogRecord[], target: ReplayTarget): void {
    for (const r of records) {
      switch (r.op) {
        case 'header':
          target.header(r.rv);
          break;
        case 'hist':
          target.history(stripOp(r), JSON.stringify(r).length + 1);
          break;
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
  async append(events: EventRecord[]): Promise<number[]> {
    const sizes = await this.appender.append(
      events.map((ev) => ({ op: 'ev', ...ev })),
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
    return this.eventsSinceCompaction >= this.compactAfter;
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
    const records: LogRecord[] = [{ op: 'header', format: 1, rv }];
    for (const h of history) records.push({ op: 'hist', ...h });
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

function stripOp<T extends { op: string }>(r: T): Omit<T, 'op'> {
  const { op: _op, ...rest } = r;
  return rest;
}
