import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import S3rver from 's3rver';
import { browserMissing, launchBrowser } from '@bis/ui-server/testing';
import { ChartCluster, NS, clusterSkipReason, eventually, sha512File } from './testing/chart-cluster.js';

/**
 * S3 backups in Kubernetes mode, end to end through pods: the chart on a real kube-apiserver, one node played by
 * `TestCluster`, s3rver on the cluster's bridge address. The credential is a Secret in the system's namespace; the
 * backup target names it through the REST API; the backing-image-manager pod backs the image up with that credential
 * (BackupCreate's credential field) and the restore's data-source pod reads it from the per-data-source Secret the
 * controller writes. Checked: the 403 of a wrong key in the target's message (no key value in it), Longhorn's layout
 * in the bucket, the pod's /metrics and web UI, and a restore that is bit-exact. Then the chart's Service, as users
 * reach the system: the REST API and the web UI in Chromium through its cluster IP (the test cluster's kube-proxy).
 */
const NODE = 'node-1';
const BUCKET = 'lh-backups';
const reason = clusterSkipReason();
if (reason) console.warn(`s3-backup.cluster.spec.ts skipped: ${reason}`);
const describeCluster = reason ? describe.skip : describe;
if (!reason && browserMissing) console.warn(`s3-backup.cluster.spec.ts: the web UI check through the Service is skipped: ${browserMissing}`);
const itWithBrowser = browserMissing ? it.skip : it;

async function walk(dir: string, prefix = ''): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
    const rel = prefix ? `${prefix}/${e.name}` : e.name;
    if (e.isDirectory()) out.push(...(await walk(path.join(dir, e.name), rel)));
    else out.push(rel);
  }
  return out;
}

describeCluster('S3 backup and restore in Kubernetes mode through pods, with a credential Secret (one node, s3rver)', () => {
  let cc: ChartCluster | undefined;
  let s3: S3rver | undefined;
  let s3Dir = '';
  let endpoint = '';
  let originUrl = '';
  const image = Buffer.concat([randomBytes(3 << 20), Buffer.alloc(2 << 20), randomBytes(1 << 20)]);
  const checksum = createHash('sha512').update(image).digest('hex');

  type Target = { status?: { available?: boolean; conditions?: { type: string; message?: string }[] } };
  const target = () => cc!.get<Target>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/backuptargets/default`);
  const putSecret = async (keyId: string, secretKey: string): Promise<void> => {
    const body = { apiVersion: 'v1', kind: 'Secret', metadata: { name: 's3-secret', namespace: NS }, stringData: { AWS_ACCESS_KEY_ID: keyId, AWS_SECRET_ACCESS_KEY: secretKey, AWS_ENDPOINTS: endpoint } };
    const cur = await cc!.cp.request('GET', `/api/v1/namespaces/${NS}/secrets/s3-secret`);
    const res = cur.status === 200
      ? await cc!.cp.request('PUT', `/api/v1/namespaces/${NS}/secrets/s3-secret`, { body: { ...body, metadata: { ...body.metadata, resourceVersion: (cur.body as { metadata: { resourceVersion: string } }).metadata.resourceVersion } } })
      : await cc!.cp.request('POST', `/api/v1/namespaces/${NS}/secrets`, { body });
    if (res.status >= 300) throw new Error(`secret: HTTP ${res.status} ${JSON.stringify(res.body)}`);
  };

  beforeAll(async () => {
    cc = await ChartCluster.start({ nodes: [NODE], allowHostAddress: true });
    const hostAddress = cc.cluster.hostAddress;
    originUrl = await cc.serveOrigin({ '/disk.raw': image });
    // The S3 server on the bridge address: the pods reach it there, as they would reach an S3 endpoint of the cluster.
    s3Dir = await mkdtemp(path.join(os.tmpdir(), 'bis-cluster-s3-'));
    s3 = new S3rver({ port: 0, address: hostAddress, silent: true, directory: s3Dir, configureBuckets: [{ name: BUCKET }] });
    endpoint = `http://${hostAddress}:${(await s3.run()).port}`;
  }, 300_000);

  afterAll(async () => {
    try {
      await cc?.stop();
    } finally {
      await s3?.close();
      if (s3Dir) await rm(s3Dir, { recursive: true, force: true });
    }
  }, 120_000);

  it('a wrong key: the target is unavailable with the 403 in its message, and no key value in it', async () => {
    await putSecret('WRONGKEYID', 'wrong-secret-key-1');
    await cc!.rest(NODE, 'PUT', '/v1/backuptargets/default', { backupTargetURL: `s3://${BUCKET}@us-east-1/`, credentialSecret: 's3-secret', pollInterval: '2s' });
    const msg = await eventually(async () => {
      const t = await target();
      const m = t.status?.conditions?.find((c) => c.type === 'Unavailable')?.message ?? '';
      return t.status?.available === false && /403/.test(m) ? m : undefined;
    }, 60_000, 'the target unavailable with the 403', () => cc!.state(''));
    expect(msg).not.toContain('wrong-secret-key-1');
    expect(msg).not.toContain('WRONGKEYID');
  }, 120_000);

  it('the right key: backup through the manager pod in Longhorn\'s layout, delete, restore through a data-source pod, bit-exact', async () => {
    await putSecret('S3RVER', 'S3RVER');
    await eventually(async () => ((await target()).status?.available ? true : undefined), 60_000, 'the target available', async () => JSON.stringify(await target()));

    await cc!.createImage(NODE, { name: 'disk-img', sourceType: 'download', parameters: { url: `${originUrl}/disk.raw` }, expectedChecksum: checksum, minNumberOfCopies: 1 });
    await eventually(async () => ((await cc!.readyCopies('disk-img')).length >= 1 ? true : undefined), 180_000, 'disk-img ready', () => cc!.state('disk-img'));

    await cc!.rest(NODE, 'POST', '/v1/backingimages/disk-img?action=backupBackingImageCreate', { backupTargetName: 'default' });
    type Bbi = { name: string; state: string; error?: string; url?: string; actions?: Record<string, string> };
    const backup = await eventually(async () => {
      const list = (await cc!.rest(NODE, 'GET', '/v1/backupbackingimages')) as { data?: Bbi[] };
      const b = list.data?.find((x) => x.name.startsWith('disk-img'));
      if (b?.state === 'Error') throw new Error(`the backup failed: ${b.error ?? ''}`);
      return b?.state === 'Completed' ? b : undefined;
    }, 180_000, 'the backup completed', () => cc!.state('disk-img'));
    expect(backup.url).toContain(`s3://${BUCKET}@us-east-1/`);
    // The object keeps the image's SHA-512 (the REST resource has no such field, as in Longhorn).
    const cr = await cc!.get<{ status?: { checksum?: string } }>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/backupbackingimages/${backup.name}`);
    expect(cr.status?.checksum).toBe(checksum);
    // What an operator scrapes and opens on the controller-manager pod: /metrics and the web UI.
    const daemon = await cc!.daemonUrl(NODE);
    const metrics = await eventually(async () => {
      const t = await (await fetch(`${daemon}/metrics`)).text();
      return t.includes('bis_backup_backing_images_total{result="completed"} 1') ? t : undefined;
    }, 30_000, 'the completed backup counted in /metrics');
    expect(metrics).toMatch(/bis_backing_image_copy_state\{node="node-1",disk="[^"]+",backing_image="disk-img",state="ready"\} 1/);
    const ui = await fetch(`${daemon}/`, { headers: { accept: 'text/html,application/xhtml+xml' } }); // as a browser asks
    expect(ui.status).toBe(200);
    expect(await ui.text()).toContain('<title>Backing images</title>');
    const files = await walk(path.join(s3Dir, BUCKET));
    expect(files.some((f) => f.startsWith('backupstore/backing-images/backing-images/disk-img/backing-image.cfg'))).toBe(true);
    expect(files.some((f) => /^backupstore\/backing-images\/blocks\/[0-9a-f]{2}\/[0-9a-f]{2}\/[0-9a-f]{64}\.blk/.test(f))).toBe(true);

    await cc!.rest(NODE, 'DELETE', '/v1/backingimages/disk-img');
    await eventually(async () => ((await cc!.cp.request('GET', `/apis/longhorn.io/v1beta2/namespaces/${NS}/backingimages/disk-img`)).status === 404 ? true : undefined), 120_000, 'disk-img deleted', () => cc!.state('disk-img'));

    const restoreUrl = new URL(backup.actions!['backupBackingImageRestore']!);
    await cc!.rest(NODE, 'POST', `${restoreUrl.pathname}${restoreUrl.search}`, { secret: '', secretNamespace: '', dataEngine: 'v1' });
    const copies = await eventually(async () => {
      const c = await cc!.readyCopies('disk-img');
      return c.length >= 1 ? c : undefined;
    }, 180_000, 'the restored disk-img ready', () => cc!.state('disk-img'));
    const restored = await cc!.bi('disk-img');
    expect(restored.spec?.sourceType).toBe('restore');
    expect(restored.status?.checksum).toBe(checksum);
    for (const c of copies) expect(await sha512File(c.file)).toBe(checksum);
  }, 600_000);

  itWithBrowser('the Service address: the REST API and the web UI in Chromium through the chart\'s Service', async () => {
    const vip = await cc!.cluster.serviceAddress(NS, 'backing-image-system-backend');
    expect(vip).not.toBe(new URL(await cc!.daemonUrl(NODE)).hostname); // a cluster IP, not the pod's address
    const base = `http://${vip}:9500`;
    type Item = { name: string; diskFileStatusMap?: Record<string, { state: string }> };
    const listed = await eventually(async () => {
      const res = await fetch(`${base}/v1/backingimages`).catch(() => undefined);
      const items = res?.ok ? ((await res.json()) as { data?: Item[] }).data : undefined;
      return items?.find((i) => i.name === 'disk-img' && Object.values(i.diskFileStatusMap ?? {}).some((f) => f.state === 'ready'));
    }, 60_000, 'disk-img listed through the Service', () => cc!.state('disk-img'));
    expect(listed.name).toBe('disk-img');
    const browser = await launchBrowser();
    try {
      const page = await browser.context.newPage();
      page.setDefaultTimeout(60_000);
      await page.goto(`${base}/`);
      expect(await page.title()).toBe('Backing images');
      const row = page.locator('#images tr[data-name="disk-img"]');
      await row.waitFor();
      await row.locator('a').click();
      await page.locator('#disks [data-state=ready]').first().waitFor();
      expect(await page.locator('#disks [data-state=ready]').count()).toBeGreaterThanOrEqual(1);
    } finally {
      await browser.close();
    }
  }, 180_000);
});
