export { IllegalTransitionError, transition, type Machine, type Reported } from './machine.js';
export { FileState, FileEvent, FILE_STATES, FILE_MACHINE } from './file-state.js';
export { FileLifecycle, type FileLifecycleSnapshot } from './progress.js';
export { ManagerState, ManagerEvent, MANAGER_STATES, MANAGER_MACHINE } from './manager-state.js';
export { BackupState, BackupEvent, BACKUP_STATES, BACKUP_MACHINE, BackupProgressState, backupEventForProgress } from './backup-state.js';

import { BACKUP_MACHINE } from './backup-state.js';
import { FILE_MACHINE } from './file-state.js';
import { MANAGER_MACHINE } from './manager-state.js';
/** Every machine of the code base (the state-writes check takes its state fields from their states). */
export const MACHINES = [FILE_MACHINE, MANAGER_MACHINE, BACKUP_MACHINE] as const;
