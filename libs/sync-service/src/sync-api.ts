import { SyncServiceError } from './errors.js';

/**
 * The sync service's HTTP API (Longhorn's `backing-image-manager/pkg/sync` server and its `pkg/client`): the one
 * definition of its paths and actions, shared by the routes (`routes.ts`) and the one client (`SyncClient`). The
 * answers are `FileInfo` (`syncing-file.ts`).
 */

/** The collection of files: `GET` lists them, `POST ?action=` starts a file (one of {@link SyncFilesAction}). */
export const SYNC_FILES_PATH = '/v1/files';

/** `POST /v1/files?action=`: how a new file gets its bytes. */
export const SyncFilesAction = {
  Fetch: 'fetch',
  DownloadFromURL: 'downloadFromURL',
  ReceiveFromPeer: 'receiveFromPeer',
  RestoreFromBackupURL: 'restoreFromBackupURL',
  CloneFromBackingImage: 'cloneFromBackingImage',
  Upload: 'upload',
} as const;

/** `POST /v1/files/{id}?action=`: what happens to an existing file. */
export const SyncFileAction = {
  Forget: 'forget',
  SendToPeer: 'sendToPeer',
} as const;

/** Decodes a `/v1/files/{id}` segment like Go's `url.QueryUnescape` (`+` is a space; `%2F` a slash). */
export function decodeFileId(segment: string): string {
  try {
    return decodeURIComponent(segment.replace(/\+/g, ' '));
  } catch {
    throw new SyncServiceError(`invalid file id ${segment}`, 400);
  }
}

/** Encodes a file path as one URL segment like Go's `url.QueryEscape`. */
export function encodeFileId(filePath: string): string {
  return encodeURIComponent(filePath).replace(/%20/g, '+');
}

/** `/v1/files/{id}`: one file (`GET` its info, `DELETE` it, `POST ?action=` one of {@link SyncFileAction}). */
export function syncFilePath(filePath: string): string {
  return `${SYNC_FILES_PATH}/${encodeFileId(filePath)}`;
}

/** `/v1/files/{id}/download`: the file's bytes (gzip-compressed, or raw with `?forV2Creation=true`). */
export function syncFileDownloadPath(filePath: string): string {
  return `${syncFilePath(filePath)}/download`;
}
