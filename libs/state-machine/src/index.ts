export { IllegalTransitionError, transition } from './machine.js';
export { FileState, FileEvent, FILE_STATES, FILE_MACHINE } from './file-state.js';
export { FileLifecycle } from './progress.js';
export { type ManagerState, type ManagerEvent, MANAGER_STATES, MANAGER_MACHINE } from './manager-state.js';
export { type BackupState, type BackupEvent, BACKUP_STATES, BACKUP_MACHINE, BackupProgressState, backupEventForProgress } from './backup-state.js';
