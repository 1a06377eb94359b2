export * from './kube-api-double.js';
export * from './kinds.js';
export { ControlPlane, ENVTEST_ASSETS_VAR, envtestAssets, installCrds, type ControlPlaneOptions, type RawRequestOptions } from './envtest.js';
export * from './cluster/index.js';
export { ChartCluster, NS as CHART_NAMESPACE, clusterSkipReason, type ChartClusterOptions, type ReadyCopy } from './chart-cluster.js';
