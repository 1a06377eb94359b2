export * from './kube-api-double.js';
export * from './kinds.js';
