export * from './machine.js';
export * from './file-state.js';
export * from './progress.js';
export * from './manager-state.js';
export * from './backup-state.js';
