import { describe, expect, it } from '@jest/globals';
import type { BisEvent } from '@bis/api-client';
import { age, describeFsError, eventsSection } from './cli.js';

const ev = (over: Partial<BisEvent>): BisEvent => ({
  id: 'x',
  type: 'event',
  links: {},
  actions: {},
  name: 'x',
  eventType: 'Normal',
  reason: 'Create',
  message: 'm',
  source: 'longhorn-backing-image-controller',
  count: 1,
  firstTimestamp: '2026-01-01T00:00:00Z',
  lastTimestamp: '2026-01-01T00:00:00Z',
  involvedObjectKind: 'BackingImage',
  involvedObjectName: 'img',
  ...over,
});

describe('bictl image get: the Events section', () => {
  const now = Date.parse('2026-01-01T00:10:00Z');
  it('lists type, reason, age, from and message as kubectl describe does, repeats with their count', () => {
    const out = eventsSection(
      [
        ev({ reason: 'Create', message: 'Backing image img created from source type download', lastTimestamp: '2026-01-01T00:00:00Z' }),
        ev({ eventType: 'Warning', reason: 'Failed', source: 'longhorn-backing-image-data-source-controller', message: 'got 404', count: 3, firstTimestamp: '2026-01-01T00:05:00Z', lastTimestamp: '2026-01-01T00:09:30Z' }),
      ],
      now,
    );
    expect(out.split('\n')).toEqual([
      'Events:',
      '  Type      Reason   Age                From                                            Message',
      '  ----      ------   ---                ----                                            -------',
      '  Normal    Create   10m                longhorn-backing-image-controller               Backing image img created from source type download',
      '  Warning   Failed   30s (x3 over 5m)   longhorn-backing-image-data-source-controller   got 404',
      '',
    ]);
    expect(eventsSection([], now)).toBe('Events:  <none>\n');
    expect(eventsSection(undefined, now)).toContain('<unknown');
  });
  it('ages like kubectl and file-system errors in words', () => {
    expect(age('2026-01-01T00:09:59Z', now)).toBe('1s');
    expect(age('2026-01-01T00:00:00Z', now)).toBe('10m');
    expect(age('2025-12-29T00:10:00Z', now)).toBe('3d');
    const e = Object.assign(new Error("ENOSPC: no space left on device, write '/x/y.part'"), { code: 'ENOSPC', path: '/x/y.part' });
    expect(describeFsError(e)).toBe('no space left on the device of /x/y.part: free some space or write elsewhere');
    expect(describeFsError(new Error('other'))).toBeUndefined();
  });
});
