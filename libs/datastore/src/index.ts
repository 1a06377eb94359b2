export {
  defineKind,
  groupOf,
  type ObjectMeta,
  type KubeObject,
  type Stored,
  type ResourceKind,
  type WatchEvent,
  type LabelSelector,
  type ListOptions,
  type ListResult,
  type WatchOptions,
  type DeleteOptions,
  FOREGROUND_FINALIZER,
} from './types.js';
export {
  type StatusReason,
  StatusError,
  NotFoundError,
  AlreadyExistsError,
  ConflictError,
  GoneError,
  InvalidError,
  isNotFound,
  isAlreadyExists,
  isConflict,
} from './errors.js';
export { type CreateOptions, type Datastore, type SharedReads, sharedReadsOf, getForReading, updateForReading, updateStatusForReading } from './datastore.js';
export { EmbeddedDatastore } from './embedded/embedded-store.js';
export { WorkQueue, type RateLimiterOptions, type WorkQueueMetrics } from './workqueue.js';
export {
  retryDelay,
  seededRandom,
  PermanentError,
  isPermanentError,
  formatRetryDelay,
  type RetryBounds,
  type RandomSource,
} from './retry.js';
export { SharedInformers } from './informer.js';
export { cloneObject, sameValue } from './json-value.js';
export { shareValue } from './json-patch.js';
export { Controller, type ControllerMetrics } from './controller.js';
