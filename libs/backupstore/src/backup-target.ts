import { deleteBackup, inspectBackup, listBackingImageBackups } from './engine/maintenance.js';
import { encodeBackupUrl } from './url.js';

/** A backing image's backup as the control plane shows it (BackupBackingImage status). */
export interface BackupTargetEntry {
  name: string;
  url: string;
  size: number;
  checksum: string;
  labels: Record<string, string>;
  compressionMethod: string;
  secret: string;
  secretNamespace: string;
  createdAt: string;
}

/**
 * The backup-target operations the control plane runs (Longhorn runs these through its engine binary with the
 * credential in the process environment): done in-process, with the target's credential passed per call. The
 * composition roots give it to their data plane (the controllers' `BackupTargetApi`).
 */
export const backupTargetOperations = {
  /** Names of the backing images that have a complete backup in the target. */
  async listBackingImages(targetURL: string, credential: Record<string, string>): Promise<string[]> {
    return (await listBackingImageBackups(targetURL, { credential })).filter((e) => e.state === 'complete').map((e) => e.name);
  },
  /** The backup's URL for an image name in a target. */
  backingImageURL: (targetURL: string, biName: string): string => encodeBackupUrl(biName, targetURL),
  async inspectBackingImage(url: string, credential: Record<string, string>): Promise<BackupTargetEntry> {
    const i = await inspectBackup(url, { credential });
    return {
      name: i.name,
      url: i.url,
      size: i.size,
      checksum: i.checksum,
      labels: i.labels ?? {},
      compressionMethod: i.compressionMethod,
      secret: i.secret,
      secretNamespace: i.secretNamespace,
      createdAt: i.completeAt,
    };
  },
  async deleteBackingImage(url: string, credential: Record<string, string>): Promise<void> {
    await deleteBackup(url, { credential });
  },
};
