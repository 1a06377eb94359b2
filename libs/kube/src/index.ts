export * from './api-access.js';
export * from './status-errors.js';
export * from './kube-datastore.js';
export * from './pod-manifests.js';
export * from './pod-runtime.js';
export * from './chart/go-template.js';
export * from './chart/render-chart.js';
export * from './chart/rbac-template.js';
