export { BackingImageMetrics, type BackingImageMetricsOptions, type FailureKind, type TransferDirection } from './metrics.js';
export { metricsPlugin, type MetricsPluginOptions } from './plugin.js';
export { ActivityObserver, type ActivityObserverOptions } from './activity-observer.js';
