import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import WebSocket from 'ws';
import { BackingImageManagerKind } from '@bis/controllers';
import { call, NS, putManager, putNode, startHarness, SHA, type Harness } from './test-support/harness.js';

let h: Harness;
beforeEach(async () => {
  h = await startHarness();
});
afterEach(async () => {
  await h.close();
});

/** Follows links the way Longhorn's Python cattle client does (`longhorn.py`, control plane §6.1–6.2). */
describe("Longhorn's Python client calls (§6.2)", () => {
  it('discovers schemas, creates, polls, runs actions through the advertised links, updates settings and nodes, deletes', async () => {
    const v1 = await fetch(`${h.url}/v1`);
    const schemasUrl = v1.headers.get('x-api-schemas');
    expect(schemasUrl).toBe(`${h.url}/v1/schemas`);
    const schemas = (await (await fetch(schemasUrl!)).json()) as { data: { id: string; links: Record<string, string>; resourceActions: Record<string, unknown>; collectionMethods: string[]; resourceMethods: string[] }[] };
    const byId = new Map(schemas.data.map((s) => [s.id, s]));
    for (const id of ['backingImage', 'backupBackingImage', 'backingImageDiskFileStatus', 'backingImageCleanupInput', 'updateMinNumberOfCopiesInput', 'backingImageRestoreInput', 'setting', 'node']) expect(byId.has(id)).toBe(true);
    const bis = byId.get('backingImage')!;
    expect(bis.collectionMethods).toEqual(['GET', 'POST']);
    expect(bis.resourceMethods).toEqual(['GET', 'DELETE']);
    expect(Object.keys(bis.resourceActions)).toEqual(expect.arrayContaining(['backingImageCleanup', 'upload', 'backupBackingImageCreate', 'updateMinNumberOfCopies']));
    expect(byId.get('backupBackingImage')!.resourceActions).toEqual({ backupBackingImageRestore: { input: 'backingImageRestoreInput' } });
    // backing_image_feature_supported: by_id_schema("backingImage") has an id
    expect((await call(h, 'GET', '/v1/schemas/backingImage')).json.id).toBe('backingImage');

    // create_backing_image_with_matching_url: list, then create with exactly these fields
    expect((await call(h, 'GET', bis.links.collection!.replace(h.url, ''))).json.data).toEqual([]);
    const created = await call(h, 'POST', '/v1/backingimages', {
      name: 'bi-test', sourceType: 'download', parameters: { url: 'https://longhorn-backing-image.s3.dualstack.us-west-1.amazonaws.com/parrot.raw' },
      expectedChecksum: SHA('3'), minNumberOfCopies: 1, nodeSelector: [], diskSelector: [], dataEngine: 'v1',
    });
    expect(created.status).toBe(200);
    const bi = (await call(h, 'GET', '/v1/backingimages/bi-test')).json;
    // the fields the helpers read
    expect(bi.deletionTimestamp).toBe('');
    expect(bi.diskFileStatusMap).toEqual({});
    expect(bi.currentChecksum).toBe('');
    expect(bi.sourceType).toBe('download');
    expect(bi.parameters.url).toContain('parrot.raw');
    // bi.updateMinNumberOfCopies(minNumberOfCopies=2) and bi.backingImageCleanup(disks=[...]) through the action links
    const upd = await call(h, 'POST', bi.actions.updateMinNumberOfCopies.replace(h.url, ''), { minNumberOfCopies: 2 });
    expect(upd.json.minNumberOfCopies).toBe(2);
    const clean = await call(h, 'POST', bi.actions.backingImageCleanup.replace(h.url, ''), { disks: ['unknown-disk'] });
    expect(clean.status).toBe(200);
    expect(clean.json.type).toBe('backingImage');
    // update_setting: by_id_setting then client.update(setting, value=...) = PUT links.self
    const setting = (await call(h, 'GET', '/v1/settings/backing-image-cleanup-wait-interval')).json;
    const put = await call(h, 'PUT', setting.links.self.replace(h.url, ''), { value: '1' });
    expect(put.json.value).toBe('1');
    // node helpers: list_node, update(node, allowScheduling=False, evictionRequested=True), node.diskUpdate(disks=...)
    await putNode(h, 'node-1', { 'disk-1': { path: '/data/1', uuid: 'uuid-1' } });
    const node = (await call(h, 'GET', '/v1/nodes')).json.data[0];
    const evicted = await call(h, 'PUT', node.links.self.replace(h.url, ''), { allowScheduling: false, evictionRequested: true });
    expect(evicted.json).toMatchObject({ allowScheduling: false, evictionRequested: true });
    const disks = Object.fromEntries(Object.entries(evicted.json.disks as Record<string, Record<string, unknown>>).map(([k, d]) => [k, { ...d, allowScheduling: false, evictionRequested: true }]));
    const du = await call(h, 'POST', node.actions.diskUpdate.replace(h.url, ''), { disks });
    expect(du.json.disks['disk-1']).toMatchObject({ allowScheduling: false, evictionRequested: true, diskUUID: 'uuid-1' });
    // by_id returns None on 404; client.delete(bi) = DELETE links.self; list_backupBackingImage().data == []
    expect((await call(h, 'GET', '/v1/backingimages/absent')).status).toBe(404);
    expect((await call(h, 'DELETE', bi.links.self.replace(h.url, ''))).status).toBe(200);
    expect((await call(h, 'GET', '/v1/backupbackingimages')).json.data).toEqual([]);
    // unknown action: plain 405
    expect((await call(h, 'POST', '/v1/backingimages/bi-test?action=explode')).status).toBe(405);
  });
});

describe('nodes, backup targets, replicas', () => {
  it('node tags and disk add/remove rules', async () => {
    await putNode(h, 'node-1', { 'disk-1': { path: '/data/1', uuid: 'uuid-1' } });
    const tags = await call(h, 'PUT', '/v1/nodes/node-1', { tags: ['ssd', 'fast', 'ssd'] });
    expect(tags.json.tags).toEqual(['fast', 'ssd']);
    expect((await call(h, 'PUT', '/v1/nodes/node-1', { tags: ['bad tag'] })).json.message).toContain('invalid tag "bad tag"');
    const add = await call(h, 'POST', '/v1/nodes/node-1?action=diskUpdate', { disks: { 'disk-1': {}, 'disk-2': { path: '/data/2', tags: ['ssd'] } } });
    expect(Object.keys(add.json.disks)).toEqual(['disk-1', 'disk-2']);
    expect(add.json.disks['disk-2']).toMatchObject({ path: '/data/2', allowScheduling: true, tags: ['ssd'] });
    expect((await call(h, 'POST', '/v1/nodes/node-1?action=diskUpdate', { disks: { 'disk-1': {}, 'disk-3': { path: '/data/1' } } })).json.message).toContain('have the same path /data/1');
    const removeScheduled = await call(h, 'POST', '/v1/nodes/node-1?action=diskUpdate', { disks: { 'disk-2': {} } });
    expect(removeScheduled.json.message).toBe('cannot remove disk disk-1 from node node-1: scheduling is still enabled on it; disable it first');
    await call(h, 'POST', '/v1/nodes/node-1?action=diskUpdate', { disks: { 'disk-1': { allowScheduling: false }, 'disk-2': {} } });
    await call(h, 'POST', '/v1/backingimages', { name: 'img', sourceType: 'upload', parameters: {}, minNumberOfCopies: 1 });
    await call(h, 'POST', '/v1/replicas', { name: 'r1', backingImage: 'img', nodeID: 'node-1', diskID: 'uuid-1' });
    expect((await call(h, 'POST', '/v1/nodes/node-1?action=diskUpdate', { disks: { 'disk-2': {} } })).json.message).toContain('replicas or backing image copies are still on it');
    await call(h, 'DELETE', '/v1/replicas/r1');
    const removed = await call(h, 'POST', '/v1/nodes/node-1?action=diskUpdate', { disks: { 'disk-2': {} } });
    expect(Object.keys(removed.json.disks)).toEqual(['disk-2']);
    expect((await call(h, 'GET', '/v1/nodes/none')).status).toBe(404);
  });

  it("each disk shows its last scrub (from its manager's status); null before one is reported", async () => {
    await putNode(h, 'node-1', { 'disk-1': { path: '/data/1', uuid: 'uuid-1' }, 'disk-2': { path: '/data/2', uuid: 'uuid-2' } });
    await putManager(h, 'uuid-1', '127.0.0.1:1');
    const bim = (await h.store.list(BackingImageManagerKind, { namespace: NS })).items.find((m) => m.spec?.diskUUID === 'uuid-1')!;
    const diskScrub = { lastScrubTime: '2026-01-02T03:04:05Z', lastScrubResult: 'corrupted', lastScrubMessage: 'img: SHA-512 chain mismatch in segment 3', lastScrubFiles: 2, scrubbing: '' };
    await h.store.updateStatus(BackingImageManagerKind, { ...bim, status: { ...bim.status, diskScrub } });
    const listed = (await call(h, 'GET', '/v1/nodes')).json.data[0];
    expect(listed.disks['disk-1'].scrub).toEqual(diskScrub);
    expect(listed.disks['disk-2'].scrub).toBeNull();
    expect((await call(h, 'GET', '/v1/nodes/node-1')).json.disks['disk-1'].scrub.lastScrubResult).toBe('corrupted');
  });

  it('backup targets CRUD and checks', async () => {
    const bad = await call(h, 'POST', '/v1/backuptargets', { name: 'default', backupTargetURL: 'ftp://x' });
    expect(bad.json.message).toContain('the scheme must be one of s3, nfs, cifs, azblob, vfs');
    const ok = await call(h, 'POST', '/v1/backuptargets', { name: 'default', backupTargetURL: 's3://bucket@us-east-1/', pollInterval: '1m' });
    expect(ok.json).toMatchObject({ id: 'default', backupTargetURL: 's3://bucket@us-east-1/', pollInterval: '1m', available: false, default: true });
    const upd = await call(h, 'PUT', '/v1/backuptargets/default', { pollInterval: '30s' });
    expect(upd.json.pollInterval).toBe('30s');
    expect((await call(h, 'PUT', '/v1/backuptargets/default', { pollInterval: 'soon' })).json.message).toContain('invalid pollInterval "soon"');
    expect((await call(h, 'DELETE', '/v1/backuptargets/default')).json.message).toBe('cannot delete the default backup target');
    await call(h, 'POST', '/v1/backuptargets', { name: 'second', backupTargetURL: 'vfs:///backups' });
    expect((await call(h, 'DELETE', '/v1/backuptargets/second')).status).toBe(200);
    expect((await call(h, 'GET', '/v1/backuptargets')).json.data.map((t: { id: string }) => t.id)).toEqual(['default']);
  });

  it('replica records', async () => {
    expect((await call(h, 'POST', '/v1/replicas', { name: 'r1', backingImage: 'nope', nodeID: 'n', diskID: 'd' })).json.message).toBe('invalid replica r1: backing image nope not found');
    expect((await call(h, 'POST', '/v1/replicas', { name: 'r1' })).json.message).toBe('invalid replica r1: backingImage, nodeID, diskID are required');
    await call(h, 'POST', '/v1/backingimages', { name: 'img', sourceType: 'upload', parameters: {}, minNumberOfCopies: 1 });
    const r = await call(h, 'POST', '/v1/replicas', { name: 'r1', backingImage: 'img', nodeID: 'n', diskID: 'd' });
    expect(r.json).toMatchObject({ id: 'r1', type: 'replica', backingImage: 'img', nodeID: 'n', diskID: 'd' });
    expect((await call(h, 'DELETE', '/v1/backingimages/img')).json.message).toContain('since there are replicas using it');
    expect((await call(h, 'DELETE', '/v1/replicas/r1')).status).toBe(200);
  });
});

describe('websocket list streams', () => {
  it('sends the list at once and again when an image is created', async () => {
    const ws = new WebSocket(`${h.url.replace('http', 'ws')}/v1/ws/100ms/backingimages`);
    const messages: { data: { id: string }[] }[] = [];
    const binary: boolean[] = [];
    const next = (n: number) =>
      new Promise<void>((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`only ${messages.length} messages`)), 5000);
        const check = () => {
          if (messages.length >= n) {
            clearTimeout(t);
            resolve();
          } else setTimeout(check, 10);
        };
        check();
      });
    ws.on('message', (d, isBinary) => {
      binary.push(isBinary);
      messages.push(JSON.parse(String(d)));
    });
    try {
      await next(1);
      expect(messages[0]!.data).toEqual([]);
      await call(h, 'POST', '/v1/backingimages', { name: 'img', sourceType: 'upload', parameters: {}, minNumberOfCopies: 1 });
      await next(2);
      expect(messages[1]!.data.map((d) => d.id)).toEqual(['img']);
      // text frames, as Longhorn's list streams send (its UI reads them as text)
      expect(binary).toEqual(binary.map(() => false));
    } finally {
      ws.close();
    }
  });
});
