import { describe, expect, it } from '@jest/globals';
import { BACKUP_MACHINE, BACKUP_STATES, IllegalTransitionError, MANAGER_MACHINE, MANAGER_STATES, backupEventForProgress, transition } from './index.js';
import type { BackupState } from './backup-state.js';
import type { Machine } from './machine.js';
import type { ManagerState } from './manager-state.js';

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

function expectTable<S extends string, E extends string>(machine: Machine<S, E>, expected: Record<S, string>): void {
  const events = machine.events;
  for (const s of machine.states) {
    const cols = expected[s].split(' ');
    expect(cols).toHaveLength(events.length);
    events.forEach((e, i) => {
      const want = cols[i];
      if (want === '-') {
        expect(() => transition(machine, s, e)).toThrow(IllegalTransitionError);
      } else {
        expect([s, e, transition(machine, s, e)]).toEqual([s, e, want]);
      }
    });
  }
}

describe('manager states', () => {
  it('are Longhorn\'s', () => {
    expect([...MANAGER_STATES].sort()).toEqual(['', 'error', 'running', 'starting', 'stopped', 'unknown']);
  });
  it('follow the workload/disk mapping for every (state, event) pair', () => {
    expectTable(MANAGER_MACHINE, MANAGER_EXPECTED);
  });
  it('a running manager cannot be "created" again', () => {
    expect(() => transition(MANAGER_MACHINE, 'running', 'workload-created', 'bim-1')).toThrow(
      'backing image manager bim-1: illegal transition: event "workload-created" is not allowed in state "running"',
    );
  });
});

describe('backup states', () => {
  it('are Longhorn\'s', () => {
    expect([...BACKUP_STATES].sort()).toEqual(['', 'Completed', 'Error', 'InProgress', 'Pending', 'Unknown']);
  });
  it('follow the table for every (state, event) pair', () => {
    expectTable(BACKUP_MACHINE, BACKUP_EXPECTED);
  });
  it('maps the data plane backup states', () => {
    expect(backupEventForProgress('in_progress')).toBe('progress');
    expect(backupEventForProgress('complete')).toBe('completed');
    expect(backupEventForProgress('error')).toBe('error');
    expect(backupEventForProgress('weird')).toBe('unrecognised');
  });
});
