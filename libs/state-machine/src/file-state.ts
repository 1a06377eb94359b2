/**
 * The state of one backing-image file (a Copy on a Disk, or the DataSource's first file).
 *
 * This is the only place where file states and their transitions are defined. The sync service, the
 * data source, the manager daemon and the controllers all move files through {@link FileStateMachine}.
 */
export const FileState = {
  Pending: 'pending',
  Starting: 'starting',
  InProgress: 'in-progress',
  ReadyForTransfer: 'ready-for-transfer',
  Ready: 'ready',
  Failed: 'failed',
  FailedAndCleanup: 'failed-and-cleanup',
  Unknown: 'unknown',
} as const;
export type FileState = (typeof FileState)[keyof typeof FileState];
export const FILE_STATES: readonly FileState[] = Object.values(FileState);

export function isFileState(value: unknown): value is FileState {
  return typeof value === 'string' && (FILE_STATES as readonly string[]).includes(value);
}

/**
 * What can happen to a file.
 *
 * - `reuse-succeeded`: the pending record found a valid existing file on disk (size, checksum) → ready.
 * - `prepared`: the pending record found nothing to reuse and cleaned the place → starting.
 * - `progress`: bytes were written (or a position was reached) → in-progress.
 * - `processed`: all bytes are in and the checksum matched → ready.
 * - `processed-for-transfer`: a data source finished its file; it waits for a manager to take it → ready-for-transfer.
 * - `transferred`: a manager took the data source's file over → ready.
 * - `modified`: a ready file changed or vanished on disk; it must be verified again → unknown.
 * - `verified`: the re-verification of an unknown file succeeded → ready.
 * - `fail`: anything went wrong (bad input, I/O, checksum, cancellation, timeout) → failed.
 * - `cleaned-up`: the control plane removed the leftovers of a failed first file → failed-and-cleanup.
 * - `lost`: the owner of the file (a manager) is unreachable; the file's fate is unknown → unknown.
 */
export const FileEvent = {
  ReuseSucceeded: 'reuse-succeeded',
  Prepared: 'prepared',
  Progress: 'progress',
  Processed: 'processed',
  ProcessedForTransfer: 'processed-for-transfer',
  Transferred: 'transferred',
  Modified: 'modified',
  Verified: 'verified',
  Fail: 'fail',
  CleanedUp: 'cleaned-up',
  Lost: 'lost',
} as const;
export type FileEvent = (typeof FileEvent)[keyof typeof FileEvent];
export const FILE_EVENTS: readonly FileEvent[] = Object.values(FileEvent);

type TransitionTable<S extends string, E extends string> = { readonly [state in S]: Partial<Readonly<Record<E, S>>> };

/**
 * Every legal transition. A (state, event) pair that is not listed is illegal and raises
 * {@link IllegalTransitionError}.
 *
 * Notes on choices that differ from Longhorn (documented in docs/state-machine.md):
 * - a `ready` file never goes to `failed` directly: it must first be noticed as modified (`unknown`) and fail its
 *   re-verification, so that a late error from a finished transfer cannot destroy a good copy;
 * - `progress` on an in-progress file is a self-transition (the progress value changes, the state does not).
 */
export const FILE_TRANSITIONS: TransitionTable<FileState, FileEvent> = {
  pending: {
    'reuse-succeeded': 'ready',
    prepared: 'starting',
    fail: 'failed',
    lost: 'unknown',
  },
  starting: {
    progress: 'in-progress',
    fail: 'failed',
    lost: 'unknown',
  },
  'in-progress': {
    progress: 'in-progress',
    processed: 'ready',
    'processed-for-transfer': 'ready-for-transfer',
    fail: 'failed',
    lost: 'unknown',
  },
  'ready-for-transfer': {
    transferred: 'ready',
    fail: 'failed',
    lost: 'unknown',
  },
  ready: {
    modified: 'unknown',
    lost: 'unknown',
  },
  failed: {
    'cleaned-up': 'failed-and-cleanup',
  },
  'failed-and-cleanup': {},
  unknown: {
    verified: 'ready',
    fail: 'failed',
    lost: 'unknown',
  },
};

/** States in which no more work happens on the file. */
export const TERMINAL_FILE_STATES: ReadonlySet<FileState> = new Set<FileState>(['failed', 'failed-and-cleanup']);

/** States in which the file's bytes are complete and verified. */
export function isFileUsable(state: FileState): boolean {
  return state === 'ready' || state === 'ready-for-transfer';
}

/** States that count as "being prepared" (used by the per-node replenish limit). */
export function isFileInProgress(state: FileState): boolean {
  return state === 'pending' || state === 'starting' || state === 'in-progress';
}
