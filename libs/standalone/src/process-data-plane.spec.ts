import { backupTargetOperations } from '@bis/backupstore';
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DATA_SOURCE_CREDENTIAL_ENV, DATA_SOURCE_MALLOC_ENV, dataSourceWorkloadName, type BackingImageDataSource } from '@bis/controllers';
import { LocalProcessRuntime } from '@bis/runtime';
import { ProcessDataPlane } from './process-data-plane.js';

// A stand-in for the data-source binary: answers GET /v1/file on its --listen address until stopped.
const FAKE_DATA_SOURCE = `
const http = require('node:http');
const a = process.argv;
if (a.includes('fail=1')) {
  // A source that logs a lot and fails: exit code 1 once its output is written.
  for (let i = 0; i < 20000; i++) console.log('noise line ' + i + ' ' + 'x'.repeat(40));
  console.log('the source is unreachable');
  process.exitCode = 1;
} else {
  const [host, port] = a[a.indexOf('--listen') + 1].split(':');
  http.createServer((q, r) => r.end(JSON.stringify({ state: 'ready-for-transfer', size: 1, progress: 100 }))).listen(Number(port), host);
  process.on('SIGTERM', () => process.exit(0));
}
`;

const bids = (name: string): BackingImageDataSource =>
  ({ apiVersion: 'longhorn.io/v1beta2', kind: 'BackingImageDataSource', metadata: { name, namespace: 'longhorn-system' }, spec: { diskUUID: 'disk-a' } }) as unknown as BackingImageDataSource;
const launch = { name: 'img', uuid: 'u', sourceType: 'download', diskPath: '/nonexistent', parameters: {}, checksum: '', credentials: {}, maxImageSize: 2 ** 41, storageReserved: 0 };

describe('ProcessDataPlane data sources', () => {
  let dir: string;
  let runtime: LocalProcessRuntime;
  let plane: ProcessDataPlane;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-pdp-'));
    const bin = path.join(dir, 'fake-data-source.cjs');
    await fsp.writeFile(bin, FAKE_DATA_SOURCE);
    runtime = new LocalProcessRuntime({ probeIntervalMs: 50, terminationGracePeriodMs: 2000 });
    plane = new ProcessDataPlane({ runtime, backupTarget: backupTargetOperations, binaries: { manager: bin, dataSource: bin }, nodeID: 'local', logsDir: path.join(dir, 'logs'), maxDataSources: 4 });
  });
  afterEach(async () => {
    plane.close();
    await runtime.stopAll({ gracePeriodMs: 500 });
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('forgets a data source once it is deleted: many started and deleted leave nothing behind', async () => {
    for (let i = 0; i < 6; i++) {
      const b = bids(`ds-${i}`);
      expect(await plane.startDataSource(b, launch)).toBe('started');
      let st = await plane.dataSourceStatus(b);
      for (let t = 0; st.phase !== 'ready' && t < 200; t++) {
        await new Promise((r) => setTimeout(r, 25));
        st = await plane.dataSourceStatus(b);
      }
      expect(st.phase).toBe('ready');
      expect((await plane.dataSourceClient(st.address).get()).state).toBe('ready-for-transfer');
      expect(plane.trackedWorkloads).toBe(1);
      await plane.deleteDataSource(b.metadata.name);
      expect(plane.trackedWorkloads).toBe(0);
      expect((await plane.dataSourceStatus(b)).phase).toBe('missing');
    }
    expect(runtime.list()).toEqual([]);
  });

  it("starts a data source with the data plane's malloc settings in its environment, and its credential there only when it has one", async () => {
    const environ = async (pid: number) =>
      Object.fromEntries((await fsp.readFile(`/proc/${pid}/environ`, 'utf8')).split('\0').filter(Boolean).map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
    for (const [name, credentials] of [['plain', {}], ['with-credential', { token: 'secret-value' }]] as const) {
      await plane.startDataSource(bids(name), { ...launch, credentials });
      const pid = plane.pidOf(dataSourceWorkloadName(name));
      expect(pid).toBeGreaterThan(0);
      const env = await environ(pid!);
      for (const [k, v] of Object.entries(DATA_SOURCE_MALLOC_ENV)) expect(env[k]).toBe(v);
      expect(env[DATA_SOURCE_CREDENTIAL_ENV]).toBe(Object.keys(credentials).length ? JSON.stringify(credentials) : undefined);
      await plane.deleteDataSource(name);
    }
  });

  it('discards the file set a data source left in <disk>/tmp, nothing else, and refuses a name that leaves the disk', async () => {
    const disk = path.join(dir, 'disk');
    await fsp.mkdir(path.join(disk, 'tmp'), { recursive: true });
    const mine = ['img-u1', 'img-u1.tmp', 'img-u1.cfg', 'img-u1.sha512chain', 'img-u1.tmp.qcow2tmp'];
    const others = ['img-u2', 'img-u1x', 'other-u1'];
    for (const f of [...mine, ...others]) await fsp.writeFile(path.join(disk, 'tmp', f), f);
    const b = (name: string, uuid: string) => ({ ...bids(name), spec: { diskUUID: 'disk-a', diskPath: disk, uuid } }) as unknown as BackingImageDataSource;
    await plane.discardDataSourceFiles(b('img', 'u1'));
    expect((await fsp.readdir(path.join(disk, 'tmp'))).sort()).toEqual([...others].sort());
    await expect(plane.discardDataSourceFiles(b('../../x', 'u1'))).rejects.toThrow(/invalid name/);
    expect((await fsp.readdir(path.join(disk, 'tmp'))).sort()).toEqual([...others].sort());
  });

  it('names the end of the log of a data source that failed (read from its last bytes, not the whole log)', async () => {
    const b = bids('ds-fail');
    await plane.startDataSource(b, { ...launch, parameters: { fail: '1' } });
    let st = await plane.dataSourceStatus(b);
    for (let t = 0; st.phase !== 'failed' && t < 400; t++) {
      await new Promise((r) => setTimeout(r, 25));
      st = await plane.dataSourceStatus(b);
    }
    expect(st.phase).toBe('failed');
    expect(st.message).toMatch(/^process ended with exit code 1/);
    expect(st.message).toContain('the source is unreachable');
    expect(st.message).toContain('noise line 19999 ');
    expect(st.message).not.toContain('noise line 19990 ');
    expect((await fsp.stat(path.join(dir, 'logs', 'backing-image-ds-ds-fail.log'))).size).toBeGreaterThan(500_000);
    await plane.deleteDataSource('ds-fail');
    expect(plane.trackedWorkloads).toBe(0);
  });
});
