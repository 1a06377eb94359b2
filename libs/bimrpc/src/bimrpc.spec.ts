import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { Server, ServerCredentials, status, type ServerWritableStream } from '@grpc/grpc-js';
import {
  BackingImageManagerServiceService,
  BackingImageSpec,
  BackupCreateRequest,
  ListResponse,
  ManagerClient,
  MANAGER_API_MIN_VERSION,
  MANAGER_API_VERSION,
  grpcError,
  isGrpcStatus,
  isManagerApiCompatible,
  type BackingImageManagerServiceServer,
  type Empty,
} from './index.js';

const repoRoot = resolve(import.meta.dirname, '../../..');

function listFiles(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string): void => {
    for (const e of readdirSync(d)) {
      const p = join(d, e);
      if (statSync(p).isDirectory()) walk(p);
      else out.push(relative(dir, p));
    }
  };
  walk(dir);
  return out.sort();
}

describe('generated code', () => {
  it('is up to date with proto/bimrpc.proto (run `npx nx run @bis/bimrpc:generate` when this fails)', () => {
    const out = mkdtempSync(join(tmpdir(), 'bimrpc-gen-'));
    try {
      execFileSync(join(repoRoot, 'node_modules/.bin/buf'), ['generate', 'proto', '--template', 'libs/bimrpc/buf.gen.yaml', '-o', out], {
        cwd: repoRoot,
        stdio: 'pipe',
      });
      const fresh = join(out, 'libs/bimrpc/src/gen');
      const committed = join(repoRoot, 'libs/bimrpc/src/gen');
      expect(listFiles(committed)).toEqual(listFiles(fresh));
      for (const f of listFiles(fresh)) {
        expect([f, readFileSync(join(committed, f), 'utf8')]).toEqual([f, readFileSync(join(fresh, f), 'utf8')]);
      }
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});

describe('wire format', () => {
  it('uses Longhorn\'s field numbers', () => {
    // name=1 (string), size=3 (varint), checksum=4, virtualSize=5, realSize=6
    const bytes = BackingImageSpec.encode({ name: 'a', uuid: '', size: 5, checksum: 'c', virtualSize: 9, realSize: 7 }).finish();
    expect(Buffer.from(bytes).toString('hex')).toBe('0a0161' + '1805' + '220163' + '2809' + '3007');
    // labels=5 repeated string, credential=6 map, concurrent_limit=8
    const b2 = BackupCreateRequest.encode({
      name: '', uuid: '', checksum: '', backupTarget: 't', labels: ['k=v'], credential: { a: 'b' }, compressionMethod: '',
      concurrentLimit: 2, parameters: {},
    }).finish();
    expect(Buffer.from(b2).toString('hex')).toBe('220174' + '2a036b3d76' + '3206' + '0a0161' + '120162' + '4002');
    const l = ListResponse.decode(ListResponse.encode({ backingImages: { x: { spec: undefined, status: undefined } } }).finish());
    expect(Object.keys(l.backingImages)).toEqual(['x']);
  });

  it('has the service path of the current Longhorn API', () => {
    expect(BackingImageManagerServiceService.get.path).toBe('/bimrpc.BackingImageManagerService/Get');
    expect(BackingImageManagerServiceService.watch.responseStream).toBe(true);
    expect(Object.keys(BackingImageManagerServiceService).sort()).toEqual(
      ['backupCreate', 'backupStatus', 'delete', 'fetch', 'get', 'list', 'prepareDownload', 'send', 'sync', 'versionGet', 'watch'],
    );
  });

  it('checks API compatibility like longhorn-manager', () => {
    expect(isManagerApiCompatible({ backingImageManagerApiVersion: 3, backingImageManagerApiMinVersion: 3 })).toBe(true);
    expect(isManagerApiCompatible({ backingImageManagerApiVersion: 4, backingImageManagerApiMinVersion: 3 })).toBe(true);
    expect(isManagerApiCompatible({ backingImageManagerApiVersion: 2, backingImageManagerApiMinVersion: 1 })).toBe(false);
    expect(isManagerApiCompatible({ backingImageManagerApiVersion: 5, backingImageManagerApiMinVersion: 4 })).toBe(false);
  });
});

describe('client and server over loopback', () => {
  let server: Server;
  let client: ManagerClient;
  const watchers: ServerWritableStream<Empty, Empty>[] = [];

  beforeAll(async () => {
    server = new Server();
    const impl: BackingImageManagerServiceServer = {
      get: (call, cb) => {
        if (!call.request.name || !call.request.uuid) return cb(grpcError(status.INVALID_ARGUMENT, 'missing required argument'));
        if (call.request.name !== 'img') {
          return cb(grpcError(status.NOT_FOUND, `cannot find backing image ${call.request.name}(${call.request.uuid})`));
        }
        cb(null, {
          spec: { name: 'img', uuid: call.request.uuid, size: 2 ** 40 + 512, checksum: '', virtualSize: 0, realSize: 0 },
          status: { state: 'ready', errorMsg: '', sendingReference: 1, senderManagerAddress: '', progress: 100, checksum: 'ab' },
        });
      },
      list: (_c, cb) => cb(null, { backingImages: {} }),
      delete: (_c, cb) => cb(null, {}),
      versionGet: (_c, cb) =>
        cb(null, {
          version: 'v', gitCommit: '', buildDate: '', backingImageManagerApiVersion: MANAGER_API_VERSION,
          backingImageManagerApiMinVersion: MANAGER_API_MIN_VERSION,
        }),
      sync: (_c, cb) => cb(grpcError(status.UNIMPLEMENTED, 'n/a')),
      send: (_c, cb) => cb(null, {}),
      fetch: (_c, cb) => cb(grpcError(status.UNKNOWN, 'file /data/backing-images/img-u/backing already exists')),
      prepareDownload: (_c, cb) => cb(null, { srcFilePath: '/p', address: '1.2.3.4:8001' }),
      backupCreate: (_c, cb) => cb(null, {}),
      backupStatus: (_c, cb) => cb(null, { progress: 50, backupUrl: 'u', error: '', state: 'in_progress' }),
      watch: (call) => {
        watchers.push(call);
        call.write({});
      },
    };
    server.addService(BackingImageManagerServiceService, impl);
    const port = await new Promise<number>((res, rej) =>
      server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))),
    );
    client = new ManagerClient(`127.0.0.1:${port}`, { callTimeoutMs: 5000 });
  });

  afterAll(async () => {
    client.close();
    for (const w of watchers) w.end();
    await new Promise<void>((res) => server.tryShutdown(() => res()));
  });

  it('round-trips unary calls, int64 sizes included', async () => {
    const r = await client.get('img', 'u1');
    expect(r.spec?.size).toBe(2 ** 40 + 512);
    expect(r.status).toMatchObject({ state: 'ready', progress: 100, sendingReference: 1, checksum: 'ab' });
    const v = await client.versionGet();
    expect(isManagerApiCompatible(v)).toBe(true);
    expect(await client.backupStatus('img')).toMatchObject({ progress: 50, state: 'in_progress' });
  });

  it('carries status codes and Longhorn\'s error substrings', async () => {
    await expect(client.get('', '')).rejects.toMatchObject({ code: status.INVALID_ARGUMENT });
    const err: unknown = await client.get('other', 'u2').catch((e: unknown) => e);
    expect(isGrpcStatus(err, status.NOT_FOUND)).toBe(true);
    expect((err as Error).message).toContain('cannot find backing image other(u2)');
    await expect(
      client.fetch({ spec: { name: 'img', uuid: 'u', size: 512, checksum: '', virtualSize: 0, realSize: 0 }, dataSourceAddress: '' }),
    ).rejects.toMatchObject({ code: status.UNKNOWN, details: expect.stringContaining('already exists') });
  });

  it('streams Watch notifications', async () => {
    const stream = client.watch();
    const got = await new Promise<number>((resolve, reject) => {
      let n = 0;
      stream.on('data', () => {
        n += 1;
        if (n === 1) watchers.at(-1)!.write({});
        if (n === 2) resolve(n);
      });
      stream.on('error', reject);
    });
    expect(got).toBe(2);
    stream.cancel();
  });
});
