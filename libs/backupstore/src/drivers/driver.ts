/**
 * A backupstore driver: the storage primitives Longhorn's drivers provide, addressed by '/'-separated paths relative
 * to the store root (the S3 key prefix, the NFS mount directory or the vfs directory).
 *
 * Unlike Longhorn, a driver never turns an error into "empty" or "missing": `list` returns [] only for a directory
 * that does not exist, and `exists` returns false only when the object is definitely absent.
 */
export interface BackupStoreDriver {
  /** Normalised target URL (Longhorn's `GetURL()`), used to build the URLs inspect returns. */
  readonly url: string;
  /** Whole object. Throws a BackupStoreError with code NotFound when it does not exist. */
  read(path: string, signal?: AbortSignal): Promise<Buffer>;
  /**
   * Optional: reads a whole object into `target` (no allocation per object) and returns its length. Throws a
   * BackupStoreError with code NotFound when it does not exist, and Corrupt when it is larger than `target`.
   */
  readInto?(path: string, target: Uint8Array, signal?: AbortSignal): Promise<number>;
  /**
   * Atomic replace: readers see the old or the new content, never a partial object. An array is written as the
   * concatenation of its pieces (vectored where the store allows it).
   */
  write(path: string, data: Uint8Array | string | readonly Uint8Array[], signal?: AbortSignal): Promise<void>;
  exists(path: string, signal?: AbortSignal): Promise<boolean>;
  /** Names (files and directories) directly under `dir`, without the prefix; [] when `dir` does not exist. */
  list(dir: string, signal?: AbortSignal): Promise<string[]>;
  /** The store's modification time of an object. */
  modificationTime(path: string, signal?: AbortSignal): Promise<Date>;
  /** Removes the object or the whole tree under `path` ("rm -rf"); filesystem drivers prune empty parents. */
  remove(path: string, signal?: AbortSignal): Promise<void>;
  /** Releases connections. */
  close(): Promise<void>;
}

/** Longhorn's backup-target credential keys, passed per call (never through process environment). */
export type BackupCredential = Readonly<Record<string, string>>;
