/**
 * Fault-injection suite: each case runs the real standalone system (managers and data sources are real processes;
 * some cases run the built `controller-manager` CLI so that it can be killed too), injects one fault at a seeded
 * random point, and asserts three things:
 *   1. convergence within the case's stated bound (polling the REST API);
 *   2. no copy is `ready` with bytes whose SHA-512 differs from the image's checksum (every ready copy is hashed);
 *   3. no orphan: while running, one manager per disk and every data-plane process a child of the running
 *      controller; after the stop, no process pointing into the data directory, no pid record, no `*.tmp` file.
 *
 * Seeds: the suite's seed is printed; `BIS_FAULT_SEED=<n>` replays it (each case derives its own from it and its
 * name). `npm test` runs the quick subset; `npm run faults` (BIS_FAULTS=full) runs every case. Bounds are generous
 * for a loaded 2-core machine.
 */
import { execFileSync } from 'node:child_process';
import { mkdir, open, readdir, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import S3rver from 's3rver';
import { binariesBuilt, tempDir } from './test-support/e2e.js';
import {
  api,
  assertNoCorruptReadyCopy,
  assertNoOrphanWhileRunning,
  assertNothingLeftAfterStop,
  backupsOf,
  between,
  caseSeed,
  cliSystem,
  CONTROLLER_MANAGER_CLI,
  converged,
  createImage,
  diskPaths,
  getImage,
  imageBytes,
  inProcessSystem,
  dataSourceFlag,
  dataSourceProcess,
  isManager,
  killLeftovers,
  logTails,
  processesOf,
  readyDisks,
  rng,
  startOrigin,
  suiteSeed,
  tmpFiles,
  until,
  type FaultSystem,
  type Origin,
} from './test-support/faults.js';

const MiB = 1 << 20;
const FULL = process.env['BIS_FAULTS'] === 'full';
const SEED = suiteSeed();

interface CaseContext {
  r: () => number;
  dir: string;
  dataDir: string;
  /** Every system the case started (stopped and killed at the end whatever happens). */
  systems: FaultSystem[];
  origins: Origin[];
  cleanups: (() => Promise<void>)[];
  note(s: string): void;
}

interface CaseResult {
  sys: FaultSystem;
  disks: number;
  /** image name → expected SHA-512 */
  images: Record<string, string>;
  convergeMs: number;
}

interface FaultCase {
  name: string;
  quick: boolean;
  /** Convergence bound, stated in the test name. */
  boundMs: number;
  /** Why a case is known to fail (runs with it.failing). */
  knownFailure?: string;
  run(ctx: CaseContext, boundMs: number): Promise<CaseResult>;
}

const results: { name: string; seed: number; convergeMs?: number; result: string; notes: string[] }[] = [];

// ------------------------------------------------------------------ helpers of the cases

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function kill9(pid: number): Promise<void> {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

/** The running manager process of disk `disk-<i>` (found by its --disk-path). */
async function managerOfDisk(dataDir: string, diskDir: string): Promise<number | undefined> {
  return (await processesOf(dataDir)).find((p) => isManager(p) && p.args[p.args.indexOf('--disk-path') + 1] === diskDir)?.pid;
}

/** One byte changed in place, the modification time put back to the nanosecond (bit rot). */
async function flipByte(f: string, offset: number): Promise<void> {
  const before = await stat(f, { bigint: true });
  const fh = await open(f, 'r+');
  const b = Buffer.alloc(1);
  await fh.read(b, 0, 1, offset);
  b[0] = b[0]! ^ 0x5a;
  await fh.write(b, 0, 1, offset);
  await fh.close();
  const ns = before.mtimeNs;
  execFileSync('touch', ['-m', '-d', `@${ns / 1_000_000_000n}.${String(ns % 1_000_000_000n).padStart(9, '0')}`, f]);
  expect((await stat(f, { bigint: true })).mtimeNs).toBe(ns);
}

async function backupCompleted(sys: FaultSystem, image: string, boundMs: number, what = 'a Completed backup'): Promise<void> {
  await until(`${image}: ${what} (bound ${boundMs / 1000} s)`, async () => {
    const bs = await backupsOf(sys, image);
    if (bs.some((b) => b.state === 'Completed')) return true;
    throw new Error(`backups: ${JSON.stringify(bs.map((b) => [b.name, b.state, b.error]))}`); // the last one is reported on timeout
  }, boundMs, 300);
}

/** Creates a backup of a ready image on the current target and returns when it is Completed. */
async function backupNow(sys: FaultSystem, image: string, boundMs: number): Promise<void> {
  // right after a fault the copy may not be ready again yet: the create is refused with that reason until it is
  await until(`the backup of ${image} accepted`, async () => {
    const r = await api(sys).call('POST', `/v1/backingimages/${image}?action=backupBackingImageCreate`, {});
    if (r.status === 200) return true;
    if (/has no ready copy/.test(String(r.json['message']))) return undefined;
    throw new Error(`backup of ${image}: ${r.status} ${JSON.stringify(r.json)}`);
  }, boundMs, 500);
  await backupCompleted(sys, image, boundMs);
}

/** Deletes the image, then restores it from its Completed backup (the restored image has the same name). */
async function deleteAndRestore(sys: FaultSystem, image: string): Promise<void> {
  const bbi = (await backupsOf(sys, image)).find((b) => b.state === 'Completed')!;
  expect((await api(sys).call('DELETE', `/v1/backingimages/${image}`)).status).toBe(200);
  await until(`${image} deleted`, async () => (await getImage(sys, image)) === undefined, 120_000);
  const r = await api(sys).call('POST', `/v1/backupbackingimages/${bbi.name}?action=backupBackingImageRestore`, { dataEngine: 'v1' });
  if (r.status !== 200) throw new Error(`restore of ${bbi.name}: ${r.status} ${JSON.stringify(r.json)}`);
}

async function waitForDataSource(dataDir: string, image: string, timeoutMs = 60_000): Promise<number> {
  return (await until(`the data source of ${image} to run`, () => dataSourceProcess(dataDir, image), timeoutMs, 50)).pid;
}

async function canMountTmpfs(dir: string): Promise<string | undefined> {
  const probe = path.join(dir, 'mount-probe');
  await mkdir(probe, { recursive: true });
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', probe], { stdio: 'pipe' });
    execFileSync('umount', [probe], { stdio: 'pipe' });
    return undefined;
  } catch (err) {
    return `cannot mount a tmpfs here (${String((err as { stderr?: Buffer }).stderr ?? (err as Error).message).trim()})`;
  } finally {
    await rm(probe, { recursive: true, force: true });
  }
}

// ------------------------------------------------------------------ the cases

const cases: FaultCase[] = [
  {
    name: 'kill -9 of the data source mid-download',
    quick: true,
    boundMs: 180_000,
    async run(ctx, bound) {
      const { data, sum } = imageBytes(16 * MiB, 1);
      const origin = await startOrigin(data, { throttleMs: 4 });
      ctx.origins.push(origin);
      const sys = await inProcessSystem(ctx.dataDir, 2);
      ctx.systems.push(sys);
      await createImage(sys, 'img', origin.url, sum, 2);
      const point = Math.floor(between(ctx.r, 0.1, 0.9) * data.length);
      ctx.note(`killed after ${(point / MiB).toFixed(1)} MiB of ${data.length / MiB}`);
      const ds = await waitForDataSource(ctx.dataDir, 'img');
      await until('the origin to have sent the point', () => origin.sent() >= point, 120_000, 20);
      await kill9(ds);
      origin.throttleMs = 0;
      const t = Date.now();
      await converged(sys, 'img', sum, 2, bound);
      ctx.note(`origin GETs ${origin.gets()}`);
      return { sys, disks: 2, images: { img: sum }, convergeMs: Date.now() - t };
    },
  },
  {
    name: 'kill -9 of a manager mid-download',
    quick: false,
    boundMs: 240_000,
    async run(ctx, bound) {
      const { data, sum } = imageBytes(24 * MiB, 2);
      const origin = await startOrigin(data, { throttleMs: 4 });
      ctx.origins.push(origin);
      const sys = await inProcessSystem(ctx.dataDir, 2);
      ctx.systems.push(sys);
      await createImage(sys, 'img', origin.url, sum, 2);
      const point = Math.floor(between(ctx.r, 0.1, 0.9) * data.length);
      await waitForDataSource(ctx.dataDir, 'img');
      await until('the origin to have sent the point', () => origin.sent() >= point, 120_000, 20);
      // the manager of the disk the data source writes to
      const diskDir = (await dataSourceFlag(ctx.dataDir, 'img', '--disk-path'))!;
      const m = await managerOfDisk(ctx.dataDir, diskDir);
      ctx.note(`manager of ${path.basename(diskDir)} killed after ${(point / MiB).toFixed(1)} MiB`);
      if (m) await kill9(m);
      origin.throttleMs = 0;
      const t = Date.now();
      await converged(sys, 'img', sum, 2, bound);
      return { sys, disks: 2, images: { img: sum }, convergeMs: Date.now() - t };
    },
  },
  {
    name: 'kill -9 of a manager mid-sync',
    quick: true,
    boundMs: 240_000,
    async run(ctx, bound) {
      const { data, sum } = imageBytes(32 * MiB, 3);
      const origin = await startOrigin(data);
      ctx.origins.push(origin);
      const sys = await inProcessSystem(ctx.dataDir, 3);
      ctx.systems.push(sys);
      await createImage(sys, 'img', origin.url, sum, 3);
      const first = await until('a first ready copy', async () => readyDisks(await getImage(sys, 'img'))[0], 120_000, 20);
      // the point: 0–500 ms after a second copy shows up (the sync has been asked for)
      const delay = Math.floor(between(ctx.r, 0, 500));
      const victimIsSender = ctx.r() < 0.5;
      await until('a sync to start', async () => {
        const x = await getImage(sys, 'img');
        return Object.entries(x?.diskFileStatusMap ?? {}).some(([d, s]) => d !== first && s.state !== '') ? true : undefined;
      }, 120_000, 20);
      await sleep(delay);
      const disks = await diskPaths(ctx.dataDir);
      const b = await getImage(sys, 'img');
      const receiver = Object.keys(b?.diskFileStatusMap ?? {}).find((d) => d !== first && b!.diskFileStatusMap[d]!.state !== 'ready');
      const victimDisk = victimIsSender || !receiver ? first : receiver;
      const states = Object.values(b?.diskFileStatusMap ?? {}).map((s) => `${s.state}${s.state === 'in-progress' ? ` ${s.progress}%` : ''}`);
      ctx.note(`${victimIsSender || !receiver ? 'sender' : 'receiver'} killed ${delay} ms after a sync was asked for (copies: ${states.map((x) => x || 'none').join(', ')})`);
      const m = await managerOfDisk(ctx.dataDir, disks.get(victimDisk)!);
      if (m) await kill9(m);
      const t = Date.now();
      await converged(sys, 'img', sum, 3, bound);
      return { sys, disks: 3, images: { img: sum }, convergeMs: Date.now() - t };
    },
  },
  {
    name: 'kill -9 of the manager mid-backup',
    quick: false,
    boundMs: 240_000,
    async run(ctx, bound) {
      const { data, sum } = imageBytes(96 * MiB, 4);
      const origin = await startOrigin(data);
      ctx.origins.push(origin);
      const sys = await inProcessSystem(ctx.dataDir, 1);
      ctx.systems.push(sys);
      await createImage(sys, 'img', origin.url, sum, 1);
      await converged(sys, 'img', sum, 1, 120_000);
      const blocks = path.join(ctx.dataDir, 'backups', 'backupstore', 'backing-images', 'blocks');
      const k = Math.floor(between(ctx.r, 1, 30));
      expect((await api(sys).call('POST', '/v1/backingimages/img?action=backupBackingImageCreate', {})).status).toBe(200);
      await until(`${k} blocks written`, async () => ((await tmpFilesOrAll(blocks)).filter((f) => f.includes('.blk')).length >= k ? true : (await backupsOf(sys, 'img')).some((x) => x.state === 'Completed')), 120_000, 20);
      const n = (await tmpFilesOrAll(blocks)).filter((f) => f.includes('.blk')).length;
      const m = await managerOfDisk(ctx.dataDir, [...(await diskPaths(ctx.dataDir)).values()][0]!);
      if (m) await kill9(m);
      ctx.note(`manager killed after ${n} of 48 blocks (point ${k})`);
      const t = Date.now();
      await converged(sys, 'img', sum, 1, bound);
      // A backup whose writer died may end in Error: a new backup of the image replaces it and completes.
      const state = await until('the backup to end', async () => (await backupsOf(sys, 'img')).find((x) => x.state === 'Completed' || x.state === 'Error'), bound, 300);
      ctx.note(`backup after the kill: ${state.state}${state.error ? ` (${state.error.slice(0, 80)})` : ''}`);
      if (state.state !== 'Completed') await backupNow(sys, 'img', bound);
      return { sys, disks: 1, images: { img: sum }, convergeMs: Date.now() - t };
    },
  },
  {
    name: 'kill -9 of the data source mid-restore',
    quick: false,
    boundMs: 240_000,
    async run(ctx, bound) {
      const { data, sum } = imageBytes(64 * MiB, 5);
      const origin = await startOrigin(data);
      ctx.origins.push(origin);
      const sys = await inProcessSystem(ctx.dataDir, 2);
      ctx.systems.push(sys);
      await createImage(sys, 'img', origin.url, sum, 2);
      await converged(sys, 'img', sum, 2, 120_000);
      await backupNow(sys, 'img', 120_000);
      await deleteAndRestore(sys, 'img');
      const ds = await waitForDataSource(ctx.dataDir, 'img');
      const delay = Math.floor(between(ctx.r, 0, 1500));
      await sleep(delay);
      const b = await getImage(sys, 'img');
      ctx.note(`data source killed ${delay} ms after it started (copies: ${Object.values(b?.diskFileStatusMap ?? {}).map((s) => s.state || 'none').join(', ') || 'none yet'})`);
      await kill9(ds);
      const t = Date.now();
      await converged(sys, 'img', sum, 2, bound);
      return { sys, disks: 2, images: { img: sum }, convergeMs: Date.now() - t };
    },
  },
  ...(['download', 'sync', 'backup', 'restore'] as const).map(
    (phase): FaultCase => ({
      name: `kill -9 of the controller-manager mid-${phase}`,
      quick: false,
      boundMs: 420_000,
      async run(ctx, bound) {
        const { data, sum } = imageBytes(48 * MiB, 6);
        const origin = await startOrigin(data, { throttleMs: phase === 'download' ? 4 : 0 });
        ctx.origins.push(origin);
        const sys = await cliSystem(ctx.dataDir, 2);
        ctx.systems.push(sys);
        await createImage(sys, 'img', origin.url, sum, 2);
        if (phase === 'download') {
          const point = Math.floor(between(ctx.r, 0.1, 0.9) * data.length);
          await until('the origin to have sent the point', () => origin.sent() >= point, 120_000, 20);
          ctx.note(`killed after ${(point / MiB).toFixed(1)} MiB of the download`);
          origin.throttleMs = 0;
        } else if (phase === 'sync') {
          await until('a first ready copy', async () => readyDisks(await getImage(sys, 'img'))[0], 180_000, 20);
          const delay = Math.floor(between(ctx.r, 0, 1500));
          await sleep(delay);
          ctx.note(`killed ${delay} ms after the first copy was ready`);
        } else {
          await converged(sys, 'img', sum, 2, 180_000);
          if (phase === 'backup') {
            expect((await api(sys).call('POST', '/v1/backingimages/img?action=backupBackingImageCreate', {})).status).toBe(200);
            const delay = Math.floor(between(ctx.r, 0, 2000));
            await sleep(delay);
            ctx.note(`killed ${delay} ms after the backup was created`);
          } else {
            await backupNow(sys, 'img', 180_000);
            await deleteAndRestore(sys, 'img');
            await waitForDataSource(ctx.dataDir, 'img', 120_000);
            const delay = Math.floor(between(ctx.r, 0, 1500));
            await sleep(delay);
            ctx.note(`killed ${delay} ms after the restore's data source started`);
          }
        }
        await sys.kill9!();
        await sys.start();
        const t = Date.now();
        await converged(sys, 'img', sum, 2, bound);
        if (phase === 'backup') {
          const state = await until('the backup to end', async () => (await backupsOf(sys, 'img')).find((x) => x.state === 'Completed' || x.state === 'Error'), bound, 500);
          ctx.note(`backup after the restart: ${state.state}${state.error ? ` (${state.error.slice(0, 80)})` : ''}`);
          if (state.state !== 'Completed') await backupNow(sys, 'img', bound);
        }
        return { sys, disks: 2, images: { img: sum }, convergeMs: Date.now() - t };
      },
    }),
  ),
  ...([true, false] as const).map(
    (range): FaultCase => ({
      name: `an origin that drops mid-body, ${range ? 'with' : 'without'} Range support`,
      quick: range,
      boundMs: 180_000,
      async run(ctx, bound) {
        const { data, sum } = imageBytes(16 * MiB, 7);
        const dropAfter = Math.floor(between(ctx.r, 0.1, 0.9) * data.length);
        const origin = await startOrigin(data, { range, dropAfter, drops: 2 });
        ctx.origins.push(origin);
        const sys = await inProcessSystem(ctx.dataDir, 1);
        ctx.systems.push(sys);
        const t = Date.now();
        await createImage(sys, 'img', origin.url, sum, 1);
        await converged(sys, 'img', sum, 1, bound);
        expect(origin.dropped()).toBeGreaterThanOrEqual(1); // with Range, the resumed request may be shorter than the drop point
        ctx.note(`dropped ${origin.dropped()}× after ${(dropAfter / MiB).toFixed(1)} MiB; ${origin.gets()} GETs, ${origin.rangeGets()} with a Range`);
        return { sys, disks: 1, images: { img: sum }, convergeMs: Date.now() - t };
      },
    }),
  ),
  {
    name: 'one disk on a small tmpfs that fills up',
    quick: false,
    boundMs: 240_000,
    async run(ctx, bound) {
      const why = await canMountTmpfs(ctx.dir);
      if (why) throw new SkipCase(why);
      const disk2 = path.join(ctx.dataDir, 'disks', 'disk-2');
      await mkdir(disk2, { recursive: true });
      const size = Math.floor(between(ctx.r, 4, 14));
      execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${size}m`, 'tmpfs', disk2]);
      ctx.cleanups.push(async () => void execFileSync('umount', ['-l', disk2]));
      const { data, sum } = imageBytes(16 * MiB, 8);
      const origin = await startOrigin(data);
      ctx.origins.push(origin);
      const sys = await inProcessSystem(ctx.dataDir, 2);
      ctx.systems.push(sys);
      const disks = await diskPaths(ctx.dataDir);
      const uuid2 = [...disks].find(([, p]) => p === disk2)![0];
      await createImage(sys, 'img', origin.url, sum, 2);
      // The full disk: a copy there fails with ENOSPC named (or is never placed there); the other disk is ready.
      const seen = await until('one ready copy and the full disk reported', async () => {
        const b = await getImage(sys, 'img');
        const s = b?.diskFileStatusMap[uuid2];
        const other = readyDisks(b).filter((d) => d !== uuid2).length === 1;
        if (other && s?.state === 'failed' && /ENOSPC|no space/i.test(s.message)) return `failed: ${s.message.slice(0, 120)}`;
        return undefined;
      }, bound, 300);
      ctx.note(`tmpfs of ${size} MiB: ${seen}`);
      expect(await tmpFiles(disk2)).toEqual([]);
      // Room again: the copy is synced once its backoff ends.
      execFileSync('mount', ['-o', 'remount,size=64m', disk2]);
      const t = Date.now();
      await converged(sys, 'img', sum, 2, bound);
      return { sys, disks: 2, images: { img: sum }, convergeMs: Date.now() - t };
    },
  },
  {
    name: 'one byte of a ready copy corrupted, mtime kept',
    quick: true,
    boundMs: 180_000,
    async run(ctx, bound) {
      const { data, sum } = imageBytes(8 * MiB, 9);
      const origin = await startOrigin(data);
      ctx.origins.push(origin);
      const sys = await inProcessSystem(ctx.dataDir, 2);
      ctx.systems.push(sys);
      // the scrub interval reaches managers as a flag when they start: set it, then start again
      expect((await api(sys).call('PUT', '/v1/settings/backing-image-scrub-interval', { value: '2' })).status).toBe(200);
      await sys.stop();
      await sys.start();
      await createImage(sys, 'img', origin.url, sum, 2);
      await converged(sys, 'img', sum, 2, 120_000);
      const b = (await getImage(sys, 'img'))!;
      const disk = readyDisks(b)[Math.floor(ctx.r() * 2)]!;
      const file = path.join((await diskPaths(ctx.dataDir)).get(disk)!, 'backing-images', `img-${b.uuid}`, 'backing');
      const offset = Math.floor(ctx.r() * data.length);
      await flipByte(file, offset);
      ctx.note(`byte ${offset} flipped on one of 2 copies`);
      const t = Date.now();
      const failed = await until('the corrupted copy found', async () => {
        const s = (await getImage(sys, 'img'))?.diskFileStatusMap[disk];
        return s?.state === 'failed' ? s.message : undefined;
      }, bound, 100);
      ctx.note(`found: ${failed.slice(0, 70)}`);
      await converged(sys, 'img', sum, 2, bound);
      return { sys, disks: 2, images: { img: sum }, convergeMs: Date.now() - t };
    },
  },
  {
    name: 'a ready file deleted',
    quick: false,
    boundMs: 180_000,
    async run(ctx, bound) {
      const { data, sum } = imageBytes(8 * MiB, 10);
      const origin = await startOrigin(data);
      ctx.origins.push(origin);
      const sys = await inProcessSystem(ctx.dataDir, 2);
      ctx.systems.push(sys);
      await createImage(sys, 'img', origin.url, sum, 2);
      await converged(sys, 'img', sum, 2, 120_000);
      const b = (await getImage(sys, 'img'))!;
      const disk = readyDisks(b)[Math.floor(ctx.r() * 2)]!;
      const file = path.join((await diskPaths(ctx.dataDir)).get(disk)!, 'backing-images', `img-${b.uuid}`, 'backing');
      await rm(file);
      const t = Date.now();
      const seen = await until('the missing file noticed', async () => {
        const s = (await getImage(sys, 'img'))?.diskFileStatusMap[disk];
        return s && s.state !== 'ready' ? `${s.state}: ${s.message.slice(0, 60)}` : undefined;
      }, bound, 100);
      ctx.note(`noticed: ${seen}`);
      await converged(sys, 'img', sum, 2, bound);
      return { sys, disks: 2, images: { img: sum }, convergeMs: Date.now() - t };
    },
  },
  {
    name: 'an S3 backup target that vanishes for 10 s mid-backup',
    quick: true,
    boundMs: 240_000,
    async run(ctx, bound) {
      const s3dir = path.join(ctx.dir, 's3');
      const bucket = 'lh-backups';
      let s3 = new S3rver({ port: 0, address: '127.0.0.1', silent: true, directory: s3dir, configureBuckets: [{ name: bucket }] });
      const port = (await s3.run()).port;
      let s3up = true;
      ctx.cleanups.push(async () => {
        if (s3up) await closeS3(s3);
      });
      const { data, sum } = imageBytes(64 * MiB, 11);
      const origin = await startOrigin(data);
      ctx.origins.push(origin);
      const sys = await inProcessSystem(ctx.dataDir, 1);
      ctx.systems.push(sys);
      const a = api(sys);
      expect((await a.call('PUT', '/v1/secrets/s3-secret', { data: { AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER', AWS_ENDPOINTS: `http://127.0.0.1:${port}` } })).status).toBe(200);
      expect((await a.call('PUT', '/v1/backuptargets/default', { backupTargetURL: `s3://${bucket}@us-east-1/`, credentialSecret: 's3-secret', pollInterval: '2s' })).status).toBe(200);
      await until('the S3 target available', async () => (await a.call('GET', '/v1/backuptargets/default')).json['available'] === true, 60_000);
      await createImage(sys, 'img', origin.url, sum, 1);
      await converged(sys, 'img', sum, 1, 120_000);
      const blocks = path.join(s3dir, bucket, 'backupstore', 'backing-images', 'blocks');
      const k = Math.floor(between(ctx.r, 1, 24));
      expect((await a.call('POST', '/v1/backingimages/img?action=backupBackingImageCreate', {})).status).toBe(200);
      await until(`${k} blocks in the bucket`, async () => (await tmpFilesOrAll(blocks)).filter((f) => f.includes('.blk')).length >= k, 120_000, 20);
      await closeS3(s3);
      s3up = false;
      const n = (await tmpFilesOrAll(blocks)).filter((f) => f.includes('.blk')).length;
      ctx.note(`S3 down after ${n} of 32 blocks (point ${k}) for 10 s`);
      expect(n).toBeLessThan(32); // the outage is mid-backup
      const t = Date.now();
      await sleep(10_000);
      s3 = new S3rver({ port, address: '127.0.0.1', silent: true, directory: s3dir, configureBuckets: [{ name: bucket }] });
      await s3.run();
      s3up = true;
      // No manual step: the backup rides out the outage.
      await until('the backup Completed', async () => {
        const bs = await backupsOf(sys, 'img');
        if (bs.some((x) => x.state === 'Error')) throw new Error(`backup in Error: ${bs.find((x) => x.state === 'Error')!.error}`);
        return bs.some((x) => x.state === 'Completed');
      }, bound, 300).catch((err: Error) => {
        throw new Error(`${err.message}`);
      });
      return { sys, disks: 1, images: { img: sum }, convergeMs: Date.now() - t };
    },
  },
  {
    name: 'a crash of everything mid-restore, then a restart',
    quick: false,
    boundMs: 420_000,
    async run(ctx, bound) {
      const { data, sum } = imageBytes(64 * MiB, 12);
      const origin = await startOrigin(data);
      ctx.origins.push(origin);
      const sys = await cliSystem(ctx.dataDir, 2);
      ctx.systems.push(sys);
      await createImage(sys, 'img', origin.url, sum, 2);
      await converged(sys, 'img', sum, 2, 180_000);
      await backupNow(sys, 'img', 180_000);
      await deleteAndRestore(sys, 'img');
      await waitForDataSource(ctx.dataDir, 'img', 120_000);
      const delay = Math.floor(between(ctx.r, 0, 1500));
      await sleep(delay);
      // power loss of the processes: the controller and every manager and data source at once
      const all = await processesOf(ctx.dataDir);
      await sys.kill9!();
      await Promise.all(all.map((p) => kill9(p.pid)));
      ctx.note(`${all.length + 1} processes killed ${delay} ms after the restore's data source started`);
      await sys.start();
      const t = Date.now();
      await converged(sys, 'img', sum, 2, bound);
      return { sys, disks: 2, images: { img: sum }, convergeMs: Date.now() - t };
    },
  },
];

class SkipCase extends Error {}

async function closeS3(s3: S3rver): Promise<void> {
  s3.httpServer?.closeAllConnections?.();
  await s3.close();
}

/** Every file under `dir` (recursively). */
async function tmpFilesOrAll(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...(await tmpFilesOrAll(p)));
    else out.push(p);
  }
  return out;
}

// ------------------------------------------------------------------ running a case

async function runCase(c: FaultCase): Promise<void> {
  const seed = caseSeed(SEED, c.name);
  const notes: string[] = [];
  const tmp = await tempDir('bis-fault-');
  const ctx: CaseContext = { r: rng(seed), dir: tmp.dir, dataDir: path.join(tmp.dir, 'data'), systems: [], origins: [], cleanups: [], note: (s) => notes.push(s) };
  const row: (typeof results)[number] = { name: c.name, seed, result: 'failed', notes };
  results.push(row);
  try {
    const res = await c.run(ctx, c.boundMs);
    row.convergeMs = res.convergeMs;
    // 2. no corrupt ready copy
    const hashed = await assertNoCorruptReadyCopy(res.sys, res.images);
    expect(hashed).toBeGreaterThan(0);
    // 3. no orphan while running, nothing left after the stop
    await assertNoOrphanWhileRunning(res.sys, res.disks);
    await res.sys.stop();
    await assertNothingLeftAfterStop(ctx.dataDir);
    row.result = 'passed';
  } catch (err) {
    if (err instanceof SkipCase) {
      row.result = `skipped: ${err.message}`;
      console.warn(`fault case "${c.name}" skipped: ${err.message}`);
      return;
    }
    if (c.knownFailure) row.result = 'failed (known failure)';
    const out = ctx.systems.map((s) => s.output()).join('\n');
    console.log(`fault case "${c.name}" (seed ${seed}, suite seed ${SEED}) failed: ${(err as Error).message}\nnotes: ${notes.join('; ')}\n${out}\n${await logTails(ctx.dataDir)}`);
    throw err;
  } finally {
    for (const s of ctx.systems) await s.stop().catch(() => undefined);
    await killLeftovers(ctx.dataDir);
    for (const o of ctx.origins) await o.close();
    for (const f of ctx.cleanups) await f().catch(() => undefined);
    await tmp.remove();
  }
}

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  await stat(CONTROLLER_MANAGER_CLI.replace(/bin\/controller-manager\.js$/, 'dist/main.js')).catch(() => {
    if (cases.some((c) => (FULL || c.quick) && /controller-manager|crash of everything/.test(c.name))) throw new Error('build the controller-manager first: npx nx run controller-manager:build');
  });
  console.log(`fault suite: seed ${SEED} (replay with BIS_FAULT_SEED=${SEED}); ${FULL ? 'every case' : 'quick subset (BIS_FAULTS=full runs every case)'}`);
});

afterAll(() => {
  if (results.length === 0) return;
  const lines = results.map((r) => `| ${r.name} | ${r.seed} | ${r.convergeMs === undefined ? '–' : `${(r.convergeMs / 1000).toFixed(1)} s`} | ${r.result} | ${r.notes.join('; ')} |`);
  console.log(`fault suite results (suite seed ${SEED}):\n| case | seed | time to converge | result | notes |\n|---|---|---|---|---|\n${lines.join('\n')}`);
});

describe('fault injection (real standalone system)', () => {
  const skipped = cases.filter((c) => !FULL && !c.quick);
  if (skipped.length) console.warn(`fault suite: ${skipped.length} cases run only with BIS_FAULTS=full (npm run faults): ${skipped.map((c) => c.name).join('; ')}`);
  for (const c of cases) {
    const title = `${c.name} (converges within ${c.boundMs / 1000} s; no corrupt ready copy; no orphan, no *.tmp)`;
    const timeout = c.boundMs * 2 + 240_000;
    // Reason: `npm test` runs only the quick subset (a few minutes); the other cases run with BIS_FAULTS=full, which
    // `npm run faults` sets. The title says so, and the warning above lists them.
    if (!FULL && !c.quick) it.skip(`${title} [skipped: a full-suite case, it runs with BIS_FAULTS=full (npm run faults)]`, () => runCase(c));
    else if (c.knownFailure) it.failing(`${title} [known failure: ${c.knownFailure}]`, () => runCase(c), timeout);
    else it(title, () => runCase(c), timeout);
  }
});
