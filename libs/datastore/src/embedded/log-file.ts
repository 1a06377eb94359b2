import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { PatchOp } from '../json-patch.js';
import type { KubeObject, WatchEventType } from '../types.js';

/**
 * On-disk format of the embedded store: one append-only JSON-lines file, `store.log`.
 *
 *   {"op":"header","format":1,"rv":N}          first line: resourceVersion at the last compaction
 *   {"op":"hist", ...EventRecord}              watch history kept across compaction (not applied to state)
 *   {"op":"obj","k":kindKey,"object":{...}}    every live object as of the header's rv
 *   {"op":"ev", ...EventRecord}                each committed change after that, in resourceVersion order
 *   {"op":"patch", ...PatchRecord}             a committed MODIFIED change, as the operations that turn the object's
 *                                              previous version (resourceVersion `base`) into the new one
 *   {"op":"histp", ...PatchRecord}             a history event the same way, against the history's previous event of
 *                                              the object
 *
 * The first two are written by compactions; `patch` records keep a change of one file in a manager listing a thousand
 * from writing the whole manager (half a megabyte) to the log. Format 2 adds `patch` and `histp`; format 1 logs are
 * read as they are.
 *
 * A change is acknowledged only after its line is written and fdatasync'ed. Changes staged while a sync is in
 * flight are appended together as one batch (one write, one fdatasync: group commit); a batch that fails is cut
 * off again (truncate to the last durable length + fdatasync), so the file never keeps an unacknowledged change. Compaction writes a new file
 * (`store.log.tmp`), fsyncs it, renames it over `store.log` and fsyncs the directory, so a crash leaves
 * either the old or the new file. A torn last line (crash during an append, never acknowledged) is cut off
 * when the store opens; a damaged line anywhere else stops the open with an error naming the line.
 */
export interface EventRecord {
  rv: number;
  /** `<group>/<Kind>` */
  k: string;
  type: Exclude<WatchEventType, 'BOOKMARK'>;
  object: KubeObject;
  /** Labels of the previous state (MODIFIED only), to turn selector transitions into ADDED/DELETED. */
  pl?: Record<string, string>;
}

/** A MODIFIED change as a patch of the object's previous version (`ns`/`n`: its namespace and name). */
export interface PatchRecord {
  rv: number;
  k: string;
  type: 'MODIFIED';
  ns?: string;
  n: string;
  /** resourceVersion of the version the operations apply to. */
  base: number;
  ops: PatchOp[];
  pl?: Record<string, string>;
}

/** The log format this code writes. */
export const LOG_FORMAT = 2;

export type LogRecord =
  | { op: 'header'; format: 1 | 2; rv: number }
  | ({ op: 'hist' } & EventRecord)
  | ({ op: 'histp' } & PatchRecord)
  | { op: 'obj'; k: string; object: KubeObject }
  | ({ op: 'ev' } & EventRecord)
  | ({ op: 'patch' } & PatchRecord);

export const LOG_NAME = 'store.log';

export class StoreLogCorruptError extends Error {
  constructor(file: string, line: number, why: string) {
    super(`datastore log ${file} is damaged at line ${line}: ${why}`);
    this.name = 'StoreLogCorruptError';
  }
}

/** Reads every record; cuts off a torn final line. */
export async function readLog(dir: string): Promise<LogRecord[]> {
  const file = path.join(dir, LOG_NAME);
  let buf: Buffer;
  try {
    buf = await fsp.readFile(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  const records: LogRecord[] = [];
  let offset = 0;
  let lineNo = 0;
  while (offset < buf.length) {
    const nl = buf.indexOf(0x0a, offset);
    const end = nl < 0 ? buf.length : nl;
    lineNo++;
    const text = buf.subarray(offset, end).toString('utf8');
    let rec: LogRecord | undefined;
    try {
      rec = JSON.parse(text) as LogRecord;
    } catch {
      rec = undefined;
    }
    const isLast = nl < 0 || nl === buf.length - 1;
    if (!rec || typeof rec !== 'object' || !('op' in rec)) {
      if (isLast) {
        // Torn append: the write was never acknowledged. Drop it.
        await fsp.truncate(file, offset);
        break;
      }
      throw new StoreLogCorruptError(file, lineNo, 'not a JSON record');
    }
    if (nl < 0) {
      // Complete JSON but no newline: the append was interrupted before its newline; treat as torn too.
      await fsp.truncate(file, offset);
      break;
    }
    records.push(rec);
    offset = end + 1;
  }
  if (records.length > 0 && records[0].op !== 'header') throw new StoreLogCorruptError(file, 1, 'missing header record');
  const format = records.length > 0 && records[0].op === 'header' ? records[0].format : LOG_FORMAT;
  if (format !== 1 && format !== LOG_FORMAT) throw new StoreLogCorruptError(file, 1, `log format ${String(format)} is not one this version reads (1 or ${LOG_FORMAT})`);
  return records;
}

export async function fsyncDir(dir: string): Promise<void> {
  const fh = await fsp.open(dir, 'r');
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Writes `records` to `store.log.tmp` and fsyncs it (the first half of a compaction). Returns the temp path. */
export async function writeLogTemp(dir: string, records: LogRecord[]): Promise<string> {
  const tmp = path.join(dir, LOG_NAME + '.tmp');
  const fh = await fsp.open(tmp, 'w', 0o600);
  try {
    const chunk: string[] = [];
    let size = 0;
    for (const r of records) {
      const line = JSON.stringify(r) + '\n';
      chunk.push(line);
      size += line.length;
      if (size > 1 << 20) {
        await fh.write(chunk.join(''));
        chunk.length = 0;
        size = 0;
      }
    }
    if (chunk.length) await fh.write(chunk.join(''));
    await fh.sync();
  } catch (err) {
    await fh.close().catch(() => undefined); // the write error is rethrown below
    await fsp.rm(tmp, { force: true });
    throw err;
  }
  await fh.close();
  return tmp;
}

/** Atomically replaces the log with `records` (temp file + fsync + rename + dir fsync). */
export async function writeCompactedLog(dir: string, records: LogRecord[]): Promise<void> {
  const tmp = await writeLogTemp(dir, records);
  await fsp.rename(tmp, path.join(dir, LOG_NAME));
  await fsyncDir(dir);
}

/** What a batch hook is told about the batch being committed. */
export interface LogBatchInfo {
  /** Change records in the batch. */
  events: number;
  /** Bytes appended. */
  bytes: number;
}

/**
 * Appends batches of records: one write, one fdatasync per batch. It remembers the length of the log up to the
 * last durable batch, so a failed batch can be cut off again (`rollback`).
 */
export class LogAppender {
  private constructor(
    private readonly fh: fsp.FileHandle,
    private durableSize: number,
  ) {}
  static async open(dir: string): Promise<LogAppender> {
    const fh = await fsp.open(path.join(dir, LOG_NAME), 'a', 0o600);
    try {
      return new LogAppender(fh, (await fh.stat()).size);
    } catch (err) {
      await fh.close();
      throw err;
    }
  }
  /** Bytes of the log that are durable. */
  get size(): number {
    return this.durableSize;
  }
  /**
   * Writes the records, calls `beforeSync` (if given), fdatasyncs; resolves once the batch is durable. On a
   * rejection the file may hold part of the batch: call `rollback()` before appending again. Resolves with the
   * length of each record's line (UTF-16 code units of its JSON, about its size in bytes).
   */
  async append(records: LogRecord[], beforeSync?: (info: LogBatchInfo) => void | Promise<void>): Promise<number[]> {
    const lines = records.map((r) => JSON.stringify(r) + '\n');
    const buf = Buffer.from(lines.join(''), 'utf8');
    for (let off = 0; off < buf.length; ) {
      const { bytesWritten } = await this.fh.write(buf, off, buf.length - off);
      if (bytesWritten <= 0) throw new Error(`short write to ${LOG_NAME}`);
      off += bytesWritten;
    }
    if (beforeSync) await beforeSync({ events: records.length, bytes: buf.length });
    await this.fh.datasync();
    this.durableSize += buf.length;
    return lines.map((l) => l.length);
  }
  /** Cuts the log back to its durable length (drops a failed batch) and syncs that. */
  async rollback(): Promise<void> {
    await this.fh.truncate(this.durableSize);
    await this.fh.datasync();
  }
  async close(): Promise<void> {
    await this.fh.close();
  }
}
