import { isNotFound, type Datastore } from '@bis/datastore';
import { BackingImageKind, ReplicaKind, replicaLabels, type StoredReplica } from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import type { ApiInput, ResourceDefinition, TypeSchema } from '@bis/rest-api';
import { changesOf } from './backing-image-resources.js';
import { refused } from './errors.js';

/**
 * Replica records: which replica uses which backing image on which disk. Longhorn's Replica CR carries much more;
 * the backing-image rules (delete and cleanup refusals, last-reference times) only need these fields.
 */
export const REPLICA_SCHEMA: TypeSchema = {
  id: 'replica',
  collectionMethods: ['GET', 'POST'],
  resourceMethods: ['GET', 'DELETE'],
  resourceFields: {
    name: { type: 'string', required: true, unique: true, create: true },
    backingImage: { type: 'string', required: true, create: true },
    nodeID: { type: 'string', required: true, create: true },
    diskID: { type: 'string', required: true, create: true },
  },
};

const NAME_RE = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;
const str = (v: unknown): string => (typeof v === 'string' ? v.trim() : '');

export class ReplicaService {
  constructor(
    private readonly store: Datastore,
    private readonly namespace: string,
  ) {}

  async list(): Promise<StoredReplica[]> {
    return (await this.store.list(ReplicaKind, { namespace: this.namespace })).items;
  }

  async get(name: string): Promise<StoredReplica | undefined> {
    try {
      return await this.store.get(ReplicaKind, name, this.namespace);
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  async create(input: ApiInput): Promise<StoredReplica> {
    const name = str(input.name);
    const backingImage = str(input.backingImage);
    const nodeID = str(input.nodeID);
    const diskID = str(input.diskID);
    if (!NAME_RE.test(name)) throw refused(`invalid replica name ${JSON.stringify(name)}: use lower-case letters, digits, '-' and '.'`);
    const missing = Object.entries({ backingImage, nodeID, diskID }).filter(([, v]) => v === '').map(([k]) => k);
    if (missing.length) throw refused(`invalid replica ${name}: ${missing.join(', ')} ${missing.length > 1 ? 'are' : 'is'} required`);
    try {
      await this.store.get(BackingImageKind, backingImage, this.namespace);
    } catch (err) {
      if (isNotFound(err)) throw refused(`invalid replica ${name}: backing image ${backingImage} not found`);
      throw err;
    }
    return this.store.create(ReplicaKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'Replica',
      metadata: { name, namespace: this.namespace, labels: replicaLabels(backingImage, diskID) },
      spec: { backingImage, nodeID, diskID },
    });
  }

  async delete(name: string): Promise<void> {
    await this.store.delete(ReplicaKind, name, this.namespace);
  }
}

export function replicaResource(service: ReplicaService, store: Datastore, namespace: string): ResourceDefinition<StoredReplica> {
  return {
    schema: REPLICA_SCHEMA,
    handlers: {
      id: (r) => r.metadata.name,
      toFields: (r) => ({ name: r.metadata.name, backingImage: r.spec.backingImage, nodeID: r.spec.nodeID, diskID: r.spec.diskID }),
      list: () => service.list(),
      get: (_ctx, id) => service.get(id),
      create: (_ctx, input) => service.create(input),
      delete: (_ctx, id) => service.delete(id),
      changes: (signal) => changesOf(store, ReplicaKind, namespace, signal),
    },
  };
}
