export { SourceHostPolicy } from './ip-policy.js';
export { type SizeLimitPolicy } from './size-limit.js';
export { type RestoreBackupFn } from './sources.js';
export { createFileSources } from './provider.js';
export { type RestoreRequest } from './contract.js';
