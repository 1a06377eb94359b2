export * from '../testing/kube-api-double.js';
