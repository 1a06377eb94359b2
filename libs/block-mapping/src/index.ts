export { type Extent } from './extent.js';
export { extentBackend, getFileLayout, getDataExtents } from './layout.js';
export { punchHole } from './punch-hole.js';
export { type BlockMapping, mapBlocks } from './block-map.js';
export { isAllZero } from './zero.js';
export { type SendFileTransfer, sendFileAvailable, sendFileToSocket } from './send-file.js';
