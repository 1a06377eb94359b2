import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { BackingImageDataSourceKind, BackingImageKind, BackingImageManagerKind, dataSourceWorkloadName } from '@bis/controllers';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, startImageServer, tempDir, waitFor, writeImage, type ImageServer } from './test-support/e2e.js';

/*
 * A delete right after a create, for every source type: the image must disappear and its data-source process must
 * be gone, whatever the data source was doing when the delete came.
 */

const SIZE = 4 * 1024 * 1024;
let tmp: { dir: string; remove(): Promise<void> };
let server: ImageServer;
let sum: string;
let sys: StandaloneHandle;

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-standalone-delete-');
  sum = await writeImage(path.join(tmp.dir, 'src.raw'), SIZE, 5);
  server = await startImageServer(tmp.dir);
  sys = await startStandalone({
    dataDir: path.join(tmp.dir, 'data'),
    listen: '127.0.0.1:0',
    disks: 2,
    allowSourceHosts: ['127.0.0.1'],
    binaries: BINARIES,
    controllerOptions: { resyncMs: 2000, timing: { dataSourcePollMs: 200, managerPollMs: 200, waitRequeueMs: 300 } },
  });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  await server?.close();
  await tmp?.remove();
});

type Json = Record<string, unknown> & { data?: Json[]; actions?: Record<string, string> };

/** What Longhorn's Python client sends: a JSON body with `Accept: application/json` and no Content-Type. */
async function call(method: string, url: string, body?: unknown): Promise<{ status: number; json: Json }> {
  const res = await fetch(url.startsWith('http') ? url : `${sys.url}${url}`, {
    method,
    headers: { accept: 'application/json' },
    body: body === undefined ? undefined : Buffer.from(JSON.stringify(body)),
  });
  const text = await res.text();
  return { status: res.status, json: text ? (JSON.parse(text) as Json) : {} };
}

const readyCount = (bi: Json) => Object.values((bi['diskFileStatusMap'] ?? {}) as Record<string, { state: string }>).filter((s) => s.state === 'ready').length;

async function waitReady(name: string): Promise<Json> {
  return waitFor(`${name} ready`, async () => {
    const r = await call('GET', `/v1/backingimages/${name}`);
    return readyCount(r.json) >= 1 ? r.json : undefined;
  }, 60_000);
}

/** The image, its data source object and its data-source process are all gone. */
async function expectGone(name: string): Promise<void> {
  await waitFor(`${name} deleted (image, data source and its process)`, async () => {
    const listed = (await call('GET', '/v1/backingimages')).json.data!.some((b) => b['name'] === name);
    const bids = await sys.store.get(BackingImageDataSourceKind, name, sys.namespace).then(() => true, () => false);
    const process = sys.dataPlane.workloads().includes(dataSourceWorkloadName(name));
    return !listed && !bids && !process;
  }, 60_000).catch(async (err: Error) => {
    const bi = await sys.store.get(BackingImageKind, name, sys.namespace).catch(() => undefined);
    const bids = await sys.store.get(BackingImageDataSourceKind, name, sys.namespace).catch(() => undefined);
    throw new Error(`${err.message}\nimage: ${JSON.stringify(bi)}\ndata source: ${JSON.stringify(bids)}\nworkloads: ${sys.dataPlane.workloads().join(', ')}`);
  });
  await expect(sys.store.get(BackingImageKind, name, sys.namespace)).rejects.toThrow();
}

async function createThenDelete(body: Record<string, unknown>): Promise<void> {
  const created = await call('POST', '/v1/backingimages', body);
  expect(created.status).toBe(200);
  const deleted = await call('DELETE', `/v1/backingimages/${String(body['name'])}`);
  expect(deleted.status).toBe(200);
  await expectGone(String(body['name']));
}

describe('a delete right after a create finishes, for every source type', () => {
  it('download (data source still fetching)', async () => {
    server.throttleMs = 20;
    try {
      await createThenDelete({ name: 'del-download', sourceType: 'download', parameters: { url: server.url('src.raw') }, expectedChecksum: sum, minNumberOfCopies: 1 });
    } finally {
      server.throttleMs = 0;
    }
  }, 120_000);

  it('upload (nothing uploaded yet)', async () => {
    await createThenDelete({ name: 'del-upload', sourceType: 'upload', parameters: {}, minNumberOfCopies: 1 });
  }, 120_000);

  it('clone, and restore from a backup', async () => {
    await call('POST', '/v1/backingimages', { name: 'del-src', sourceType: 'download', parameters: { url: server.url('src.raw') }, expectedChecksum: sum, minNumberOfCopies: 1 });
    const src = await waitReady('del-src');
    await createThenDelete({ name: 'del-clone', sourceType: 'clone', parameters: { 'backing-image': 'del-src' }, minNumberOfCopies: 1 });

    // Restore: back the source up, delete it, restore it (the restore creates an image with the source's name) and
    // delete that at once.
    expect((await call('POST', src.actions!['backupBackingImageCreate']!, {})).status).toBe(200);
    const bbi = await waitFor('backup completed', async () => {
      const b = (await call('GET', '/v1/backupbackingimages')).json.data!.find((x) => x['backingImageName'] === 'del-src' || x['name'] === 'del-src');
      return b && b['state'] === 'Completed' ? b : undefined;
    }, 60_000);
    expect((await call('DELETE', '/v1/backingimages/del-src')).status).toBe(200);
    await expectGone('del-src');
    expect((await call('POST', bbi.actions!['backupBackingImageRestore']!, { secret: '', secretNamespace: '', dataEngine: 'v1' })).status).toBe(200);
    expect((await call('DELETE', '/v1/backingimages/del-src')).status).toBe(200);
    await expectGone('del-src');
  }, 240_000);
});

/** Directories and files named after the image anywhere under the data directory (copies, temporary files). */
async function leftovers(name: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (dir: string): Promise<void> => {
    for (const e of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
      const p = path.join(dir, e.name);
      if (e.name.startsWith(`${name}-`)) out.push(p);
      else if (e.isDirectory()) await walk(p);
    }
  };
  await walk(path.join(tmp.dir, 'data'));
  return out;
}

/** For a failure message: each leftover with what is inside it, and every manager's listed files. */
async function describeLeftovers(name: string): Promise<string> {
  const lines: string[] = [];
  for (const p of await leftovers(name)) {
    const inside = await readdir(p).catch(() => undefined);
    lines.push(inside === undefined ? p : `${p}/ [${inside.join(', ')}]`);
  }
  const managers = await sys.store.list(BackingImageManagerKind, { namespace: sys.namespace }).then((r) => r.items, () => []);
  for (const m of managers) lines.push(`manager ${m.metadata.name}: spec ${JSON.stringify(m.spec?.backingImages ?? {})}, files ${JSON.stringify(m.status?.backingImageFileMap ?? {})}`);
  return lines.join('\n');
}

describe('a delete at later moments of an image\'s life finishes and leaves nothing on the disks', () => {
  type Moment = { label: string; reached: (bi: Json, dataSourceState: string) => boolean };
  const copies = (bi: Json) => Object.values((bi['diskFileStatusMap'] ?? {}) as Record<string, { state: string }>);
  const moments: Moment[] = [
    { label: 'the first file is ready for transfer in the data source', reached: (_bi, ds) => ds === 'ready-for-transfer' || ds === 'ready' },
    { label: 'the first copy is ready and the second one is syncing', reached: (bi) => readyCount(bi) === 1 && copies(bi).length === 2 },
    { label: 'every copy is ready', reached: (bi) => readyCount(bi) === 2 },
  ];
  it.each(moments.map((m, i) => [m.label, m, i] as const))('download, deleted when %s', async (_label, m, i) => {
    const name = `del-later-${i}`;
    server.throttleMs = 2;
    try {
      expect((await call('POST', '/v1/backingimages', { name, sourceType: 'download', parameters: { url: server.url('src.raw') }, expectedChecksum: sum, minNumberOfCopies: 2 })).status).toBe(200);
      await waitFor(`${name}: ${m.label}`, async () => {
        const bi = (await call('GET', `/v1/backingimages/${name}`)).json;
        const ds = await sys.store.get(BackingImageDataSourceKind, name, sys.namespace).then((b) => String(b.status?.currentState ?? ''), () => '');
        return m.reached(bi, ds) ? true : undefined;
      }, 90_000);
    } finally {
      server.throttleMs = 0;
    }
    expect((await call('DELETE', `/v1/backingimages/${name}`)).status).toBe(200);
    await expectGone(name);
    await waitFor(`${name}: no copy or temporary file left on the disks`, async () => ((await leftovers(name)).length === 0 ? true : undefined), 60_000).catch(async (err: Error) => {
      throw new Error(`${err.message}:\n${await describeLeftovers(name)}`);
    });
  }, 240_000);
});

describe('upload, clone and restore, deleted once their first copy is ready and a second one syncs', () => {
  const syncing = (bi: Json) => readyCount(bi) >= 1 && Object.keys((bi['diskFileStatusMap'] ?? {}) as object).length === 2;

  async function deleteWhen(name: string, reached: (bi: Json) => boolean): Promise<void> {
    await waitFor(`${name}: first copy ready, second syncing`, async () => (reached((await call('GET', `/v1/backingimages/${name}`)).json) ? true : undefined), 120_000);
    expect((await call('DELETE', `/v1/backingimages/${name}`)).status).toBe(200);
    await expectGone(name);
    await waitFor(`${name}: no copy or temporary file left on the disks`, async () => ((await leftovers(name)).length === 0 ? true : undefined), 60_000).catch(async (err: Error) => {
      throw new Error(`${err.message}:\n${await describeLeftovers(name)}`);
    });
  }

  it('upload (the upload finished)', async () => {
    const data = await readFile(path.join(tmp.dir, 'src.raw'));
    expect((await call('POST', '/v1/backingimages', { name: 'del-up-later', sourceType: 'upload', parameters: {}, expectedChecksum: sum, minNumberOfCopies: 2 })).status).toBe(200);
    await waitFor('upload accepted', async () => {
      const form = new FormData();
      form.append('chunk', new Blob([data]), 'src.raw');
      const r = await fetch(`${sys.url}/v1/backingimages/del-up-later?action=upload&size=${data.length}`, { method: 'POST', body: form });
      return r.status === 200 ? true : undefined;
    }, 60_000);
    await deleteWhen('del-up-later', (bi) => readyCount(bi) >= 1);
  }, 240_000);

  it('clone and restore', async () => {
    expect((await call('POST', '/v1/backingimages', { name: 'del-later-src', sourceType: 'download', parameters: { url: server.url('src.raw') }, expectedChecksum: sum, minNumberOfCopies: 1 })).status).toBe(200);
    const src = await waitReady('del-later-src');
    expect((await call('POST', '/v1/backingimages', { name: 'del-clone-later', sourceType: 'clone', parameters: { 'backing-image': 'del-later-src' }, minNumberOfCopies: 2 })).status).toBe(200);
    await deleteWhen('del-clone-later', syncing);

    expect((await call('POST', src.actions!['backupBackingImageCreate']!, {})).status).toBe(200);
    const bbi = await waitFor('backup completed', async () => {
      const b = (await call('GET', '/v1/backupbackingimages')).json.data!.find((x) => x['backingImageName'] === 'del-later-src' || x['name'] === 'del-later-src');
      return b && b['state'] === 'Completed' ? b : undefined;
    }, 60_000);
    expect((await call('DELETE', '/v1/backingimages/del-later-src')).status).toBe(200);
    await expectGone('del-later-src');
    // the restore creates an image with the backup's name and the default number of copies (2 disks here)
    expect((await call('POST', bbi.actions!['backupBackingImageRestore']!, { secret: '', secretNamespace: '', dataEngine: 'v1' })).status).toBe(200);
    await deleteWhen('del-later-src', (bi) => readyCount(bi) >= 1);
  }, 300_000);
});
