// The sync service without its HTTP server, client and peer transfer modules (those load on first use): for
// processes that must start fast. The package's main entry exports these too.
export { SyncService, type SyncServiceOptions } from './sync-service.js';
export { SyncFileNotFoundError } from './errors.js';
export { type FileInfo } from './syncing-file.js';
export { removeFileSet } from './chain-path.js';
