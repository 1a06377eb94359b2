export * from './api-access.js';
export * from './status-errors.js';
export * from './kube-datastore.js';
export * from './pod-manifests.js';
export * from './pod-runtime.js';
