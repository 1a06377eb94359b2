import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import Fastify from 'fastify';
import { EmbeddedDatastore } from '@bis/datastore';
import { BackingImageKind, BackupBackingImageKind, NodeKind } from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { BackingImageMetrics } from './metrics.js';
import { metricsPlugin } from './plugin.js';

const NS = 'longhorn-system';
let dir: string;
let store: EmbeddedDatastore;
beforeEach(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'metrics-'));
  store = await EmbeddedDatastore.open({ dataDir: dir });
});
afterEach(async () => {
  await store.close();
  await rm(dir, { recursive: true, force: true });
});

async function seed(progress: number): Promise<void> {
  let bi = await store.get(BackingImageKind, 'img', NS).catch(() => undefined);
  if (!bi) bi = await store.create(BackingImageKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackingImage', metadata: { name: 'img', namespace: NS }, spec: { sourceType: 'download', minNumberOfCopies: 1 } });
  await store.updateStatus(BackingImageKind, {
    ...bi,
    status: {
      uuid: 'u1',
      size: 1000,
      ownerID: 'node-1',
      diskFileStatusMap: {
        'disk-a': { dataEngine: 'v1', state: 'ready', progress: 100, message: '', lastStateTransitionTime: '' },
        'disk-b': { dataEngine: 'v1', state: 'in-progress', progress, message: '', lastStateTransitionTime: '' },
      },
    },
  });
}

describe('BackingImageMetrics', () => {
  it('exports Longhorn gauges, progress, bytes/s, per-disk states and counters; serves /metrics', async () => {
    const n = await store.create(NodeKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Node', metadata: { name: 'node-1', namespace: NS }, spec: {} });
    await store.updateStatus(NodeKind, { ...n, status: { diskStatus: { d1: { diskUUID: 'disk-a' } as never, d2: { diskUUID: 'disk-b' } as never } } });
    const bbi = await store.create(BackupBackingImageKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackupBackingImage', metadata: { name: 'img-0123abcd', namespace: NS }, spec: { backingImage: 'img', userCreated: true } });
    await store.updateStatus(BackupBackingImageKind, { ...bbi, status: { state: 'InProgress', size: 4096, progress: 40 } });
    let now = 1_000_000;
    const m = new BackingImageMetrics({ store, namespace: NS, now: () => now });
    await seed(10);
    await m.refresh();
    now += 2000;
    await seed(50);
    m.transferStarted('upload', 'img');
    m.transferFinished('upload', 'img', 'succeeded', 512);
    m.retried('download');
    m.backupFinished('completed');
    const app = Fastify();
    await app.register(metricsPlugin, { metrics: m });
    const r = await app.inject({ method: 'GET', url: '/metrics' });
    await app.close();
    expect(r.headers['content-type']).toContain('text/plain');
    const t = r.body;
    expect(t).toContain('longhorn_backing_image_state{node="node-1",disk="disk-a",backing_image="img"} 4');
    expect(t).toContain('longhorn_backing_image_state{node="node-1",disk="disk-b",backing_image="img"} 2');
    expect(t).toContain('longhorn_backing_image_actual_size_bytes{node="node-1",disk="disk-a",backing_image="img"} 1000');
    expect(t).toContain('bis_backing_image_progress_percent{node="node-1",disk="disk-b",backing_image="img"} 50');
    // 40% of 1000 bytes in 2 s
    expect(t).toContain('bis_backing_image_transfer_bytes_per_second{node="node-1",disk="disk-b",backing_image="img"} 200');
    expect(t).toContain('bis_disk_backing_image_files{node="node-1",disk="disk-a",state="ready"} 1');
    expect(t).toContain('longhorn_backup_backing_image_state{backup_backing_image="img-0123abcd"} 2');
    expect(t).toContain('longhorn_backup_backing_image_actual_size_bytes{backup_backing_image="img-0123abcd"} 4096');
    expect(t).toContain('bis_backing_image_transfers_total{kind="upload",result="succeeded"} 1');
    expect(t).toContain('bis_backing_image_transfer_bytes_total{kind="upload"} 512');
    expect(t).toContain('bis_backing_image_transfers_active{kind="upload"} 0');
    expect(t).toContain('bis_backing_image_retries_total{kind="download"} 1');
    expect(t).toContain('bis_backing_image_backups_total{result="completed"} 1');
  });

  it('drops series of deleted images and exports only the owner node when asked', async () => {
    await seed(10);
    const m = new BackingImageMetrics({ store, namespace: NS, ownerID: 'node-2' });
    expect(await m.text()).not.toContain('backing_image="img"');
    const all = new BackingImageMetrics({ store, namespace: NS });
    expect(await all.text()).toContain('backing_image="img"');
    const bi = await store.get(BackingImageKind, 'img', NS);
    await store.delete(BackingImageKind, bi.metadata.name, NS);
    expect(await all.text()).not.toContain('backing_image="img"');
  });
});
