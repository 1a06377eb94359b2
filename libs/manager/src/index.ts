export * from './manager-service.js';
export * from './convert.js';
export * from './backups.js';
export * from './disk-config.js';
