import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import http from 'node:http';
import http2 from 'node:http2';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { gunzipSync } from 'node:zlib';
import type { AddressInfo } from 'node:net';
import { status } from '@grpc/grpc-js';
import { backingFilePath, encodeFileId, type FileInfo } from '@bis/sync-service';
import { buildDaemon, makeDisk, startDaemonProcess, type DaemonProcess } from './test-support/daemon-process.js';
import { sha512File, waitFor, writeSparseImage } from './test-support/images.js';
import { startFakeDataSource } from './test-support/fake-data-source.js';

const MiB = 1 << 20;
const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const FIXTURE_STORE = path.join(REPO_ROOT, 'libs/backupstore/test-data/longhorn-backupstore-lz4');
// the backupstore lock's 2 s check wait (Longhorn's) is not what these tests are about
const FAST_LOCKS = { BACKUPSTORE_LOCK_CHECK_WAIT_MS: '0' };

async function grpcError(p: Promise<unknown>): Promise<{ code: number; details: string }> {
  try {
    await p;
  } catch (err) {
    const e = err as { code: number; details: string };
    return { code: e.code, details: e.details };
  }
  throw new Error('expected the call to fail');
}

function waitFile(d: DaemonProcess, filePath: string, want: string, timeoutMs = 20_000): Promise<FileInfo> {
  return waitFor(`${filePath} ${want}`, async () => {
    const f = await d.sync.get(filePath);
    if (f.state === 'failed' && want !== 'failed') throw new Error(`failed: ${f.message}`);
    return f.state === want ? f : undefined;
  }, timeoutMs);
}

/** Fetches a prepared image into the daemon (stand-in data source) and waits until it is ready. */
async function readyImage(d: DaemonProcess, name: string, uuid: string, pattern: string, checksum = ''): Promise<string> {
  await fsp.mkdir(path.join(d.disk, 'tmp'), { recursive: true });
  const src = path.join(d.disk, 'tmp', `${name}-${uuid}`);
  const sha = await writeSparseImage(src, pattern);
  const ds = await startFakeDataSource({ filePath: src, uuid, state: 'ready-for-transfer', size: pattern.length * MiB });
  try {
    await d.client.fetch({ spec: { name, uuid, size: pattern.length * MiB, checksum, virtualSize: 0, realSize: 0 }, dataSourceAddress: ds.address });
  } finally {
    await ds.close();
  }
  await waitFor(`${name} settled`, async () => {
    const s = (await d.client.get(name, uuid)).status!.state;
    return s === 'ready' || s === 'failed' ? s : undefined;
  });
  return sha;
}

interface RawResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

function request(address: string, method: string, urlPath: string, body?: Buffer, headers: Record<string, string> = {}): Promise<RawResponse> {
  const [host, port] = address.split(':');
  return new Promise((resolve, reject) => {
    const req = http.request({ host, port: Number(port), method, path: urlPath, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

function multipart(boundary: string, parts: Array<{ name: string; filename?: string; data: Buffer }>): Buffer {
  const out: Buffer[] = [];
  for (const p of parts) {
    const disp = `form-data; name="${p.name}"${p.filename ? `; filename="${p.filename}"` : ''}`;
    const type = p.filename ? 'Content-Type: application/octet-stream\r\n' : '';
    out.push(Buffer.from(`--${boundary}\r\nContent-Disposition: ${disp}\r\n${type}\r\n`), p.data, Buffer.from('\r\n'));
  }
  out.push(Buffer.from(`--${boundary}--\r\n`));
  return Buffer.concat(out);
}

describe('backing-image-manager daemon: backups, sources, download, Watch (real processes)', () => {
  let root: string;
  const daemons: DaemonProcess[] = [];
  const servers: http.Server[] = [];
  const start = async (name: string, args: string[] = []) => {
    const d = await startDaemonProcess(await makeDisk(root, name), args, FAST_LOCKS);
    daemons.push(d);
    return d;
  };

  beforeAll(async () => {
    buildDaemon();
    root = await fsp.mkdtemp(path.join(os.tmpdir(), 'bim-actions-'));
  }, 120_000);

  afterAll(async () => {
    await Promise.all(daemons.map((d) => d.stop()));
    for (const s of servers) {
      s.closeAllConnections();
      s.close();
    }
    await fsp.rm(root, { recursive: true, force: true });
  });

  it('BackupCreate -> BackupStatus complete on a vfs target; a second backup of the name reports the newest', async () => {
    const d = await start('backup');
    const sha = await readyImage(d, 'bk-img', 'ub', 'dhdd');
    const store1 = path.join(root, 'store1');
    const store2 = path.join(root, 'store2');
    await fsp.mkdir(store1);
    await fsp.mkdir(store2);
    const req = {
      name: 'bk-img',
      uuid: 'ub',
      checksum: sha,
      backupTarget: `vfs://${store1}`,
      labels: ['app=test'],
      credential: {},
      compressionMethod: 'lz4',
      concurrentLimit: 2,
      parameters: { secret: 'sec', 'secret-namespace': 'ns' },
    };
    await d.client.backupCreate(req);
    const done = await waitFor('backup complete', async () => {
      const s = await d.client.backupStatus('bk-img');
      if (s.state === 'error') throw new Error(s.error);
      return s.state === 'complete' ? s : undefined;
    });
    expect(done).toEqual({ progress: 100, backupUrl: `vfs://${store1}?backingImage=bk-img`, error: '', state: 'complete' });
    const cfgText = await fsp.readFile(path.join(store1, 'backupstore/backing-images/backing-images/bk-img/backing-image.cfg'), 'utf8');
    const cfg = JSON.parse(cfgText) as Record<string, unknown>;
    expect(cfg).toMatchObject({ Name: 'bk-img', Size: String(4 * MiB), Checksum: sha, Labels: { app: 'test' }, CompressionMethod: 'lz4', Secret: 'sec', SecretNamespace: 'ns' });
    expect((cfg['Blocks'] as unknown[]).length).toBe(2); // 3 data MiB in two 2 MiB blocks; the hole block is skipped

    // the same name to another target: BackupStatus follows the newest backup (Longhorn reported the oldest)
    await d.client.backupCreate({ ...req, backupTarget: `vfs://${store2}` });
    const second = await waitFor('second backup complete', async () => {
      const s = await d.client.backupStatus('bk-img');
      return s.state === 'complete' && s.backupUrl.includes(store2) ? s : undefined;
    });
    expect(second.backupUrl).toBe(`vfs://${store2}?backingImage=bk-img`);
    // again to the first target: a complete backup of that name is kept and reported complete at once
    await d.client.backupCreate(req);
    const third = await waitFor('third backup complete', async () => {
      const s = await d.client.backupStatus('bk-img');
      return s.state === 'complete' && s.backupUrl.includes(store1) ? s : undefined;
    });
    expect(third.progress).toBe(100);
    expect(await fsp.readFile(path.join(store1, 'backupstore/backing-images/backing-images/bk-img/backing-image.cfg'), 'utf8')).toBe(cfgText);

    // a target that cannot be opened: the status carries the error
    await d.client.backupCreate({ ...req, backupTarget: 'bogus://nowhere' });
    const failed = await waitFor('backup error', async () => {
      const s = await d.client.backupStatus('bk-img');
      return s.state === 'error' ? s : undefined;
    });
    expect(failed.error).toContain('bogus');
  }, 60_000);

  it('BackupCreate / BackupStatus error paths: missing target, bad name, file not ready, unknown image', async () => {
    const d = await start('backup-errors');
    await readyImage(d, 'good', 'ug', 'dd');
    const base = { name: 'good', uuid: 'ug', checksum: '', backupTarget: `vfs://${root}`, labels: [], credential: {}, compressionMethod: 'lz4', concurrentLimit: 1, parameters: {} };
    const noTarget = await grpcError(d.client.backupCreate({ ...base, backupTarget: '' }));
    expect(noTarget.details).toContain('missing input parameter: backup target');
    const badLabel = await grpcError(d.client.backupCreate({ ...base, labels: ['nolabel'] }));
    expect(badLabel.details).toContain('invalid label "nolabel"');
    // a 65-character name is a valid backing-image name but not a valid backup name (at most 64)
    const long = 'x'.repeat(65);
    await readyImage(d, long, 'ux', 'd');
    const badName = await grpcError(d.client.backupCreate({ ...base, name: long, uuid: 'ux' }));
    expect(badName.details).toContain(`invalid backing image name ${long}`);
    // a one-character name breaks Longhorn's backing-image name rule: refused before the image is looked up
    const oneChar = await grpcError(d.client.backupCreate({ ...base, name: 'x', uuid: 'ux' }));
    expect(oneChar).toEqual({ code: status.INVALID_ARGUMENT, details: 'invalid name "x": a backing image name must match ^[a-z0-9][a-z0-9_.-]+$' });
    // a failed image cannot be backed up
    await readyImage(d, 'broken', 'uk', 'd', 'ab'.repeat(64));
    expect((await d.client.get('broken', 'uk')).status!.state).toBe('failed');
    const notReady = await grpcError(d.client.backupCreate({ ...base, name: 'broken', uuid: 'uk' }));
    expect(notReady).toEqual({ code: status.FAILED_PRECONDITION, details: 'invalid backing image state failed for the backup' });
    const unknown = await grpcError(d.client.backupCreate({ ...base, name: 'nope', uuid: 'un' }));
    expect(unknown).toEqual({ code: status.NOT_FOUND, details: 'cannot find backing image nope(un)' });
    const noStatus = await grpcError(d.client.backupStatus('nope'));
    expect(noStatus).toEqual({ code: status.NOT_FOUND, details: 'failed to get backup status nope: backup backing image not found nope' });
  }, 60_000);

  it('downloadFromURL from a loopback server (allowed host), refused without the allowlist; clone (ignore) of the result', async () => {
    const data = Buffer.concat([randomBytes(MiB), Buffer.alloc(MiB), randomBytes(MiB)]);
    const sha = createHash('sha512').update(data).digest('hex');
    const server = http.createServer((_req, res) => {
      res.setHeader('Content-Length', data.length);
      res.end(data);
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/image.raw`;

    const d = await start('download', ['--allow-source-host', '127.0.0.1']);
    const filePath = backingFilePath(d.disk, 'dl-img', 'udl');
    await d.sync.downloadFromURL({ filePath, uuid: 'udl', url, diskUUID: 'disk-download', expectedChecksum: sha });
    const ready = await waitFile(d, filePath, 'ready');
    expect(ready).toMatchObject({ currentChecksum: sha, size: data.length, progress: 100 });
    expect(await sha512File(filePath)).toBe(sha);
    expect((await d.client.get('dl-img', 'udl')).status!.checksum).toBe(sha);

    const clonePath = backingFilePath(d.disk, 'cl-img', 'ucl');
    await d.sync.cloneFromBackingImage({ filePath: clonePath, uuid: 'ucl', backingImage: 'dl-img', backingImageUUID: 'udl', encryption: 'ignore' });
    expect((await waitFile(d, clonePath, 'ready')).currentChecksum).toBe(sha);
    expect(await sha512File(clonePath)).toBe(sha);

    const guarded = await start('download-guarded');
    const refusedPath = backingFilePath(guarded.disk, 'dl-img', 'udl');
    await guarded.sync.downloadFromURL({ filePath: refusedPath, uuid: 'udl', url });
    const refused = await waitFile(guarded, refusedPath, 'failed');
    expect(refused.message).toContain('refusing to connect to 127.0.0.1');
    await expect(fsp.stat(refusedPath + '.tmp')).rejects.toThrow();
  }, 60_000);

  it('upload: multipart parts before the first chunk part are skipped; no chunk part is an error', async () => {
    const d = await start('upload');
    const data = randomBytes(2 * MiB);
    const sha = createHash('sha512').update(data).digest('hex');
    const filePath = backingFilePath(d.disk, 'up-img', 'uup');
    const boundary = 'bisboundary42';
    const body = multipart(boundary, [
      { name: 'meta', filename: 'meta.json', data: Buffer.from('{"not":"the image"}') },
      { name: 'note', data: Buffer.from('a plain field') },
      { name: 'chunk', filename: 'blob', data },
    ]);
    const q = new URLSearchParams({ action: 'upload', 'file-path': filePath, uuid: 'uup', size: String(data.length), 'expected-checksum': sha });
    const res = await request(d.syncAddress, 'POST', `/v1/files?${q}`, body, { 'Content-Type': `multipart/form-data; boundary=${boundary}` });
    expect(res.body.toString()).toBe('');
    expect(res.status).toBe(200);
    expect((await d.sync.get(filePath)).state).toBe('ready');
    expect(await sha512File(filePath)).toBe(sha);

    const other = backingFilePath(d.disk, 'up-none', 'unone');
    const q2 = new URLSearchParams({ action: 'upload', 'file-path': other, uuid: 'unone', size: String(MiB) });
    const none = await request(d.syncAddress, 'POST', `/v1/files?${q2}`, multipart(boundary, [{ name: 'meta', filename: 'm', data: Buffer.alloc(MiB) }]), {
      'Content-Type': `multipart/form-data; boundary=${boundary}`,
    });
    expect(none.status).toBe(500);
    expect(none.body.toString()).toContain('no file part named chunk');
  });

  it('restoreFromBackupURL from the Longhorn fixture store: SHA-512 equals the config Checksum', async () => {
    const store = path.join(root, 'fixture-copy');
    await fsp.cp(FIXTURE_STORE, store, { recursive: true }); // the restore takes a lock: never write into the fixture
    const cfg = JSON.parse(await fsp.readFile(path.join(store, 'backupstore/backing-images/backing-images/fixture-lz4/backing-image.cfg'), 'utf8')) as {
      Checksum: string;
      Size: string;
    };
    const d = await start('restore');
    const filePath = backingFilePath(d.disk, 'restored', 'urs');
    const backupUrl = `vfs://${store}?backingImage=fixture-lz4`;
    await expect(d.sync.restoreFromBackupURL({ filePath, uuid: 'urs', backupUrl, concurrentLimit: 0 })).rejects.toThrow('invalid concurrent limit 0');
    await d.sync.restoreFromBackupURL({ filePath, uuid: 'urs', backupUrl, concurrentLimit: 2, expectedChecksum: cfg.Checksum });
    const ready = await waitFile(d, filePath, 'ready');
    // The fixture's size is not a multiple of 512: the copy is the restored bytes zero-padded to the next one, the
    // backup's checksum is that of the bytes before the padding, and the copy's checksum is of the file as stored.
    const size = Number(cfg.Size);
    const stored = await fsp.readFile(filePath);
    expect(ready.size).toBe(Math.ceil(size / 512) * 512);
    expect(stored.length).toBe(ready.size);
    expect(createHash('sha512').update(stored.subarray(0, size)).digest('hex')).toBe(cfg.Checksum);
    expect(stored.subarray(size).every((b) => b === 0)).toBe(true);
    expect(ready.currentChecksum).toBe(await sha512File(filePath));
  }, 60_000);

  it('download endpoint: gzip with the whole name in Content-Disposition, raw with Content-Length, HEAD, non-ready refused', async () => {
    const d = await start('download-endpoint');
    const sha = await readyImage(d, 'my-image-v2', 'udn', 'dhd');
    const filePath = backingFilePath(d.disk, 'my-image-v2', 'udn');
    const id = encodeFileId(filePath);
    const gz = await request(d.syncAddress, 'GET', `/v1/files/${id}/download`);
    expect(gz.status).toBe(200);
    expect(gz.headers['content-type']).toBe('application/octet-stream');
    expect(gz.headers['content-disposition']).toBe('attachment; filename=my-image-v2.gz');
    expect(gz.headers['content-length']).toBeUndefined();
    expect(createHash('sha512').update(gunzipSync(gz.body)).digest('hex')).toBe(sha);

    const raw = await request(d.syncAddress, 'GET', `/v1/files/${id}/download?forV2Creation=true`);
    expect(raw.status).toBe(200);
    expect(raw.headers['content-length']).toBe(String(3 * MiB));
    expect(createHash('sha512').update(raw.body).digest('hex')).toBe(sha);

    const head = await request(d.syncAddress, 'HEAD', `/v1/files/${id}/download?forV2Creation=true`);
    expect(head.status).toBe(200);
    expect(head.headers['content-length']).toBe(String(3 * MiB));
    expect(head.body.length).toBe(0);
    const headGz = await request(d.syncAddress, 'HEAD', `/v1/files/${id}/download`);
    expect(headGz.headers['content-disposition']).toBe('attachment; filename=my-image-v2.gz');

    await readyImage(d, 'bad-one', 'ubd', 'd', 'ab'.repeat(64));
    const refused = await request(d.syncAddress, 'GET', `/v1/files/${encodeFileId(backingFilePath(d.disk, 'bad-one', 'ubd'))}/download`);
    expect(refused.status).toBe(500);
    expect(refused.body.toString()).toContain('cannot get the reader for a non-ready file, current state failed');
    const unknown = await request(d.syncAddress, 'GET', `/v1/files/${encodeFileId(backingFilePath(d.disk, 'none', 'u0'))}/download`);
    expect(unknown.status).toBe(500);
    expect(unknown.body.toString()).toContain('nil sync file');
  }, 60_000);

  it('Watch: a subscriber that reads nothing blocks neither the daemon nor another subscriber', async () => {
    const d = await start('watch', ['--watch-interval-ms', '100']);
    // the stalled subscriber: a raw HTTP/2 gRPC call with a receive window of 0, so no DATA frame can reach it
    const session = http2.connect(`http://${d.grpcAddress}`, { settings: { initialWindowSize: 0 } });
    session.on('error', () => undefined);
    const stalled = session.request({
      ':method': 'POST',
      ':path': '/bimrpc.BackingImageManagerService/Watch',
      'content-type': 'application/grpc',
      te: 'trailers',
    });
    stalled.on('error', () => undefined);
    let stalledBytes = 0;
    stalled.on('data', (c: Buffer) => (stalledBytes += c.length));
    stalled.end(Buffer.from([0, 0, 0, 0, 0])); // one empty message

    const watch = d.client.watch();
    let notes = 0;
    watch.on('data', () => notes++);
    watch.on('error', () => undefined);
    try {
      await new Promise((r) => setTimeout(r, 300));
      // many changes, each followed by calls that must be answered promptly
      for (let i = 0; i < 6; i++) {
        const before = notes;
        await readyImage(d, `w${i}`, `uw${i}`, 'd');
        // a List blocked behind the stalled subscriber would never be answered (the test's timeout catches it)
        await d.client.list();
        await waitFor(`notification after change ${i}`, async () => (notes > before ? true : undefined), 5000);
      }
      expect(stalledBytes).toBe(0);
      // once the stalled subscriber opens its window it gets notifications too
      session.settings({ initialWindowSize: 65535 });
      await d.client.delete('w0', 'uw0');
      await waitFor('the stalled subscriber drains', async () => (stalledBytes >= 5 ? true : undefined), 5000);
    } finally {
      watch.cancel();
      stalled.close();
      session.close();
    }
  }, 60_000);
});
