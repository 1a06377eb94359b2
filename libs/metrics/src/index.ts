export * from './metrics.js';
export * from './plugin.js';
