import { describe, it, expect, afterEach } from '@jest/globals';
import { createServer, type AddressInfo } from 'node:net';
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { execFileSync } from 'node:child_process';
import { randomBytes, createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createFileSources, type SizeLimitPolicy } from '@bis/file-sources';
import type { InternalAuth } from '@bis/internal-auth';
import { SyncService, SsyncSendError, sendFile, backingFilePath, type FileLayout } from '@bis/sync-service';
import { DataSource } from './data-source.js';
import { validateDataSourceConfig } from './config.js';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const sha512 = (b: Buffer): string => createHash('sha512').update(b).digest('hex');

async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address() as AddressInfo;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

async function start(
  sourceType: string,
  parameters: Record<string, string>,
  o: { exportReceiverPort?: number; checksum?: string; dir?: string; internalAuth?: InternalAuth; sizeLimit?: SizeLimitPolicy } = {},
) {
  const dir = o.dir ?? (await mkdtemp(join(tmpdir(), 'ds-x-')));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  const sync = new SyncService({ diskPath: dir, sources: createFileSources({ sizeLimit: o.sizeLimit }), monitorIntervalMs: 0, receiverHost: '127.0.0.1', internalAuth: o.internalAuth });
  cleanups.push(() => sync.close());
  const config = validateDataSourceConfig({ name: 'img1', uuid: 'u1', sourceType, parameters, checksum: o.checksum });
  const ds = new DataSource({
    config,
    diskPath: dir,
    diskUUID: 'disk-1',
    sync,
    exportReceiverPort: o.exportReceiverPort,
    receiverHost: '127.0.0.1',
    internalAuth: o.internalAuth,
    sizeLimit: o.sizeLimit,
  });
  await ds.start();
  cleanups.push(() => ds.close());
  return { ds, dir, sync };
}

async function until(ds: DataSource, states: string[], ms = 15_000) {
  const end = Date.now() + ms;
  for (;;) {
    const i = ds.info();
    if (states.includes(i.state)) return i;
    if (Date.now() > end) throw new Error(`state ${i.state} (${i.message}) did not become ${states.join('/')}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A volume snapshot as a replica would send it: data, a 1 MiB hole, data. */
async function volume(dir: string): Promise<{ path: string; bytes: Buffer; layout: FileLayout }> {
  const bytes = Buffer.concat([randomBytes(1 << 20), Buffer.alloc(1 << 20), randomBytes(1 << 20)]);
  const path = join(dir, 'snapshot.img');
  await writeFile(path, bytes);
  const layout: FileLayout = {
    size: bytes.length,
    data: [{ offset: 0, length: 1 << 20 }, { offset: 2 << 20, length: 1 << 20 }],
    holes: [{ offset: 1 << 20, length: 1 << 20 }],
  };
  return { path, bytes, layout };
}

describe('export-from-volume through the ssync sender', () => {
  it('receives a raw export from sendFile and reaches ready-for-transfer with the volume checksum', async () => {
    const src = await mkdtemp(join(tmpdir(), 'replica-'));
    cleanups.push(() => rm(src, { recursive: true, force: true }));
    const vol = await volume(src);
    const port = await freePort();
    const { ds } = await start('export-from-volume', { 'snapshot-name': 'snap-1', 'sender-address': '127.0.0.1:10000', 'volume-size': String(vol.bytes.length), 'export-type': 'raw' }, { exportReceiverPort: port });
    const sent = await sendFile({ path: vol.path, toAddress: `127.0.0.1:${port}`, layout: async () => vol.layout });
    expect(sent).toMatchObject({ size: vol.bytes.length, dataBytes: 2 << 20, holeBytes: 1 << 20 });
    const i = await until(ds, ['ready-for-transfer', 'failed']);
    expect(i).toMatchObject({ state: 'ready-for-transfer', size: vol.bytes.length, currentChecksum: sha512(vol.bytes) });
    expect((await readFile(ds.filePath)).equals(vol.bytes)).toBe(true);
    await ds.transfer();
    expect(ds.info().state).toBe('ready');
  });

  it('converts a qcow2 export (export-type=qcow2) and leaves no scratch files', async () => {
    const src = await mkdtemp(join(tmpdir(), 'replica-'));
    cleanups.push(() => rm(src, { recursive: true, force: true }));
    const vol = await volume(src);
    const port = await freePort();
    const { ds, dir } = await start('export-from-volume', { 'snapshot-name': 'snap-1', 'sender-address': '127.0.0.1:10000', 'volume-size': String(vol.bytes.length), 'export-type': 'qcow2' }, { exportReceiverPort: port });
    expect(['starting', 'in-progress']).toContain(ds.info().state);
    await sendFile({ path: vol.path, toAddress: `127.0.0.1:${port}`, layout: async () => vol.layout });
    const i = await until(ds, ['ready-for-transfer', 'failed']);
    expect(i.state).toBe('ready-for-transfer');
    expect(i.virtualSize).toBe(vol.bytes.length);
    const stored = await readFile(ds.filePath);
    expect(stored.subarray(0, 4).toString('latin1')).toBe('QFI\xfb');
    expect(i.currentChecksum).toBe(sha512(stored));
    // the qcow2 holds the volume's bytes
    execFileSync('qemu-img', ['convert', '-f', 'qcow2', '-O', 'raw', ds.filePath, join(src, 'back.raw')]);
    expect(sha512(await readFile(join(src, 'back.raw')))).toBe(sha512(vol.bytes));
    expect((await readdir(join(dir, 'tmp'))).filter((f) => f.includes('.export-'))).toEqual([]);
  });

  it('cancels a qcow2 export on shutdown: state failed, receiver port freed, no scratch files', async () => {
    const port = await freePort();
    const { ds, dir } = await start('export-from-volume', { 'snapshot-name': 's', 'sender-address': '127.0.0.1:10000', 'volume-size': String(3 << 20), 'export-type': 'qcow2' }, { exportReceiverPort: port });
    await new Promise((r) => setTimeout(r, 100));
    await ds.close();
    expect(ds.info()).toMatchObject({ state: 'failed', message: 'the export was cancelled' });
    expect((await readdir(join(dir, 'tmp'))).filter((f) => f.includes('.export-'))).toEqual([]);
    // the receiver no longer listens
    const srv = createServer();
    await new Promise<void>((resolve, reject) => srv.once('error', reject).listen(port, '127.0.0.1', () => resolve()));
    await new Promise<void>((r) => srv.close(() => r()));
  });
});

async function portIsFree(port: number): Promise<void> {
  const srv = createServer();
  await new Promise<void>((resolve, reject) => srv.once('error', reject).listen(port, '127.0.0.1', () => resolve()));
  await new Promise<void>((r) => srv.close(() => r()));
}

describe('export-from-volume: the receiver is internal', () => {
  for (const type of ['raw', 'qcow2']) {
    it(`refuses a sender without the internal token with 401 and writes nothing; the token's holder is served (${type})`, async () => {
      const src = await mkdtemp(join(tmpdir(), 'replica-'));
      cleanups.push(() => rm(src, { recursive: true, force: true }));
      const vol = await volume(src);
      const port = await freePort();
      const token = 't'.repeat(32);
      const params = { 'snapshot-name': 'snap-1', 'sender-address': '127.0.0.1:10000', 'volume-size': String(vol.bytes.length), 'export-type': type };
      const { ds, dir } = await start('export-from-volume', params, { exportReceiverPort: port, internalAuth: { token } });
      for (const bad of [undefined, 'w'.repeat(32)]) {
        const err = await sendFile({ path: vol.path, toAddress: `127.0.0.1:${port}`, layout: async () => vol.layout, token: bad }).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(SsyncSendError);
        expect(err).toMatchObject({ status: 401 });
        expect((err as Error).message).toContain('HTTP 401');
      }
      // nothing was received: no target file, and the data source still waits for the export
      expect(await readdir(join(dir, 'tmp'))).toEqual([]);
      expect(['starting', 'in-progress']).toContain(ds.info().state);
      await sendFile({ path: vol.path, toAddress: `127.0.0.1:${port}`, layout: async () => vol.layout, token });
      expect(await until(ds, ['ready-for-transfer', 'failed'], 30_000)).toMatchObject({ state: 'ready-for-transfer' });
    });
  }
});

describe('export-from-volume: size limit', () => {
  for (const type of ['raw', 'qcow2']) {
    it(`fails an export whose volume size is over the limit before a receiver listens (${type})`, async () => {
      const port = await freePort();
      const size = 4 << 20;
      const params = { 'snapshot-name': 'snap-1', 'sender-address': '127.0.0.1:10000', 'volume-size': String(size), 'export-type': type };
      const { ds, dir } = await start('export-from-volume', params, { exportReceiverPort: port, sizeLimit: { maxImageSize: 1 << 20 } });
      expect(ds.info()).toMatchObject({
        state: 'failed',
        message: `the volume's size of ${size} bytes is larger than the limit of ${1 << 20} bytes (the backing-image-max-size setting)`,
      });
      await portIsFree(port);
      expect(await readdir(join(dir, 'tmp'))).toEqual([]);
    });
  }
});

describe('clone', () => {
  it('clones a ready backing image on the same disk (encryption ignore)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'ds-clone-'));
    const bytes = Buffer.concat([randomBytes(300_000), Buffer.alloc(1 << 20), randomBytes(200_000)]);
    const padded = Buffer.concat([bytes, Buffer.alloc((512 - (bytes.length % 512)) % 512)]);
    const source = backingFilePath(dir, 'base', 'b-uuid');
    await mkdir(dirname(source), { recursive: true });
    await writeFile(source, padded);
    const { ds } = await start('clone', { 'backing-image': 'base', 'backing-image-uuid': 'b-uuid', encryption: 'ignore' }, { dir, checksum: sha512(padded) });
    const i = await until(ds, ['ready-for-transfer', 'failed']);
    expect(i).toMatchObject({ state: 'ready-for-transfer', size: padded.length, currentChecksum: sha512(padded), progress: 100 });
    expect((await readFile(ds.filePath)).equals(padded)).toBe(true);
  });

  it('fails a clone of a backing image that is not on this disk', async () => {
    const { ds } = await start('clone', { 'backing-image': 'nope', 'backing-image-uuid': 'x', encryption: 'ignore' });
    const i = await until(ds, ['failed']);
    expect(i.message).toContain('the source backing file does not exist');
  });
});
