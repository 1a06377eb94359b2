export { alignedBuffer, DIRECT_IO_ALIGNMENT } from './aligned.js';
export {
  DirectFileWriter,
  DISABLE_DIRECT_IO_ENV,
  type DirectFileWriterOptions,
  type DirectFileWriterStats,
} from './writer.js';
