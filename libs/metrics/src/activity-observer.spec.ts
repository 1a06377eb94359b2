import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { EmbeddedDatastore } from '@bis/datastore';
import { BackingImageDataSourceKind, BackingImageManagerKind, BackupBackingImageKind, NodeKind } from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { ActivityObserver } from './activity-observer.js';
import { BackingImageMetrics } from './metrics.js';

const NS = 'longhorn-system';
let dir: string;
let store: EmbeddedDatastore;
let observer: ActivityObserver | undefined;
const lines: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
const log = {
  debug: () => undefined,
  info: (msg: string, fields?: Record<string, unknown>) => lines.push({ level: 'info', msg, fields }),
  warn: (msg: string, fields?: Record<string, unknown>) => lines.push({ level: 'warn', msg, fields }),
  error: (msg: string, fields?: Record<string, unknown>) => lines.push({ level: 'error', msg, fields }),
};

beforeEach(async () => {
  lines.length = 0;
  dir = await mkdtemp(path.join(tmpdir(), 'observer-'));
  store = await EmbeddedDatastore.open({ dataDir: dir });
  const n = await store.create(NodeKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Node', metadata: { name: 'node-1', namespace: NS }, spec: {} });
  await store.updateStatus(NodeKind, { ...n, status: { diskStatus: { 'disk-1': { diskUUID: 'uuid-d1' } as never } } });
});
afterEach(async () => {
  await observer?.stop();
  await store.close();
  await rm(dir, { recursive: true, force: true });
});

async function until<T>(fn: () => T | undefined, what: string): Promise<T> {
  const end = Date.now() + 20_000;
  for (;;) {
    const v = fn();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(lines)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A download data source of image `name` (UUID `u-<name>`) on disk uuid-d1, in `status`. */
async function dataSource(name: string, status: Record<string, unknown>) {
  const ds = await store.create(BackingImageDataSourceKind, {
    apiVersion: LONGHORN_API_VERSION,
    kind: 'BackingImageDataSource',
    metadata: { name, namespace: NS },
    spec: { uuid: `u-${name}`, diskUUID: 'uuid-d1', nodeID: 'node-1', diskPath: '/d1', sourceType: 'download', parameters: {} },
  });
  return store.updateStatus(BackingImageDataSourceKind, { ...ds, status });
}

/** Manager bim-1 of disk uuid-d1 on node-1, without files. */
function manager() {
  return store.create(BackingImageManagerKind, {
    apiVersion: LONGHORN_API_VERSION,
    kind: 'BackingImageManager',
    metadata: { name: 'bim-1', namespace: NS },
    spec: { image: 'i', nodeID: 'node-1', diskUUID: 'uuid-d1', diskPath: '/d1', backingImages: {} },
  });
}

describe('ActivityObserver', () => {
  it('logs failed data sources, copies and backups with image and disk, and counts bytes, failures and backups', async () => {
    const metrics = new BackingImageMetrics({ store, namespace: NS, processMetrics: false });
    observer = new ActivityObserver({ store, namespace: NS, log, metrics });
    await observer.start();

    // an upload's data source fails: nothing starts it again (error)
    const ds = await store.create(BackingImageDataSourceKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImageDataSource',
      metadata: { name: 'up', namespace: NS },
      spec: { uuid: 'u-up', diskUUID: 'uuid-d1', nodeID: 'node-1', diskPath: '/d1', sourceType: 'upload', parameters: {} },
    });
    const running = await store.updateStatus(BackingImageDataSourceKind, { ...ds, status: { currentState: 'in-progress', size: 2048, progress: 50, message: '' } });
    await store.updateStatus(BackingImageDataSourceKind, { ...running, status: { currentState: 'failed', size: 2048, progress: 50, message: 'upload interrupted' } });
    const dsErr = await until(() => lines.find((l) => l.level === 'error' && l.fields?.['image'] === 'up'), 'the data source error');
    expect(dsErr.msg).toBe('upload data source of backing image up (u-up) on disk disk-1 failed: upload interrupted');
    expect(dsErr.fields).toMatchObject({ uuid: 'u-up', disk: 'disk-1', diskUUID: 'uuid-d1', sourceType: 'upload' });

    // a copy on a disk fails (warning: copies are tried again)
    const bim = await manager();
    const file = { name: 'img', uuid: 'u-img', size: 4096, virtualSize: 4096, realSize: 4096, currentChecksum: '', sendingReference: 0, senderManagerAddress: '' };
    const b1 = await store.updateStatus(BackingImageManagerKind, { ...bim, status: { backingImageFileMap: { img: { ...file, state: 'in-progress', progress: 25, message: '' } } } });
    await store.updateStatus(BackingImageManagerKind, { ...b1, status: { backingImageFileMap: { img: { ...file, state: 'failed', progress: 25, message: 'ENOSPC: no space left on device' } } } });
    const copyWarn = await until(() => lines.find((l) => l.level === 'warn' && l.fields?.['image'] === 'img'), 'the copy warning');
    expect(copyWarn.msg).toContain('copy of backing image img (u-img) on disk disk-1 failed: ENOSPC');

    // a backup advances, then fails (error)
    const bbi = await store.create(BackupBackingImageKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackupBackingImage', metadata: { name: 'img-bk', namespace: NS }, spec: { backingImage: 'img', userCreated: true } });
    const p1 = await store.updateStatus(BackupBackingImageKind, { ...bbi, status: { state: 'InProgress', size: 4096, progress: 50 } });
    await store.updateStatus(BackupBackingImageKind, { ...p1, status: { state: 'Error', size: 4096, progress: 50, error: 'connection reset by the backup target' } });
    const bkErr = await until(() => lines.find((l) => l.level === 'error' && l.fields?.['backup'] === 'img-bk'), 'the backup error');
    expect(bkErr.msg).toBe('backup img-bk of backing image img failed: connection reset by the backup target');

    const t = await metrics.text();
    expect(t).toContain('bis_backing_image_transferred_bytes_total{direction="in",kind="upload"} 1024');
    expect(t).toContain('bis_backing_image_transferred_bytes_total{direction="in",kind="sync"} 1024');
    expect(t).toContain('bis_backing_image_transferred_bytes_total{direction="out",kind="backup"} 2048');
    expect(t).toContain('bis_backing_image_failures_total{kind="data-source",reason="other"} 1');
    expect(t).toContain('bis_backing_image_failures_total{kind="copy",reason="no-space"} 1');
    expect(t).toContain('bis_backing_image_failures_total{kind="backup",reason="connection"} 1');
    expect(t).toContain('bis_backup_backing_images_total{result="error"} 1');
    expect(t).toContain('bis_backup_backing_image_duration_seconds_count{result="error"} 1');
  });

  it("counts the first copy on its data source's disk as moved, not synced, until nothing carries its UUID any more", async () => {
    const metrics = new BackingImageMetrics({ store, namespace: NS, processMetrics: false });
    observer = new ActivityObserver({ store, namespace: NS, log, metrics });
    await observer.start();
    const synced = async () => Number(/kind="sync"} (\d+)/.exec(await metrics.text())?.[1] ?? 0);
    await dataSource('img', { currentState: 'ready-for-transfer', size: 4096, progress: 100, message: '' });
    const bim = await manager();
    const file = { name: 'img', uuid: 'u-img', size: 4096, virtualSize: 4096, realSize: 4096, currentChecksum: '', sendingReference: 0, senderManagerAddress: '', progress: 100, message: '' };
    const b1 = await store.updateStatus(BackingImageManagerKind, { ...bim, status: { backingImageFileMap: { img: { ...file, state: 'ready' } } } });
    await store.delete(BackingImageDataSourceKind, 'img', NS);
    // the copy drops out of the manager's list, then a copy of the same image is received on that disk: a sync
    const b2 = await store.updateStatus(BackingImageManagerKind, { ...b1, status: { backingImageFileMap: {} } });
    const b3 = await store.updateStatus(BackingImageManagerKind, { ...b2, status: { backingImageFileMap: { img: { ...file, state: 'in-progress', progress: 50 } } } });
    expect(b3.status?.backingImageFileMap?.['img']?.state).toBe('in-progress');
    const n = await (async () => {
      for (let i = 0; i < 200; i++) {
        const v = await synced();
        if (v > 0) return v;
        await new Promise((r) => setTimeout(r, 20));
      }
      return 0;
    })();
    // the first copy (moved from the data source) counted nothing; the second one counts its half
    expect(n).toBe(2048);
  });

  it('does not log again what had already failed before it started', async () => {
    await dataSource('old', { currentState: 'failed', size: 0, progress: 0, message: 'HTTP 500' });
    const metrics = new BackingImageMetrics({ store, namespace: NS, processMetrics: false });
    observer = new ActivityObserver({ store, namespace: NS, log, metrics });
    await observer.start();
    const later = await store.create(BackingImageDataSourceKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImageDataSource',
      metadata: { name: 'new', namespace: NS },
      spec: { uuid: 'u-new', diskUUID: 'uuid-d1', nodeID: 'node-1', diskPath: '/d1', sourceType: 'download', parameters: {} },
    });
    await store.updateStatus(BackingImageDataSourceKind, { ...later, status: { currentState: 'failed', size: 0, progress: 0, message: 'expected status code 200 from http://x/a, got 503' } });
    const w = await until(() => lines.find((l) => l.fields?.['image'] === 'new'), 'the new failure');
    expect(w.level).toBe('warn');
    expect(w.msg).toContain('it is started again after a backoff');
    expect(lines.filter((l) => l.fields?.['image'] === 'old')).toEqual([]);
    expect(await metrics.text()).toContain('bis_backing_image_failures_total{kind="data-source",reason="http-5xx"} 1');
  });

  it('a write of a manager that shares unchanged copies with the version before counts and logs only the changed ones, once', async () => {
    const metrics = new BackingImageMetrics({ store, namespace: NS, processMetrics: false });
    observer = new ActivityObserver({ store, namespace: NS, log, metrics });
    await observer.start();
    const bim = await manager();
    const file = (name: string) => ({ name, uuid: `u-${name}`, size: 4096, virtualSize: 4096, realSize: 4096, currentChecksum: '', sendingReference: 0, senderManagerAddress: '' });
    const b1 = await store.updateStatus(BackingImageManagerKind, {
      ...bim,
      status: { backingImageFileMap: { a: { ...file('a'), state: 'in-progress', progress: 50, message: '' }, b: { ...file('b'), state: 'failed', progress: 0, message: 'EIO: i/o error' } } },
    });
    // each write keeps the entry of b (the store's versions share it; the informer delivers them) and moves a on
    const b2 = await store.updateStatus(BackingImageManagerKind, { ...b1, status: { backingImageFileMap: { ...b1.status!.backingImageFileMap, a: { ...file('a'), state: 'in-progress', progress: 75, message: '' } } } });
    await store.updateStatus(BackingImageManagerKind, { ...b2, status: { backingImageFileMap: { ...b2.status!.backingImageFileMap, a: { ...file('a'), state: 'ready', progress: 100, message: '' } } } });
    // the informer delivers the three writes in order: the last one's log line is not expected, so wait for the bytes
    let t = '';
    for (const end = Date.now() + 20_000; Date.now() < end; await new Promise((r) => setTimeout(r, 20))) {
      t = await metrics.text();
      if (t.includes('bis_backing_image_transferred_bytes_total{direction="in",kind="sync"} 4096')) break;
    }
    // a: 2048 + 1024 + 1024 bytes as it went; b failed once: one warning and one failure counted
    expect(t).toContain('bis_backing_image_transferred_bytes_total{direction="in",kind="sync"} 4096');
    expect(t).toContain('bis_backing_image_failures_total{kind="copy",reason="io-error"} 1');
    expect(lines.filter((l) => l.level === 'warn' && l.fields?.['image'] === 'b').map((l) => l.msg)).toEqual(['copy of backing image b (u-b) on disk disk-1 failed: EIO: i/o error']);
  });
});
