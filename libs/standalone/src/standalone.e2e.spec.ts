import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { BackingImageKind, type BackingImage } from '@bis/controllers';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, startImageServer, tempDir, waitFor, writeImage, type ImageServer } from './test-support/e2e.js';

const SIZE = 3 * 1024 * 1024 + 512;

let tmp: { dir: string; remove(): Promise<void> };
let server: ImageServer;
let sum: string;
let sys: StandaloneHandle | undefined;
let built = false;

beforeAll(async () => {
  built = await binariesBuilt();
  if (!built) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-standalone-');
  sum = await writeImage(path.join(tmp.dir, 'img.raw'), SIZE);
  server = await startImageServer(tmp.dir);
});

afterAll(async () => {
  await sys?.stop();
  await server?.close();
  await tmp?.remove();
});

const logs: string[] = [];
const log = { info: (m: string) => logs.push(`I ${m}`), warn: (m: string) => logs.push(`W ${m}`), error: (m: string) => logs.push(`E ${m}`), debug: (m: string) => logs.push(`D ${m}`) };

/** Prints what the controllers and workloads said (for a failing wait). */
async function dump(): Promise<void> {
  const files = await readdir(sys!.logsDir).catch(() => [] as string[]);
  const tails = await Promise.all(files.map(async (f) => `== ${f}\n${(await readFile(path.join(sys!.logsDir, f), 'utf8')).split('\n').slice(-15).join('\n')}`));
  const objs = (await sys!.store.list(BackingImageKind, { namespace: sys!.namespace })).items.map((b) => JSON.stringify(b.status));
  console.log([...logs.slice(-80), ...objs, ...tails].join('\n'));
}

async function waitOrDump<T>(what: string, fn: () => Promise<T>, ms: number): Promise<NonNullable<T>> {
  try {
    return await waitFor(what, fn, ms);
  } catch (err) {
    await dump();
    throw err;
  }
}

const start = () =>
  startStandalone({
    log,
    dataDir: path.join(tmp.dir, 'data'),
    listen: '127.0.0.1:0',
    disks: 3,
    allowSourceHosts: ['127.0.0.1'],
    binaries: BINARIES,
    controllerOptions: { resyncMs: 2000, timing: { dataSourcePollMs: 300, managerPollMs: 300, waitRequeueMs: 300, managerRestartInitialMs: 200, dataSourceRetryInitialMs: 1000, dataSourceRetryMaxMs: 5000 } },
  });

const bi = (name: string) => sys!.store.get(BackingImageKind, name, sys!.namespace);
const readyDisks = (b: BackingImage) => Object.entries(b.status?.diskFileStatusMap ?? {}).filter(([, s]) => s.state === 'ready').map(([d]) => d);

async function backingFiles(): Promise<string[]> {
  const out: string[] = [];
  for (const d of sys!.disks) {
    const dir = path.join(d.path, 'backing-images');
    for (const e of await readdir(dir).catch(() => [] as string[])) out.push(path.join(dir, e));
  }
  return out;
}

describe('standalone system with real data-plane processes', () => {
  it('downloads from a local HTTP server to ready on minNumberOfCopies disks, then delete removes every file', async () => {
    sys = await start();
    await sys.controllers.actions.create({ name: 'img', sourceType: 'download', parameters: { url: server.url('img.raw') }, expectedChecksum: sum, minNumberOfCopies: 2 });
    const ready = await waitOrDump('2 ready copies', async () => {
      const b = await bi('img');
      return readyDisks(b).length === 2 ? b : undefined;
    }, 60_000);
    expect(ready.status?.checksum).toBe(sum);
    expect(ready.status?.size).toBe(SIZE);
    expect(server.gets.get('img.raw')).toBe(1);
    const files = await backingFiles();
    expect(files).toHaveLength(2);
    for (const f of files) {
      const data = await readFile(path.join(f, 'backing'));
      expect(data.length).toBe(SIZE);
    }

    await sys.controllers.actions.delete('img');
    await waitFor('image deleted', async () => (await sys!.store.list(BackingImageKind, { namespace: sys!.namespace })).items.length === 0, 30_000);
    await waitFor('files removed', async () => (await backingFiles()).length === 0, 30_000);
  }, 120_000);

  it('a wrong checksum fails with both checksums in the message', async () => {
    const wrong = sum.slice(1) + sum[0];
    await sys!.controllers.actions.create({ name: 'bad', sourceType: 'download', parameters: { url: server.url('img.raw') }, expectedChecksum: wrong, minNumberOfCopies: 1 });
    const failed = await waitFor('failed copy', async () => {
      const b = await bi('bad');
      return Object.values(b.status?.diskFileStatusMap ?? {}).find((s) => s.state === 'failed' || s.state === 'failed-and-cleanup');
    }, 60_000);
    if (!failed.message?.includes(wrong)) console.log((await readdir(sys!.logsDir)).join(' '), await readFile(path.join(sys!.logsDir, 'backing-image-ds-bad.log'), 'utf8'));
    expect(failed.message).toContain(wrong);
    expect(failed.message).toContain(sum);
    // A failed download is retried with backoff; deleting the image stops it and removes its leftovers.
    await sys!.controllers.actions.delete('bad');
    await waitOrDump('bad deleted', async () => (await sys!.store.list(BackingImageKind, { namespace: sys!.namespace })).items.length === 0, 30_000);
    expect(sys!.dataPlane.workloads().filter((w) => w.includes('backing-image-ds-'))).toEqual([]);
  }, 90_000);

  it('stop and restart with the same data directory picks up where it was', async () => {
    await sys!.controllers.actions.create({ name: 'keep', sourceType: 'download', parameters: { url: server.url('img.raw') }, expectedChecksum: sum, minNumberOfCopies: 1 });
    await waitFor('1 ready copy', async () => readyDisks(await bi('keep')).length === 1, 60_000);
    const downloads = server.gets.get('img.raw');
    await sys!.stop();
    sys = await start();
    const after = await waitOrDump('ready again after restart', async () => {
      const b = await bi('keep');
      return readyDisks(b).length === 1 && b.status?.checksum === sum ? b : undefined;
    }, 60_000);
    expect(after.status?.size).toBe(SIZE);
    expect(server.gets.get('img.raw')).toBe(downloads); // the manager reused its file: no second download
  }, 120_000);
});
