import type { Machine } from './machine.js';

/** BackupBackingImage `status.state` (control plane §1.2). */
export const BackupState = {
  New: '',
  Pending: 'Pending',
  InProgress: 'InProgress',
  Completed: 'Completed',
  Error: 'Error',
  Unknown: 'Unknown',
} as const;
export type BackupState = (typeof BackupState)[keyof typeof BackupState];
export const BACKUP_STATES: readonly BackupState[] = Object.values(BackupState);

/**
 * - `create-timed-out`: BackupCreate hit a deadline; the monitor polls with back-off → Pending;
 * - `progress`: the manager reports `in_progress` → InProgress;
 * - `completed`: the manager reports `complete`, or the remote config was inspected → Completed;
 * - `error`: the manager reports `error`, the poll failed, or the image vanished → Error;
 * - `unrecognised`: the manager reported a state we do not know → Unknown;
 * - `synced`: the backup was found complete on the backup target → Completed.
 */
export const BackupEvent = {
  CreateTimedOut: 'create-timed-out',
  Progress: 'progress',
  Completed: 'completed',
  Error: 'error',
  Unrecognised: 'unrecognised',
  Synced: 'synced',
} as const;
export type BackupEvent = (typeof BackupEvent)[keyof typeof BackupEvent];
export const BACKUP_EVENTS: readonly BackupEvent[] = Object.values(BackupEvent);

const active = {
  'create-timed-out': 'Pending',
  progress: 'InProgress',
  completed: 'Completed',
  error: 'Error',
  unrecognised: 'Unknown',
  synced: 'Completed',
} as const satisfies Record<BackupEvent, BackupState>;

export const BACKUP_TRANSITIONS: { readonly [s in BackupState]: Partial<Readonly<Record<BackupEvent, BackupState>>> } = {
  '': active,
  Pending: active,
  InProgress: { ...active, 'create-timed-out': 'InProgress' },
  // A completed backup only changes when the remote copy is re-inspected (it stays completed).
  Completed: { synced: 'Completed' },
  // Error and Unknown are final for a user-created backup; a remote re-sync can still find it complete.
  Error: { synced: 'Completed' },
  Unknown: { synced: 'Completed', error: 'Error' },
};

/**
 * The progress of one backup in the data plane, as the manager's BackupStatus RPC and the backup engine report it.
 * Defined here once; the backup engine, the manager daemon and the controllers use it.
 */
export const BackupProgressState = { InProgress: 'in_progress', Complete: 'complete', Error: 'error' } as const;
export type BackupProgressState = (typeof BackupProgressState)[keyof typeof BackupProgressState];

/** The data plane's backup progress state → the event it means for the BackupBackingImage. */
export function backupEventForProgress(state: string): BackupEvent {
  switch (state) {
    case BackupProgressState.InProgress:
      return BackupEvent.Progress;
    case BackupProgressState.Complete:
      return BackupEvent.Completed;
    case BackupProgressState.Error:
      return BackupEvent.Error;
    default:
      return BackupEvent.Unrecognised;
  }
}

export const BACKUP_MACHINE: Machine<BackupState, BackupEvent> = { name: 'backup backing image', states: BACKUP_STATES, events: BACKUP_EVENTS, table: BACKUP_TRANSITIONS };
