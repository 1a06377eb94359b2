import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { BackingImageKind, BackupBackingImageKind, ReplicaKind, replicaLabels } from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { cleanupRefusal, countCopies, CLEANUP_NOT_ENOUGH_FILES, CLEANUP_NOT_ENOUGH_HANDLING, CLEANUP_NOT_ENOUGH_READY } from '@bis/controllers';
import { goTimeString } from './errors.js';
import { call, NS, putBackupTarget, putDataSource, setDiskStates, SHA, startHarness, type Harness } from './test-support/harness.js';

let h: Harness;
beforeEach(async () => {
  h = await startHarness();
});
afterEach(async () => {
  await h.close();
});

const create = (body: Record<string, unknown>) => call(h, 'POST', '/v1/backingimages', body);
const download = (name: string, extra: Record<string, unknown> = {}) =>
  create({ name, sourceType: 'download', parameters: { url: 'https://images.example/parrot.raw' }, expectedChecksum: '', minNumberOfCopies: 1, ...extra });

async function addReplica(name: string, bi: string, disk: string): Promise<void> {
  await h.store.create(ReplicaKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Replica', metadata: { name, namespace: NS, labels: replicaLabels(bi, disk) }, spec: { backingImage: bi, nodeID: 'node-1', diskID: disk } });
}

describe('backingImage create / list / get / delete', () => {
  it('creates with the mutator defaults and renders every field of §2.3', async () => {
    const r = await create({ name: 'Parrot', sourceType: 'download', parameters: { url: ' https://images.example/parrot.qcow2 ' }, expectedChecksum: ` ${SHA('a')} ` });
    expect(r.status).toBe(200);
    expect(r.json).toEqual({
      id: 'parrot',
      type: 'backingImage',
      links: { self: `${h.url}/v1/backingimages/parrot` },
      actions: {
        backingImageCleanup: `${h.url}/v1/backingimages/parrot?action=backingImageCleanup`,
        upload: `${h.url}/v1/backingimages/parrot?action=upload`,
        backupBackingImageCreate: `${h.url}/v1/backingimages/parrot?action=backupBackingImageCreate`,
        updateMinNumberOfCopies: `${h.url}/v1/backingimages/parrot?action=updateMinNumberOfCopies`,
        uploadOffset: `${h.url}/v1/backingimages/parrot?action=uploadOffset`,
        uploadPart: `${h.url}/v1/backingimages/parrot?action=uploadPart`,
      },
      name: 'parrot',
      uuid: '',
      sourceType: 'download',
      parameters: { url: 'https://images.example/parrot.qcow2' },
      diskSelector: [],
      nodeSelector: [],
      minNumberOfCopies: 3,
      expectedChecksum: SHA('a'),
      dataEngine: 'v1',
      diskFileStatusMap: {},
      size: 0,
      virtualSize: 0,
      currentChecksum: '',
      secret: '',
      secretNamespace: '',
      deletionTimestamp: '',
      conditions: [],
    });
    const stored = await h.store.get(BackingImageKind, 'parrot', NS);
    expect(stored.metadata.finalizers).toEqual(['longhorn.io']);
    expect(stored.metadata.labels).toMatchObject({ 'longhorn.io/managed-by': 'longhorn-manager', 'longhorn.io/component': 'backing-image' });
    expect(stored.spec?.disks).toEqual({});
  });

  it('shortens long names like the mutator and uses the setting for minNumberOfCopies 0', async () => {
    await call(h, 'PUT', '/v1/settings/default-min-number-of-backing-image-copies', { value: '2' });
    const long = 'a'.repeat(50);
    const r = await download(long, { minNumberOfCopies: 0 });
    expect(r.status).toBe(200);
    expect(r.json.name).toMatch(/^a{31}-[0-9a-f]{8}$/);
    expect(r.json.minNumberOfCopies).toBe(2);
  });

  it('lists sorted by name, gets, 404s with cattle error bodies', async () => {
    await download('zeta');
    await download('alpha');
    const list = await call(h, 'GET', '/v1/backingimages');
    expect(list.json).toMatchObject({ type: 'collection', resourceType: 'backingImage', links: { self: `${h.url}/v1/backingimages` } });
    expect(list.json.data.map((d: { id: string }) => d.id)).toEqual(['alpha', 'zeta']);
    const missing = await call(h, 'GET', '/v1/backingimages/nope');
    expect(missing.status).toBe(404);
    expect(missing.json).toEqual({ type: 'error', status: 404, code: 'Not Found', message: 'backingImage nope not found', detail: '', links: { self: `${h.url}/v1/backingimages/nope` }, actions: {} });
    const delMissing = await call(h, 'DELETE', '/v1/backingimages/nope');
    expect(delMissing.status).toBe(404);
    expect(delMissing.json.message).toBe('backingimages.longhorn.io "nope" not found');
  });

  it('refuses invalid input with the webhook messages (500)', async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ name: 'x1', sourceType: 'ftp', parameters: {} }, 'spec.sourceType'],
      [{ name: 'x2', sourceType: 'download', parameters: { url: 'https://h/i' }, dataEngine: 'v2' }, 'v2 backing image is not supported'],
      [{ name: 'x3', sourceType: 'download', parameters: { url: 'https://h/i' }, minNumberOfCopies: -1 }, 'minimum number of backing image copies -1 must larger than 0'],
      [{ name: 'x4', sourceType: 'download', parameters: { url: 'https://h/i' }, expectedChecksum: 'abc' }, 'spec.checksum'],
      [{ name: 'x5', sourceType: 'download', parameters: { url: 'http://127.0.0.1:8000/i' } }, 'spec.sourceParameters[url]: download URL must not target a loopback address (got "127.0.0.1")'],
      [{ name: 'x6', sourceType: 'download', parameters: {} }, 'spec.sourceParameters[url]: download URL is not provided'],
      [{ name: 'x7', sourceType: 'download', parameters: { url: 'ftp://h/i' } }, 'spec.sourceParameters[url]: invalid download URL scheme "ftp"'],
      [{ name: 'x11', sourceType: 'download', parameters: { url: 'x' } }, 'spec.sourceParameters[url]: invalid download URL: parse "x": invalid URI for request'],
      [{ name: 'x12', sourceType: 'download', parameters: { url: 'http:///x.img' } }, 'download URL must not target a loopback address (the URL has no host)'],
      [{ name: 'x13', sourceType: 'upload', parameters: {}, expectedChecksum: 'abc' }, 'spec.checksum: invalid checksum abc: '],
      [{ name: '-bad', sourceType: 'upload', parameters: {} }, 'invalid name -bad'],
      [{ name: 'x8', sourceType: 'clone', parameters: { 'backing-image': 'nope' } }, 'source backing image nope not found'],
      [{ name: 'x9', sourceType: 'restore', parameters: { 'backup-url': 's3://b@r/?backingImage=x' } }, 'cannot find the backup target'],
    ];
    for (const [body, msg] of cases) {
      const r = await create(body);
      expect({ body, status: r.status, type: r.json.type }).toEqual({ body, status: 500, type: 'error' });
      expect(r.json.message).toContain(msg);
      // Longhorn's api/backingimage.go wraps the webhook's denial (Go's map formatting: keys sorted).
      const params = Object.entries(body['parameters'] as Record<string, string>).sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, v]) => `${k}:${v}`).join(' ');
      expect(r.json.message.startsWith(`failed to create backing image ${String(body['name'])} from source type ${String(body['sourceType'])} with parameters map[${params}]: admission webhook "`)).toBe(true);
      expect(r.json.message).toMatch(/: admission webhook "(validator|mutator)\.longhorn\.io" denied the request: /);
    }
    const typed = await create({ name: 'x10', sourceType: 'download', parameters: { url: 1 } });
    expect(typed.json.message).toBe('invalid input for backingImage: field "parameters.url" must be a string, got 1');
    const dup = await download('twice');
    expect(dup.status).toBe(200);
    const again = await download('twice');
    expect(again.status).toBe(500);
    expect(again.json.message).toMatch(/^failed to create backing image twice from source type download with parameters map\[url:\S+\]: backingimages\.longhorn\.io "twice" already exists$/);
    expect((await call(h, 'GET', '/v1/backingimages')).json.data.map((d: { id: string }) => d.id)).toEqual(['twice']);
  });

  it('deletes with an empty 200 (Foreground: deletionTimestamp as a Go time string while finalizers remain), refused while replicas use it', async () => {
    await download('img');
    await addReplica('r1', 'img', 'disk-a');
    const refused = await call(h, 'DELETE', '/v1/backingimages/img');
    expect(refused.status).toBe(500);
    expect(refused.json.message).toBe('admission webhook "validator.longhorn.io" denied the request: cannot delete backing image img since there are replicas using it');
    await h.store.delete(ReplicaKind, 'r1', NS);
    const del = await call(h, 'DELETE', '/v1/backingimages/img');
    expect(del.status).toBe(200);
    expect(del.text).toBe('');
    const got = await call(h, 'GET', '/v1/backingimages/img');
    expect(got.json.deletionTimestamp).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \+0000 UTC$/);
  });

  it('inserts placeholders for spec disks without status', async () => {
    await download('img');
    await setDiskStates(h, 'img', { 'disk-a': 'ready', 'disk-b': '-' });
    const r = await call(h, 'GET', '/v1/backingimages/img');
    expect(r.json.uuid).toBe('abcd1234');
    expect(r.json.diskFileStatusMap['disk-b']).toEqual({ dataEngine: 'v1', state: '', progress: 0, message: 'File processing is not started', lastStateTransitionTime: '' });
    expect(r.json.diskFileStatusMap['disk-a']).toMatchObject({ state: 'ready', progress: 100 });
  });
});

describe('backingImageCleanup (HA rules)', () => {
  const cleanup = (name: string, disks: string[]) => call(h, 'POST', `/v1/backingimages/${name}?action=backingImageCleanup`, { disks });

  it('accepts when enough ready copies stay, and returns the updated image', async () => {
    await download('img', { minNumberOfCopies: 2 });
    await setDiskStates(h, 'img', { a: 'ready', b: 'ready', c: 'ready' });
    const r = await cleanup('img', ['c', 'not-in-spec']);
    expect(r.status).toBe(200);
    expect(r.json.type).toBe('backingImage');
    const stored = await h.store.get(BackingImageKind, 'img', NS);
    expect(Object.keys(stored.spec?.diskFileSpecMap ?? {}).sort()).toEqual(['a', 'b']);
  });

  it('refuses removing a ready copy below the minimum', async () => {
    await download('img', { minNumberOfCopies: 2 });
    await setDiskStates(h, 'img', { a: 'ready', b: 'ready' });
    const r = await cleanup('img', ['b']);
    expect(r.status).toBe(500);
    expect(r.json.message).toBe(CLEANUP_NOT_ENOUGH_READY);
    expect(Object.keys((await h.store.get(BackingImageKind, 'img', NS)).spec?.diskFileSpecMap ?? {})).toHaveLength(2);
  });

  it('refuses removing the only in-progress copy when too few would remain (Longhorn allowed this: counting fault fixed)', async () => {
    await download('img', { minNumberOfCopies: 2 });
    await setDiskStates(h, 'img', { a: 'ready', b: 'in-progress' });
    const r = await cleanup('img', ['b']);
    expect(r.status).toBe(500);
    expect(r.json.message).toBe(CLEANUP_NOT_ENOUGH_HANDLING);
  });

  it('accepts removing an in-progress copy when ready + in-progress copies that stay are enough', async () => {
    await download('img', { minNumberOfCopies: 2 });
    await setDiskStates(h, 'img', { a: 'ready', b: 'in-progress', c: 'pending' });
    expect((await cleanup('img', ['c'])).status).toBe(200);
  });

  it('refuses removing a failed copy when not even failed copies keep the minimum; accepts when they do', async () => {
    await download('img', { minNumberOfCopies: 3 });
    await setDiskStates(h, 'img', { a: 'ready', b: 'failed', c: 'failed' });
    const r = await cleanup('img', ['c']);
    expect(r.status).toBe(500);
    expect(r.json.message).toBe(CLEANUP_NOT_ENOUGH_FILES);
    await call(h, 'POST', '/v1/backingimages/img?action=updateMinNumberOfCopies', { minNumberOfCopies: 2 });
    expect((await cleanup('img', ['c'])).status).toBe(200);
  });

  it('refuses a disk used by a replica or by the unfinished data source', async () => {
    await download('img', { minNumberOfCopies: 1 });
    await setDiskStates(h, 'img', { a: 'ready', b: 'ready', c: 'ready' });
    await addReplica('r1', 'img', 'b');
    const r = await cleanup('img', ['b']);
    expect(r.status).toBe(500);
    expect(r.json.message).toBe('cannot clean up backing image img in disk b since there is at least one replica using it');
    await putDataSource(h, 'img', 'in-progress', '127.0.0.1:1', { diskUUID: 'c', fileTransferred: false, sourceType: 'download' });
    expect((await cleanup('img', ['c'])).json.message).toBe('cannot clean up backing image img in disk c since there is at least one replica using it');
    await putDataSource(h, 'img', 'ready', '127.0.0.1:1', { diskUUID: 'c', fileTransferred: true, sourceType: 'download' });
    expect((await cleanup('img', ['c'])).status).toBe(200);
  });

  it('the rule table', () => {
    const run = (states: Record<string, string>, remove: string[], m: number) =>
      cleanupRefusal(countCopies(Object.keys(states), (d) => states[d], new Set(remove)), m);
    expect(run({ a: 'ready', b: 'ready-for-transfer' }, ['a'], 1)).toBeUndefined();
    expect(run({ a: 'ready', b: 'unknown' }, ['b'], 2)).toBe(CLEANUP_NOT_ENOUGH_HANDLING);
    expect(run({ a: 'ready', b: 'failed', c: 'pending' }, ['b'], 2)).toBeUndefined();
    expect(run({ a: 'failed' }, [], 3)).toBeUndefined();
  });
});

describe('updateMinNumberOfCopies and backups', () => {
  it('updates, and answers a refusal with an error body (Longhorn dropped the connection)', async () => {
    await download('img');
    const ok = await call(h, 'POST', '/v1/backingimages/img?action=updateMinNumberOfCopies', { minNumberOfCopies: 2 });
    expect(ok.status).toBe(200);
    expect(ok.json.minNumberOfCopies).toBe(2);
    const zero = await call(h, 'POST', '/v1/backingimages/img?action=updateMinNumberOfCopies', { minNumberOfCopies: 0 });
    expect(zero.status).toBe(500);
    expect(zero.json.message).toContain('minimum number of backing image copies 0 must larger than 0');
    const missing = await call(h, 'POST', '/v1/backingimages/nope?action=updateMinNumberOfCopies', { minNumberOfCopies: 2 });
    expect(missing.status).toBe(404);
    expect(missing.json.type).toBe('error');
  });

  it('backupBackingImageCreate: target rules, empty 200, duplicate refused; BBI list/get/restore/delete', async () => {
    await download('img');
    const noTarget = await call(h, 'POST', '/v1/backingimages/img?action=backupBackingImageCreate', {});
    expect(noTarget.status).toBe(500);
    expect(noTarget.json.message).toContain('backup target default not found');
    await putBackupTarget(h, 'default', false);
    const unavailable = await call(h, 'POST', '/v1/backingimages/img?action=backupBackingImageCreate', { backupTargetName: 'other' });
    expect(unavailable.json.message).toContain('backup target default is not available');
    await h.store.delete(BackingImageKind, 'img', NS).catch(() => undefined);
    await h.close();
    h = await startHarness();
    await download('img');
    await putBackupTarget(h, 'default', true);
    // No ready copy yet: refused up front, with the copies' states.
    const early = await call(h, 'POST', '/v1/backingimages/img?action=backupBackingImageCreate', { backupTargetName: '' });
    expect(early.status).toBe(500);
    expect(early.json.message).toMatch(/^backing image img has no ready copy to back up yet \(copies: .*\); wait until a copy is ready, then create the backup$/);
    await setDiskStates(h, 'img', { 'disk-a': 'ready' });
    const ok = await call(h, 'POST', '/v1/backingimages/img?action=backupBackingImageCreate', { backupTargetName: '' });
    expect(ok.status).toBe(200);
    expect(ok.text).toBe('');
    const dup = await call(h, 'POST', '/v1/backingimages/img?action=backupBackingImageCreate');
    expect(dup.json.message).toContain('backup backing image img for backup target default already exists');
    const list = await call(h, 'GET', '/v1/backupbackingimages');
    expect(list.json.data).toHaveLength(1);
    const bbi = list.json.data[0];
    expect(bbi.id).toMatch(/^img-[0-9a-f]{8}$/);
    expect(bbi).toMatchObject({ type: 'backupBackingImage', backingImageName: 'img', backupTargetName: 'default', state: '', url: '', labels: null, messages: null });
    expect(bbi.actions).toEqual({ backupBackingImageRestore: `${h.url}/v1/backupbackingimages/${bbi.id}?action=backupBackingImageRestore` });
    const exists = await call(h, 'POST', `/v1/backupbackingimages/${bbi.id}?action=backupBackingImageRestore`, { dataEngine: 'v1' });
    expect(exists.json.message).toBe('backing image img already exists');
    const missingEngine = await call(h, 'POST', `/v1/backupbackingimages/${bbi.id}?action=backupBackingImageRestore`, { secret: '' });
    expect(missingEngine.json.message).toBe(`missing parameters for restoring backing image, name=${bbi.id} dataEngine=`);
    await h.store.delete(BackingImageKind, 'img', NS, { propagationPolicy: 'Background' });
    const stored = await h.store.get(BackingImageKind, 'img', NS).catch(() => undefined);
    if (stored) await h.store.update(BackingImageKind, { ...stored, metadata: { ...stored.metadata, finalizers: [] } });
    const stBbi = await h.store.get(BackupBackingImageKind, bbi.id, NS);
    await h.store.updateStatus(BackupBackingImageKind, { ...stBbi, status: { ...(stBbi.status ?? {}), url: 's3://bucket@us-east-1/?backingImage=img', checksum: SHA('c'), state: 'Completed' } });
    const restored = await call(h, 'POST', `/v1/backupbackingimages/${bbi.id}?action=backupBackingImageRestore`, { secret: '', secretNamespace: '', dataEngine: 'v1' });
    expect(restored.status).toBe(200);
    expect(restored.text).toBe('');
    const bi = await call(h, 'GET', '/v1/backingimages/img');
    expect(bi.json).toMatchObject({ sourceType: 'restore', expectedChecksum: SHA('c'), parameters: { 'backup-target-name': 'default', 'backup-url': 's3://bucket@us-east-1/?backingImage=img', 'concurrent-limit': '2' } });
    const del = await call(h, 'DELETE', `/v1/backupbackingimages/${bbi.id}`);
    expect(del.status).toBe(200);
  });
});

describe('helpers', () => {
  it('renders Go time strings', () => {
    expect(goTimeString('2026-11-22T10:00:00Z')).toBe('2026-11-22 10:00:00 +0000 UTC');
    expect(goTimeString('2026-11-22T10:00:00.120Z')).toBe('2026-11-22 10:00:00.12 +0000 UTC');
  });
});
