import { describe, it, expect, beforeAll, afterEach } from '@jest/globals';
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createServer as createHttpServer, type Server } from 'node:http';
import { createServer, type AddressInfo } from 'node:net';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startTestProxy } from '@bis/file-sources/testing';
import { createModuleRecorder } from './test-support/module-recorder.js';

const APP_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const REPO_ROOT = path.resolve(APP_ROOT, '../..');
const BIN = path.join(APP_ROOT, 'bin/backing-image-data-source.js');
const FIXTURE = path.join(REPO_ROOT, 'libs/backupstore/test-data/longhorn-backupstore-lz4');

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

beforeAll(() => {
  // The tests run the built binary: build the app and the libraries it references.
  execFileSync(process.execPath, [path.join(REPO_ROOT, 'node_modules/typescript/bin/tsc'), '--build', path.join(APP_ROOT, 'tsconfig.lib.json')], { stdio: 'inherit' });
}, 120_000);

const sha512 = (b: Buffer): string => createHash('sha512').update(b).digest('hex');

function runToExit(args: string[]): Promise<{ code: number; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [BIN, ...args], { env: { PATH: process.env['PATH'] ?? '' }, timeout: 20_000 }, (err, _stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stderr });
    });
  });
}

async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address() as AddressInfo;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

type Launched = { url: string; syncUrl: string; disk: string; child: ChildProcess; stderr: () => string };

/**
 * Starts the built data source as a child process; stops it (SIGTERM) after the test. A port found free can be taken
 * before the child binds it (by another test's connection on a loaded machine): then it starts again on new ports.
 */
async function launch(args: string[], env: Record<string, string> = {}, nodeArgs: string[] = [], probeHeaders: Record<string, string> = {}): Promise<Launched> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await launchOnce(args, env, nodeArgs, probeHeaders);
    } catch (err) {
      if (attempt >= 5 || !(err instanceof Error) || !err.message.includes('EADDRINUSE')) throw err;
    }
  }
}

async function launchOnce(args: string[], env: Record<string, string>, nodeArgs: string[], probeHeaders: Record<string, string>): Promise<Launched> {
  const disk = await mkdtemp(path.join(tmpdir(), 'bids-cli-'));
  cleanups.push(() => rm(disk, { recursive: true, force: true }));
  const [port, syncPort] = [await freePort(), await freePort()];
  const child = spawn(process.execPath, [...nodeArgs, BIN, '--listen', `127.0.0.1:${port}`, '--sync-listen', `127.0.0.1:${syncPort}`, '--disk-path', disk, '--name', 'img1', '--uuid', 'u1', ...args], {
    env: { PATH: process.env['PATH'] ?? '', ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  cleanups.push(async () => {
    if (child.exitCode === null) child.kill('SIGTERM');
    await exited;
  });
  const url = `http://127.0.0.1:${port}`;
  const end = Date.now() + 15_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`data source exited ${child.exitCode}: ${stderr}`);
    const ok = await fetch(`${url}/v1/file`, { headers: probeHeaders }).then((r) => r.ok, () => false);
    if (ok) break;
    if (Date.now() > end) throw new Error(`data source did not start: ${stderr}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return { url, syncUrl: `http://127.0.0.1:${syncPort}`, disk, child, stderr: () => stderr };
}

async function waitState(url: string, states: string[], ms = 20_000): Promise<Record<string, unknown>> {
  const end = Date.now() + ms;
  for (;;) {
    const i = (await (await fetch(`${url}/v1/file`)).json()) as Record<string, unknown>;
    if (states.includes(String(i['state']))) return i;
    if (Date.now() > end) throw new Error(`state ${String(i['state'])}: ${String(i['message'])}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('backing-image-data-source CLI (built binary)', () => {
  it.each([
    [['--name', 'ab', '--uuid', 'b', '--source-type', 'download'], 'missing parameter "url"'],
    [['--name', 'ab', '--uuid', 'b', '--source-type', 'ftp'], 'unknown --source-type "ftp"'],
    [['--name', 'ab', '--uuid', 'b', '--source-type', 'download', '--parameters', 'url'], 'invalid --parameters value "url": expected key=value'],
    [['--name', 'ab', '--uuid', 'b', '--source-type', 'restore', '--parameters', 'backup-url=s3://x', '--parameters', 'concurrent-limit=zero'], 'invalid parameter "concurrent-limit" value "zero"'],
    [['--name', 'ab', '--uuid', 'b', '--source-type', 'clone', '--parameters', 'backing-image=xy', '--parameters', 'backing-image-uuid=y', '--parameters', 'encryption=encrypt'], 'missing --credential'],
    [['--name', 'ab', '--uuid', 'b', '--source-type', 'upload', '--bogus', '1'], 'unknown flag --bogus'],
    [['--name', '../../victim', '--uuid', 'x', '--source-type', 'upload'], 'invalid --name "../../victim": a backing image name must match'],
    [['--name', 'ab', '--uuid', 'x/../..', '--source-type', 'upload'], 'invalid --uuid "x/../..": a backing image uuid must match'],
    [['--name', 'ab', '--uuid', 'b', '--source-type', 'clone', '--parameters', 'backing-image=../../x', '--parameters', 'backing-image-uuid=y', '--parameters', 'encryption=ignore'], 'invalid parameter "backing-image" "../../x"'],
  ])('exits with status 2 naming the problem: %j', async (args, message) => {
    const r = await runToExit(args);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(message);
  });

  it('with --internal-token-file refuses callers without the token (401) on /v1/file and its sync service; the opt-in admits them', async () => {
    const token = 'data-source-test-token-0123456789';
    const dir = await mkdtemp(path.join(tmpdir(), 'bids-token-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const tokenFile = path.join(dir, 'token');
    await writeFile(tokenFile, `${token}\n`, { mode: 0o600 });
    const good = { authorization: `Bearer ${token}` };
    const ds = await launch(['--source-type', 'upload', '--internal-token-file', tokenFile], {}, [], good);
    expect((await fetch(`${ds.url}/v1/file`)).status).toBe(401);
    expect((await fetch(`${ds.url}/v1/file`, { headers: { authorization: 'Bearer wrong-wrong-wrong-wrong' } })).status).toBe(401);
    expect((await fetch(`${ds.url}/v1/file?action=transfer`, { method: 'POST' })).status).toBe(401);
    expect((await fetch(`${ds.url}/v1/file`, { headers: good })).status).toBe(200);
    expect((await fetch(`${ds.syncUrl}/v1/files`)).status).toBe(401);
    expect((await fetch(`${ds.syncUrl}/v1/files`, { headers: good })).status).toBe(200);
    expect(ds.stderr()).toContain('refused /v1/file: missing bearer token');

    const open = await launch(['--source-type', 'upload', '--internal-token-file', tokenFile, '--allow-unauthenticated-internal-calls'], {}, [], {});
    expect((await fetch(`${open.url}/v1/file`)).status).toBe(200);
    expect((await fetch(`${open.url}/v1/file`, { headers: { authorization: 'Bearer wrong-wrong-wrong-wrong' } })).status).toBe(401);

    const r = await runToExit(['--name', 'img-a', '--uuid', 'b', '--source-type', 'upload', '--allow-unauthenticated-internal-calls']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('--allow-unauthenticated-internal-calls needs --internal-token-file');
  });

  it('downloads through HTTP_PROXY to ready-for-transfer, then transfers; its own sync service is never proxied', async () => {
    const img = Buffer.concat([randomBytes(1 << 20), Buffer.alloc(1 << 20), randomBytes(4096)]);
    const origin: Server = createHttpServer((_req, res) => res.writeHead(200, { 'content-length': img.length }).end(img));
    await new Promise<void>((r) => origin.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise<void>((r) => origin.close(() => r())));
    const proxy = await startTestProxy();
    cleanups.push(() => proxy.close());
    const originUrl = `http://127.0.0.1:${(origin.address() as AddressInfo).port}/img`;
    const ds = await launch(['--source-type', 'download', '--parameters', `url=${originUrl}`, '--allow-source-hosts', '127.0.0.1', '--checksum', sha512(img)], {
      HTTP_PROXY: proxy.url,
      HTTPS_PROXY: proxy.url,
    });
    const i = await waitState(ds.url, ['ready-for-transfer', 'failed']);
    expect(i).toMatchObject({ state: 'ready-for-transfer', size: img.length, currentChecksum: sha512(img), progress: 100 });
    expect(proxy.requests.map((r) => r.target)).toEqual([`127.0.0.1:${(origin.address() as AddressInfo).port}`]);
    const t = await fetch(`${ds.url}/v1/file?action=transfer`, { method: 'POST' });
    expect(t.status).toBe(200);
    expect((await waitState(ds.url, ['ready']))['state']).toBe('ready');
    expect((await readFile(path.join(ds.disk, 'tmp', 'img1-u1'))).equals(img)).toBe(true);
    expect(proxy.requests).toHaveLength(1);
    // SIGTERM ends the process cleanly
    ds.child.kill('SIGTERM');
    const code = await new Promise<number | null>((r) => ds.child.once('exit', (c) => r(c)));
    expect(code).toBe(0);
  });

  it('restores the Longhorn fixture (vfs backup URL) with the checksum recorded in backing-image.cfg', async () => {
    const cfgPath = path.join(FIXTURE, 'backupstore/backing-images/backing-images/fixture-lz4/backing-image.cfg');
    const cfg = JSON.parse(await readFile(cfgPath, 'utf8')) as { Size: string; Checksum: string };
    const ds = await launch([
      '--source-type', 'restore',
      '--parameters', `backup-url=vfs://${FIXTURE}?backingImage=fixture-lz4`,
      '--parameters', 'concurrent-limit=2',
      '--checksum', cfg.Checksum,
    ]);
    const i = await waitState(ds.url, ['ready-for-transfer', 'failed'], 30_000);
    expect(i['message']).toBe('');
    expect(i['state']).toBe('ready-for-transfer');
    const stored = await readFile(path.join(ds.disk, 'tmp', 'img1-u1'));
    // a restore reproduces the backed-up bytes exactly, zero-padded to the next multiple of 512 (the fixture's
    // 9,437,307 bytes are not one): the checksum of the backup covers the bytes before the padding
    const size = Number(cfg.Size);
    expect(size % 512).not.toBe(0);
    expect(stored.length).toBe(Math.ceil(size / 512) * 512);
    expect(sha512(stored.subarray(0, size))).toBe(cfg.Checksum);
    expect(stored.subarray(size).every((b) => b === 0)).toBe(true);
    expect(i['currentChecksum']).toBe(sha512(stored));
  });
});

/**
 * One data source process runs per image being prepared, so each loads only what its source type needs. The child is
 * started with a module recorder (an ES module load hook plus the CommonJS cache at exit) and the files it loaded are
 * checked for the packages and modules that its source type never uses.
 */
describe('backing-image-data-source start (modules loaded per source type)', () => {
  // modules no download or upload data source needs
  const NOT_FOR_DOWNLOAD_OR_UPLOAD: Array<[string, RegExp]> = [
    ['the backup engine (@bis/backupstore)', /\/libs\/backupstore\//],
    ['the S3 client', /\/node_modules\/@aws-sdk\//],
    ['gRPC', /\/node_modules\/@grpc\//],
    ['the ssync receiver', /\/libs\/sync-service\/(src|dist)\/ssync\/receiver\./],
    ['the ssync sender', /\/libs\/sync-service\/(src|dist)\/ssync\/sender\./],
    ['the block-mapping addon (@bis/block-mapping)', /\/libs\/block-mapping\//],
    ['LUKS', /\/libs\/file-sources\/(src|dist)\/luks\./],
    ['qemu-img', /\/libs\/file-sources\/(src|dist)\/qemu-img\./],
    ['ajv (fastify schema compilers)', /\/node_modules\/ajv\//],
  ];
  const present = (files: string[], re: RegExp): string[] => files.filter((f) => re.test(f));

  async function recorder() {
    const dir = await mkdtemp(path.join(tmpdir(), 'bids-modules-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    return createModuleRecorder(dir);
  }

  async function stop(child: ChildProcess): Promise<number | null> {
    const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
    child.kill('SIGTERM');
    return exited;
  }

  it('a plain http download loads neither got nor the modules it does not need, through to ready-for-transfer', async () => {
    const img = Buffer.concat([randomBytes(1 << 20), Buffer.alloc(4096)]);
    const origin: Server = createHttpServer((_req, res) => res.writeHead(200, { 'content-length': img.length }).end(img));
    await new Promise<void>((r) => origin.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise<void>((r) => origin.close(() => r())));
    const rec = await recorder();
    const originUrl = `http://127.0.0.1:${(origin.address() as AddressInfo).port}/img`;
    const ds = await launch(['--source-type', 'download', '--parameters', `url=${originUrl}`, '--allow-source-hosts', '127.0.0.1'], {}, rec.nodeArgs);
    const i = await waitState(ds.url, ['ready-for-transfer', 'failed']);
    expect(i).toMatchObject({ state: 'ready-for-transfer', currentChecksum: sha512(img) });
    expect(await stop(ds.child)).toBe(0);
    const files = await rec.loadedFiles();
    // the recorder saw both kinds of module: ES (the direct HTTP GET of @bis/file-sources) and CommonJS (fastify)
    expect(present(files, /\/libs\/file-sources\/(src|dist)\/direct-get\./).length).toBeGreaterThan(0);
    expect(present(files, /\/node_modules\/fastify\/fastify\.js$/)).toHaveLength(1);
    // the body was read by the direct path: the HTTP client (got, the proxy agents) is never loaded
    for (const [what, re] of [...NOT_FOR_DOWNLOAD_OR_UPLOAD, ['got', /\/node_modules\/(got|hpagent)\//] as [string, RegExp]]) {
      expect({ what, loaded: present(files, re) }).toEqual({ what, loaded: [] });
    }
    // the SHA-512 chain is recorded in the pass that writes the file: its library and addon are loaded for that
    expect(present(files, /\/libs\/sha512-chain\/(src|dist)\/recorder\./).length).toBeGreaterThan(0);
  });

  it('a download whose origin answers chunked loads got when it needs it, and completes', async () => {
    const img = Buffer.concat([randomBytes(1 << 20), Buffer.alloc(4096)]);
    // no Content-Length: Node sends the body chunked, which the direct path leaves to the HTTP client
    const origin: Server = createHttpServer((_req, res) => {
      res.writeHead(200);
      res.end(img);
    });
    await new Promise<void>((r) => origin.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise<void>((r) => origin.close(() => r())));
    const rec = await recorder();
    const originUrl = `http://127.0.0.1:${(origin.address() as AddressInfo).port}/img`;
    const ds = await launch(['--source-type', 'download', '--parameters', `url=${originUrl}`, '--allow-source-hosts', '127.0.0.1'], {}, rec.nodeArgs);
    expect(await waitState(ds.url, ['ready-for-transfer', 'failed'])).toMatchObject({ state: 'ready-for-transfer', currentChecksum: sha512(img) });
    expect(await stop(ds.child)).toBe(0);
    expect(present(await rec.loadedFiles(), /\/node_modules\/got\//).length).toBeGreaterThan(0);
  });

  it('an upload does not load the download client (got) either', async () => {
    const rec = await recorder();
    const ds = await launch(['--source-type', 'upload'], {}, rec.nodeArgs);
    const body = randomBytes(8192);
    const r = await fetch(`${ds.url}/v1/file?action=upload&size=${body.length}`, {
      method: 'POST',
      headers: { 'content-type': 'application/octet-stream' },
      body,
    });
    expect(r.status).toBe(200);
    expect((await waitState(ds.url, ['ready-for-transfer', 'failed']))['currentChecksum']).toBe(sha512(body));
    expect(await stop(ds.child)).toBe(0);
    const files = await rec.loadedFiles();
    expect(present(files, /\/node_modules\/@fastify\/multipart\//).length).toBeGreaterThan(0);
    expect(present(files, /\/libs\/sha512-chain\/(src|dist)\/recorder\./).length).toBeGreaterThan(0);
    for (const [what, re] of [...NOT_FOR_DOWNLOAD_OR_UPLOAD, ['got', /\/node_modules\/(got|hpagent)\//] as [string, RegExp]]) {
      expect({ what, loaded: present(files, re) }).toEqual({ what, loaded: [] });
    }
  });

  it('a restore loads the backup engine when it runs (the recorder sees modules imported later)', async () => {
    const rec = await recorder();
    const ds = await launch([
      '--source-type', 'restore',
      '--parameters', `backup-url=vfs://${FIXTURE}?backingImage=fixture-lz4`,
      '--parameters', 'concurrent-limit=1',
    ], {}, rec.nodeArgs);
    expect((await waitState(ds.url, ['ready-for-transfer', 'failed'], 30_000))['state']).toBe('ready-for-transfer');
    expect(await stop(ds.child)).toBe(0);
    const files = await rec.loadedFiles();
    expect(present(files, /\/libs\/backupstore\//).length).toBeGreaterThan(0);
    expect(present(files, /\/node_modules\/(got|hpagent)\//)).toEqual([]);
  });
});
