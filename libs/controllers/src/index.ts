export {
  type BackingImage,
  type BackingImageDataSource,
  type BackingImageManager,
  type BackupBackingImage,
  type BackupTarget,
  type Node,
  BackingImageKind,
  BackingImageDataSourceKind,
  BackingImageManagerKind,
  BackupBackingImageKind,
  BackupTargetKind,
  NodeKind,
  ReplicaKind,
  SettingKind,
  type StoredBI,
  type StoredBIDS,
  type StoredBIM,
  type StoredBBI,
  type StoredNode,
  type StoredReplica,
} from './kinds.js';
export { backingImageManagerName, dataSourceWorkloadName, replicaLabels, Annotation } from './names.js';
export { SettingName, SettingsReader } from './settings.js';
export { EventRecorder } from './events.js';
export {
  countCopies,
  cleanupRefusal,
  CLEANUP_NOT_ENOUGH_READY,
  CLEANUP_NOT_ENOUGH_HANDLING,
  CLEANUP_NOT_ENOUGH_FILES,
} from './rules.js';
export {
  managerLaunchArgs,
  type WorkloadStatus,
  type ManagerApi,
  type DataSourceApi,
  DATA_SOURCE_CREDENTIAL_ENV,
  DATA_SOURCE_MALLOC_ENV,
  type DataSourceLaunch,
  type BackupTargetApi,
  type ManagerLaunch,
  type DataPlane,
} from './data-plane.js';
export { type Logger } from './base-controller.js';
export { ensureDefaultBackupTarget, parseGoDuration, type DefaultBackupTargetSpec } from './backup-target-controller.js';
export { managerApiFromClient } from './manager-api.js';
export { ActionError, type CreateBackingImageInput, BackingImageActions } from './actions.js';
export { describeImageCopies, diskNamesByUUID } from './copies-text.js';
export { type ControllerManagerOptions, ControllerManager } from './controller-manager.js';
export {
  SecretKind,
  SecretNotFoundError,
  backupTargetCredential,
  decodeSecretData,
  encodeSecretData,
  type Secret,
  type SecretStore,
} from './secrets.js';
export {
  DISK_ERROR_REASONS,
  DISK_HEALTHY_CONDITION,
  diskErrorOf,
  diskHasError,
  failedCopyMessage,
  withDiskCondition,
  type DiskErrorCode,
} from './disk-errors.js';
export { recordDiskHealth } from './disk-conditions.js';
export { EventKind, eventLine, eventName, involvedObjectRef, recordedEventOf, redactEventMessage, type EventQuery, type EventSink, type EventType, type InvolvedObject, type RecordedEvent } from './events.js';
export { EVENT_MESSAGE_MAX, EventLogRecorder, type EventLogOpened, type EventLogOptions } from './event-log.js';
export { QueuedEventSink } from './events.js';
