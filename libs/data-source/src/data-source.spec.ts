import { describe, it, expect, afterEach } from '@jest/globals';
import { createServer, request, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, readFile, rm, access } from 'node:fs/promises';
import { randomBytes, createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Fastify, { type FastifyInstance } from 'fastify';
import { createFileSources, type SizeLimitPolicy } from '@bis/file-sources';
import { SyncService } from '@bis/sync-service';
import { DataSource, BEGIN_TIMEOUT_MESSAGE } from './data-source.js';
import { dataSourceRoutes } from './routes.js';
import { parseKeyValues, validateDataSourceConfig } from './config.js';

interface Harness {
  ds: DataSource;
  app: FastifyInstance;
  url: string;
  dir: string;
  sync: SyncService;
}
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function harness(sourceType: string, parameters: Record<string, string>, extra: { checksum?: string; beginTimeoutMs?: number; sizeLimit?: SizeLimitPolicy } = {}): Promise<Harness> {
  const dir = await mkdtemp(join(tmpdir(), 'ds-'));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  const sync = new SyncService({ diskPath: dir, sources: createFileSources({ allowSourceHosts: ['127.0.0.1'], sizeLimit: extra.sizeLimit }), monitorIntervalMs: 0 });
  cleanups.push(() => sync.close());
  const config = validateDataSourceConfig({ name: 'img1', uuid: 'u1234', sourceType, parameters, checksum: extra.checksum });
  const ds = new DataSource({ config, diskPath: dir, diskUUID: 'disk-1', sync, beginTimeoutMs: extra.beginTimeoutMs ?? 60_000, sizeLimit: extra.sizeLimit });
  await ds.start();
  cleanups.push(() => ds.close());
  const app = Fastify({ forceCloseConnections: true });
  await app.register(dataSourceRoutes, { dataSource: ds });
  await app.listen({ host: '127.0.0.1', port: 0 });
  cleanups.push(() => app.close());
  return { ds, app, url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`, dir, sync };
}

async function waitFor<T>(fn: () => Promise<T>, ok: (v: T) => boolean, ms = 10_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (ok(v)) return v;
    if (Date.now() > end) throw new Error(`condition not reached: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function info(url: string): Promise<Record<string, unknown>> {
  const r = await fetch(`${url}/v1/file`);
  return (await r.json()) as Record<string, unknown>;
}

async function serveBytes(body: Buffer): Promise<string> {
  const srv: Server = createServer((_req, res) => res.writeHead(200, { 'content-length': body.length }).end(body));
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  cleanups.push(() => new Promise<void>((r) => srv.close(() => r())));
  return `http://127.0.0.1:${(srv.address() as AddressInfo).port}/img`;
}

const sha512 = (b: Buffer): string => createHash('sha512').update(b).digest('hex');

describe('data source', () => {
  it('downloads to ready-for-transfer, reports DataSourceInfo in Go field order, then transfer makes it ready', async () => {
    const img = Buffer.concat([randomBytes(1 << 20), Buffer.alloc(1 << 20)]);
    const url = await serveBytes(img);
    const h = await harness('download', { url });
    const i = await waitFor(() => info(h.url), (v) => v['state'] === 'ready-for-transfer');
    expect(Object.keys(i)).toEqual([
      'sourceType', 'parameters', 'name', 'diskUUID', 'expectedChecksum', 'filePath', 'uuid', 'size', 'virtualSize',
      'realSize', 'state', 'progress', 'processedSize', 'modificationTime', 'currentChecksum', 'message', 'sendingReference',
    ]);
    expect(i).toMatchObject({ sourceType: 'download', parameters: { url }, name: 'img1', uuid: 'u1234', size: img.length, progress: 100, currentChecksum: sha512(img) });
    expect(i['filePath']).toBe(join(h.dir, 'tmp', 'img1-u1234'));
    expect((await readFile(join(h.dir, 'tmp', 'img1-u1234'))).equals(img)).toBe(true);
    const t = await fetch(`${h.url}/v1/file?action=transfer`, { method: 'POST' });
    expect(t.status).toBe(200);
    expect((await info(h.url))['state']).toBe('ready');
    expect(h.sync.has(h.ds.filePath)).toBe(false); // forgotten, file kept for the manager
    await access(h.ds.filePath);
    expect((await fetch(`${h.url}/v1/file?action=transfer`, { method: 'POST' })).status).toBe(200);
  });

  it('refuses transfer before the file is ready, and upload on a non-upload source', async () => {
    const h = await harness('upload', {});
    const t = await fetch(`${h.url}/v1/file?action=transfer`, { method: 'POST' });
    expect(t.status).toBe(500);
    expect(await t.text()).toContain('datasource file current state is pending rather than ready-for-transfer');
    const url = await serveBytes(Buffer.alloc(512, 1));
    const d = await harness('download', { url });
    const u = await fetch(`${d.url}/v1/file?action=upload&size=512`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: new Blob([Buffer.alloc(512)]) });
    expect(u.status).toBe(400);
    expect(await u.text()).toContain('cannot do upload since data source type is download rather than upload');
  });

  it('accepts a multipart upload (part chunk) with the declared size', async () => {
    const h = await harness('upload', {});
    expect((await info(h.url))['state']).toBe('pending');
    const img = randomBytes(256 * 1024);
    const form = new FormData();
    form.append('other', 'x');
    form.append('chunk', new Blob([img]), 'blob');
    const r = await fetch(`${h.url}/v1/file?action=upload&size=${img.length}`, { method: 'POST', body: form });
    expect(r.status).toBe(200);
    const i = await waitFor(() => info(h.url), (v) => v['state'] === 'ready-for-transfer');
    expect(i['currentChecksum']).toBe(sha512(img));
  });

  it('answers a wait for a change of state the moment the state changes, at once when it already differs, after its time when it does not, and forgets a caller that went away', async () => {
    const h = await harness('upload', {});
    const wait = async (state: string, seconds: number, signal?: AbortSignal) => {
      const r = await fetch(`${h.url}/v1/file?waitWhile=${state}&wait=${seconds}`, signal ? { signal } : {});
      return { status: r.status, waits: r.headers.get('x-bis-waits'), body: (await r.json()) as Record<string, unknown> };
    };
    // already another state: at once
    expect(await wait('', 30)).toMatchObject({ status: 200, waits: 'state', body: { state: 'pending' } });
    // no change within its time: the same state, still saying it waited
    expect(await wait('pending', 0)).toMatchObject({ status: 200, waits: 'state', body: { state: 'pending' } });
    // waits while pending: answered by the upload's end, not by its time (30 s, above the test's timeout)
    let answered = false;
    const waiting = wait('pending', 30).finally(() => (answered = true));
    await waitFor(async () => h.sync.listenerCount('change'), (n) => n === 1);
    expect(answered).toBe(false);
    const img = randomBytes(64 * 1024);
    const form = new FormData();
    form.append('chunk', new Blob([img]), 'blob');
    expect((await fetch(`${h.url}/v1/file?action=upload&size=${img.length}`, { method: 'POST', body: form })).status).toBe(200);
    const changed = await waiting;
    expect(changed.waits).toBe('state');
    expect(['starting', 'in-progress', 'ready-for-transfer']).toContain(changed.body['state']);
    await waitFor(() => info(h.url), (v) => v['state'] === 'ready-for-transfer');
    // the transfer (a manager took the file) ends a wait while ready-for-transfer
    const transferred = wait('ready-for-transfer', 30);
    await waitFor(async () => h.sync.listenerCount('change'), (n) => n === 1);
    expect((await fetch(`${h.url}/v1/file?action=transfer`, { method: 'POST' })).status).toBe(200);
    expect((await transferred).body).toMatchObject({ state: 'ready', currentChecksum: sha512(img) });
    expect(h.sync.listenerCount('change')).toBe(0);
    // a caller that goes away: its wait ends and nothing listens for it any more
    const ac = new AbortController();
    const gone = wait('ready', 30, ac.signal).catch((e: Error) => e.name);
    await waitFor(async () => h.sync.listenerCount('change'), (n) => n === 1);
    ac.abort();
    expect(await gone).toBe('AbortError');
    await waitFor(async () => h.sync.listenerCount('change'), (n) => n === 0);
    // bounded: a state that is none, a wait too long
    for (const q of ['waitWhile=done&wait=1', 'waitWhile=ready&wait=31', 'waitWhile=ready&wait=x']) {
      const r = await fetch(`${h.url}/v1/file?${q}`);
      expect(r.status).toBe(400);
      expect(await r.text()).toContain('waitWhile must be a file state and wait 0 to 30 seconds');
    }
  });

  it('fails an upload whose body is shorter than the declared size', async () => {
    const h = await harness('upload', {});
    const form = new FormData();
    form.append('chunk', new Blob([randomBytes(1024)]), 'blob');
    const r = await fetch(`${h.url}/v1/file?action=upload&size=4096`, { method: 'POST', body: form });
    expect(r.status).toBe(500);
    expect(await r.text()).toContain('processed data size 1024 does not match the expected file size 4096');
    await expect(access(`${h.ds.filePath}.tmp`)).rejects.toThrow();
  });

  it('refuses an upload whose declared size is above the limit with 413, before reading the body', async () => {
    const h = await harness('upload', {}, { sizeLimit: { maxImageSize: 1 << 20 } });
    const limitMsg = `is larger than the limit of ${1 << 20} bytes (the backing-image-max-size setting)`;
    // The client announces 64 MiB but sends only its first 64 KiB: the reply comes without the rest.
    const whole = await new Promise<{ status: number; body: string; connection: string | undefined }>((resolve, reject) => {
      const req = request({ host: '127.0.0.1', port: Number(new URL(h.url).port), method: 'POST', path: `/v1/file?action=upload&size=${64 << 20}`, headers: { 'content-type': 'application/octet-stream', 'content-length': 64 << 20 } }, (res) => {
        let body = '';
        res.setEncoding('utf8').on('data', (c: string) => (body += c)).on('end', () => resolve({ status: res.statusCode ?? 0, body, connection: res.headers.connection }));
      });
      req.on('error', reject);
      req.write(Buffer.alloc(64 << 10));
    });
    expect(whole.status).toBe(413);
    expect(whole.body).toBe(`the upload's declared size of ${64 << 20} bytes ${limitMsg}\n`);
    expect(whole.connection).toBe('close');
    const part = await fetch(`${h.url}/v1/file?action=uploadPart&size=${(1 << 20) + 512}&offset=0`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: Buffer.alloc(512) });
    expect(part.status).toBe(413);
    expect(await part.text()).toContain(limitMsg);
    await expect(access(h.ds.filePath)).rejects.toThrow();
    // Nothing was started: an upload within the limit still works.
    const img = randomBytes(1 << 20);
    const ok = await fetch(`${h.url}/v1/file?action=upload&size=${img.length}`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: img });
    expect(ok.status).toBe(200);
    expect((await readFile(h.ds.filePath)).equals(img)).toBe(true);
  });

  it('completes a resumable upload after a dropped connection', async () => {
    const h = await harness('upload', {});
    const img = randomBytes(3 << 20);
    const port = (h.app.server.address() as AddressInfo).port;
    // First part: send 1 MiB of a 2 MiB part, then drop the connection.
    await new Promise<void>((resolve) => {
      const req = request({ host: '127.0.0.1', port, method: 'POST', path: `/v1/file?action=uploadPart&size=${img.length}&offset=0`, headers: { 'content-type': 'application/octet-stream', 'content-length': 2 << 20 } });
      req.on('error', () => resolve());
      req.write(img.subarray(0, 1 << 20), () => setTimeout(() => { req.destroy(); resolve(); }, 100));
    });
    const off = await waitFor(async () => (await (await fetch(`${h.url}/v1/file?action=uploadOffset`)).json()) as { offset: number; size: number }, (v) => v.offset === 1 << 20);
    expect(off).toEqual({ size: img.length, offset: 1 << 20 });
    const bad = await fetch(`${h.url}/v1/file?action=uploadPart&size=${img.length}&offset=0`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: img.subarray(0, 10) });
    expect(bad.status).toBe(409);
    expect(await bad.text()).toContain('the next byte expected is 1048576');
    const rest = await fetch(`${h.url}/v1/file?action=uploadPart&size=${img.length}&offset=${off.offset}`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: img.subarray(off.offset) });
    expect(rest.status).toBe(200);
    expect(await rest.json()).toEqual({ size: img.length, offset: img.length });
    const i = await waitFor(() => info(h.url), (v) => v['state'] === 'ready-for-transfer');
    expect(i['currentChecksum']).toBe(sha512(img));
    expect((await readFile(h.ds.filePath)).equals(img)).toBe(true);
  });

  it('fails with Longhorn\'s message when processing does not begin in time', async () => {
    const h = await harness('upload', {}, { beginTimeoutMs: 200 });
    const i = await waitFor(() => info(h.url), (v) => v['state'] === 'failed', 5000);
    expect(i['message']).toBe(BEGIN_TIMEOUT_MESSAGE);
  });

  it('reports a checksum mismatch as failed with both values', async () => {
    const img = randomBytes(4096);
    const url = await serveBytes(img);
    const h = await harness('download', { url }, { checksum: 'sha256:' + '1'.repeat(64) });
    const i = await waitFor(() => info(h.url), (v) => v['state'] === 'failed');
    expect(i['message']).toContain(`sha256:${'1'.repeat(64)}`);
    expect(i['message']).toContain(`sha256:${createHash('sha256').update(img).digest('hex')}`);
  });
});

describe('data source configuration', () => {
  it('names the missing or bad parameter', () => {
    expect(() => validateDataSourceConfig({ name: 'ab', uuid: 'b', sourceType: 'ftp' })).toThrow(/unknown --source-type "ftp"/);
    expect(() => validateDataSourceConfig({ name: 'ab', uuid: 'b', sourceType: 'download', parameters: {} })).toThrow(/missing parameter "url"/);
    expect(() => validateDataSourceConfig({ name: 'ab', uuid: 'b', sourceType: 'restore', parameters: { 'backup-url': 's3://x' } })).toThrow(/missing parameter "concurrent-limit"/);
    expect(() => validateDataSourceConfig({ name: 'ab', uuid: 'b', sourceType: 'restore', parameters: { 'backup-url': 's3://x', 'concurrent-limit': '0' } })).toThrow(/"concurrent-limit" value "0"/);
    expect(() => validateDataSourceConfig({ name: 'ab', uuid: 'b', sourceType: 'clone', parameters: { 'backing-image': 'xy', 'backing-image-uuid': 'y' } })).toThrow(/"encryption"/);
    expect(() => validateDataSourceConfig({ name: 'ab', uuid: 'b', sourceType: 'clone', parameters: { 'backing-image': 'xy', 'backing-image-uuid': 'y', encryption: 'encrypt' } })).toThrow(/secret is not provided/);
    expect(() => validateDataSourceConfig({ name: 'ab', uuid: 'b', sourceType: 'export-from-volume', parameters: { 'snapshot-name': 's', 'sender-address': 'h:1', 'volume-size': '1000' } })).toThrow(/"volume-size"/);
    expect(() => validateDataSourceConfig({ name: 'ab', uuid: 'b', sourceType: 'export-from-volume', parameters: { 'snapshot-name': 's', 'sender-address': 'h:1', 'volume-size': '1024', 'export-type': 'vmdk' } })).toThrow('invalid parameter "export-type" value "vmdk": expected raw or qcow2');
    expect(() => validateDataSourceConfig({ uuid: 'b', sourceType: 'upload' })).toThrow(/name or uuid is not specified/);
  });

  it('parses k=v values strictly (quirk 14)', () => {
    expect(parseKeyValues('--parameters', ['url=http://h/a?x=1'])).toEqual({ url: 'http://h/a?x=1' });
    expect(() => parseKeyValues('--parameters', ['url'])).toThrow('invalid --parameters value "url": expected key=value');
    expect(() => parseKeyValues('--credential', ['=v'])).toThrow(/the key is empty/);
  });
});
