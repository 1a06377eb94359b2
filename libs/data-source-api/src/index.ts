export { DATA_SOURCE_FILE_PATH, DATA_SOURCE_MAX_WAIT_SECONDS, DATA_SOURCE_WAITS_HEADER, DataSourceAction, type DataSourceFileInfo, type UploadProgress } from './contract.js';
export {
  DataSourceClient,
  DataSourceHttpError,
  DATA_SOURCE_CALL_TIMEOUT_MS,
  parseUploadProgress,
  type DataSourceAnswer,
  type DataSourceClientOptions,
} from './client.js';
