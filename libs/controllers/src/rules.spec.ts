import { describe, expect, it } from '@jest/globals';
import type { BackingImageDiskFileStatus, BackingImageState, BackingImageStatus } from '@bis/crd-types';
import {
  allFilesUnavailable,
  cleanupHaVerdict,
  eligibleDiskCount,
  evictionDecision,
  healthyCopyCounts,
  minCopiesShortfall,
  needsReplenish,
  NodeSyncLimiter,
  disksToPrestart,
  pickDiskForCopy,
  pickSender,
  MAX_ALTERNATIVE_SENDERS,
  SenderGrants,
  SYNC_GRANT_GRACE_MS,
  receiversBySender,
  senderIsFull,
  tagsMatch,
  unusedCopiesToRemove,
  updatedLastRefMap,
} from './rules.js';
import { nodeChangeMatters, Topology } from './topology.js';
import { onlyPassingCopyChanges } from './status.js';
import { diskErrorOf, diskHasError, withDiskCondition } from './disk-errors.js';
import { testNode } from './test-support/fixtures.js';

const st = (state: string, t = '2026-01-01T00:00:00Z'): BackingImageDiskFileStatus => ({ state: state as BackingImageDiskFileStatus['state'], progress: 0, message: '', dataEngine: 'v1', lastStateTransitionTime: t });
const spec = (...disks: string[]) => Object.fromEntries(disks.map((d) => [d, { dataEngine: 'v1' as const, evictionRequested: false }]));
const identity = <T>(a: T[]) => a;
const policy = { nodeSelector: [], diskSelector: [], allowEmptyNodeSelector: true, allowEmptyDiskSelector: true };

describe('disk selection by selectors', () => {
  it('tagsMatch requires every selector tag and honours the empty-selector setting', () => {
    expect(tagsMatch(['ssd', 'fast'], ['ssd'], false)).toBe(true);
    expect(tagsMatch(['ssd'], ['ssd', 'fast'], true)).toBe(false);
    expect(tagsMatch([], [], false)).toBe(true);
    expect(tagsMatch(['ssd'], [], false)).toBe(false);
    expect(tagsMatch(['ssd'], [], true)).toBe(true);
  });

  it('picks the first eligible disk not yet in the spec map and skips unschedulable or untagged disks', () => {
    const topo = new Topology([
      testNode('n1', [
        { uuid: 'd1', tags: ['ssd'] },
        { uuid: 'd2', tags: ['hdd'] },
        { uuid: 'd3', tags: ['ssd'], allowScheduling: false },
      ]),
      testNode('n2', [{ uuid: 'd4', tags: ['ssd'] }], { tags: ['zone-b'] }),
    ]);
    const sel = { ...policy, diskSelector: ['ssd'] };
    expect(pickDiskForCopy(topo, {}, sel, identity)?.disk.diskUUID).toBe('d1');
    expect(pickDiskForCopy(topo, spec('d1'), sel, identity)?.disk.diskUUID).toBe('d4');
    expect(pickDiskForCopy(topo, spec('d1', 'd4'), sel, identity)).toBeUndefined();
    expect(pickDiskForCopy(topo, spec('d1'), { ...sel, nodeSelector: ['zone-a'] }, identity)).toBeUndefined();
    // Tagged node with an empty node selector is refused when allow-empty-node-selector-volume is false.
    expect(pickDiskForCopy(topo, spec('d1'), { ...sel, allowEmptyNodeSelector: false }, identity)).toBeUndefined();
  });

  it('counts the disks the selectors allow and names a minNumberOfCopies beyond them', () => {
    const topo = new Topology([
      testNode('n1', [
        { uuid: 'd1', tags: ['ssd'] },
        { uuid: 'd2', tags: ['hdd'] },
        { uuid: 'd3', tags: ['ssd'], allowScheduling: false },
      ]),
      testNode('n2', [{ uuid: 'd4', tags: ['ssd'] }]),
    ]);
    const allowed = eligibleDiskCount(topo, { ...policy, diskSelector: ['ssd'] });
    expect(allowed).toBe(2);
    expect(eligibleDiskCount(topo, policy)).toBe(3);
    expect(minCopiesShortfall(3, allowed)).toBe('minNumberOfCopies 3 exceeds the 2 disks that the selectors allow');
    expect(minCopiesShortfall(2, 1)).toBe('minNumberOfCopies 2 exceeds the 1 disk that the selectors allow');
    expect(minCopiesShortfall(2, allowed)).toBeUndefined();
  });

  it('refuses disks on nodes that are not schedulable', () => {
    const topo = new Topology([testNode('n1', [{ uuid: 'd1' }], { schedulable: false })]);
    expect(pickDiskForCopy(topo, {}, policy, identity)).toBeUndefined();
  });

  it('refuses disks on nodes that are down and disks that are not ready (a copy placed there could never sync)', () => {
    const topo = new Topology([
      testNode('down', [{ uuid: 'd1' }], { ready: false }),
      testNode('up', [{ uuid: 'd2', ready: false }, { uuid: 'd3' }]),
    ]);
    expect(pickDiskForCopy(topo, {}, policy, identity)?.disk.diskUUID).toBe('d3');
    expect(pickDiskForCopy(topo, spec('d3'), policy, identity)).toBeUndefined();
  });
});

describe('managers started ahead of the next copies', () => {
  const topo = new Topology([
    testNode('n1', [{ uuid: 'd1' }, { uuid: 'd2' }]),
    testNode('n2', [{ uuid: 'd3' }, { uuid: 'd4', tags: ['hdd'] }]),
    testNode('n3', [{ uuid: 'd5', ready: false }, { uuid: 'd6' }]),
  ]);
  const sel = { ...policy, allowEmptyDiskSelector: false };

  it('a replacement copy prefers a disk whose manager runs, else takes any eligible disk', () => {
    expect(pickDiskForCopy(topo, spec('d1'), sel, identity, new Set(['d6']))?.disk.diskUUID).toBe('d6');
    expect(pickDiskForCopy(topo, spec('d1'), sel, identity, new Set(['d4', 'd5']))?.disk.diskUUID).toBe('d2');
    expect(pickDiskForCopy(topo, spec('d1'), sel, identity, new Set())?.disk.diskUUID).toBe('d2');
  });

  it('picks eligible disks on other nodes first, counts disks that already have a manager, and wants none once enough are covered', () => {
    // The first file is on d1 (node n1): the next two copies go to n2 and n3 before a second disk of n1.
    expect(disksToPrestart(topo, spec('d1'), sel, 2, new Set())).toEqual(['d3', 'd6']);
    expect(disksToPrestart(topo, spec('d1'), sel, 3, new Set())).toEqual(['d3', 'd6', 'd2']);
    // d3 already has a manager: one more is needed for two copies.
    expect(disksToPrestart(topo, spec('d1'), sel, 2, new Set(['d3']))).toEqual(['d6']);
    expect(disksToPrestart(topo, spec('d1'), sel, 2, new Set(['d3', 'd2']))).toEqual([]);
    // A manager on an ineligible disk (untagged selector, not ready) does not count.
    expect(disksToPrestart(topo, spec('d1'), sel, 1, new Set(['d4', 'd5']))).toEqual(['d3']);
    expect(disksToPrestart(topo, spec('d1'), sel, 0, new Set())).toEqual([]);
    expect(disksToPrestart(topo, spec('d1', 'd2', 'd3', 'd6'), sel, 2, new Set())).toEqual([]);
  });
});

describe('HA cleanup rules (backingImageCleanup)', () => {
  it('allows removing a ready copy when enough ready copies stay active', () => {
    const s = { a: st('ready'), b: st('ready'), c: st('ready') };
    expect(cleanupHaVerdict(spec('a', 'b', 'c'), s, new Set(['c']), 2)).toEqual({ ok: true });
  });

  it('refuses removing a ready copy that HA needs, with Longhorn message', () => {
    const s = { a: st('ready'), b: st('ready') };
    expect(cleanupHaVerdict(spec('a', 'b'), s, new Set(['b']), 2)).toEqual({
      ok: false,
      message: 'failed to do cleanup since there will be no enough ready files for HA after the deletion',
    });
  });

  it('counts the copies that stay, not the ones removed (Longhorn counting fault fixed)', () => {
    // Longhorn allowed this (it counted the removed in-progress copy): only one copy would remain for min 2.
    expect(cleanupHaVerdict(spec('a', 'b'), { a: st('ready'), b: st('in-progress') }, new Set(['b']), 2)).toEqual({
      ok: false,
      message: 'failed to do cleanup since there will be no enough ready/in-progress/pending files for HA after the deletion',
    });
    // An in-progress copy that stays counts.
    expect(cleanupHaVerdict(spec('a', 'b', 'c'), { a: st('ready'), b: st('in-progress'), c: st('pending') }, new Set(['c']), 2)).toEqual({ ok: true });
    expect(cleanupHaVerdict(spec('a', 'b'), { a: st('ready'), b: st('failed') }, new Set(['b']), 3)).toEqual({
      ok: false,
      message: 'cannot do cleanup since there are no enough files for HA',
    });
    // A failed copy that stays counts for the last class.
    expect(cleanupHaVerdict(spec('a', 'b', 'c'), { a: st('ready'), b: st('failed'), c: st('failed') }, new Set(['c']), 2)).toEqual({ ok: true });
    // Nothing removed and not enough copies: allowed (nothing gets worse).
    expect(cleanupHaVerdict(spec('a'), { a: st('in-progress') }, new Set(), 3)).toEqual({ ok: true });
  });
});

describe('unused copy cleanup after the wait interval', () => {
  const now = Date.parse('2026-01-01T02:00:00Z');
  const old = '2026-01-01T00:00:00Z';
  const recent = '2026-01-01T01:59:30Z';

  it('trims copies older than the wait down to minNumberOfCopies, failed first, ready last', () => {
    const specMap = spec('a', 'b', 'c', 'd');
    const status = { a: st('ready'), b: st('ready'), c: st('failed'), d: st('in-progress') };
    const lastRef = { a: old, b: old, c: old, d: old };
    const out = unusedCopiesToRemove(specMap, status, lastRef, ['a', 'b', 'c', 'd'], 1, now, 60_000);
    expect(out).toEqual(['c', 'd', 'a']);
  });

  it('keeps copies still referenced recently and copies on other nodes', () => {
    const specMap = spec('a', 'b', 'c');
    const status = { a: st('ready'), b: st('ready'), c: st('ready') };
    expect(unusedCopiesToRemove(specMap, status, { a: old, b: recent, c: old }, ['a', 'b'], 1, now, 60_000)).toEqual(['a']);
  });

  it('never goes below one copy even when minNumberOfCopies is 0', () => {
    expect(unusedCopiesToRemove(spec('a'), { a: st('ready') }, { a: old }, ['a'], 0, now, 60_000)).toEqual([]);
  });

  it('last-reference map drops disks in use and keeps earlier timestamps', () => {
    expect(updatedLastRefMap(spec('a', 'b', 'c'), { a: old }, new Set(['b']), '2026-01-02T00:00:00Z')).toEqual({ a: old, c: '2026-01-02T00:00:00Z' });
  });
});

describe('replenish and eviction', () => {
  it('counts non-failed and non-evicting copies', () => {
    const specMap = { ...spec('a', 'b', 'c'), c: { dataEngine: 'v1' as const, evictionRequested: true } };
    expect(healthyCopyCounts(specMap, { a: st('ready'), b: st('failed'), c: st('ready') })).toEqual({ nonFailed: 2, nonEvicting: 1 });
  });

  it('asks for one more copy only when a healthy source exists and the limit is not 0', () => {
    expect(needsReplenish(spec('a'), { a: st('ready') }, 2, 5)).toBe(true);
    expect(needsReplenish(spec('a'), { a: st('ready') }, 2, 0)).toBe(false);
    expect(needsReplenish(spec('a'), { a: st('failed') }, 2, 5)).toBe(false);
    expect(needsReplenish(spec('a', 'b'), { a: st('ready') }, 2, 5)).toBe(false);
  });

  it('never drops the last healthy copy and keeps copies used by replicas', () => {
    const evicting = { a: { dataEngine: 'v1' as const, evictionRequested: true } };
    expect(evictionDecision(evicting, { a: st('ready') }, new Set())).toEqual({ remove: [], keptLastHealthy: 'a' });
    const two = { ...evicting, b: { dataEngine: 'v1' as const, evictionRequested: false } };
    expect(evictionDecision(two, { a: st('ready'), b: st('in-progress') }, new Set())).toEqual({ remove: [], keptLastHealthy: 'a' });
    expect(evictionDecision(two, { a: st('ready'), b: st('ready') }, new Set())).toEqual({ remove: ['a'] });
    expect(evictionDecision(two, { a: st('ready'), b: st('ready') }, new Set(['a']))).toEqual({ remove: [] });
  });
});

describe('recovery when every copy failed', () => {
  const now = Date.parse('2026-01-01T01:00:00Z');
  it('is true only when every copy failed longer than the wait', () => {
    expect(allFilesUnavailable(spec('a', 'b'), { a: st('failed'), b: st('failed') }, now, 300_000)).toBe(true);
    expect(allFilesUnavailable(spec('a', 'b'), { a: st('failed'), b: st('failed', '2026-01-01T00:59:00Z') }, now, 300_000)).toBe(false);
    expect(allFilesUnavailable(spec('a', 'b'), { a: st('failed'), b: st('unknown') }, now, 300_000)).toBe(false);
    expect(allFilesUnavailable(spec('a', 'b'), { a: st('failed') }, now, 300_000)).toBe(false);
  });
  it('FIX: an empty spec and status map is not "all unavailable"', () => {
    expect(allFilesUnavailable({}, {}, now, 0)).toBe(false);
  });
});

describe('senders and the per-node sync limit', () => {
  it('picks a running default manager with a ready file and fewer than 3 sends', () => {
    const c = [
      { name: 'm1', running: true, defaultImage: true, file: { state: 'ready' as const, sendingReference: 3 } },
      { name: 'm2', running: false, defaultImage: true, file: { state: 'ready' as const, sendingReference: 0 } },
      { name: 'm3', running: true, defaultImage: true, file: { state: 'ready' as const, sendingReference: 2 } },
    ];
    expect(pickSender(c).sender?.name).toBe('m3');
    expect(pickSender(c.slice(0, 2))).toEqual({ anyReady: true });
    expect(pickSender([{ name: 'x', running: true, defaultImage: true, file: { state: 'in-progress' as const, sendingReference: 0 } }])).toEqual({ anyReady: false });
  });

  it('spreads receivers over equally busy senders, prefers the least busy one, and keeps a receiver on its choice', () => {
    const ready = (name: string, sendingReference: number) => ({ name, running: true, defaultImage: true, file: { state: 'ready' as const, sendingReference } });
    const senders = ['s1', 's2', 's3', 's4'].map((n) => ready(n, 0));
    const receivers = Array.from({ length: 12 }, (_, i) => `bim-receiver-${i}`);
    const chosen = receivers.map((r) => pickSender(senders, r).sender!.name);
    // every sender is chosen by some receiver (taking the first in list order sent all twelve to s1)
    expect(new Set(chosen)).toEqual(new Set(['s1', 's2', 's3', 's4']));
    // the same receiver asks the same sender while nothing changed, whatever the list order
    expect(receivers.map((r) => pickSender([...senders].reverse(), r).sender!.name)).toEqual(chosen);
    // a less busy sender wins over a busier one
    expect(pickSender([ready('busy', 2), ready('idle', 0)], 'bim-receiver-0').sender?.name).toBe('idle');
    expect(pickSender([ready('busy', 2), ready('idle', 0)], 'bim-receiver-1').sender?.name).toBe('idle');
  });

  it('a copy being received forwards when no ready copy is idle: chains form, one send each, never back to where it comes from', () => {
    const ready = (name: string, sendingReference: number) => ({ name, running: true, defaultImage: true, file: { state: 'ready' as const, sendingReference } });
    const receiving = (name: string, receivesFrom: string, sendingReference = 0, state: 'pending' | 'starting' | 'in-progress' = 'in-progress') => ({
      name,
      running: true,
      defaultImage: true,
      file: { state, sendingReference },
      receivesFrom,
    });
    // an idle ready copy is taken first
    expect(pickSender([ready('a', 0), receiving('b', 'a')], 'c').sender?.name).toBe('a');
    // the ready copy sends already: the copy it sends to forwards (its link is not shared), the ready copy is the alternative
    expect(pickSender([ready('a', 1), receiving('b', 'a')], 'c')).toEqual({ sender: receiving('b', 'a'), alternatives: [ready('a', 1)], anyReady: true });
    // a forwarder that forwards already is not taken again: the busy ready copy with room is
    expect(pickSender([ready('a', 1), receiving('b', 'a', 1)], 'c').sender?.name).toBe('a');
    // a chain a -> b -> c -> d: the next receiver e takes d, the last one
    const chain = [ready('a', 1), receiving('b', 'a', 1), receiving('c', 'b', 1), receiving('d', 'c', 0, 'pending')];
    expect(pickSender(chain, 'e').sender?.name).toBe('d');
    // no cycle: b is not chosen for a receiver it receives from, directly or through others
    expect(pickSender([ready('a', 3), receiving('b', 'x')], 'x')).toEqual({ anyReady: true });
    expect(pickSender([ready('a', 3), receiving('b', 'c'), receiving('c', 'x', 1)], 'x')).toEqual({ anyReady: true });
    expect(pickSender([ready('a', 3), receiving('b', 'c'), receiving('c', 'a', 1)], 'x').sender?.name).toBe('b');
    // a copy being received is no ready copy: with none ready, nothing is chosen (the first file is fetched)
    expect(pickSender([receiving('b', 'a')], 'c')).toEqual({ anyReady: false });
  });

  it('names the other ready copies, least busy first, as alternatives to the chosen sender', () => {
    const ready = (name: string, sendingReference: number) => ({ name, running: true, defaultImage: true, file: { state: 'ready' as const, sendingReference } });
    const notReady = { name: 'pending', running: true, defaultImage: true, file: { state: 'in-progress' as const, sendingReference: 0 } };
    const r = pickSender([ready('full', 3), ready('two', 2), notReady, ready('idle', 0), ready('one', 1)], 'bim-r');
    expect(r.sender?.name).toBe('idle');
    // a busy copy is still named: its count is a status old, and the receiver asks it last
    expect(r.alternatives?.map((c) => c.name)).toEqual(['one', 'two', 'full']);
    const many = Array.from({ length: 8 }, (_, i) => ready(`s${i}`, 0));
    expect(pickSender(many, 'bim-r').alternatives).toHaveLength(MAX_ALTERNATIVE_SENDERS);
    expect(pickSender([ready('only', 0)], 'bim-r').alternatives).toEqual([]);
  });

  it('counts the sends asked of a sender until the receiving copies are done, or the grace passed unlisted', () => {
    let t = 0;
    const g = new SenderGrants(() => t);
    g.grant('s', 'img', 'r1');
    g.grant('s', 'img', 'r2');
    g.grant('s', 'img', 'r3');
    g.grant('s', 'other', 'r1');
    const states: Record<string, string | undefined> = { r1: 'pending', r2: 'in-progress', r3: undefined };
    expect(g.live('s', 'img', (r) => states[r])).toBe(3);
    states.r1 = 'ready';
    states.r2 = 'failed';
    expect(g.live('s', 'img', (r) => states[r])).toBe(1); // r3 not listed yet: counted within the grace
    t = SYNC_GRANT_GRACE_MS + 1;
    expect(g.live('s', 'img', (r) => states[r])).toBe(0);
    expect(g.live('s', 'other', () => 'in-progress')).toBe(1);
    g.dropManager('r1');
    expect(g.live('s', 'other', () => 'in-progress')).toBe(0);
    g.grant('gone', 'img', 'r9');
    g.dropManager('gone');
    expect(g.live('gone', 'img', () => 'in-progress')).toBe(0);
  });

  it('counts the copies being received per sender address from the statuses', () => {
    const counts = receiversBySender([
      { state: 'in-progress', senderManagerAddress: 'a:8000' },
      { state: 'pending', senderManagerAddress: 'a:8000' },
      { state: 'starting', senderManagerAddress: 'b:8000' },
      { state: 'ready', senderManagerAddress: 'a:8000' },
      { state: 'in-progress', senderManagerAddress: '' },
      undefined,
    ]);
    expect(Object.fromEntries(counts)).toEqual({ 'a:8000': 2, 'b:8000': 1 });
  });

  it('calls a sender full when 3 copies are listed as being received from it', () => {
    const f = (state: string, senderManagerAddress: string) => ({ state: state as 'ready', senderManagerAddress });
    const taken = [f('in-progress', 'x'), f('in-progress', 'x'), f('in-progress', 'x')];
    expect(senderIsFull(taken, 'x')).toBe(true);
    expect(senderIsFull(taken, 'y')).toBe(false);
    // copies waiting for it (starting) or done (ready) do not take its slots
    expect(senderIsFull([...taken.slice(1), f('starting', 'x'), f('ready', 'x'), undefined], 'x')).toBe(false);
  });

  it('gives back a node slot that no sync used', () => {
    const l = new NodeSyncLimiter(() => 0);
    expect(l.tryAcquire('n', 'd1', 'a', 1)).toBe(true);
    expect(l.tryAcquire('n', 'd2', 'b', 1)).toBe(false);
    l.release('n', 'd1', 'a');
    expect(l.tryAcquire('n', 'd2', 'b', 1)).toBe(true);
  });

  it('limits concurrent syncs per node and frees slots when syncs finish', () => {
    let t = 0;
    const l = new NodeSyncLimiter(() => t);
    const files = [{ diskUUID: 'd1', biName: 'a', state: 'in-progress' }];
    expect(l.canSync('n', 'd2', 'b', 2, files)).toBe(true);
    expect(l.canSync('n', 'd3', 'c', 2, files)).toBe(false);
    // The key already counted is allowed again (FIX of Longhorn's key-order quirk).
    expect(l.canSync('n', 'd1', 'a', 2, files)).toBe(true);
    // d1/a finished (ready) and d2/b shows in-progress: one slot frees.
    const later = [{ diskUUID: 'd1', biName: 'a', state: 'ready' }, { diskUUID: 'd2', biName: 'b', state: 'in-progress' }];
    expect(l.canSync('n', 'd3', 'c', 2, later)).toBe(true);
    expect(l.canSync('n', 'd5', 'e', 2, later)).toBe(false);
    expect(l.canSync('n', 'd4', 'x', 0, files)).toBe(true);
    // A grant whose file never shows up stops counting after the grace period.
    t = 31_000;
    expect(l.canSync('n', 'd6', 'f', 2, [{ diskUUID: 'd2', biName: 'b', state: 'in-progress' }])).toBe(true);
  });
});

describe('disk conditions', () => {
  it('a disk error sets Healthy=False (reason per error), repeats change nothing, a success sets it True; scheduling skips the disk meanwhile', () => {
    const now = '2026-01-01T00:00:00Z';
    const base = [{ type: 'Ready', status: 'True', reason: '', message: '', lastProbeTime: '', lastTransitionTime: '' }];
    expect(diskErrorOf('write /d/x: EIO: i/o error')).toBe('EIO');
    expect(diskErrorOf('open backing.tmp: permission denied')).toBe('EACCES');
    const full = withDiskCondition(base, { code: 'ENOSPC', message: 'disk-1: ENOSPC' }, now)!;
    expect(full).toEqual([base[0], { type: 'Healthy', status: 'False', reason: 'DiskFull', message: 'disk-1: ENOSPC', lastProbeTime: now, lastTransitionTime: now }]);
    expect(withDiskCondition(full, { code: 'ENOSPC', message: 'disk-1: ENOSPC' }, '2026-01-01T00:01:00Z')).toBeUndefined();
    const ro = withDiskCondition(full, { code: 'EROFS', message: 'disk-1: EROFS' }, '2026-01-01T00:02:00Z')!;
    expect(ro[1]).toMatchObject({ status: 'False', reason: 'DiskReadOnly', lastTransitionTime: now });
    expect(withDiskCondition(base, undefined, now)).toBeUndefined();

    const node = testNode('n1', [{ uuid: 'd1' }, { uuid: 'd2' }]);
    node.status!.diskStatus!['d1']!.conditions = withDiskCondition(node.status!.diskStatus!['d1']!.conditions, { code: 'EIO', message: 'd1: EIO' }, now)!;
    const topo = new Topology([node]);
    expect(topo.find('d1')!.disk.healthy).toBe(false);
    expect(eligibleDiskCount(topo, policy)).toBe(1);
    expect(pickDiskForCopy(topo, {}, policy, identity)?.disk.diskUUID).toBe('d2');
    expect(pickDiskForCopy(topo, spec('d2'), policy, identity)).toBeUndefined();
    const healed = withDiskCondition(node.status!.diskStatus!['d1']!.conditions, undefined, '2026-01-01T00:05:00Z')!;
    expect(healed.find((c) => c.type === 'Healthy')).toMatchObject({ status: 'True', reason: '', message: '', lastTransitionTime: '2026-01-01T00:05:00Z' });
    expect(diskHasError(healed)).toBe(false);
    node.status!.diskStatus!['d1']!.conditions = healed;
    expect(pickDiskForCopy(new Topology([node]), spec('d2'), policy, identity)?.disk.diskUUID).toBe('d1');
  });
});

describe('onlyPassingCopyChanges (what may wait for imageTransientWriteMs)', () => {
  const copy = (state: string, progress = 0) => ({ state: state as BackingImageState, progress, message: '', lastStateTransitionTime: 't0' });
  const status = (map: Record<string, ReturnType<typeof copy>>, extra: Partial<BackingImageStatus> = {}): BackingImageStatus => ({ uuid: 'u', size: 10, diskFileStatusMap: map, ...extra });

  it('is true for copies added in, or moving between, passing states and their progress', () => {
    expect(onlyPassingCopyChanges(status({ a: copy('ready') }), status({ a: copy('ready'), b: copy('starting') }))).toBe(true);
    expect(onlyPassingCopyChanges(status({ a: copy('ready'), b: copy('starting') }), status({ a: copy('ready'), b: copy('in-progress', 40) }))).toBe(true);
    expect(onlyPassingCopyChanges(status({ b: copy('') }), status({ b: copy('pending') }))).toBe(true);
  });

  it('is false for a copy ready, failed or removed, and for any other field', () => {
    expect(onlyPassingCopyChanges(status({ b: copy('in-progress') }), status({ b: copy('ready', 100) }))).toBe(false);
    expect(onlyPassingCopyChanges(status({ b: copy('in-progress') }), status({ b: copy('failed') }))).toBe(false);
    expect(onlyPassingCopyChanges(status({ a: copy('ready'), b: copy('starting') }), status({ a: copy('ready') }))).toBe(false);
    expect(onlyPassingCopyChanges(status({ b: copy('starting') }), status({ b: copy('in-progress') }, { size: 11 }))).toBe(false);
    expect(onlyPassingCopyChanges(status({ b: copy('starting') }), status({ b: copy('ready-for-transfer') }))).toBe(false);
  });
});

describe('nodeChangeMatters (which Node events re-run the data sources and managers of the node)', () => {
  const disks = [{ uuid: 'disk-1' }, { uuid: 'disk-2' }];
  const node = testNode('node-1', disks);
  it('a resync, or a status write of what the controllers do not read, does not', () => {
    expect(nodeChangeMatters('RESYNC', node, node)).toBe(false);
    const figures = structuredClone(node);
    figures.status!.diskStatus!['disk-1'] = { ...figures.status!.diskStatus!['disk-1'], storageAvailable: 123, storageScheduled: 45 };
    figures.status!.conditions = figures.status!.conditions!.map((c) => ({ ...c, lastProbeTime: '2026-01-01T00:00:00Z', message: 'still fine' }));
    expect(nodeChangeMatters('MODIFIED', figures, node)).toBe(false);
  });
  it("an added or deleted node, its readiness, a disk's readiness, health, path or eviction does", () => {
    expect(nodeChangeMatters('ADDED', node, undefined)).toBe(true);
    expect(nodeChangeMatters('DELETED', node, undefined)).toBe(true);
    expect(nodeChangeMatters('MODIFIED', testNode('node-1', disks, { ready: false }), node)).toBe(true);
    expect(nodeChangeMatters('MODIFIED', testNode('node-1', [{ uuid: 'disk-1', ready: false }, { uuid: 'disk-2' }]), node)).toBe(true);
    expect(nodeChangeMatters('MODIFIED', testNode('node-1', [{ uuid: 'disk-1', path: '/elsewhere' }, { uuid: 'disk-2' }]), node)).toBe(true);
    expect(nodeChangeMatters('MODIFIED', testNode('node-1', [{ uuid: 'disk-1', evictionRequested: true }, { uuid: 'disk-2' }]), node)).toBe(true);
    expect(nodeChangeMatters('MODIFIED', testNode('node-1', [{ uuid: 'disk-1' }]), node)).toBe(true);
    const full = structuredClone(node);
    full.status!.diskStatus!['disk-2']!.conditions = [...full.status!.diskStatus!['disk-2']!.conditions!, { type: 'Healthy', status: 'False', reason: 'DiskFull', message: 'ENOSPC' }];
    expect(nodeChangeMatters('MODIFIED', full, node)).toBe(true);
  });
});
