import type { FileState } from '@bis/state-machine';

/**
 * The data source's HTTP API (Longhorn's `backing-image-manager/pkg/datasource` server and its `pkg/client`):
 * the one definition of its path, actions and answers, shared by the server (`@bis/data-source`) and the client.
 */

/** The only resource of a data source: its file. */
export const DATA_SOURCE_FILE_PATH = '/v1/file';

/** The `action` query parameter of `/v1/file`. */
export const DataSourceAction = {
  /** `POST`: the whole upload in one request (`size=`; multipart part `chunk` or an octet-stream body). */
  Upload: 'upload',
  /** `POST`: one part of a resumable upload (`size=`, `offset=`; octet-stream body); answers {@link UploadProgress}. */
  UploadPart: 'uploadPart',
  /** `GET`: where a resumable upload continues; answers {@link UploadProgress}. */
  UploadOffset: 'uploadOffset',
  /** `POST`: a manager takes the finished file over. */
  Transfer: 'transfer',
} as const;
export type DataSourceAction = (typeof DataSourceAction)[keyof typeof DataSourceAction];

/**
 * Our extension of `GET /v1/file`: with `waitWhile=<state>&wait=<seconds>` the data source answers once its file's
 * state is not `<state>` (at once when it is not), or after `<seconds>` (at most {@link DATA_SOURCE_MAX_WAIT_SECONDS})
 * with the state unchanged. A data source that waits says so in this header of its answer; Longhorn's data source
 * ignores the parameters and answers at once, without it.
 */
export const DATA_SOURCE_WAITS_HEADER = 'x-bis-waits';
/** Longest wait of one `GET /v1/file?waitWhile=…&wait=…`. */
export const DATA_SOURCE_MAX_WAIT_SECONDS = 30;

/** `GET /v1/file`: Longhorn's `api.DataSourceInfo` (JSON key order as Go emits it). */
export interface DataSourceFileInfo {
  sourceType: string;
  parameters: Record<string, string>;
  name: string;
  diskUUID: string;
  expectedChecksum: string;
  filePath: string;
  uuid: string;
  size: number;
  virtualSize: number;
  realSize: number;
  state: FileState;
  progress: number;
  processedSize: number;
  modificationTime: string;
  currentChecksum: string;
  message: string;
  sendingReference: number;
  /** Our extension, only on a file zero-padded to a multiple of 512: its size and SHA-512 before the padding. */
  unpaddedSize?: number;
  unpaddedChecksum?: string;
}

/** The answer of `uploadOffset` and `uploadPart`: the declared size and the bytes accepted so far. */
export interface UploadProgress {
  size: number;
  offset: number;
}
