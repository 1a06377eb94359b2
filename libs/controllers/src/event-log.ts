import { mkdir, open, readFile, rename, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { eventLine, eventName, matchesQuery, redactEventMessage, sameEvent, type EventQuery, type EventSink, type EventType, type InvolvedObject, type RecordedEvent } from './events.js';

export interface EventLogOptions {
  /** The file the events are kept in (created with its directory). */
  file: string;
  /** The namespace of involved objects that have none (cluster-scoped). */
  namespace: string;
  /** Events kept per involved object (oldest dropped first; default 50). */
  perObject?: number;
  /** Events kept in all (oldest dropped first; default 5000). */
  total?: number;
  log?: (line: string, type: EventType) => void;
  now?: () => Date;
}

/** What opening the log found. */
export interface EventLogOpened {
  /** Events kept after replaying the file. */
  events: number;
  /** Lines of the file that were not events (a write cut short by a crash, a damaged file): skipped. */
  skippedLines: number;
}

/** The longest message kept (longer ones are cut, with a mark): a line of the log stays bounded. */
export const EVENT_MESSAGE_MAX = 4096;

/**
 * Events kept in their own append-only file instead of the object store, the way large Kubernetes clusters keep them
 * in a separate etcd (`--etcd-servers-overrides=/events#…`): they are many (a dozen per image) and only informational,
 * so they neither take the store's writes, its watch history and its fdatasyncs, nor wake its watchers.
 *
 * Bounded like the store's events were: the newest `perObject` per involved object and the newest `total` in all. A
 * repeat of an object's last event (same type, reason and message) folds into it: its count and time change. Each
 * record and repeat appends one line (the whole event, which a later line with the same id replaces); replaying the
 * file with the same bounds gives the same events back. When the file holds more than twice `total` lines it is
 * rewritten with the kept events (to a temporary file, then renamed over it). Lines are written in the background, in
 * the order recorded, several per write; they are not fsync'ed (a crash may lose the last events, never the store's
 * objects). `record` never throws and never waits; a failed write is logged and the next write tries again.
 */
export class EventLogRecorder implements EventSink {
  /** Kept events, oldest first (Map order; a repeat moves its event to the end). */
  private readonly kept = new Map<string, RecordedEvent>();
  /** Each object's kept events, oldest first. */
  private readonly ofObject = new Map<string, Set<string>>();
  /** Each object's newest event (`kind/name` → id): a repeat of it folds. */
  private readonly last = new Map<string, string>();
  private readonly perObject: number;
  private readonly total: number;
  private readonly now: () => Date;
  private seq = 0;
  private pending: string[] = [];
  private linesInFile = 0;
  private writing?: Promise<void>;
  private closed = false;
  /** Writes that failed since the start. */
  writeFailures = 0;

  private constructor(
    private readonly opts: EventLogOptions,
    private fh: FileHandle,
  ) {
    this.perObject = Math.max(1, opts.perObject ?? 50);
    this.total = Math.max(1, opts.total ?? 5000);
    this.now = opts.now ?? (() => new Date());
  }

  /** Opens (or creates) the log and replays it. */
  static async open(opts: EventLogOptions): Promise<{ recorder: EventLogRecorder; opened: EventLogOpened }> {
    await mkdir(path.dirname(opts.file), { recursive: true });
    let text = '';
    try {
      text = await readFile(opts.file, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    const fh = await open(opts.file, 'a', 0o600);
    const recorder = new EventLogRecorder(opts, fh);
    let skippedLines = 0;
    for (const line of text.split('\n')) {
      if (line === '') continue;
      const e = parseEvent(line);
      if (e) recorder.keep(e);
      else skippedLines++;
      recorder.linesInFile++;
    }
    if (skippedLines > 0) opts.log?.(`event log ${opts.file}: ${skippedLines} line(s) that are not events skipped`, 'Warning');
    // a file of many replaced or dropped events is rewritten now rather than after the next 2 × total records (nothing
    // is being written yet)
    if (recorder.linesInFile > 2 * recorder.total || skippedLines > 0) await recorder.rewrite();
    return { recorder, opened: { events: recorder.kept.size, skippedLines } };
  }

  /**
   * Adds events kept elsewhere before (oldest first), as if recorded then, and writes them. Used once to move the
   * events an older version kept in the store.
   */
  async import(events: readonly RecordedEvent[]): Promise<void> {
    for (const e of events) this.append(this.keep({ ...e, involvedObject: { ...e.involvedObject } }));
    await this.flush();
  }

  record(source: string, obj: InvolvedObject, type: EventType, reason: string, message: string): void {
    message = boundMessage(redactEventMessage(message));
    this.opts.log?.(eventLine(type, reason, obj, message), type);
    if (this.closed) return;
    const time = this.now().toISOString();
    const key = objectKey(obj.kind, obj.metadata.name);
    const lastId = this.last.get(key);
    const last = lastId !== undefined ? this.kept.get(lastId) : undefined;
    const e: RecordedEvent =
      last && sameEvent(last, type, reason, message)
        ? { ...last, involvedObject: { ...last.involvedObject }, count: last.count + 1, time }
        : {
            id: eventName(obj.metadata.name, Date.parse(time), this.seq++),
            time,
            firstTime: time,
            type,
            reason,
            message,
            source,
            involvedObject: { kind: obj.kind, name: obj.metadata.name, namespace: obj.metadata.namespace ?? this.opts.namespace },
            count: 1,
          };
    this.append(this.keep(e));
  }

  async list(q: EventQuery = {}): Promise<RecordedEvent[]> {
    const out: RecordedEvent[] = [];
    for (const e of this.kept.values()) if (matchesQuery(e, q)) out.push({ ...e, involvedObject: { ...e.involvedObject } });
    return out;
  }

  /** Waits until the lines recorded so far are written (or their write failed). */
  async flush(): Promise<void> {
    while (this.writing) await this.writing;
  }

  /** Writes what is pending and closes the file; later records are only logged. */
  async close(): Promise<void> {
    await this.flush();
    this.closed = true;
    await this.fh.close();
  }

  /** Keeps `e` (replacing the event with its id), drops the oldest beyond the bounds; returns `e`. */
  private keep(e: RecordedEvent): RecordedEvent {
    const key = objectKey(e.involvedObject.kind, e.involvedObject.name);
    let ids = this.ofObject.get(key);
    if (!ids) this.ofObject.set(key, (ids = new Set()));
    // a replaced event moves to the end of both orders
    this.kept.delete(e.id);
    ids.delete(e.id);
    this.kept.set(e.id, e);
    ids.add(e.id);
    this.last.set(key, e.id);
    if (ids.size > this.perObject) this.drop(this.kept.get(ids.values().next().value as string) as RecordedEvent);
    while (this.kept.size > this.total) this.drop(this.kept.values().next().value as RecordedEvent);
    return e;
  }

  private drop(e: RecordedEvent): void {
    const key = objectKey(e.involvedObject.kind, e.involvedObject.name);
    this.kept.delete(e.id);
    const ids = this.ofObject.get(key);
    ids?.delete(e.id);
    if (ids?.size === 0) this.ofObject.delete(key);
    if (this.last.get(key) === e.id) this.last.delete(key);
  }

  private append(e: RecordedEvent): void {
    this.pending.push(`${JSON.stringify(e)}\n`);
    this.startWriting();
  }

  private startWriting(): void {
    if (this.writing || this.closed) return;
    const run = async () => {
      // lines recorded while a write runs go together in the next one
      while (this.pending.length > 0) {
        const lines = this.pending;
        this.pending = [];
        try {
          if (this.linesInFile + lines.length > 2 * this.total) {
            await this.rewrite();
            continue;
          }
          await this.fh.write(lines.join(''));
          this.linesInFile += lines.length;
        } catch (err) {
          this.writeFailures++;
          this.opts.log?.(`event log ${this.opts.file}: ${lines.length} event line(s) not written: ${(err as Error).message}`, 'Warning');
        }
      }
    };
    this.writing = run().finally(() => {
      this.writing = undefined;
      if (this.pending.length > 0) this.startWriting();
    });
  }

  /** Replaces the file by one line per kept event (the pending lines are in it: they are kept events already). */
  private async rewrite(): Promise<void> {
    const tmp = `${this.opts.file}.tmp`;
    const body = [...this.kept.values()].map((e) => `${JSON.stringify(e)}\n`).join('');
    const out = await open(tmp, 'w', 0o600);
    try {
      await out.write(body);
      await out.sync();
    } finally {
      await out.close();
    }
    await rename(tmp, this.opts.file);
    const old = this.fh;
    this.fh = await open(this.opts.file, 'a', 0o600);
    await old.close();
    this.linesInFile = this.kept.size;
  }
}

const objectKey = (kind: string, name: string) => `${kind}/${name}`;

const TRUNCATED = '… (truncated)';

function boundMessage(message: string): string {
  return message.length > EVENT_MESSAGE_MAX ? `${message.slice(0, EVENT_MESSAGE_MAX - TRUNCATED.length)}${TRUNCATED}` : message;
}

function parseEvent(line: string): RecordedEvent | undefined {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch {
    return undefined;
  }
  if (typeof v !== 'object' || v === null) return undefined;
  const e = v as Partial<RecordedEvent>;
  const o = e.involvedObject;
  if (typeof e.id !== 'string' || typeof e.time !== 'string' || (e.type !== 'Normal' && e.type !== 'Warning') || typeof e.reason !== 'string' || typeof e.message !== 'string') return undefined;
  if (typeof o !== 'object' || o === null || typeof o.kind !== 'string' || typeof o.name !== 'string') return undefined;
  return {
    id: e.id,
    time: e.time,
    ...(typeof e.firstTime === 'string' ? { firstTime: e.firstTime } : {}),
    type: e.type,
    reason: e.reason,
    message: e.message,
    source: typeof e.source === 'string' ? e.source : '',
    involvedObject: { kind: o.kind, name: o.name, ...(typeof o.namespace === 'string' ? { namespace: o.namespace } : {}) },
    count: typeof e.count === 'number' && e.count >= 1 ? Math.floor(e.count) : 1,
  };
}
