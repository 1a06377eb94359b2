import { describe, expect, it } from '@jest/globals';
import {
  BACKUP_EVENTS,
  BACKUP_STATES,
  BACKUP_TRANSITIONS,
  IllegalTransitionError,
  MANAGER_EVENTS,
  MANAGER_STATES,
  MANAGER_TRANSITIONS,
  StateMachine,
  backupEventForManagerState,
  nextState,
  type BackupEvent,
  type BackupState,
  type ManagerEvent,
  type ManagerState,
} from './index.js';

// Columns: workload-created, workload-pending, workload-ready, workload-not-ready, workload-missing,
// workload-failed, disk-unavailable, stopped.
const MANAGER_EXPECTED: Record<ManagerState, string> = {
  '': 'starting starting running starting stopped error unknown stopped',
  stopped: 'starting starting running starting stopped error unknown stopped',
  starting: 'starting starting running starting error error unknown stopped',
  running: '- error running error error error unknown stopped',
  error: 'starting error running error error error unknown stopped',
  unknown: 'starting starting running starting error error unknown stopped',
};

// Columns: create-timed-out, progress, completed, error, unrecognised, synced.
const BACKUP_EXPECTED: Record<BackupState, string> = {
  '': 'Pending InProgress Completed Error Unknown Completed',
  Pending: 'Pending InProgress Completed Error Unknown Completed',
  InProgress: 'InProgress InProgress Completed Error Unknown Completed',
  Completed: '- - - - - Completed',
  Error: '- - - - - Completed',
  Unknown: '- - - Error - Completed',
};

function expectTable<S extends string, E extends string>(
  name: string,
  table: { readonly [s in S]: Partial<Readonly<Record<E, S>>> },
  states: readonly S[],
  events: readonly E[],
  expected: Record<S, string>,
): void {
  for (const s of states) {
    const cols = expected[s].split(' ');
    expect(cols).toHaveLength(events.length);
    events.forEach((e, i) => {
      const want = cols[i];
      if (want === '-') {
        expect(() => nextState(name, table, s, e)).toThrow(IllegalTransitionError);
      } else {
        expect([s, e, nextState(name, table, s, e)]).toEqual([s, e, want]);
      }
    });
  }
}

describe('manager states', () => {
  it('are Longhorn\'s', () => {
    expect([...MANAGER_STATES].sort()).toEqual(['', 'error', 'running', 'starting', 'stopped', 'unknown']);
  });
  it('follow the workload/disk mapping for every (state, event) pair', () => {
    expectTable<ManagerState, ManagerEvent>('manager', MANAGER_TRANSITIONS, MANAGER_STATES, MANAGER_EVENTS, MANAGER_EXPECTED);
  });
  it('a running manager cannot be "created" again', () => {
    const m = new StateMachine<ManagerState, ManagerEvent>('manager', MANAGER_TRANSITIONS, 'running');
    expect(() => m.fire('workload-created')).toThrow('illegal transition');
  });
});

describe('backup states', () => {
  it('are Longhorn\'s', () => {
    expect([...BACKUP_STATES].sort()).toEqual(['', 'Completed', 'Error', 'InProgress', 'Pending', 'Unknown']);
  });
  it('follow the table for every (state, event) pair', () => {
    expectTable<BackupState, BackupEvent>('backup', BACKUP_TRANSITIONS, BACKUP_STATES, BACKUP_EVENTS, BACKUP_EXPECTED);
  });
  it('maps the data plane backup states', () => {
    expect(backupEventForManagerState('in_progress')).toBe('progress');
    expect(backupEventForManagerState('complete')).toBe('completed');
    expect(backupEventForManagerState('error')).toBe('error');
    expect(backupEventForManagerState('weird')).toBe('unrecognised');
  });
});
