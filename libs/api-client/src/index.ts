export {
  SOURCE_TYPES,
  type SourceType,
  type BackingImage,
  type BackupBackingImage,
  type BackupTarget,
  type BackupTargetUpdate,
  type SecretInfo,
  type Node,
  type CreateBackingImageRequest,
} from './types.js';
export { isUnauthorized, isNotFound, errorFromResponse, transportError, ApiClientError } from './errors.js';
export {
  formatBytes,
  formatDuration,
  summariseCopies,
  allCopiesFailedReason,
  describeCopies,
  describeSource,
  copiesShortfall,
} from './format.js';
export { parseExpectedChecksum } from './checksum.js';
export { BisClient } from './client.js';
export { type BisEvent, type DiskScrub, type NodeDisk } from './types.js';
