import { s, type Infer } from '../schema/model.js';
import { backingImageStateSchema, sourceTypeSchema } from './backing-image.js';
import { AGE_COLUMN, defineKind, type ObjectOf } from './kind.js';

export const backingImageDataSourceSpecSchema = s.object(
  {
    nodeID: s.string({ description: 'Node on which the first file is produced.' }),
    uuid: s.string({ description: 'The UUID of the backing image (status.uuid of the BackingImage).' }),
    diskUUID: s.string({ description: 'Disk on which the first file is produced.' }),
    diskPath: s.string(),
    checksum: s.string({ description: 'Expected checksum (spec.checksum of the BackingImage).' }),
    sourceType: sourceTypeSchema,
    parameters: s.map(s.string()),
    fileTransferred: s.bool({ description: 'True once a backing image manager has taken over the file.' }),
  },
  { description: 'BackingImageDataSourceSpec is the desired state of a backing image data source.' },
);
export type BackingImageDataSourceSpec = Infer<typeof backingImageDataSourceSpecSchema>;

export const backingImageDataSourceStatusSchema = s.object(
  {
    ownerID: s.string(),
    runningParameters: s.nullable(s.map(s.string())),
    currentState: backingImageStateSchema,
    ip: s.string(),
    storageIP: s.string(),
    size: s.int64(),
    progress: s.int(),
    checksum: s.string(),
    message: s.string(),
    retryCount: s.int({ description: 'Attempts of the data source that failed since the last success (an addition to Longhorn\'s fields).' }),
    nextRetryAt: s.string({ description: 'RFC 3339 time the failed data source is started again; empty when none is planned (an addition to Longhorn\'s fields).' }),
  },
  { description: 'BackingImageDataSourceStatus is the observed state of a backing image data source.' },
);
export type BackingImageDataSourceStatus = Infer<typeof backingImageDataSourceStatusSchema>;

export const BACKING_IMAGE_DATA_SOURCE = defineKind({
  kind: 'BackingImageDataSource',
  listKind: 'BackingImageDataSourceList',
  plural: 'backingimagedatasources',
  singular: 'backingimagedatasource',
  shortNames: ['lhbids'],
  description: 'BackingImageDataSource describes how the first file of a backing image is produced.',
  printerColumns: [
    { name: 'UUID', type: 'string', jsonPath: '.spec.uuid', description: 'Generated UUID of the backing image file' },
    { name: 'State', type: 'string', jsonPath: '.status.currentState', description: 'State of the first file' },
    { name: 'SourceType', type: 'string', jsonPath: '.spec.sourceType', description: 'Where the image comes from' },
    { name: 'Size', type: 'string', jsonPath: '.status.size', description: 'Size of the file' },
    { name: 'Node', type: 'string', jsonPath: '.spec.nodeID', description: 'Node the file is produced on' },
    { name: 'DiskUUID', type: 'string', jsonPath: '.spec.diskUUID', description: 'Disk the file is produced on' },
    AGE_COLUMN,
  ],
  root: s.object({ spec: backingImageDataSourceSpecSchema, status: backingImageDataSourceStatusSchema }),
});
// An interface (not an alias) so that the compiler resolves the inferred type once and names it in messages.
export interface BackingImageDataSource extends ObjectOf<typeof BACKING_IMAGE_DATA_SOURCE> {}
