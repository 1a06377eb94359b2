import { describe, expect, it } from '@jest/globals';
import {
  FILE_EVENTS,
  FILE_STATES,
  FILE_TRANSITIONS,
  FileLifecycle,
  IllegalTransitionError,
  computeProgress,
  nextState,
  type FileEvent,
  type FileState,
} from './index.js';

// The expected outcome of every (state, event) pair, written out independently of the implementation's table.
// '-' means the event is illegal in that state.
const EXPECTED: Record<FileState, Record<FileEvent, FileState | '-'>> = {
  pending: {
    'reuse-succeeded': 'ready', prepared: 'starting', progress: '-', processed: '-', 'processed-for-transfer': '-',
    transferred: '-', modified: '-', verified: '-', fail: 'failed', 'cleaned-up': '-', lost: 'unknown',
  },
  starting: {
    'reuse-succeeded': '-', prepared: '-', progress: 'in-progress', processed: '-', 'processed-for-transfer': '-',
    transferred: '-', modified: '-', verified: '-', fail: 'failed', 'cleaned-up': '-', lost: 'unknown',
  },
  'in-progress': {
    'reuse-succeeded': '-', prepared: '-', progress: 'in-progress', processed: 'ready',
    'processed-for-transfer': 'ready-for-transfer', transferred: '-', modified: '-', verified: '-', fail: 'failed',
    'cleaned-up': '-', lost: 'unknown',
  },
  'ready-for-transfer': {
    'reuse-succeeded': '-', prepared: '-', progress: '-', processed: '-', 'processed-for-transfer': '-',
    transferred: 'ready', modified: '-', verified: '-', fail: 'failed', 'cleaned-up': '-', lost: 'unknown',
  },
  ready: {
    'reuse-succeeded': '-', prepared: '-', progress: '-', processed: '-', 'processed-for-transfer': '-',
    transferred: '-', modified: 'unknown', verified: '-', fail: '-', 'cleaned-up': '-', lost: 'unknown',
  },
  failed: {
    'reuse-succeeded': '-', prepared: '-', progress: '-', processed: '-', 'processed-for-transfer': '-',
    transferred: '-', modified: '-', verified: '-', fail: '-', 'cleaned-up': 'failed-and-cleanup', lost: '-',
  },
  'failed-and-cleanup': {
    'reuse-succeeded': '-', prepared: '-', progress: '-', processed: '-', 'processed-for-transfer': '-',
    transferred: '-', modified: '-', verified: '-', fail: '-', 'cleaned-up': '-', lost: '-',
  },
  unknown: {
    'reuse-succeeded': '-', prepared: '-', progress: '-', processed: '-', 'processed-for-transfer': '-',
    transferred: '-', modified: '-', verified: 'ready', fail: 'failed', 'cleaned-up': '-', lost: 'unknown',
  },
};

describe('file state machine', () => {
  it('knows exactly the eight data-plane states, with their wire spelling', () => {
    expect([...FILE_STATES].sort()).toEqual(
      ['failed', 'failed-and-cleanup', 'in-progress', 'pending', 'ready', 'ready-for-transfer', 'starting', 'unknown'],
    );
  });

  const pairs = FILE_STATES.flatMap((s) => FILE_EVENTS.map((e) => [s, e] as const));
  it('covers all (state, event) pairs', () => {
    expect(pairs).toHaveLength(8 * 11);
    expect(Object.keys(FILE_TRANSITIONS).sort()).toEqual([...FILE_STATES].sort());
  });

  it.each(pairs)('%s + %s', (state, event) => {
    const want = EXPECTED[state][event];
    if (want === '-') {
      expect(() => nextState('file', FILE_TRANSITIONS, state, event)).toThrow(IllegalTransitionError);
      try {
        nextState('file', FILE_TRANSITIONS, state, event);
      } catch (e) {
        expect(e).toBeInstanceOf(IllegalTransitionError);
        const err = e as IllegalTransitionError;
        expect(err.from).toBe(state);
        expect(err.event).toBe(event);
        expect(err.message).toContain(`"${event}" is not allowed in state "${state}"`);
      }
    } else {
      expect(nextState('file', FILE_TRANSITIONS, state, event)).toBe(want);
    }
  });
});

describe('progress rules', () => {
  it('truncates, clamps and needs a known size', () => {
    expect(computeProgress(0, 100)).toBe(0);
    expect(computeProgress(499, 1000)).toBe(49);
    expect(computeProgress(1000, 1000)).toBe(100);
    expect(computeProgress(3 * 2097152, 9437307)).toBe(66);
    expect(computeProgress(5 * 2097152, 9437307)).toBe(100); // restore overshoot is clamped
    expect(computeProgress(123, 0)).toBe(0);
    expect(computeProgress(123, -1)).toBe(0);
  });

  it('moves starting to in-progress on the first byte and to ready with progress 100', () => {
    const f = new FileLifecycle({ size: 1000 });
    expect(f.updateProgress(10)).toBe(false); // pending: ignored
    f.fire('prepared');
    expect(f.state).toBe('starting');
    expect(f.updateProgress(250)).toBe(true);
    expect(f.state).toBe('in-progress');
    expect(f.progress).toBe(25);
    f.addProgress(250);
    expect(f.progress).toBe(50);
    f.fire('processed');
    expect(f.snapshot()).toEqual({ state: 'ready', size: 1000, processedSize: 1000, progress: 100, message: '' });
    expect(f.updateProgress(10)).toBe(false);
    expect(f.progress).toBe(100);
  });

  it('adopts the processed size when the size was unknown', () => {
    const f = new FileLifecycle({ size: -1 });
    f.fire('prepared');
    f.updateProgress(4096);
    expect(f.progress).toBe(0);
    f.fire('processed-for-transfer');
    expect(f.state).toBe('ready-for-transfer');
    expect(f.size).toBe(4096);
    expect(f.progress).toBe(100);
  });

  it('keeps the first failure message and refuses to revive a failed file', () => {
    const f = new FileLifecycle({ size: 10 });
    f.fire('fail', 'failed to process sync file: boom');
    expect(() => f.fire('fail', 'second')).toThrow(IllegalTransitionError);
    expect(f.tryFire('prepared')).toBe(false);
    expect(f.message).toBe('failed to process sync file: boom');
    f.fire('cleaned-up');
    expect(f.state).toBe('failed-and-cleanup');
  });

  it('re-verifies a modified ready file', () => {
    const f = new FileLifecycle({ size: 10, initial: 'ready' });
    expect(f.progress).toBe(100);
    f.fire('modified', 'ready file is suddenly modified');
    expect(f.state).toBe('unknown');
    expect(f.message).toBe('ready file is suddenly modified');
    f.fire('verified');
    expect(f.state).toBe('ready');
    expect(f.message).toBe('');
  });

  it('notifies listeners of each transition', () => {
    const f = new FileLifecycle();
    const seen: string[] = [];
    f.onTransition((t) => seen.push(`${t.from}>${t.event}>${t.to}`));
    f.fire('prepared');
    f.updateProgress(1);
    f.updateProgress(2);
    expect(seen).toEqual(['pending>prepared>starting', 'starting>progress>in-progress']);
  });
});
