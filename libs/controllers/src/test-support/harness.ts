import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { EmbeddedDatastore } from '@bis/datastore';
import type { Logger } from '../base-controller.js';
import { ControllerManager, type ControllerManagerOptions } from '../controller-manager.js';
import { NodeKind } from '../kinds.js';
import { SimDataPlane } from './sim-data-plane.js';
import { testNode, type TestDisk } from './fixtures.js';
import { waitFor as pollUntil } from '@bis/datastore/testing';

export const NS = 'longhorn-system';

export const FAST_TIMING = {
  dataSourcePollMs: 40,
  managerPollMs: 40,
  managerForcedListTicks: 5,
  managerListMinIntervalMs: 10,
  managerProgressWriteMs: 120,
  imageTransientWriteMs: 60,
  dataSourceTransientWriteMs: 300,
  managerEventCoalesceMs: 10,
  backupPollMs: 40,
  dataSourceRetryInitialMs: 200,
  dataSourceRetryMaxMs: 1000,
  dataSourceDeferredRetryMs: 50,
  fileBackoffInitialMs: 200,
  fileBackoffMaxMs: 1000,
  managerRestartInitialMs: 50,
  managerRestartMaxMs: 500,
  waitRequeueMs: 100,
  rateLimiter: { baseDelayMs: 5, maxDelayMs: 500 },
};

export interface Harness {
  dir: string;
  store: EmbeddedDatastore;
  sim: SimDataPlane;
  cm: ControllerManager;
  logs: string[];
  /** Replaces the controller manager with a fresh one over the same store and data plane. */
  restartControllers(): Promise<void>;
  close(): Promise<void>;
}

export async function startHarness(disks: TestDisk[] = [{ uuid: 'disk-1' }, { uuid: 'disk-2' }, { uuid: 'disk-3' }], extra: Partial<ControllerManagerOptions> = {}): Promise<Harness> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'bis-controllers-'));
  const store = await EmbeddedDatastore.open({ dataDir: dir });
  const sim = new SimDataPlane();
  const logs: string[] = [];
  const log: Logger = {
    info: (m) => logs.push(`I ${m}`),
    warn: (m) => logs.push(`W ${m}`),
    error: (m) => logs.push(`E ${m}`),
    debug: () => {},
  };
  const node = testNode('node-1', disks);
  const created = await store.create(NodeKind, node);
  await store.updateStatus(NodeKind, { ...created, status: node.status });
  const make = () => new ControllerManager({ store, dataPlane: sim, nodeID: 'node-1', namespace: NS, workers: 3, resyncMs: 1000, timing: FAST_TIMING, log, allowSourceHosts: ['127.0.0.1'], ...extra });
  const h: Harness = {
    dir,
    store,
    sim,
    cm: make(),
    logs,
    async restartControllers() {
      await h.cm.stop();
      h.cm = make();
      await h.cm.start();
    },
    async close() {
      await h.cm.stop();
      for (const m of [...sim.managers.keys()]) sim.kill(m);
      for (const d of [...sim.dataSources.keys()]) await sim.deleteDataSource(d);
      await store.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
  await h.cm.start();
  return h;
}

/** Polls `fn` until it returns a truthy value; fails with the last value after `timeoutMs`. */
export function waitFor<T>(what: string, fn: () => Promise<T> | T, timeoutMs = 10_000): Promise<NonNullable<T>> {
  return pollUntil(what, fn, timeoutMs, 25);
}
