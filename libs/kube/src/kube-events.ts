import { CoreV1Api, PatchStrategy, setHeaderOptions, type CoreV1Event, type KubeConfig } from '@kubernetes/client-node';
import {
  eventName,
  involvedObjectRef,
  QueuedEventSink,
  recordedEventOf,
  type EventQuery,
  type EventType,
  type InvolvedObject,
  type RecordedEvent,
} from '@bis/controllers';
import { ApiAccess } from './api-access.js';

export interface KubeEventRecorderOptions {
  kubeConfig: KubeConfig;
  /** The system's namespace: events are created there (the involved objects live there). */
  namespace: string;
  /** `reportingInstance` and `source.host` (the node the controller runs on). */
  host?: string;
  access?: ApiAccess;
  /** Most events waiting (beyond it a Normal event is only logged, a Warning beyond twice it; default 1000). */
  maxPending?: number;
  /** Most requests at once (events of different objects; default 8). */
  concurrency?: number;
  log?: (line: string, type: EventType) => void;
  now?: () => Date;
}

/**
 * Events as Kubernetes Events (core/v1 `Event`, as Longhorn's recorder writes them) on the involved object, so
 * `kubectl describe lhbi <name>` lists them. A repeat of an object's last event patches its `count` and
 * `lastTimestamp` (the event correlator's aggregation); the API server's event TTL bounds their retention. Written in
 * the background, each object's in the order recorded (`QueuedEventSink`); a failed write is logged, never thrown.
 */
export class KubeEventRecorder extends QueuedEventSink<Date> {
  private readonly core: CoreV1Api;
  private readonly access: ApiAccess;
  private seq = 0;
  private readonly last = new Map<string, { name: string; type: EventType; reason: string; message: string; count: number }>();
  private readonly now: () => Date;

  constructor(private readonly opts: KubeEventRecorderOptions) {
    super(opts, 'written');
    this.core = opts.kubeConfig.makeApiClient(CoreV1Api);
    this.access = opts.access ?? new ApiAccess();
    this.now = opts.now ?? (() => new Date());
  }

  protected stamp(): Date {
    return this.now();
  }

  override async list(q: EventQuery = {}): Promise<RecordedEvent[]> {
    await this.flush();
    this.access.require('', 'events', 'list');
    const selector = [q.kind ? `involvedObject.kind=${q.kind}` : '', q.name ? `involvedObject.name=${q.name}` : '', q.reason ? `reason=${q.reason}` : ''].filter(Boolean).join(',');
    const res = await this.core.listNamespacedEvent({ namespace: this.opts.namespace, ...(selector ? { fieldSelector: selector } : {}) });
    return res.items
      .map((e) =>
        recordedEventOf({
          metadata: { name: e.metadata?.name ?? '' },
          lastTimestamp: iso(e.lastTimestamp ?? e.eventTime ?? e.metadata?.creationTimestamp),
          firstTimestamp: iso(e.firstTimestamp ?? e.eventTime ?? e.metadata?.creationTimestamp),
          type: (e.type === 'Warning' ? 'Warning' : 'Normal') as EventType,
          reason: e.reason ?? '',
          message: e.message ?? '',
          source: { component: e.source?.component ?? e.reportingComponent ?? '' },
          involvedObject: { kind: e.involvedObject.kind ?? '', name: e.involvedObject.name ?? '', namespace: e.involvedObject.namespace },
          count: e.count ?? 1,
        }),
      )
      // also filtered here: the field selector is the server's to honour
      .filter((e) => (!q.kind || e.involvedObject.kind === q.kind) && (!q.name || e.involvedObject.name === q.name) && (!q.reason || e.reason === q.reason))
      .sort((a, b) => a.time.localeCompare(b.time));
  }

  protected async write(source: string, obj: InvolvedObject, type: EventType, reason: string, message: string, time: Date): Promise<void> {
    const namespace = this.opts.namespace;
    const key = `${obj.kind}/${obj.metadata.name}`;
    const last = this.last.get(key);
    if (last && last.type === type && last.reason === reason && last.message === message) {
      this.access.require('', 'events', 'patch');
      try {
        await this.core.patchNamespacedEvent(
          { name: last.name, namespace, body: { count: last.count + 1, lastTimestamp: time } },
          setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch),
        );
        last.count++;
        return;
      } catch {
        // gone (the event TTL) or refused: recorded as a new event
      }
    }
    this.access.require('', 'events', 'create');
    const body: CoreV1Event = {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name: eventName(obj.metadata.name, time.getTime(), this.seq++), namespace },
      involvedObject: involvedObjectRef(obj, namespace),
      reason,
      message,
      type,
      source: { component: source, ...(this.opts.host ? { host: this.opts.host } : {}) },
      firstTimestamp: time,
      lastTimestamp: time,
      count: 1,
      reportingComponent: source,
      reportingInstance: this.opts.host ?? '',
    };
    const created = await this.core.createNamespacedEvent({ namespace, body });
    this.last.set(key, { name: created.metadata?.name ?? body.metadata.name!, type, reason, message, count: 1 });
  }
}

function iso(v: Date | string | undefined): string {
  if (!v) return '';
  return typeof v === 'string' ? v : v.toISOString();
}
