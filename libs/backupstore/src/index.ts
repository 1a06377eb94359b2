export { BackupStoreError } from './names.js';
export { encodeBackupInfo, parseCompressionMethod } from './config.js';
export { goIndentTabs } from './go-json.js';
export { type BackupCredential } from './drivers/index.js';
export { LOCK_TIMING_ENV, lockTimingFromEnv, type LockTiming } from './lock.js';
export { createBackup } from './engine/backup.js';
export { restoreBackup } from './engine/restore.js';
export { deleteBackup, gcTarget, inspectBackup, listBackingImageBackups, verifyTarget } from './engine/maintenance.js';
export { backupTargetOperations } from './backup-target.js';
