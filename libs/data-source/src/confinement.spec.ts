import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { AddressInfo } from 'node:net';
import Fastify from 'fastify';
import { createFileSources } from '@bis/file-sources';
import { SyncService } from '@bis/sync-service';
import { DiskPathError } from '@bis/disk-path';
import { createSandbox, httpRequest, snapshotOutside, traversalCases, type Sandbox } from '@bis/disk-path/testing';
import { DataSource } from './data-source.js';
import { dataSourceRoutes } from './routes.js';
import { DataSourceConfigError, validateDataSourceConfig, type DataSourceConfig } from './config.js';

/**
 * The data source against the traversal table: its identity (`--name`, `--uuid`: the file `<disk>/tmp/<name>-<uuid>`)
 * and a clone's source (`backing-image`, `backing-image-uuid`) are refused by the configuration check naming the
 * parameter, and — were the check skipped — by the data source itself before anything is created; its HTTP service
 * (`/v1/file`, real server on loopback) ignores path parameters smuggled into queries. Nothing outside the disk root
 * is created, changed or removed.
 */
let s: Sandbox;
let sync: SyncService;

beforeAll(async () => {
  s = await createSandbox('ds-confinement-');
  sync = new SyncService({ diskPath: s.root, sources: createFileSources({}), monitorIntervalMs: 0 });
});
afterAll(async () => {
  await sync?.close();
  await s?.remove();
});

function configError(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    if (e instanceof DataSourceConfigError) return e.message;
    throw e;
  }
  return '';
}

/** Names whose data-source file is a plain new file inside the disk (the planted links are in backing-images/). */
const HARMLESS_AS_IDENTITY = new Set(['evil', 'up', 'file']);

describe('data source: path confinement', () => {
  it('refuses every traversal attempt as its identity (--name/--uuid), before anything changes', async () => {
    for (const c of traversalCases(s)) {
      const before = await snapshotOutside(s);
      const msg = configError(() => validateDataSourceConfig({ name: c.name, uuid: c.uuid, sourceType: 'upload' }));
      const config: DataSourceConfig = { name: c.name, uuid: c.uuid, sourceType: 'upload', parameters: {}, checksum: '', credential: {} };
      let refused: unknown;
      let ds: DataSource | undefined;
      try {
        ds = new DataSource({ config, diskPath: s.root, diskUUID: 'd', sync });
        await ds.start();
      } catch (e) {
        refused = e;
      }
      if (HARMLESS_AS_IDENTITY.has(c.name)) {
        expect({ case: c.label, file: ds?.filePath }).toEqual({ case: c.label, file: `${s.root}/tmp/${c.name}-${c.uuid}` });
      } else {
        if (c.name !== 'lnk') expect({ case: c.label, config: msg.startsWith(`invalid --${c.names} `) }).toEqual({ case: c.label, config: true });
        expect({ case: c.label, refused: refused instanceof DiskPathError, parameter: (refused as DiskPathError).parameter }).toEqual({
          case: c.label,
          refused: true,
          parameter: c.names,
        });
      }
      await ds?.close();
      expect({ case: c.label, outside: await snapshotOutside(s) }).toEqual({ case: c.label, outside: before });
    }
  });

  it('refuses every traversal attempt as a clone source; its /v1/file service ignores smuggled path parameters', async () => {
    let i = 0;
    for (const c of traversalCases(s)) {
      const before = await snapshotOutside(s);
      const parameters = { 'backing-image': c.name, 'backing-image-uuid': c.uuid, encryption: 'ignore' };
      const param = c.names === 'name' ? 'backing-image' : 'backing-image-uuid';
      const msg = configError(() => validateDataSourceConfig({ name: 'target', uuid: `t${i}`, sourceType: 'clone', parameters }));
      if (!['evil', 'up', 'file', 'lnk'].includes(c.name)) {
        expect({ case: c.label, config: msg.startsWith(`invalid parameter "${param}" `) }).toEqual({ case: c.label, config: true });
      }
      // the configuration check skipped: the data source refuses the source itself
      const config: DataSourceConfig = { name: 'target', uuid: `t${i++}`, sourceType: 'clone', parameters, checksum: '', credential: {} };
      const ds = new DataSource({ config, diskPath: s.root, diskUUID: 'd', sync });
      const refused = await ds.start().then(() => undefined, (e: unknown) => e);
      expect({ case: c.label, refused: refused instanceof DiskPathError, parameter: (refused as DiskPathError).parameter }).toEqual({
        case: c.label,
        refused: true,
        parameter: param,
      });
      const app = Fastify({ forceCloseConnections: true });
      await app.register(dataSourceRoutes, { dataSource: ds });
      await app.listen({ host: '127.0.0.1', port: 0 });
      const port = (app.server.address() as AddressInfo).port;
      try {
        const w = c.filePathWire;
        const info = await httpRequest(port, 'GET', `/v1/file?file-path=${w}&name=${encodeURIComponent(c.name)}`);
        expect(JSON.parse(info.text)).toMatchObject({ filePath: ds.filePath, state: '' });
        expect((await httpRequest(port, 'POST', `/v1/file?action=transfer&file-path=${w}`)).status).toBe(500);
        expect((await httpRequest(port, 'POST', `/v1/file?action=upload&size=512&file-path=${w}`, Buffer.alloc(512), { 'content-type': 'application/octet-stream' })).status).toBe(400);
        expect((await httpRequest(port, 'DELETE', `/v1/file?file-path=${w}`)).status).toBe(200);
      } finally {
        await app.close();
        await ds.close();
      }
      expect({ case: c.label, outside: await snapshotOutside(s) }).toEqual({ case: c.label, outside: before });
    }
    expect(sync.list()).toEqual({});
  });
});
