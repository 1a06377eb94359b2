import path from 'node:path';

/** Default disk mount of a Longhorn backing-image-manager (`types.DiskPathInContainer`). */
export const DEFAULT_DISK_PATH = '/data/';
export const DISK_CONFIG_FILE = 'longhorn-disk.cfg';
export const BACKING_IMAGES_DIR = 'backing-images';
export const DISK_TMP_DIR = 'tmp';
export const BACKING_FILE_NAME = 'backing';
export const TMP_SUFFIX = '.tmp';
export const CFG_SUFFIX = '.cfg';

/** `<disk>/backing-images` */
export function backingImagesRoot(diskPath: string): string {
  return path.join(diskPath, BACKING_IMAGES_DIR);
}

/** `<disk>/backing-images/<name>-<uuid>` */
export function backingImageDir(diskPath: string, name: string, uuid: string): string {
  return path.join(diskPath, BACKING_IMAGES_DIR, `${name}-${uuid}`);
}

/** `<disk>/backing-images/<name>-<uuid>/backing` */
export function backingFilePath(diskPath: string, name: string, uuid: string): string {
  return path.join(backingImageDir(diskPath, name, uuid), BACKING_FILE_NAME);
}

/** `<disk>/tmp` (data-source results wait here until a manager fetches them). */
export function diskTmpDir(diskPath: string): string {
  return path.join(diskPath, DISK_TMP_DIR);
}

/** `<disk>/tmp/<name>-<uuid>`: the data source's finished file. */
export function dataSourceFilePath(diskPath: string, name: string, uuid: string): string {
  return path.join(diskPath, DISK_TMP_DIR, `${name}-${uuid}`);
}

/** `<file>.tmp`: where a file is produced. */
export function tmpPathOf(filePath: string): string {
  return filePath + TMP_SUFFIX;
}

/** `<file>.cfg`: the file's metadata (`backing.cfg`). */
export function cfgPathOf(filePath: string): string {
  return filePath + CFG_SUFFIX;
}

/** `<disk>/longhorn-disk.cfg` */
export function diskConfigPath(diskPath: string): string {
  return path.join(diskPath, DISK_CONFIG_FILE);
}

/**
 * Recovers the backing-image name from a file path `.../<name>-<uuid>/backing` (or `.../<name>-<uuid>`), the way
 * Longhorn does: the directory (or file) name with the `-<uuid>` suffix stripped.
 */
export function backingImageNameFromPath(filePath: string, uuid: string): string {
  const base = path.basename(filePath) === BACKING_FILE_NAME ? path.basename(path.dirname(filePath)) : path.basename(filePath);
  const suffix = `-${uuid}`;
  return uuid !== '' && base.endsWith(suffix) ? base.slice(0, -suffix.length) : base;
}
