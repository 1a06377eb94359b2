import { FILE_STATES, MANAGER_STATES, BACKUP_STATES, type FileState } from '@bis/state-machine';

/** API group, version and the combined `apiVersion` of every kind in this library. */
export const LONGHORN_GROUP = 'longhorn.io';
export const LONGHORN_VERSION = 'v1beta2';
export const LONGHORN_API_VERSION = `${LONGHORN_GROUP}/${LONGHORN_VERSION}` as const;

/** `spec.sourceType` of BackingImage and BackingImageDataSource. */
export const BackingImageDataSourceType = {
  Download: 'download',
  Upload: 'upload',
  ExportFromVolume: 'export-from-volume',
  Restore: 'restore',
  Clone: 'clone',
} as const;
export type BackingImageDataSourceType = (typeof BackingImageDataSourceType)[keyof typeof BackingImageDataSourceType];
export const BACKING_IMAGE_DATA_SOURCE_TYPES: readonly BackingImageDataSourceType[] = Object.values(BackingImageDataSourceType);

export const DataEngineType = { V1: 'v1', V2: 'v2' } as const;
export type DataEngineType = (typeof DataEngineType)[keyof typeof DataEngineType];
export const DATA_ENGINE_TYPES: readonly DataEngineType[] = Object.values(DataEngineType);

export const BackupCompressionMethod = { None: 'none', Lz4: 'lz4', Gzip: 'gzip' } as const;
export type BackupCompressionMethod = (typeof BackupCompressionMethod)[keyof typeof BackupCompressionMethod];
export const BACKUP_COMPRESSION_METHODS: readonly BackupCompressionMethod[] = Object.values(BackupCompressionMethod);

/** `export-type` parameter of `export-from-volume`. */
export const ExportType = { Raw: 'raw', Qcow2: 'qcow2' } as const;
export type ExportType = (typeof ExportType)[keyof typeof ExportType];
export const EXPORT_TYPES: readonly ExportType[] = Object.values(ExportType);

/** `encryption` parameter of `clone`. */
export const CloneEncryption = { Encrypt: 'encrypt', Decrypt: 'decrypt', Ignore: 'ignore' } as const;
export type CloneEncryption = (typeof CloneEncryption)[keyof typeof CloneEncryption];
export const CLONE_ENCRYPTIONS: readonly CloneEncryption[] = Object.values(CloneEncryption);

/** Node `spec.disks[*].diskType`. */
export const DiskType = { Filesystem: 'filesystem', Block: 'block' } as const;
export type DiskType = (typeof DiskType)[keyof typeof DiskType];
export const DISK_TYPES: readonly DiskType[] = Object.values(DiskType);

/**
 * A backing-image file state as stored in BI `status.diskFileStatusMap[*].state`, BIDS `status.currentState` and
 * BIM `status.backingImageFileMap[*].state`: a {@link FileState} (`""` for a file nobody has reported yet).
 */
export type BackingImageState = FileState;
export const BACKING_IMAGE_STATES: readonly BackingImageState[] = FILE_STATES;

export { FILE_STATES, MANAGER_STATES, BACKUP_STATES };

/**
 * Keys of `spec.sourceParameters` (BI) / `spec.parameters` and `status.runningParameters` (BIDS).
 */
export const DataSourceParameter = {
  Url: 'url',
  VolumeName: 'volume-name',
  ExportType: 'export-type',
  VolumeSize: 'volume-size',
  SnapshotName: 'snapshot-name',
  SenderAddress: 'sender-address',
  FileSyncHttpClientTimeout: 'file-sync-http-client-timeout',
  BackupUrl: 'backup-url',
  BackupTargetName: 'backup-target-name',
  ConcurrentLimit: 'concurrent-limit',
  BackingImage: 'backing-image',
  BackingImageUuid: 'backing-image-uuid',
  Encryption: 'encryption',
  Secret: 'secret',
  SecretNamespace: 'secret-namespace',
  DataEngine: 'data-engine',
} as const;
export type DataSourceParameter = (typeof DataSourceParameter)[keyof typeof DataSourceParameter];
