import { MANAGER_STATES } from '@bis/state-machine';
import { s, type Infer } from '../schema/model.js';
import { backingImageStateSchema } from './backing-image.js';
import { AGE_COLUMN, defineKind, type ObjectOf } from './kind.js';

export const backingImageManagerSpecSchema = s.object(
  {
    image: s.string({ description: 'Container image of the manager.' }),
    nodeID: s.string(),
    diskUUID: s.string(),
    diskPath: s.string(),
    backingImages: s.map(s.string(), { description: 'The backing images (name to UUID) this manager must hold.' }),
  },
  { description: 'BackingImageManagerSpec is the desired state of a backing image manager.' },
);
export type BackingImageManagerSpec = Infer<typeof backingImageManagerSpecSchema>;

export const backingImageFileInfoSchema = s.object({
  name: s.string(),
  uuid: s.string(),
  size: s.int64(),
  virtualSize: s.int64(),
  realSize: s.int64(),
  state: backingImageStateSchema,
  currentChecksum: s.string(),
  message: s.string(),
  sendingReference: s.int(),
  senderManagerAddress: s.string(),
  progress: s.int(),
  retryCount: s.int({ description: 'Failed attempts counted since the last success (an addition to Longhorn\'s fields).' }),
  nextRetryAt: s.string({ description: 'RFC 3339 time of the next attempt after a failure; empty when none is planned (an addition to Longhorn\'s fields).' }),
});
export type BackingImageFileInfo = Infer<typeof backingImageFileInfoSchema>;

/** The disk's background scrub, as its manager reports it (our extension; see docs/reliability.md). */
export const diskScrubStatusSchema = s.object(
  {
    lastScrubTime: s.string({ description: 'RFC 3339 time the last scrub pass of the disk ended; empty before the first.' }),
    lastScrubResult: s.string({ description: 'ok, corrupted (a copy failed its SHA-512 chain), error (a copy could not be read), or empty.' }),
    lastScrubMessage: s.string({ description: 'The corrupt or unreadable copies of the last pass and why.' }),
    lastScrubFiles: s.int({ description: 'Copies verified by the last pass.' }),
    scrubbing: s.string({ description: 'The copy being scrubbed now (empty when idle).' }),
  },
  { description: 'DiskScrubStatus is the last background re-verification of the copies on the disk.' },
);
export type DiskScrubStatus = Infer<typeof diskScrubStatusSchema>;

export const backingImageManagerStatusSchema = s.object(
  {
    ownerID: s.string(),
    currentState: s.enumOf(MANAGER_STATES, { enumInOpenApi: false }),
    backingImageFileMap: s.nullable(s.map(backingImageFileInfoSchema)),
    ip: s.string(),
    storageIP: s.string(),
    apiMinVersion: s.int(),
    apiVersion: s.int(),
    message: s.string({ description: 'Why the manager is not running, e.g. its pod could not be created (our extension; empty when running).' }),
    diskScrub: diskScrubStatusSchema,
  },
  { description: 'BackingImageManagerStatus is the observed state of a backing image manager.' },
);
export type BackingImageManagerStatus = Infer<typeof backingImageManagerStatusSchema>;

export const BACKING_IMAGE_MANAGER = defineKind({
  kind: 'BackingImageManager',
  listKind: 'BackingImageManagerList',
  plural: 'backingimagemanagers',
  singular: 'backingimagemanager',
  shortNames: ['lhbim'],
  description: 'BackingImageManager is the per-disk daemon that holds the backing image files of one disk.',
  printerColumns: [
    { name: 'State', type: 'string', jsonPath: '.status.currentState', description: 'State of the manager' },
    { name: 'Image', type: 'string', jsonPath: '.spec.image', description: 'Container image of the manager' },
    { name: 'Node', type: 'string', jsonPath: '.spec.nodeID', description: 'Node the manager runs on' },
    { name: 'DiskUUID', type: 'string', jsonPath: '.spec.diskUUID', description: 'Disk the manager is responsible for' },
    { name: 'DiskPath', type: 'string', jsonPath: '.spec.diskPath', description: 'Path of that disk' },
    AGE_COLUMN,
  ],
  root: s.object({ spec: backingImageManagerSpecSchema, status: backingImageManagerStatusSchema }),
});
// An interface (not an alias) so that the compiler resolves the inferred type once and names it in messages.
export interface BackingImageManager extends ObjectOf<typeof BACKING_IMAGE_MANAGER> {}
