import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Annotation, BackingImageKind, BackingImageManagerKind, BackupBackingImageKind, BackupTargetKind, NodeKind, type BackingImage } from '@bis/controllers';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, startImageServer, tempDir, waitFor, writeImage, type ImageServer } from './test-support/e2e.js';

const SMALL = 2 * 1024 * 1024;
const BIG = 48 * 1024 * 1024;

let tmp: { dir: string; remove(): Promise<void> };
let server: ImageServer;
let smallSum: string;
let bigSum: string;
let sys: StandaloneHandle;
const logs: string[] = [];
const log = { info: (m: string) => logs.push(`I ${m}`), warn: (m: string) => logs.push(`W ${m}`), error: (m: string) => logs.push(`E ${m}`), debug: () => {} };

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-standalone-ops-');
  smallSum = await writeImage(path.join(tmp.dir, 'small.raw'), SMALL, 7);
  bigSum = await writeImage(path.join(tmp.dir, 'big.raw'), BIG, 9);
  server = await startImageServer(tmp.dir);
  sys = await startStandalone({
    dataDir: path.join(tmp.dir, 'data'),
    listen: '127.0.0.1:0',
    disks: 3,
    allowSourceHosts: ['127.0.0.1'],
    binaries: BINARIES,
    log,
    controllerOptions: { resyncMs: 2000, timing: { dataSourcePollMs: 200, managerPollMs: 200, waitRequeueMs: 300, managerRestartInitialMs: 200, fileBackoffInitialMs: 500, fileBackoffMaxMs: 2000, backupPollMs: 300 } },
  });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  await server?.close();
  await tmp?.remove();
});

const bi = (name: string) => sys.store.get(BackingImageKind, name, sys.namespace);
const readyDisks = (b: BackingImage) => Object.entries(b.status?.diskFileStatusMap ?? {}).filter(([, s]) => s.state === 'ready').map(([d]) => d);

async function dumpOnFailure<T>(p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (err) {
    const files = await readdir(sys.logsDir).catch(() => [] as string[]);
    const tails = await Promise.all(files.map(async (f) => `== ${f}\n${(await readFile(path.join(sys.logsDir, f), 'utf8')).split('\n').slice(-8).join('\n')}`));
    const objs = (await sys.store.list(BackingImageKind, { namespace: sys.namespace })).items.map((b) => `${b.metadata.name} ${JSON.stringify(b.spec?.diskFileSpecMap)} ${JSON.stringify(b.status?.diskFileStatusMap)}`);
    console.log([...logs.slice(-60), ...objs, ...tails].join('\n'));
    throw err;
  }
}

const waitReady = (name: string, n: number, ms = 60_000) =>
  dumpOnFailure(
    waitFor(`${n} ready copies of ${name}`, async () => {
      const b = await bi(name);
      return readyDisks(b).length === n && Object.keys(b.spec?.diskFileSpecMap ?? {}).length === n ? b : undefined;
    }, ms),
  );

async function remove(name: string): Promise<void> {
  await sys.controllers.actions.delete(name);
  await waitFor(`${name} deleted`, async () => !(await sys.store.list(BackingImageKind, { namespace: sys.namespace })).items.some((b) => b.metadata.name === name), 30_000);
}

describe('standalone operations with real processes', () => {
  it('controller restart mid-download converges without a second download', async () => {
    server.throttleMs = 40; // ~1.6 MiB/s: the download stays in progress for a while
    const before = server.gets.get('small.raw') ?? 0;
    await sys.controllers.actions.create({ name: 'restart', sourceType: 'download', parameters: { url: server.url('small.raw') }, expectedChecksum: smallSum, minNumberOfCopies: 1 });
    await dumpOnFailure(waitFor('download in progress', async () => (await bi('restart')).status?.diskFileStatusMap && Object.values((await bi('restart')).status!.diskFileStatusMap!).some((s) => s.state === 'in-progress'), 30_000));
    await sys.restartControllers();
    server.throttleMs = 0;
    const b = await waitReady('restart', 1);
    expect(b.status?.checksum).toBe(smallSum);
    expect((server.gets.get('small.raw') ?? 0) - before).toBe(1);
    await remove('restart');
  }, 90_000);

  it('upload: the data source accepts the file while pending; minNumberOfCopies 2 gives 2 ready copies on different disks', async () => {
    await sys.controllers.actions.create({ name: 'up', sourceType: 'upload', minNumberOfCopies: 2 });
    const target = await dumpOnFailure(waitFor('upload target', () => sys.controllers.actions.uploadTarget('up'), 30_000));
    const data = await readFile(path.join(tmp.dir, 'small.raw'));
    const form = new FormData();
    form.append('chunk', new Blob([data]), 'small.raw');
    const token = (await readFile(sys.internalTokenFile, 'utf8')).trim();
    const res = await fetch(`http://${target}/v1/file?action=upload&size=${data.length}`, { method: 'POST', body: form, headers: { authorization: `Bearer ${token}` } });
    expect(res.status).toBe(200);
    const b = await waitReady('up', 2);
    expect(new Set(readyDisks(b)).size).toBe(2);
    expect(b.status?.checksum).toBe(smallSum);
  }, 90_000);

  it('cleanup action is refused by the HA rule and accepted after lowering minNumberOfCopies; eviction moves a copy', async () => {
    const b = await bi('up');
    const [d1, d2] = readyDisks(b) as [string, string];
    await expect(sys.controllers.actions.cleanupDiskFiles('up', [d1])).rejects.toThrow('no enough ready files for HA');
    await sys.controllers.actions.updateMinNumberOfCopies('up', 1);
    await sys.controllers.actions.cleanupDiskFiles('up', [d1]);
    await waitReady('up', 1);
    const dir = (disk: string) => path.join(sys.disks.find((d) => d.uuid === disk)!.path, 'backing-images');
    await waitFor('file removed from the cleaned disk', async () => (await readdir(dir(d1)).catch(() => [])).length === 0, 30_000);

    // Evict the disk holding the last copy: a new copy is made elsewhere first, then the evicted one goes.
    const node = await sys.store.get(NodeKind, 'local', sys.namespace);
    const disks = structuredClone(node.spec!.disks!);
    const name = sys.disks.find((d) => d.uuid === d2)!.name;
    Object.assign(disks[name]!, { evictionRequested: true, allowScheduling: false });
    await sys.store.update(NodeKind, { ...node, spec: { ...node.spec, disks } });
    const moved = await dumpOnFailure(waitFor('copy moved off the evicted disk', async () => {
      const x = await bi('up');
      const r = readyDisks(x);
      return r.length === 1 && r[0] !== d2 && !x.spec?.diskFileSpecMap?.[d2] ? x : undefined;
    }, 60_000));
    expect(moved.status?.checksum).toBe(smallSum);
    Object.assign(disks[name]!, { evictionRequested: false, allowScheduling: true });
    const n2 = await sys.store.get(NodeKind, 'local', sys.namespace);
    await sys.store.update(NodeKind, { ...n2, spec: { ...n2.spec, disks } });
  }, 120_000);

  it('backup to the filesystem target and restore as a new image with the same checksum', async () => {
    await dumpOnFailure(waitFor('backup target available', async () => (await sys.store.get(BackupTargetKind, 'default', sys.namespace)).status?.available, 30_000));
    const bbi = await sys.controllers.actions.createBackup('up');
    const done = await dumpOnFailure(waitFor('backup completed', async () => {
      const x = await sys.store.get(BackupBackingImageKind, bbi.metadata.name, sys.namespace);
      return x.status?.state === 'Completed' && x.status.lastSyncedAt ? x : x.status?.state === 'Error' ? Promise.reject(new Error(x.status.error)) : undefined;
    }, 60_000));
    expect(done.status?.checksum).toBe(smallSum);
    expect(done.status?.url).toContain('backingImage=up');
    await remove('up');
    await sys.controllers.actions.restoreBackup(bbi.metadata.name, { dataEngine: 'v1' });
    const restored = await waitReady('up', 3, 90_000);
    expect(restored.spec?.sourceType).toBe('restore');
    expect(restored.status?.checksum).toBe(smallSum);
    await remove('up');
  }, 180_000);

  it('a manager killed during a sync is restarted and the copy converges', async () => {
    await sys.controllers.actions.create({ name: 'big', sourceType: 'download', parameters: { url: server.url('big.raw') }, expectedChecksum: bigSum, minNumberOfCopies: 1 });
    const first = readyDisks(await waitReady('big', 1, 90_000))[0]!;
    await sys.controllers.actions.updateMinNumberOfCopies('big', 2);
    // Kill the receiving manager as soon as its copy is being synced. The managers are asked directly (gRPC List,
    // every 10 ms): the objects' status follows them only once per second, and a 48 MiB sync on an idle machine is
    // over in a fraction of that.
    const victim = await dumpOnFailure(waitFor('a sync in progress', async () => {
      const bims = (await sys.store.list(BackingImageManagerKind, { namespace: sys.namespace })).items.filter((m) => m.spec?.diskUUID !== first);
      for (const m of bims) {
        const address = m.metadata.annotations?.[Annotation.Address];
        if (!address) continue;
        const state = (await sys.dataPlane.managerClient(address).list().catch(() => undefined))?.backingImages['big']?.status?.state ?? '';
        if (['starting', 'in-progress', 'pending'].includes(state)) return m;
      }
      return undefined;
    }, 60_000, 10));
    const pid = sys.dataPlane.pidOf(victim.metadata.name);
    expect(pid).toBeDefined();
    process.kill(pid!, 'SIGKILL');
    // The killed manager's copy turns unknown, so replenishment may also add a third disk (as in Longhorn); every
    // copy the spec asks for must end ready, at least 2, and the killed manager's disk among them.
    const b = await dumpOnFailure(waitFor('every copy ready, at least 2', async () => {
      const x = await bi('big');
      const spec = Object.keys(x.spec?.diskFileSpecMap ?? {});
      return spec.length >= 2 && readyDisks(x).length === spec.length && readyDisks(x).includes(victim.spec!.diskUUID!) ? x : undefined;
    }, 90_000));
    expect(b.status?.checksum).toBe(bigSum);
    expect(sys.dataPlane.pidOf(victim.metadata.name)).not.toBe(pid);
    expect((await sys.events.list({ kind: 'BackingImageManager', name: victim.metadata.name, reason: 'Create' })).length).toBeGreaterThanOrEqual(1);
  }, 180_000);
});
