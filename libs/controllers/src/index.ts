export * from './kinds.js';
export * from './names.js';
export * from './settings.js';
export * from './backoff.js';
export * from './events.js';
export * from './topology.js';
export * from './rules.js';
export * from './status.js';
export * from './data-plane.js';
export { Controller, DEFAULT_TIMING, isResponsibleFor, type ControllerContext, type ControllerTiming, type Logger } from './base-controller.js';
export { BackingImageController } from './backing-image-controller.js';
export { BackingImageDataSourceController, MAX_MONITOR_RETRY_COUNT } from './data-source-controller.js';
export { BackingImageManagerController, MAX_MONITOR_RECEIVE_ERRORS } from './manager-controller.js';
export { BackupBackingImageController, syncBackupTargetBackingImages } from './backup-controller.js';
export { BackupTargetController, parseGoDuration } from './backup-target-controller.js';
export { NodeController } from './node-controller.js';
export * from './manager-api.js';
export * from './actions.js';
export { describeImageCopies, diskNamesByUUID } from './copies-text.js';
export * from './controller-manager.js';
export {
  BACKUP_TARGET_CREDENTIAL_KEYS,
  DatastoreSecretStore,
  SecretKind,
  SecretNotFoundError,
  backupTargetCredential,
  decodeSecretData,
  encodeSecretData,
  redactSecrets,
  type Secret,
  type SecretStore,
} from './secrets.js';
