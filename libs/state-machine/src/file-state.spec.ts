import { describe, expect, it } from '@jest/globals';
import { FILE_MACHINE, FILE_STATES, FileEvent, FileLifecycle, IllegalTransitionError, transition, type FileState } from './index.js';
import { computeProgress } from './progress.js';

// The expected outcome of every (state, event) pair, written out independently of the implementation's table.
// '-' means the event is illegal in that state; "new" is the state "".
// Columns: reuse-succeeded prepared progress processed processed-for-transfer transferred modified verified fail
//          cleaned-up lost disk-unavailable found-corrupted source-gone deleted retried await-upload
const EXPECTED: Record<string, string> = {
  new: '- starting - - - ready - - failed - unknown unknown failed failed failed new pending',
  pending: 'ready starting - - - - - - failed - unknown unknown failed failed failed new -',
  starting: '- - in-progress - - - - - failed - unknown unknown failed failed failed - -',
  'in-progress': '- - in-progress ready ready-for-transfer - - - failed - unknown unknown failed failed failed - -',
  'ready-for-transfer': '- - - - - ready - - failed - unknown unknown failed failed failed - -',
  ready: '- - - - - ready unknown - - - unknown unknown failed failed failed - -',
  failed: '- - - - - - - - - failed-and-cleanup - unknown - - failed new -',
  'failed-and-cleanup': '- - - - - - - - - - - unknown - - - new -',
  unknown: '- - - - - - - ready failed - unknown unknown failed failed failed - -',
};
const stateOf = (s: string): FileState => (s === 'new' ? '' : (s as FileState));

describe('file state machine', () => {
  it('knows exactly the nine states, with their wire spelling', () => {
    expect([...FILE_STATES].sort()).toEqual(
      ['', 'failed', 'failed-and-cleanup', 'in-progress', 'pending', 'ready', 'ready-for-transfer', 'starting', 'unknown'],
    );
  });

  const pairs = FILE_STATES.flatMap((s) => FILE_MACHINE.events.map((e, i) => [s, e, i] as const));
  it('covers all (state, event) pairs', () => {
    expect(pairs).toHaveLength(9 * 17);
    expect(Object.keys(EXPECTED).map(stateOf).sort()).toEqual([...FILE_STATES].sort());
  });

  it.each(pairs)('"%s" + %s', (state, event, i) => {
    const want = EXPECTED[state === '' ? 'new' : state]!.split(' ')[i]!;
    if (want === '-') {
      let err: unknown;
      try {
        transition(FILE_MACHINE, state, event, 'image-1');
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(IllegalTransitionError);
      const e = err as IllegalTransitionError;
      expect([e.from, e.event, e.subject]).toEqual([state, event, 'image-1']);
      expect(e.message).toBe(`file image-1: illegal transition: event "${event}" is not allowed in state "${state}"`);
    } else {
      expect(transition(FILE_MACHINE, state, event)).toBe(stateOf(want));
    }
  });

  it('a reported state is taken as it is, if it is a state', () => {
    expect(transition(FILE_MACHINE, 'starting', { reported: 'ready-for-transfer' })).toBe('ready-for-transfer');
    expect(transition(FILE_MACHINE, 'failed', { reported: '' })).toBe('');
    expect(() => transition(FILE_MACHINE, 'starting', { reported: 'done' }, 'image-1')).toThrow(
      'file image-1: illegal transition: event "reported "done"" is not allowed in state "starting"',
    );
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
    expect(() => f.fire('prepared')).toThrow(IllegalTransitionError);
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

describe('FileLifecycle notes', () => {
  it('a note is the message of a file still being processed until its next progress; ignored once it failed', () => {
    const l = new FileLifecycle({ size: 1000 });
    l.fire(FileEvent.Prepared);
    expect(l.note('origin answered HTTP 500; attempt 1 of 6 failed, next attempt at 2026-01-01T00:00:01.000Z')).toBe(true);
    expect(l.snapshot()).toMatchObject({ state: 'starting', message: 'origin answered HTTP 500; attempt 1 of 6 failed, next attempt at 2026-01-01T00:00:01.000Z' });
    l.updateProgress(100);
    expect(l.snapshot()).toMatchObject({ state: 'in-progress', message: '', progress: 10 });
    l.note('connection reset; attempt 2 of 6 failed');
    l.fire(FileEvent.Fail, 'download failed after 6 attempts');
    expect(l.message).toBe('download failed after 6 attempts');
    expect(l.note('late')).toBe(false);
    expect(l.message).toBe('download failed after 6 attempts');
  });
});
