import { afterEach, describe, expect, it } from '@jest/globals';
import type { AddressInfo } from 'node:net';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createFileSources } from '@bis/file-sources';
import { SyncService } from '@bis/sync-service';
import { validateDataSourceConfig } from './config.js';
import { DataSource } from './data-source.js';
import { SharedInstanceServers, type InstanceServer } from './servers.js';

const TOKEN = 'a-token-of-the-internal-calls-0123456789';
const auth = { token: TOKEN, allowUnauthenticated: false };
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function dataSource(name: string): Promise<{ ds: DataSource; sync: SyncService }> {
  const dir = await mkdtemp(join(tmpdir(), 'ds-shared-'));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  const sync = new SyncService({ diskPath: dir, sources: createFileSources({ allowSourceHosts: ['127.0.0.1'] }), monitorIntervalMs: 0 });
  cleanups.push(() => sync.close());
  const config = validateDataSourceConfig({ name, uuid: `u-${name}`, sourceType: 'upload', parameters: {} });
  const ds = new DataSource({ config, diskPath: dir, diskUUID: `disk-${name}`, sync, beginTimeoutMs: 60_000 });
  await ds.start();
  cleanups.push(() => ds.close());
  return { ds, sync };
}

const urlOf = (s: InstanceServer): string => `http://127.0.0.1:${(s.server.address() as AddressInfo).port}`;
const authed = { authorization: `Bearer ${TOKEN}` };

describe('SharedInstanceServers', () => {
  it('serves each data source on its own ports from apps built once, refuses calls without the token into that data source log, and closes one without the other', async () => {
    const servers = new SharedInstanceServers();
    cleanups.push(() => servers.close());
    const logs: Record<string, string[]> = { a: [], b: [] };
    const a = await dataSource('img-a');
    const b = await dataSource('img-b');
    const at = { host: '127.0.0.1', port: 0 };
    const aHttp = await servers.listenDataSource(a.ds, at, auth, (l) => logs['a']!.push(l));
    const bHttp = await servers.listenDataSource(b.ds, at, auth, (l) => logs['b']!.push(l));
    const aSync = await servers.listenSync(a.sync, at, auth);
    const bSync = await servers.listenSync(b.sync, at, auth);
    cleanups.push(async () => {
      for (const s of [aHttp, bHttp, aSync, bSync]) await s.close();
    });

    // each port answers for its own data source
    const fileOf = async (s: InstanceServer) => (await (await fetch(`${urlOf(s)}/v1/file`, { headers: authed })).json()) as { diskUUID: string; uuid: string };
    expect(await fileOf(aHttp)).toMatchObject({ diskUUID: 'disk-img-a', uuid: 'u-img-a' });
    expect(await fileOf(bHttp)).toMatchObject({ diskUUID: 'disk-img-b', uuid: 'u-img-b' });
    // the sync routes too (the open start-up probe path and the token-protected files)
    expect((await fetch(`${urlOf(aSync)}/`)).status).toBe(200);
    expect((await fetch(`${urlOf(bSync)}/v1/files`)).status).toBe(401);
    expect((await fetch(`${urlOf(bSync)}/v1/files`, { headers: authed })).status).toBe(200);

    // a call without the token is refused, and said in the log of the data source it was for
    expect((await fetch(`${urlOf(bHttp)}/v1/file`)).status).toBe(401);
    expect(logs['b']).toEqual([expect.stringMatching(/^refused \/v1\/file: /)]);
    expect(logs['a']).toEqual([]);

    // closing one data source's servers ends its ports only
    const aUrl = urlOf(aHttp);
    await aHttp.close();
    await aSync.close();
    await expect(fetch(`${aUrl}/v1/file`, { headers: authed })).rejects.toThrow();
    expect(await fileOf(bHttp)).toMatchObject({ diskUUID: 'disk-img-b' });
  });
});
