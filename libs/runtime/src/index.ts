export * from './types.js';
export { RotatingLogFile, type RotatingLogOptions } from './rotating-log.js';
export { LocalProcessRuntime, type LocalProcessRuntimeOptions } from './local-process-runtime.js';
