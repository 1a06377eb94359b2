import type { Datastore } from '@bis/datastore';
import type { DownloadUrlPolicy } from '@bis/crd-types';
import { SourceHostPolicy } from '@bis/file-sources';
import { Annotation, type SettingName, type StoredBIDS, type StoredBIM } from '@bis/controllers';

/**
 * The download-URL policy of a system whose data sources run with `--allow-source-hosts <allow>`: the same hosts
 * are accepted although loopback, and a URL whose host is an address outside them (private, link-local, metadata,
 * … ranges) is refused at create time rather than when the data source connects.
 */
export function downloadUrlPolicyFor(allow: readonly string[]): DownloadUrlPolicy {
  const hosts = new SourceHostPolicy(allow);
  return {
    allowedHosts: allow.filter((h) => !h.includes('/')).map((h) => h.trim().toLowerCase()),
    refuseHost: (hostname) => hosts.refusal(hostname),
  };
}

/** The part of the settings the resources read (satisfied by `SettingsReader` from `@bis/controllers`). */
export interface SettingsAccess {
  get(name: SettingName): Promise<string>;
  int(name: SettingName): Promise<number>;
}

/** The manager call the download proxy needs (satisfied by `ManagerClient` from `@bis/bimrpc`). */
export interface DownloadPreparer {
  prepareDownload(name: string, uuid: string): Promise<{ srcFilePath: string; address: string }>;
}

/** Where the data-plane workloads listen. */
export interface WorkloadEndpoints {
  /** `host:port` of the data source HTTP server (`/v1/file`) of a BIDS, or undefined while it is not running. */
  dataSourceAddress(bids: StoredBIDS): string | undefined;
  /** `host:port` of the manager gRPC server of a BIM, or undefined while it is not running. */
  managerAddress(bim: StoredBIM): string | undefined;
  /** A client of the manager at `address` (for PrepareDownload). The caller does not close it. */
  managerClient(address: string): DownloadPreparer;
}

/** Counters the proxies increment (satisfied by `BackingImageMetrics` from `@bis/metrics`). */
export interface TransferObserver {
  transferStarted(kind: 'upload' | 'download', backingImage: string): void;
  transferFinished(kind: 'upload' | 'download', backingImage: string, result: 'succeeded' | 'failed' | 'cancelled', bytes: number): void;
}

/** What the backing-image REST resources need from the composition root. */
export interface BackingImageApiDeps {
  store: Datastore;
  /** Namespace of the Longhorn objects (Longhorn: `longhorn-system`). */
  namespace: string;
  settings: SettingsAccess;
  endpoints: WorkloadEndpoints;
  /** Clock (deletion timestamps in the API are rendered from the store; this is used for records the API writes). */
  now?: () => Date;
  /** Policy for `download` URLs (Longhorn always rejects loopback hosts). */
  downloadUrlPolicy?: DownloadUrlPolicy;
  /** Whether a Secret exists (Kubernetes mode). Without it, secret references are not checked for existence. */
  secretExists?: (namespace: string, name: string) => Promise<boolean>;
  /** Transfer counters for `/metrics`. */
  observer?: TransferObserver;
  /** The system's internal token, sent by the upload and download proxies to data sources and sync services. */
  internalToken?: string;
}

/**
 * Endpoints read from the annotations the controllers write on BIDS and BIM objects
 * (`bis.longhorn.io/address`), with the client factory given by the caller.
 */
export function annotationEndpoints(managerClient: (address: string) => DownloadPreparer): WorkloadEndpoints {
  return {
    dataSourceAddress: (bids) => (bids.status?.ip ? bids.metadata.annotations?.[Annotation.Address] || undefined : undefined),
    managerAddress: (bim) => bim.metadata.annotations?.[Annotation.Address] || undefined,
    managerClient,
  };
}
