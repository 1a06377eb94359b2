/**
 * How the controllers reach the data-plane workloads. The controllers never know whether a workload is a local
 * process or a pod: they ask the DataPlane to start, observe and stop workloads, and get typed clients for the
 * manager's gRPC API and the data source's HTTP API.
 */
import type { BackingImageResponse, BackupCreateRequest, BackupStatusResponse, FetchRequest, ListResponse, PrepareDownloadResponse, SyncInput, VersionResponse } from '@bis/bimrpc';
import type { DataSourceFileInfo } from '@bis/data-source-api';
import type { FileState } from '@bis/state-machine';
import type { BackingImageDataSource, BackingImageManager } from './kinds.js';

/** Observed phase of a workload (Longhorn's pod phase + readiness, reduced). */
export type WorkloadPhase = 'missing' | 'pending' | 'ready' | 'not-ready' | 'failed' | 'deleting';

export interface WorkloadStatus {
  phase: WorkloadPhase;
  /** Node the workload runs on. */
  nodeID: string;
  /** The disk it was started for. */
  diskUUID: string;
  /** Host (IP) of the workload (Longhorn's pod IP / storage IP). */
  ip: string;
  /** Full `host:port` of the main API: the manager's gRPC or the data source's HTTP server. */
  address: string;
  /** Full `host:port` of the sync HTTP server. */
  syncAddress: string;
  /** For a failed workload: why (exit code, last log lines). */
  message?: string;
}

/** The manager gRPC calls the controllers use (satisfied by `ManagerClient` from `@bis/bimrpc`). */
export interface ManagerApi {
  list(): Promise<ListResponse>;
  delete(name: string, uuid: string): Promise<void>;
  versionGet(): Promise<VersionResponse>;
  fetch(req: FetchRequest): Promise<BackingImageResponse>;
  sync(req: SyncInput): Promise<BackingImageResponse>;
  prepareDownload(name: string, uuid: string): Promise<PrepareDownloadResponse>;
  backupCreate(req: BackupCreateRequest): Promise<void>;
  backupStatus(name: string): Promise<BackupStatusResponse>;
  /** Change notifications; the callback gets an error when the stream ends abnormally. Returns a cancel function. */
  watch(onChange: () => void, onEnd: (err?: Error) => void): () => void;
}

/** The data source's HTTP API calls the controllers use (satisfied by `DataSourceClient` from `@bis/data-source-api`). */
export interface DataSourceApi {
  get(): Promise<DataSourceFileInfo>;
  /**
   * The file once its state is not `state`, or after `waitSeconds` with it unchanged; undefined when the data source
   * does not wait (the caller polls it instead). Optional: without it the controller polls.
   */
  waitForChange?(state: FileState, opts: { waitSeconds: number; signal?: AbortSignal }): Promise<DataSourceFileInfo | undefined>;
}

/**
 * The environment variable that carries a data source's credential (a JSON object of strings) to its process. Longhorn
 * passes `--credential k=v` flags; here they never reach a command line, which any local user can read with `ps`.
 * The data source (`backing-image-data-source`) reads the same name.
 */
export const DATA_SOURCE_CREDENTIAL_ENV = 'BACKING_IMAGE_DATA_SOURCE_CREDENTIAL';

/**
 * glibc malloc settings every data-source process gets (standalone processes and Kubernetes pods alike). A download
 * receives the image in 64 KiB reads, each into a fresh buffer; with glibc's defaults the heap is trimmed and grown
 * again all the time, and the page faults that follow cost system time on the cores that the SHA-512 needs. With
 * these, freed memory stays in the process (peak RSS unchanged at 137–144 MiB for a 2 GiB download). Measured in
 * docs/benchmarks.md (data-source).
 */
export const DATA_SOURCE_MALLOC_ENV: Readonly<Record<string, string>> = {
  MALLOC_TRIM_THRESHOLD_: String(256 << 20),
  MALLOC_TOP_PAD_: String(64 << 20),
  MALLOC_MMAP_THRESHOLD_: String(256 << 20),
};

/** What the data source must be started with (Longhorn's BIDS pod command line; `credentials` go by environment). */
export interface DataSourceLaunch {
  name: string;
  uuid: string;
  sourceType: string;
  diskPath: string;
  parameters: Record<string, string>;
  checksum: string;
  credentials: Record<string, string>;
  /** The `backing-image-max-size` setting: largest image the data source stores or accepts (bytes). */
  maxImageSize: number;
  /** Bytes of the destination disk kept free (its `storageReserved`): the image may not eat into them. */
  storageReserved: number;
}

/** Remote backup-target operations (Longhorn runs these through its engine binary). */
export interface BackupTargetApi {
  /** Names of the backing images that have a backup in the target. */
  listBackingImages(targetURL: string, credential: Record<string, string>): Promise<string[]>;
  /** The backup's URL for an image name in a target. */
  backingImageURL(targetURL: string, biName: string): string;
  inspectBackingImage(backupURL: string, credential: Record<string, string>): Promise<{
    name: string;
    url: string;
    size: number;
    checksum: string;
    labels: Record<string, string>;
    compressionMethod: string;
    secret: string;
    secretNamespace: string;
    createdAt: string;
  }>;
  deleteBackingImage(backupURL: string, credential: Record<string, string>): Promise<void>;
}

/** Settings a manager takes at its start (daemon flags `--scrub-interval`, `--scrub-bandwidth`). */
export interface ManagerLaunch {
  /** `backing-image-scrub-interval`: seconds between two scrubs of each ready copy; 0 = off. */
  scrubIntervalSeconds: number;
  /** `backing-image-scrub-bandwidth`: bytes per second the scrub reads on the disk. */
  scrubBandwidth: number;
}

/** The manager daemon's flags for a launch. */
export function managerLaunchArgs(launch: ManagerLaunch | undefined): string[] {
  if (!launch) return [];
  return ['--scrub-interval', String(launch.scrubIntervalSeconds), '--scrub-bandwidth', String(launch.scrubBandwidth)];
}

export interface DataPlane {
  /** Observes the manager workload of a BIM. */
  managerStatus(bim: BackingImageManager): Promise<WorkloadStatus>;
  /** Starts the manager workload of a BIM (no-op when it exists), with the settings it takes at start. */
  startManager(bim: BackingImageManager, launch?: ManagerLaunch): Promise<void>;
  /** Stops and removes the manager workload of a BIM (no-op when missing). */
  deleteManager(bimName: string): Promise<void>;
  managerClient(address: string): ManagerApi;

  dataSourceStatus(bids: BackingImageDataSource): Promise<WorkloadStatus>;
  /**
   * Starts the data-source workload of a BIDS (no-op when it exists). Answers `deferred` when the data plane has no
   * capacity for one more right now (the controller tries again later without counting a retry).
   */
  startDataSource(bids: BackingImageDataSource, launch: DataSourceLaunch): Promise<'started' | 'deferred'>;
  deleteDataSource(bidsName: string): Promise<void>;
  /**
   * Removes what a data source left on its disk (`<disk>/tmp/<name>-<uuid>` and its companions) when its first file
   * will never be fetched (its image is being deleted), after its workload is gone. Optional: a data plane that cannot
   * reach the disk relies on the disk's manager (its Delete removes the same files).
   */
  discardDataSourceFiles?(bids: BackingImageDataSource): Promise<void>;
  dataSourceClient(address: string): DataSourceApi;

  backupTarget: BackupTargetApi;

  /** Called with (kind, name) whenever a workload changes phase, so its owner can be reconciled at once. */
  onWorkloadChange(listener: (kind: 'manager' | 'data-source', name: string) => void): () => void;
}
