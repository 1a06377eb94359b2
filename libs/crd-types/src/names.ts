import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { posix } from 'node:path';

/** The finalizer the mutators put on BI, BIDS, BIM and BBI (the API group name). */
export const LONGHORN_FINALIZER = 'longhorn.io';

/** Label keys (control plane §1.3–1.7). */
export const LabelKey = {
  ManagedBy: 'longhorn.io/managed-by',
  Component: 'longhorn.io/component',
  DiskUUID: 'longhorn.io/disk-uuid',
  Node: 'longhorn.io/node',
  BackingImageDataSource: 'longhorn.io/backing-image-data-source',
  ExportFromVolume: 'longhorn.io/export-from-volume',
  /** On replicas: the backing image they use. */
  ReplicaBackingImage: 'longhorn.io/backing-image',
  /** On replicas: legacy disk-UUID label (unprefixed). */
  ReplicaLegacyDiskUUID: 'longhorndiskuuid',
  /** On the snapshot made for an export. */
  ForExportingBackingImage: 'longhorn.io/for-exporting-backing-image',
  /** On a BBI: delete the custom resource only, keep the remote backup. */
  DeleteCustomResourceOnly: 'longhorn.io/delete-custom-resource-only',
  /** On a BBI (unprefixed, as in Longhorn). */
  BackupTarget: 'backup-target',
  /** On a BBI (unprefixed, as in Longhorn). */
  BackupBackingImage: 'backing-image',
} as const;

export const MANAGED_BY_LONGHORN_MANAGER = 'longhorn-manager';

export const Component = {
  BackingImage: 'backing-image',
  BackingImageManager: 'backing-image-manager',
  BackingImageDataSource: 'backing-image-data-source',
} as const;
export type Component = (typeof Component)[keyof typeof Component];

/** Labels every CRD file of the chart carries. */
export const CRD_LABELS: Readonly<Record<string, string>> = {
  'app.kubernetes.io/name': 'backing-image-system',
  'longhorn-manager': '',
};

/** The default backup target's name. */
export const DEFAULT_BACKUP_TARGET_NAME = 'default';

/** Labels of a BackingImage (set by the REST API and the create mutator). */
export function backingImageLabels(): Record<string, string> {
  return { [LabelKey.ManagedBy]: MANAGED_BY_LONGHORN_MANAGER, [LabelKey.Component]: Component.BackingImage };
}

/** Labels of a BackingImageManager (and of its pod). */
export function backingImageManagerLabels(nodeID: string, diskUUID: string): Record<string, string> {
  return {
    [LabelKey.ManagedBy]: MANAGED_BY_LONGHORN_MANAGER,
    [LabelKey.Component]: Component.BackingImageManager,
    [LabelKey.DiskUUID]: diskUUID,
    [LabelKey.Node]: nodeID,
  };
}

/** Labels of the data-source pod of BIDS `bidsName`. */
export function backingImageDataSourcePodLabels(bidsName: string, nodeID: string, diskUUID: string): Record<string, string> {
  return {
    [LabelKey.ManagedBy]: MANAGED_BY_LONGHORN_MANAGER,
    [LabelKey.Component]: Component.BackingImageDataSource,
    [LabelKey.BackingImageDataSource]: bidsName,
    [LabelKey.DiskUUID]: diskUUID,
    [LabelKey.Node]: nodeID,
  };
}

/** The two unprefixed labels of a BackupBackingImage. */
export function backupBackingImageLabels(backupTargetName: string, backingImageName: string): Record<string, string> {
  return { [LabelKey.BackupTarget]: backupTargetName, [LabelKey.BackupBackingImage]: backingImageName };
}

/** Label selector of the replicas that use backing image `biName` on disk `diskUUID`. */
export function replicaBackingImageSelector(biName: string, diskUUID: string): Record<string, string> {
  return { [LabelKey.ReplicaBackingImage]: biName, [LabelKey.ReplicaLegacyDiskUUID]: diskUUID };
}

/** `bim-` + hex SHA-224 of the trimmed `"<image>-<diskUUID>"`: one manager per (image, disk). */
export function backingImageManagerName(image: string, diskUUID: string): string {
  const digest = createHash('sha224').update(`${image}-${diskUUID}`.trim()).digest('hex');
  return `bim-${digest}`;
}

/** The BIM pod has the BIM's name. */
export function backingImageManagerPodName(bimName: string): string {
  return bimName;
}

/** The BIDS has the name of its BackingImage. */
export function backingImageDataSourceName(biName: string): string {
  return biName;
}

/** `backing-image-ds-<biName>`. */
export function backingImageDataSourcePodName(biName: string): string {
  return `backing-image-ds-${biName}`;
}

/** Eight lowercase hex characters from a cryptographic source. */
export function randomHex8(): string {
  return randomBytes(4).toString('hex');
}

/** `<biName>-<8 random hex>`: each backup target gets its own BBI for the same image. */
export function backupBackingImageName(biName: string, random: () => string = randomHex8): string {
  return `${biName}-${random()}`;
}

/** `status.uuid` of a new BackingImage: the first 8 characters of a random UUIDv4. */
export function generateBackingImageUUID(): string {
  return randomUUID().slice(0, 8);
}

/** The name of the snapshot taken to export volume data into BIDS `bidsName`. */
export function exportSnapshotName(bidsName: string, random: () => string = randomHex8): string {
  return `${bidsName}-${random()}`;
}

/** Volume attachment ticket id used while exporting into BIDS `bidsName`. */
export function exportAttachmentTicketId(bidsName: string): string {
  return `bim-ds-controller-${bidsName}`;
}

/** Longest BackingImage name the create mutator lets through unchanged. */
export const BACKING_IMAGE_NAME_MAX_LENGTH = 40;

/**
 * The create mutator's name correction: lower-case, and if longer than `maxLength`, cut and suffixed with `-` and
 * the first 8 hex characters of the SHA-512 of the original name (trailing dashes of the cut part are dropped).
 */
export function autoCorrectName(name: string, maxLength: number = BACKING_IMAGE_NAME_MAX_LENGTH): string {
  let corrected = name.toLowerCase();
  if (name.length > maxLength) {
    const suffix = '-' + createHash('sha512').update(name).digest('hex').slice(0, 8);
    corrected = corrected.slice(0, maxLength - suffix.length).replace(/-+$/, '') + suffix;
  }
  return corrected;
}

/** `<name>-<uuid>`: the directory of a backing image file on a disk. */
export function backingImageDirectoryName(biName: string, biUUID: string): string {
  return `${biName}-${biUUID}`;
}

/** `<diskPath>/backing-images/<name>-<uuid>`. */
export function backingImageDirectoryPath(diskPath: string, biName: string, biUUID: string): string {
  return posix.join(diskPath, 'backing-images', backingImageDirectoryName(biName, biUUID));
}

/** `<diskPath>/backing-images/<name>-<uuid>/backing`. */
export function backingImageFilePath(diskPath: string, biName: string, biUUID: string): string {
  return posix.join(backingImageDirectoryPath(diskPath, biName, biUUID), 'backing');
}

/** `<diskPath>/backing-images/<name>-<uuid>/backing.cfg`. */
export function backingImageConfigPath(diskPath: string, biName: string, biUUID: string): string {
  return posix.join(backingImageDirectoryPath(diskPath, biName, biUUID), 'backing.cfg');
}

/** `<diskPath>/tmp/<name>-<uuid>`: where the data source produces the first file. */
export function dataSourceTempFilePath(diskPath: string, biName: string, biUUID: string): string {
  return posix.join(diskPath, 'tmp', backingImageDirectoryName(biName, biUUID));
}

/** `/host<diskPath>/backing-images/<name>-<uuid>/backing`: the path a replica opens. */
export function replicaBackingImagePath(diskPath: string, biName: string, biUUID: string): string {
  return posix.join('/host', backingImageFilePath(diskPath, biName, biUUID));
}
