import { DISK_TYPES } from '../enums.js';
import { conditionSchema } from '../meta.js';
import { s, type Infer } from '../schema/model.js';
import { AGE_COLUMN, defineKind, type ObjectOf } from './kind.js';

export const diskSpecSchema = s.object({
  diskType: s.enumOf(DISK_TYPES),
  diskDriver: s.enumOf(['', 'auto', 'aio', 'nvme']),
  path: s.string(),
  allowScheduling: s.bool(),
  evictionRequested: s.bool(),
  storageReserved: s.int64({ description: 'Bytes of the disk kept free of replicas and backing images.' }),
  tags: s.array(s.string()),
});
export type DiskSpec = Infer<typeof diskSpecSchema>;

export const diskStatusSchema = s.object({
  conditions: s.nullable(s.array(conditionSchema)),
  storageAvailable: s.int64(),
  storageScheduled: s.int64(),
  storageMaximum: s.int64(),
  scheduledReplica: s.nullable(s.map(s.int64())),
  scheduledBackingImage: s.nullable(s.map(s.int64(), { description: 'Bytes scheduled for each backing image.' })),
  diskUUID: s.string(),
  diskName: s.string(),
  diskPath: s.string(),
  diskType: s.string(),
  diskDriver: s.string(),
  filesystemType: s.string(),
  instanceManagerName: s.string(),
});
export type DiskStatus = Infer<typeof diskStatusSchema>;

export const nodeSpecSchema = s.object(
  {
    name: s.string(),
    disks: s.map(diskSpecSchema, { description: 'The disks of the node, by disk name.' }),
    allowScheduling: s.bool(),
    evictionRequested: s.bool(),
    tags: s.array(s.string()),
    instanceManagerCPURequest: s.int(),
  },
  { description: 'NodeSpec is the desired state of a storage node.' },
);
export type NodeSpec = Infer<typeof nodeSpecSchema>;

export const nodeStatusSchema = s.object(
  {
    conditions: s.nullable(s.array(conditionSchema)),
    diskStatus: s.nullable(s.map(diskStatusSchema, { description: 'Observed state of each disk, by disk name.' })),
    region: s.string(),
    zone: s.string(),
    autoEvicting: s.bool(),
  },
  { description: 'NodeStatus is the observed state of a storage node.' },
);
export type NodeStatus = Infer<typeof nodeStatusSchema>;

export const NODE = defineKind({
  kind: 'Node',
  listKind: 'NodeList',
  plural: 'nodes',
  singular: 'node',
  shortNames: ['lhn'],
  description: 'Node is a storage node and its disks.',
  printerColumns: [
    { name: 'Ready', type: 'string', jsonPath: ".status.conditions[?(@.type=='Ready')].status", description: 'Whether the node is ready' },
    { name: 'AllowScheduling', type: 'boolean', jsonPath: '.spec.allowScheduling', description: 'Whether scheduling onto the node is allowed' },
    { name: 'Schedulable', type: 'string', jsonPath: ".status.conditions[?(@.type=='Schedulable')].status", description: 'Whether the node can take replicas' },
    AGE_COLUMN,
  ],
  root: s.object({ spec: nodeSpecSchema, status: nodeStatusSchema }),
});
// An interface (not an alias) so that the compiler resolves the inferred type once and names it in messages.
export interface Node extends ObjectOf<typeof NODE> {}
