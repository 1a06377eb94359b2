import { afterEach, describe, expect, it } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { request as httpRequest } from 'node:http';
import { Readable } from 'node:stream';
import { gunzipSync } from 'node:zlib';
import Fastify from 'fastify';
import { Server, ServerCredentials } from '@grpc/grpc-js';
import { BackingImageManagerServiceService } from '@bis/bimrpc';
import { DataSource, dataSourceRoutes, validateDataSourceConfig } from '@bis/data-source';
import { createFileSources } from '@bis/file-sources';
import { ManagerService } from '@bis/manager';
import { backingFilePath, PortAllocator, startSyncServer, SyncService } from '@bis/sync-service';
import { call, putDataSource, putManager, setDiskStates, startHarness, type Harness } from './test-support/harness.js';

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const sha512 = (b: Buffer): string => createHash('sha512').update(b).digest('hex');

async function harness(): Promise<Harness> {
  const h = await startHarness();
  cleanups.push(() => h.close());
  return h;
}

/** A real data source (upload type) with its own sync service, as libs/data-source's tests run it. */
async function dataSource(checksum?: string): Promise<{ address: string; ds: DataSource; dir: string }> {
  const dir = await mkdtemp(path.join(tmpdir(), 'api-ds-'));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  const sync = new SyncService({ diskPath: dir, sources: createFileSources({}), monitorIntervalMs: 0 });
  cleanups.push(() => sync.close());
  const ds = new DataSource({ config: validateDataSourceConfig({ name: 'img', uuid: 'abcd1234', sourceType: 'upload', parameters: {}, checksum }), diskPath: dir, diskUUID: 'disk-a', sync, beginTimeoutMs: 60_000 });
  await ds.start();
  cleanups.push(() => ds.close());
  const app = Fastify({ forceCloseConnections: true });
  await app.register(dataSourceRoutes, { dataSource: ds });
  await app.listen({ host: '127.0.0.1', port: 0 });
  cleanups.push(() => app.close());
  return { address: `127.0.0.1:${(app.server.address() as { port: number }).port}`, ds, dir };
}

async function createUploadImage(h: Harness, checksum = ''): Promise<void> {
  const r = await call(h, 'POST', '/v1/backingimages', { name: 'img', sourceType: 'upload', parameters: {}, expectedChecksum: checksum, minNumberOfCopies: 1 });
  expect(r.status).toBe(200);
}

describe('upload proxy (real data source)', () => {
  it('streams a multipart upload to the data source while it is pending; refuses before and after', async () => {
    const h = await harness();
    const src = await dataSource();
    await createUploadImage(h);
    const img = randomBytes(256 << 10);
    const form = () => {
      const f = new FormData();
      f.append('chunk', new Blob([img]), 'img');
      return f;
    };
    const noBids = await fetch(`${h.url}/v1/backingimages/img?action=upload&size=${img.length}`, { method: 'POST', body: form() });
    expect(noBids.status).toBe(500);
    expect(((await noBids.json()) as { message: string }).message).toBe('cannot find pod for backing image data source img');
    await putDataSource(h, 'img', 'starting', src.address);
    const notPending = await fetch(`${h.url}/v1/backingimages/img?action=upload&size=${img.length}`, { method: 'POST', body: form() });
    expect(((await notPending.json()) as { message: string }).message).toBe('upload server for backing image img has not been initiated');
    await putDataSource(h, 'img', 'pending', src.address);
    const ok = await fetch(`${h.url}/v1/backingimages/img?action=upload&size=${img.length}`, { method: 'POST', body: form() });
    expect(ok.status).toBe(200);
    expect(await ok.text()).toBe('');
    const info = src.ds.info() as unknown as { state: string; currentChecksum: string; size: number };
    expect(info).toMatchObject({ state: 'ready-for-transfer', currentChecksum: sha512(img), size: img.length });
    expect(h.events.some((e) => e.startsWith('end upload img succeeded'))).toBe(true);
    const wrongType = await fetch(`${h.url}/v1/backingimages/img?action=backingImageCleanup`, { method: 'POST', headers: { 'content-type': 'multipart/form-data; boundary=x' }, body: '--x--' });
    expect(wrongType.status).toBe(415);
    // An octet-stream body anywhere else is read as JSON, like every body: raw image bytes are not JSON (400).
    const notJson = await fetch(`${h.url}/v1/backingimages/img?action=backingImageCleanup`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: img.subarray(0, 10) });
    expect(notJson.status).toBe(400);
    expect(((await notJson.json()) as { message: string }).message).toMatch(/^request body is not valid JSON/);
  });

  it('a wrong checksum fails the upload with both checksums in the message', async () => {
    const h = await harness();
    const expected = 'f'.repeat(128);
    const src = await dataSource(expected);
    await createUploadImage(h, expected);
    await putDataSource(h, 'img', 'pending', src.address);
    const img = randomBytes(64 << 10);
    const r = await fetch(`${h.url}/v1/backingimages/img?action=upload&size=${img.length}`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: img });
    const body = (await r.json()) as { type: string; message: string };
    expect(r.status).toBeGreaterThanOrEqual(400);
    expect(body.type).toBe('error');
    expect(body.message).toContain(expected);
    expect(body.message).toContain(sha512(img));
    expect((src.ds.info() as unknown as { state: string }).state).toBe('failed');
  });

  it('resumable upload: uploadOffset and uploadPart are proxied, wrong offsets keep the 409', async () => {
    const h = await harness();
    const src = await dataSource();
    await createUploadImage(h);
    await putDataSource(h, 'img', 'pending', src.address);
    const img = randomBytes(128 << 10);
    const part = (offset: number, bytes: Buffer) =>
      fetch(`${h.url}/v1/backingimages/img?action=uploadPart&size=${img.length}&offset=${offset}`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: bytes });
    const first = await part(0, img.subarray(0, 64 << 10));
    expect(first.status).toBe(200);
    expect(await first.json()).toMatchObject({ type: 'backingImageUploadProgress', size: img.length, offset: 64 << 10 });
    await putDataSource(h, 'img', 'in-progress', src.address);
    const off = await call(h, 'POST', '/v1/backingimages/img?action=uploadOffset');
    expect(off.json).toMatchObject({ size: img.length, offset: 64 << 10 });
    const wrong = await part(0, img.subarray(0, 10));
    expect(wrong.status).toBe(409);
    expect(((await wrong.json()) as { message: string }).message).toContain('upload offset mismatch');
    const rest = await part(64 << 10, img.subarray(64 << 10));
    expect(await rest.json()).toMatchObject({ offset: img.length });
    expect(src.ds.info() as unknown as { currentChecksum: string }).toMatchObject({ currentChecksum: sha512(img) });
  });
});

describe('upload proxy size bounds (backing-image-max-size)', () => {
  /** A raw request whose body is `sent` bytes although it may declare more (the server may answer before it ends). */
  function post(h: Harness, p: string, headers: Record<string, string | number>, sent: Buffer, end = true): Promise<{ status: number; body: string }> {
    return new Promise((resolve, reject) => {
      const u = new URL(h.url);
      const req = httpRequest({ host: u.hostname, port: Number(u.port), method: 'POST', path: p, headers }, (res) => {
        let body = '';
        res.setEncoding('utf8').on('data', (c: string) => (body += c)).on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      });
      req.on('error', reject);
      req.write(sent);
      if (end) req.end();
    });
  }

  it('refuses a declared size above the setting, and a body larger than its declared size, with 413', async () => {
    const h = await harness();
    const src = await dataSource();
    await createUploadImage(h);
    await putDataSource(h, 'img', 'pending', src.address);
    expect((await call(h, 'PUT', '/v1/settings/backing-image-max-size', { value: String(1 << 20) })).status).toBe(200);
    // Declared 64 MiB, only 64 KiB sent: refused up front without waiting for the rest.
    const big = await post(h, `/v1/backingimages/img?action=upload&size=${64 << 20}`, { 'content-type': 'application/octet-stream', 'content-length': 64 << 20 }, Buffer.alloc(64 << 10), false);
    expect(big.status).toBe(413);
    expect((JSON.parse(big.body) as { message: string }).message).toBe(
      `the upload's declared size of ${64 << 20} bytes is larger than the limit of ${1 << 20} bytes (the backing-image-max-size setting)`,
    );
    // A Content-Length larger than the declared size.
    const cl = await post(h, '/v1/backingimages/img?action=upload&size=4096', { 'content-type': 'application/octet-stream', 'content-length': 8192 }, Buffer.alloc(8192));
    expect(cl.status).toBe(413);
    expect((JSON.parse(cl.body) as { message: string }).message).toBe('the upload body is larger than its declared size of 4096 bytes');
    // A chunked body (no Content-Length) that goes past the declared size.
    const chunked = await post(h, '/v1/backingimages/img?action=upload&size=4096', { 'content-type': 'application/octet-stream', 'transfer-encoding': 'chunked' }, randomBytes(64 << 10));
    expect(chunked.status).toBe(413);
    expect((JSON.parse(chunked.body) as { message: string }).message).toBe('the upload body is larger than its declared size of 4096 bytes');
    expect(h.events.some((e) => e.startsWith('end upload img failed'))).toBe(true);
    // A part may not carry more than what is left after its offset.
    const part = await post(h, `/v1/backingimages/img?action=uploadPart&size=8192&offset=4096`, { 'content-type': 'application/octet-stream', 'content-length': 8192 }, Buffer.alloc(8192));
    expect(part.status).toBe(413);
    expect((JSON.parse(part.body) as { message: string }).message).toBe('the upload body is larger than its declared size: more than the 4096 bytes left of 8192 after offset 4096');
    // Within the limit the upload goes through, and the stored image is exactly the body.
    const img = randomBytes(256 << 10);
    const ok = await fetch(`${h.url}/v1/backingimages/img?action=upload&size=${img.length}`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: img });
    expect(ok.status).toBe(200);
    expect(src.ds.info() as unknown as { currentChecksum: string }).toMatchObject({ currentChecksum: sha512(img) });
  });
});

describe('download proxy (real manager gRPC + sync service)', () => {
  it('streams gzip by default and raw on request from a ready copy', async () => {
    const h = await harness();
    const disk = await mkdtemp(path.join(tmpdir(), 'api-bim-'));
    cleanups.push(() => rm(disk, { recursive: true, force: true }));
    const sync = new SyncService({ diskPath: disk, sources: createFileSources({}), monitorIntervalMs: 0 });
    cleanups.push(() => sync.close());
    const http = await startSyncServer(sync, { host: '127.0.0.1', port: 0 });
    cleanups.push(() => http.close());
    const syncAddress = `127.0.0.1:${(http.server.address() as { port: number }).port}`;
    const manager = new ManagerService({ diskPath: disk, diskUUID: 'disk-a', sync, ports: new PortAllocator({ min: 30000, max: 30100 }), syncAddress, receiverHost: '127.0.0.1' });
    const grpc = new Server();
    grpc.addService(BackingImageManagerServiceService, manager.implementation());
    const port = await new Promise<number>((res, rej) => grpc.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))));
    cleanups.push(() => new Promise<void>((r) => grpc.tryShutdown(() => r())));
    const img = Buffer.concat([randomBytes(100 << 10), Buffer.alloc(28 << 10)]);
    await sync.upload({ filePath: backingFilePath(disk, 'img', 'abcd1234'), uuid: 'abcd1234', size: img.length, body: Readable.from([img]) });

    await createUploadImage(h);
    const none = await call(h, 'GET', '/v1/backingimages/img/download');
    expect(none.status).toBe(500);
    expect(none.json.message).toBe('backing image img has no ready copy to download yet (copies: none yet)');
    await setDiskStates(h, 'img', { 'disk-a': 'ready' });
    const noManager = await call(h, 'GET', '/v1/backingimages/img/download');
    expect(noManager.status).toBe(500);
    expect(noManager.json.message).toMatch(/^no backing image manager is running on (disk disk-a|\S+ on node \S+), which holds the ready copy of backing image img; check that disk \(bictl node ls\) and its manager's state and log$/);
    await putManager(h, 'disk-a', `127.0.0.1:${port}`);

    const gz = await fetch(`${h.url}/v1/backingimages/img/download`);
    expect(gz.status).toBe(200);
    expect(gz.headers.get('content-disposition')).toContain('.gz');
    expect(gunzipSync(Buffer.from(await gz.arrayBuffer())).equals(img)).toBe(true);
    const raw = await fetch(`${h.url}/v1/backingimages/img/download?raw=true`);
    expect(raw.headers.get('content-length')).toBe(String(img.length));
    expect(Buffer.from(await raw.arrayBuffer()).equals(img)).toBe(true);
    expect(h.events.filter((e) => e.startsWith('end download img succeeded'))).toHaveLength(2);
    const missing = await call(h, 'GET', '/v1/backingimages/nope/download');
    expect(missing.status).toBe(404);
  });
});
