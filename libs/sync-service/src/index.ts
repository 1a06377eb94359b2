export {
  backingImagesRoot,
  backingImageDir,
  backingFilePath,
  diskTmpDir,
  dataSourceFilePath,
  tmpPathOf,
  diskConfigPath,
  backingImageNameFromPath,
  DEFAULT_DISK_PATH,
} from './layout.js';
export { readSyncingFileConfig, writeSyncingFileConfig } from './backing-cfg.js';
export { removeFileSet } from './chain-path.js';
export { parsePortRange, PortAllocator } from './port-allocator.js';
export { errorMessage, SyncInvalidArgumentError, SyncFileNotFoundError } from './errors.js';
export { type FileInfo } from './syncing-file.js';
export { type ScrubOptions, SyncService, askHintOf, isSendingLimitRefusal, refusalWithHint, sendingLimitRefusal } from './sync-service.js';
export { startSyncServer } from './server.js';
export { SyncClientError, type SyncDownload, SyncClient } from './sync-client.js';
export { encodeFileId } from './sync-api.js';
export { type FileLayout } from './ssync/layout.js';
export { sendFile } from './ssync/sender.js';
export { SsyncSendError } from './ssync/sender.js';
