/** A source failed in a way that retrying cannot fix (bad status, bad input, refused host). */
export class SourceError extends Error {
  override readonly name: string = 'SourceError';
}

/** No bytes arrived for longer than the stall timeout. */
export class StallError extends SourceError {
  override readonly name = 'StallError';
  constructor(readonly timeoutMs: number) {
    super(`no data was processed for ${timeoutMs / 1000} s: transfer stalled and was cancelled`);
  }
}

/** The caller cancelled the operation (DELETE, shutdown). */
export class SourceCancelledError extends SourceError {
  override readonly name = 'SourceCancelledError';
  constructor(reason?: unknown) {
    super(`cancelled${reason instanceof Error ? `: ${reason.message}` : typeof reason === 'string' ? `: ${reason}` : ''}`);
  }
}

export function throwIfAborted(signal: AbortSignal): void {
  if (signal.aborted) throw new SourceCancelledError(signal.reason);
}
