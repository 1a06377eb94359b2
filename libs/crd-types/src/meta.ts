import { s, type Infer } from './schema/model.js';

/** `metadata.ownerReferences[*]`. */
export const ownerReferenceSchema = s.object(
  {
    apiVersion: s.string(),
    kind: s.string(),
    name: s.string(),
    uid: s.string(),
    controller: s.bool(),
    blockOwnerDeletion: s.bool(),
  },
  { required: ['apiVersion', 'kind', 'name', 'uid'] },
);
export type OwnerReference = Infer<typeof ownerReferenceSchema>;

/**
 * The Kubernetes ObjectMeta fields this system reads and writes. Used for runtime checks and types; the CRDs
 * describe `metadata` as a plain `type: object`, as Longhorn's do (the API server owns its schema).
 */
export const objectMetaSchema = s.object({
  name: s.string(),
  generateName: s.string(),
  namespace: s.string(),
  uid: s.string(),
  resourceVersion: s.string(),
  generation: s.int64(),
  creationTimestamp: s.nullable(s.dateTime()),
  deletionTimestamp: s.nullable(s.dateTime()),
  deletionGracePeriodSeconds: s.nullable(s.int64()),
  labels: s.map(s.string()),
  annotations: s.map(s.string()),
  finalizers: s.array(s.string()),
  ownerReferences: s.array(ownerReferenceSchema),
});
export type ObjectMeta = Infer<typeof objectMetaSchema>;

/** A Kubernetes status condition as Longhorn writes it (Node, disk, BackupTarget). */
export const conditionSchema = s.object({
  type: s.string({ description: 'Type of the condition.' }),
  status: s.string({ description: 'Status of the condition: True, False or Unknown.' }),
  lastProbeTime: s.string({ description: 'Last time the condition was probed.' }),
  lastTransitionTime: s.string({ description: 'Last time the condition changed from one status to another.' }),
  reason: s.string({ description: 'One-word CamelCase reason for the last transition.' }),
  message: s.string({ description: 'Human-readable details about the last transition.' }),
});
export type Condition = Infer<typeof conditionSchema>;
