export * from './types.js';
export * from './errors.js';
export * from './format.js';
export * from './checksum.js';
export * from './client.js';
