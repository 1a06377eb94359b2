import { backupTargetOperations } from '@bis/backupstore';
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { parse, parseAllDocuments } from 'yaml';
import { BackingImageKind, BackingImageManagerKind, SettingKind, SettingName, backingImageManagerName } from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { eventually } from '@bis/datastore/testing';
import { KubeDataPlane, podSettingsFromStore } from './kube-data-plane.js';
import { KubeDatastore } from './kube-datastore.js';
import { KubeEventRecorder } from './kube-events.js';
import { chartCrds, renderChart } from './chart/render-chart.js';
import { ControlPlane, envtestAssets, installCrds } from './testing/envtest.js';

/**
 * The controllers with the identity the chart gives them, against a real kube-apiserver (envtest): the
 * ServiceAccount bound only by the chart's rendered Role / ClusterRole (token from the TokenRequest API), never admin.
 * Nothing plays the kubelet: pods stay Pending. Needs KUBEBUILDER_ASSETS; skipped otherwise.
 *
 * The whole controllers flow with this identity is controllers-flow.envtest.spec.ts.
 */
const assets = envtestAssets();
if (!assets.dir) console.warn(`rbac.envtest.spec.ts skipped: ${assets.reason}`);
const describeEnv = assets.dir ? describe : describe.skip;

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const chartDir = path.join(repoRoot, 'charts/backing-image-system');
const NS = 'longhorn-system';
const NODE = 'node-1';
const IMAGE = 'registry.example/backing-image-manager:v1';
type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string }; [k: string]: unknown };
type Rule = { apiGroups: string[]; resources: string[]; verbs: string[] };

describeEnv('controllers with the chart RBAC against a real API server (envtest)', () => {
  let cp: ControlPlane;
  let admin: KubeDatastore;
  let saStore: KubeDatastore;
  let dataPlane: KubeDataPlane;
  let saToken = '';
  const rbac: Obj[] = [];

  const apply = async (o: Obj, p: string): Promise<void> => {
    const res = await cp.request('PATCH', p, { body: o, contentType: 'application/apply-patch+yaml', query: { fieldManager: 'rbac-test', force: 'true' } });
    if (res.status >= 300) throw new Error(`${o.kind} ${o.metadata.name}: HTTP ${res.status} ${JSON.stringify(res.body)}`);
  };
  const rbacPath = (o: Obj): string => {
    const plural = { ServiceAccount: 'serviceaccounts', Role: 'roles', RoleBinding: 'rolebindings', ClusterRole: 'clusterroles', ClusterRoleBinding: 'clusterrolebindings' }[o.kind] as string;
    if (o.kind === 'ServiceAccount') return `/api/v1/namespaces/${NS}/serviceaccounts/${o.metadata.name}`;
    const base = '/apis/rbac.authorization.k8s.io/v1';
    return o.kind.startsWith('Cluster') ? `${base}/${plural}/${o.metadata.name}` : `${base}/namespaces/${NS}/${plural}/${o.metadata.name}`;
  };

  beforeAll(async () => {
    cp = await ControlPlane.start();
    await installCrds(cp, (await chartCrds(chartDir)) as Obj[]);
    expect((await cp.request('POST', '/api/v1/namespaces', { body: { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS } } })).status).toBe(201);
    // The chart's RBAC, rendered with the repository's renderer, applied as admin: nothing else grants the account.
    for (const text of (await renderChart(chartDir, {}, { name: 'backing-image-system', namespace: NS })).values()) {
      for (const d of parseAllDocuments(text)) {
        const o = d.toJS() as Obj | null;
        if (o && ['ServiceAccount', 'Role', 'RoleBinding', 'ClusterRole', 'ClusterRoleBinding'].includes(o.kind)) rbac.push(o);
      }
    }
    expect(rbac.map((o) => o.kind).sort()).toEqual(['ClusterRole', 'ClusterRoleBinding', 'Role', 'RoleBinding', 'ServiceAccount']);
    for (const o of rbac) await apply(o, rbacPath(o));
    const sa = rbac.find((o) => o.kind === 'ServiceAccount') as Obj;
    const tr = await cp.request('POST', `/api/v1/namespaces/${NS}/serviceaccounts/${sa.metadata.name}/token`, {
      body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 3600 } },
    });
    expect(tr.status).toBe(201);
    const token = (tr.body as { status: { token: string } }).status.token;
    const kc = cp.kubeConfig(token);
    admin = new KubeDatastore({ kubeConfig: cp.kubeConfig(), defaultNamespace: NS });
    await admin.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: SettingName.DefaultBackingImageManagerImage, namespace: NS }, value: IMAGE });

    saToken = token;
    saStore = new KubeDatastore({ kubeConfig: kc, defaultNamespace: NS });
    dataPlane = new KubeDataPlane({ backupTarget: backupTargetOperations,
      kubeConfig: kc,
      settings: { namespace: NS, serviceAccountName: sa.metadata.name },
      settingsProvider: podSettingsFromStore(saStore, NS),
      managerImage: IMAGE,
      watchRetryMs: 50,
    });
  }, 180_000);

  afterAll(async () => {
    dataPlane?.close();
    await saStore?.close();
    await admin?.close();
    await cp?.stop();
  }, 60_000);

  const pod = (name: string): Promise<{ status: number; body: unknown }> => cp.request('GET', `/api/v1/namespaces/${NS}/pods/${name}`);

  const createBim = (image: string) =>
    admin.create(BackingImageManagerKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImageManager',
      metadata: { name: backingImageManagerName(image, 'disk-1'), namespace: NS, labels: { 'longhorn.io/node': NODE, 'longhorn.io/disk-uuid': 'disk-1' } },
      spec: { image, nodeID: NODE, diskUUID: 'disk-1', diskPath: '/var/lib/longhorn/', backingImages: {} },
    });

  it('the service account gets what the chart grants and nothing else', async () => {
    const can = async (p: string): Promise<number> => (await cp.request('GET', p, { token: saToken })).status;
    expect(await can(`/apis/longhorn.io/v1beta2/namespaces/${NS}/backingimages`)).toBe(200);
    expect(await can(`/api/v1/namespaces/${NS}/pods`)).toBe(200);
    expect(await can('/api/v1/nodes')).toBe(200); // ClusterRole: the node health monitor
    expect(await can(`/api/v1/namespaces/${NS}/secrets/any`)).toBe(404); // get is granted (backup credentials)
    expect(await can(`/api/v1/namespaces/${NS}/secrets`)).toBe(403); // list is not
    expect(await can('/api/v1/namespaces/kube-system/pods')).toBe(403); // other namespaces are not
    expect(await can(`/api/v1/namespaces/${NS}/configmaps`)).toBe(403);
    // The datastore with that identity reads and writes the Longhorn kinds.
    await admin.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: 'probe', namespace: NS }, value: 'x' });
    const got = await saStore.get(SettingKind, 'probe', NS);
    await saStore.update(SettingKind, { ...got, value: 'y' });
    expect((await admin.get(SettingKind, 'probe', NS)).value).toBe('y');
  });

  it('creates a manager pod with that identity; it stays Pending (no scheduler, no kubelet)', async () => {
    const bim = await createBim(IMAGE);
    await dataPlane.startManager(bim);
    const p = (await pod(bim.metadata.name)).body as { spec: { nodeName: string; serviceAccountName: string }; status: { phase: string }; metadata: { ownerReferences: { uid: string }[] } };
    expect(p.spec.nodeName).toBe(NODE);
    expect(p.metadata.ownerReferences[0].uid).toBe(bim.metadata.uid);
    expect(p.status.phase).toBe('Pending');
    expect((await dataPlane.managerStatus(bim)).phase).toBe('pending');
    await dataPlane.deleteManager(bim.metadata.name);
    // A pod bound to a node is deleted gracefully: it keeps a deletionTimestamp until its kubelet confirms (none here).
    const deleting = (await pod(bim.metadata.name)).body as { metadata: { deletionTimestamp?: string } };
    expect(deleting.metadata.deletionTimestamp).toBeTruthy();
    expect((await dataPlane.managerStatus(bim)).phase).toBe('deleting');
  }, 60_000);

  it('without the create verb on pods in the Role, starting a manager fails with a clear 403', async () => {
    const role = rbac.find((o) => o.kind === 'Role') as Obj & { rules: Rule[] };
    const cut = { ...role, rules: role.rules.map((r) => (r.resources.includes('pods') ? { ...r, verbs: r.verbs.filter((v) => v !== 'create') } : r)) };
    expect(cut.rules.some((r) => r.resources.includes('pods') && !r.verbs.includes('create'))).toBe(true);
    await apply(cut, rbacPath(role));
    try {
      const bim = await createBim('registry.example/backing-image-manager:v2');
      const err = await eventually(async () => {
        try {
          await dataPlane.startManager(bim);
          await dataPlane.deleteManager(bim.metadata.name); // the authorizer had not seen the new Role yet
          return undefined;
        } catch (e) {
          return e as Error;
        }
      }, 20_000, '403 on pod creation');
      expect(err.message).toMatch(/^create pod bim-[0-9a-f]+: pods is forbidden: User "system:serviceaccount:longhorn-system:[a-z-]+" cannot create resource "pods"/);
      expect((await pod(bim.metadata.name)).status).toBe(404);
    } finally {
      await apply(role, rbacPath(role));
    }
  }, 60_000);

  it('records events as core/v1 Events on the involved object with the chart RBAC: created, repeats patched, listed', async () => {
    const bi = await admin.create(BackingImageKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImage',
      metadata: { name: 'evimg', namespace: NS },
      spec: { sourceType: 'download', sourceParameters: { url: 'https://example.com/evimg.raw' }, minNumberOfCopies: 1 },
    });
    const warnings: string[] = [];
    const rec = new KubeEventRecorder({ kubeConfig: cp.kubeConfig(saToken), namespace: NS, host: NODE, log: (l, type) => type === 'Warning' && warnings.push(l) });
    const failed = 'Copy of backing image evimg on disk disk-1 on node node-1 failed: disk-1: no space left on device (ENOSPC)';
    rec.record('longhorn-backing-image-manager-controller', bi, 'Warning', 'Failed', failed);
    rec.record('longhorn-backing-image-manager-controller', bi, 'Warning', 'Failed', failed);
    rec.record('longhorn-backing-image-controller', bi, 'Normal', 'Ready', 'Copy of backing image evimg on disk disk-2 on node node-1 is ready');
    await rec.flush();
    expect(warnings.filter((w) => w.includes('not written'))).toEqual([]);
    // What `kubectl describe lhbi evimg` asks the API server for: the events of that object (by kind, name and uid).
    const res = await cp.request('GET', `/api/v1/namespaces/${NS}/events`, {
      query: { fieldSelector: `involvedObject.kind=BackingImage,involvedObject.name=evimg,involvedObject.uid=${bi.metadata.uid}` },
    });
    expect(res.status).toBe(200);
    type CoreEvent = { type: string; reason: string; message: string; count: number; source: { component: string; host?: string }; involvedObject: { kind: string; name: string; namespace: string; uid: string; apiVersion: string } };
    const items = (res.body as { items: CoreEvent[] }).items;
    expect(items).toHaveLength(2);
    const f = items.find((e) => e.reason === 'Failed')!;
    expect(f).toMatchObject({ type: 'Warning', message: failed, count: 2, source: { component: 'longhorn-backing-image-manager-controller', host: NODE } });
    expect(f.involvedObject).toMatchObject({ kind: 'BackingImage', name: 'evimg', namespace: NS, uid: bi.metadata.uid, apiVersion: LONGHORN_API_VERSION });
    expect(items.find((e) => e.reason === 'Ready')).toMatchObject({ type: 'Normal', count: 1 });
    // The REST API's /v1/events reads them back through the same identity (list is granted).
    const listed = await rec.list({ kind: 'BackingImage', name: 'evimg' });
    expect(listed.map((e) => [e.type, e.reason, e.count])).toEqual(expect.arrayContaining([['Warning', 'Failed', 2], ['Normal', 'Ready', 1]]));
    expect(await rec.list({ kind: 'BackingImage', name: 'other' })).toEqual([]);
  }, 60_000);
});
