import { mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from '@jest/globals';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import type { KubeObject, ResourceKind, Stored } from '@bis/datastore';
import { BackingImageDataSourceKind, BackingImageKind, BackingImageManagerKind, BackupBackingImageKind, BackupTargetKind, NodeKind, ReplicaKind, SettingKind, type BackingImage } from './kinds.js';
import { Annotation, replicaLabels } from './names.js';
import { FAST_TIMING, NS, startHarness, waitFor, type Harness } from './test-support/harness.js';

const URL = 'http://127.0.0.1:8080/parrot.raw';
const DATA = 'parrot-image-bytes-'.repeat(64);

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

const getBI = (name: string) => h!.store.get(BackingImageKind, name, NS);
const readyDisks = (bi: BackingImage) => Object.entries(bi.status?.diskFileStatusMap ?? {}).filter(([, s]) => s.state === 'ready').map(([d]) => d);
const waitReady = (name: string, n: number, timeoutMs = 10_000) =>
  waitFor(`${n} ready copies of ${name}`, async () => {
    const bi = await getBI(name);
    return readyDisks(bi).length === n && Object.keys(bi.spec?.diskFileSpecMap ?? {}).length === n ? bi : undefined;
  }, timeoutMs);

async function setSetting(name: string, value: string) {
  await h!.store.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name, namespace: NS }, value });
}

/** Samples every 2 ms, until stopped, how many copies the simulated managers receive from a sender at once (`max`: the most). */
function samplePassing(): { readonly max: number; stop: () => void } {
  let max = 0;
  const timer = setInterval(() => {
    let n = 0;
    for (const m of h!.sim.managers.values()) for (const f of m.files.values()) if (['pending', 'starting', 'in-progress'].includes(f.state) && f.sender) n++;
    max = Math.max(max, n);
  }, 2);
  return {
    get max() {
      return max;
    },
    stop: () => clearInterval(timer),
  };
}

/** Every version of `kind` the store commits (created or changed) until `stop()`, which returns them. */
function recordVersions<T extends KubeObject>(kind: ResourceKind<T>): { stop: () => Promise<Stored<T>[]> } {
  const versions: Stored<T>[] = [];
  const stopWatch = new AbortController();
  const watching = (async () => {
    for await (const ev of h!.store.watch(kind, { namespace: NS, signal: stopWatch.signal })) {
      if (ev.type === 'ADDED' || ev.type === 'MODIFIED') versions.push(ev.object);
    }
  })().catch(() => undefined);
  return {
    stop: async () => {
      stopWatch.abort();
      await watching;
      return versions;
    },
  };
}

/** A new harness; every version of `kind` the store commits while the image `parrot` is created and reaches `copies` ready copies. */
async function versionsWhileCreating<T extends KubeObject>(kind: ResourceKind<T>, copies: number): Promise<Stored<T>[]> {
  h = await startHarness();
  const sum = h.sim.serve(URL, DATA);
  const recording = recordVersions(kind);
  await h.cm.actions.create({ name: 'parrot', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: copies });
  await waitReady('parrot', copies);
  return recording.stop();
}

describe('backing image controllers over the embedded store', () => {
  it('downloads once, reaches ready on minNumberOfCopies different disks, and releases the data source', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    const created = await h.cm.actions.create({ name: 'parrot', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 2 });
    expect(created.status?.uuid ?? '').toBe('');
    const bi = await waitReady('parrot', 2);
    expect(new Set(readyDisks(bi)).size).toBe(2);
    expect(bi.status?.checksum).toBe(sum);
    expect(bi.status?.size).toBe(DATA.length);
    expect(bi.status?.uuid).toMatch(/^[0-9a-f]{8}$/);
    expect(h.sim.downloads.get(URL)).toBe(1);
    const bids = await h.store.get(BackingImageDataSourceKind, 'parrot', NS);
    expect(bids.spec?.fileTransferred).toBe(true);
    await waitFor('data source workload removed', () => !h!.sim.dataSources.has('parrot'));
    const bims = (await h.store.list(BackingImageManagerKind, { namespace: NS })).items;
    expect(bims).toHaveLength(2);
    expect(bims.every((m) => m.status?.currentState === 'running' && m.spec?.backingImages?.['parrot'] === bi.status?.uuid)).toBe(true);
    expect(h.sim.syncCalls).toHaveLength(1);
    expect((await h.cm.events.list({ name: 'parrot', reason: 'Update' })).some((e) => e.message.startsWith('Initialized UUID to'))).toBe(true);
  });

  it("sees each state of a data source when the data source reaches it (waiting there for a change), and polls one that answers at once (Longhorn's)", async () => {
    // an interval poll that never comes within the test: only the watch, or the first polls of the ramp, see the states
    h = await startHarness(undefined, { timing: { ...FAST_TIMING, dataSourcePollMs: 600_000 } });
    const recording = recordVersions(BackingImageDataSourceKind);
    await h.cm.actions.create({ name: 'parrot', sourceType: 'download', parameters: { url: URL }, expectedChecksum: h.sim.serve(URL, DATA), minNumberOfCopies: 1 });
    await waitReady('parrot', 1);
    // starting → in-progress → ready-for-transfer → ready (taken over): answered by waits (a state that lasts less
    // than the simulation's 5 ms look may be passed over, and the release may end the last wait)
    expect(h.sim.dataSourceWaitCalls.changed).toBeGreaterThanOrEqual(2);
    const changedBefore = h.sim.dataSourceWaitCalls.changed;
    h.sim.dataSourceWaits = false;
    const other = 'http://127.0.0.1:8080/other.raw';
    await h.cm.actions.create({ name: 'other', sourceType: 'download', parameters: { url: other }, expectedChecksum: h.sim.serve(other, DATA), minNumberOfCopies: 1 });
    await waitReady('other', 1);
    expect(h.sim.dataSourceWaitCalls.changed).toBe(changedBefore);
    const states = (await recording.stop()).map((v) => `${v.metadata.name} ${v.status?.currentState ?? ''}`);
    for (const name of ['parrot', 'other']) expect(states).toEqual(expect.arrayContaining([`${name} ready-for-transfer`, `${name} ready`]));
  });

  it('releases a data source once its manager has the file, before the image marks it transferred; a restart then does not take it for a lost workload', async () => {
    h = await startHarness();
    // the image's mark (spec.fileTransferred) fails (and is retried) until the test lets it through
    let held = true;
    const letThrough = () => (held = false);
    const update = h.store.update.bind(h.store);
    h.store.update = (async (kind: ResourceKind<KubeObject>, obj: KubeObject) => {
      if (held && kind === BackingImageDataSourceKind && (obj as { spec?: { fileTransferred?: boolean } }).spec?.fileTransferred) throw new Error('held by the test');
      return update(kind, obj);
    }) as typeof h.store.update;
    await h.cm.actions.create({ name: 'parrot', sourceType: 'download', parameters: { url: URL }, expectedChecksum: h.sim.serve(URL, DATA), minNumberOfCopies: 1 });
    // the workload is deleted, then the reconcile's status write says so (no ip)
    const released = await waitFor('the data source released while the file is not marked transferred', async () => {
      const b = await h!.store.get(BackingImageDataSourceKind, 'parrot', NS);
      return !h!.sim.dataSources.has('parrot') && b.status?.ip === '' && !b.spec?.fileTransferred ? b : undefined;
    });
    expect(released.status?.currentState).toBe('ready');
    await h.restartControllers();
    // the restarted controllers look at it (resync every second here) and leave it ready
    await new Promise((r) => setTimeout(r, 1500));
    expect((await h.store.get(BackingImageDataSourceKind, 'parrot', NS)).status?.currentState).toBe('ready');
    letThrough();
    await waitReady('parrot', 1);
    await waitFor('the file marked transferred', async () => (await h!.store.get(BackingImageDataSourceKind, 'parrot', NS)).spec?.fileTransferred === true);
    expect(h.sim.downloads.get(URL)).toBe(1);
    expect(await h.cm.events.list({ name: 'parrot', reason: 'Failed' })).toEqual([]);
  });

  it('a data source whose workload runs as soon as it started gets its address and ip in the status write of its start', async () => {
    const seen = await versionsWhileCreating(BackingImageDataSourceKind, 1);
    // the first version that shows the start (the download's parameters, no message) already has the workload's ip
    // and address: no write of a started data source without them
    const started = seen.find((b) => b.status?.runningParameters?.['url'] === URL && b.status?.message === '');
    expect(started?.status?.ip).toBe('127.0.0.1');
    expect(started?.metadata.annotations?.[Annotation.Address]).toMatch(/^127\.0\.0\.1:\d+$/);
    expect(seen.filter((b) => b.status?.runningParameters?.['url'] === URL && !b.status?.ip && (b.status?.currentState ?? '') !== 'ready')).toEqual([]);
  });

  it("the placed copies' last-reference times are written with the placement's status, not in a write of their own", async () => {
    const versions = await versionsWhileCreating(BackingImageKind, 3);
    const onlyLastRefs = versions.slice(1).filter((v, i) => {
      const prev = versions[i]!;
      if (JSON.stringify(prev.spec) !== JSON.stringify(v.spec)) return false;
      const keys = new Set([...Object.keys(prev.status ?? {}), ...Object.keys(v.status ?? {})]);
      const differing = [...keys].filter((k) => JSON.stringify((prev.status as Record<string, unknown> | undefined)?.[k]) !== JSON.stringify((v.status as Record<string, unknown> | undefined)?.[k]));
      return differing.length === 1 && differing[0] === 'diskLastRefAtMap';
    });
    expect(onlyLastRefs.map((v) => v.status?.diskLastRefAtMap)).toEqual([]);
    expect(Object.keys((await getBI('parrot')).status?.diskLastRefAtMap ?? {})).toHaveLength(3);
  });

  it('a data source that is ready soon after it started has no in-progress write; a long one shows its progress', async () => {
    h = await startHarness(undefined, { timing: { ...FAST_TIMING, dataSourceTransientWriteMs: 1500 } });
    const recording = recordVersions(BackingImageDataSourceKind);
    // ready 100 ms after it started: within the 1.5 s, the in-progress answer is not written
    h.sim.transferMs = 100;
    const quick = 'http://127.0.0.1:8080/quick.raw';
    await h.cm.actions.create({ name: 'quick', sourceType: 'download', parameters: { url: quick }, expectedChecksum: h.sim.serve(quick, DATA), minNumberOfCopies: 1 });
    await waitReady('quick', 1);
    // in progress for 4 s: written once the 1.5 s since the start's write have passed
    h.sim.transferMs = 4000;
    const slow = 'http://127.0.0.1:8080/slow.raw';
    await h.cm.actions.create({ name: 'slow', sourceType: 'download', parameters: { url: slow }, expectedChecksum: h.sim.serve(slow, DATA), minNumberOfCopies: 1 });
    await waitReady('slow', 1);
    // each data source's states in the order they were written (repeats folded)
    const states = new Map<string, string[]>();
    for (const v of await recording.stop()) {
      const list = states.get(v.metadata.name) ?? [];
      const st = v.status?.currentState ?? '';
      if (list[list.length - 1] !== st) list.push(st);
      states.set(v.metadata.name, list);
    }
    expect(states.get('quick')).toContain('ready-for-transfer');
    expect(states.get('quick')).not.toContain('in-progress');
    expect(states.get('slow')).toEqual(expect.arrayContaining(['in-progress', 'ready-for-transfer']));
    expect(states.get('slow')!.indexOf('in-progress')).toBeLessThan(states.get('slow')!.indexOf('ready-for-transfer'));
  }, 30_000);

  it('starts the managers of the next copies while the first file is prepared, places the copies there, and deletes what no copy used', async () => {
    h = await startHarness([{ uuid: 'disk-1' }, { uuid: 'disk-2' }, { uuid: 'disk-3' }, { uuid: 'disk-4' }]);
    const managersNow = async () => (await h!.store.list(BackingImageManagerKind, { namespace: NS })).items;
    // Every version of the image's spec map, to see how the copies were placed.
    const specSizes: number[] = [];
    const stopWatch = new AbortController();
    const watching = (async () => {
      for await (const ev of h!.store.watch(BackingImageKind, { namespace: NS, signal: stopWatch.signal })) {
        if (ev.type !== 'BOOKMARK' && ev.object.metadata.name === 'early') specSizes.push(Object.keys(ev.object.spec?.diskFileSpecMap ?? {}).length);
      }
    })();
    await h.cm.actions.create({ name: 'early', sourceType: 'upload', minNumberOfCopies: 3 });
    // The upload is not sent yet: the first file waits, and the managers of two more disks run already.
    const ahead = await waitFor('two managers started ahead of the first file', async () => {
      const ms = (await managersNow()).filter((m) => m.metadata.annotations?.['bis.longhorn.io/prestarted-for'] === 'early');
      return ms.length === 2 && ms.every((m) => m.status?.currentState === 'running' && Object.keys(m.spec?.backingImages ?? {}).length === 0) ? ms : undefined;
    });
    const bi = await getBI('early');
    expect(Object.keys(bi.spec?.diskFileSpecMap ?? {})).toHaveLength(1);
    expect(readyDisks(bi)).toHaveLength(0);
    const firstDisk = Object.keys(bi.spec!.diskFileSpecMap!)[0]!;
    expect(ahead.map((m) => m.spec?.diskUUID)).not.toContain(firstDisk);
    h.sim.upload('early', 'uploaded-early');
    const done = await waitReady('early', 3);
    // The copies went to the disks whose managers were started ahead; no fourth manager was started.
    expect(new Set(readyDisks(done))).toEqual(new Set([firstDisk, ...ahead.map((m) => m.spec!.diskUUID!)]));
    expect((await managersNow()).map((m) => m.spec?.diskUUID).sort()).toEqual([firstDisk, ...ahead.map((m) => m.spec!.diskUUID!)].sort());
    // The very managers started ahead took the copies: none was deleted and created again.
    const uids = new Set((await managersNow()).map((m) => m.metadata.uid));
    for (const m of ahead) expect(uids.has(m.metadata.uid)).toBe(true);
    expect(h.logs.filter((l) => l.includes('deleting manager'))).toEqual([]);
    // Both missing copies were placed in one write once the first file was ready (Longhorn places one per reconcile).
    stopWatch.abort();
    await watching;
    expect(specSizes).toContain(3);
    expect(specSizes).not.toContain(2);

    // An image deleted while its first file waits takes its pre-started managers with it.
    await h.cm.actions.create({ name: 'gone', sourceType: 'upload', minNumberOfCopies: 4 });
    await waitFor('a manager started ahead on the fourth disk', async () => (await managersNow()).some((m) => m.metadata.annotations?.['bis.longhorn.io/prestarted-for'] === 'gone' && m.status?.currentState === 'running'));
    expect(h.sim.managers.size).toBe(4);
    await h.cm.actions.delete('gone');
    await waitFor('the pre-started manager deleted with its image', async () => (await managersNow()).length === 3 && h!.sim.managers.size === 3);
    expect((await managersNow()).every((m) => m.spec?.backingImages?.['early'])).toBe(true);
    expect(h.logs.some((l) => l.includes('started ahead'))).toBe(true);
  });

  it('a wrong checksum fails the first file with both checksums and cleans it up', async () => {
    h = await startHarness();
    const actual = h.sim.serve(URL, DATA);
    const wrong = actual.slice(1) + actual[0];
    await h.cm.actions.create({ name: 'bad', sourceType: 'download', parameters: { url: URL }, expectedChecksum: wrong, minNumberOfCopies: 1 });
    const bi = await waitFor('failed-and-cleanup', async () => {
      const b = await getBI('bad');
      return Object.values(b.status?.diskFileStatusMap ?? {}).some((s) => s.state === 'failed-and-cleanup') ? b : undefined;
    });
    const entry = Object.values(bi.status!.diskFileStatusMap!)[0]!;
    expect(entry.message).toContain(wrong);
    expect(entry.message).toContain(actual);
    expect(readyDisks(bi)).toHaveLength(0);
  });

  it('upload: the data source waits in pending, then the uploaded file becomes ready', async () => {
    h = await startHarness();
    await h.cm.actions.create({ name: 'up', sourceType: 'upload', minNumberOfCopies: 1 });
    await expect(h.cm.actions.uploadTarget('missing')).rejects.toThrow('cannot find pod for backing image data source missing');
    const address = await waitFor('upload target', () => h!.cm.actions.uploadTarget('up'));
    expect(address).toMatch(/^127\.0\.0\.1:\d+$/);
    h.sim.upload('up', 'uploaded-bytes');
    const bi = await waitReady('up', 1);
    expect(bi.status?.size).toBe('uploaded-bytes'.length);
    await expect(h.cm.actions.uploadTarget('up')).rejects.toThrow();
  });

  it('disk eviction moves the copy; evicting the only eligible disk keeps it with a FailedDeleting event', async () => {
    h = await startHarness([{ uuid: 'disk-1', tags: ['ssd'] }, { uuid: 'disk-2' }, { uuid: 'disk-3', tags: ['ssd'] }]);
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'ev', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 1, diskSelector: ['ssd'] });
    const first = readyDisks(await waitReady('ev', 1))[0]!;
    const other = first === 'disk-1' ? 'disk-3' : 'disk-1';
    const evictDisk = async (disk: string, allowOthers: boolean) => {
      const node = await h!.store.get(NodeKind, 'node-1', NS);
      const disks = structuredClone(node.spec!.disks!);
      for (const [n, d] of Object.entries(disks)) {
        if (n === disk) Object.assign(d, { evictionRequested: true, allowScheduling: false });
        else if (!allowOthers && d.tags?.includes('ssd')) d.allowScheduling = false;
      }
      await h!.store.update(NodeKind, { ...node, spec: { ...node.spec, disks } });
    };
    await evictDisk(first, true);
    const moved = await waitFor('copy moved', async () => {
      const b = await getBI('ev');
      const r = readyDisks(b);
      return r.length === 1 && r[0] === other && !b.spec?.diskFileSpecMap?.[first] ? b : undefined;
    });
    expect(Object.keys(moved.spec!.diskFileSpecMap!)).toEqual([other]);
    expect((await h.cm.events.list({ name: 'ev', reason: 'EvictionUserRequested' })).length).toBeGreaterThan(0);

    // Now the remaining copy's disk is evicted too, and no other ssd disk may take it.
    await evictDisk(other, false);
    await waitFor('FailedDeleting event', async () =>
      (await h!.cm.events.list({ name: 'ev', reason: 'FailedDeleting' })).some((e) => e.message.includes('since there is no other healthy backing image copy')),
    );
    const kept = await getBI('ev');
    expect(readyDisks(kept)).toEqual([other]);
  });

  it('cleanup action: refused per the HA rules and for disks in use, accepted otherwise; unused copies are trimmed after the wait', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'ha', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 3 });
    const bi = await waitReady('ha', 3);
    const [d1, d2] = readyDisks(bi) as [string, string];
    await expect(h.cm.actions.cleanupDiskFiles('ha', [d1])).rejects.toThrow('failed to do cleanup since there will be no enough ready files for HA after the deletion');
    await h.store.create(ReplicaKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Replica', metadata: { name: 'r1', namespace: NS, labels: replicaLabels('ha', d2) }, spec: { backingImage: 'ha', nodeID: 'node-1', diskID: d2 } });
    await expect(h.cm.actions.cleanupDiskFiles('ha', [d2])).rejects.toThrow(`cannot clean up backing image ha in disk ${d2} since there is at least one replica using it`);
    await expect(h.cm.actions.delete('ha')).rejects.toThrow('replicas using it');
    await expect(h.cm.actions.updateMinNumberOfCopies('ha', 0)).rejects.toThrow('minimum number of backing image copies 0 must larger than 0');
    await h.cm.actions.updateMinNumberOfCopies('ha', 2);
    const after = await h.cm.actions.cleanupDiskFiles('ha', [d1]);
    expect(after.spec?.diskFileSpecMap?.[d1]).toBeUndefined();
    await waitReady('ha', 2);
    await waitFor('file removed from disk', () => ![...(h!.sim.disks.get(d1)?.keys() ?? [])].length);

    // Lower the minimum to 1 and the wait to 0 minutes: the node controller trims the copy no replica uses.
    await setSetting('backing-image-cleanup-wait-interval', '0');
    await h.cm.actions.updateMinNumberOfCopies('ha', 1);
    const trimmed = await waitReady('ha', 1);
    expect(readyDisks(trimmed)).toEqual([d2]);
  });

  it('delete removes every file, manager and data source; it is refused while replicas use the image', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'gone', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 2 });
    await waitReady('gone', 2);
    await h.cm.actions.delete('gone');
    await waitFor('backing image deleted', async () => (await h!.store.list(BackingImageKind, { namespace: NS })).items.length === 0);
    await waitFor('managers deleted', async () => (await h!.store.list(BackingImageManagerKind, { namespace: NS })).items.length === 0);
    expect((await h.store.list(BackingImageDataSourceKind, { namespace: NS })).items).toHaveLength(0);
    expect([...h.sim.disks.values()].every((d) => d.size === 0)).toBe(true);
    expect(h.sim.managers.size).toBe(0);
  });

  it('a deleted manager takes with it a file its status has not shown yet (a Fetch that returned just before)', async () => {
    // The monitor Lists only after a change it was told of: a file registered without telling it stays out of the
    // status, as one does between a Fetch's return and the monitor's next List.
    h = await startHarness([{ uuid: 'disk-1' }], { timing: { ...FAST_TIMING, managerForcedListTicks: 1_000_000 } });
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'only', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 1 });
    await waitReady('only', 1);
    const m = [...h.sim.managers.values()][0]!;
    const late = { name: 'late', uuid: 'u-late', size: 1, checksum: '', state: 'ready', progress: 100, message: '', sendingReference: 0 };
    m.files.set('late', late);
    h.sim.disks.get('disk-1')!.set('late-u-late', late);
    const bim = (await h.store.list(BackingImageManagerKind, { namespace: NS })).items[0]!;
    expect(Object.keys(bim.status?.backingImageFileMap ?? {})).toEqual(['only']);
    await h.cm.actions.delete('only');
    await waitFor('managers deleted', async () => (await h!.store.list(BackingImageManagerKind, { namespace: NS })).items.length === 0);
    expect([...h.sim.disks.get('disk-1')!.keys()]).toEqual([]);
  });

  it('a Sync names the other ready copies as senders to ask when the chosen one is at its sending limit', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'alts', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 2 });
    await waitReady('alts', 2);
    expect(h.sim.syncCalls.map((c) => c.alternatives)).toEqual([[]]); // one ready copy: no one else to name
    await h.cm.actions.updateMinNumberOfCopies('alts', 3);
    await waitReady('alts', 3);
    const third = h.sim.syncCalls[1]!;
    const readyBefore = h.sim.syncCalls[0]!;
    // the third copy's Sync names one of the two ready copies as its sender and the other as the alternative
    expect(new Set([third.from, ...third.alternatives])).toEqual(new Set([readyBefore.from, readyBefore.to]));
    expect(third.alternatives).toHaveLength(1);
  });

  it('copies being received forward to the next ones: six copies fill as a chain, each sender asked for one send', async () => {
    h = await startHarness(Array.from({ length: 6 }, (_, i) => ({ uuid: `disk-${i + 1}` })));
    h.sim.transferMs = 400;
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'wide', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 6 });
    await waitReady('wide', 6, 20_000);
    const calls = h.sim.syncCalls.filter((c) => c.bi === 'wide');
    expect(calls).toHaveLength(5);
    const first = calls[0]!.from;
    // the first copy sends to one; every later copy is sent by a copy that was itself being received (asked before)
    expect(new Set(calls.map((c) => c.from)).size).toBe(5);
    expect(calls.slice(1).every((c, i) => c.from !== first && calls.slice(0, i + 1).some((e) => e.to === c.from))).toBe(true);
    // each Sync names the ready copy as the alternative to ask when its forwarder cannot send
    expect(calls.slice(1).every((c) => c.alternatives.includes(first))).toBe(true);
  });

  it('converges when the copies being received do not forward: each receiver takes the ready copy its Sync names', async () => {
    h = await startHarness(Array.from({ length: 6 }, (_, i) => ({ uuid: `disk-${i + 1}` })));
    h.sim.transferMs = 400;
    h.sim.forwarding = false;
    h.sim.enforceSendingLimit = true;
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'wide', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 6 });
    await waitReady('wide', 6, 20_000);
    const sends = h.sim.sends.filter((c) => c.bi === 'wide');
    const calls = h.sim.syncCalls.filter((c) => c.bi === 'wide');
    expect(sends).toHaveLength(5);
    // the controller chose copies being received, which refused: the sends came from the ready alternatives named
    const chosenForwarders = calls.filter((c) => c.from !== calls[0]!.from && c.alternatives.includes(calls[0]!.from));
    expect(chosenForwarders.length).toBeGreaterThan(0);
    for (const c of chosenForwarders) expect(sends.find((x) => x.to === c.to)?.from).not.toBe(c.from);
  });

  it("counts the copies other controllers' managers list as received from a sender (a restarted controller has no grants)", async () => {
    h = await startHarness(Array.from({ length: 6 }, (_, i) => ({ uuid: `disk-${i + 1}` })));
    h.sim.transferMs = 1500;
    h.sim.reportSends = false;
    h.sim.forwarding = false; // the receivers take the ready copy the Syncs name as the alternative
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'listed', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 4 });
    // three copies are received from the first one, and their managers' statuses say so
    await waitFor('three receivers listed', async () => {
      const bims = await h!.store.list(BackingImageManagerKind, { namespace: NS });
      const n = bims.items.filter((m) => m.status?.backingImageFileMap?.listed?.state === 'in-progress' && m.status.backingImageFileMap.listed.senderManagerAddress).length;
      return n === 3 ? true : undefined;
    });
    const before = h.sim.syncCalls.length;
    await h.restartControllers();
    await h.cm.actions.updateMinNumberOfCopies('listed', 6);
    await waitReady('listed', 6, 20_000);
    const first = h.sim.syncCalls.find((c) => c.bi === 'listed')!.from;
    // the first copy's status says it sends nothing (reportSends false), but three copies list it as their sender:
    // the restarted controller does not take it as an idle sender
    const after = h.sim.syncCalls.slice(before).filter((c) => c.bi === 'listed');
    expect(after.length).toBeGreaterThanOrEqual(2);
    expect(after.every((c) => c.from !== first)).toBe(true);
  });

  it("writes a manager's progress-only changes at most once per managerProgressWriteMs, and the latest one at the end of the wait", async () => {
    h = await startHarness(undefined, { timing: { ...FAST_TIMING, managerProgressWriteMs: 1500 } });
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'prog', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 1 });
    await waitReady('prog', 1);
    h.sim.transferMs = 60_000; // the sync stays in progress for the whole test
    await h.cm.actions.updateMinNumberOfCopies('prog', 2);
    const call = await waitFor('a sync started', () => h!.sim.syncCalls.find((c) => c.bi === 'prog'));
    const progressOf = async () => (await h!.store.get(BackingImageManagerKind, call.to, NS)).status?.backingImageFileMap?.prog;
    await waitFor('the copy shown in progress', async () => ((await progressOf())?.state === 'in-progress' ? true : undefined));
    // let the write that showed the state age, then report progress every 40 ms for 0.6 s
    await new Promise((r) => setTimeout(r, 1600));
    const seen = new Set<number>();
    for (let p = 5; p <= 80; p += 5) {
      h.sim.setProgress(call.to, 'prog', p);
      await new Promise((r) => setTimeout(r, 40));
      seen.add((await progressOf())?.progress ?? -1);
    }
    // the first progress change is written at once (the last write is older than the wait), the later ones wait
    expect(seen.size).toBeLessThanOrEqual(2);
    // the latest progress is written once the wait is over
    await waitFor('the latest progress written', async () => ((await progressOf())?.progress === 80 ? true : undefined), 5000);
  });

  it("writes a backing image's copies in passing states at most once per imageTransientWriteMs after its last status write, a ready copy at once", async () => {
    h = await startHarness(undefined, { timing: { ...FAST_TIMING, imageTransientWriteMs: 1500 } });
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'pass', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 1 });
    await waitReady('pass', 1);
    // Every status the store holds for the image from now on, with the time it was seen.
    const seen: { at: number; states: string[] }[] = [];
    const stopWatch = new AbortController();
    const watching = (async () => {
      for await (const ev of h!.store.watch(BackingImageKind, { namespace: NS, signal: stopWatch.signal })) {
        if (ev.type !== 'BOOKMARK' && ev.object.metadata.name === 'pass') seen.push({ at: performance.now(), states: Object.values(ev.object.status?.diskFileStatusMap ?? {}).map((f) => f.state ?? '') });
      }
    })();
    const lastWriteBefore = performance.now();
    h.sim.transferMs = 60_000; // the second copy stays in progress
    await h.cm.actions.updateMinNumberOfCopies('pass', 2);
    await waitFor('a sync started', () => h!.sim.syncCalls.find((c) => c.bi === 'pass'));
    // the copy in progress is written, but not before the wait after the image's last status write
    await waitFor('the second copy shown in a passing state', async () => (seen.some((v) => v.states.length === 2 && v.states.some((x) => x === 'starting' || x === 'in-progress')) ? true : undefined), 10_000);
    const firstPassing = seen.find((v) => v.states.length === 2 && v.states.some((x) => x === 'starting' || x === 'in-progress'))!;
    // the write before it placed the copy (spec, then the status with the new disk's last-reference time): the copy's
    // passing states waited for the interval after it
    const before = seen.filter((v) => v.at < firstPassing.at).at(-1)!;
    expect(before.at).toBeGreaterThan(lastWriteBefore);
    expect(firstPassing.at - before.at).toBeGreaterThanOrEqual(1400);
    stopWatch.abort();
    await watching;
  });

  it('tells the copies placed together in one event, and the virtual size once', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'told', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 3 });
    await waitReady('told', 3);
    const syncing = await h.cm.events.list({ name: 'told', reason: 'Syncing' });
    expect(syncing).toHaveLength(1);
    expect(syncing[0]!.count).toBe(1);
    expect(syncing[0]!.message).toMatch(/^Adding 2 copies of backing image told: on disk \S+ \(disk-\d\) on node node-1, on disk \S+ \(disk-\d\) on node node-1$/);
    // the size comes with the data source's status; the virtual size from the managers, told once
    const updates = (await h.cm.events.list({ name: 'told', reason: 'Update' })).filter((u) => u.message.startsWith('Set virtualSize'));
    expect(updates.map((u) => [u.message, u.count])).toEqual([[`Set virtualSize to ${DATA.length}`, 1]]);
  });

  it('a controller restart mid-download converges without a second download', async () => {
    h = await startHarness();
    h.sim.transferMs = 600;
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'restart', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 2 });
    await waitFor('download in progress', async () => (await h!.store.get(BackingImageDataSourceKind, 'restart', NS)).status?.currentState === 'in-progress');
    await h.restartControllers();
    await waitReady('restart', 2, 15_000);
    expect(h.sim.downloads.get(URL)).toBe(1);
  });

  it('a manager killed mid-sync is restarted and the copy converges', async () => {
    h = await startHarness();
    h.sim.transferMs = 400;
    const sum = h.sim.serve(URL, DATA);
    await h.cm.actions.create({ name: 'kill', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 2 });
    const call = await waitFor('a sync started', () => h!.sim.syncCalls[0]);
    const killedDisk = (await h.store.get(BackingImageManagerKind, call.to, NS)).spec?.diskUUID ?? '';
    h.sim.kill(call.to);
    // The killed manager's copy converges once its manager is back. Meanwhile a third copy may have been added
    // elsewhere, since the failed copy did not count as healthy: that is the replenishment doing its job, and the
    // unused-copy cleanup removes the extra copy later.
    const bi = await waitFor('the killed manager\'s copy ready again, with at least 2 ready copies', async () => {
      const b = await getBI('kill');
      return readyDisks(b).includes(killedDisk) && readyDisks(b).length >= 2 ? b : undefined;
    }, 15_000);
    expect(h.sim.syncCalls.length).toBeGreaterThanOrEqual(2);
    expect(h.sim.downloads.get(URL)).toBe(1);
    expect(h.sim.managers.has(call.to)).toBe(true);
    expect(readyDisks(bi).length).toBeGreaterThanOrEqual(2);
  });

  it('without resyncs, a ready copy that fails later is replaced: its manager looks at the images that changed, not only at every image', async () => {
    // resync off: only the changes that concern a copy bring its manager's reconcile to look at it again
    h = await startHarness(undefined, { resyncMs: 0 });
    const sum = h.sim.serve(URL, DATA);
    for (const name of ['steady-a', 'steady-b']) {
      await h.cm.actions.create({ name, sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 2 });
    }
    await waitReady('steady-a', 2);
    await waitReady('steady-b', 2);
    const holder = [...h.sim.managers.values()].find((m) => m.files.get('steady-a')?.state === 'ready' && m.files.get('steady-b')?.state === 'ready');
    const mgr = holder ?? [...h.sim.managers.values()].find((m) => m.files.get('steady-a')?.state === 'ready')!;
    const disk = mgr.diskUUID;
    const untouched = [...h.sim.managers.values()].find((m) => m.files.get('steady-b')?.state === 'ready')!;
    const bFile = untouched.files.get('steady-b');
    const syncsBefore = h.sim.syncCalls.filter((c) => c.bi === 'steady-a').length;
    h.sim.failFile(mgr.name, 'steady-a', 'checksum mismatch found by the scrub');
    const failedFile = h.sim.managers.get(mgr.name)!.files.get('steady-a');
    // The failed file is deleted and synced again (the disk stays in the image's spec while the copy is replaced; a
    // third copy may be placed meanwhile, since the failed one did not count as healthy).
    const bi = await waitFor('the failed copy replaced, at least two ready copies of steady-a', async () => {
      const b = await getBI('steady-a');
      const states = Object.values(b.status?.diskFileStatusMap ?? {}).map((f) => f.state);
      const now = h!.sim.managers.get(mgr.name)?.files.get('steady-a');
      return readyDisks(b).length >= 2 && !states.includes('failed') && now !== failedFile && (now === undefined || now.state === 'ready') ? b : undefined;
    }, 15_000);
    expect(readyDisks(bi).length).toBeGreaterThanOrEqual(2);
    expect(h.sim.syncCalls.filter((c) => c.bi === 'steady-a').length).toBeGreaterThan(syncsBefore);
    // the other image's copy was left alone
    expect(untouched.files.get('steady-b')).toBe(bFile);
    expect(h.sim.downloads.get(URL)).toBe(2);
  }, 30_000);

  it('when every copy failed longer than the recovery wait, a download image is prepared again from the origin', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    await setSetting('backing-image-recovery-wait-interval', '0');
    await h.cm.actions.create({ name: 'rec', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 1 });
    const bi = await waitReady('rec', 1);
    const disk = readyDisks(bi)[0]!;
    const m = [...h.sim.managers.values()].find((x) => x.diskUUID === disk)!;
    const f = m.files.get('rec')!;
    Object.assign(f, { state: 'failed', message: 'file vanished' });
    h.sim.disks.get(disk)!.clear();
    for (const w of m.watchers) w();
    await waitFor('downloaded again', () => h!.sim.downloads.get(URL) === 2);
    // The new first file lands on another disk; the failed copy is deleted and synced again from it.
    const recovered = await waitFor('every copy ready again', async () => {
      const b = await getBI('rec');
      const spec = Object.keys(b.spec?.diskFileSpecMap ?? {});
      return spec.length >= 1 && readyDisks(b).length === spec.length && readyDisks(b).includes(disk) ? b : undefined;
    }, 15_000);
    expect(recovered.status?.checksum).toBe(sum);
  });

  it('when every copy failed, an image with a completed backup is restored from it, not downloaded again', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    await setSetting('backing-image-recovery-wait-interval', '0');
    await h.store.create(BackupTargetKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackupTarget', metadata: { name: 'default', namespace: NS }, spec: { backupTargetURL: 'vfs:///backups', pollInterval: '1s' } });
    await waitFor('backup target available', async () => (await h!.store.get(BackupTargetKind, 'default', NS)).status?.available);
    await h.cm.actions.create({ name: 'bak', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 1 });
    const bi = await waitReady('bak', 1);
    const bbi = await h.cm.actions.createBackup('bak');
    await waitFor('backup completed', async () => (await h!.store.get(BackupBackingImageKind, bbi.metadata.name, NS)).status?.state === 'Completed');
    const disk = readyDisks(bi)[0]!;
    const m = [...h.sim.managers.values()].find((x) => x.diskUUID === disk)!;
    Object.assign(m.files.get('bak')!, { state: 'failed', message: 'file vanished' });
    h.sim.disks.get(disk)!.clear();
    for (const w of m.watchers) w();
    const bids = await waitFor('the first file prepared again from the backup', async () => {
      const d = await h!.store.get(BackingImageDataSourceKind, 'bak', NS);
      return d.spec?.sourceType === 'restore' ? d : undefined;
    }, 15_000);
    expect(bids.spec?.parameters?.['backup-url']).toContain('backingImage=bak');
    expect(bids.spec?.checksum).toBe(sum);
    const recovered = await waitFor('every copy ready again', async () => {
      const b = await getBI('bak');
      const spec = Object.keys(b.spec?.diskFileSpecMap ?? {});
      return spec.length >= 1 && readyDisks(b).length === spec.length && readyDisks(b).includes(disk) ? b : undefined;
    }, 15_000);
    expect(recovered.status?.checksum).toBe(sum);
    expect(h.sim.downloads.get(URL)).toBe(1); // the origin was not asked again
    expect(recovered.spec?.sourceType).toBe('download'); // the image keeps its origin
    expect(h.logs.some((l) => l.includes('All copies failed; restoring the first file from backup'))).toBe(true);
  });

  it('backs up to the backup target and restores as a new image with the same checksum', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    await h.store.create(BackupTargetKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackupTarget', metadata: { name: 'default', namespace: NS }, spec: { backupTargetURL: 'vfs:///backups', pollInterval: '1s' } });
    await waitFor('backup target available', async () => (await h!.store.get(BackupTargetKind, 'default', NS)).status?.available);
    await h.cm.actions.create({ name: 'orig', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 1 });
    await waitReady('orig', 1);
    const bbi = await h.cm.actions.createBackup('orig');
    expect(bbi.metadata.name).toMatch(/^orig-[0-9a-f]{8}$/);
    await expect(h.cm.actions.createBackup('orig')).rejects.toThrow('backup backing image orig for backup target default already exists');
    const done = await waitFor('backup completed', async () => {
      const b = await h!.store.get(BackupBackingImageKind, bbi.metadata.name, NS);
      return b.status?.state === 'Completed' && b.status.lastSyncedAt ? b : undefined;
    });
    expect(done.status?.checksum).toBe(sum);
    expect(done.status?.url).toContain('backingImage=orig');

    await h.cm.actions.delete('orig');
    await waitFor('original deleted', async () => (await h!.store.list(BackingImageKind, { namespace: NS })).items.length === 0);
    await expect(h.cm.actions.restoreBackup(bbi.metadata.name, { dataEngine: '' })).rejects.toThrow('missing parameters for restoring backing image');
    await h.cm.actions.restoreBackup(bbi.metadata.name, { dataEngine: 'v1' });
    // Restore creates the image like Longhorn does: minNumberOfCopies from the default setting (3).
    const restored = await waitReady('orig', 3);
    expect(restored.spec?.sourceType).toBe('restore');
    expect(restored.status?.checksum).toBe(sum);
    await expect(h.cm.actions.restoreBackup(bbi.metadata.name, { dataEngine: 'v1' })).rejects.toThrow('backing image orig already exists');
  });

  it('a backup created while the only manager holding the image restarts waits for it (status says why) and completes', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    await h.store.create(BackupTargetKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackupTarget', metadata: { name: 'default', namespace: NS }, spec: { backupTargetURL: 'vfs:///backups', pollInterval: '1s' } });
    await waitFor('backup target available', async () => (await h!.store.get(BackupTargetKind, 'default', NS)).status?.available);
    await h.cm.actions.create({ name: 'held', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 1 });
    await waitReady('held', 1);
    const [holder] = [...h.sim.managers.values()].filter((m) => m.files.has('held'));
    expect(holder).toBeDefined();
    // The manager goes away (as after a restart) and the backup object is created at once, before it is back: it stays
    // away until the backup has said that it waits.
    h.sim.startsHeld.add(holder!.name);
    h.sim.kill(holder!.name);
    const bbi = await h.store.create(BackupBackingImageKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackupBackingImage',
      metadata: { name: 'held-bak', namespace: NS, labels: { 'backup-target': 'default' } },
      spec: { userCreated: true, backingImage: 'held', backupTargetName: 'default', labels: {} },
    });
    const waited = await waitFor('the backup says it waits for a ready manager', async () => {
      const b = await h!.store.get(BackupBackingImageKind, bbi.metadata.name, NS);
      return b.status?.error?.includes('failed to find a ready backing image manager holding backing image held; attempt') ? b : undefined;
    });
    expect(waited.status?.state ?? '').toBe('');
    h.sim.startsHeld.delete(holder!.name);
    const done = await waitFor('backup completed once the manager is back', async () => {
      const b = await h!.store.get(BackupBackingImageKind, bbi.metadata.name, NS);
      if (b.status?.state === 'Error') throw new Error(`backup failed: ${b.status.error}`);
      return b.status?.state === 'Completed' ? b : undefined;
    }, 30_000);
    expect(done.status?.checksum).toBe(sum);
    expect(done.status?.error ?? '').toBe('');
  });

  it('defers data sources beyond the data plane capacity and still converges every image', async () => {
    h = await startHarness();
    h.sim.maxDataSources = 1;
    const sums = ['ia', 'ib', 'ic'].map((n) => h!.sim.serve(`http://127.0.0.1:8080/${n}`, `${n}-content`.repeat(50)));
    for (const [i, n] of ['ia', 'ib', 'ic'].entries()) await h.cm.actions.create({ name: n, sourceType: 'download', parameters: { url: `http://127.0.0.1:8080/${n}` }, expectedChecksum: sums[i], minNumberOfCopies: 1 });
    let maxSeen = 0;
    const timer = setInterval(() => (maxSeen = Math.max(maxSeen, h!.sim.dataSources.size)), 5);
    try {
      for (const n of ['ia', 'ib', 'ic']) await waitReady(n, 1, 15_000);
    } finally {
      clearInterval(timer);
    }
    expect(maxSeen).toBe(1);
    expect(['ia', 'ib', 'ic'].map((n) => h!.sim.downloads.get(`http://127.0.0.1:8080/${n}`))).toEqual([1, 1, 1]);
  });

  it('syncs started together (several per manager reconcile) never exceed the per-node limit or the SendingLimit', async () => {
    const disks = ['d1', 'd2', 'd3', 'd4', 'd5', 'd6'].map((uuid) => ({ uuid }));
    h = await startHarness(disks);
    await setSetting('concurrent-backing-image-replenish-per-node-limit', '2');
    h.sim.transferMs = 300;
    const names = ['s1', 's2', 's3'];
    const sums = names.map((n) => h!.sim.serve(`http://127.0.0.1:8080/${n}`, `${n}-content`.repeat(40)));
    const passing = samplePassing();
    try {
      for (const [i, n] of names.entries()) await h.cm.actions.create({ name: n, sourceType: 'download', parameters: { url: `http://127.0.0.1:8080/${n}` }, expectedChecksum: sums[i], minNumberOfCopies: 3 });
      for (const n of names) await waitReady(n, 3, 20_000);
    } finally {
      passing.stop();
    }
    // 6 syncs in all; at most 2 at once on the node (one node holds every disk), each copy sent to at most 3 at once
    expect(h.sim.syncCalls.length).toBeGreaterThanOrEqual(6);
    expect(passing.max).toBeGreaterThan(0);
    expect(passing.max).toBeLessThanOrEqual(2);
    expect(h.sim.maxSending).toBeLessThanOrEqual(3);
  });

  it('with one slot per node and many copies waiting for it, every copy is synced, one at a time', async () => {
    // Most passes find the node full: the waiting copies that nothing changed wait again without a look, and each
    // freed slot still goes to one of them.
    h = await startHarness([{ uuid: 'd1' }, { uuid: 'd2' }, { uuid: 'd3' }]);
    await setSetting('concurrent-backing-image-replenish-per-node-limit', '1');
    h.sim.transferMs = 40;
    const names = ['w1', 'w2', 'w3', 'w4', 'w5', 'w6'];
    const sums = names.map((n) => h!.sim.serve(`http://127.0.0.1:8080/${n}`, `${n}-content`.repeat(30)));
    const passing = samplePassing();
    try {
      await Promise.all(names.map((n, i) => h!.cm.actions.create({ name: n, sourceType: 'download', parameters: { url: `http://127.0.0.1:8080/${n}` }, expectedChecksum: sums[i], minNumberOfCopies: 3 })));
      for (const n of names) await waitReady(n, 3, 30_000);
    } finally {
      passing.stop();
    }
    // two syncs per image (the first copy is fetched from its data source), never two at once on the node
    expect(h.sim.syncCalls.length).toBeGreaterThanOrEqual(12);
    expect(passing.max).toBe(1);
  });

  it('a data source told to wait while room came meanwhile tries again at once (no lost wake-up)', async () => {
    // The fallback retry of a waiting data source and the resync are made far longer than the test: only the wake-up can start it.
    h = await startHarness(undefined, { resyncMs: 600_000, timing: { ...FAST_TIMING, dataSourceDeferredRetryMs: 600_000 } });
    h.sim.maxDataSources = 1;
    const sums = ['wa', 'wb'].map((n) => h!.sim.serve(`http://127.0.0.1:8080/${n}`, `${n}-content`.repeat(50)));
    await h.cm.actions.create({ name: 'wa', sourceType: 'upload', minNumberOfCopies: 1 });
    await waitFor('the first data source to run', async () => h!.sim.dataSources.has('wa'));
    await h.cm.actions.create({ name: 'wb', sourceType: 'download', parameters: { url: 'http://127.0.0.1:8080/wb' }, expectedChecksum: sums[1], minNumberOfCopies: 1 });
    await waitFor('the second data source to wait', async () => /waiting for the data plane/.test((await h!.store.get(BackingImageDataSourceKind, 'wb', NS)).status?.message ?? ''));
    // Its status writes are over (the image's status follows the data source's): nothing else brings it back.
    let lastDeferral = Date.now();
    h.sim.onDeferred = (name) => {
      if (name === 'wb') lastDeferral = Date.now();
    };
    await waitFor('the waiting data source to be left alone', async () => Date.now() - lastDeferral > 500);
    // A change wakes `wb`, which finds no room again (its status stays the same: no write, no event brings it back);
    // room appears and the data plane says so while that start is being told to wait, before the controller has put
    // `wb` among the waiting ones again.
    h.sim.onDeferred = (name) => {
      if (name !== 'wb') return;
      h!.sim.onDeferred = undefined;
      h!.sim.maxDataSources = 2;
      h!.sim.signalDataSourceChange('wa');
    };
    h.sim.signalDataSourceChange('wa');
    await waitReady('wb', 1, 15_000);
    expect(h.sim.onDeferred).toBeUndefined();
  });

  it('rejects invalid creations with clear messages', async () => {
    h = await startHarness();
    await expect(h.cm.actions.create({ name: 'x1', sourceType: 'nope' })).rejects.toThrow('admission webhook "validator.longhorn.io" denied the request: spec.sourceType: must be one of');
    await expect(h.cm.actions.create({ name: 'x2', sourceType: 'download', parameters: {} })).rejects.toThrow('download URL is not provided');
    await expect(h.cm.actions.create({ name: 'x3', sourceType: 'download', parameters: { url: 'ftp://h/x' } })).rejects.toThrow('invalid download URL scheme "ftp"');
    await expect(h.cm.actions.create({ name: 'x4', sourceType: 'download', parameters: { url: 'http://localhost/x' } })).rejects.toThrow('download URL must not target a loopback address');
    await expect(h.cm.actions.create({ name: 'x5', sourceType: 'upload', dataEngine: 'v2' })).rejects.toThrow('v2 backing image is not supported');
    await expect(h.cm.actions.create({ name: 'x8', sourceType: 'export-from-volume', parameters: { 'volume-name': 'vol1', 'export-type': 'raw' } })).rejects.toThrow(
      'volume vol1 not found: there is no volume to export from',
    );
    await expect(h.cm.actions.create({ name: 'x6', sourceType: 'upload', expectedChecksum: 'abc' })).rejects.toThrow('sha512 checksum must be 128 hex characters');
    await expect(h.cm.actions.create({ name: 'x7', sourceType: 'upload', minNumberOfCopies: -1 })).rejects.toThrow('must larger than 0');
    const d = await h.cm.actions.create({ name: 'Defaults', sourceType: 'upload' });
    expect(d.metadata.name).toBe('defaults');
    expect(d.spec?.minNumberOfCopies).toBe(3);
    expect(d.metadata.finalizers).toEqual(['longhorn.io']);
  });

  it('a full disk (ENOSPC): the copy says so with its retry, the disk gets Healthy=False, scheduling avoids it until a write on it succeeds', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    // Every sync fails as on a full disk until the test picks the disk that stays full.
    let full: string | undefined;
    h.sim.syncFailure = (disk) => (full === undefined || disk === full ? 'failed to write backing.tmp: ENOSPC: no space left on device, write' : undefined);
    await h.cm.actions.create({ name: 'full', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 2 });
    const [disk, entry] = await waitFor('a copy failed with ENOSPC', async () =>
      Object.entries((await getBI('full')).status?.diskFileStatusMap ?? {}).find(([, f]) => f.state === 'failed' && /ENOSPC/.test(f.message ?? '')),
    );
    full = disk;
    // The copy's status names the disk and the condition, counts the attempt and says when the next one comes.
    expect(entry.message).toMatch(new RegExp(`^${disk}: no space left on device \\(ENOSPC\\)`));
    const waiting = await waitFor('the retry of the failed copy', async () => {
      const f = (await getBI('full')).status?.diskFileStatusMap?.[disk];
      return f?.state === 'failed' && f.retryCount && f.nextRetryAt ? f : undefined;
    });
    expect(Number.isFinite(Date.parse(waiting.nextRetryAt!))).toBe(true);
    // The disk shows the condition like Longhorn's disk conditions.
    const cond = await waitFor('the disk condition', async () =>
      (await h!.store.get(NodeKind, 'node-1', NS)).status?.diskStatus?.[disk]?.conditions?.find((c) => c.type === 'Healthy' && c.status === 'False'),
    );
    expect(cond.reason).toBe('DiskFull');
    expect(cond.message).toContain('ENOSPC');
    // The second copy goes to the third disk (the full one is avoided), and reaches ready.
    const bi = await waitFor('a second ready copy elsewhere', async () => {
      const b = await getBI('full');
      return readyDisks(b).length === 2 ? b : undefined;
    }, 15_000);
    expect(readyDisks(bi)).not.toContain(disk);
    // The copy, the failure and the disk condition are events.
    const evs = await h.cm.events.list({ name: 'full' });
    expect(evs.some((e) => e.type === 'Warning' && e.reason === 'Failed' && e.message.includes('ENOSPC'))).toBe(true);
    expect(evs.filter((e) => e.reason === 'Ready').length).toBeGreaterThanOrEqual(2);
    expect((await h.cm.events.list({ kind: 'Node', name: 'node-1', reason: 'DiskError' })).length).toBe(1);
    // Space is freed: the next attempt on the disk succeeds and the condition clears.
    full = '';
    await waitFor('the disk recovered', async () =>
      (await h!.store.get(NodeKind, 'node-1', NS)).status?.diskStatus?.[disk]?.conditions?.find((c) => c.type === 'Healthy' && c.status === 'True'),
      15_000,
    );
    expect((await h.cm.events.list({ kind: 'Node', name: 'node-1', reason: 'DiskRecovered' })).length).toBe(1);
  }, 30_000);

  it('a disk marked unhealthy with no copy retried on it recovers through a probe write after the backoff window', async () => {
    const root = await mkdtemp(path.join(os.tmpdir(), 'bis-probe-'));
    try {
      const disks = ['disk-1', 'disk-2'].map((uuid) => ({ uuid, path: path.join(root, uuid) }));
      for (const d of disks) await mkdir(d.path);
      h = await startHarness(disks);
      const sum = h.sim.serve(URL, DATA);
      await h.cm.actions.create({ name: 'probed', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 1 });
      const [disk] = readyDisks(await waitReady('probed', 1));
      // The disk was found full (as a failed write would mark it).
      const node = await h.store.get(NodeKind, 'node-1', NS);
      const ds = node.status!.diskStatus![disk!]!;
      const t = new Date().toISOString();
      const full = { type: 'Healthy', status: 'False', reason: 'DiskFull', message: `${disk}: ENOSPC`, lastProbeTime: t, lastTransitionTime: t };
      await h.store.updateStatus(NodeKind, { ...node, status: { ...node.status, diskStatus: { ...node.status!.diskStatus, [disk!]: { ...ds, conditions: [...(ds.conditions ?? []), full] } } } });
      const healed = await waitFor('the probe clears the condition', async () =>
        (await h!.store.get(NodeKind, 'node-1', NS)).status?.diskStatus?.[disk!]?.conditions?.find((c) => c.type === 'Healthy' && c.status === 'True'),
      10_000);
      expect(Date.parse(healed.lastTransitionTime!) - Date.parse(t)).toBeGreaterThanOrEqual(900); // not before the window (1 s here)
      const ev = await h.cm.events.list({ kind: 'Node', reason: 'DiskRecovered' });
      expect(ev.map((e) => e.message)).toEqual([expect.stringContaining('a probe write of 1048576 bytes succeeded')]);
      expect((await readdir(path.join(root, disk!))).filter((f) => f.startsWith('.bis-disk-probe'))).toEqual([]);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  }, 30_000);
});
