import { execFile } from 'node:child_process';
import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { BackupStoreError } from '../names.js';
import type { FileSystemTargetLocation } from '../url.js';

const execFileAsync = promisify(execFile);

/** Longhorn's mount root for NFS and CIFS targets. */
export const DEFAULT_MOUNT_ROOT = '/var/lib/longhorn-backupstore-mounts';

/** Longhorn's defaults when `nfsOptions` is absent: each NFS 4.x minor version is tried in turn. */
const DEFAULT_ATTEMPTS = ['4.2', '4.1', '4.0'].map((v) => ['nfsvers=' + v, 'actimeo=1', 'soft', 'timeo=300', 'retry=2']);

/** `<root>/<host with '.'→'_'>/<export path>`, as Longhorn lays out its mount points. */
export function nfsMountPoint(location: FileSystemTargetLocation, mountRoot: string): string {
  return path.join(mountRoot, location.host.replace(/\./g, '_').replace(/:$/, ''), location.path);
}

async function mountedAt(dir: string): Promise<boolean> {
  let mounts: string;
  try {
    mounts = await fs.readFile('/proc/self/mounts', 'utf8');
  } catch {
    return false;
  }
  const target = dir.replace(/ /g, '\\040');
  return mounts.split('\n').some((line) => line.split(' ')[1] === target);
}

/**
 * Mounts `server:/export` with the system's `mount -t nfs4` unless it is mounted already, and returns the mount point.
 * Fails with a clear error when `mount` is missing, not permitted, or the server refuses.
 */
export async function ensureNfsMounted(location: FileSystemTargetLocation, mountRoot = DEFAULT_MOUNT_ROOT): Promise<string> {
  const dir = nfsMountPoint(location, mountRoot);
  if (await mountedAt(dir)) return dir;
  await fs.mkdir(dir, { recursive: true, mode: 0o700 }).catch((err: unknown) => {
    throw new BackupStoreError('Io', `cannot create NFS mount point ${dir}: ${(err as Error).message}`, { cause: err });
  });
  const attempts = location.mountOptions.length > 0 ? [location.mountOptions] : DEFAULT_ATTEMPTS;
  const errors: string[] = [];
  for (const options of attempts) {
    try {
      await execFileAsync('mount', ['-t', 'nfs4', '-o', options.join(','), `${location.host}:${location.path}`, dir], {
        timeout: 60_000,
      });
      return dir;
    } catch (err) {
      const e = err as NodeJS.ErrnoException & { stderr?: string };
      if (e.code === 'ENOENT') {
        throw new BackupStoreError('Unsupported', `cannot mount nfs://${location.host}:${location.path}: the system has no mount command`);
      }
      errors.push(`-o ${options.join(',')}: ${(e.stderr ?? e.message).trim()}`);
    }
  }
  await fs.rmdir(dir).catch(() => undefined); // best effort: the mount error below is what matters
  throw new BackupStoreError('Io', `cannot mount nfs://${location.host}:${location.path} at ${dir}: ${errors.join('; ')}`);
}
