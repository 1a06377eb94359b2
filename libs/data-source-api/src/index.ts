export { DATA_SOURCE_FILE_PATH, DataSourceAction, type DataSourceFileInfo, type UploadProgress } from './contract.js';
export {
  DataSourceClient,
  DataSourceHttpError,
  DATA_SOURCE_CALL_TIMEOUT_MS,
  parseUploadProgress,
  type DataSourceAnswer,
  type DataSourceClientOptions,
} from './client.js';
