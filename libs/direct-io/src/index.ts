export { alignedBuffer, isAlignedView, DIRECT_IO_ALIGNMENT, type AlignedBufferOptions } from './aligned.js';
export {
  DirectFileWriter,
  DISABLE_DIRECT_IO_ENV,
  type DirectFileWriterOptions,
  type DirectFileWriterStats,
} from './writer.js';
