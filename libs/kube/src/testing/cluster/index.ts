export { TestCluster, type ClusterNode, type ClusterNodeSpec, type TestClusterOptions } from './test-cluster.js';
export { ClusterNetwork, CLUSTER_NAME_PREFIX, clusterNetworkSupport, sweepStale, LinkShapeUnsupportedError, type LinkShape, type PodNetwork } from './network.js';
