import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Datastore } from '../datastore.js';
import { updateForReading, updateStatusForReading } from '../datastore.js';
import { isConflict, isGone, isNotFound, StatusError } from '../errors.js';
import { runDatastoreContract, takeEvents, WidgetKind, type Widget } from '../testing/index.js';
import { EmbeddedDatastore } from './embedded-store.js';
import { LOG_NAME } from './log-file.js';

runDatastoreContract('embedded', async ({ historyLimit }) => {
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-ds-contract-'));
  let store = await EmbeddedDatastore.open({ dataDir: dir, historyLimit, compactAfterEvents: 15 });
  return {
    get store() {
      return store;
    },
    async reopen() {
      await store.close();
      store = await EmbeddedDatastore.open({ dataDir: dir, historyLimit, compactAfterEvents: 15 });
      return store;
    },
    async dispose() {
      await store.close();
      await fsp.rm(dir, { recursive: true, force: true });
    },
  };
});

const w = (name: string, size = 1): Widget => ({ apiVersion: WidgetKind.apiVersion, kind: 'Widget', metadata: { name, namespace: 'ns' }, spec: { size } });

describe('EmbeddedDatastore on disk', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-ds-'));
  });
  afterEach(async () => {
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('listShared hands out the committed objects: the same object while unchanged, a new one per write, equal to list', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    await s.create(WidgetKind, w('b'));
    await s.create(WidgetKind, w('a'));
    const first = s.listShared(WidgetKind, { namespace: 'ns' });
    expect(first.items.map((i) => i.metadata.name)).toEqual(['a', 'b']);
    expect(first).toEqual(await s.list(WidgetKind, { namespace: 'ns' }));
    const a = first.items[0];
    const b = first.items[1];
    // a write replaces its object; the other stays the same object
    const b2 = await s.update(WidgetKind, { ...(await s.get(WidgetKind, 'b', 'ns')), spec: { size: 2 } });
    const second = s.listShared(WidgetKind, { namespace: 'ns' });
    expect(second.items[0]).toBe(a);
    expect(second.items[1]).not.toBe(b);
    expect(second.items[1]).toEqual(b2);
    expect(b.spec.size).toBe(1);
    expect(second.resourceVersion).toBe(b2.metadata.resourceVersion);
    // what a writer changes in its own copy never reaches the shared objects
    b2.spec.size = 99;
    (await s.get(WidgetKind, 'a', 'ns')).spec.size = 99;
    expect(s.listShared(WidgetKind, { namespace: 'ns' }).items.map((i) => i.spec.size)).toEqual([1, 2]);
    expect(s.listShared(WidgetKind, { namespace: 'other' }).items).toEqual([]);
    await s.close();
  });

  it('updateShared and updateStatusShared answer with the committed object, also for a write that changes nothing; the helpers pick them', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir, freezeCommitted: true });
    try {
      await s.create(WidgetKind, w('a'));
      const cur = await s.get(WidgetKind, 'a', 'ns');
      const spec = await s.updateShared(WidgetKind, { ...cur, spec: { size: 3 } });
      expect(spec).toBe(s.getShared(WidgetKind, 'a', 'ns'));
      expect(spec.spec.size).toBe(3);
      expect(Object.isFrozen(spec.spec)).toBe(true);
      expect(await s.updateShared(WidgetKind, { ...spec })).toBe(spec); // nothing changed: no write, the same object
      const status = await s.updateStatusShared(WidgetKind, { ...spec, status: { phase: 'ready', count: 1 } });
      expect(status).toBe(s.getShared(WidgetKind, 'a', 'ns'));
      expect(status.status).toEqual({ phase: 'ready', count: 1 });
      expect(status.metadata.resourceVersion).not.toBe(spec.metadata.resourceVersion);
      expect(await s.updateStatusShared(WidgetKind, { ...status })).toBe(status);
      // the helpers use the shared answers of this store...
      const viaHelper = await updateStatusForReading(s, WidgetKind, { ...status, status: { phase: 'ready', count: 2 } });
      expect(viaHelper).toBe(s.getShared(WidgetKind, 'a', 'ns'));
      expect(await updateForReading(s, WidgetKind, { ...viaHelper, spec: { size: 4 } })).toBe(s.getShared(WidgetKind, 'a', 'ns'));
      // ...and the plain writes of a store without them (a copy, writable)
      const plain = { update: s.update.bind(s), updateStatus: s.updateStatus.bind(s) } as unknown as Datastore;
      const copy = await updateStatusForReading(plain, WidgetKind, { ...s.getShared(WidgetKind, 'a', 'ns'), status: { phase: 'done' } });
      expect(copy).not.toBe(s.getShared(WidgetKind, 'a', 'ns'));
      expect(copy).toEqual(s.getShared(WidgetKind, 'a', 'ns'));
      copy.status!.phase = 'changed by the caller';
      const plainUpdate = await s.update(WidgetKind, { ...copy, spec: { size: 5 } });
      expect(plainUpdate).not.toBe(s.getShared(WidgetKind, 'a', 'ns'));
      expect(s.getShared(WidgetKind, 'a', 'ns').status?.phase).toBe('done');
    } finally {
      await s.close();
    }
  });

  it('getShared and a shared watch hand out the committed objects; a plain watch and get hand out copies; frozen when asked', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir, freezeCommitted: true });
    const ac = new AbortController();
    try {
      await s.create(WidgetKind, w('a'));
      const shared = s.getShared(WidgetKind, 'a', 'ns');
      expect(shared).toBe(s.listShared(WidgetKind, { namespace: 'ns' }).items[0]);
      expect(() => s.getShared(WidgetKind, 'missing', 'ns')).toThrow(/not found/);
      const rv = shared.metadata.resourceVersion;
      const sharedWatch = s.watch(WidgetKind, { namespace: 'ns', resourceVersion: rv, shared: true, signal: ac.signal })[Symbol.asyncIterator]();
      const plainWatch = s.watch(WidgetKind, { namespace: 'ns', resourceVersion: rv, signal: ac.signal })[Symbol.asyncIterator]();
      const initial = s.watch(WidgetKind, { namespace: 'ns', shared: true, signal: ac.signal })[Symbol.asyncIterator]();
      expect((await initial.next()).value?.object).toBe(shared);
      const updated = await s.update(WidgetKind, { ...(await s.get(WidgetKind, 'a', 'ns')), spec: { size: 2 } });
      const committed = s.getShared(WidgetKind, 'a', 'ns');
      expect(committed).not.toBe(shared);
      expect(committed).toEqual(updated);
      const viaShared = (await sharedWatch.next()).value?.object;
      const viaPlain = (await plainWatch.next()).value?.object;
      expect(viaShared).toBe(committed);
      expect(viaPlain).not.toBe(committed);
      expect(viaPlain).toEqual(committed);
      // the committed objects are frozen: a reader that changes one throws; copies stay writable
      expect(Object.isFrozen(committed.spec)).toBe(true);
      expect(() => {
        (committed.spec as { size: number }).size = 99;
      }).toThrow(TypeError);
      viaPlain!.spec.size = 98;
      updated.spec.size = 97;
      (await s.get(WidgetKind, 'a', 'ns')).spec.size = 96;
      expect(s.getShared(WidgetKind, 'a', 'ns').spec.size).toBe(2);
    } finally {
      ac.abort();
      await s.close();
    }
  });

  it('drops a torn last line (an unacknowledged append) and keeps everything before it', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    await s.create(WidgetKind, w('a'));
    await s.create(WidgetKind, w('b'));
    await s.close();
    await fsp.appendFile(path.join(dir, LOG_NAME), '{"op":"ev","rv":3,"k":"contract.bis.dev/Wid');
    const s2 = await EmbeddedDatastore.open({ dataDir: dir });
    expect((await s2.list(WidgetKind)).items.map((i) => i.metadata.name)).toEqual(['a', 'b']);
    expect(s2.resourceVersion).toBe('2');
    const c = await s2.create(WidgetKind, w('c'));
    expect(c.metadata.resourceVersion).toBe('3');
    await s2.close();
    const text = await fsp.readFile(path.join(dir, LOG_NAME), 'utf8');
    expect(text.endsWith('\n')).toBe(true);
    expect(text.split('\n').filter(Boolean).every((l) => JSON.parse(l))).toBe(true);
  });

  it('refuses to open a log damaged in the middle, naming the line', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    await s.create(WidgetKind, w('a'));
    await s.create(WidgetKind, w('b'));
    await s.close();
    const file = path.join(dir, LOG_NAME);
    const lines = (await fsp.readFile(file, 'utf8')).split('\n');
    lines[1] = 'garbage';
    await fsp.writeFile(file, lines.join('\n'));
    await expect(EmbeddedDatastore.open({ dataDir: dir })).rejects.toThrow(/damaged at line 2/);
    // The failed open did not keep the lock.
    await expect(fsp.access(path.join(dir, 'LOCK'))).rejects.toThrow();
  });

  it('compacts the log: bounded size, same objects, same history', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir, historyLimit: 10, compactAfterEvents: 50 });
    let cur = await s.create(WidgetKind, w('a', 0));
    for (let i = 1; i <= 200; i++) cur = await s.update(WidgetKind, { ...cur, spec: { size: i } });
    await s.close();
    const lines = (await fsp.readFile(path.join(dir, LOG_NAME), 'utf8')).split('\n').filter(Boolean);
    expect(lines.length).toBeLessThanOrEqual(1 + 10 + 1 + 50);
    const s2 = await EmbeddedDatastore.open({ dataDir: dir, historyLimit: 10, compactAfterEvents: 50 });
    expect((await s2.get(WidgetKind, 'a', 'ns')).spec.size).toBe(200);
    expect(s2.resourceVersion).toBe('201');
    await s2.close();
  });

  it('bounds the watch history by the size of its events: big objects push old versions out (410 Gone), small ones stay', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir, historyLimit: 1000, historyMaxBytes: 64 * 1024, compactAfterEvents: 10_000 });
    try {
      const first = await s.create(WidgetKind, { apiVersion: WidgetKind.apiVersion, kind: 'Widget', metadata: { name: 'big', namespace: 'ns' }, spec: { size: 0, color: 'x'.repeat(10_000) } });
      const fromFirst = first.metadata.resourceVersion;
      // 20 versions that each change ~10 KiB: ~200 KiB of events, more than the 64 KiB bound although far fewer than 1000.
      let cur = first;
      for (let i = 1; i <= 20; i++) cur = await s.update(WidgetKind, { ...cur, spec: { size: i, color: String.fromCharCode(97 + i).repeat(10_000) } });
      const h = s.historyStats;
      expect(h.bytes).toBeLessThanOrEqual(64 * 1024);
      expect(h.events).toBeGreaterThanOrEqual(5);
      expect(h.events).toBeLessThan(10);
      // A watch from the first version is too old now: 410 Gone (the informer then re-lists).
      let err: unknown;
      try {
        for await (const _ of s.watch(WidgetKind, { namespace: 'ns', resourceVersion: fromFirst })) break;
      } catch (e) {
        err = e;
      }
      expect(isGone(err)).toBe(true);
      // A watch from inside the kept window still gets every later version, in order.
      const from = Number(h.oldestResourceVersion);
      const ac = new AbortController();
      const seen: number[] = [];
      for await (const ev of s.watch(WidgetKind, { namespace: 'ns', resourceVersion: String(from), signal: ac.signal })) {
        seen.push(ev.object.spec.size);
        if (ev.object.spec.size === 20) ac.abort();
      }
      expect(seen).toEqual(Array.from({ length: h.events - 1 }, (_, i) => 21 - h.events + 1 + i));
      // Small objects: the count bound applies, not the size bound.
      for (let i = 0; i < 50; i++) await s.create(WidgetKind, { apiVersion: WidgetKind.apiVersion, kind: 'Widget', metadata: { name: `s${i}`, namespace: 'ns' }, spec: { size: i } });
      expect(s.historyStats.bytes).toBeLessThanOrEqual(64 * 1024);
      expect(s.historyStats.events).toBeGreaterThan(50);
    } finally {
      await s.close();
    }
    // The bound also applies to the history read back from the log.
    const s2 = await EmbeddedDatastore.open({ dataDir: dir, historyLimit: 1000, historyMaxBytes: 4 * 1024, compactAfterEvents: 10_000 });
    try {
      expect(s2.historyStats.bytes).toBeLessThanOrEqual(4 * 1024);
      expect(s2.historyStats.events).toBeGreaterThan(5);
    } finally {
      await s2.close();
    }
  });

  it('keeps the newest event even when it alone is bigger than the size bound', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir, historyMaxBytes: 1024 });
    try {
      const o = await s.create(WidgetKind, { apiVersion: WidgetKind.apiVersion, kind: 'Widget', metadata: { name: 'huge', namespace: 'ns' }, spec: { size: 1, color: 'y'.repeat(5000) } });
      expect(s.historyStats.events).toBe(1);
      const ac = new AbortController();
      const next = (async () => {
        for await (const ev of s.watch(WidgetKind, { namespace: 'ns', resourceVersion: o.metadata.resourceVersion, signal: ac.signal })) {
          ac.abort();
          return ev;
        }
        return undefined;
      })();
      await s.update(WidgetKind, { ...o, spec: { size: 2, color: 'y'.repeat(5000) } });
      expect((await next)?.object.spec.size).toBe(2);
    } finally {
      await s.close();
    }
  });

  it('allows one process per data directory', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    await expect(EmbeddedDatastore.open({ dataDir: dir })).rejects.toThrow(/already open/);
    await s.close();
    const again = await EmbeddedDatastore.open({ dataDir: dir });
    await again.close();
  });
});

/** A Widget whose status lists many files (like a manager's), typed loosely: the store keeps any JSON. */
type FileWidget = Widget & { status: { phase?: string; files: Record<string, { state: string; progress: number; checksum: string }> } };

function withFile(o: FileWidget, name: string, state: string, progress: number): FileWidget {
  return { ...o, status: { ...o.status, files: { ...o.status.files, [name]: { ...o.status.files[name]!, state, progress } } } };
}

async function logRecords(dir: string): Promise<{ line: string; rec: { op: string; rv?: number; format?: number; base?: number } }[]> {
  const lines = (await fsp.readFile(path.join(dir, LOG_NAME), 'utf8')).split('\n').filter(Boolean);
  return lines.map((line) => ({ line, rec: JSON.parse(line) as { op: string; rv?: number; format?: number; base?: number } }));
}

describe('EmbeddedDatastore changes logged as patches', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-ds-patch-'));
  });
  afterEach(async () => {
    await fsp.rm(dir, { recursive: true, force: true });
  });

  const files = (n: number): FileWidget['status']['files'] => Object.fromEntries(Array.from({ length: n }, (_, i) => [`f${i}`, { state: 'pending', progress: 0, checksum: `${i}`.padStart(128, 'c') }]));

  async function bigWidget(s: EmbeddedDatastore): Promise<FileWidget> {
    const o = await s.create(WidgetKind, { apiVersion: WidgetKind.apiVersion, kind: 'Widget', metadata: { name: 'big', namespace: 'ns' }, spec: { size: 1 } });
    return (await s.updateStatus(WidgetKind, { ...o, status: { phase: 'running', files: files(300) } } as FileWidget)) as FileWidget;
  }

  async function versionsFrom(s: EmbeddedDatastore, rv: string, last: number): Promise<FileWidget[]> {
    const ac = new AbortController();
    const seen: FileWidget[] = [];
    for await (const ev of s.watch(WidgetKind, { namespace: 'ns', resourceVersion: rv, signal: ac.signal })) {
      seen.push(ev.object as FileWidget);
      if (ev.object.metadata.resourceVersion === String(last)) ac.abort();
    }
    return seen;
  }

  it('logs a change of one file of a big status as a patch of the version before, and rebuilds every version when reopened', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir, compactAfterEvents: 10_000 });
    let cur = await bigWidget(s);
    const from = String(cur.metadata.resourceVersion);
    const size = JSON.stringify(cur).length;
    expect(size).toBeGreaterThan(40_000);
    for (let i = 0; i < 20; i++) cur = (await s.updateStatus(WidgetKind, withFile(cur, `f${i * 7}`, 'ready', 100))) as FileWidget;
    // a spec change and a label change are patches too
    cur = (await s.update(WidgetKind, { ...cur, spec: { size: 2 }, metadata: { ...cur.metadata, labels: { l: 'v' } } })) as FileWidget;
    const last = Number(cur.metadata.resourceVersion);
    const records = (await logRecords(dir)).slice(-21);
    expect(records.map((r) => r.rec.op)).toEqual(Array(21).fill('patch'));
    for (const r of records) expect(r.line.length).toBeLessThan(1000);
    const before = await versionsFrom(s, from, last);
    expect(before).toHaveLength(21);
    expect(before[19]!.status.files['f133']).toEqual({ state: 'ready', progress: 100, checksum: '133'.padStart(128, 'c') });
    expect(before[18]!.status.files['f133']!.state).toBe('pending');
    await s.close();

    const s2 = await EmbeddedDatastore.open({ dataDir: dir, compactAfterEvents: 10_000 });
    expect(await s2.get(WidgetKind, 'big', 'ns')).toEqual(cur);
    expect(s2.resourceVersion).toBe(String(last));
    expect(await versionsFrom(s2, from, last)).toEqual(before);
    await s2.close();

    // a compaction writes the history as patches of its previous events, and every version comes back again
    const s3 = await EmbeddedDatastore.open({ dataDir: dir, compactAfterEvents: 1 });
    const compacted = await logRecords(dir);
    expect(compacted[0]!.rec).toMatchObject({ op: 'header', format: 2, rv: last });
    expect(compacted.filter((r) => r.rec.op === 'histp').length).toBeGreaterThanOrEqual(21);
    expect(compacted.filter((r) => r.rec.op === 'obj')).toHaveLength(1);
    expect(compacted.reduce((a, r) => a + r.line.length, 0)).toBeLessThan(4 * size);
    await s3.close();
    const s4 = await EmbeddedDatastore.open({ dataDir: dir, compactAfterEvents: 10_000 });
    try {
      expect(await s4.get(WidgetKind, 'big', 'ns')).toEqual(cur);
      expect(await versionsFrom(s4, from, last)).toEqual(before);
    } finally {
      await s4.close();
    }
  });

  it('shares what did not change between versions: a committed version keeps the unchanged files of the one before', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    try {
      const cur = await bigWidget(s);
      const v1 = s.getShared(WidgetKind, 'big', 'ns') as FileWidget;
      await s.updateStatus(WidgetKind, withFile(cur, 'f5', 'ready', 100));
      const v2 = s.getShared(WidgetKind, 'big', 'ns') as FileWidget;
      expect(v2).not.toBe(v1);
      expect(v2.status.files['f6']).toBe(v1.status.files['f6']);
      expect(v2.status.files['f5']).not.toBe(v1.status.files['f5']);
      expect(v1.status.files['f5']!.state).toBe('pending');
      expect(v2.spec).toBe(v1.spec);
    } finally {
      await s.close();
    }
  });

  it('stops the open with an error naming the line when a patch does not apply to the version the log has', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir, compactAfterEvents: 10_000 });
    const cur = await bigWidget(s);
    await s.updateStatus(WidgetKind, withFile(cur, 'f1', 'ready', 100));
    await s.close();
    const records = await logRecords(dir);
    const at = records.findIndex((r) => r.rec.op === 'patch');
    expect(at).toBeGreaterThan(0);
    const damaged = records.map((r, i) => (i === at ? JSON.stringify({ ...r.rec, base: 999 }) : r.line));
    await fsp.writeFile(path.join(dir, LOG_NAME), damaged.join('\n') + '\n');
    await expect(EmbeddedDatastore.open({ dataDir: dir })).rejects.toThrow(new RegExp(`damaged at line ${at + 1}: patch of .*big at resourceVersion \\d+ applies to resourceVersion 999, but the object is at \\d+`));
  });

  it('reads a log of format 1 and rewrites it in format 2 before appending to it', async () => {
    const obj = { apiVersion: WidgetKind.apiVersion, kind: 'Widget', metadata: { name: 'old', namespace: 'ns', uid: 'u-1', generation: 1, creationTimestamp: '2026-01-01T00:00:00Z', resourceVersion: '1' }, spec: { size: 3 } };
    await fsp.writeFile(path.join(dir, LOG_NAME), [JSON.stringify({ op: 'header', format: 1, rv: 0 }), JSON.stringify({ op: 'ev', rv: 1, k: 'contract.bis.dev/Widget', type: 'ADDED', object: obj })].join('\n') + '\n');
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    try {
      expect((await logRecords(dir))[0]!.rec).toEqual({ op: 'header', format: 2, rv: 1 });
      const o = await s.get(WidgetKind, 'old', 'ns');
      expect(o.spec.size).toBe(3);
      await s.update(WidgetKind, { ...o, spec: { size: 4 } });
    } finally {
      await s.close();
    }
    expect((await logRecords(dir)).map((r) => r.rec.op)).toEqual(['header', 'hist', 'obj', 'patch']);
  });

  it('refuses a log of a format it does not know', async () => {
    await fsp.writeFile(path.join(dir, LOG_NAME), JSON.stringify({ op: 'header', format: 3, rv: 0 }) + '\n');
    await expect(EmbeddedDatastore.open({ dataDir: dir })).rejects.toThrow(/damaged at line 1: log format 3 is not one this version reads \(1 or 2\)/);
  });
});

/** A gate a test opens by hand: `wait()` resolves once `open()` was called. */
function gate(): { wait: () => Promise<void>; open: () => void } {
  let open!: () => void;
  const p = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { wait: () => p, open };
}

async function logEventRvs(dir: string): Promise<number[]> {
  const lines = (await fsp.readFile(path.join(dir, LOG_NAME), 'utf8')).split('\n').filter(Boolean);
  return lines.map((l) => JSON.parse(l) as { op: string; rv?: number }).filter((r) => r.op === 'ev' || r.op === 'patch').map((r) => r.rv as number);
}

describe('EmbeddedDatastore group commit', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-ds-gc-'));
  });
  afterEach(async () => {
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('concurrent writers share fdatasyncs; every acknowledged write is durable across a reopen', async () => {
    const batchSizes: number[] = [];
    const s = await EmbeddedDatastore.open({ dataDir: dir, beforeLogSync: (b) => void batchSizes.push(b.events) });
    // 200 creates issued in one turn: one batch, one fdatasync.
    const created = await Promise.all(Array.from({ length: 200 }, (_, i) => s.create(WidgetKind, w(`w-${i}`, i))));
    expect(batchSizes).toEqual([200]);
    expect(created.map((c) => Number(c.metadata.resourceVersion)).sort((a, b) => a - b)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
    // 64 writers, each 5 sequential read-modify-writes of its own objects: writes arriving during a sync share the next.
    const acked = new Map<string, number>();
    await Promise.all(
      Array.from({ length: 64 }, async (_, wr) => {
        for (let j = 0; j < 5; j++) {
          const name = `w-${wr * 3 + (j % 3)}`;
          const cur = await s.get(WidgetKind, name, 'ns');
          const u = await s.updateStatus(WidgetKind, { ...cur, status: { phase: `p${j}`, count: wr } });
          acked.set(name, Number(u.metadata.resourceVersion));
        }
      }),
    );
    const stats = s.commitStats;
    expect(stats.events).toBe(200 + 64 * 5);
    expect(stats.batches).toBe(batchSizes.length);
    expect(stats.batches).toBeLessThan(64 * 5);
    expect(Math.max(...batchSizes.slice(1))).toBeGreaterThan(1);
    const rvBefore = s.resourceVersion;
    expect(rvBefore).toBe(String(200 + 64 * 5));
    const snapshot = (await s.list(WidgetKind)).items;
    await s.close();

    const s2 = await EmbeddedDatastore.open({ dataDir: dir });
    expect(s2.resourceVersion).toBe(rvBefore);
    expect((await s2.list(WidgetKind)).items).toEqual(snapshot);
    for (const [name, rv] of acked) {
      const got = await s2.get(WidgetKind, name, 'ns');
      expect(Number(got.metadata.resourceVersion)).toBeGreaterThanOrEqual(rv);
      expect(got.status).toBeDefined();
    }
    await s2.close();
  });

  it('watch order = resourceVersion order = log order, and every acknowledged version is delivered once', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    const { resourceVersion } = await s.list(WidgetKind, { namespace: 'ns' });
    const total = 32 * 4;
    const events = takeEvents((signal) => s.watch(WidgetKind, { namespace: 'ns', resourceVersion, signal }), total, 10000);
    const ackedRvs: number[] = [];
    await Promise.all(
      Array.from({ length: 32 }, async (_, wr) => {
        let cur = await s.create(WidgetKind, w(`o-${wr}`, 0));
        ackedRvs.push(Number(cur.metadata.resourceVersion));
        for (let j = 1; j < 4; j++) {
          cur = await s.update(WidgetKind, { ...cur, spec: { size: j } });
          ackedRvs.push(Number(cur.metadata.resourceVersion));
        }
      }),
    );
    const got = await events;
    expect(got).toHaveLength(total);
    const rvs = got.map((e) => Number(e.object.metadata.resourceVersion));
    for (let i = 1; i < rvs.length; i++) expect(rvs[i]).toBe(rvs[i - 1] + 1);
    expect([...rvs].sort((a, b) => a - b)).toEqual([...ackedRvs].sort((a, b) => a - b));
    expect(await logEventRvs(dir)).toEqual(rvs);
    // Per object the watch sees its changes in the order they were made.
    for (let wr = 0; wr < 32; wr++) {
      const mine = got.filter((e) => e.object.metadata.name === `o-${wr}`);
      expect(mine.map((e) => `${e.type}:${e.object.spec.size}`)).toEqual(['ADDED:0', 'MODIFIED:1', 'MODIFIED:2', 'MODIFIED:3']);
    }
    await s.close();
  });

  it('reads and watches do not wait behind a sync and never show a change before it is durable', async () => {
    const hold = { current: undefined as ReturnType<typeof gate> | undefined, entered: gate() };
    const s = await EmbeddedDatastore.open({
      dataDir: dir,
      beforeLogSync: async () => {
        const g = hold.current;
        if (g) {
          hold.entered.open();
          await g.wait();
        }
      },
    });
    const a = await s.create(WidgetKind, w('a', 1));
    hold.current = gate();
    const watched = takeEvents((signal) => s.watch(WidgetKind, { namespace: 'ns', resourceVersion: a.metadata.resourceVersion, signal }), 1, 5000);
    let acknowledged = false;
    const pending = s.update(WidgetKind, { ...a, spec: { size: 2 } }).then((r) => {
      acknowledged = true;
      return r;
    });
    await hold.entered.wait(); // the batch is written and its sync is being held
    // A second update from the same version conflicts with the staged one; the rejection waits for that batch.
    let conflictSettled = false;
    const loser = s.update(WidgetKind, { ...a, spec: { size: 3 } }).catch((err: unknown) => {
      conflictSettled = true;
      return err;
    });
    // Reads answer while the batch's sync is still held (it is opened only below): they never wait for it.
    expect((await s.get(WidgetKind, 'a', 'ns')).spec.size).toBe(1);
    expect((await s.list(WidgetKind, { namespace: 'ns' })).items.map((i) => i.spec.size)).toEqual([1]);
    expect(s.resourceVersion).toBe(a.metadata.resourceVersion);
    await new Promise((r) => setTimeout(r, 50));
    expect(acknowledged).toBe(false);
    expect(conflictSettled).toBe(false);
    hold.current.open();
    hold.current = undefined;
    const u = await pending;
    expect(u.spec.size).toBe(2);
    expect(isConflict(await loser)).toBe(true);
    // After the Conflict a re-read sees the state it conflicted with.
    expect((await s.get(WidgetKind, 'a', 'ns')).metadata.resourceVersion).toBe(u.metadata.resourceVersion);
    expect((await watched).map((e) => `${e.type}:${e.object.spec.size}`)).toEqual(['MODIFIED:2']);
    await s.close();
  });

  it('a failed batch rejects all its writes and those staged behind it, leaves memory and log as before, and the store goes on', async () => {
    let failNext: ReturnType<typeof gate> | undefined;
    const entered = gate();
    const s = await EmbeddedDatastore.open({
      dataDir: dir,
      beforeLogSync: async () => {
        const g = failNext;
        if (!g) return;
        failNext = undefined;
        entered.open();
        await g.wait();
        throw new Error('injected EIO');
      },
    });
    const a = await s.create(WidgetKind, w('a', 1));
    const rvBefore = s.resourceVersion;
    const logBefore = await fsp.readFile(path.join(dir, LOG_NAME), 'utf8');
    const watched = takeEvents((signal) => s.watch(WidgetKind, { namespace: 'ns', resourceVersion: rvBefore, signal }), 1, 5000);

    const g = gate();
    failNext = g;
    // Batch 1 (fails): an update of a and a create of b.
    const r1 = Promise.allSettled([s.update(WidgetKind, { ...a, spec: { size: 2 } }), s.create(WidgetKind, w('b'))]);
    await entered.wait();
    // Staged behind the failing batch (validated against it): c, and an update of a from the staged version.
    const r2 = Promise.allSettled([s.create(WidgetKind, w('c')), s.update(WidgetKind, { ...a, metadata: { ...a.metadata, resourceVersion: String(Number(rvBefore) + 1) }, spec: { size: 5 } })]);
    g.open();
    for (const r of [...(await r1), ...(await r2)]) {
      expect(r.status).toBe('rejected');
      const reason = (r as PromiseRejectedResult).reason as StatusError;
      expect(reason).toBeInstanceOf(StatusError);
      expect(reason.code).toBe(500);
      expect(reason.message).toMatch(/injected EIO/);
    }
    expect(s.commitStats.failedBatches).toBe(1);
    // Memory and log are as before the failed batch.
    expect(s.resourceVersion).toBe(rvBefore);
    expect(await s.get(WidgetKind, 'a', 'ns')).toEqual(a);
    expect(isNotFound(await s.get(WidgetKind, 'b', 'ns').catch((e: unknown) => e))).toBe(true);
    expect(isNotFound(await s.get(WidgetKind, 'c', 'ns').catch((e: unknown) => e))).toBe(true);
    expect(await fsp.readFile(path.join(dir, LOG_NAME), 'utf8')).toBe(logBefore);

    // The store goes on: the next write takes the next version; the watch never saw the failed changes.
    const b = await s.create(WidgetKind, w('b', 7));
    expect(b.metadata.resourceVersion).toBe(String(Number(rvBefore) + 1));
    expect((await watched).map((e) => `${e.type}:${e.object.metadata.name}:${e.object.spec.size}`)).toEqual(['ADDED:b:7']);
    const names = (await s.list(WidgetKind)).items.map((i) => i.metadata.name);
    await s.close();

    const s2 = await EmbeddedDatastore.open({ dataDir: dir });
    expect((await s2.list(WidgetKind)).items.map((i) => i.metadata.name)).toEqual(names);
    expect((await s2.get(WidgetKind, 'a', 'ns')).spec.size).toBe(1);
    expect(s2.resourceVersion).toBe(b.metadata.resourceVersion);
    await s2.close();
  });

  it('creates with status in one step with keepStatus, and the status survives a reopen', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    const n = await s.create(WidgetKind, { ...w('node-1'), status: { phase: 'ready' } }, { keepStatus: true });
    expect(n.metadata.resourceVersion).toBe('1');
    expect(n.status).toEqual({ phase: 'ready' });
    await s.close();
    const s2 = await EmbeddedDatastore.open({ dataDir: dir });
    expect(await s2.get(WidgetKind, 'node-1', 'ns')).toEqual(n);
    await s2.close();
  });

  it('refuses writes after close but waits for staged ones to become durable', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    const writes = Array.from({ length: 20 }, (_, i) => s.create(WidgetKind, w(`x-${i}`)));
    const closed = s.close();
    await expect(s.create(WidgetKind, w('late'))).rejects.toThrow(/closed/);
    expect(await Promise.all(writes)).toHaveLength(20);
    await closed;
    const s2 = await EmbeddedDatastore.open({ dataDir: dir });
    expect((await s2.list(WidgetKind)).items).toHaveLength(20);
    await s2.close();
  });
});
