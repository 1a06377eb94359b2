import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { open, readFile, readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { BackingImageKind, BackingImageManagerKind, SettingName, type BackingImage } from '@bis/controllers';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, startImageServer, tempDir, waitFor, writeImage, type ImageServer } from './test-support/e2e.js';

const MiB = 1 << 20;
const SEG = 2 * MiB;
const SIZE = 8 * MiB;

let tmp: { dir: string; remove(): Promise<void> };
let server: ImageServer;
let sum: string;
let sys: StandaloneHandle | undefined;
const logs: string[] = [];
const log = { info: (m: string) => logs.push(`I ${m}`), warn: (m: string) => logs.push(`W ${m}`), error: (m: string) => logs.push(`E ${m}`), debug: () => {} };

const start = () =>
  startStandalone({
    dataDir: path.join(tmp.dir, 'data'),
    listen: '127.0.0.1:0',
    disks: 2,
    allowSourceHosts: ['127.0.0.1'],
    binaries: BINARIES,
    log,
    controllerOptions: { resyncMs: 1000, timing: { dataSourcePollMs: 200, managerPollMs: 200, waitRequeueMs: 300, managerRestartInitialMs: 200, fileBackoffInitialMs: 500, fileBackoffMaxMs: 2000 } },
  });

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-standalone-scrub-');
  sum = await writeImage(path.join(tmp.dir, 'img.raw'), SIZE, 11);
  server = await startImageServer(tmp.dir);
  // the scrub settings are daemon flags: set them, then start again so that the managers start with them
  const first = await start();
  await first.settings.set(SettingName.BackingImageScrubInterval, '2');
  await first.stop();
  sys = await start();
}, 120_000);

afterAll(async () => {
  await sys?.stop();
  await server?.close();
  await tmp?.remove();
});

const bi = (name: string) => sys!.store.get(BackingImageKind, name, sys!.namespace);
const readyDisks = (b: BackingImage) => Object.entries(b.status?.diskFileStatusMap ?? {}).filter(([, s]) => s.state === 'ready').map(([d]) => d);

async function dumpOnFailure<T>(p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (err) {
    const files = await readdir(sys!.logsDir).catch(() => [] as string[]);
    const tails = await Promise.all(files.map(async (f) => `== ${f}\n${(await readFile(path.join(sys!.logsDir, f), 'utf8')).split('\n').slice(-15).join('\n')}`));
    const b = await bi('rot').catch(() => undefined);
    console.log([...logs.slice(-40), JSON.stringify(b?.status?.diskFileStatusMap), ...tails].join('\n'));
    throw err;
  }
}

/** Bit rot: one byte changed in place, the modification time put back to the nanosecond. */
async function flipByte(f: string, offset: number): Promise<void> {
  const before = await stat(f, { bigint: true });
  const fh = await open(f, 'r+');
  const b = Buffer.alloc(1);
  await fh.read(b, 0, 1, offset);
  b[0] = b[0]! ^ 0x5a;
  await fh.write(b, 0, 1, offset);
  await fh.close();
  const ns = before.mtimeNs;
  const stamp = `@${ns / 1_000_000_000n}.${String(ns % 1_000_000_000n).padStart(9, '0')}`;
  execFileSync('touch', ['-m', '-d', stamp, f]);
  expect((await stat(f, { bigint: true })).mtimeNs).toBe(ns);
}

describe('scrub through the standalone system', () => {
  it('a flipped byte under a restored mtime is found by the scrub, the copy fails naming the segment, and is replaced from the healthy one', async () => {
    await sys!.controllers.actions.create({ name: 'rot', sourceType: 'download', parameters: { url: server.url('img.raw') }, expectedChecksum: sum, minNumberOfCopies: 2 });
    const ready = await dumpOnFailure(waitFor('2 ready copies', async () => {
      const b = await bi('rot');
      return readyDisks(b).length === 2 ? b : undefined;
    }, 60_000));
    const disk = readyDisks(ready)[0]!;
    const diskPath = sys!.disks.find((d) => d.uuid === disk)!.path;
    const file = path.join(diskPath, 'backing-images', `rot-${ready.status!.uuid}`, 'backing');
    await flipByte(file, 3 * SEG + 77);

    const failed = await dumpOnFailure(waitFor('the corrupted copy failed', async () => {
      const s = (await bi('rot')).status?.diskFileStatusMap?.[disk];
      return s?.state === 'failed' ? s : undefined;
    }, 30_000));
    expect(failed.message).toContain(`scrub: SHA-512 chain mismatch in segment 3 (bytes ${3 * SEG}-${4 * SEG - 1})`);
    const bims = (await sys!.store.list(BackingImageManagerKind, { namespace: sys!.namespace })).items;
    const bim = bims.find((m) => m.spec?.diskUUID === disk)!;
    expect(bim.status?.diskScrub?.lastScrubResult).toBe('corrupted');
    expect(bim.status?.diskScrub?.lastScrubMessage).toContain('segment 3');
    // users see it with the disk: the node resource of the REST API (what `bictl node ls` and the UI show)
    const diskName = sys!.disks.find((d) => d.uuid === disk)!.name;
    const restDisk = async () =>
      ((await (await fetch(`${sys!.url}/v1/nodes`)).json()) as { data: { disks: Record<string, { scrub: { lastScrubResult: string; lastScrubMessage: string; lastScrubTime: string } | null }> }[] }).data[0]!.disks[diskName]!;
    const corrupted = (await restDisk()).scrub;
    expect(corrupted?.lastScrubResult).toBe('corrupted');
    expect(corrupted?.lastScrubMessage).toContain('SHA-512 chain mismatch in segment 3');
    expect(Date.parse(corrupted!.lastScrubTime)).toBeGreaterThan(0);

    // the failed copy has a healthy sibling: deleted and synced again from it
    await dumpOnFailure(waitFor('the copy replaced and ready', async () => {
      const b = await bi('rot');
      return readyDisks(b).includes(disk) && readyDisks(b).length === 2 ? b : undefined;
    }, 60_000));
    expect(createHash('sha512').update(await readFile(file)).digest('hex')).toBe(sum);
    // the scrub of the new copy finds it intact
    await dumpOnFailure(waitFor('a clean scrub of the disk', async () => {
      const m = (await sys!.store.list(BackingImageManagerKind, { namespace: sys!.namespace })).items.find((x) => x.spec?.diskUUID === disk);
      return m?.status?.diskScrub?.lastScrubResult === 'ok' ? m : undefined;
    }, 30_000));
    await dumpOnFailure(waitFor('the clean scrub shown with the disk in the REST API', async () => ((await restDisk()).scrub?.lastScrubResult === 'ok' ? true : undefined), 30_000));
  }, 150_000);
});
