import type { BackingImageResponse } from '@bis/bimrpc';
import { backingImageNameFromPath, type FileInfo } from '@bis/sync-service';

/**
 * Longhorn's `backingImageResponse()`: a sync-service record as the gRPC response. `senderManagerAddress` is the peer
 * manager a file being synced comes from (empty otherwise).
 */
export function toBackingImageResponse(info: FileInfo, senderManagerAddress = ''): BackingImageResponse {
  return {
    spec: {
      name: backingImageNameFromPath(info.filePath, info.uuid),
      uuid: info.uuid,
      size: info.size,
      checksum: info.expectedChecksum,
      virtualSize: info.virtualSize,
      realSize: info.realSize,
    },
    status: {
      state: info.state,
      errorMsg: info.message,
      sendingReference: info.sendingReference,
      senderManagerAddress,
      progress: info.progress,
      checksum: info.currentChecksum,
    },
  };
}
