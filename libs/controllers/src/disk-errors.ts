/**
 * Disk conditions recognised in a copy's failure message: errors that say something about the disk rather than the
 * image (a full disk, an I/O error, a read-only or forbidden directory).
 */
export type DiskErrorCode = 'ENOSPC' | 'EIO' | 'EACCES' | 'EPERM' | 'EROFS';

const DISK_ERRORS: Record<DiskErrorCode, string> = {
  ENOSPC: 'no space left on device',
  EIO: 'input/output error',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  EROFS: 'read-only file system',
};

/** The disk condition a failure message names (by its errno code or by its text), if any. */
export function diskErrorOf(message: string): DiskErrorCode | undefined {
  for (const [code, text] of Object.entries(DISK_ERRORS) as [DiskErrorCode, string][]) {
    if (new RegExp(`\\b${code}\\b`).test(message) || message.toLowerCase().includes(text)) return code;
  }
  return undefined;
}

/**
 * A failed copy's status message as operators read it: the disk named, the disk condition spelled out, and when the
 * next attempt comes: `disk-2: no space left on device (ENOSPC), next retry in 40 s (attempt 3): <original message>`.
 */
export function failedCopyMessage(disk: string, message: string, retry?: { attempt: number; inText: string }): string {
  const code = diskErrorOf(message);
  const head = code ? `${disk}: ${DISK_ERRORS[code]} (${code})` : `${disk}`;
  const next = retry ? `, next retry in ${retry.inText} (attempt ${retry.attempt})` : '';
  return `${head}${next}: ${message}`;
}
