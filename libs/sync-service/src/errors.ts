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
