import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import Fastify, { type FastifyInstance } from 'fastify';
import { httpAuthHook } from '@bis/internal-auth';
import { DataSourceHostClient, DataSourceHostError, dataSourceHostRoutes, HOST_SERVER_OPTIONS } from '@bis/data-source-api/host';
import { DataSourceHost, type DataSourceRun } from './host.js';

/**
 * A data source run for the host's tests: listens on a real loopback port (answering its own name), logs one line,
 * ends with exit code 2 when its args say `--fail`, throws on `--throw`, and ignores the stop with `--stubborn`.
 */
const run: DataSourceRun = async (argv, io) => {
  if (argv.includes('--fail')) {
    io.errors?.('backing-image-data-source: invalid --source-type "nope"');
    return 2;
  }
  if (argv.includes('--throw')) throw new Error('the source exploded');
  const name = argv[argv.indexOf('--name') + 1] ?? '';
  const server = http.createServer((_q, r) => r.end(JSON.stringify({ name, credential: io.env['CRED'] ?? null })));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  if (io.logDestination && typeof io.logDestination === 'object' && 'stream' in io.logDestination) {
    io.logDestination.stream.write(`${JSON.stringify({ level: 'info', msg: `${name} listening on ${port}` })}\n`);
  }
  io.onListening?.({ http: `127.0.0.1:${port}`, sync: `127.0.0.1:${port}` });
  await new Promise<void>((r) => io.signal.addEventListener('abort', () => r(), { once: true }));
  if (argv.includes('--stubborn')) await new Promise((r) => setTimeout(r, 1500));
  await new Promise<void>((r) => server.close(() => r()));
  return 0;
};

/** Waits until the file holds a match of `re` (a log is written asynchronously); returns the first group. */
async function logged(file: string, re: RegExp, timeoutMs = 20_000): Promise<string> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const m = re.exec(await readFile(file, 'utf8').catch(() => ''));
    if (m) return m[1] ?? m[0];
    if (Date.now() > end) throw new Error(`${file} did not log ${String(re)} within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function getJson(url: string): Promise<unknown> {
  const res = await fetch(url);
  return res.json();
}

describe('DataSourceHost (the instance table) behind its routes, through its one client', () => {
  let dir: string;
  let host: DataSourceHost;
  let app: FastifyInstance;
  let client: DataSourceHostClient;
  const token = 'host-token-0123456789abcdef';
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-dshost-'));
    host = new DataSourceHost({ run, logsDir: dir, maxInstances: 3, env: { CRED: 'from-host' }, gracePeriodMs: 5000 });
    app = Fastify({ ...HOST_SERVER_OPTIONS, logger: false });
    app.addHook('onRequest', httpAuthHook({ token, allowUnauthenticated: false }));
    await app.register(dataSourceHostRoutes, { host });
    await app.listen({ host: '127.0.0.1', port: 0 });
    client = new DataSourceHostClient(`127.0.0.1:${(app.server.address() as AddressInfo).port}`, { token });
  });
  afterEach(async () => {
    await host.close(2000);
    client.close();
    await app.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('runs several data sources at once, each on its own port with its own environment and log, and stops each alone', async () => {
    const a = await client.start('backing-image-ds-a', { args: ['--name', 'a'] });
    const b = await client.start('backing-image-ds-b', { args: ['--name', 'b'], env: { CRED: 'for-b' } });
    expect(a.instance).toMatchObject({ name: 'backing-image-ds-a', phase: 'running', ready: true, message: 'listening' });
    expect(b.instance.ready).toBe(true);
    expect(a.instance.id).not.toBe(b.instance.id);
    const list = await client.list();
    expect(list.pid).toBe(process.pid);
    expect(list.instances.map((i) => i.name).sort()).toEqual(['backing-image-ds-a', 'backing-image-ds-b']);
    const port = await logged(path.join(dir, 'backing-image-ds-a.log'), /listening on (\d+)/);
    expect(await getJson(`http://127.0.0.1:${port}/`)).toEqual({ name: 'a', credential: 'from-host' });
    const portB = await logged(path.join(dir, 'backing-image-ds-b.log'), /listening on (\d+)/);
    expect(await getJson(`http://127.0.0.1:${portB}/`)).toEqual({ name: 'b', credential: 'for-b' });

    const stopped = await client.stop('backing-image-ds-a');
    expect(stopped).toMatchObject({ phase: 'succeeded', exitCode: 0, ready: false });
    await expect(fetch(`http://127.0.0.1:${port}/`)).rejects.toThrow();
    expect(await getJson(`http://127.0.0.1:${portB}/`)).toEqual({ name: 'b', credential: 'for-b' });
    expect((await client.list()).instances.map((i) => i.name)).toEqual(['backing-image-ds-b']);
    expect(await client.stop('backing-image-ds-a')).toBeUndefined();
  });

  it('reports a data source that ends by itself (exit code, error) in its status and its log, and keeps it until it is stopped', async () => {
    const failed = await client.start('backing-image-ds-bad', { args: ['--fail'] });
    expect(failed.instance).toMatchObject({ phase: 'failed', exitCode: 2, ready: false, message: 'ended with exit code 2' });
    const thrown = await client.start('backing-image-ds-boom', { args: ['--throw'] });
    expect(thrown.instance).toMatchObject({ phase: 'failed', exitCode: 1, message: 'ended with an error: the source exploded' });
    // the start is answered once the run ended and its log was closed
    expect(await readFile(path.join(dir, 'backing-image-ds-bad.log'), 'utf8')).toContain('invalid --source-type \\"nope\\"');
    expect(await readFile(path.join(dir, 'backing-image-ds-boom.log'), 'utf8')).toContain('the source exploded');
    expect((await client.list()).instances.map((i) => i.phase)).toEqual(['failed', 'failed']);
    expect(await client.stop('backing-image-ds-bad')).toMatchObject({ phase: 'failed', exitCode: 2 });
  });

  it('answers a list with ?after when the table changes, and at the end of the wait when it does not', async () => {
    const { version } = await client.list();
    const waiting = client.list({ after: version, waitSeconds: 30 });
    let settled = false;
    void waiting.then(() => (settled = true));
    await new Promise((r) => setTimeout(r, 100));
    expect(settled).toBe(false);
    await client.start('backing-image-ds-c', { args: ['--name', 'c'] });
    const l = await waiting;
    expect(l.version).toBeGreaterThan(version);
    const quiet = await client.list();
    const unchanged = await client.list({ after: quiet.version, waitSeconds: 0.2 });
    expect(unchanged.version).toBe(quiet.version);
  });

  it('refuses bad, duplicate and unauthenticated requests, and more instances than its maximum', async () => {
    await expect(client.start('Bad/Name', { args: [] })).rejects.toMatchObject({ statusCode: 400 });
    await expect(client.start('x'.repeat(300), { args: [] })).rejects.toMatchObject({ statusCode: 400 });
    await expect(client.start('ok', { args: 'nope' as unknown as string[] })).rejects.toMatchObject({ statusCode: 400 });
    await expect(client.start('ok', { args: Array.from({ length: 600 }, () => 'a') })).rejects.toThrow(/at most 512 strings/);
    await client.start('one', { args: ['--name', '1'] });
    await expect(client.start('one', { args: [] })).rejects.toMatchObject({ statusCode: 409 });
    await client.start('two', { args: ['--name', '2'] });
    await client.start('three', { args: ['--name', '3'] });
    const full = await client.start('four', { args: [] }).catch((e: unknown) => e);
    expect(full).toBeInstanceOf(DataSourceHostError);
    expect((full as DataSourceHostError).statusCode).toBe(429);
    expect((full as Error).message).toMatch(/runs 3 instances, its maximum/);
    const anonymous = new DataSourceHostClient(client.address);
    await expect(anonymous.list()).rejects.toMatchObject({ statusCode: 401 });
    await expect(anonymous.start('five', { args: [] })).rejects.toMatchObject({ statusCode: 401 });
    anonymous.close();
    expect((await client.list()).instances).toHaveLength(3);
  });

  it('answers a stop that outlasts the grace period without forgetting the instance (its name and ports stay taken)', async () => {
    await client.start('slow', { args: ['--name', 's', '--stubborn'] });
    const st = await client.stop('slow', 100);
    expect(st?.message).toBe('did not stop within 100 ms');
    expect((await client.list()).instances.map((i) => i.name)).toEqual(['slow']);
    await expect(client.start('slow', { args: [] })).rejects.toMatchObject({ statusCode: 409 });
    expect(await client.stop('slow', 5000)).toMatchObject({ phase: 'succeeded' });
    expect((await client.list()).instances).toEqual([]);
  });
});
