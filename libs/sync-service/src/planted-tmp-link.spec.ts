import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import type { FastifyInstance } from 'fastify';
import { createFileSources } from '@bis/file-sources';
import { DISK_UUID, createSandbox, httpRequest, snapshotOutside, type Sandbox } from '@bis/disk-path/testing';
import { SyncService } from './sync-service.js';
import { startSyncServer } from './server.js';
import { encodeFileId } from './sync-api.js';

/**
 * The check-then-use race of path confinement: `file-path` is confined when the receive is launched, and the
 * record's `<file>.tmp` is cleaned then; a symbolic link planted at the `.tmp` name afterwards (pointing out of the
 * disk) must not make the receiver create, truncate or write the link's target. The receiver opens the file with
 * O_NOFOLLOW and refuses the link (400); everything outside the disk root stays as it was.
 */
let s: Sandbox;
let svc: SyncService;
let server: FastifyInstance;
let port: number;

beforeAll(async () => {
  s = await createSandbox('planted-tmp-');
  svc = new SyncService({ diskPath: s.root, sources: createFileSources({}), monitorIntervalMs: 0, receiverHost: '127.0.0.1' });
  server = await startSyncServer(svc, { host: '127.0.0.1', port: 0 });
  port = (server.server.address() as { port: number }).port;
});

afterAll(async () => {
  await server?.close();
  await svc?.close();
  await s?.remove();
});

async function freePort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const p = (srv.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  return p;
}

async function waitListening(p: number, timeoutMs = 30_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const c = net.connect(p, '127.0.0.1');
      c.once('connect', () => {
        c.destroy();
        resolve(true);
      });
      c.once('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > until) throw new Error(`nothing listens on port ${p}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('a symbolic link planted at the .tmp name after the receive was launched', () => {
  it('is refused by the ssync receiver (O_NOFOLLOW): the file outside the disk is not created, truncated or written', async () => {
    const file = `${s.root}/backing-images/plant-x/backing`;
    const rxPort = await freePort();
    const launch = await httpRequest(
      port,
      'POST',
      `/v1/files?action=receiveFromPeer&file-path=${encodeURIComponent(file)}&uuid=x&disk-uuid=${DISK_UUID}&size=4096&port=${rxPort}`,
    );
    expect(launch).toEqual({ status: 200, text: '' });
    await waitListening(rxPort);
    const before = await snapshotOutside(s);
    const victim = await fsp.readFile(s.victimFile);
    // planted between the launch's clean-up and the sender's open: to a file outside, and to a name that does not
    // exist yet outside (a create through the link)
    await fsp.symlink(s.victimFile, `${file}.tmp`);
    const open = await httpRequest(rxPort, 'GET', '/v1-ssync/open?begin=0&end=4096');
    expect(open.status).toBe(400);
    expect(open.text).toContain(`refusing to write ${file}.tmp: it is a symbolic link`);
    await fsp.rm(`${file}.tmp`);
    await fsp.symlink(`${s.base}/created-through-link`, `${file}.tmp`);
    const again = await httpRequest(rxPort, 'GET', '/v1-ssync/open?begin=0&end=4096');
    expect(again.status).toBe(400);
    expect(await snapshotOutside(s)).toEqual(before);
    expect(await fsp.readFile(s.victimFile)).toEqual(victim);
    await expect(fsp.lstat(`${s.base}/created-through-link`)).rejects.toMatchObject({ code: 'ENOENT' });
    expect((await httpRequest(port, 'DELETE', `/v1/files/${encodeFileId(file)}`)).status).toBe(200);
    // the record's clean-up removes the link, not its target
    expect(await snapshotOutside(s)).toEqual(before);
  });
});
