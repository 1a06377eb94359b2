/**
 * Backups recover by themselves, through the REST API of the real standalone system (manager and data-source
 * processes): a backup of an image without a ready copy is refused with the copies' states, and a new backup of an
 * image whose backup failed replaces the failed one.
 */
import { mkdir, readFile, readdir, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, startImageServer, tempDir, waitFor, writeImage, type ImageServer } from './test-support/e2e.js';

let tmp: { dir: string; remove(): Promise<void> };
let server: ImageServer;
let sum: string;
let sys: StandaloneHandle;
const logs: string[] = [];
const log = { info: (m: string) => logs.push(`I ${m}`), warn: (m: string) => logs.push(`W ${m}`), error: (m: string) => logs.push(`E ${m}`), debug: () => {} };

interface Resource {
  [k: string]: unknown;
  actions?: Record<string, string>;
}

async function call(method: string, url: string, body?: unknown): Promise<{ status: number; json: Resource & { data?: Resource[]; message?: string } }> {
  const res = await fetch(url.startsWith('http') ? url : `${sys.url}${url}`, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, json: text ? (JSON.parse(text) as Resource) : {} };
}

/** A copy of the image is `ready` on a manager's disk (what a backup reads from). */
const hasReadyCopy = async (image: string) =>
  Object.values(((await call('GET', `/v1/backingimages/${image}`)).json['diskFileStatusMap'] ?? {}) as Record<string, { state: string }>).some((f) => f.state === 'ready');
const backupsOf = async (image: string) => (await call('GET', '/v1/backupbackingimages')).json.data!.filter((b) => b['backingImageName'] === image);

async function dumpOnFailure<T>(p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (err) {
    const files = await readdir(sys.logsDir).catch(() => [] as string[]);
    const tails = await Promise.all(files.map(async (f) => `== ${f}\n${(await readFile(path.join(sys.logsDir, f), 'utf8')).split('\n').slice(-8).join('\n')}`));
    console.log([...logs.slice(-60), ...tails].join('\n'));
    throw err;
  }
}

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-backup-recovery-');
  sum = await writeImage(path.join(tmp.dir, 'img.raw'), 4 * 1024 * 1024, 5);
  server = await startImageServer(tmp.dir);
  sys = await startStandalone({
    dataDir: path.join(tmp.dir, 'data'),
    listen: '127.0.0.1:0',
    disks: 1,
    allowSourceHosts: ['127.0.0.1'],
    binaries: BINARIES,
    log,
    controllerOptions: { resyncMs: 2000, timing: { dataSourcePollMs: 200, managerPollMs: 200, waitRequeueMs: 300, backupPollMs: 300 } },
  });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  await server?.close();
  await tmp?.remove();
});

describe('backups recover by themselves', () => {
  it('refuses a backup of an image with no ready copy, naming each copy with its state, then backs it up once ready', async () => {
    server.throttleMs = 60; // the download stays in progress for a while
    expect((await call('POST', '/v1/backingimages', { name: 'slow', sourceType: 'download', parameters: { url: server.url('img.raw') }, expectedChecksum: sum, minNumberOfCopies: 1 })).status).toBe(200);
    await dumpOnFailure(
      waitFor('the copy in progress', async () => {
        const bi = (await call('GET', '/v1/backingimages/slow')).json;
        return Object.values((bi['diskFileStatusMap'] ?? {}) as Record<string, { state: string }>).some((f) => f.state === 'in-progress');
      }, 30_000),
    );
    const refused = await call('POST', '/v1/backingimages/slow?action=backupBackingImageCreate', {});
    expect(refused.status).toBe(500);
    expect(refused.json.message).toMatch(/^backing image slow has no ready copy to back up yet \(copies: disk-1 on node \S+ (in-progress \d+%|pending|starting)\); wait until a copy is ready, then create the backup$/);
    expect(await backupsOf('slow')).toEqual([]);

    server.throttleMs = 0;
    await dumpOnFailure(waitFor('a ready copy of slow', () => hasReadyCopy('slow'), 60_000));
    const created = await call('POST', '/v1/backingimages/slow?action=backupBackingImageCreate', {});
    expect({ status: created.status, message: created.json.message }).toEqual({ status: 200, message: undefined });
    await dumpOnFailure(waitFor('the backup completed', async () => (await backupsOf('slow'))[0]?.['state'] === 'Completed', 60_000));
  }, 150_000);

  it('a new backup of the same image replaces a backup in Error, and completes', async () => {
    expect((await call('POST', '/v1/backingimages', { name: 'retry', sourceType: 'download', parameters: { url: server.url('img.raw') }, expectedChecksum: sum, minNumberOfCopies: 1 })).status).toBe(200);
    await dumpOnFailure(waitFor('a ready copy of retry', () => hasReadyCopy('retry'), 60_000));

    // The backup target's directory is replaced by a file: the backup fails in the manager.
    const backups = path.join(tmp.dir, 'data', 'backups');
    await rename(backups, `${backups}.away`);
    await writeFile(backups, 'not a directory');
    const first = await call('POST', '/v1/backingimages/retry?action=backupBackingImageCreate', {});
    expect({ status: first.status, message: first.json.message }).toEqual({ status: 200, message: undefined });
    const failed = await dumpOnFailure(
      waitFor('the backup in Error', async () => {
        const b = (await backupsOf('retry'))[0];
        return b?.['state'] === 'Error' ? b : undefined;
      }, 60_000),
    );
    expect(String(failed['error'])).not.toBe('');

    // The target is back; a second create is not refused with "already exists": it replaces the failed backup.
    await rm(backups);
    await rename(`${backups}.away`, backups);
    await mkdir(backups, { recursive: true });
    const again = await call('POST', '/v1/backingimages/retry?action=backupBackingImageCreate', {});
    expect({ status: again.status, message: again.json.message }).toEqual({ status: 200, message: undefined });
    const done = await dumpOnFailure(
      waitFor('one completed backup of retry', async () => {
        const list = await backupsOf('retry');
        return list.length === 1 && list[0]!['state'] === 'Completed' ? list[0] : undefined;
      }, 60_000),
    );
    expect(done['name']).not.toBe(failed['name']);
    expect(String(done['url'])).toContain('backingImage=retry');

    // A third create, while that backup is Completed, is still refused: only a failed backup is replaced.
    const dup = await call('POST', '/v1/backingimages/retry?action=backupBackingImageCreate', {});
    expect(dup.status).toBe(500);
    expect(dup.json.message).toContain('backup backing image retry for backup target default already exists');
  }, 180_000);
});
