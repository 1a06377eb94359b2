import { afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { DataSourceClient } from '@bis/data-source-api';
import { DataSourceHostClient } from '@bis/data-source-api/host';
import { waitFor } from '@bis/datastore/testing';
import { LocalProcessRuntime, type WorkloadEvent } from '@bis/runtime';
import { DataSourceHosts } from './data-source-hosts.js';
import { PortReservations } from './ports.js';
import { BINARIES, binariesBuilt } from './test-support/e2e.js';

const IMAGE = randomBytes(256 * 1024);
const SUM = createHash('sha512').update(IMAGE).digest('hex');
beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-data-source');
});

/**
 * Shared data-source hosts run by the real runtime: the real `backing-image-data-source host` program running real
 * download data sources from a loopback origin.
 */
describe('DataSourceHosts (several data sources per process)', () => {
  let dir: string;
  let runtime: LocalProcessRuntime;
  let ports: PortReservations;
  let hosts: DataSourceHosts;
  let origin: http.Server;
  let url: string;
  const token = 'data-source-hosts-spec-token-0123456789';
  let tokenFile: string;
  let events: WorkloadEvent[];
  let ac: AbortController;

  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-dshosts-'));
    await mkdir(path.join(dir, 'disk'));
    tokenFile = path.join(dir, 'token');
    await writeFile(tokenFile, token, { mode: 0o600 });
    origin = http.createServer((_q, r) => r.writeHead(200, { 'content-length': IMAGE.length }).end(IMAGE));
    await new Promise<void>((r) => origin.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(origin.address() as AddressInfo).port}/img.raw`;
    runtime = new LocalProcessRuntime({ probeIntervalMs: 50, terminationGracePeriodMs: 5000 });
    ports = new PortReservations('127.0.0.1');
    hosts = new DataSourceHosts({
      base: runtime,
      node: process.execPath,
      binary: BINARIES.dataSource,
      logsDir: path.join(dir, 'logs'),
      instancesPerHost: 2,
      host: '127.0.0.1',
      ports,
      internalAuth: { tokenFile, token },
      idleStopMs: 300,
    });
    events = [];
    ac = new AbortController();
    void (async () => {
      for await (const e of hosts.watch(ac.signal)) events.push(e);
    })();
  });
  afterEach(async () => {
    ac.abort();
    await hosts.stopAll({ gracePeriodMs: 2000 });
    hosts.close();
    await runtime.stopAll({ gracePeriodMs: 1000 });
    await new Promise<void>((r) => origin.close(() => r()));
    await rm(dir, { recursive: true, force: true });
  });

  /** Starts a download data source for `name` on ports of its own; resolves with its API address. */
  async function startDownload(name: string, extra: string[] = []): Promise<string> {
    const [api, sync] = (await ports.reserve(name, 2)) as [number, number];
    await hosts.start({
      name: `backing-image-ds-${name}`,
      labels: { 'longhorn.io/component': 'backing-image-data-source' },
      command: 'backing-image-data-source',
      args: [
        '--listen', `127.0.0.1:${api}`,
        '--sync-listen', `127.0.0.1:${sync}`,
        '--disk-path', path.join(dir, 'disk'),
        '--name', `img-${name}`,
        '--uuid', `u-${name}`,
        '--source-type', 'download',
        '--parameters', `url=${url}`,
        '--checksum', SUM,
        '--allow-source-hosts', '127.0.0.1',
        '--internal-token-file', tokenFile,
        ...extra,
      ],
      logFile: path.join(dir, 'logs', `backing-image-ds-${name}.log`),
    });
    return `127.0.0.1:${api}`;
  }

  const ready = (name: string) => waitFor(`${name} ready`, () => hosts.get(`backing-image-ds-${name}`)?.ready || undefined, 60_000);

  it('runs two data sources per host process and starts another host for a third; each downloads and checks its own file', async () => {
    const addresses = await Promise.all(['a', 'b', 'c'].map((n) => startDownload(n)));
    await Promise.all(['a', 'b', 'c'].map(ready));
    const pids = ['a', 'b', 'c'].map((n) => hosts.get(`backing-image-ds-${n}`)!.pid);
    expect(new Set(pids).size).toBe(2);
    expect(hosts.hosts()).toHaveLength(2);
    for (const address of addresses) {
      const c = new DataSourceClient(address, { token });
      const f = await waitFor('the file checked', async () => {
        const x = await c.get();
        return x.state === 'ready-for-transfer' ? x : undefined;
      }, 60_000);
      expect(f.currentChecksum).toBe(SUM);
      expect(f.size).toBe(IMAGE.length);
    }
    // calls without the token are refused by the data sources and by the hosts' control API
    await expect(new DataSourceClient(addresses[0]!).get()).rejects.toThrow(/401/);
    const hostAddress = await waitFor('the host\'s start line', async () => /--listen (\S+)/.exec(await readFile(path.join(dir, 'logs', `${hosts.hosts()[0]}.log`), 'utf8'))?.[1]);
    await expect(new DataSourceHostClient(hostAddress).list()).rejects.toMatchObject({ statusCode: 401 });
    expect((await new DataSourceHostClient(hostAddress, { token }).list()).instances.length).toBeGreaterThan(0);
    // each data source logs to its own file
    await waitFor('b\'s listening line in its own log', async () => /data source img-b-u-b \(download\) listening on/.test(await readFile(path.join(dir, 'logs', 'backing-image-ds-b.log'), 'utf8')) || undefined);
  });

  it('stops one data source without touching its neighbour, and stops a host once it has been idle', async () => {
    const a = await startDownload('a');
    const b = await startDownload('b');
    await Promise.all(['a', 'b'].map(ready));
    const [host] = hosts.hosts();
    const stopped = await hosts.stop('backing-image-ds-a');
    expect(stopped).toMatchObject({ phase: 'succeeded', exitCode: 0, ready: false });
    expect(hosts.get('backing-image-ds-a')).toBeUndefined();
    await expect(new DataSourceClient(a, { token }).get()).rejects.toThrow();
    expect((await new DataSourceClient(b, { token }).get()).name).toBe('img-b');
    expect(runtime.get(host!)?.phase).toBe('running');
    await hosts.stop('backing-image-ds-b');
    await waitFor('the idle host to stop', () => (runtime.get(host!) === undefined ? true : undefined), 30_000);
    expect(hosts.hosts()).toEqual([]);
    expect(events.filter((e) => e.type === 'DELETED').map((e) => e.status.name).sort()).toEqual(['backing-image-ds-a', 'backing-image-ds-b']);
  });

  it('fails every data source of a host that is killed, with the reason, and runs the next data sources in a new host', async () => {
    await startDownload('a');
    await startDownload('b');
    await Promise.all(['a', 'b'].map(ready));
    const pid = hosts.get('backing-image-ds-a')!.pid!;
    process.kill(pid, 'SIGKILL');
    for (const n of ['a', 'b']) {
      const st = await waitFor(`${n} failed`, () => {
        const s = hosts.get(`backing-image-ds-${n}`);
        return s?.phase === 'failed' ? s : undefined;
      }, 30_000);
      expect(st.ready).toBe(false);
      expect(st.message).toMatch(/^data-source host data-source-host-1 ended \(signal SIGKILL\)/);
    }
    expect(events.some((e) => e.type === 'MODIFIED' && e.status.name === 'backing-image-ds-a' && e.status.phase === 'failed')).toBe(true);
    await hosts.stop('backing-image-ds-a');
    await hosts.stop('backing-image-ds-b');
    await startDownload('c');
    await ready('c');
    expect(hosts.get('backing-image-ds-c')!.pid).not.toBe(pid);
    expect(hosts.hosts()).toEqual(['data-source-host-2']);
  });

  it('reports a data source whose arguments are wrong as failed with exit code 2, and its error in its log', async () => {
    await startDownload('bad', ['--name', 'X']);
    const st = await waitFor('bad failed', () => {
      const s = hosts.get('backing-image-ds-bad');
      return s?.phase === 'failed' ? s : undefined;
    }, 30_000);
    expect(st).toMatchObject({ exitCode: 2, message: 'ended with exit code 2', ready: false });
    expect(await readFile(path.join(dir, 'logs', 'backing-image-ds-bad.log'), 'utf8')).toContain('invalid --name \\"X\\"');
    // the host keeps running the others
    await startDownload('good');
    await ready('good');
  });
});
