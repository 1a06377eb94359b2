export { ManagerService } from './manager-service.js';
export { type BackupRunner } from './backups.js';
export { checkDiskConfig } from './disk-config.js';
