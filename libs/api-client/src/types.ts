/**
 * Resource shapes of the backing-image REST API (Longhorn's cattle-style `/v1`, §2.3 of the control-plane
 * reference). Every resource carries the cattle envelope: `id`, `type`, `links.self` and `actions`.
 */

export interface ResourceEnvelope {
  id: string;
  type: string;
  links: Record<string, string>;
  actions: Record<string, string>;
}

export interface Collection<T> {
  type: 'collection';
  resourceType: string;
  links: Record<string, string>;
  data: T[];
}

/** `BackingImageState` (disk-file, data-source and manager file-map states); `""` for a new file. */
export type BackingImageState =
  | ''
  | 'pending'
  | 'starting'
  | 'ready-for-transfer'
  | 'ready'
  | 'in-progress'
  | 'failed'
  | 'failed-and-cleanup'
  | 'unknown';

export const SOURCE_TYPES = ['download', 'upload', 'clone', 'restore', 'export-from-volume'] as const;
export type SourceType = (typeof SOURCE_TYPES)[number];

export type DataEngine = 'v1' | 'v2';

export interface DiskFileStatus {
  dataEngine?: string;
  state: BackingImageState | string;
  progress: number;
  message: string;
  lastStateTransitionTime: string;
  /** Failed attempts since the last success (absent when none). */
  retryCount?: number;
  /** RFC 3339 time of the next attempt of a failed copy (absent when none is planned). */
  nextRetryAt?: string;
}

/** An event the controllers recorded (`GET /v1/events`). */
export interface BisEvent extends ResourceEnvelope {
  type: 'event';
  name: string;
  eventType: 'Normal' | 'Warning';
  reason: string;
  message: string;
  source: string;
  count: number;
  firstTimestamp: string;
  lastTimestamp: string;
  involvedObjectKind: string;
  involvedObjectName: string;
}

export interface BackingImage extends ResourceEnvelope {
  type: 'backingImage';
  name: string;
  uuid: string;
  sourceType: SourceType | string;
  parameters: Record<string, string> | null;
  diskSelector: string[] | null;
  nodeSelector: string[] | null;
  minNumberOfCopies: number;
  expectedChecksum: string;
  dataEngine: string;
  /** Disk UUID → file status. Always an object. */
  diskFileStatusMap: Record<string, DiskFileStatus>;
  size: number;
  virtualSize: number;
  currentChecksum: string;
  secret: string;
  secretNamespace: string;
  /** `""` when not being deleted. */
  deletionTimestamp: string;
  /**
   * Conditions of the image (not in Longhorn's API; absent from older servers). `MinCopiesSatisfiable` is `False`
   * when `minNumberOfCopies` exceeds the disks that the selectors allow.
   */
  conditions?: Condition[] | null;
}

/** A status condition as the API renders it. */
export interface Condition {
  type: string;
  status: 'True' | 'False' | 'Unknown' | string;
  reason?: string;
  message?: string;
  lastTransitionTime?: string;
}

/** `BackupState` of a backup backing image. */
export type BackupState = '' | 'Pending' | 'InProgress' | 'Completed' | 'Error' | 'Unknown';

export interface BackupBackingImage extends ResourceEnvelope {
  type: 'backupBackingImage';
  name: string;
  state: BackupState | string;
  progress: number;
  error: string;
  url: string;
  /** When the backup was taken (status.backupCreatedAt). */
  created: string;
  size: number;
  labels: Record<string, string> | null;
  messages: Record<string, string> | null;
  compressionMethod: string;
  secret: string;
  secretNamespace: string;
  backingImageName: string;
  backupTargetName: string;
}

export interface BackupTarget extends ResourceEnvelope {
  name: string;
  backupTargetURL: string;
  credentialSecret?: string;
  pollInterval?: string;
  available: boolean;
  message?: string;
  default?: boolean;
}

/** The updatable fields of a backup target (`PUT /v1/backuptargets/<name>`); omitted fields are kept. */
export interface BackupTargetUpdate {
  backupTargetURL?: string;
  credentialSecret?: string;
  /** A Go duration, e.g. `5m0s`; `0` stops polling. */
  pollInterval?: string;
}

/** A credential secret of the standalone system: its name and the names of its keys, never a value. */
export interface SecretInfo extends ResourceEnvelope {
  name: string;
  keys: string[];
}

export interface NodeDisk {
  path: string;
  diskUUID: string;
  diskType?: string;
  allowScheduling: boolean;
  evictionRequested: boolean;
  storageAvailable?: number;
  storageMaximum?: number;
  storageReserved?: number;
  storageScheduled?: number;
  tags: string[] | null;
  conditions?: unknown;
  /** The disk's last background scrub (our extension; null before its manager reported one). */
  scrub?: DiskScrub | null;
}

/** A disk's last background re-verification of its copies against their SHA-512 chains. */
export interface DiskScrub {
  /** RFC 3339 time the last pass ended; empty before the first. */
  lastScrubTime: string;
  /** ok, corrupted, error, or empty before the first pass. */
  lastScrubResult: string;
  lastScrubMessage: string;
  lastScrubFiles: number;
  /** The copy being scrubbed now (empty when idle). */
  scrubbing: string;
}

export interface Node extends ResourceEnvelope {
  name: string;
  address?: string;
  allowScheduling: boolean;
  evictionRequested: boolean;
  tags: string[] | null;
  disks: Record<string, NodeDisk>;
  conditions?: unknown;
}

export interface Setting extends ResourceEnvelope {
  name: string;
  value: string;
  definition?: Record<string, unknown>;
}

export interface CreateBackingImageRequest {
  name: string;
  sourceType: SourceType;
  parameters: Record<string, string>;
  expectedChecksum?: string;
  minNumberOfCopies?: number;
  nodeSelector?: string[];
  diskSelector?: string[];
  secret?: string;
  secretNamespace?: string;
  dataEngine?: DataEngine;
}

export interface RestoreBackupRequest {
  secret?: string;
  secretNamespace?: string;
  dataEngine?: DataEngine;
}

/** The cattle error body. */
export interface ApiErrorBody {
  type: 'error';
  status: number;
  code: string;
  message: string;
  detail?: string;
}
