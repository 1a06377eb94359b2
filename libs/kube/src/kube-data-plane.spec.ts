import { backupTargetOperations } from '@bis/backupstore';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import {
  BackingImageKind,
  BackingImageManagerKind,
  ControllerManager,
  NodeKind,
  SettingKind,
  SettingName,
  backingImageManagerName,
  type Logger,
} from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { eventually } from '@bis/datastore/testing';
import { KubeDataPlane, parseNodeSelector, parseTaintToleration, podSettingsFromStore } from './kube-data-plane.js';
import { KubeDatastore, kubeConfigFor } from './kube-datastore.js';
import { NodeDiskReporter } from './node-disks.js';
import { storageIPFromPod, workloadStatusFromPod } from './pod-runtime.js';
import { startManagerOnDisk } from './test-support/manager-on-disk.js';
import { CONTROLLER_KINDS, KubeApiDouble, TestPodKind } from './testing/index.js';

const NS = 'longhorn-system';
const IMAGE = 'registry.example/backing-image-manager:v1';
const TIMING = { managerRestartInitialMs: 50, managerRestartMaxMs: 500, waitRequeueMs: 100, rateLimiter: { baseDelayMs: 5, maxDelayMs: 500 } };
const quiet: Logger = { info() {}, warn() {}, error() {}, debug() {} };

interface Instance {
  nodeID: string;
  store: KubeDatastore;
  dataPlane: KubeDataPlane;
  cm: ControllerManager;
  disks: NodeDiskReporter;
  dir: string;
}

async function startInstance(api: KubeApiDouble, nodeID: string, ports?: { api: number; sync: number }): Promise<Instance> {
  const kc = kubeConfigFor(api.url, api.token);
  const store = new KubeDatastore({ kubeConfig: kc, defaultNamespace: NS });
  const dir = await mkdtemp(path.join(os.tmpdir(), `kube-dp-${nodeID}-`));
  const disks = new NodeDiskReporter({ store, namespace: NS, nodeID, defaultDataPath: dir, intervalMs: 60_000 });
  await disks.start();
  const dataPlane = new KubeDataPlane({ backupTarget: backupTargetOperations,
    kubeConfig: kc,
    settings: { namespace: NS, serviceAccountName: 'backing-image-system' },
    settingsProvider: podSettingsFromStore(store, NS),
    managerImage: IMAGE,
    watchRetryMs: 50,
    ports,
  });
  const cm = new ControllerManager({ store, dataPlane, nodeID, namespace: NS, workers: 2, resyncMs: 500, timing: TIMING, log: quiet });
  await cm.start();
  return { nodeID, store, dataPlane, cm, disks, dir };
}

async function stopInstance(i: Instance): Promise<void> {
  await i.cm.stop();
  await i.disks.stop();
  i.dataPlane.close();
  await i.store.close();
  await rm(i.dir, { recursive: true, force: true });
}

async function diskUUIDOf(store: KubeDatastore, nodeID: string): Promise<{ uuid: string; path: string }> {
  const node = await store.get(NodeKind, nodeID, NS);
  const [name, st] = Object.entries(node.status?.diskStatus ?? {})[0]!;
  return { uuid: st.diskUUID ?? '', path: node.spec?.disks?.[name]?.path ?? '' };
}

async function createBim(store: KubeDatastore, nodeID: string) {
  const disk = await diskUUIDOf(store, nodeID);
  return store.create(BackingImageManagerKind, {
    apiVersion: LONGHORN_API_VERSION,
    kind: 'BackingImageManager',
    metadata: { name: backingImageManagerName(IMAGE, disk.uuid), namespace: NS, labels: { 'longhorn.io/node': nodeID, 'longhorn.io/disk-uuid': disk.uuid } },
    spec: { image: IMAGE, nodeID, diskUUID: disk.uuid, diskPath: disk.path, backingImages: {} },
  });
}

async function setPodStatus(api: KubeApiDouble, name: string, status: NonNullable<import('./testing/index.js').TestPod['status']>): Promise<void> {
  for (;;) {
    const pod = await api.store.get(TestPodKind, name, NS);
    try {
      await api.store.updateStatus(TestPodKind, { ...pod, status });
      return;
    } catch (err) {
      if ((err as { reason?: string }).reason !== 'Conflict') throw err;
    }
  }
}

describe('pod evaluation helpers', () => {
  it('takes the storage IP from the Multus network-status of lhnet1 and falls back to the pod IP', () => {
    const pod = {
      metadata: { name: 'p', labels: { 'longhorn.io/disk-uuid': 'd' }, annotations: { 'k8s.v1.cni.cncf.io/network-status': JSON.stringify([{ name: 'cbr0', interface: 'eth0', ips: ['10.0.0.7'] }, { name: 'longhorn-system/storage', interface: 'lhnet1', ips: ['192.168.50.7'] }]) } },
      spec: { nodeName: 'n', containers: [] },
      status: { phase: 'Running', podIP: '10.0.0.7', containerStatuses: [{ name: 'c', ready: true, image: '', imageID: '', restartCount: 0 }] },
    };
    expect(storageIPFromPod(pod)).toBe('192.168.50.7');
    expect(workloadStatusFromPod(pod, { nodeID: 'n', diskUUID: 'd' })).toEqual({ phase: 'ready', nodeID: 'n', diskUUID: 'd', ip: '10.0.0.7', address: '10.0.0.7:8000', syncAddress: '192.168.50.7:8001' });
    expect(storageIPFromPod({ ...pod, metadata: { ...pod.metadata, annotations: { 'k8s.v1.cni.cncf.io/network-status': 'not json' } } })).toBe('10.0.0.7');
    expect(storageIPFromPod({ ...pod, metadata: { ...pod.metadata, annotations: {} } })).toBe('10.0.0.7');
  });

  it("parses Longhorn's toleration and node-selector settings and names a bad value", () => {
    expect(parseTaintToleration('nodetype=storage:NoSchedule; dedicated:NoExecute;:NoSchedule')).toEqual([
      { key: 'nodetype', operator: 'Equal', value: 'storage', effect: 'NoSchedule' },
      { key: 'dedicated', operator: 'Exists', effect: 'NoExecute' },
      { operator: 'Exists', effect: 'NoSchedule' },
    ]);
    expect(() => parseTaintToleration('key=value:Sometimes')).toThrow('unknown effect Sometimes');
    expect(parseNodeSelector('label-key1:label-value1;zone=a')).toEqual({ 'label-key1': 'label-value1', zone: 'a' });
    expect(() => parseNodeSelector('novalue')).toThrow('invalid node selector "novalue"');
  });
});

describe('KubeDataPlane with the controllers against the API double', () => {
  let api: KubeApiDouble;
  const instances: Instance[] = [];
  beforeEach(async () => {
    api = await KubeApiDouble.start({ kinds: CONTROLLER_KINDS });
  });
  afterEach(async () => {
    for (const i of instances.splice(0)) await stopInstance(i);
    await api.stop();
  });

  it('reports the node disk, creates the manager pod, maps pod phase and readiness to manager states and deletes the pod', async () => {
    const a = await startInstance(api, 'node-1');
    instances.push(a);
    await a.store.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: SettingName.DefaultBackingImageManagerImage, namespace: NS }, value: IMAGE });
    await a.store.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: 'taint-toleration', namespace: NS }, value: 'nodetype=storage:NoSchedule' });

    // The node's disk: longhorn-disk.cfg written on the disk, its UUID and conditions in the Node status.
    const disk = await diskUUIDOf(a.store, 'node-1');
    expect(JSON.parse(await readFile(path.join(a.dir, 'longhorn-disk.cfg'), 'utf8'))).toEqual({ diskUUID: disk.uuid });
    const node = await a.store.get(NodeKind, 'node-1', NS);
    const ds = Object.values(node.status?.diskStatus ?? {})[0]!;
    expect(ds.conditions?.map((c) => `${c.type}=${c.status}`)).toEqual(['Ready=True', 'Schedulable=True']);
    expect(ds.storageMaximum).toBeGreaterThan(0);
    expect(node.status?.conditions?.find((c) => c.type === 'Ready')?.status).toBe('True');
    // A disk error's condition (set by the controllers) survives the reporter's next pass.
    const diskName = Object.keys(node.status!.diskStatus!)[0]!;
    const full = { type: 'Healthy', status: 'False', reason: 'DiskFull', message: `${diskName}: ENOSPC`, lastProbeTime: '', lastTransitionTime: new Date().toISOString() };
    await a.store.updateStatus(NodeKind, { ...node, status: { ...node.status, diskStatus: { ...node.status!.diskStatus, [diskName]: { ...ds, conditions: [...ds.conditions!, full] } } } });
    await a.disks.sync();
    const kept = (await a.store.get(NodeKind, 'node-1', NS)).status!.diskStatus![diskName]!.conditions!;
    expect(kept.map((c) => `${c.type}=${c.status}`).sort()).toEqual(['Healthy=False', 'Ready=True', 'Schedulable=True']);

    const bim = await createBim(a.store, 'node-1');
    const podName = bim.metadata.name;
    await eventually(async () => (await api.store.get(TestPodKind, podName, NS).catch(() => undefined)) !== undefined, 10_000, 'manager pod');
    const pod = await api.store.get(TestPodKind, podName, NS);
    expect(pod.spec.nodeName).toBe('node-1');
    expect(pod.spec.containers[0]!.image).toBe(IMAGE);
    // The scrub settings reach the pod as flags (their defaults here: 7 days, 50 MiB/s), as in standalone mode.
    expect(pod.spec.containers[0]!.command).toEqual(['backing-image-manager', '--debug', 'daemon', '--listen', ':8000', '--sync-listen', ':8001', '--scrub-interval', '604800', '--scrub-bandwidth', '52428800']);
    expect(pod.spec.volumes).toEqual([{ name: 'disk-path', hostPath: { path: a.dir } }]);
    expect((pod.spec as { tolerations?: unknown }).tolerations).toEqual([{ key: 'nodetype', operator: 'Equal', value: 'storage', effect: 'NoSchedule' }]);
    expect(pod.metadata.ownerReferences?.[0]).toMatchObject({ kind: 'BackingImageManager', name: podName, uid: bim.metadata.uid });

    const state = async () => (await a.store.get(BackingImageManagerKind, podName, NS)).status;
    await eventually(async () => (await state())?.currentState === 'starting', 10_000, 'BIM starting');
    expect((await state())?.ownerID).toBe('node-1');

    // The kubelet's part: Running but not ready keeps it starting; the container exits: error, and the controller
    // deletes the failed pod and starts a new one.
    await setPodStatus(api, podName, { phase: 'Running', podIP: '10.0.0.7', containerStatuses: [{ name: 'backing-image-manager', ready: false }] });
    await new Promise((r) => setTimeout(r, 300));
    expect((await state())?.currentState).toBe('starting');
    const firstUid = pod.metadata.uid;
    await setPodStatus(api, podName, { phase: 'Failed', podIP: '10.0.0.7', containerStatuses: [{ name: 'backing-image-manager', ready: false }] });
    await eventually(async () => {
      const p = await api.store.get(TestPodKind, podName, NS).catch(() => undefined);
      return p !== undefined && p.metadata.uid !== firstUid;
    }, 10_000, 'failed manager pod replaced by a new one');
    expect(['error', 'starting']).toContain((await state())?.currentState);

    // Deleting the BIM removes its pod (the controller deletes it; the ownerReference would as well).
    await a.store.delete(BackingImageManagerKind, podName, NS);
    await eventually(async () => (await api.store.get(TestPodKind, podName, NS).catch(() => undefined)) === undefined, 10_000, 'pod deleted');
    await eventually(async () => (await a.store.get(BackingImageManagerKind, podName, NS).catch(() => undefined)) === undefined, 10_000, 'BIM finalized');
  }, 60_000);

  it('a ready manager pod makes the BIM running, through the real manager gRPC API at the pod address', async () => {
    // The test plays the kubelet: the "pod" is a real manager on the node's disk at 127.0.0.1 (ports of its own,
    // given to the data plane instead of Longhorn's fixed 8000/8001).
    const dir = await mkdtemp(path.join(os.tmpdir(), 'kube-dp-mgr-'));
    const probeStore = new KubeDatastore({ kubeConfig: kubeConfigFor(api.url, api.token), defaultNamespace: NS });
    const probe = new NodeDiskReporter({ store: probeStore, namespace: NS, nodeID: 'none', defaultDataPath: '' });
    await probe.checkDisk(dir); // writes longhorn-disk.cfg, which the manager requires
    const mgr = await startManagerOnDisk(dir);
    try {
      const a = await startInstance(api, 'node-1', { api: mgr.grpcPort, sync: mgr.syncPort });
      instances.push(a);
      await a.store.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: SettingName.DefaultBackingImageManagerImage, namespace: NS }, value: IMAGE });
      // Point the node's disk at the manager's directory (the instance reports it on its next check).
      const node = await a.store.get(NodeKind, 'node-1', NS);
      const diskName = Object.keys(node.spec?.disks ?? {})[0]!;
      await a.store.update(NodeKind, { ...node, spec: { ...node.spec!, disks: { [diskName]: { ...node.spec!.disks![diskName]!, path: dir } } } });
      await a.disks.trigger();
      const uuid = JSON.parse(await readFile(path.join(dir, 'longhorn-disk.cfg'), 'utf8')).diskUUID as string;
      await eventually(async () => (await diskUUIDOf(a.store, 'node-1')).uuid === uuid, 5000, 'disk reported with the manager disk UUID');
      const bim = await createBim(a.store, 'node-1');
      const podName = bim.metadata.name;
      await eventually(async () => (await api.store.get(TestPodKind, podName, NS).catch(() => undefined)) !== undefined, 10_000, 'manager pod');
      await setPodStatus(api, podName, { phase: 'Running', podIP: '127.0.0.1', containerStatuses: [{ name: 'backing-image-manager', ready: true }] });
      const st = await eventually(async () => {
        const b = await a.store.get(BackingImageManagerKind, podName, NS);
        return b.status?.currentState === 'running' && b.status.apiVersion ? b : undefined;
      }, 10_000, 'BIM running');
      expect(st.status?.ip).toBe('127.0.0.1');
      expect(st.status?.apiVersion).toBeGreaterThan(0);
      expect(st.metadata.annotations?.['bis.longhorn.io/address']).toBe(`127.0.0.1:${mgr.grpcPort}`);
      expect(st.metadata.annotations?.['bis.longhorn.io/sync-address']).toBe(`127.0.0.1:${mgr.syncPort}`);
      // The pod stops being ready: the manager leaves running.
      await setPodStatus(api, podName, { phase: 'Running', podIP: '127.0.0.1', containerStatuses: [{ name: 'backing-image-manager', ready: false }] });
      await eventually(async () => (await a.store.get(BackingImageManagerKind, podName, NS)).status?.currentState !== 'running', 10_000, 'BIM leaves running');
    } finally {
      await probeStore.close();
      await mgr.stop();
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);

  it('two instances each handle their own node; backing-image ownership moves when its node goes down', async () => {
    const a = await startInstance(api, 'node-1');
    instances.push(a);
    const b = await startInstance(api, 'node-2');
    instances.push(b);
    await a.store.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: SettingName.DefaultBackingImageManagerImage, namespace: NS }, value: IMAGE });
    const bim1 = await createBim(a.store, 'node-1');
    const bim2 = await createBim(a.store, 'node-2');
    const owner = async (n: string) => (await a.store.get(BackingImageManagerKind, n, NS)).status?.ownerID;
    await eventually(async () => (await owner(bim1.metadata.name)) === 'node-1' && (await owner(bim2.metadata.name)) === 'node-2', 10_000, 'each BIM owned by its node');
    await eventually(async () => (await api.store.list(TestPodKind, { namespace: NS })).items.length === 2, 10_000, 'two manager pods');
    const pods = (await api.store.list(TestPodKind, { namespace: NS })).items;
    expect(Object.fromEntries(pods.map((p) => [p.metadata.name, p.spec.nodeName]))).toEqual({ [bim1.metadata.name]: 'node-1', [bim2.metadata.name]: 'node-2' });
    // Each node's disk status is written by its own instance only.
    expect((await diskUUIDOf(a.store, 'node-1')).path).toBe(a.dir);
    expect((await diskUUIDOf(a.store, 'node-2')).path).toBe(b.dir);

    await a.store.create(BackingImageKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImage',
      metadata: { name: 'parrot', namespace: NS },
      spec: { sourceType: 'download', sourceParameters: { url: 'https://example.com/parrot.raw' }, checksum: '', diskFileSpecMap: {}, minNumberOfCopies: 1 },
    });
    const biOwner = async () => (await a.store.get(BackingImageKind, 'parrot', NS)).status?.ownerID ?? '';
    const first = await eventually(async () => (await biOwner()) || undefined, 10_000, 'BI owner');
    await new Promise((r) => setTimeout(r, 500));
    expect(await biOwner()).toBe(first);

    // The owner's node goes down (Kubernetes node not ready): the other instance takes the backing image over.
    const other = first === 'node-1' ? 'node-2' : 'node-1';
    const down = first === 'node-1' ? a : b;
    await down.disks.stop();
    await down.cm.stop();
    for (;;) {
      const n = await a.store.get(NodeKind, first, NS);
      const conditions = (n.status?.conditions ?? []).map((c) => (c.type === 'Ready' ? { ...c, status: 'False', reason: 'KubernetesNodeNotReady', message: `Kubernetes node ${first} not ready` } : c));
      try {
        await a.store.updateStatus(NodeKind, { ...n, status: { ...n.status, conditions } });
        break;
      } catch (err) {
        if ((err as { reason?: string }).reason !== 'Conflict') throw err;
      }
    }
    await eventually(async () => (await biOwner()) === other, 15_000, `BI ownership moved to ${other}`);
  }, 60_000);
});
