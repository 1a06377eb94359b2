export * from './layout.js';
export * from './go-time.js';
export * from './backing-cfg.js';
export * from './port-allocator.js';
export * from './errors.js';
export * from './file-util.js';
export * from './syncing-file.js';
export * from './sync-service.js';
export * from './routes.js';
export * from './server.js';
export * from './sync-client.js';
export * from './sync-api.js';
export * from './ssync/layout.js';
export * from './ssync/interval-set.js';
export * from './ssync/receiver.js';
export * from './ssync/sender.js';
export * from './chain-file.js';
export {
  TokenBucket,
  CorruptionError,
  ChainVerifyingStream,
  ChecksumVerifyingStream,
  verifyFileThrottled,
  hashFileThrottled,
  segmentMismatchText,
  systemClock,
  type ScrubClock,
  type ThrottledVerifyOptions,
} from './integrity.js';
