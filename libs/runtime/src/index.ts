export * from './types.js';
export { RotatingLogFile, type RotatingLogOptions } from './rotating-log.js';
export { LocalProcessRuntime, type LocalProcessRuntimeOptions } from './local-process-runtime.js';
export {
  LIVENESS_FD_ENV,
  endRecordedProcesses,
  exitWithParent,
  isProcessRunning,
  procStat,
  readProcessRecords,
  type EndRecordedProcessesOptions,
  type EndedProcess,
  type ExitWithParentOptions,
  type ProcessRecord,
  type ProcStat,
} from './process-lifecycle.js';
export { startModuleWorker } from './module-worker.js';
