import { GoneError, StatusError } from '../errors.js';
import type { CompiledSelector } from '../label-selector.js';
import type { KubeObject, ResourceKind, Stored, WatchEvent, WatchOptions } from '../types.js';
import type { EventRecord } from './log-file.js';
import { clone as copyOf, kindKeyOf, selectorOrInvalid, type AnyStored } from './object-rules.js';

/** What a watch reads besides the history: the committed state. */
export interface WatchSource {
  /** Last committed resourceVersion. */
  rv(): number;
  /** The store is closed: every watch ends. */
  closed(): boolean;
  /** Committed objects of kind `k` (in `namespace`, when given) matching `sel`, sorted. */
  matching(k: string, namespace: string | undefined, sel: CompiledSelector): AnyStored[];
}

/**
 * The watch history of the embedded store: the last committed events, bounded by a count (`limit`) and by the length
 * of their JSON (`maxBytes`; the newest event always stays), kept across restarts through the log. A watch resumes
 * from any resourceVersion still in it; an older one gets 410 Gone. Watches wait for `notify` (a committed change)
 * between events.
 */
export class WatchHistory {
  private readonly events: EventRecord[] = [];
  /** JSON length of each event (same index) and their sum. */
  private readonly sizes: number[] = [];
  private bytes = 0;
  private waiters = new Set<() => void>();

  constructor(
    private readonly limit: number,
    private readonly maxBytes: number,
  ) {}

  /** Appends a committed event (call `trim` after a batch). */
  push(ev: EventRecord, size: number): void {
    this.events.push(ev);
    this.sizes.push(size);
    this.bytes += size;
  }

  /** Drops the oldest events beyond `limit` events or `maxBytes` (the newest event always stays). */
  trim(): void {
    let drop = Math.max(0, this.events.length - this.limit);
    let bytes = this.bytes;
    for (let i = 0; i < drop; i++) bytes -= this.sizes[i];
    while (bytes > this.maxBytes && drop < this.events.length - 1) bytes -= this.sizes[drop++];
    if (drop === 0) return;
    this.events.splice(0, drop);
    this.sizes.splice(0, drop);
    this.bytes = bytes;
  }

  /** The events kept, oldest first (for a compaction snapshot). */
  get entries(): readonly EventRecord[] {
    return this.events;
  }

  get stats(): { events: number; bytes: number; oldestResourceVersion: string | undefined } {
    return { events: this.events.length, bytes: this.bytes, oldestResourceVersion: this.events.length ? String(this.events[0].rv) : undefined };
  }

  /** Wakes every waiting watch (after a committed change, and at close). */
  notify(): void {
    const waiters = this.waiters;
    this.waiters = new Set();
    for (const w of waiters) w();
  }

  /**
   * The events of `kind` after `opts.resourceVersion` (or the current objects as ADDED, then the events after them),
   * with selector transitions turned into ADDED / DELETED and optional bookmarks; ends when the source closes or
   * `opts.signal` aborts; throws GoneError once the requested resourceVersion is no longer in the history.
   */
  async *watch<T extends KubeObject>(source: WatchSource, kind: ResourceKind<T>, opts: WatchOptions): AsyncGenerator<WatchEvent<T>> {
    const sel = selectorOrInvalid(kind, opts.labelSelector);
    const k = kindKeyOf(kind);
    const ns = kind.namespaced ? opts.namespace : undefined;
    const signal = opts.signal;
    let cursor: number;
    if (opts.resourceVersion === undefined || opts.resourceVersion === '' || opts.resourceVersion === '0') {
      const copy = opts.shared ? (o: AnyStored) => o : copyOf;
      const initial = source.matching(k, ns, sel).map((o) => copy(o));
      cursor = source.rv();
      for (const o of initial) yield { type: 'ADDED', object: o as Stored<T> };
    } else {
      if (!/^\d+$/.test(opts.resourceVersion)) {
        throw new StatusError('BadRequest', 400, `invalid resource version "${opts.resourceVersion}"`);
      }
      cursor = Number(opts.resourceVersion);
    }
    let lastSent = Date.now();
    while (!source.closed() && !signal?.aborted) {
      const history = this.events;
      const oldest = history.length ? history[0].rv : source.rv() + 1;
      if (cursor < oldest - 1) throw new GoneError(String(cursor), String(oldest - 1));
      let delivered = false;
      for (let i = Math.max(0, cursor + 1 - oldest); i < history.length; i++) {
        const ev = history[i];
        if (ev.rv <= cursor) continue;
        cursor = ev.rv;
        const out = translate<T>(ev, k, ns, sel, opts.shared === true);
        if (out) {
          delivered = true;
          lastSent = Date.now();
          yield out;
          // History may have been trimmed or grown while suspended: restart the scan from the cursor.
          break;
        }
      }
      if (delivered) continue;
      if (cursor >= source.rv() || history.length === 0 || history[history.length - 1].rv <= cursor) {
        const wait = opts.bookmarkIntervalMs ? Math.max(0, opts.bookmarkIntervalMs - (Date.now() - lastSent)) : undefined;
        const woke = await this.waitForChange(wait, signal);
        if (!woke && opts.bookmarkIntervalMs && !source.closed() && !signal?.aborted && cursor >= source.rv()) {
          lastSent = Date.now();
          yield {
            type: 'BOOKMARK',
            object: { apiVersion: kind.apiVersion, kind: kind.kind, metadata: { name: '', resourceVersion: String(cursor) } } as unknown as Stored<T>,
          };
        }
      }
    }
  }

  /** Resolves true on `notify`, false on timeout/abort. */
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
}

/** One history event as the watcher of kind `k`, namespace `ns` and selector `sel` sees it (undefined: not at all). */
function translate<T extends KubeObject>(ev: EventRecord, k: string, ns: string | undefined, sel: CompiledSelector, shared: boolean): WatchEvent<T> | undefined {
  if (ev.k !== k) return undefined;
  const o = ev.object as AnyStored;
  const give = shared ? (x: AnyStored) => x : copyOf;
  if (ns !== undefined && (o.metadata.namespace ?? '') !== ns) return undefined;
  const now = sel.matches(o.metadata.labels);
  if (ev.type === 'MODIFIED' && ev.pl !== undefined) {
    const before = sel.matches(ev.pl);
    if (before && !now) return { type: 'DELETED', object: give(o) as Stored<T> };
    if (!before && now) return { type: 'ADDED', object: give(o) as Stored<T> };
  }
  if (!now) return undefined;
  return { type: ev.type, object: give(o) as Stored<T> };
}
