import { defineKind, isNotFound, type Datastore, type ObjectMeta, type Stored } from '@bis/datastore';
import { Semaphore } from '@bis/runtime';

/** Longhorn's event reasons (`constant/events.go`) used by the backing-image controllers. */
export const EventReason = {
  Create: 'Create',
  Delete: 'Delete',
  Update: 'Update',
  FailedDeleting: 'FailedDeleting',
  FailedStarting: 'FailedStarting',
  Unknown: 'Unknown',
  Fetching: 'Fetching',
  Syncing: 'Syncing',
  EvictionUserRequested: 'EvictionUserRequested',
  EvictionCanceled: 'EvictionCanceled',
  Running: 'Running',
  Completed: 'Completed',
  InProgress: 'InProgress',
  Pending: 'Pending',
  Error: 'Error',
  Ready: 'Ready',
  Failed: 'Failed',
  Started: 'Started',
} as const;

export const EventSource = {
  BackingImage: 'longhorn-backing-image-controller',
  BackingImageDataSource: 'longhorn-backing-image-data-source-controller',
  BackingImageManager: 'longhorn-backing-image-manager-controller',
  BackupBackingImage: 'longhorn-backup-backing-image-controller',
  Node: 'longhorn-node-controller',
} as const;

export type EventType = 'Normal' | 'Warning';

/** The object an event is about: any stored object (its kind, name, namespace and, when known, uid). */
export interface InvolvedObject {
  kind: string;
  metadata: { name: string; namespace?: string; uid?: string };
  apiVersion?: string;
}

export interface RecordedEvent {
  /** Unique among the kept events (the Event object's name when it is stored). */
  id: string;
  /** When it was last seen (RFC 3339). */
  time: string;
  /** When it was first seen (RFC 3339); repetitions keep it. */
  firstTime?: string;
  type: EventType;
  reason: string;
  message: string;
  source: string;
  involvedObject: { kind: string; name: string; namespace?: string };
  /** Repetitions of the same (object, type, reason, message) folded into this entry. */
  count: number;
}

export interface EventQuery {
  kind?: string;
  name?: string;
  reason?: string;
}

/**
 * Where the controllers record what they do and why something fails. One interface for every mode: the in-memory
 * ring ({@link EventRecorder}), the store ({@link StoreEventRecorder}, standalone; survives restarts) and the Kubernetes
 * API (`KubeEventRecorder` of `@bis/kube`: core/v1 Events on the involved object). `record` never throws and never
 * waits; `list` answers the newest last; `flush` waits for the records made so far to be written.
 */
export interface EventSink {
  record(source: string, obj: InvolvedObject, type: EventType, reason: string, message: string): void;
  list(q?: EventQuery): Promise<RecordedEvent[]>;
  flush(): Promise<void>;
}

const URL_USERINFO = /(\b[a-z][a-z0-9+.-]*:\/\/)[^/@\s:]+:[^/@\s]+@/gi;
const SECRET_QUERY = /([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|signature|sig|token|access_token|password|secret|key)=)[^&\s"']+/gi;

/**
 * An event's message without credentials a URL may carry (`user:password@`, signed-URL and token query parameters).
 * Secrets the controllers know by value are removed where they are used (`redactSecrets`).
 */
export function redactEventMessage(message: string): string {
  return message.replace(URL_USERINFO, '$1***@').replace(SECRET_QUERY, '$1***');
}

const sameEvent = (e: RecordedEvent, type: EventType, reason: string, message: string) => e.type === type && e.reason === reason && e.message === message;

const matches = (e: RecordedEvent, q: EventQuery) =>
  (!q.kind || e.involvedObject.kind === q.kind) && (!q.name || e.involvedObject.name === q.name) && (!q.reason || e.reason === q.reason);

/**
 * Records events into an in-memory ring and forwards each to a log line (warnings as warnings). Identical consecutive
 * events on the same object are folded (count++), as Kubernetes' event correlator does. Lost on restart: the
 * standalone system and the Kubernetes mode use the store and the API instead.
 */
export class EventRecorder implements EventSink {
  private readonly ring: RecordedEvent[] = [];
  private seq = 0;

  constructor(
    private readonly capacity = 2000,
    private readonly log: (line: string, type: EventType) => void = () => {},
  ) {}

  record(source: string, obj: InvolvedObject, type: EventType, reason: string, message: string): void {
    message = redactEventMessage(message);
    const time = new Date().toISOString();
    const last = this.ring.findLast((e) => e.involvedObject.kind === obj.kind && e.involvedObject.name === obj.metadata.name);
    if (last && sameEvent(last, type, reason, message)) {
      last.count++;
      last.time = time;
    } else {
      this.ring.push({ id: `${obj.metadata.name}.${(this.seq++).toString(16).padStart(8, '0')}`, time, firstTime: time, type, reason, message, source, involvedObject: { kind: obj.kind, name: obj.metadata.name, namespace: obj.metadata.namespace }, count: 1 });
      if (this.ring.length > this.capacity) this.ring.splice(0, this.ring.length - this.capacity);
    }
    this.log(eventLine(type, reason, obj, message), type);
  }

  async list(q: EventQuery = {}): Promise<RecordedEvent[]> {
    return this.ring.filter((e) => matches(e, q)).map((e) => ({ ...e, involvedObject: { ...e.involvedObject } }));
  }

  async flush(): Promise<void> {}
}

export function eventLine(type: EventType, reason: string, obj: InvolvedObject, message: string): string {
  return `event ${type} ${reason} ${obj.kind}/${obj.metadata.name}: ${message}`;
}

// ------------------------------------------------------------------ events kept in the store (standalone)

/** A core/v1 Event as the store keeps it (the same object Kubernetes keeps). */
export interface CoreEvent {
  apiVersion: 'v1';
  kind: 'Event';
  metadata: ObjectMeta;
  involvedObject: { kind: string; name: string; namespace?: string; uid?: string; apiVersion?: string };
  reason: string;
  message: string;
  type: EventType;
  source: { component: string; host?: string };
  firstTimestamp: string;
  lastTimestamp: string;
  count: number;
  reportingComponent?: string;
  reportingInstance?: string;
}

export const EventKind = defineKind<CoreEvent>({ apiVersion: 'v1', kind: 'Event', plural: 'events', namespaced: true, statusSubresource: false });

/** The API shape of a core/v1 Event. */
export function recordedEventOf(e: Pick<CoreEvent, 'lastTimestamp' | 'firstTimestamp' | 'type' | 'reason' | 'message' | 'source' | 'involvedObject' | 'count'> & { metadata: { name: string } }): RecordedEvent {
  return {
    id: e.metadata.name,
    time: e.lastTimestamp,
    firstTime: e.firstTimestamp,
    type: e.type,
    reason: e.reason,
    message: e.message,
    source: e.source?.component ?? '',
    involvedObject: { kind: e.involvedObject.kind, name: e.involvedObject.name, namespace: e.involvedObject.namespace },
    count: e.count ?? 1,
  };
}

/** The `involvedObject` of a core/v1 Event about `obj` (its namespace, or `namespace` for a cluster-scoped object). */
export function involvedObjectRef(obj: InvolvedObject, namespace: string): CoreEvent['involvedObject'] {
  return {
    kind: obj.kind,
    name: obj.metadata.name,
    namespace: obj.metadata.namespace ?? namespace,
    ...(obj.metadata.uid ? { uid: obj.metadata.uid } : {}),
    ...(obj.apiVersion ? { apiVersion: obj.apiVersion } : {}),
  };
}

/** Kubernetes' event name: `<object name>.<16 hex digits of the time in ns>` (unique per record here). */
export function eventName(objName: string, nowMs: number, seq: number): string {
  const ns = BigInt(nowMs) * 1_000_000n + BigInt(seq % 1_000_000);
  return `${objName}.${ns.toString(16).padStart(16, '0')}`;
}

export interface StoreEventRecorderOptions {
  store: Datastore;
  namespace: string;
  /** Events kept per involved object (oldest dropped first; default 50). */
  perObject?: number;
  /** Events kept in all (oldest dropped first; default 5000). */
  total?: number;
  /** Most events waiting (beyond it a Normal event is only logged, a Warning beyond twice it; default 1000). */
  maxPending?: number;
  /** Most writes at once (events of different objects; default 8). */
  concurrency?: number;
  log?: (line: string, type: EventType) => void;
  now?: () => Date;
  component?: string;
}

interface Kept {
  name: string;
  obj: string;
  time: string;
}

/**
 * The kept events, oldest first (a Map keeps insertion order: a repeat moves its event to the end), with a count per
 * involved object, so that pruning after each write costs in proportion to what it drops, not to the events kept (it
 * filtered all 5,000 twice per write: 2.5 % of the controller-manager's CPU at 1,000 images).
 */
class KeptEvents {
  readonly byName = new Map<string, Kept>();
  private readonly perObject = new Map<string, number>();

  constructor(sorted: Kept[]) {
    for (const k of sorted) this.add(k);
  }
  get size(): number {
    return this.byName.size;
  }
  count(obj: string): number {
    return this.perObject.get(obj) ?? 0;
  }
  add(k: Kept): void {
    this.byName.set(k.name, k);
    this.perObject.set(k.obj, this.count(k.obj) + 1);
  }
  /** A repeat: the event is the newest now. */
  touch(name: string, time: string): void {
    const k = this.byName.get(name);
    if (!k) return;
    this.byName.delete(name);
    k.time = time;
    this.byName.set(name, k);
  }
  remove(k: Kept): boolean {
    if (this.byName.get(k.name) !== k) return false;
    this.byName.delete(k.name);
    const n = this.count(k.obj) - 1;
    if (n > 0) this.perObject.set(k.obj, n);
    else this.perObject.delete(k.obj);
    return true;
  }
}

/**
 * What every sink that keeps events somewhere shares: each event is logged at once and written in the background.
 * The events of one object are written one at a time, in the order recorded (a repeat folds into the last one); those
 * of different objects at the same time, at most `concurrency` writes at once (8), so that a store or API server that
 * acknowledges each write after a sync is not paced by one write at a time. At most `maxPending` events wait (1000);
 * beyond that a `Normal` event is logged only, and a `Warning` still waits up to twice that, so that a burst of
 * routine events does not hide why something failed. What was only logged is counted (`dropped`) and said in a log
 * line at most every 10 s. A failed write is logged, never thrown. `flush` waits for what was recorded so far.
 */
export abstract class QueuedEventSink<Time> implements EventSink {
  /** The last write queued for each object (`kind/name`): the next event of that object goes after it. */
  private readonly tails = new Map<string, Promise<void>>();
  private readonly inFlight = new Set<Promise<void>>();
  private pending = 0;
  private readonly slots: Semaphore;
  /** Events only logged because too many waited, by type. */
  readonly dropped = { Normal: 0, Warning: 0 };
  private droppedSaidAt = 0;
  private droppedSaid = 0;

  constructor(
    private readonly queue: { maxPending?: number; concurrency?: number; log?: (line: string, type: EventType) => void; now?: () => Date },
    /** How a failed write is described ("stored", "written"). */
    private readonly done: string,
  ) {
    this.slots = new Semaphore(Math.max(1, queue.concurrency ?? 8));
  }

  /** The event's time, taken when it is recorded. */
  protected abstract stamp(): Time;
  protected abstract write(source: string, obj: InvolvedObject, type: EventType, reason: string, message: string, time: Time): Promise<void>;
  abstract list(q?: EventQuery): Promise<RecordedEvent[]>;

  record(source: string, obj: InvolvedObject, type: EventType, reason: string, message: string): void {
    message = redactEventMessage(message);
    this.queue.log?.(eventLine(type, reason, obj, message), type);
    const max = this.queue.maxPending ?? 1000;
    if (this.pending >= (type === 'Warning' ? 2 * max : max)) {
      this.dropped[type]++;
      this.sayDropped();
      return;
    }
    this.pending++;
    const time = this.stamp();
    const key = `${obj.kind}/${obj.metadata.name}`;
    const after = this.tails.get(key) ?? Promise.resolve();
    const p: Promise<void> = after
      .then(() => this.slots.run(() => this.write(source, obj, type, reason, message, time)))
      .catch((err: unknown) =>
        this.queue.log?.(`event ${reason} on ${obj.kind}/${obj.metadata.name} not ${this.done}: ${err instanceof Error ? err.message : String(err)}`, 'Warning'),
      )
      .finally(() => {
        this.pending--;
        this.inFlight.delete(p);
        if (this.tails.get(key) === p) this.tails.delete(key);
      });
    this.tails.set(key, p);
    this.inFlight.add(p);
  }

  private sayDropped(): void {
    const now = (this.queue.now?.() ?? new Date()).getTime();
    if (now - this.droppedSaidAt < 10_000) return;
    const total = this.dropped.Normal + this.dropped.Warning;
    this.droppedSaidAt = now;
    this.queue.log?.(`${total - this.droppedSaid} event(s) only logged, not ${this.done}: ${this.pending} waiting already (${this.dropped.Normal} Normal and ${this.dropped.Warning} Warning since the start)`, 'Warning');
    this.droppedSaid = total;
  }

  async flush(): Promise<void> {
    await Promise.all([...this.inFlight]);
  }
}

/**
 * Events kept in the store as core/v1 Event objects, with bounded retention: the newest `perObject` per involved
 * object and the newest `total` in all. Written in the background ({@link QueuedEventSink}); a repeat of an object's
 * last event updates that event's count and lastTimestamp instead of adding one.
 */
export class StoreEventRecorder extends QueuedEventSink<string> {
  private seq = 0;
  /** Kept events, oldest first (loaded from the store on the first write). */
  private keptLoad?: Promise<KeptEvents>;
  /** Last event per object (`kind/name`): folded repeats. */
  private readonly last = new Map<string, Stored<CoreEvent>>();
  private readonly perObject: number;
  private readonly total: number;
  private readonly now: () => Date;

  constructor(private readonly opts: StoreEventRecorderOptions) {
    super(opts, 'stored');
    this.perObject = opts.perObject ?? 50;
    this.total = opts.total ?? 5000;
    this.now = opts.now ?? (() => new Date());
  }

  protected stamp(): string {
    return this.now().toISOString();
  }

  override async list(q: EventQuery = {}): Promise<RecordedEvent[]> {
    await this.flush();
    const { items } = await this.opts.store.list(EventKind, { namespace: this.opts.namespace });
    return items
      .map(recordedEventOf)
      .filter((e) => matches(e, q))
      .sort((a, b) => a.time.localeCompare(b.time) || (a.firstTime ?? '').localeCompare(b.firstTime ?? ''));
  }

  private loadKept(): Promise<KeptEvents> {
    // one load, whichever write comes first (writes of different objects run at the same time)
    this.keptLoad ??= this.opts.store.list(EventKind, { namespace: this.opts.namespace }).then(({ items }) =>
      new KeptEvents(items.map((e) => ({ name: e.metadata.name, obj: `${e.involvedObject.kind}/${e.involvedObject.name}`, time: e.lastTimestamp ?? '' })).sort((a, b) => a.time.localeCompare(b.time))),
    );
    return this.keptLoad;
  }

  protected async write(source: string, obj: InvolvedObject, type: EventType, reason: string, message: string, time: string): Promise<void> {
    const { store, namespace } = this.opts;
    const key = `${obj.kind}/${obj.metadata.name}`;
    const kept = await this.loadKept();
    const last = this.last.get(key);
    if (last && last.type === type && last.reason === reason && last.message === message) {
      try {
        const saved = await store.update(EventKind, { ...last, count: (last.count ?? 1) + 1, lastTimestamp: time });
        this.last.set(key, saved);
        kept.touch(saved.metadata.name, time);
        return;
      } catch {
        // deleted or changed meanwhile: recorded as a new event
      }
    }
    const nowMs = Date.parse(time);
    const saved = await store.create(EventKind, {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name: eventName(obj.metadata.name, nowMs, this.seq++), namespace },
      involvedObject: involvedObjectRef(obj, namespace),
      reason,
      message,
      type,
      source: { component: source },
      firstTimestamp: time,
      lastTimestamp: time,
      count: 1,
      reportingComponent: source,
      reportingInstance: this.opts.component ?? '',
    });
    this.last.set(key, saved);
    kept.add({ name: saved.metadata.name, obj: key, time });
    await this.prune(kept, key);
  }

  private async prune(kept: KeptEvents, key: string): Promise<void> {
    // the oldest events of this object beyond perObject, then the oldest of the rest beyond total
    const drop = new Set<Kept>();
    let ofObject = kept.count(key) - this.perObject;
    let overall = kept.size - this.total;
    if (ofObject > 0) {
      for (const e of kept.byName.values()) {
        if (ofObject <= 0) break;
        if (e.obj !== key) continue;
        drop.add(e);
        ofObject--;
      }
    }
    overall -= drop.size;
    if (overall > 0) {
      for (const e of kept.byName.values()) {
        if (overall <= 0) break;
        if (drop.has(e)) continue;
        drop.add(e);
        overall--;
      }
    }
    for (const e of drop) {
      // another object's write may have dropped it meanwhile (they prune at the same time)
      if (!kept.remove(e)) continue;
      if (this.last.get(e.obj)?.metadata.name === e.name) this.last.delete(e.obj);
      await this.opts.store.delete(EventKind, e.name, this.opts.namespace).catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      });
    }
  }
}
