// The light part of @bis/file-sources (Node built-ins only, no HTTP client): the source contract, checksums,
// errors, qcow2 header checks, the hash worker and the external tools. For processes that must start fast.
export * from './contract.js';
export * from './checksum.js';
export * from './errors.js';
export * from './qcow2.js';
export { convertRawToQcow2, type Qcow2ConversionRequest } from './qemu-img.js';
export { runTool, type ToolRun } from './tool-process.js';
export { HashWorker, HashWorkerError } from './hash-worker.js';
