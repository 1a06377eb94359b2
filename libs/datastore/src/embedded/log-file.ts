import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { KubeObject, WatchEventType } from '../types.js';

/**
 * On-disk format of the embedded store: one append-only JSON-lines file, `store.log`.
 *
 *   {"op":"header","format":1,"rv":N}          first line: resourceVersion at the last compaction
 *   {"op":"hist", ...EventRecord}              watch history kept across compaction (not applied to state)
 *   {"op":"obj","k":kindKey,"object":{...}}    every live object as of the header's rv
 *   {"op":"ev", ...EventRecord}                each committed change after that, in resourceVersion order
 *
 * A change is acknowledged only after its line is written and fdatasync'ed. Compaction writes a new file
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

export type LogRecord =
  | { op: 'header'; format: 1; rv: number }
  | ({ op: 'hist' } & EventRecord)
  | { op: 'obj'; k: string; object: KubeObject }
  | ({ op: 'ev' } & EventRecord);

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

/** Atomically replaces the log with `records` (temp file + fsync + rename + dir fsync). */
export async function writeCompactedLog(dir: string, records: LogRecord[]): Promise<void> {
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
  } finally {
    await fh.close();
  }
  await fsp.rename(tmp, path.join(dir, LOG_NAME));
  await fsyncDir(dir);
}

/** Appends records and fdatasyncs before resolving. */
export class LogAppender {
  private constructor(private readonly fh: fsp.FileHandle) {}
  static async open(dir: string): Promise<LogAppender> {
    return new LogAppender(await fsp.open(path.join(dir, LOG_NAME), 'a', 0o600));
  }
  async append(records: LogRecord[]): Promise<void> {
    await this.fh.write(records.map((r) => JSON.stringify(r) + '\n').join(''));
    await this.fh.datasync();
  }
  async close(): Promise<void> {
    await this.fh.close();
  }
}
