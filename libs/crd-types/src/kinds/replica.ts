import { s } from '../schema/model.js';
import { AGE_COLUMN, defineKind, type ObjectOf } from './kind.js';

/**
 * Longhorn's Replica, as far as this system reads it: the controllers watch replicas to know which disks use a
 * backing image (`spec.backingImage`, `spec.nodeID`, `spec.diskID`, the `longhorn.io/backing-image` label). Longhorn
 * owns the rest of the object (engine, data path, instance manager, …): its schema is left open
 * (`x-kubernetes-preserve-unknown-fields`), so the objects of a Longhorn installation are stored unchanged.
 */
export const replicaSpecSchema = s.object(
  {
    backingImage: s.string({ description: 'Name of the backing image the replica is based on ("" for none).' }),
    nodeID: s.string({ description: 'Node the replica runs on.' }),
    diskID: s.string({ description: 'UUID of the disk that holds the replica.' }),
    dataEngine: s.string({ description: 'Data engine of the replica (v1 or v2).' }),
  },
  { description: 'ReplicaSpec is the desired state of a Longhorn replica (open: Longhorn owns the other fields).', preserveUnknownFields: true },
);

export const replicaStatusSchema = s.object({}, { description: 'ReplicaStatus is the observed state of a Longhorn replica (written by Longhorn).', preserveUnknownFields: true });

export const REPLICA = defineKind({
  kind: 'Replica',
  listKind: 'ReplicaList',
  plural: 'replicas',
  singular: 'replica',
  shortNames: ['lhr'],
  description: "Replica is Longhorn's replica of a volume (read by the backing-image controllers; written by Longhorn).",
  printerColumns: [
    { name: 'Data Engine', type: 'string', jsonPath: '.spec.dataEngine', description: 'The data engine of the replica' },
    { name: 'State', type: 'string', jsonPath: '.status.currentState', description: 'The current state of the replica' },
    { name: 'Node', type: 'string', jsonPath: '.spec.nodeID', description: 'The node that the replica is on' },
    { name: 'Disk', type: 'string', jsonPath: '.spec.diskID', description: 'The disk that the replica is on' },
    { name: 'InstanceManager', type: 'string', jsonPath: '.status.instanceManagerName', description: 'The instance manager of the replica' },
    { name: 'Image', type: 'string', jsonPath: '.status.currentImage', description: 'The current image of the replica' },
    AGE_COLUMN,
  ],
  root: s.object({ spec: replicaSpecSchema, status: replicaStatusSchema }),
});
export interface ReplicaObject extends ObjectOf<typeof REPLICA> {}
