export * from './contract.js';
export * from './checksum.js';
