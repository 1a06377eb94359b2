import type { EventQuery, RecordedEvent } from '@bis/controllers';
import type { ResourceDefinition, TypeSchema } from '@bis/rest-api';

/**
 * `GET /v1/events?kind=<kind>&name=<name>&reason=<reason>`: what the controllers recorded about the objects, oldest
 * first, as a Longhorn-style collection. In standalone the events are kept in the store (bounded); in Kubernetes mode
 * they are the cluster's core/v1 Events of the system's namespace.
 */
export const EVENT_SCHEMA: TypeSchema = {
  id: 'event',
  collectionMethods: ['GET'],
  resourceMethods: [],
  resourceFields: {
    name: { type: 'string' },
    eventType: { type: 'enum', options: ['Normal', 'Warning'] },
    reason: { type: 'string' },
    message: { type: 'string' },
    source: { type: 'string' },
    count: { type: 'int' },
    firstTimestamp: { type: 'date' },
    lastTimestamp: { type: 'date' },
    involvedObjectKind: { type: 'string' },
    involvedObjectName: { type: 'string' },
  },
};

/** Where the events are read from (the controllers' `EventSink`). */
export interface EventSource {
  list(q?: EventQuery): Promise<RecordedEvent[]>;
}

const str = (v: unknown): string | undefined => (typeof v === 'string' && v ? v : undefined);

export function eventResource(events: EventSource): ResourceDefinition<RecordedEvent> {
  return {
    schema: EVENT_SCHEMA,
    handlers: {
      id: (e) => e.id,
      toFields: (e) => ({
        name: e.id,
        eventType: e.type,
        reason: e.reason,
        message: e.message,
        source: e.source,
        count: e.count,
        firstTimestamp: e.firstTime ?? e.time,
        lastTimestamp: e.time,
        involvedObjectKind: e.involvedObject.kind,
        involvedObjectName: e.involvedObject.name,
      }),
      list: (ctx) => {
        const q = (ctx.request.query ?? {}) as Record<string, unknown>;
        return events.list({ kind: str(q['kind']), name: str(q['name']), reason: str(q['reason']) });
      },
    },
  };
}
