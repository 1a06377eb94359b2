import { backupTargetOperations } from '@bis/backupstore';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import S3rver from 's3rver';
import {
  BackingImageDataSourceKind,
  BackingImageKind,
  BackingImageManagerKind,
  BackupTargetKind,
  ControllerManager,
  backupTargetCredential,
  NodeKind,
  SettingKind,
  SettingName,
  type Logger,
} from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { eventually } from '@bis/datastore/testing';
import { KubeDataPlane, podSettingsFromStore } from './kube-data-plane.js';
import { KubeDatastore } from './kube-datastore.js';
import { KubeSecretStore } from './kube-secret-store.js';
import { NodeDiskReporter } from './node-disks.js';
import { ControlPlane, envtestAssets } from './testing/envtest.js';
import { applyObject, installChartIdentity, rbacPath, roleWithout, type Obj, type Rule } from './testing/chart-rbac.js';

/**
 * The controller-manager's controllers (the composition of `controller-manager daemon`: KubeDatastore, KubeDataPlane,
 * KubeSecretStore, NodeDiskReporter, ControllerManager) against a real kube-apiserver (envtest), with the identity the
 * chart gives them: the ServiceAccount bound only by the chart's rendered Role / ClusterRole, token from the
 * TokenRequest API. Nothing plays the kubelet, so pods stay Pending: the flow goes as far as pods created and statuses
 * written. Needs KUBEBUILDER_ASSETS; skipped otherwise.
 */
const assets = envtestAssets();
if (!assets.dir) console.warn(`controllers-flow.envtest.spec.ts skipped: ${assets.reason}`);
const describeEnv = assets.dir ? describe : describe.skip;

const NS = 'longhorn-system';
const NODE = 'node-1';
const IMAGE = 'registry.example/backing-image-manager:v1';
const URL = 'http://images.example/parrot.raw';

type Pod = { metadata: { name: string; ownerReferences?: { kind: string; name: string; uid: string }[]; deletionTimestamp?: string }; spec: { nodeName: string; serviceAccountName: string }; status: { phase: string } };

describeEnv('the controllers flow under the chart RBAC against a real API server (envtest)', () => {
  let cp: ControlPlane;
  let admin: KubeDatastore;
  let store: KubeDatastore;
  let dataPlane: KubeDataPlane;
  let disks: NodeDiskReporter;
  let controllers: ControllerManager;
  let dataDir = '';
  let rbac: Obj[] = [];
  let serviceAccount = '';
  let saToken = '';
  let s3: S3rver | undefined;
  const logLines: string[] = [];

  beforeAll(async () => {
    cp = await ControlPlane.start();
    const identity = await installChartIdentity(cp, NS);
    rbac = identity.rbac;
    serviceAccount = identity.serviceAccount;
    saToken = identity.token;
    // installChartIdentity installed every CRD of the chart, Longhorn's Replica among them (the controllers'
    // informers list replicas and wait for that list before they start).
    admin = new KubeDatastore({ kubeConfig: cp.kubeConfig(), defaultNamespace: NS });
    // `controller-manager daemon` writes this setting from its flag; here the admin does (the account may too).
    await admin.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: SettingName.DefaultBackingImageManagerImage, namespace: NS }, value: IMAGE });

    dataDir = await mkdtemp(path.join(os.tmpdir(), 'bis-flow-'));
    const kubeConfig = cp.kubeConfig(identity.token);
    const log: Logger = {
      info: (m) => logLines.push(`INFO ${m}`),
      warn: (m) => logLines.push(`WARN ${m}`),
      error: (m) => logLines.push(`ERROR ${m}`),
      debug: () => undefined,
    };
    // The daemon's composition (apps/controller-manager/src/daemon.ts), every piece with the account's token.
    store = new KubeDatastore({ kubeConfig, defaultNamespace: NS });
    dataPlane = new KubeDataPlane({ backupTarget: backupTargetOperations,
      kubeConfig,
      settings: { namespace: NS, serviceAccountName: identity.serviceAccount },
      settingsProvider: podSettingsFromStore(store, NS),
      managerImage: IMAGE,
      watchRetryMs: 50,
    });
    disks = new NodeDiskReporter({ store, namespace: NS, nodeID: NODE, defaultDataPath: dataDir, intervalMs: 500, log });
    controllers = new ControllerManager({
      store,
      dataPlane,
      nodeID: NODE,
      namespace: NS,
      log,
      secrets: new KubeSecretStore({ kubeConfig, namespace: NS }),
      resyncMs: 2000,
      workers: 2,
      timing: { managerRestartInitialMs: 200, managerRestartMaxMs: 1000, dataSourceRetryInitialMs: 300, dataSourceRetryMaxMs: 1000, waitRequeueMs: 500 },
    });
    await disks.start();
    await controllers.start();
  }, 180_000);

  afterAll(async () => {
    await controllers?.stop().catch(() => undefined);
    await disks?.stop().catch(() => undefined);
    dataPlane?.close();
    await store?.close();
    await admin?.close();
    await s3?.close();
    await cp?.stop();
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  }, 60_000);

  const pod = async (name: string): Promise<Pod | undefined> => {
    const res = await cp.request('GET', `/api/v1/namespaces/${NS}/pods/${name}`);
    return res.status === 200 ? (res.body as Pod) : undefined;
  };

  it('registers the node and its disk (NodeDiskReporter): Node record, longhorn-disk.cfg, disk status with empty reasons omitted', async () => {
    const node = await eventually(async () => {
      const n = await admin.get(NodeKind, NODE, NS).catch(() => undefined);
      const d = Object.values(n?.status?.diskStatus ?? {})[0];
      return d?.diskUUID && d.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ? n : undefined;
    }, 30_000, 'node-1 with a ready disk');
    const [diskName, spec] = Object.entries(node.spec?.disks ?? {})[0]!;
    expect(spec.path).toBe(dataDir);
    expect(node.status?.diskStatus?.[diskName]?.storageMaximum).toBeGreaterThan(0);
    // What the API server stored: no empty optional string (the 1.20 build with Go >= 1.16 would refuse it), and the
    // datastore reads those fields back as empty.
    const raw = (await cp.request('GET', `/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${NODE}`)).body as { status: { conditions: Record<string, unknown>[] } };
    const ready = raw.status.conditions.find((c) => c['type'] === 'Ready')!;
    expect(ready['status']).toBe('True');
    expect('reason' in ready).toBe(false);
    expect(node.status?.conditions?.find((c) => c.type === 'Ready')?.reason).toBe('');
  }, 60_000);

  it('a BackingImage gets its data source and manager objects, their pods (Pending, with the account), and statuses', async () => {
    await controllers.actions.create({ name: 'parrot', sourceType: 'download', parameters: { url: URL }, minNumberOfCopies: 1 });
    const bids = await eventually(async () => {
      const b = await admin.get(BackingImageDataSourceKind, 'parrot', NS).catch(() => undefined);
      return b?.spec?.diskUUID && b.status?.ownerID === NODE ? b : undefined;
    }, 30_000, 'the data source object, owned by node-1');
    expect(bids.spec?.sourceType).toBe('download');
    expect(bids.spec?.nodeID).toBe(NODE);

    const dsPod = await eventually(() => pod('backing-image-ds-parrot'), 30_000, 'the data-source pod');
    expect(dsPod.spec.nodeName).toBe(NODE);
    expect(dsPod.spec.serviceAccountName).toBe(serviceAccount);
    expect(dsPod.metadata.ownerReferences?.[0]).toMatchObject({ kind: 'BackingImageDataSource', name: 'parrot', uid: bids.metadata.uid });
    expect(dsPod.status.phase).toBe('Pending');

    const bim = await eventually(async () => {
      const { items } = await admin.list(BackingImageManagerKind, { namespace: NS });
      return items.find((m) => m.spec?.diskUUID === bids.spec?.diskUUID && m.status?.currentState);
    }, 30_000, 'the manager of the disk, with a state');
    expect(bim.spec?.image).toBe(IMAGE);
    const mPod = await eventually(() => pod(bim.metadata.name), 30_000, 'the manager pod');
    expect(mPod.spec.nodeName).toBe(NODE);
    expect(mPod.status.phase).toBe('Pending');
    expect(mPod.metadata.ownerReferences?.[0]).toMatchObject({ kind: 'BackingImageManager', name: bim.metadata.name });

    // Statuses: the BI has its UUID and a copy on the data source's disk that is not ready (no kubelet runs the pod);
    // the manager waits for its pod.
    const bi = await eventually(async () => {
      const b = await admin.get(BackingImageKind, 'parrot', NS);
      return b.status?.uuid && b.status.diskFileStatusMap?.[bids.spec!.diskUUID!] ? b : undefined;
    }, 30_000, 'the backing image status');
    expect(bi.status?.ownerID).toBe(NODE);
    expect(bi.status?.diskFileStatusMap?.[bids.spec!.diskUUID!]?.state).not.toBe('ready');
    const m = await admin.get(BackingImageManagerKind, bim.metadata.name, NS);
    expect(['starting', 'unknown']).toContain(m.status?.currentState);
    expect(m.status?.message).toBe('');
    expect(logLines.filter((l) => /forbidden|Invalid value: "null"/.test(l))).toEqual([]);
  }, 90_000);

  it('without create on pods in the Role, the flow fails with a clear 403 in the log and in the objects\' status', async () => {
    const role = rbac.find((o) => o.kind === 'Role') as Obj & { rules: Rule[] };
    const cut = roleWithout(role, 'pods', 'create');
    expect(cut.rules.some((r) => r.resources.includes('pods') && !r.verbs.includes('create'))).toBe(true);
    await applyObject(cp, cut, rbacPath(role, NS));
    const forbidden = /pods is forbidden: User "system:serviceaccount:longhorn-system:backing-image-system[a-z-]*" cannot create resource "pods" in API group "" in the namespace "longhorn-system"/;
    try {
      // The manager's pod goes away (force-deleted: no kubelet confirms a graceful delete); the controller must
      // create it again and cannot.
      const { items } = await admin.list(BackingImageManagerKind, { namespace: NS });
      const bim = items[0]!;
      const del = await cp.request('DELETE', `/api/v1/namespaces/${NS}/pods/${bim.metadata.name}`, { query: { gracePeriodSeconds: '0' } });
      expect(del.status).toBe(200);
      const failed = await eventually(async () => {
        const m = await admin.get(BackingImageManagerKind, bim.metadata.name, NS);
        return forbidden.test(m.status?.message ?? '') ? m : undefined;
      }, 30_000, 'the manager status names the 403');
      expect(failed.status?.message).toMatch(/^failed to start the backing image manager: create pod bim-[0-9a-f]+: pods is forbidden/);
      expect(await pod(bim.metadata.name)).toBeUndefined();

      // A new image's data source cannot get its pod either: its status says why.
      await controllers.actions.create({ name: 'denied', sourceType: 'download', parameters: { url: URL }, minNumberOfCopies: 1 });
      const bids = await eventually(async () => {
        const b = await admin.get(BackingImageDataSourceKind, 'denied', NS).catch(() => undefined);
        return b && forbidden.test(b.status?.message ?? '') ? b : undefined;
      }, 30_000, 'the data source status names the 403');
      expect(bids.status?.message).toMatch(/^failed to start the data source: .*pods is forbidden/);
      expect(await pod('backing-image-ds-denied')).toBeUndefined();

      expect(logLines.some((l) => l.startsWith('WARN') && l.includes(bim.metadata.name) && forbidden.test(l))).toBe(true);
    } finally {
      await applyObject(cp, role, rbacPath(role, NS));
    }
    // With the verb back, the manager's pod is created again and the message is cleared.
    const { items } = await admin.list(BackingImageManagerKind, { namespace: NS });
    await eventually(async () => ((await pod(items[0]!.metadata.name)) ? true : undefined), 30_000, 'the manager pod again');
    await eventually(async () => ((await admin.get(BackingImageManagerKind, items[0]!.metadata.name, NS)).status?.message === '' ? true : undefined), 30_000, 'message cleared');
  }, 120_000);

  it('S3 backup target: the credential Secret read under the chart RBAC, availability polled against s3rver (wrong key: 403; right key: available)', async () => {
    s3 = new S3rver({ port: 0, address: '127.0.0.1', silent: true, directory: path.join(dataDir, 's3'), configureBuckets: [{ name: 'lh-backups' }] });
    const endpoint = `http://127.0.0.1:${(await s3.run()).port}`;
    // s3rver knows one key pair (S3RVER / S3RVER) and refuses an unknown access key id with 403 InvalidAccessKeyId.
    const secret = (keyId: string, secretKey: string) => ({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 's3-secret', namespace: NS },
      stringData: { AWS_ACCESS_KEY_ID: keyId, AWS_SECRET_ACCESS_KEY: secretKey, AWS_ENDPOINTS: endpoint, unrelated: 'x' },
    });
    expect((await cp.request('POST', `/api/v1/namespaces/${NS}/secrets`, { body: secret('WRONGKEYID', 'wrong-secret-key-1') })).status).toBe(201);
    // The account reads it (get on secrets in the namespace); the controllers' credential is Longhorn's keys only.
    const sa = new KubeSecretStore({ kubeConfig: cp.kubeConfig(saToken), namespace: NS });
    expect(await backupTargetCredential(sa, { spec: { credentialSecret: 's3-secret' } })).toEqual({ AWS_ACCESS_KEY_ID: 'WRONGKEYID', AWS_SECRET_ACCESS_KEY: 'wrong-secret-key-1', AWS_ENDPOINTS: endpoint });
    await admin.create(BackupTargetKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackupTarget',
      metadata: { name: 'default', namespace: NS },
      spec: { backupTargetURL: 's3://lh-backups@us-east-1/', credentialSecret: 's3-secret', pollInterval: '1s' },
    });
    const unavailable = await eventually(async () => {
      const t = await admin.get(BackupTargetKind, 'default', NS);
      const msg = t.status?.conditions?.find((c) => c.type === 'Unavailable')?.message ?? '';
      return t.status?.available === false && /403/.test(msg) ? msg : undefined;
    }, 30_000, 'the target unavailable with the 403').catch(async (err: Error) => {
      const t = await admin.get(BackupTargetKind, 'default', NS);
      throw new Error(`${err.message}; target status ${JSON.stringify(t.status)}; log: ${logLines.filter((l) => /target|secret/i.test(l)).slice(-5).join(' | ')}`);
    });
    expect(unavailable).not.toContain('wrong-secret-key-1');
    expect(logLines.some((l) => l.includes('backup target default is not available') && l.includes('403'))).toBe(true);

    const cur = (await cp.request('GET', `/api/v1/namespaces/${NS}/secrets/s3-secret`)).body as { metadata: { resourceVersion: string } };
    const put = await cp.request('PUT', `/api/v1/namespaces/${NS}/secrets/s3-secret`, { body: { ...secret('S3RVER', 'S3RVER'), metadata: { ...secret('S3RVER', 'S3RVER').metadata, resourceVersion: cur.metadata.resourceVersion } } });
    expect(put.status).toBe(200);
    const ok = await eventually(async () => {
      const t = await admin.get(BackupTargetKind, 'default', NS);
      return t.status?.available === true ? t : undefined;
    }, 30_000, 'the target available');
    expect(ok.status?.conditions ?? []).toEqual([]);
    expect(ok.status?.ownerID).toBe(NODE);
  }, 90_000);
});
