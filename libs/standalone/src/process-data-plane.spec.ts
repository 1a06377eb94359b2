import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { BackingImageDataSource } from '@bis/controllers';
import { LocalProcessRuntime } from '@bis/runtime';
import { ProcessDataPlane } from './process-data-plane.js';

// A stand-in for the data-source binary: answers GET /v1/file on its --listen address until stopped.
const FAKE_DATA_SOURCE = `
const http = require('node:http');
const a = process.argv;
const [host, port] = a[a.indexOf('--listen') + 1].split(':');
http.createServer((q, r) => r.end(JSON.stringify({ state: 'ready-for-transfer', size: 1, progress: 100 }))).listen(Number(port), host);
process.on('SIGTERM', () => process.exit(0));
`;

const bids = (name: string): BackingImageDataSource =>
  ({ apiVersion: 'longhorn.io/v1beta2', kind: 'BackingImageDataSource', metadata: { name, namespace: 'longhorn-system' }, spec: { diskUUID: 'disk-a' } }) as unknown as BackingImageDataSource;
const launch = { name: 'img', uuid: 'u', sourceType: 'download', diskPath: '/nonexistent', parameters: {}, checksum: '', credentials: {} };

describe('ProcessDataPlane data sources', () => {
  let dir: string;
  let runtime: LocalProcessRuntime;
  let plane: ProcessDataPlane;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-pdp-'));
    const bin = path.join(dir, 'fake-data-source.cjs');
    await fsp.writeFile(bin, FAKE_DATA_SOURCE);
    runtime = new LocalProcessRuntime({ probeIntervalMs: 50, terminationGracePeriodMs: 2000 });
    plane = new ProcessDataPlane({ runtime, binaries: { manager: bin, dataSource: bin }, nodeID: 'local', logsDir: path.join(dir, 'logs'), maxDataSources: 4 });
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
});
