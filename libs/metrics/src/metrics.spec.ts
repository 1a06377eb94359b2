import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import Fastify from 'fastify';
import { EmbeddedDatastore } from '@bis/datastore';
import { BackingImageKind, BackupBackingImageKind, NodeKind } from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { BackingImageMetrics, failureReason } from './metrics.js';
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
  it('exports per-copy state labels and 0-1 progress, per-disk counts, backups, counters and queue metrics; serves /metrics', async () => {
    const n = await store.create(NodeKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Node', metadata: { name: 'node-1', namespace: NS }, spec: {} });
    await store.updateStatus(NodeKind, { ...n, status: { diskStatus: { d1: { diskUUID: 'disk-a' } as never, d2: { diskUUID: 'disk-b' } as never } } });
    const bbi = await store.create(BackupBackingImageKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackupBackingImage', metadata: { name: 'img-0123abcd', namespace: NS }, spec: { backingImage: 'img', userCreated: true } });
    await store.updateStatus(BackupBackingImageKind, { ...bbi, status: { state: 'InProgress', size: 4096, progress: 40 } });
    const m = new BackingImageMetrics({ store, namespace: NS });
    await seed(50);
    m.transferred('in', 'download', 512);
    m.transferred('out', 'backup', 0);
    m.failed('copy', 'no-space');
    m.backupFinished('completed', 3);
    m.scrubFinished('ok');
    const q = m.controllerMetrics('BackingImageController');
    q.added();
    q.added();
    q.depth(1);
    q.retried();
    q.reconciled(0.02, 'success');
    const app = Fastify();
    await app.register(metricsPlugin, { metrics: m });
    const r = await app.inject({ method: 'GET', url: '/metrics' });
    await app.close();
    expect(r.headers['content-type']).toContain('text/plain');
    const t = r.body;
    expect(t).toContain('bis_backing_image_copy_state{node="node-1",disk="disk-a",backing_image="img",state="ready"} 1');
    expect(t).toContain('bis_backing_image_copy_state{node="node-1",disk="disk-b",backing_image="img",state="in-progress"} 1');
    expect(t).not.toMatch(/^longhorn_backing_image_state/m);
    expect(t).toContain('longhorn_backing_image_actual_size_bytes{node="node-1",disk="disk-a",backing_image="img"} 1000');
    expect(t).toContain('bis_backing_image_copy_progress_ratio{node="node-1",disk="disk-b",backing_image="img"} 0.5');
    expect(t).toContain('bis_backing_image_copy_progress_ratio{node="node-1",disk="disk-a",backing_image="img"} 1');
    expect(t).toContain('bis_disk_backing_image_copies{node="node-1",disk="disk-a",state="ready"} 1');
    expect(t).toContain('bis_backup_backing_image_state{backup_backing_image="img-0123abcd",backing_image="img",state="InProgress"} 1');
    expect(t).toContain('bis_backup_backing_image_progress_ratio{backup_backing_image="img-0123abcd",backing_image="img"} 0.4');
    expect(t).toContain('bis_backup_backing_image_size_bytes{backup_backing_image="img-0123abcd",backing_image="img"} 4096');
    expect(t).toContain('bis_backing_image_transferred_bytes_total{direction="in",kind="download"} 512');
    expect(t).not.toContain('direction="out"');
    expect(t).toContain('bis_backing_image_failures_total{kind="copy",reason="no-space"} 1');
    expect(t).toContain('bis_backup_backing_images_total{result="completed"} 1');
    expect(t).toContain('bis_backup_backing_image_duration_seconds_count{result="completed"} 1');
    expect(t).toContain('bis_disk_scrub_passes_total{result="ok"} 1');
    expect(t).toContain('workqueue_adds_total{name="BackingImageController"} 2');
    expect(t).toContain('workqueue_depth{name="BackingImageController"} 1');
    expect(t).toContain('workqueue_retries_total{name="BackingImageController"} 1');
    expect(t).toContain('controller_runtime_reconcile_time_seconds_count{controller="BackingImageController",result="success"} 1');
    expect(t).toMatch(/^process_cpu_user_seconds_total \d/m);
    expect(t).toMatch(/^nodejs_heap_size_used_bytes \d/m);
  });

  it('drops series of deleted images and exports only the owner node when asked', async () => {
    await seed(10);
    const m = new BackingImageMetrics({ store, namespace: NS, ownerID: 'node-2', processMetrics: false });
    expect(await m.text()).not.toContain('backing_image="img"');
    const all = new BackingImageMetrics({ store, namespace: NS, processMetrics: false });
    expect(await all.text()).toContain('backing_image="img"');
    const bi = await store.get(BackingImageKind, 'img', NS);
    await store.delete(BackingImageKind, bi.metadata.name, NS);
    expect(await all.text()).not.toContain('backing_image="img"');
  });

  it('names failure reasons from a small fixed set', () => {
    expect(failureReason('download from http://x failed after 5 attempts: HTTP 500 Internal Server Error')).toBe('http-5xx');
    expect(failureReason('unexpected status 404 from http://x')).toBe('http-4xx');
    expect(failureReason('checksum mismatch: expected a, got b')).toBe('checksum-mismatch');
    expect(failureReason('ENOSPC: no space left on device')).toBe('no-space');
    expect(failureReason('expected status code 200 from http://x/a, got 500')).toBe('http-5xx');
    expect(failureReason('something odd')).toBe('other');
  });
});
