export {
  BACKUP_BLOCK_SIZE,
  BACKUPSTORE_BASE,
  BACKING_IMAGES_DIR,
  BLOCKS_DIR,
  LOCK_VOLUME_NAME,
  BackupStoreError,
  type BackupStoreErrorCode,
  assertBackingImageName,
  isValidBackingImageName,
  backingImageConfigPath,
  blockChecksum,
  blockPath,
  lockDir,
} from './names.js';
export {
  type BackingImageBackupConfig,
  type BackupInfo,
  type BlockEntry,
  type CompressionMethod,
  COMPRESSION_METHODS,
  decodeBackingImageConfig,
  encodeBackingImageConfig,
  encodeBackupInfo,
  effectiveCompressionMethod,
  goTimestamp,
  parseCompressionMethod,
} from './config.js';
export { goIndentTabs, goJsonString } from './go-json.js';
export { compressBlock, decompressAndVerifyBlock, sniffEncoding, GZIP_LEVEL } from './compression.js';
export {
  type BackupUrl,
  type TargetLocation,
  type S3TargetLocation,
  type FileSystemTargetLocation,
  encodeBackupUrl,
  parseBackupUrl,
  parseTargetUrl,
} from './url.js';
export * from './drivers/index.js';
export {
  BackupStoreLock,
  BACKUP_LOCK,
  RESTORE_LOCK,
  DELETION_LOCK,
  LONGHORN_LOCK_TIMING,
  LOCK_TIMING_ENV,
  lockTimingFromEnv,
  currentLockOwner,
  isLockOwnerDead,
  type LockOptions,
  type LockTiming,
} from './lock.js';
export type { StoreAccessOptions } from './engine/common.js';
export {
  createBackup,
  startBackup,
  type BackupOperation,
  type BackupProgress,
  type BackupResult,
  type BackupStatus,
  type CreateBackupOptions,
} from './engine/backup.js';
export { restoreBackup, type RestoreBackupOptions, type RestoreProgress, type RestoreResult } from './engine/restore.js';
export {
  deleteBackup,
  gcTarget,
  inspectBackup,
  listBackingImageBackups,
  listBackingImageBackupNames,
  verifyTarget,
  type BackupListEntry,
  type BlockProblem,
  type DeleteResult,
  type GcOptions,
  type GcResult,
  type VerifyOptions,
  type VerifyResult,
} from './engine/maintenance.js';
export type { LockOwner } from './config.js';
export { backupTargetOperations, type BackupTargetEntry } from './backup-target.js';
