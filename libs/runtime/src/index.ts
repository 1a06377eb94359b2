export { type WorkloadStatus, type WorkloadRuntime } from './types.js';
export { LocalProcessRuntime } from './local-process-runtime.js';
export { endRecordedProcesses, exitWithParent } from './process-lifecycle.js';
export { startModuleWorker } from './module-worker.js';
export { RotatingLogFile, type RotatingLogOptions } from './rotating-log.js';
export { WatchHub } from './watch-hub.js';
export { matchesLabels, WorkloadExistsError, WorkloadNotFoundError, type WorkloadEvent, type WorkloadSpec } from './types.js';
export { Semaphore } from './semaphore.js';
