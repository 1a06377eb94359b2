import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { gunzipSync } from 'node:zlib';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, startImageServer, tempDir, waitFor, writeImage, type ImageServer } from './test-support/e2e.js';

const SIZE = 1024 * 1024;
let tmp: { dir: string; remove(): Promise<void> };
let server: ImageServer;
let sum: string;
let sys: StandaloneHandle;

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-standalone-rest-');
  sum = await writeImage(path.join(tmp.dir, 'parrot.raw'), SIZE, 3);
  server = await startImageServer(tmp.dir);
  sys = await startStandalone({
    dataDir: path.join(tmp.dir, 'data'),
    listen: '127.0.0.1:0',
    disks: 3,
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

type Json = Record<string, unknown> & { data?: Json[]; actions?: Record<string, string>; links?: Record<string, string> };

async function call(method: string, url: string, body?: unknown): Promise<{ status: number; json: Json }> {
  const res = await fetch(url.startsWith('http') ? url : `${sys.url}${url}`, {
    method,
    // What Longhorn's Python client sends: `Accept: application/json` and a JSON body without a Content-Type.
    headers: { accept: 'application/json' },
    body: body === undefined ? undefined : Buffer.from(JSON.stringify(body)),
  });
  const text = await res.text();
  return { status: res.status, json: text ? (JSON.parse(text) as Json) : {} };
}

const readyCount = (bi: Json) => Object.values((bi['diskFileStatusMap'] ?? {}) as Record<string, { state: string }>).filter((s) => s.state === 'ready').length;

describe('REST API of the standalone system (Longhorn Python-client call shapes)', () => {
  it('GET /v1/healthz: 200 while the store answers and the controllers run, 503 while they are stopped', async () => {
    expect(await call('GET', '/v1/healthz')).toEqual({ status: 200, json: { status: 'ok', checks: { store: 'ok', controllers: 'ok' } } });
    await sys.controllers.stop();
    try {
      expect(await call('GET', '/v1/healthz')).toEqual({ status: 503, json: { status: 'unavailable', checks: { store: 'ok', controllers: 'controllers are not running' } } });
    } finally {
      await sys.restartControllers(); // a new ControllerManager (a stopped one does not start again)
    }
    expect((await call('GET', '/v1/healthz')).status).toBe(200);
  });

  it('create_backing_image(download) → by_id polling to ready → download → cleanup → delete', async () => {
    // create_backing_image_with_matching_url: list, create, then poll by_id_backing_image
    expect((await call('GET', '/v1/backingimages')).json.data).toEqual([]);
    const created = await call('POST', '/v1/backingimages', { name: 'bi-test', sourceType: 'download', parameters: { url: server.url('parrot.raw') }, expectedChecksum: sum, minNumberOfCopies: 2, nodeSelector: [], diskSelector: [], dataEngine: 'v1' });
    expect(created.status).toBe(200);
    expect(created.json['deletionTimestamp']).toBe('');
    const bi = await waitFor('2 ready copies over REST', async () => {
      const r = await call('GET', '/v1/backingimages/bi-test');
      return readyCount(r.json) === 2 && r.json['currentChecksum'] === sum ? r.json : undefined;
    }, 60_000);
    expect(bi['sourceType']).toBe('download');
    expect((bi['parameters'] as Record<string, string>)['url']).toBe(server.url('parrot.raw'));

    const dl = await fetch(`${sys.url}/v1/backingimages/bi-test/download`);
    expect(dl.status).toBe(200);
    // Like Longhorn's UI download, the file comes gzip-compressed (`<name>.gz`).
    const bytes = gunzipSync(Buffer.from(await dl.arrayBuffer()));
    expect(createHash('sha512').update(bytes).digest('hex')).toBe(sum);

    const disks = Object.keys(bi['diskFileStatusMap'] as object);
    const refused = await call('POST', bi.actions!['backingImageCleanup']!, { disks: [disks[0]] });
    expect(refused.status).toBe(500);
    expect(String(refused.json['message'])).toContain('no enough ready files for HA');
    expect((await call('POST', bi.actions!['updateMinNumberOfCopies']!, { minNumberOfCopies: 1 })).status).toBe(200);
    const cleaned = await call('POST', bi.actions!['backingImageCleanup']!, { disks: [disks[0]] });
    expect(cleaned.status).toBe(200);
    await waitFor('disk removed from the map', async () => !((await call('GET', '/v1/backingimages/bi-test')).json['diskFileStatusMap'] as Record<string, unknown>)[disks[0]!], 30_000);

    expect((await call('DELETE', '/v1/backingimages/bi-test')).status).toBe(200);
    await waitFor('deleted', async () => (await call('GET', '/v1/backingimages')).json.data!.length === 0, 30_000);
    expect((await call('GET', '/v1/backingimages/bi-test')).status).toBe(404);
  }, 120_000);

  it('upload through the REST proxy, and a wrong checksum shows both checksums', async () => {
    const data = await readFile(path.join(tmp.dir, 'parrot.raw'));
    expect((await call('POST', '/v1/backingimages', { name: 'up', sourceType: 'upload', parameters: {}, expectedChecksum: sum, minNumberOfCopies: 1 })).status).toBe(200);
    const res = await waitFor('upload accepted', async () => {
      const form = new FormData();
      form.append('chunk', new Blob([data]), 'parrot.raw');
      const r = await fetch(`${sys.url}/v1/backingimages/up?action=upload&size=${data.length}`, { method: 'POST', body: form });
      return r.status === 200 ? r : undefined;
    }, 30_000);
    expect(res.status).toBe(200);
    await waitFor('uploaded image ready', async () => readyCount((await call('GET', '/v1/backingimages/up')).json) === 1, 60_000);

    const wrong = sum.slice(1) + sum[0];
    await call('POST', '/v1/backingimages', { name: 'wrong', sourceType: 'download', parameters: { url: server.url('parrot.raw') }, expectedChecksum: wrong, minNumberOfCopies: 1 });
    const failed = await waitFor('failed copy', async () => {
      const m = (await call('GET', '/v1/backingimages/wrong')).json['diskFileStatusMap'] as Record<string, { state: string; message: string }>;
      return Object.values(m ?? {}).find((s) => s.state === 'failed-and-cleanup' || s.state === 'failed');
    }, 60_000);
    expect(failed.message).toContain(wrong);
    expect(failed.message).toContain(sum);
  }, 120_000);
});
