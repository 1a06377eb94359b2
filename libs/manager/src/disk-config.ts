import { promises as fsp } from 'node:fs';
import { diskConfigPath } from '@bis/sync-service';

export class DiskConfigError extends Error {
  override readonly name = 'DiskConfigError';
}

/**
 * Reads `<disk>/longhorn-disk.cfg` (`{"diskUUID":"…"}`) and checks it against the UUID the daemon was given.
 * Returns the disk UUID to use. Throws DiskConfigError when the file is missing, unreadable, invalid, or names
 * another disk.
 */
export async function checkDiskConfig(diskPath: string, wantedUUID?: string): Promise<string> {
  const file = diskConfigPath(diskPath);
  let text: string;
  try {
    text = await fsp.readFile(file, 'utf8');
  } catch (err) {
    throw new DiskConfigError(`cannot read the disk config file ${file}: ${(err as Error).message}`);
  }
  let uuid: unknown;
  try {
    uuid = (JSON.parse(text) as { diskUUID?: unknown }).diskUUID;
  } catch (err) {
    throw new DiskConfigError(`invalid disk config file ${file}: ${(err as Error).message}`);
  }
  if (typeof uuid !== 'string' || uuid === '') throw new DiskConfigError(`invalid disk config file ${file}: no diskUUID`);
  if (wantedUUID && wantedUUID !== uuid) {
    throw new DiskConfigError(
      `invalid input disk UUID ${wantedUUID} which doesn't match disk UUID ${uuid} in the disk config file ${file}`,
    );
  }
  return uuid;
}
