import { BackupStoreError } from '../names.js';
import { parseTargetUrl } from '../url.js';
import type { BackupCredential, BackupStoreDriver } from './driver.js';
import { FileSystemDriver } from './filesystem.js';
import { DEFAULT_MOUNT_ROOT, ensureNfsMounted } from './nfs.js';
import type { S3DriverOptions } from './s3.js';

export type { BackupCredential, BackupStoreDriver } from './driver.js';
export { FileSystemDriver } from './filesystem.js';
// The S3 driver (and the AWS SDK behind it) is loaded only when an s3:// target is opened.
export type { S3DriverOptions } from './s3.js';
export { DEFAULT_MOUNT_ROOT, ensureNfsMounted, nfsMountPoint } from './nfs.js';

export interface DriverOptions {
  s3?: S3DriverOptions;
  /** Where nfs:// targets are mounted. Default Longhorn's `/var/lib/longhorn-backupstore-mounts`. */
  mountRoot?: string;
}

/** Opens the driver for a target URL (`s3://`, `nfs://`, `vfs://`). */
export async function openDriver(
  targetUrl: string,
  credential: BackupCredential = {},
  options: DriverOptions = {},
): Promise<BackupStoreDriver> {
  const location = parseTargetUrl(targetUrl);
  switch (location.scheme) {
    case 's3': {
      const { S3Driver } = await import('./s3.js');
      return new S3Driver(location, credential, options.s3);
    }
    case 'vfs':
      return new FileSystemDriver(location.path, `vfs://${location.path}`);
    case 'nfs': {
      const dir = await ensureNfsMounted(location, options.mountRoot ?? DEFAULT_MOUNT_ROOT);
      return new FileSystemDriver(dir, `nfs://${location.host}:${location.path}`);
    }
    default:
      throw new BackupStoreError('Unsupported', `unsupported backup target ${targetUrl}`);
  }
}
