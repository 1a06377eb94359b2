import { deleteBackup, encodeBackupUrl, inspectBackup, listBackingImageBackups } from '@bis/backupstore';
import type { BackupTargetApi } from './data-plane.js';

/**
 * Backup-target operations done in-process by the backup engine (`@bis/backupstore`), with the target's credential
 * passed per call (Longhorn runs them through its engine binary with the credential in the process environment).
 */
export const backupstoreTargetApi: BackupTargetApi = {
  async listBackingImages(targetURL, credential) {
    return (await listBackingImageBackups(targetURL, { credential })).filter((e) => e.state === 'complete').map((e) => e.name);
  },
  backingImageURL: (targetURL, biName) => encodeBackupUrl(biName, targetURL),
  async inspectBackingImage(url, credential) {
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
  async deleteBackingImage(url, credential) {
    await deleteBackup(url, { credential });
  },
};
