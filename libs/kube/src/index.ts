export { KubeDatastore } from './kube-datastore.js';
export { podSettingsFromStore, KubeDataPlane } from './kube-data-plane.js';
export { NodeDiskReporter } from './node-disks.js';
export { DEFAULT_MANAGER_POD_SELECTOR, NodeHealthMonitor } from './node-health.js';
export { KubeSecretStore } from './kube-secret-store.js';
export { INTERNAL_TOKEN_SECRET, ensureInternalTokenSecret } from './internal-token-secret.js';
export { LONGHORN_MANAGER_SELECTOR, LonghornDetectedError, assertNoLonghorn, findLonghornManagers, type LonghornInstallation } from './longhorn-detect.js';
export { KubeEventRecorder, type KubeEventRecorderOptions } from './kube-events.js';
