export {
  type Extent,
  type FileLayout,
  type ExtentBackend,
  mergeExtents,
  complementExtents,
} from './extent.js';
export {
  type LayoutOptions,
  extentBackend,
  getFileLayout,
  getDataExtents,
  ZERO_SCAN_GRANULARITY,
  ZERO_SCAN_READ_SIZE,
} from './layout.js';
export { punchHole, punchHoleWithFallocateTool, PunchHoleError } from './punch-hole.js';
export { BLOCK_SIZE, type BlockMapping, type IterateBlocksOptions, mapBlocks, iterateBlocks } from './block-map.js';
export { isAllZero } from './zero.js';
export { nativeAddonStatus, DISABLE_NATIVE_ENV, ADDON_PATH_ENV } from './native.js';
export { type SendFileTransfer, sendFileAvailable, sendFileToSocket } from './send-file.js';
