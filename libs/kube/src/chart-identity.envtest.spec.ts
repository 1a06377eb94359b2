import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { LonghornDetectedError, assertNoLonghorn, findLonghornManagers } from './longhorn-detect.js';
import { KubePodRuntime } from './pod-runtime.js';
import { ControlPlane, envtestAssets } from './testing/envtest.js';
import { installChartIdentity } from './testing/chart-rbac.js';
import { LONGHORN_API_VERSION } from '@bis/crd-types';

/**
 * What the chart's RBAC must allow for the Longhorn check and the data sources' credential Secrets, against a real
 * kube-apiserver with the ServiceAccount token the chart's rendered Role / ClusterRole alone grant (never admin).
 * Needs KUBEBUILDER_ASSETS; skipped otherwise.
 */
const assets = envtestAssets();
if (!assets.dir) console.warn(`chart-identity.envtest.spec.ts skipped: ${assets.reason}`);
const describeEnv = assets.dir ? describe : describe.skip;

const NS = 'bis-system';

describeEnv("the chart's identity on a real API server: Longhorn check and credential Secrets", () => {
  let cp: ControlPlane;
  let token = '';

  beforeAll(async () => {
    cp = await ControlPlane.start();
    token = (await installChartIdentity(cp, NS)).token;
  }, 180_000);
  afterAll(async () => {
    await cp?.stop();
  }, 60_000);

  it("finds Longhorn's manager DaemonSet in another namespace with the chart's ClusterRole, and refuses", async () => {
    const kc = cp.kubeConfig(token);
    expect(await findLonghornManagers(kc)).toEqual([]);
    expect((await cp.request('POST', '/api/v1/namespaces', { body: { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'longhorn-system' } } })).status).toBe(201);
    const ds = await cp.request('POST', '/apis/apps/v1/namespaces/longhorn-system/daemonsets', {
      body: {
        apiVersion: 'apps/v1',
        kind: 'DaemonSet',
        metadata: { name: 'longhorn-manager', namespace: 'longhorn-system', labels: { app: 'longhorn-manager' } },
        spec: {
          selector: { matchLabels: { app: 'longhorn-manager' } },
          template: { metadata: { labels: { app: 'longhorn-manager' } }, spec: { containers: [{ name: 'longhorn-manager', image: 'longhornio/longhorn-manager:v1.9.0' }] } },
        },
      },
    });
    expect(ds.status).toBe(201);
    expect(await findLonghornManagers(kc)).toEqual([{ namespace: 'longhorn-system', name: 'longhorn-manager' }]);
    await expect(assertNoLonghorn(kc)).rejects.toBeInstanceOf(LonghornDetectedError);
    // The grant is list only: the account can neither read one by name nor change it.
    expect((await cp.request('GET', '/apis/apps/v1/namespaces/longhorn-system/daemonsets/longhorn-manager', { token })).status).toBe(403);
    expect((await cp.request('DELETE', '/apis/apps/v1/namespaces/longhorn-system/daemonsets/longhorn-manager', { token })).status).toBe(403);
  });

  it("writes, replaces and deletes a data source's credential Secret with the chart's Role; the pod refers to it", async () => {
    // The owner the Secret and the pod refer to (created as admin, as the controllers would).
    const created = await cp.request('POST', `/apis/longhorn.io/v1beta2/namespaces/${NS}/backingimagedatasources`, {
      body: { apiVersion: LONGHORN_API_VERSION, kind: 'BackingImageDataSource', metadata: { name: 'bi-restore', namespace: NS }, spec: { nodeID: 'node-1', diskUUID: 'd1', diskPath: '/var/lib/longhorn/', sourceType: 'restore', uuid: 'u1' } },
    });
    expect(created.status).toBe(201);
    const uid = (created.body as { metadata: { uid: string } }).metadata.uid;
    const rt = new KubePodRuntime({ kubeConfig: cp.kubeConfig(token), settings: { namespace: NS, serviceAccountName: 'backing-image-system-service-account' } });
    try {
      const input = { name: 'bi-restore', uid, image: 'bim:1', nodeID: 'node-1', diskUUID: 'd1', diskPath: '/var/lib/longhorn/', uuid: 'u1', sourceType: 'restore', parameters: { 'backup-url': 's3://b@us-east-1/?backingImage=x' }, checksum: '', credentials: { AWS_ACCESS_KEY_ID: 'AKID', AWS_SECRET_ACCESS_KEY: 'first-secret' } };
      await rt.startDataSource(input);
      const pod = await cp.request('GET', `/api/v1/namespaces/${NS}/pods/backing-image-ds-bi-restore`);
      expect(pod.status).toBe(200);
      expect(JSON.stringify(pod.body)).not.toContain('first-secret');
      const secret = async () => {
        const r = await cp.request('GET', `/api/v1/namespaces/${NS}/secrets/backing-image-ds-bi-restore-credential`);
        return r.status === 200 ? (JSON.parse(Buffer.from((r.body as { data: { credential: string } }).data.credential, 'base64').toString()) as Record<string, string>) : r.status;
      };
      expect(await secret()).toEqual(input.credentials);
      // A retry (pod gone) with a rotated key replaces the Secret (update), then delete removes pod and Secret.
      expect((await cp.request('DELETE', `/api/v1/namespaces/${NS}/pods/backing-image-ds-bi-restore`, { query: { gracePeriodSeconds: '0' } })).status).toBe(200);
      await rt.startDataSource({ ...input, credentials: { ...input.credentials, AWS_SECRET_ACCESS_KEY: 'rotated' } });
      expect(await secret()).toEqual({ ...input.credentials, AWS_SECRET_ACCESS_KEY: 'rotated' });
      await rt.deleteDataSource('bi-restore');
      expect(await secret()).toBe(404);
    } finally {
      rt.stop();
    }
  });
});
