import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import S3rver from 's3rver';
import { BackingImageKind, BackupBackingImageKind, BackupTargetKind, SecretKind, type BackingImage } from '@bis/controllers';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, startImageServer, tempDir, waitFor, writeImage, type ImageServer } from './test-support/e2e.js';

/**
 * The whole standalone system against a real S3-protocol server (s3rver) on loopback: a credential secret, an s3://
 * backup target naming it, a backup in Longhorn's layout, a restore that is bit-exact, and the failures an operator
 * must see (wrong credentials, a missing bucket) without any secret value in a status.
 */
const SIZE = 6 * 1024 * 1024;
const BUCKET = 'lh-backups';
const KEY_ID = 'S3RVER';
const SECRET_KEY = 'S3RVER';

let tmp: { dir: string; remove(): Promise<void> };
let images: ImageServer;
let sum: string;
let s3: S3rver;
let s3Endpoint: string;
let sys: StandaloneHandle;
const logs: string[] = [];
const log = { info: (m: string) => logs.push(`I ${m}`), warn: (m: string) => logs.push(`W ${m}`), error: (m: string) => logs.push(`E ${m}`), debug: () => {} };

async function call(method: string, url: string, body?: unknown): Promise<{ status: number; json: Record<string, unknown>; text: string }> {
  const res = await fetch(`${sys.url}${url}`, { method, headers: body === undefined ? {} : { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, json: text ? (JSON.parse(text) as Record<string, unknown>) : {}, text };
}

async function sha512Of(file: string): Promise<string> {
  const h = createHash('sha512');
  for await (const c of createReadStream(file)) h.update(c as Buffer);
  return h.digest('hex');
}

async function walk(dir: string, prefix = ''): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
    const rel = prefix ? `${prefix}/${e.name}` : e.name;
    if (e.isDirectory()) out.push(...(await walk(path.join(dir, e.name), rel)));
    else out.push(rel);
  }
  return out;
}

const target = () => sys.store.get(BackupTargetKind, 'default', sys.namespace);
const unavailableMessage = async () => (await target()).status?.conditions?.find((c) => c.type === 'Unavailable')?.message ?? '';
const readyDisks = (b: BackingImage) => Object.entries(b.status?.diskFileStatusMap ?? {}).filter(([, s]) => s.state === 'ready').map(([d]) => d);

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-standalone-s3-');
  sum = await writeImage(path.join(tmp.dir, 'img.raw'), SIZE, 21);
  images = await startImageServer(tmp.dir);
  s3 = new S3rver({ port: 0, address: '127.0.0.1', silent: true, directory: path.join(tmp.dir, 's3'), configureBuckets: [{ name: BUCKET }] });
  s3Endpoint = `http://127.0.0.1:${(await s3.run()).port}`;
  sys = await startStandalone({
    dataDir: path.join(tmp.dir, 'data'),
    listen: '127.0.0.1:0',
    disks: 2,
    allowSourceHosts: ['127.0.0.1'],
    binaries: BINARIES,
    log,
    controllerOptions: { resyncMs: 2000, timing: { dataSourcePollMs: 200, managerPollMs: 200, waitRequeueMs: 300, managerRestartInitialMs: 200, backupPollMs: 300 } },
  });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  await images?.close();
  await s3?.close();
  await tmp?.remove();
});

describe('S3 backup target with a credential secret (standalone, s3rver on loopback)', () => {
  it('secrets: values are stored, never returned', async () => {
    const put = await call('PUT', '/v1/secrets/s3-secret', { data: { AWS_ACCESS_KEY_ID: 'WRONGKEYID', AWS_SECRET_ACCESS_KEY: 'very-secret-value-1', AWS_ENDPOINTS: s3Endpoint } });
    expect(put.status).toBe(200);
    expect(put.json['keys']).toEqual(['AWS_ACCESS_KEY_ID', 'AWS_ENDPOINTS', 'AWS_SECRET_ACCESS_KEY']);
    const list = await call('GET', '/v1/secrets');
    expect(list.text).toContain('s3-secret');
    expect(list.text).not.toContain('very-secret-value-1');
    expect((await call('GET', '/v1/secrets/s3-secret')).text).not.toContain('very-secret-value-1');
    expect((await sys.store.get(SecretKind, 's3-secret', sys.namespace)).data?.['AWS_SECRET_ACCESS_KEY']).toBe(Buffer.from('very-secret-value-1').toString('base64'));
    expect((await call('PUT', '/v1/secrets/bad', { data: { 'A B': 'x' } })).status).toBe(500);
    expect((await call('GET', '/v1/secrets/none')).status).toBe(404);
  });

  it('wrong credentials: the target is unavailable with the 403 in its message, no secret value anywhere', async () => {
    const put = await call('PUT', '/v1/backuptargets/default', { backupTargetURL: `s3://${BUCKET}@us-east-1/`, credentialSecret: 's3-secret', pollInterval: '2s' });
    expect(put.status).toBe(200);
    const msg = await waitFor('the target reports the 403', async () => {
      const m = await unavailableMessage();
      return /403/.test(m) ? m : undefined;
    }, 30_000);
    expect((await target()).status?.available).toBe(false);
    for (const text of [msg, (await call('GET', '/v1/backuptargets/default')).text, logs.join('\n'), JSON.stringify(await sys.events.list())]) {
      expect(text).not.toContain('very-secret-value-1');
      expect(text).not.toContain('WRONGKEYID');
    }
    // A backup refused because of it carries the target's message.
    await sys.controllers.actions.create({ name: 's3img', sourceType: 'download', parameters: { url: images.url('img.raw') }, expectedChecksum: sum, minNumberOfCopies: 1 });
    await waitFor('s3img ready', async () => readyDisks(await sys.store.get(BackingImageKind, 's3img', sys.namespace)).length >= 1, 60_000);
    const refused = await call('POST', '/v1/backingimages/s3img?action=backupBackingImageCreate', { backupTargetName: 'default' });
    expect(refused.status).toBe(500);
    expect(String(refused.json['message'])).toMatch(/backup target default is not available: .*403/);
  }, 120_000);

  it('a missing bucket: the message carries the 404', async () => {
    await call('PUT', '/v1/secrets/s3-secret', { data: { AWS_ACCESS_KEY_ID: KEY_ID, AWS_SECRET_ACCESS_KEY: SECRET_KEY, AWS_ENDPOINTS: s3Endpoint } });
    await call('PUT', '/v1/backuptargets/default', { backupTargetURL: 's3://no-such-bucket@us-east-1/' });
    await waitFor('the target reports the 404', async () => /404|NoSuchBucket/.test(await unavailableMessage()), 30_000);
  }, 60_000);

  it('right credentials: backup in Longhorn\'s layout, delete, restore bit-exact', async () => {
    await call('PUT', '/v1/backuptargets/default', { backupTargetURL: `s3://${BUCKET}@us-east-1/` });
    await waitFor('target available', async () => (await target()).status?.available, 30_000);
    const create = await call('POST', '/v1/backingimages/s3img?action=backupBackingImageCreate', { backupTargetName: 'default' });
    expect(create.status).toBe(200);
    const bbi = await waitFor('backup completed', async () => {
      const all = (await sys.store.list(BackupBackingImageKind, { namespace: sys.namespace })).items.filter((b) => b.spec?.backingImage === 's3img');
      const b = all[0];
      if (b?.status?.state === 'Error') throw new Error(b.status.error);
      return b?.status?.state === 'Completed' && b.status.lastSyncedAt ? b : undefined;
    }, 90_000);
    expect(bbi.status?.url).toContain(`s3://${BUCKET}@us-east-1/`);
    expect(bbi.status?.checksum).toBe(sum);
    const files = await walk(path.join(tmp.dir, 's3', BUCKET));
    expect(files.some((f) => f.startsWith('backupstore/backing-images/backing-images/s3img/backing-image.cfg'))).toBe(true);
    expect(files.some((f) => /^backupstore\/backing-images\/blocks\/[0-9a-f]{2}\/[0-9a-f]{2}\/[0-9a-f]{64}\.blk/.test(f))).toBe(true);

    // Delete the image, restore it from the backup (the data source gets the credential by environment).
    await sys.controllers.actions.delete('s3img');
    await waitFor('s3img deleted', async () => !(await sys.store.list(BackingImageKind, { namespace: sys.namespace })).items.some((b) => b.metadata.name === 's3img'), 30_000);
    await sys.controllers.actions.restoreBackup(bbi.metadata.name, { dataEngine: 'v1' });
    const restored = await waitFor('restored, a ready copy on every disk', async () => {
      const b = await sys.store.get(BackingImageKind, 's3img', sys.namespace).catch(() => undefined);
      return b && readyDisks(b).length === 2 ? b : undefined;
    }, 120_000);
    expect(restored.spec?.sourceType).toBe('restore');
    expect(restored.status?.checksum).toBe(sum);
    const disk = sys.disks[0]!;
    const file = path.join(disk.path, 'backing-images', `s3img-${restored.status?.uuid}`, 'backing');
    expect(await sha512Of(file)).toBe(sum);

    // Deleting the backup removes it from the bucket.
    await sys.store.delete(BackupBackingImageKind, bbi.metadata.name, sys.namespace);
    await waitFor('backup config removed from the bucket', async () => !(await walk(path.join(tmp.dir, 's3', BUCKET))).some((f) => f.includes('backing-images/s3img/')), 60_000);
  }, 300_000);
});
