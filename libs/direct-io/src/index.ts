export { alignedBuffer, isAlignedView, DIRECT_IO_ALIGNMENT, type AlignedBufferOptions } from './aligned.js';
export { DirectTarget, directIoSupported, DISABLE_DIRECT_IO_ENV } from './target.js';
export {
  DirectFileWriter,
  type DirectFileWriterOptions,
  type DirectFileWriterStats,
} from './writer.js';
