import type { Machine } from './machine.js';

/**
 * BackingImageManager (per-disk daemon) states, as stored in `status.currentState`.
 * The empty string is the state of a manager that was never observed.
 */
export const ManagerState = {
  New: '',
  Starting: 'starting',
  Running: 'running',
  Stopped: 'stopped',
  Error: 'error',
  Unknown: 'unknown',
} as const;
export type ManagerState = (typeof ManagerState)[keyof typeof ManagerState];
export const MANAGER_STATES: readonly ManagerState[] = Object.values(ManagerState);

/**
 * Observations of the manager's workload (a pod or a local process) and of its disk.
 *
 * - `workload-created`: the controller started the workload;
 * - `workload-pending`: the workload exists but is not running yet;
 * - `workload-ready`: running and ready (answers on its ports);
 * - `workload-not-ready`: running but not ready;
 * - `workload-missing`: there is no workload;
 * - `workload-failed`: the workload ended, runs on the wrong node, or is being deleted;
 * - `disk-unavailable`: the disk is not ready, not in the node's spec, or moved;
 * - `stopped`: the controller stopped the manager on purpose.
 */
export const ManagerEvent = {
  WorkloadCreated: 'workload-created',
  WorkloadPending: 'workload-pending',
  WorkloadReady: 'workload-ready',
  WorkloadNotReady: 'workload-not-ready',
  WorkloadMissing: 'workload-missing',
  WorkloadFailed: 'workload-failed',
  DiskUnavailable: 'disk-unavailable',
  Stopped: 'stopped',
} as const;
export type ManagerEvent = (typeof ManagerEvent)[keyof typeof ManagerEvent];
export const MANAGER_EVENTS: readonly ManagerEvent[] = Object.values(ManagerEvent);

const fromIdle = {
  'workload-created': 'starting',
  'workload-pending': 'starting',
  'workload-ready': 'running',
  'workload-not-ready': 'starting',
  'workload-missing': 'stopped',
  'workload-failed': 'error',
  'disk-unavailable': 'unknown',
  stopped: 'stopped',
} as const satisfies Record<ManagerEvent, ManagerState>;

/** Longhorn's pod → state mapping (control plane §3.3), as a table. */
export const MANAGER_TRANSITIONS: { readonly [s in ManagerState]: Partial<Readonly<Record<ManagerEvent, ManagerState>>> } = {
  '': fromIdle,
  stopped: fromIdle,
  starting: {
    'workload-created': 'starting',
    'workload-pending': 'starting',
    'workload-ready': 'running',
    'workload-not-ready': 'starting',
    'workload-missing': 'error',
    'workload-failed': 'error',
    'disk-unavailable': 'unknown',
    stopped: 'stopped',
  },
  running: {
    'workload-pending': 'error',
    'workload-ready': 'running',
    'workload-not-ready': 'error',
    'workload-missing': 'error',
    'workload-failed': 'error',
    'disk-unavailable': 'unknown',
    stopped: 'stopped',
  },
  error: {
    'workload-created': 'starting',
    'workload-pending': 'error',
    'workload-ready': 'running',
    'workload-not-ready': 'error',
    'workload-missing': 'error',
    'workload-failed': 'error',
    'disk-unavailable': 'unknown',
    stopped: 'stopped',
  },
  unknown: {
    'workload-created': 'starting',
    'workload-pending': 'starting',
    'workload-ready': 'running',
    'workload-not-ready': 'starting',
    'workload-missing': 'error',
    'workload-failed': 'error',
    'disk-unavailable': 'unknown',
    stopped: 'stopped',
  },
};

export const MANAGER_MACHINE: Machine<ManagerState, ManagerEvent> = { name: 'backing image manager', states: MANAGER_STATES, events: MANAGER_EVENTS, table: MANAGER_TRANSITIONS };
