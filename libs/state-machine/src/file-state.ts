import type { Machine } from './machine.js';

/**
 * The state of one backing-image file: a copy on a disk (sync service, manager daemon, BackingImageManager file map,
 * BackingImage `diskFileStatusMap`) or the data source's first file (data source, BackingImageDataSource
 * `currentState`). `""` is a file nobody has reported yet (Longhorn's zero value).
 *
 * This is the only place where file states and their transitions are defined.
 */
export const FileState = {
  New: '',
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

/**
 * What can happen to a file. Data plane:
 * - `reuse-succeeded`: the pending record found a valid existing file on disk (size, checksum) → ready.
 * - `prepared`: the pending record found nothing to reuse and cleaned the place, or a data source began processing
 *   its file itself (the qcow2 export of a volume) → starting.
 * - `progress`: bytes were written (or a position was reached) → in-progress.
 * - `processed`: all bytes are in and the checksum matched → ready.
 * - `processed-for-transfer`: a data source finished its file; it waits for a manager to take it → ready-for-transfer.
 * - `modified`: a ready file changed or vanished on disk; it must be verified again → unknown.
 * - `verified`: the re-verification of an unknown file succeeded → ready.
 * - `fail`: anything went wrong (bad input, I/O, checksum, cancellation, timeout, the process could not start) → failed.
 *
 * - `await-upload`: an upload data source waits for its upload to begin → pending.
 *
 * Control plane:
 * - `transferred`: a manager took the data source's file over (BIDS `spec.fileTransferred`) → ready.
 * - `cleaned-up`: the manager removed the leftovers of a failed first file → failed-and-cleanup.
 * - `lost`: the manager that owns the file is not running or its disk is gone; the file's fate is unknown → unknown.
 * - `disk-unavailable`: the disk the file is on is not ready, or moved (Longhorn marks the file unknown whatever it
 *   was) → unknown.
 * - `found-corrupted`: the control plane found the copy's checksum, size or virtual size differs from the image's →
 *   failed (also from ready: the copy is bad).
 * - `source-gone`: the data source process of the first file failed, vanished, or runs on the wrong node or disk →
 *   failed (also from ready: a first file not yet marked transferred is lost with its process).
 * - `deleted`: the image is deleted; the manager must remove the first file's leftovers → failed.
 * - `retried`: the data source of the first file is started again (a new attempt, a retried download) → "".
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
  DiskUnavailable: 'disk-unavailable',
  FoundCorrupted: 'found-corrupted',
  SourceGone: 'source-gone',
  Deleted: 'deleted',
  Retried: 'retried',
  AwaitUpload: 'await-upload',
} as const;
export type FileEvent = (typeof FileEvent)[keyof typeof FileEvent];
export const FILE_EVENTS: readonly FileEvent[] = Object.values(FileEvent);

/** Events that apply to every file that is not failed yet. */
const whileAlive = {
  'disk-unavailable': 'unknown',
  'found-corrupted': 'failed',
  deleted: 'failed',
  lost: 'unknown',
} as const;

/**
 * Every legal transition. A (state, event) pair that is not listed is illegal and raises
 * {@link IllegalTransitionError}.
 *
 * Choices that differ from Longhorn (documented in docs/state-machine.md):
 * - a `ready` file never `fail`s: a late error of a finished transfer cannot destroy a good copy. It becomes failed
 *   only when the control plane finds it corrupted (`found-corrupted`), when the first file's data source is gone
 *   before the file was marked transferred (`source-gone`), when the image is deleted, or when its re-verification
 *   fails (`modified`, then `fail` from `unknown`);
 * - a failed file never becomes healthy again: only a new attempt (`retried`, back to `""`) or a lost disk
 *   (`disk-unavailable`) moves it.
 */
export const FILE_TRANSITIONS: { readonly [s in FileState]: Partial<Readonly<Record<FileEvent, FileState>>> } = {
  '': {
    ...whileAlive,
    'await-upload': 'pending',
    prepared: 'starting',
    transferred: 'ready',
    fail: 'failed',
    'source-gone': 'failed',
    retried: '',
  },
  pending: {
    ...whileAlive,
    'reuse-succeeded': 'ready',
    prepared: 'starting',
    fail: 'failed',
    'source-gone': 'failed',
    retried: '',
  },
  starting: {
    ...whileAlive,
    progress: 'in-progress',
    fail: 'failed',
    'source-gone': 'failed',
  },
  'in-progress': {
    ...whileAlive,
    progress: 'in-progress',
    processed: 'ready',
    'processed-for-transfer': 'ready-for-transfer',
    fail: 'failed',
    'source-gone': 'failed',
  },
  'ready-for-transfer': {
    ...whileAlive,
    transferred: 'ready',
    fail: 'failed',
    'source-gone': 'failed',
  },
  ready: {
    ...whileAlive,
    modified: 'unknown',
    transferred: 'ready',
    'source-gone': 'failed',
  },
  failed: {
    'cleaned-up': 'failed-and-cleanup',
    'disk-unavailable': 'unknown',
    deleted: 'failed',
    retried: '',
  },
  'failed-and-cleanup': {
    'disk-unavailable': 'unknown',
    retried: '',
  },
  unknown: {
    ...whileAlive,
    verified: 'ready',
    fail: 'failed',
    'source-gone': 'failed',
  },
};

export const FILE_MACHINE: Machine<FileState, FileEvent> = { name: 'file', states: FILE_STATES, events: FILE_EVENTS, table: FILE_TRANSITIONS };
