import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { Server, ServerCredentials, status } from '@grpc/grpc-js';
import { BackingImageManagerServiceService, ManagerClient } from '@bis/bimrpc';
import { PortAllocator, SyncService } from '@bis/sync-service';
import { DISK_UUID, createSandbox, snapshotOutside, traversalCases, type Sandbox } from '@bis/disk-path/testing';
import { ManagerService } from './manager-service.js';
import type { BackupRunner } from './backups.js';

/**
 * The manager's gRPC service (a real grpc-js server on loopback) against the traversal table: every RPC that takes
 * a name and a uuid answers INVALID_ARGUMENT naming the parameter, and nothing outside the disk root is created,
 * changed or removed (a listing of the sandbox, sizes and mtimes, before and after each call).
 */
let s: Sandbox;
let sync: SyncService;
let manager: ManagerService;
let server: Server;
let client: ManagerClient;
let backupCalls = 0;

beforeAll(async () => {
  s = await createSandbox('grpc-confinement-');
  sync = new SyncService({ diskPath: s.root, monitorIntervalMs: 0 });
  const backup: BackupRunner = {
    createBackup: async () => {
      backupCalls++;
      return { backupUrl: '' };
    },
  };
  manager = new ManagerService({
    diskPath: s.root,
    diskUUID: DISK_UUID,
    sync,
    ports: new PortAllocator({ min: 41000, max: 41010 }),
    syncAddress: '127.0.0.1:1',
    receiverHost: '127.0.0.1',
    backup,
  });
  server = new Server();
  server.addService(BackingImageManagerServiceService, manager.implementation());
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  client = new ManagerClient(`127.0.0.1:${port}`, { callTimeoutMs: 20_000 });
});

afterAll(async () => {
  client?.close();
  await manager?.close();
  await sync?.close();
  server?.forceShutdown();
  await s?.remove();
});

async function grpcError(p: Promise<unknown>): Promise<{ code: number; details: string }> {
  try {
    await p;
  } catch (err) {
    const e = err as { code: number; details: string };
    return { code: e.code, details: e.details };
  }
  return { code: status.OK, details: '' };
}

describe('manager gRPC: path confinement', () => {
  it('refuses the reported Delete and keeps the victim directory; a legitimate Delete still removes its entry', async () => {
    const before = await snapshotOutside(s);
    const attack = await grpcError(client.delete(`../../../../../${s.base.slice(1)}/victim`, 'x')); // test-isolation: attack string, sent to the API and never read
    expect(attack.code).toBe(status.INVALID_ARGUMENT);
    expect(attack.details).toMatch(/^invalid name ".*victim": a backing image name must match/);
    expect(await fsp.readFile(path.join(s.victimEntry, 'inner', 'data'), 'utf8')).toBe('victim data\n');
    expect(await snapshotOutside(s)).toEqual(before);

    const entry = path.join(s.root, 'backing-images', 'legit-u1');
    await fsp.mkdir(entry, { recursive: true });
    await fsp.writeFile(path.join(entry, 'backing'), 'x');
    await client.delete('legit', 'u1');
    await expect(fsp.stat(entry)).rejects.toThrow('ENOENT');
  });

  it('a Delete also removes the data source\'s file set in <disk>/tmp (an image deleted before its first file was fetched), nothing of other images', async () => {
    const tmp = path.join(s.root, 'tmp');
    await fsp.mkdir(tmp, { recursive: true });
    const mine = ['ds-u2', 'ds-u2.tmp', 'ds-u2.cfg', 'ds-u2.sha512chain', 'ds-u2.tmp.qcow2tmp'];
    const others = ['ds-u3', 'ds-u3.cfg', 'ds-u2x', 'other-u2'];
    const planted = await fsp.readdir(tmp); // the sandbox's own entries stay too
    for (const f of [...mine, ...others]) await fsp.writeFile(path.join(tmp, f), f);
    await client.delete('ds', 'u2');
    expect((await fsp.readdir(tmp)).sort()).toEqual([...others, ...planted].sort());
  });

  it('refuses every traversal attempt on every RPC, before anything changes', async () => {
    const cases = traversalCases(s);
    expect(cases.length).toBeGreaterThanOrEqual(25);
    for (const c of cases) {
      const spec = { name: c.name, uuid: c.uuid, size: 4096, checksum: '', virtualSize: 0, realSize: 0 };
      const calls: Array<[string, () => Promise<unknown>]> = [
        ['Get', () => client.get(c.name, c.uuid)],
        ['Delete', () => client.delete(c.name, c.uuid)],
        ['Fetch (re-adopt)', () => client.fetch({ spec, dataSourceAddress: '' })],
        ['Fetch (data source)', () => client.fetch({ spec, dataSourceAddress: '127.0.0.1:9' })],
        ['Sync', () => client.sync({ spec, fromAddress: '127.0.0.1:9' })],
        ['Send', () => client.send(c.name, c.uuid, '127.0.0.1:9')],
        ['PrepareDownload', () => client.prepareDownload(c.name, c.uuid)],
        [
          'BackupCreate',
          () =>
            client.backupCreate({
              name: c.name, uuid: c.uuid, checksum: '', backupTarget: `vfs://${s.base}/store`, labels: [], credential: {},
              compressionMethod: 'lz4', concurrentLimit: 1, parameters: {},
            }),
        ],
      ];
      for (const [rpc, call] of calls) {
        const before = await snapshotOutside(s);
        const err = await grpcError(call());
        expect({ case: c.label, rpc, code: err.code }).toEqual({ case: c.label, rpc, code: status.INVALID_ARGUMENT });
        expect({ case: c.label, rpc, names: err.details.startsWith(`invalid ${c.names} `) }).toEqual({ case: c.label, rpc, names: true });
        expect({ case: c.label, rpc, outside: await snapshotOutside(s) }).toEqual({ case: c.label, rpc, outside: before });
      }
    }
    expect(sync.list()).toEqual({});
    expect(backupCalls).toBe(0);
  });
});
