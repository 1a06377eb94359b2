import { createHash } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { cidrContains, normalizeBackingImageName } from './actions.js';
import { seededRandom } from '@bis/datastore';
import { Backoff } from './backoff.js';
import { isResponsibleFor } from './base-controller.js';
import { BACKUP_MACHINE, backupEventForProgress, transition } from '@bis/state-machine';
import { parseGoDuration } from './backup-target-controller.js';
import { EventRecorder } from './events.js';
import type { BackingImageDataSource, BackingImageManager } from './kinds.js';
import { backingImageManagerName, newBackingImageUUID } from './names.js';
import { aggregateFileStatus } from './status.js';

describe('Backoff (flowcontrol semantics)', () => {
  it('starts at initial, doubles up to max, and expires after 2×max without updates', () => {
    let now = 0;
    const b = new Backoff(1000, 5000, () => now, { jitter: 0 });
    expect(b.isInBackOffSinceUpdate('x')).toBe(false);
    b.next('x');
    expect(b.get('x')).toBe(1000);
    expect(b.isInBackOffSinceUpdate('x')).toBe(true);
    now = 999;
    expect(b.remaining('x')).toBe(1);
    now = 1000;
    expect(b.isInBackOffSinceUpdate('x')).toBe(false);
    b.next('x');
    b.next('x');
    b.next('x');
    expect(b.get('x')).toBe(5000);
    now += 10_001;
    expect(b.get('x')).toBe(0);
    b.next('x');
    expect(b.get('x')).toBe(1000);
    b.reset('x');
    expect(b.isInBackOffSinceUpdate('x')).toBe(false);
  });
});

describe('Backoff (the one retry policy, with jitter)', () => {
  it('counts attempts, jitters each window within [d·0.8, d] reproducibly, and reports when the next retry is', () => {
    let now = 0;
    const run = () => {
      const b = new Backoff(60_000, 300_000, () => now, { random: seededRandom(3) });
      const windows: number[] = [];
      for (let i = 0; i < 6; i++) {
        b.next('f');
        windows.push(b.get('f'));
      }
      return { b, windows };
    };
    const { b, windows } = run();
    expect(run().windows).toEqual(windows);
    const nominal = [60_000, 120_000, 240_000, 300_000, 300_000, 300_000];
    windows.forEach((w, i) => {
      expect(w).toBeLessThanOrEqual(nominal[i]!);
      expect(w).toBeGreaterThanOrEqual(nominal[i]! * 0.8);
    });
    expect(b.attempts('f')).toBe(6);
    expect(b.nextAt('f')).toBe(windows[5]);
    now = 1000;
    expect(b.remaining('f')).toBe(windows[5]! - 1000);
    b.reset('f');
    expect(b.attempts('f')).toBe(0);
    expect(b.nextAt('f')).toBeUndefined();
  });
});

describe('ownership', () => {
  const down = new Set(['dead']);
  const isDown = (n: string) => down.has(n);
  it('follows Longhorn isControllerResponsibleFor', () => {
    expect(isResponsibleFor('n1', 'n1', 'n2', isDown)).toBe(true);
    expect(isResponsibleFor('n1', 'n2', 'n1', isDown)).toBe(false);
    expect(isResponsibleFor('n1', 'dead', 'n1', isDown)).toBe(true);
    expect(isResponsibleFor('n1', '', '', isDown)).toBe(true);
    expect(isResponsibleFor('n1', '', 'n2', isDown)).toBe(false);
    expect(isResponsibleFor('n1', '', 'dead', isDown)).toBe(true);
  });
});

describe('names and small parsers', () => {
  it('names managers bim-<sha224(image-disk)>', () => {
    const h = createHash('sha224').update('img:1-disk-a').digest('hex');
    expect(backingImageManagerName('img:1', 'disk-a')).toBe(`bim-${h}`);
    expect(backingImageManagerName('img:1', 'disk-a')).toHaveLength(60);
  });
  it('makes 8-character UUIDs', () => {
    expect(newBackingImageUUID()).toMatch(/^[0-9a-f]{8}$/);
  });
  it('normalises long names like the mutator', () => {
    expect(normalizeBackingImageName('Parrot')).toBe('parrot');
    const long = 'a'.repeat(50);
    const n = normalizeBackingImageName(long);
    expect(n).toHaveLength(40);
    expect(n).toBe(`${'a'.repeat(31)}-${createHash('sha512').update(long).digest('hex').slice(0, 8)}`);
  });
  it('parses Go durations', () => {
    expect(parseGoDuration('5m0s')).toBe(300_000);
    expect(parseGoDuration('1h30m')).toBe(5_400_000);
    expect(parseGoDuration('300')).toBeUndefined();
  });
  it('matches IPv4 CIDRs', () => {
    expect(cidrContains('127.0.0.0/8', '127.0.0.1')).toBe(true);
    expect(cidrContains('10.0.0.0/24', '10.0.1.1')).toBe(false);
    expect(cidrContains('::1', '::1')).toBe(true);
  });
  it('maps manager backup states', () => {
    expect(['in_progress', 'complete', 'error', 'x'].map((s) => transition(BACKUP_MACHINE, 'InProgress', backupEventForProgress(s)))).toEqual(['InProgress', 'Completed', 'Error', 'Unknown']);
  });
});

describe('EventRecorder', () => {
  it('folds repeated events and filters by object and reason', async () => {
    const lines: string[] = [];
    const r = new EventRecorder(3, (l) => lines.push(l));
    const bi = { kind: 'BackingImage', metadata: { name: 'bi' } };
    r.record('src', bi, 'Normal', 'FailedDeleting', 'm');
    r.record('src', bi, 'Normal', 'FailedDeleting', 'm');
    r.record('src', { kind: 'BackingImage', metadata: { name: 'other' } }, 'Normal', 'Update', 'x');
    expect(await r.list({ name: 'bi', reason: 'FailedDeleting' })).toEqual([expect.objectContaining({ count: 2, message: 'm' })]);
    expect(lines).toHaveLength(3);
    for (let i = 0; i < 5; i++) r.record('src', bi, 'Normal', 'Update', `n${i}`);
    expect(await r.list()).toHaveLength(3);
  });
});

describe('status aggregation', () => {
  const bids = (state: string, extra: Partial<NonNullable<BackingImageDataSource['status']>> = {}): BackingImageDataSource => ({
    apiVersion: LONGHORN_API_VERSION,
    kind: 'BackingImageDataSource',
    metadata: { name: 'bi' },
    spec: { diskUUID: 'd1', fileTransferred: state === 'ready' },
    status: { currentState: state as 'ready', progress: 40, size: 4096, checksum: '', message: '', ...extra },
  });
  const bim = (name: string, disk: string, file: Record<string, unknown>): BackingImageManager => ({
    apiVersion: LONGHORN_API_VERSION,
    kind: 'BackingImageManager',
    metadata: { name },
    spec: { diskUUID: disk },
    status: { backingImageFileMap: { bi: { name: 'bi', uuid: 'u1', size: 4096, virtualSize: 8192, realSize: 100, state: 'ready', currentChecksum: 'c1', message: '', progress: 100, sendingReference: 0, senderManagerAddress: '', ...file } } },
  });
  const now = '2026-01-01T00:00:00Z';

  it('mirrors the data source while the first file is prepared, then the managers', () => {
    const status: Parameters<typeof aggregateFileStatus>[0]['status'] = { uuid: 'u1', diskFileStatusMap: {} };
    aggregateFileStatus({ status, bids: bids('in-progress'), managers: [bim('m1', 'd1', { state: 'ready' })], biName: 'bi', nowIso: now });
    expect(status.diskFileStatusMap).toEqual({ d1: { dataEngine: 'v1', state: 'in-progress', progress: 40, message: '', lastStateTransitionTime: now } });
    expect(status.size).toBe(4096);

    const events = aggregateFileStatus({ status, bids: bids('ready'), managers: [bim('m1', 'd1', {}), bim('m2', 'd2', { state: 'in-progress', progress: 10, currentChecksum: '' })], biName: 'bi', nowIso: now });
    expect(status.diskFileStatusMap!['d1']!.state).toBe('ready');
    expect(status.diskFileStatusMap!['d2']).toMatchObject({ state: 'in-progress', progress: 10 });
    expect(status.checksum).toBe('c1');
    expect(status.virtualSize).toBe(8192);
    expect(status.realSize).toBe(100);
    expect(events.map((e) => e.message)).toContain('Set virtualSize to 8192');
  });

  it('fails a copy whose checksum or size differs, and drops disks no longer reported', () => {
    const status: Parameters<typeof aggregateFileStatus>[0]['status'] = { uuid: 'u1', checksum: 'c1', size: 4096, diskFileStatusMap: { d9: { state: 'ready', dataEngine: 'v1', lastStateTransitionTime: now } } };
    const events = aggregateFileStatus({
      status,
      bids: bids('ready'),
      managers: [bim('m1', 'd1', { currentChecksum: 'c2' }), bim('m2', 'd2', { size: 1 }), bim('m3', 'd3', { uuid: 'other' })],
      biName: 'bi',
      nowIso: now,
    });
    expect(status.diskFileStatusMap!['d1']).toMatchObject({ state: 'failed', message: "Backing image recorded checksum c1 doesn't match the file checksum c2 in disk d1" });
    expect(status.diskFileStatusMap!['d2']).toMatchObject({ state: 'failed', message: 'found mismatching size 1 reported by backing image manager m2 in disk d2, the size recorded in status is 4096' });
    expect(Object.keys(status.diskFileStatusMap!).sort()).toEqual(['d1', 'd2']);
    expect(events.some((e) => e.type === 'Warning')).toBe(true);
  });
});
