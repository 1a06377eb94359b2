export * from './metrics.js';
export * from './plugin.js';
export * from './activity-observer.js';
