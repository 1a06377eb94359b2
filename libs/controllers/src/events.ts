import { defineKind, type ObjectMeta } from '@bis/datastore';
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
 * ring ({@link EventRecorder}), the event log (`EventLogRecorder`, standalone; survives restarts) and the Kubernetes
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

/** Whether a new event repeats `e` (same type, reason and message): it then folds into it. */
export const sameEvent = (e: RecordedEvent, type: EventType, reason: string, message: string): boolean => e.type === type && e.reason === reason && e.message === message;

/** Whether `e` is one that `q` asks for. */
export const matchesQuery = (e: RecordedEvent, q: EventQuery): boolean =>
  (!q.kind || e.involvedObject.kind === q.kind) && (!q.name || e.involvedObject.name === q.name) && (!q.reason || e.reason === q.reason);

/**
 * Records events into an in-memory ring and forwards each to a log line (warnings as warnings). Identical consecutive
 * events on the same object are folded (count++), as Kubernetes' event correlator does. Lost on restart: the
 * standalone system and the Kubernetes mode use the event log and the API instead.
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
    return this.ring.filter((e) => matchesQuery(e, q)).map((e) => ({ ...e, involvedObject: { ...e.involvedObject } }));
  }

  async flush(): Promise<void> {}
}

export function eventLine(type: EventType, reason: string, obj: InvolvedObject, message: string): string {
  return `event ${type} ${reason} ${obj.kind}/${obj.metadata.name}: ${message}`;
}

// ------------------------------------------------------------------ core/v1 Events (Kubernetes; the store of earlier standalone versions)

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
