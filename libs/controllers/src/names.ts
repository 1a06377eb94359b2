import { createHash, randomBytes, randomUUID } from 'node:crypto';

/** Finalizer added to BI, BIDS, BIM and BBI (Longhorn's API group). */
export const FINALIZER = 'longhorn.io';

export const Label = {
  ManagedBy: 'longhorn.io/managed-by',
  Component: 'longhorn.io/component',
  DiskUUID: 'longhorn.io/disk-uuid',
  Node: 'longhorn.io/node',
  BackingImage: 'longhorn.io/backing-image',
  LegacyDiskUUID: 'longhorndiskuuid',
  ExportFromVolume: 'longhorn.io/export-from-volume',
  BackingImageDataSource: 'longhorn.io/backing-image-data-source',
  DeleteCustomResourceOnly: 'longhorn.io/delete-custom-resource-only',
  /** BBI labels are unprefixed in Longhorn. */
  BackupTarget: 'backup-target',
  BackupBackingImage: 'backing-image',
} as const;

export const MANAGED_BY = 'longhorn-manager';
export const Component = {
  BackingImage: 'backing-image',
  BackingImageManager: 'backing-image-manager',
  BackingImageDataSource: 'backing-image-data-source',
} as const;

/**
 * Annotations this implementation adds (beyond Longhorn's fields) to carry full `host:port` endpoints, because in
 * standalone mode every workload listens on 127.0.0.1 with its own ports rather than on a pod IP with fixed ports.
 */
export const Annotation = {
  /** BIM: gRPC address of the manager. BIDS: HTTP address of the data source. */
  Address: 'bis.longhorn.io/address',
  /** BIM: address of the sync HTTP server (`/v1/files`, `/v1-ssync/`). */
  SyncAddress: 'bis.longhorn.io/sync-address',
  /**
   * BI: the image's SHA-512 before it was zero-padded to a multiple of 512 bytes (a restore of an unaligned backup),
   * so that a backup recorded with that checksum is still found as a backup of the image.
   */
  UnpaddedChecksum: 'bis.longhorn.io/unpadded-checksum',
  /**
   * BIM: the backing image it was started for while that image's first file was prepared, before any copy was placed
   * on its disk (EXTENSION, docs/controller-manager.md). Such a manager with no image in its spec is deleted when that
   * image no longer needs it.
   */
  PrestartedFor: 'bis.longhorn.io/prestarted-for',
} as const;

/** `bim-` + hex SHA-224 of `"<image>-<diskUUID>"` (Longhorn's GetBackingImageManagerName). */
export function backingImageManagerName(image: string, diskUUID: string): string {
  return 'bim-' + createHash('sha224').update(`${image}-${diskUUID}`.trim()).digest('hex');
}

/** The data-source workload of a BIDS (Longhorn's pod name). */
export function dataSourceWorkloadName(bidsName: string): string {
  return `backing-image-ds-${bidsName}`;
}

/** BI `status.uuid`: the first 8 characters of a random UUIDv4. */
export function newBackingImageUUID(): string {
  return randomUUID().slice(0, 8);
}

/** `<bi>-<8 random hex>` (Longhorn's GetBackupBackingImageNameFromBIName). */
export function backupBackingImageName(biName: string): string {
  return `${biName}-${randomBytes(4).toString('hex')}`;
}

/** Labels of a Replica record, as Longhorn's replicas carry them. */
export function replicaLabels(backingImage: string, diskUUID: string): Record<string, string> {
  return { [Label.BackingImage]: backingImage, [Label.LegacyDiskUUID]: diskUUID };
}

/** RFC 3339 UTC timestamp with second precision, as Go's time.RFC3339 renders it. */
export function rfc3339(d: Date): string {
  return d.toISOString().replace(/\.\d{3}Z$/, 'Z');
}
