import { backupTargetOperations } from '@bis/backupstore';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { BackingImageKind, ControllerManager, NodeKind, type Logger } from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { eventually } from '@bis/datastore/testing';
import { ApiAccess } from './api-access.js';
import { KubeDataPlane } from './kube-data-plane.js';
import { KubeDatastore, kubeConfigFor } from './kube-datastore.js';
import { NodeDiskReporter } from './node-disks.js';
import { DEFAULT_MANAGER_POD_SELECTOR, NodeHealthMonitor, nodeHealth, withReadyCondition } from './node-health.js';
import { CONTROLLER_KINDS, KubeApiDouble, TestKubeNodeKind, TestPodKind } from './testing/index.js';

const NS = 'longhorn-system';
const quiet: Logger = { info() {}, warn() {}, error() {}, debug() {} };
const TIMING = { managerRestartInitialMs: 50, managerRestartMaxMs: 500, waitRequeueMs: 100, rateLimiter: { baseDelayMs: 5, maxDelayMs: 500 } };

async function setKubeNode(api: KubeApiDouble, name: string, ready: 'True' | 'False' | 'Unknown'): Promise<void> {
  const conditions = [{ type: 'Ready', status: ready, reason: ready === 'True' ? 'KubeletReady' : 'NodeStatusUnknown', message: ready === 'True' ? 'kubelet is posting ready status' : 'Kubelet stopped posting node status.' }];
  for (;;) {
    try {
      let cur;
      try {
        cur = await api.store.get(TestKubeNodeKind, name);
      } catch (err) {
        if ((err as { reason?: string }).reason !== 'NotFound') throw err;
        cur = await api.store.create(TestKubeNodeKind, { apiVersion: 'v1', kind: 'Node', metadata: { name } });
      }
      // Node status is a subresource: the kubelet writes it through /status.
      await api.store.updateStatus(TestKubeNodeKind, { ...cur, status: { conditions } });
      return;
    } catch (err) {
      if ((err as { reason?: string }).reason !== 'Conflict') throw err;
    }
  }
}

/** A controller-manager DaemonSet pod on `node`, running and ready. */
async function startManagerPod(api: KubeApiDouble, node: string): Promise<void> {
  await api.store.create(TestPodKind, {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: `backing-image-system-manager-${node}`, namespace: NS, labels: { app: 'backing-image-system-manager' } },
    spec: { nodeName: node, containers: [{ name: 'backing-image-system-manager', image: 'cm', command: ['controller-manager'] }] },
  });
  const pod = await api.store.get(TestPodKind, `backing-image-system-manager-${node}`, NS);
  await api.store.updateStatus(TestPodKind, { ...pod, status: { phase: 'Running', podIP: '10.0.0.1', containerStatuses: [{ name: 'backing-image-system-manager', ready: true }] } });
}

async function createLonghornNode(store: KubeDatastore, name: string): Promise<void> {
  await store.create(NodeKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Node', metadata: { name, namespace: NS }, spec: { name, disks: {}, allowScheduling: true, evictionRequested: false, tags: [], instanceManagerCPURequest: 0 } });
}

async function readyOf(store: KubeDatastore, name: string): Promise<string> {
  const c = (await store.get(NodeKind, name, NS)).status?.conditions?.find((x) => x.type === 'Ready');
  return c ? `${c.status}/${c.reason ?? ''}` : 'none';
}

describe('nodeHealth', () => {
  const kubeNode = (status: string) => ({ metadata: { name: 'n1' }, status: { conditions: [{ type: 'Ready', status }] } });
  const pod = (node: string, phase: string, ready: boolean) => ({ spec: { nodeName: node, containers: [] }, status: { phase, containerStatuses: [{ name: 'c', ready, image: '', imageID: '', restartCount: 0 }] } });
  it('applies Longhorn\'s precedence: node gone, then node not ready, then manager pod missing', () => {
    expect(nodeHealth('n1', undefined, [pod('n1', 'Running', true)]).reason).toBe('KubernetesNodeGone');
    expect(nodeHealth('n1', kubeNode('Unknown'), [pod('n1', 'Running', true)]).reason).toBe('KubernetesNodeNotReady');
    expect(nodeHealth('n1', kubeNode('True'), [pod('n2', 'Running', true)]).reason).toBe('ManagerPodMissing');
    expect(nodeHealth('n1', kubeNode('True'), [pod('n1', 'Running', false)]).reason).toBe('ManagerPodMissing');
    expect(nodeHealth('n1', kubeNode('True'), [pod('n1', 'Pending', true)]).reason).toBe('ManagerPodMissing');
    expect(nodeHealth('n1', kubeNode('True'), [pod('n1', 'Running', true)])).toEqual({ ready: true, reason: '', message: '' });
  });
  it('changes the Ready condition only when it differs, keeping the other conditions', () => {
    const down = nodeHealth('n1', undefined, []);
    const c1 = withReadyCondition([{ type: 'Schedulable', status: 'True' }], down)!;
    expect(c1.map((c) => `${c.type}=${c.status}/${c.reason ?? ''}`)).toEqual(['Ready=False/KubernetesNodeGone', 'Schedulable=True/']);
    expect(withReadyCondition(c1, down)).toBeUndefined();
    expect(withReadyCondition(c1, { ready: true, reason: '', message: '' })![0].status).toBe('True');
  });
});

describe('NodeHealthMonitor against the Kubernetes API double', () => {
  let api: KubeApiDouble;
  const stores: KubeDatastore[] = [];
  const stops: (() => Promise<void>)[] = [];
  const newStore = () => {
    const s = new KubeDatastore({ kubeConfig: kubeConfigFor(api.url, api.token), defaultNamespace: NS });
    stores.push(s);
    return s;
  };
  const startMonitor = async (): Promise<NodeHealthMonitor> => {
    const m = new NodeHealthMonitor({ kubeConfig: kubeConfigFor(api.url, api.token), store: newStore(), namespace: NS, resyncMs: 60_000, watchRetryMs: 50, log: quiet });
    await m.start();
    stops.push(() => m.stop());
    return m;
  };

  beforeEach(async () => {
    api = await KubeApiDouble.start({ kinds: CONTROLLER_KINDS });
  });
  afterEach(async () => {
    for (const s of stops.splice(0).reverse()) await s();
    for (const s of stores.splice(0)) await s.close();
    await api.stop();
  });

  it('two racing monitors mark nodes down (gone, not ready, manager pod missing) and up again, writing only on change', async () => {
    const store = newStore();
    for (const n of ['node-1', 'node-2']) {
      await setKubeNode(api, n, 'True');
      await startManagerPod(api, n);
      await createLonghornNode(store, n);
    }
    await startMonitor();
    await startMonitor();
    const both = async (v1: string, v2: string) => (await readyOf(store, 'node-1')) === v1 && (await readyOf(store, 'node-2')) === v2;
    await eventually(() => both('True/', 'True/'), 10_000, 'both nodes Ready');

    await setKubeNode(api, 'node-1', 'Unknown');
    await eventually(() => both('False/KubernetesNodeNotReady', 'True/'), 10_000, 'node-1 KubernetesNodeNotReady');
    const msg = (await store.get(NodeKind, 'node-1', NS)).status?.conditions?.find((c) => c.type === 'Ready')?.message;
    expect(msg).toContain('node-1 not ready');

    await api.store.delete(TestKubeNodeKind, 'node-1');
    await eventually(() => both('False/KubernetesNodeGone', 'True/'), 10_000, 'node-1 KubernetesNodeGone');

    await api.store.delete(TestPodKind, 'backing-image-system-manager-node-2', NS);
    await eventually(() => both('False/KubernetesNodeGone', 'False/ManagerPodMissing'), 10_000, 'node-2 ManagerPodMissing');

    // Recovery.
    await setKubeNode(api, 'node-1', 'True');
    await startManagerPod(api, 'node-2');
    await eventually(() => both('True/', 'True/'), 10_000, 'both nodes Ready again');

    // Settled: another pass of each monitor writes nothing (idempotent).
    const writes = () => api.calls.filter((c) => c.resource === 'nodes/status' && c.group === 'longhorn.io').length;
    await new Promise((r) => setTimeout(r, 300));
    const settled = writes();
    const monitor = await startMonitor();
    await monitor.sync();
    expect(writes()).toBe(settled);

    // Every call the monitors made is granted by the chart's RBAC (the table it is generated from).
    const access = new ApiAccess();
    expect(api.calls.filter((c) => !access.allows(c.group, c.resource, c.verb))).toEqual([]);
    expect(api.calls.some((c) => c.group === '' && c.resource === 'nodes' && c.verb === 'watch')).toBe(true);
    expect(DEFAULT_MANAGER_POD_SELECTOR).toBe('app=backing-image-system-manager');
  }, 60_000);

  it('a Kubernetes node going NotReady moves a backing image to the instance of another node', async () => {
    interface Inst { cm: ControllerManager; disks: NodeDiskReporter; dp: KubeDataPlane; monitor: NodeHealthMonitor; dir: string; stopped: boolean }
    const insts = new Map<string, Inst>();
    const stopInst = async (i: Inst) => {
      if (i.stopped) return;
      i.stopped = true;
      await i.monitor.stop();
      await i.cm.stop();
      await i.disks.stop();
      i.dp.close();
      await rm(i.dir, { recursive: true, force: true });
    };
    for (const nodeID of ['node-1', 'node-2']) {
      await setKubeNode(api, nodeID, 'True');
      await startManagerPod(api, nodeID);
      const kc = kubeConfigFor(api.url, api.token);
      const store = newStore();
      const dir = await mkdtemp(path.join(os.tmpdir(), `node-health-${nodeID}-`));
      const disks = new NodeDiskReporter({ store, namespace: NS, nodeID, defaultDataPath: dir, intervalMs: 200 });
      await disks.start();
      const dp = new KubeDataPlane({ backupTarget: backupTargetOperations, kubeConfig: kc, settings: { namespace: NS, serviceAccountName: 'sa' }, managerImage: 'img', watchRetryMs: 50 });
      const cm = new ControllerManager({ store, dataPlane: dp, nodeID, namespace: NS, workers: 2, resyncMs: 300, timing: TIMING, log: quiet });
      await cm.start();
      const monitor = new NodeHealthMonitor({ kubeConfig: kc, store, namespace: NS, resyncMs: 60_000, watchRetryMs: 50, log: quiet });
      await monitor.start();
      const inst: Inst = { cm, disks, dp, monitor, dir, stopped: false };
      insts.set(nodeID, inst);
      stops.push(() => stopInst(inst));
    }
    const store = newStore();
    await eventually(async () => (await readyOf(store, 'node-1')) === 'True/' && (await readyOf(store, 'node-2')) === 'True/', 10_000, 'both Ready');
    await store.create(BackingImageKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImage',
      metadata: { name: 'parrot', namespace: NS },
      spec: { sourceType: 'download', sourceParameters: { url: 'https://example.com/parrot.raw' }, checksum: '', diskFileSpecMap: {}, minNumberOfCopies: 1 },
    });
    const biOwner = async () => (await store.get(BackingImageKind, 'parrot', NS)).status?.ownerID ?? '';
    const first = await eventually(async () => (await biOwner()) || undefined, 10_000, 'BI owner');
    const other = first === 'node-1' ? 'node-2' : 'node-1';
    await new Promise((r) => setTimeout(r, 500));
    expect(await biOwner()).toBe(first);

    // The owner's machine dies: its instance stops and the kubelet stops posting status. Only the monitor of the
    // surviving instance can mark the node down; nothing in the test writes the Longhorn Node.
    await stopInst(insts.get(first)!);
    await setKubeNode(api, first, 'Unknown');
    await eventually(async () => (await readyOf(store, first)) === 'False/KubernetesNodeNotReady', 10_000, `${first} marked down`);
    await eventually(async () => (await biOwner()) === other, 15_000, `BI ownership moved to ${other}`);
    // The surviving node's own disk reporter keeps its Ready condition as the monitor set it.
    await new Promise((r) => setTimeout(r, 400));
    expect(await readyOf(store, other)).toBe('True/');
  }, 60_000);
});
