import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { backupTargetOperations } from '@bis/backupstore';
import { defineKind, type KubeObject } from '@bis/datastore';
import { eventually } from '@bis/datastore/testing';
import { LONGHORN_API_VERSION, backingImageManagerName } from '@bis/crd-types';
import { DATA_SOURCE_CREDENTIAL_ENV, DATA_SOURCE_MALLOC_ENV, SecretKind } from '@bis/controllers';
import { KubeDataPlane } from './kube-data-plane.js';
import { ApiAccess, API_RESOURCE_USES } from './api-access.js';
import { KubeDatastore, kubeConfigFor } from './kube-datastore.js';
import { KubePodRuntime } from './pod-runtime.js';
import { KubeApiDouble } from './test-support/kube-api-double.js';

interface Pod extends KubeObject {
  spec: {
    nodeName?: string;
    restartPolicy?: string;
    serviceAccountName?: string;
    containers: { name: string; image: string; command: string[]; securityContext?: { privileged?: boolean }; env?: { name: string; valueFrom?: unknown }[]; ports?: { containerPort: number }[]; readinessProbe?: { tcpSocket?: { port: number }; initialDelaySeconds?: number; periodSeconds?: number; timeoutSeconds?: number; failureThreshold?: number }; volumeMounts?: { name: string; mountPath: string }[] }[];
    volumes?: { name: string; hostPath?: { path: string } }[];
    tolerations?: unknown[];
    priorityClassName?: string;
  };
  status?: { phase?: string; podIP?: string; containerStatuses?: { name: string; ready: boolean; state?: { terminated?: { exitCode: number; reason?: string } } }[] };
}
interface Bim extends KubeObject {
  spec: { image: string; nodeID: string; diskUUID: string; diskPath: string; backingImages: Record<string, string> };
}
const PodKind = defineKind<Pod>({ apiVersion: 'v1', kind: 'Pod', plural: 'pods', namespaced: true });
const BimKind = defineKind<Bim>({ apiVersion: LONGHORN_API_VERSION, kind: 'BackingImageManager', plural: 'backingimagemanagers', namespaced: true });
const BidsKind = defineKind<KubeObject & { spec: Record<string, unknown> }>({ apiVersion: LONGHORN_API_VERSION, kind: 'BackingImageDataSource', plural: 'backingimagedatasources', namespaced: true });
const NS = 'longhorn-system';
const IMAGE = 'registry.example/backing-image-manager:v1';
const DISK = '6f0c8f4e-1e2a-4b7c-9d41-3a5e2f7b8c90';

describe('KubePodRuntime against the API double', () => {
  let api: KubeApiDouble;
  let rt: KubePodRuntime;
  let ds: KubeDatastore;
  beforeEach(async () => {
    api = await KubeApiDouble.start({ kinds: [PodKind, BimKind, BidsKind, SecretKind] });
    const kc = kubeConfigFor(api.url, api.token);
    rt = new KubePodRuntime({ kubeConfig: kc, settings: { namespace: NS, serviceAccountName: 'bis-service-account', priorityClassName: 'bis-critical', tolerations: [{ key: 'a', operator: 'Exists' }, { key: 'a', operator: 'Exists' }] }, watchRetryMs: 50 });
    ds = new KubeDatastore({ kubeConfig: kc, defaultNamespace: NS });
  });
  afterEach(async () => {
    rt.stop();
    await ds.close();
    await api.stop();
  });

  async function createBim(): Promise<Bim & { metadata: { uid: string } }> {
    const name = backingImageManagerName(IMAGE, DISK);
    return ds.create(BimKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImageManager',
      metadata: { name, namespace: NS },
      spec: { image: IMAGE, nodeID: 'node-1', diskUUID: DISK, diskPath: '/var/lib/longhorn/', backingImages: {} },
    });
  }

  it("creates Longhorn's manager pod and maps pod phase and readiness to the workload phase", async () => {
    const bim = await createBim();
    const input = { name: bim.metadata.name, uid: bim.metadata.uid, ...bim.spec };
    const changes: string[] = [];
    rt.onWorkloadChange((kind, name) => changes.push(`${kind}/${name}`));
    expect((await rt.managerStatus(bim)).phase).toBe('missing');
    await rt.startManager(input);
    await rt.startManager(input); // AlreadyExists is not an error

    const pod = await api.store.get(PodKind, bim.metadata.name, NS);
    expect(pod.metadata.name).toMatch(/^bim-[0-9a-f]{56}$/);
    expect(pod.metadata.labels).toEqual({
      'longhorn.io/managed-by': 'longhorn-manager',
      'longhorn.io/component': 'backing-image-manager',
      'longhorn.io/disk-uuid': DISK,
      'longhorn.io/node': 'node-1',
    });
    expect(pod.metadata.ownerReferences).toEqual([{ apiVersion: 'longhorn.io/v1beta2', kind: 'BackingImageManager', name: bim.metadata.name, uid: bim.metadata.uid, controller: true, blockOwnerDeletion: true }]);
    expect(pod.metadata.annotations?.['longhorn.io/last-applied-tolerations']).toBe('[{"key":"a","operator":"Exists"}]');
    expect(pod.spec.nodeName).toBe('node-1');
    expect(pod.spec.restartPolicy).toBe('Never');
    expect(pod.spec.serviceAccountName).toBe('bis-service-account');
    expect(pod.spec.priorityClassName).toBe('bis-critical');
    const c = pod.spec.containers[0];
    expect(c.name).toBe('backing-image-manager');
    expect(c.image).toBe(IMAGE);
    expect(c.command).toEqual(['backing-image-manager', '--debug', 'daemon', '--listen', ':8000', '--sync-listen', ':8001']);
    expect(c.securityContext?.privileged).toBe(true);
    expect(c.env).toEqual([{ name: 'POD_IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } }]);
    expect(c.ports?.map((p) => p.containerPort)).toEqual([8000, 8001]);
    expect(c.readinessProbe).toEqual({ tcpSocket: { port: 8000 }, initialDelaySeconds: 3, periodSeconds: 5, timeoutSeconds: 4, failureThreshold: 3 });
    expect(c.volumeMounts).toEqual([{ name: 'disk-path', mountPath: '/data/' }]);
    expect(pod.spec.volumes).toEqual([{ name: 'disk-path', hostPath: { path: '/var/lib/longhorn/' } }]);

    expect((await rt.managerStatus(bim)).phase).toBe('pending');
    // The kubelet's part: the pod runs but is not ready yet, then becomes ready.
    const running = await api.store.updateStatus(PodKind, { ...pod, status: { phase: 'Running', podIP: '10.0.0.7', containerStatuses: [{ name: 'backing-image-manager', ready: false }] } });
    expect((await rt.managerStatus(bim)).phase).toBe('not-ready');
    await api.store.updateStatus(PodKind, { ...running, status: { phase: 'Running', podIP: '10.0.0.7', containerStatuses: [{ name: 'backing-image-manager', ready: true }] } });
    expect(await rt.managerStatus(bim)).toEqual({ phase: 'ready', nodeID: 'node-1', diskUUID: DISK, ip: '10.0.0.7', address: '10.0.0.7:8000', syncAddress: '10.0.0.7:8001' });
    await eventually(() => changes.length >= 3, 5000, 'pod change notifications');
    expect(new Set(changes)).toEqual(new Set([`manager/${bim.metadata.name}`]));

    // Deleting the BIM garbage-collects its pod through the ownerReference.
    await ds.delete(BimKind, bim.metadata.name, NS);
    await eventually(async () => (await rt.managerStatus(bim)).phase === 'missing', 5000, 'pod garbage collection');
  });

  it('reports a pod on the wrong node as failed', async () => {
    const bim = await createBim();
    await rt.startManager({ name: bim.metadata.name, uid: bim.metadata.uid, ...bim.spec });
    const st = await rt.managerStatus({ ...bim, spec: { ...bim.spec, nodeID: 'node-2' } });
    expect(st.phase).toBe('failed');
    expect(st.message).toContain('runs on node node-1, expected node-2');
    await rt.deleteManager(bim.metadata.name);
    await rt.deleteManager(bim.metadata.name); // NotFound is not an error
    expect((await rt.managerStatus(bim)).phase).toBe('missing');
  });

  it("creates the data-source pod with Longhorn's command line and reports a failed pod with its log", async () => {
    // The owner must exist, or the garbage collector removes the pod (as Kubernetes does).
    const bids = await ds.create(BidsKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackingImageDataSource', metadata: { name: 'bi-test', namespace: NS }, spec: {} });
    const ds0 = { name: 'bi-test', uid: bids.metadata.uid, image: IMAGE, nodeID: 'node-1', diskUUID: DISK, diskPath: '/var/lib/longhorn/', uuid: 'a1b2c3d4', sourceType: 'download', parameters: { url: 'https://example.com/parrot.raw' }, checksum: 'ab'.repeat(64), credentials: {} };
    await rt.startDataSource(ds0);
    const pod = await api.store.get(PodKind, 'backing-image-ds-bi-test', NS);
    expect(pod.metadata.labels?.['longhorn.io/component']).toBe('backing-image-data-source');
    expect(pod.metadata.labels?.['longhorn.io/backing-image-data-source']).toBe('bi-test');
    expect(pod.spec.containers[0].name).toBe('backing-image-data-source');
    expect(pod.spec.containers[0].command).toEqual([
      'backing-image-data-source', '--debug', '--listen', ':8000', '--sync-listen', ':8001',
      '--name', 'bi-test', '--uuid', 'a1b2c3d4', '--source-type', 'download',
      '--parameters', 'url=https://example.com/parrot.raw', '--checksum', 'ab'.repeat(64),
    ]);
    expect(pod.spec.volumes?.map((v) => [v.name, v.hostPath?.path])).toEqual([['disk-path', '/var/lib/longhorn/'], ['host-dev', '/dev'], ['host-proc', '/proc']]);
    api.podLogs.set(`${NS}/backing-image-ds-bi-test`, 'download failed: 404 Not Found');
    await api.store.updateStatus(PodKind, { ...pod, status: { phase: 'Failed', containerStatuses: [{ name: 'backing-image-data-source', ready: false, state: { terminated: { exitCode: 1 } } }] } });
    const st = await rt.dataSourceStatus({ metadata: { name: 'bi-test' }, spec: { nodeID: 'node-1', diskUUID: DISK } });
    expect(st.phase).toBe('failed');
    expect(st.message).toBe('the pod dedicated to prepare the first backing image file failed: download failed: 404 Not Found');
  });

  it('passes the scrub settings to the manager pod as daemon flags (as the standalone data plane does)', async () => {
    const bim = await createBim();
    const dp = new KubeDataPlane({ backupTarget: backupTargetOperations, kubeConfig: kubeConfigFor(api.url, api.token), settings: { namespace: NS, serviceAccountName: 'sa' }, managerImage: IMAGE });
    try {
      await dp.startManager(bim as unknown as Parameters<KubeDataPlane['startManager']>[0], { scrubIntervalSeconds: 86400, scrubBandwidth: 52428800 });
    } finally {
      dp.close();
    }
    const pod = await api.store.get(PodKind, bim.metadata.name, NS);
    expect(pod.spec.containers[0].command).toEqual([
      'backing-image-manager', '--debug', 'daemon', '--listen', ':8000', '--sync-listen', ':8001', '--scrub-interval', '86400', '--scrub-bandwidth', '52428800',
    ]);
  });

  it("gives the data source its credential through a Secret of its own (secretKeyRef): the pod never holds it", async () => {
    const bids = await ds.create(BidsKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackingImageDataSource', metadata: { name: 'bi-cred', namespace: NS }, spec: {} });
    const credentials = { AWS_ACCESS_KEY_ID: 'AKIDEXAMPLE', AWS_SECRET_ACCESS_KEY: 'very-secret-key-123' };
    const input = { name: 'bi-cred', uid: bids.metadata.uid, image: IMAGE, nodeID: 'node-1', diskUUID: DISK, diskPath: '/var/lib/longhorn/', uuid: 'u1', sourceType: 'restore', parameters: { 'backup-url': 's3://b@us-east-1/?backingImage=x' }, checksum: '', credentials };
    await rt.startDataSource(input);
    const pod = await api.store.get(PodKind, 'backing-image-ds-bi-cred', NS);
    expect(JSON.stringify(pod)).not.toContain('very-secret-key-123');
    expect(JSON.stringify(pod)).not.toContain('AKIDEXAMPLE');
    expect(pod.spec.containers[0].env).toContainEqual({ name: DATA_SOURCE_CREDENTIAL_ENV, valueFrom: { secretKeyRef: { name: 'backing-image-ds-bi-cred-credential', key: 'credential' } } });
    // The data plane's malloc settings, as in standalone.
    for (const [name, value] of Object.entries(DATA_SOURCE_MALLOC_ENV)) expect(pod.spec.containers[0].env).toContainEqual({ name, value });
    const decode = async () => {
      const secret = (await api.store.get(SecretKind, 'backing-image-ds-bi-cred-credential', NS)) as unknown as { data: Record<string, string>; metadata: { ownerReferences?: unknown[]; labels?: Record<string, string> } };
      return { secret, credential: JSON.parse(Buffer.from(secret.data['credential']!, 'base64').toString()) as Record<string, string> };
    };
    const first = await decode();
    expect(first.credential).toEqual(credentials);
    expect(first.secret.metadata.ownerReferences).toEqual([{ apiVersion: LONGHORN_API_VERSION, kind: 'BackingImageDataSource', name: 'bi-cred', uid: bids.metadata.uid }]);
    expect(first.secret.metadata.labels?.['longhorn.io/backing-image-data-source']).toBe('bi-cred');

    // A retry after the pod is gone, with a rotated key: the Secret is replaced, not left stale.
    await rt.deleteDataSource('bi-cred');
    await expect(api.store.get(SecretKind, 'backing-image-ds-bi-cred-credential', NS)).rejects.toThrow();
    await rt.startDataSource(input);
    await api.store.delete(PodKind, 'backing-image-ds-bi-cred', NS);
    await rt.startDataSource({ ...input, credentials: { ...credentials, AWS_SECRET_ACCESS_KEY: 'rotated-key-456' } });
    expect((await decode()).credential.AWS_SECRET_ACCESS_KEY).toBe('rotated-key-456');

    // Deleting the data source removes the pod and the Secret (a second delete finds nothing and is fine).
    await rt.deleteDataSource('bi-cred');
    await rt.deleteDataSource('bi-cred');
    await expect(api.store.get(SecretKind, 'backing-image-ds-bi-cred-credential', NS)).rejects.toThrow();
    const access = new ApiAccess(API_RESOURCE_USES);
    expect(api.calls.filter((c) => !access.allows(c.group, c.resource, c.verb))).toEqual([]);
    const used = new Set(api.calls.map((c) => `${c.verb} ${c.resource}`));
    for (const v of ['create secrets', 'update secrets', 'delete secrets']) expect(used).toContain(v);

    // Without a credential no Secret is written.
    await rt.startDataSource({ ...input, credentials: {} });
    await expect(api.store.get(SecretKind, 'backing-image-ds-bi-cred-credential', NS)).rejects.toThrow();
    expect((await api.store.get(PodKind, 'backing-image-ds-bi-cred', NS)).spec.containers[0].env).toEqual([
      { name: 'POD_IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
      ...Object.entries(DATA_SOURCE_MALLOC_ENV).map(([name, value]) => ({ name, value })),
    ]);
  });

  it('makes only API calls that the RBAC table (and so the chart) grants', async () => {
    const bim = await createBim();
    await rt.startManager({ name: bim.metadata.name, uid: bim.metadata.uid, ...bim.spec });
    await rt.managerStatus(bim);
    await rt.containerLog(bim.metadata.name, 'backing-image-manager');
    rt.onWorkloadChange(() => undefined);
    await ds.update(BimKind, { ...bim, spec: { ...bim.spec, backingImages: { x: 'y' } } });
    await ds.updateStatus(BimKind, { ...bim, metadata: { ...bim.metadata, resourceVersion: '' } });
    await ds.list(BimKind, { namespace: NS });
    await eventually(() => api.calls.some((c) => c.verb === 'watch'), 5000, 'pod watch');
    await rt.deleteManager(bim.metadata.name);
    await ds.delete(BimKind, bim.metadata.name, NS);
    const access = new ApiAccess(API_RESOURCE_USES);
    const denied = api.calls.filter((c) => !access.allows(c.group, c.resource, c.verb));
    expect(denied).toEqual([]);
    const used = new Set(api.calls.map((c) => `${c.verb} ${c.resource}`));
    for (const v of ['create pods', 'get pods', 'delete pods', 'watch pods', 'get pods/log', 'create backingimagemanagers', 'update backingimagemanagers', 'update backingimagemanagers/status', 'list backingimagemanagers', 'delete backingimagemanagers']) {
      expect(used).toContain(v);
    }
  });
});
