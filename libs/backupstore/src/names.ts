import { createHash, webcrypto } from 'node:crypto';

/** Longhorn's `DEFAULT_BLOCK_SIZE`: backing images always use 2 MiB blocks. */
export const BACKUP_BLOCK_SIZE = 2 * 1024 * 1024;

/** `backupstore.SetBackupstoreBase` default. */
export const BACKUPSTORE_BASE = 'backupstore';
export const BACKING_IMAGES_DIR = `${BACKUPSTORE_BASE}/backing-images/backing-images`;
export const BLOCKS_DIR = `${BACKUPSTORE_BASE}/backing-images/blocks`;
export const BACKING_IMAGE_CONFIG_FILE = 'backing-image.cfg';
/**
 * The SHA-512 chain of the image (`@bis/sha512-chain` encoding, 2 MiB segments), beside the config: lets a restore
 * verify the whole-image checksum in parallel. Not part of Longhorn's format (Longhorn never reads it).
 */
export const BACKING_IMAGE_CHAIN_FILE = 'backing-image.sha512chain';
/** Pseudo-volume whose lock directory serialises all backing-image operations of a store. */
export const LOCK_VOLUME_NAME = 'BACKINGIMAGE';

const BACKING_IMAGE_NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]+$/;
/** BIM caps names at 64 characters. */
export const MAX_BACKING_IMAGE_NAME_LENGTH = 64;
const BLOCK_CHECKSUM = /^[0-9a-f]{64}$/;

/** Longhorn's `util.GetChecksum`: first 32 bytes of SHA-512 of the data, lowercase hex. */
export function blockChecksum(data: Uint8Array | string): string {
  return createHash('sha512').update(data).digest('hex').slice(0, 64);
}

/** The same checksum, computed on the libuv thread pool so several blocks hash in parallel. */
export async function blockChecksumAsync(data: Uint8Array): Promise<string> {
  const digest = await webcrypto.subtle.digest('SHA-512', data);
  return Buffer.from(digest, 0, 32).toString('hex');
}

export function isValidBackingImageName(name: string): boolean {
  return BACKING_IMAGE_NAME.test(name) && name.length <= MAX_BACKING_IMAGE_NAME_LENGTH;
}

export function assertBackingImageName(name: string): void {
  if (!BACKING_IMAGE_NAME.test(name)) {
    throw new BackupStoreError(
      'InvalidArgument',
      `invalid backing image name ${JSON.stringify(name)}: must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]+$`,
    );
  }
  if (name.length > MAX_BACKING_IMAGE_NAME_LENGTH) {
    throw new BackupStoreError(
      'InvalidArgument',
      `invalid backing image name ${JSON.stringify(name)}: longer than ${MAX_BACKING_IMAGE_NAME_LENGTH} characters`,
    );
  }
}

export function isBlockChecksum(value: string): boolean {
  return BLOCK_CHECKSUM.test(value);
}

export function backingImageDir(name: string): string {
  return `${BACKING_IMAGES_DIR}/${name}`;
}

export function backingImageConfigPath(name: string): string {
  return `${BACKING_IMAGES_DIR}/${name}/${BACKING_IMAGE_CONFIG_FILE}`;
}

export function backingImageChainPath(name: string): string {
  return `${BACKING_IMAGES_DIR}/${name}/${BACKING_IMAGE_CHAIN_FILE}`;
}

/** `backupstore/backing-images/blocks/<c[0:2]>/<c[2:4]>/<c>.blk` */
export function blockPath(checksum: string): string {
  return `${BLOCKS_DIR}/${checksum.slice(0, 2)}/${checksum.slice(2, 4)}/${checksum}.blk`;
}

/** `backupstore/volumes/22/fc/BACKINGIMAGE/locks` */
export function lockDir(): string {
  const h = blockChecksum(LOCK_VOLUME_NAME);
  return `${BACKUPSTORE_BASE}/volumes/${h.slice(0, 2)}/${h.slice(2, 4)}/${LOCK_VOLUME_NAME}/locks`;
}

export type BackupStoreErrorCode =
  | 'InvalidArgument'
  | 'NotFound'
  | 'InProgress'
  | 'AlreadyExists'
  | 'LockConflict'
  | 'Corrupt'
  | 'ChecksumMismatch'
  | 'Unsupported'
  | 'Aborted'
  | 'Io';

/** Every error the backupstore raises on purpose carries a code a caller can branch on. */
export class BackupStoreError extends Error {
  constructor(
    readonly code: BackupStoreErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'BackupStoreError';
  }
}

export function abortError(signal: AbortSignal): BackupStoreError {
  const reason: unknown = signal.reason;
  const detail = reason instanceof Error ? reason.message : reason === undefined ? 'aborted' : String(reason);
  return new BackupStoreError('Aborted', `operation cancelled: ${detail}`, { cause: reason });
}

export function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw abortError(signal);
}
