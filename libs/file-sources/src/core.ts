// The light part of @bis/file-sources (Node built-ins only, no HTTP client): the source contract, checksums,
// errors, qcow2 header checks and the hash worker. For processes that must start fast; the qcow2 conversion
// (qemu-img) is `@bis/file-sources/qemu-img`.
export { type EncryptionOperation, type FileSourceProvider, type ProgressSink, type SourceResult } from './contract.js';
export { ChecksumFormatError, ChecksumMismatchError, StreamHasher, assertChecksumMatches, parseExpectedChecksum, type ExpectedChecksum } from './checksum.js';
export { HashWorker, HashWorkerError } from './hash-worker.js';
export { imageSizeLimit, SizeLimitError, DEFAULT_MAX_IMAGE_SIZE, type SizeLimit, type SizeLimitPolicy } from './size-limit.js';
