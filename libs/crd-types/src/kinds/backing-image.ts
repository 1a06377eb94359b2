import { BACKING_IMAGE_DATA_SOURCE_TYPES, BACKING_IMAGE_STATES, DATA_ENGINE_TYPES } from '../enums.js';
import { s, type Infer } from '../schema/model.js';
import { conditionSchema } from '../meta.js';
import { AGE_COLUMN, defineKind, type ObjectOf } from './kind.js';

export const dataEngineSchema = s.enumOf(DATA_ENGINE_TYPES);
export const sourceTypeSchema = s.enumOf(BACKING_IMAGE_DATA_SOURCE_TYPES);
/** A file state; checked at runtime, a plain string in the CRD (as in Longhorn). */
export const backingImageStateSchema = s.enumOf(BACKING_IMAGE_STATES, { enumInOpenApi: false });

export const backingImageDiskFileSpecSchema = s.object({
  evictionRequested: s.bool({ description: 'Move this copy away from the disk.' }),
  dataEngine: dataEngineSchema,
});
export type BackingImageDiskFileSpec = Infer<typeof backingImageDiskFileSpecSchema>;

export const backingImageDiskFileStatusSchema = s.object({
  dataEngine: dataEngineSchema,
  state: backingImageStateSchema,
  progress: s.int(),
  message: s.string(),
  lastStateTransitionTime: s.string({ description: 'RFC 3339 time of the last state change.' }),
  retryCount: s.int({ description: 'Failed attempts counted since the last success (an addition to Longhorn\'s fields).' }),
  nextRetryAt: s.string({ description: 'RFC 3339 time of the next attempt after a failure; empty when none is planned (an addition to Longhorn\'s fields).' }),
});
export type BackingImageDiskFileStatus = Infer<typeof backingImageDiskFileStatusSchema>;

export const backingImageSpecSchema = s.object(
  {
    disks: s.map(s.string(), {
      description: 'Deprecated: replaced by diskFileSpecMap. Kept for compatibility with old clients.',
    }),
    diskFileSpecMap: s.map(backingImageDiskFileSpecSchema, {
      description: 'The disks (by disk UUID) that should hold a copy of the image.',
    }),
    checksum: s.string({ description: 'Expected checksum of the image file; empty means any.' }),
    sourceType: sourceTypeSchema,
    sourceParameters: s.map(s.string(), { description: 'Parameters of the source type (url, volume-name, ...).' }),
    minNumberOfCopies: s.int({ description: 'Minimum number of ready copies to keep.' }),
    diskSelector: s.array(s.string(), { description: 'Disk tags a disk must all have to hold a copy.' }),
    nodeSelector: s.array(s.string(), { description: 'Node tags a node must all have to hold a copy.' }),
    secret: s.string({ description: 'Name of the encryption secret.' }),
    secretNamespace: s.string({ description: 'Namespace of the encryption secret.' }),
    dataEngine: s.enumOf(DATA_ENGINE_TYPES, { default: 'v1' }),
  },
  { description: 'BackingImageSpec is the desired state of a backing image.' },
);
export type BackingImageSpec = Infer<typeof backingImageSpecSchema>;

export const backingImageStatusSchema = s.object(
  {
  ownerID: s.string(),
  uuid: s.string({ description: 'Eight characters generated once for the image; part of its on-disk directory name.' }),
  size: s.int64({ description: 'Size of the image file in bytes.' }),
  virtualSize: s.int64({ description: 'Virtual size of the image (qcow2 virtual size or the raw size).' }),
  realSize: s.int64({ description: 'Bytes the sparse file actually occupies on a disk.' }),
  checksum: s.string({ description: 'Checksum of the first file produced; immutable once set.' }),
  diskFileStatusMap: s.nullable(s.map(backingImageDiskFileStatusSchema)),
  diskLastRefAtMap: s.nullable(
    s.map(s.string(), { description: 'When each disk was last seen with no replica using the image (RFC 3339).' }),
  ),
  v2FirstCopyStatus: backingImageStateSchema,
  v2FirstCopyDisk: s.string(),
  conditions: s.nullable(
    s.array(conditionSchema, {
      description: 'MinCopiesSatisfiable: False when minNumberOfCopies exceeds the disks that the node and disk selectors allow (not in Longhorn).',
    }),
  ),
  },
  { description: 'BackingImageStatus is the observed state of a backing image.' },
);
export type BackingImageStatus = Infer<typeof backingImageStatusSchema>;

export const BACKING_IMAGE = defineKind({
  kind: 'BackingImage',
  listKind: 'BackingImageList',
  plural: 'backingimages',
  singular: 'backingimage',
  shortNames: ['lhbi'],
  description: 'BackingImage is a VM disk image that replicas of volumes are built on, with copies on several disks.',
  printerColumns: [
    { name: 'UUID', type: 'string', jsonPath: '.status.uuid', description: 'Generated UUID of the backing image' },
    { name: 'SourceType', type: 'string', jsonPath: '.spec.sourceType', description: 'Where the image comes from' },
    { name: 'Size', type: 'string', jsonPath: '.status.size', description: 'Size of the image file' },
    { name: 'VirtualSize', type: 'string', jsonPath: '.status.virtualSize', description: 'Virtual size of the image' },
    AGE_COLUMN,
  ],
  root: s.object({ spec: backingImageSpecSchema, status: backingImageStatusSchema }),
});
// An interface (not an alias) so that the compiler resolves the inferred type once and names it in messages.
export interface BackingImage extends ObjectOf<typeof BACKING_IMAGE> {}
