export { type WorkloadStatus, type WorkloadRuntime } from './types.js';
export { LocalProcessRuntime } from './local-process-runtime.js';
export { endRecordedProcesses, exitWithParent } from './process-lifecycle.js';
export { startModuleWorker } from './module-worker.js';
