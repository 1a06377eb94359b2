export * from './types.js';
export * from './errors.js';
export * from './datastore.js';
export { compileSelector, parseLabelSelector, isValidLabelKey, isValidLabelValue, LabelSelectorError, type CompiledSelector } from './label-selector.js';
export { EmbeddedDatastore, type EmbeddedDatastoreOptions } from './embedded/embedded-store.js';
export { StoreLogCorruptError } from './embedded/log-file.js';
export { WorkQueue, ItemExponentialRateLimiter, type RateLimiterOptions } from './workqueue.js';
export { Informer, SharedInformers, objectKey, splitKey, sleep, type InformerHandler, type InformerOptions, type SharedInformerEventType, type SharedInformerHandler, type SharedInformersOptions } from './informer.js';
export { Controller, type ControllerOptions, type ReconcileResult, type ControllerLogger } from './controller.js';
