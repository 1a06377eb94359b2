// The sync service without its HTTP server, client and peer transfer modules (those load on first use): for
// processes that must start fast. The package's main entry exports all of this too.
export * from './sync-service.js';
export * from './errors.js';
export * from './layout.js';
export * from './syncing-file.js';
