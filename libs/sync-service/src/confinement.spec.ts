import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import type { FastifyInstance } from 'fastify';
import { createFileSources } from '@bis/file-sources';
import {
  DISK_UUID,
  createSandbox,
  httpRequest,
  snapshotOutside,
  traversalCases,
  validBackingFile,
  type Sandbox,
} from '@bis/disk-path/testing';
import { SyncService } from './sync-service.js';
import { startSyncServer } from './server.js';
import { encodeFileId } from './sync-api.js';

/**
 * The sync HTTP service (`/v1/files`, real server on loopback) against the traversal table: every route that takes
 * a path refuses each attempt with 400 naming the parameter, and nothing outside the disk root is created, changed
 * or removed (a listing of the sandbox, sizes and mtimes, before and after each request).
 */
let s: Sandbox;
let svc: SyncService;
let server: FastifyInstance;
let port: number;

beforeAll(async () => {
  s = await createSandbox('sync-confinement-');
  svc = new SyncService({ diskPath: s.root, sources: createFileSources({}), monitorIntervalMs: 0 });
  server = await startSyncServer(svc, { host: '127.0.0.1', port: 0 });
  port = (server.server.address() as { port: number }).port;
});

afterAll(async () => {
  await server?.close();
  await svc?.close();
  await s?.remove();
});

const octet = { 'content-type': 'application/octet-stream' };

describe('sync HTTP service: path confinement', () => {
  it("keeps working for Longhorn's absolute file paths inside the disk (positive control)", async () => {
    const good = validBackingFile(s, 'good', 'x');
    const up = await httpRequest(port, 'POST', `/v1/files?action=upload&file-path=${encodeURIComponent(good)}&uuid=x&disk-uuid=${DISK_UUID}&size=512`, Buffer.alloc(512, 1), octet);
    expect(up).toEqual({ status: 200, text: '' });
    const info = await httpRequest(port, 'GET', `/v1/files/${encodeFileId(good)}`);
    expect(JSON.parse(info.text)).toMatchObject({ filePath: good, state: 'ready', size: 512 });
    expect((await httpRequest(port, 'DELETE', `/v1/files/${encodeFileId(good)}`)).status).toBe(200);
    await expect(fsp.stat(good)).rejects.toThrow('ENOENT');
  });

  it('serves a file whose id is longer than fastify\'s default parameter limit (a deep path inside the disk)', async () => {
    const deep = validBackingFile(s, `deep-${'d'.repeat(165)}`, 'y'.repeat(60));
    expect(encodeFileId(deep).length).toBeGreaterThan(200);
    const up = await httpRequest(port, 'POST', `/v1/files?action=upload&file-path=${encodeURIComponent(deep)}&uuid=${'y'.repeat(60)}&disk-uuid=${DISK_UUID}&size=512`, Buffer.alloc(512, 2), octet);
    expect(up).toEqual({ status: 200, text: '' });
    const info = await httpRequest(port, 'GET', `/v1/files/${encodeFileId(deep)}`);
    expect(info.status).toBe(200);
    expect(JSON.parse(info.text)).toMatchObject({ filePath: deep, state: 'ready', size: 512 });
    expect((await httpRequest(port, 'DELETE', `/v1/files/${encodeFileId(deep)}`)).status).toBe(200);
    await fsp.rm(deep.slice(0, deep.lastIndexOf('/')), { recursive: true });
  });

  it('refuses the reported attacks: a download and a registration+DELETE outside the disk', async () => {
    const before = await snapshotOutside(s);
    const dl = await httpRequest(
      port,
      'POST',
      `/v1/files?action=downloadFromURL&file-path=${encodeURIComponent(`${s.base}/written-by-attacker`)}&uuid=y&url=${encodeURIComponent('http://127.0.0.1:9/x')}&disk-uuid=${DISK_UUID}`,
    );
    expect(dl.status).toBe(400);
    expect(dl.text).toContain('invalid file-path');
    expect(dl.text).toContain('outside the disk root');
    const reg = await httpRequest(port, 'POST', `/v1/files?action=upload&file-path=${encodeURIComponent(s.victimFile)}&uuid=z&size=512`, Buffer.alloc(512), octet);
    expect(reg.status).toBe(400);
    const del = await httpRequest(port, 'DELETE', `/v1/files/${encodeURIComponent(s.victimFile)}`);
    expect(del.status).toBe(400);
    expect(del.text).toContain('invalid file id');
    expect(await snapshotOutside(s)).toEqual(before);
    expect(svc.list()).toEqual({});
  });

  it('refuses every traversal attempt on every route, before anything changes', async () => {
    const cases = traversalCases(s);
    expect(cases.length).toBeGreaterThanOrEqual(25);
    const good = encodeURIComponent(validBackingFile(s, 'good', 'x'));
    const goodTmp = encodeURIComponent(`${s.root}/tmp/good-x`);
    for (const c of cases) {
      const w = c.filePathWire;
      const attempts: Array<{ what: string; method: string; url: string; body?: Buffer; headers?: Record<string, string>; names: string }> = [
        { what: 'downloadFromURL', method: 'POST', url: `/v1/files?action=downloadFromURL&file-path=${w}&uuid=x&url=http%3A%2F%2F127.0.0.1%3A9%2Fi&disk-uuid=${DISK_UUID}`, names: 'file-path' },
        { what: 'upload', method: 'POST', url: `/v1/files?action=upload&file-path=${w}&uuid=x&size=512`, body: Buffer.alloc(512, 2), headers: octet, names: 'file-path' },
        { what: 'receiveFromPeer', method: 'POST', url: `/v1/files?action=receiveFromPeer&file-path=${w}&uuid=x&size=512&port=0`, names: 'file-path' },
        { what: 'restoreFromBackupURL', method: 'POST', url: `/v1/files?action=restoreFromBackupURL&file-path=${w}&uuid=x&backup-url=vfs%3A%2F%2F%2Fnowhere%3FbackingImage%3Dab&concurrent-limit=1`, names: 'file-path' },
        { what: 'cloneFromBackingImage (file-path)', method: 'POST', url: `/v1/files?action=cloneFromBackingImage&file-path=${w}&uuid=x&backing-image=good&backing-image-uuid=y&encryption=ignore`, names: 'file-path' },
        {
          what: 'cloneFromBackingImage (source)',
          method: 'POST',
          url: `/v1/files?action=cloneFromBackingImage&file-path=${good}&uuid=x&backing-image=${encodeURIComponent(c.name)}&backing-image-uuid=${encodeURIComponent(c.uuid)}&encryption=ignore`,
          names: c.names === 'name' ? 'backing-image' : 'backing-image-uuid',
        },
        { what: 'fetch (src)', method: 'POST', url: `/v1/files?action=fetch&src-file-path=${w}&dst-file-path=${good}&uuid=x&disk-uuid=${DISK_UUID}&size=512`, names: 'src-file-path' },
        { what: 'fetch (dst)', method: 'POST', url: `/v1/files?action=fetch&src-file-path=${goodTmp}&dst-file-path=${w}&uuid=x&disk-uuid=${DISK_UUID}&size=512`, names: 'dst-file-path' },
        { what: 'GET id', method: 'GET', url: `/v1/files/${w}`, names: 'file id' },
        { what: 'DELETE id', method: 'DELETE', url: `/v1/files/${w}`, names: 'file id' },
        { what: 'download id', method: 'GET', url: `/v1/files/${w}/download`, names: 'file id' },
        { what: 'forget id', method: 'POST', url: `/v1/files/${w}?action=forget`, names: 'file id' },
        { what: 'sendToPeer id', method: 'POST', url: `/v1/files/${w}?action=sendToPeer&to-address=127.0.0.1%3A9`, names: 'file id' },
      ];
      for (const a of attempts) {
        const before = await snapshotOutside(s);
        const r = await httpRequest(port, a.method, a.url, a.body, a.headers);
        if (c.wellFormedId && a.names === 'file id') {
          // a well-formed id of a file that does not exist: looked up (404 or Longhorn's no-op), nothing touched
          expect([404, 200, 500]).toContain(r.status);
          expect(await snapshotOutside(s)).toEqual(before);
          continue;
        }
        expect({ case: c.label, what: a.what, status: r.status }).toEqual({ case: c.label, what: a.what, status: 400 });
        // the router itself may refuse a URL it cannot route (e.g. an encoded NUL in a segment); otherwise the message names the parameter
        if (!r.text.startsWith('{')) {
          expect({ case: c.label, what: a.what, text: r.text.startsWith(`invalid ${a.names} `) }).toEqual({ case: c.label, what: a.what, text: true });
        }
        expect({ case: c.label, what: a.what, outside: await snapshotOutside(s) }).toEqual({ case: c.label, what: a.what, outside: before });
      }
    }
    expect(svc.list()).toEqual({});
    // nothing was created inside the disk either
    expect((await fsp.readdir(`${s.root}/backing-images`)).sort()).toEqual(['evil-x', 'file-x', 'good-x', 'lnk-x', 'up-x']); // good-x: the positive control's emptied entry
  });
});
