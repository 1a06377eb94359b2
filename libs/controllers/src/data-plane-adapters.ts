import { deleteBackup, encodeBackupUrl, inspectBackup, listBackingImageBackups } from '@bis/backupstore';
import type { BackupTargetApi, DataSourceApi, DataSourceFileInfo } from './data-plane.js';

/** Longhorn's data-source client timeout for `GET /v1/file`. */
const DATA_SOURCE_GET_TIMEOUT_MS = 10_000;

/** The data source's HTTP API (`GET /v1/file`) at `host:port`, for any data plane whose data sources speak HTTP. */
export function httpDataSourceClient(address: string): DataSourceApi {
  return {
    async get(): Promise<DataSourceFileInfo> {
      const res = await fetch(`http://${address}/v1/file`, { signal: AbortSignal.timeout(DATA_SOURCE_GET_TIMEOUT_MS) });
      if (!res.ok) throw new Error(`GET http://${address}/v1/file: HTTP ${res.status} ${await res.text()}`);
      const b = (await res.json()) as Partial<DataSourceFileInfo>;
      return {
        state: b.state ?? '',
        size: Number(b.size ?? 0),
        progress: Number(b.progress ?? 0),
        currentChecksum: b.currentChecksum ?? '',
        message: b.message ?? '',
      };
    },
  };
}

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
