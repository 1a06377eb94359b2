/** An error of the sync service with the HTTP status its route answers with (Longhorn: 500, 404, 400). */
export class SyncServiceError extends Error {
  override readonly name: string = 'SyncServiceError';
  constructor(
    message: string,
    readonly httpStatus: number = 500,
  ) {
    super(message);
  }
}

/**
 * A request that can never succeed as made (e.g. a size that is not a multiple of 512): retrying it is useless. The
 * manager answers it with gRPC INVALID_ARGUMENT, which the controllers treat as a permanent failure. The HTTP status
 * stays Longhorn's (500).
 */
export class SyncInvalidArgumentError extends SyncServiceError {
  override readonly name = 'SyncInvalidArgumentError';
}

export class SyncFileNotFoundError extends SyncServiceError {
  override readonly name = 'SyncFileNotFoundError';
  constructor(readonly filePath: string) {
    super(`can not find sync file ${filePath}`, 404);
  }
}

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

export function isAbortError(err: unknown): boolean {
  return err instanceof Error && (err.name === 'AbortError' || (err as NodeJS.ErrnoException).code === 'ABORT_ERR');
}

/**
 * A file-system error of a sync file as a person reads it: which file of which backing image, what happened and what
 * to do, instead of a raw `ENOENT: no such file or directory, rename '…/x.tmp'`. The error code ends the text for
 * operators. Other errors keep their message.
 */
export function describeFileError(err: unknown, file: { filePath: string; imageName: string }): string {
  const e = fsErrorOf(err);
  if (!e) return errorMessage(err);
  const at = e.path ?? file.filePath;
  const which = at === file.filePath ? 'the file' : at === `${file.filePath}.tmp` ? 'the file being written' : `file ${at}`;
  const of = `${which} of backing image ${file.imageName}${at === file.filePath || at === `${file.filePath}.tmp` ? ` (${at})` : ''}`;
  switch (e.code) {
    case 'ENOENT':
      return `${of} is missing: something outside the system removed it (or its directory) from the disk while it was in use; this copy is lost and has to be made again (${e.code})`;
    case 'ENOSPC':
    case 'EDQUOT':
      return `the disk of ${of} is full: free space on it or lower the copies kept there, then the copy can be made again (${e.code})`;
    case 'EACCES':
    case 'EPERM':
      return `${of} cannot be written or read: permission denied; check the owner and mode of the disk directory (${e.code})`;
    case 'EROFS':
      return `the disk of ${of} is read-only: remount it read-write or stop scheduling on it (${e.code})`;
    case 'EIO':
      return `the disk of ${of} reported an I/O error: the disk may be failing; check the kernel log and move copies away (${e.code})`;
    default:
      return errorMessage(err);
  }
}

/** Node's `E…: text, syscall 'path'` message, also after it lost its fields (a worker thread, a re-thrown string). */
const FS_MESSAGE = /^(?:Error: )?(E[A-Z]+): [^,]*, (\w+) '([^']*)'/;

function fsErrorOf(err: unknown): { code: string; path?: string } | undefined {
  const e = err as NodeJS.ErrnoException | undefined;
  if (err instanceof Error && typeof e?.code === 'string' && e.syscall) return { code: e.code, ...(e.path ? { path: e.path } : {}) };
  const m = FS_MESSAGE.exec(errorMessage(err));
  return m ? { code: m[1]!, path: m[3]! } : undefined;
}
