export {
  BackingImageSpec,
  BackingImageResponse,
  DeleteRequest,
  GetRequest,
  ListResponse,
  VersionResponse,
  SyncRequest,
  SendRequest,
  FetchRequest,
  PrepareDownloadRequest,
  PrepareDownloadResponse,
  BackupCreateRequest,
  BackupStatusRequest,
  BackupStatusResponse,
  BackingImageManagerServiceService,
  type BackingImageManagerServiceServer,
} from './gen/bimrpc.js';
export { Empty } from './gen/google/protobuf/empty.js';
export {
  isManagerApiCompatible,
  withInternalAuth,
  isGrpcStatus,
  grpcError,
  MANAGER_API_VERSION,
  MANAGER_API_MIN_VERSION,
  ManagerClient,
  type SyncInput,
} from './client.js';
