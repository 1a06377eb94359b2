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
} as const;

export const EventSource = {
  BackingImage: 'longhorn-backing-image-controller',
  BackingImageDataSource: 'longhorn-backing-image-data-source-controller',
  BackingImageManager: 'longhorn-backing-image-manager-controller',
  BackupBackingImage: 'longhorn-backup-backing-image-controller',
  Node: 'longhorn-node-controller',
} as const;

export interface RecordedEvent {
  time: string;
  type: 'Normal' | 'Warning';
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
 * Records events into an in-memory ring (for the API) and forwards each to a log line. Identical consecutive events
 * on the same object are folded (count++), as Kubernetes' event correlator does.
 */
export class EventRecorder {
  private readonly ring: RecordedEvent[] = [];

  constructor(
    private readonly capacity = 2000,
    private readonly log: (line: string) => void = () => {},
  ) {}

  record(source: string, obj: { kind: string; metadata: { name: string; namespace?: string } }, type: 'Normal' | 'Warning', reason: string, message: string): void {
    const time = new Date().toISOString();
    const last = this.ring.findLast((e) => e.involvedObject.kind === obj.kind && e.involvedObject.name === obj.metadata.name);
    if (last && last.type === type && last.reason === reason && last.message === message) {
      last.count++;
      last.time = time;
    } else {
      this.ring.push({ time, type, reason, message, source, involvedObject: { kind: obj.kind, name: obj.metadata.name, namespace: obj.metadata.namespace }, count: 1 });
      if (this.ring.length > this.capacity) this.ring.splice(0, this.ring.length - this.capacity);
    }
    this.log(`event ${type} ${reason} ${obj.kind}/${obj.metadata.name}: ${message}`);
  }

  list(q: EventQuery = {}): RecordedEvent[] {
    return this.ring.filter(
      (e) => (!q.kind || e.involvedObject.kind === q.kind) && (!q.name || e.involvedObject.name === q.name) && (!q.reason || e.reason === q.reason),
    );
  }
}
