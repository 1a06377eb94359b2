export * from './api-double.js';
export * from './flaky-proxy.js';
