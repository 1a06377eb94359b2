import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import S3rver from 's3rver';
import { BackingImageKind, BackupBackingImageKind, BackupTargetKind, type BackingImage } from '@bis/controllers';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, startImageServer, tempDir, waitFor, writeImage, type ImageServer } from './test-support/e2e.js';

/**
 * `AWS_CERT` through the whole standalone system: s3rver serves HTTPS with a certificate for 127.0.0.1 signed by a CA
 * the test makes with the openssl CLI. Without `AWS_CERT` in the target's secret the target is unavailable and says
 * the certificate could not be verified; with the CA's PEM as `AWS_CERT` the backup and the restore (manager and
 * data-source processes) go over TLS.
 */
const run = promisify(execFile);
const SIZE = 4 * 1024 * 1024;
const BUCKET = 'tls-backups';

let tmp: { dir: string; remove(): Promise<void> };
let images: ImageServer;
let sum: string;
let s3: S3rver;
let endpoint: string;
let caPem: string;
let sys: StandaloneHandle;
const logs: string[] = [];
const log = { info: (m: string) => logs.push(`I ${m}`), warn: (m: string) => logs.push(`W ${m}`), error: (m: string) => logs.push(`E ${m}`), debug: () => {} };

async function call(method: string, url: string, body?: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(`${sys.url}${url}`, { method, headers: body === undefined ? {} : { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, json: text ? (JSON.parse(text) as Record<string, unknown>) : {} };
}

async function sha512Of(file: string): Promise<string> {
  const h = createHash('sha512');
  for await (const c of createReadStream(file)) h.update(c as Buffer);
  return h.digest('hex');
}

/** A CA and a server certificate for 127.0.0.1 signed by it, made with the openssl CLI. */
async function makeCertificates(dir: string): Promise<{ ca: string; key: string; cert: string }> {
  const f = (n: string) => path.join(dir, n);
  await run('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', f('ca.key'), '-out', f('ca.pem'), '-days', '2', '-subj', '/CN=bis test CA',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
  await run('openssl', ['req', '-newkey', 'rsa:2048', '-nodes', '-keyout', f('server.key'), '-out', f('server.csr'), '-subj', '/CN=127.0.0.1']);
  await writeFile(f('server.ext'), 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n');
  await run('openssl', ['x509', '-req', '-in', f('server.csr'), '-CA', f('ca.pem'), '-CAkey', f('ca.key'), '-CAcreateserial', '-out', f('server.pem'), '-days', '2', '-extfile', f('server.ext')]);
  return { ca: await readFile(f('ca.pem'), 'utf8'), key: await readFile(f('server.key'), 'utf8'), cert: await readFile(f('server.pem'), 'utf8') };
}

const target = () => sys.store.get(BackupTargetKind, 'default', sys.namespace);
const unavailableMessage = async () => (await target()).status?.conditions?.find((c) => c.type === 'Unavailable')?.message ?? '';
const readyDisks = (b: BackingImage) => Object.entries(b.status?.diskFileStatusMap ?? {}).filter(([, s]) => s.state === 'ready').map(([d]) => d);

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-standalone-s3-tls-');
  const certs = await makeCertificates(tmp.dir);
  caPem = certs.ca;
  sum = await writeImage(path.join(tmp.dir, 'img.raw'), SIZE, 33);
  images = await startImageServer(tmp.dir);
  s3 = new S3rver({ port: 0, address: '127.0.0.1', silent: true, directory: path.join(tmp.dir, 's3'), configureBuckets: [{ name: BUCKET }], key: certs.key, cert: certs.cert });
  endpoint = `https://127.0.0.1:${(await s3.run()).port}`;
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

describe('S3 over TLS with AWS_CERT (standalone, s3rver with a certificate from a test CA)', () => {
  it('without AWS_CERT the target is unavailable and says the certificate could not be verified', async () => {
    expect((await call('PUT', '/v1/secrets/tls', { data: { AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER', AWS_ENDPOINTS: endpoint } })).status).toBe(200);
    expect((await call('PUT', '/v1/backuptargets/default', { backupTargetURL: `s3://${BUCKET}@us-east-1/`, credentialSecret: 'tls', pollInterval: '2s' })).status).toBe(200);
    const msg = await waitFor('the target reports the certificate', async () => {
      const m = await unavailableMessage();
      return /certificate/i.test(m) ? m : undefined;
    }, 30_000);
    expect(msg).toContain('AWS_CERT');
    expect((await target()).status?.available).toBe(false);
    await sys.controllers.actions.create({ name: 'tlsimg', sourceType: 'download', parameters: { url: images.url('img.raw') }, expectedChecksum: sum, minNumberOfCopies: 2 });
    await waitFor('tlsimg ready', async () => readyDisks(await sys.store.get(BackingImageKind, 'tlsimg', sys.namespace)).length >= 1, 60_000);
    const refused = await call('POST', '/v1/backingimages/tlsimg?action=backupBackingImageCreate', { backupTargetName: 'default' });
    expect(refused.status).toBe(500);
    expect(String(refused.json['message'])).toMatch(/backup target default is not available: .*certificate/i);
  }, 120_000);

  it('with the CA as AWS_CERT: backup over TLS, delete, restore bit-exact', async () => {
    expect((await call('PUT', '/v1/secrets/tls', { data: { AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER', AWS_ENDPOINTS: endpoint, AWS_CERT: caPem } })).status).toBe(200);
    await waitFor('target available', async () => (await target()).status?.available, 30_000);
    expect((await call('POST', '/v1/backingimages/tlsimg?action=backupBackingImageCreate', { backupTargetName: 'default' })).status).toBe(200);
    const bbi = await waitFor('backup completed', async () => {
      const b = (await sys.store.list(BackupBackingImageKind, { namespace: sys.namespace })).items.find((x) => x.spec?.backingImage === 'tlsimg');
      if (b?.status?.state === 'Error') throw new Error(b.status.error);
      return b?.status?.state === 'Completed' && b.status.lastSyncedAt ? b : undefined;
    }, 90_000);
    expect(bbi.status?.checksum).toBe(sum);

    await sys.controllers.actions.delete('tlsimg');
    await waitFor('tlsimg deleted', async () => !(await sys.store.list(BackingImageKind, { namespace: sys.namespace })).items.some((b) => b.metadata.name === 'tlsimg'), 30_000);
    await sys.controllers.actions.restoreBackup(bbi.metadata.name, { dataEngine: 'v1' });
    const restored = await waitFor('restored, a ready copy on every disk', async () => {
      const b = await sys.store.get(BackingImageKind, 'tlsimg', sys.namespace).catch(() => undefined);
      return b && readyDisks(b).length === 2 ? b : undefined;
    }, 120_000);
    expect(restored.status?.checksum).toBe(sum);
    const file = path.join(sys.disks[0]!.path, 'backing-images', `tlsimg-${restored.status?.uuid}`, 'backing');
    expect(await sha512Of(file)).toBe(sum);
    // The PEM is a secret value like any other: it never reaches a log line or an event.
    const pemBody = caPem.split('\n')[1]!;
    expect(logs.join('\n')).not.toContain(pemBody);
    expect(JSON.stringify(await sys.events.list())).not.toContain(pemBody);
  }, 300_000);
});
