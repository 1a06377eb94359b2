import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { status } from '@grpc/grpc-js';
import { ManagerClient } from '@bis/bimrpc';
import { dataSourceFilePath } from '@bis/sync-service';
import { buildDaemon, makeDisk, runDaemonExpectingFailure, startDaemonProcess, type DaemonProcess } from './test-support/daemon-process.js';
import { waitFor, writeSparseImage } from './test-support/images.js';
import { startFakeDataSource } from './test-support/fake-data-source.js';

const MiB = 1 << 20;
const TOKEN = 'a-test-token-of-enough-length-0123456789';

async function grpcCode(p: Promise<unknown>): Promise<number> {
  try {
    await p;
  } catch (err) {
    return (err as { code: number }).code;
  }
  return status.OK;
}

/** One plain HTTP request; resolves the status code. */
function httpStatus(address: string, method: string, urlPath: string, authorization?: string, body?: Buffer): Promise<number> {
  const [host, port] = [address.slice(0, address.lastIndexOf(':')), Number(address.slice(address.lastIndexOf(':') + 1))];
  return new Promise((resolve, reject) => {
    const headers: http.OutgoingHttpHeaders = { connection: 'close' };
    if (authorization !== undefined) headers['authorization'] = authorization;
    if (body) headers['content-length'] = body.length;
    const req = http.request({ host, port, method, path: urlPath, headers, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end(body);
  });
}

describe('backing-image-manager daemon: authenticated internal calls (real processes)', () => {
  let root: string;
  let tokenFile: string;
  const daemons: DaemonProcess[] = [];
  const start = async (name: string, args: string[], token?: string) => {
    const d = await startDaemonProcess(await makeDisk(root, name), args, {}, { token });
    daemons.push(d);
    return d;
  };

  beforeAll(async () => {
    buildDaemon();
    root = await fsp.mkdtemp(path.join(os.tmpdir(), 'bim-auth-'));
    tokenFile = path.join(root, 'token');
    await fsp.writeFile(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
  }, 120_000);

  afterAll(async () => {
    await Promise.all(daemons.map((d) => d.stop()));
    await fsp.rm(root, { recursive: true, force: true });
  });

  it('gRPC and sync HTTP refuse no token and a wrong token, accept the right one; GET / stays open', async () => {
    const d = await start('strict', ['--internal-token-file', tokenFile], TOKEN);
    const none = new ManagerClient(d.grpcAddress, { callTimeoutMs: 10_000 });
    const wrong = new ManagerClient(d.grpcAddress, { callTimeoutMs: 10_000, token: 'wrong-token-wrong-token-wrong' });
    try {
      expect(await grpcCode(none.list())).toBe(status.UNAUTHENTICATED);
      expect(await grpcCode(none.delete('x', 'y'))).toBe(status.UNAUTHENTICATED);
      expect(await grpcCode(wrong.list())).toBe(status.UNAUTHENTICATED);
      expect(await grpcCode(wrong.send('x', 'y', '127.0.0.1:1'))).toBe(status.UNAUTHENTICATED);
      expect(await grpcCode(d.client.list())).toBe(status.OK);
      // the Watch stream is refused too
      const watch = none.watch();
      const code = await new Promise<number>((resolve) => {
        watch.on('error', (e: { code: number }) => resolve(e.code));
        watch.on('data', () => resolve(status.OK));
      });
      expect(code).toBe(status.UNAUTHENTICATED);
    } finally {
      none.close();
      wrong.close();
    }
    expect(d.stderr()).toContain('refused gRPC list: missing bearer token');
    expect(await httpStatus(d.syncAddress, 'GET', '/v1/files')).toBe(401);
    expect(await httpStatus(d.syncAddress, 'GET', '/v1/files', 'Bearer wrong-token-wrong-token-wrong')).toBe(401);
    expect(await httpStatus(d.syncAddress, 'GET', '/v1/files', `Basic ${TOKEN}`)).toBe(401);
    expect(await httpStatus(d.syncAddress, 'GET', '/v1/files', `Bearer ${TOKEN}`)).toBe(200);
    expect(await httpStatus(d.syncAddress, 'GET', '/')).toBe(200);
    expect(await d.sync.list()).toEqual({});
  });

  it('a peer receiver refuses senders without the token; Sync between two daemons with the token works; Fetch sends the token to the data source', async () => {
    const a = await start('peer-a', ['--internal-token-file', tokenFile], TOKEN);
    const b = await start('peer-b', ['--internal-token-file', tokenFile], TOKEN);
    // Fetch: the manager presents the token to the data source
    await fsp.mkdir(path.join(a.disk, 'tmp'), { recursive: true });
    const src = dataSourceFilePath(a.disk, 'img', 'u1');
    const sha = await writeSparseImage(src, 'dhdh');
    const ds = await startFakeDataSource({ filePath: src, uuid: 'u1', state: 'ready-for-transfer', size: 4 * MiB });
    try {
      await a.client.fetch({ spec: { name: 'img', uuid: 'u1', size: 4 * MiB, checksum: '', virtualSize: 0, realSize: 0 }, dataSourceAddress: ds.address });
      expect(ds.authorizations.length).toBeGreaterThan(0);
      expect(new Set(ds.authorizations)).toEqual(new Set([`Bearer ${TOKEN}`]));
    } finally {
      await ds.close();
    }
    await waitFor('img ready on A', async () => ((await a.client.get('img', 'u1')).status!.state === 'ready' ? true : undefined), 20_000);

    // a receiver started on B (receiveFromPeer through the authenticated sync API) refuses an unauthenticated sender
    const port = Number(b.child.spawnargs[b.child.spawnargs.indexOf('--port-range') + 1]!.split('-')[1]);
    await b.sync.receiveFromPeer({ filePath: dataSourceFilePath(b.disk, 'probe', 'up'), uuid: 'up', size: MiB, port });
    const receiver = `127.0.0.1:${port}`;
    await waitFor('receiver listening', async () => ((await httpStatus(receiver, 'GET', '/v1-ssync/open?begin=0&end=0').catch(() => 0)) === 401 ? true : undefined), 10_000);
    expect(await httpStatus(receiver, 'POST', `/v1-ssync/open?begin=0&end=${MiB}`)).toBe(401);
    expect(await httpStatus(receiver, 'POST', `/v1-ssync/open?begin=0&end=${MiB}`, 'Bearer wrong-token-wrong-token-wrong')).toBe(401);
    expect(await httpStatus(receiver, 'POST', `/v1-ssync/writeData?begin=0&end=4`, undefined, Buffer.from('evil'))).toBe(401);
    await b.sync.delete(dataSourceFilePath(b.disk, 'probe', 'up'));

    // the real transfer, authenticated end to end (gRPC B -> A, A's sender -> B's receiver)
    await b.client.sync({ spec: { name: 'img', uuid: 'u1', size: 4 * MiB, checksum: sha, virtualSize: 0, realSize: 0 }, fromAddress: a.grpcAddress });
    const r = await waitFor('img ready on B', async () => {
      const s = (await b.client.get('img', 'u1')).status!;
      return s.state === 'ready' || s.state === 'failed' ? s : undefined;
    }, 30_000);
    expect(r.state).toBe('ready');
    expect(r.checksum).toBe(sha);
  });

  it('--allow-unauthenticated-internal-calls admits callers without a token but still refuses a wrong token', async () => {
    const d = await start('optin', ['--internal-token-file', tokenFile, '--allow-unauthenticated-internal-calls'], TOKEN);
    const none = new ManagerClient(d.grpcAddress, { callTimeoutMs: 10_000 });
    const wrong = new ManagerClient(d.grpcAddress, { callTimeoutMs: 10_000, token: 'wrong-token-wrong-token-wrong' });
    try {
      expect(await grpcCode(none.list())).toBe(status.OK);
      expect(await grpcCode(wrong.list())).toBe(status.UNAUTHENTICATED);
    } finally {
      none.close();
      wrong.close();
    }
    expect(await httpStatus(d.syncAddress, 'GET', '/v1/files')).toBe(200);
    expect(await httpStatus(d.syncAddress, 'GET', '/v1/files', 'Bearer wrong-token-wrong-token-wrong')).toBe(401);
    expect(d.stderr()).toContain('calls without a token are admitted');
  });

  it('refuses the opt-in without a token file, and a token file that is too short', async () => {
    const disk = await makeDisk(root, 'bad-flags');
    const optIn = await runDaemonExpectingFailure(['--listen', '127.0.0.1:0', '--sync-listen', '127.0.0.1:0', '--disk-path', disk, '--allow-unauthenticated-internal-calls']);
    expect(optIn.code).toBe(2);
    expect(optIn.stderr).toContain('--allow-unauthenticated-internal-calls needs --internal-token-file');
    const short = path.join(root, 'short-token');
    await fsp.writeFile(short, 'abc\n');
    const tooShort = await runDaemonExpectingFailure(['--listen', '127.0.0.1:0', '--sync-listen', '127.0.0.1:0', '--disk-path', disk, '--internal-token-file', short]);
    expect(tooShort.code).toBe(1);
    expect(tooShort.stderr).toContain('the token must have at least 16 characters');
  });
});
