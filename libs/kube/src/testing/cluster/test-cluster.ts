import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createWriteStream, promises as fsp } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { V1Container, V1EnvVar, V1Pod } from '@kubernetes/client-node';
import type { ControlPlane } from '../envtest.js';
import { GarbageCollector } from './garbage-collector.js';
import { ClusterNetwork, type LinkShape, type PodNetwork } from './network.js';
import { relay } from './relay.js';
import { ServiceProxy, type ServiceEndpointPod } from './service-proxy.js';

/** A node of the test cluster. */
export interface ClusterNodeSpec {
  name: string;
  /** Labels of the Node object (besides `kubernetes.io/hostname` and `kubernetes.io/os`). */
  labels?: Record<string, string>;
}

export interface TestClusterOptions {
  controlPlane: ControlPlane;
  nodes: readonly ClusterNodeSpec[];
  /**
   * The "images": for each image name, the executables it holds (a container's `command[0]`) mapped to the Node.js
   * script that plays it (an app's `bin/*.js`). A pod whose image is not here stays `Waiting` with `ErrImagePull`.
   */
  images: Readonly<Record<string, Readonly<Record<string, string>>>>;
  /** Namespaces whose DaemonSets get one pod per matching node (the DaemonSet controller's part). */
  daemonSetNamespaces?: readonly string[];
  /** Lease renewal / node status period. Default 1000 ms. */
  heartbeatMs?: number;
  /** How long a node's lease may be stale before its `Ready` turns `Unknown` (node-monitor-grace-period). Default 6000 ms. */
  nodeMonitorGracePeriodMs?: number;
  /** Period of the pod sync loop. Default 250 ms. */
  syncMs?: number;
  /** Upper bound of a deleted pod's termination grace. Default 5000 ms. */
  maxGraceMs?: number;
  /**
   * Collections (API paths, e.g. `/apis/longhorn.io/v1beta2/namespaces/ns/backingimages`) the garbage collector
   * watches every second: foreground deletion and orphaned dependents (see `GarbageCollector`). Default none.
   */
  garbageCollect?: readonly string[];
  log?: (line: string) => void;
}

/** The host directories of a node: each hostPath `P` of a pod on the node is `<root>/P` (except /dev, /proc, /sys). */
export interface ClusterNode {
  name: string;
  root: string;
  /** The node's host path as the test process sees it. */
  hostPath(p: string): string;
}

interface RunningPod {
  uid: string;
  namespace: string;
  name: string;
  node: string;
  net: PodNetwork;
  labels: Record<string, string>;
  /** Container ports by name (Services may name their targetPort). */
  namedPorts: Record<string, number>;
  dir: string;
  logFile: string;
  child?: ChildProcess;
  startedAt: string;
  restartCount: number;
  exit?: { code: number | null; signal: NodeJS.Signals | null; at: string };
  ready: boolean;
  /** Readiness probe failures in a row. */
  probeFailures?: number;
  lastStatus?: string;
  restartAt?: number;
  terminating?: boolean;
  failedStart?: string;
}

interface NodeState {
  spec: ClusterNodeSpec;
  node: ClusterNode;
  killed: boolean;
  cut: boolean;
  shape?: LinkShape;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const rfc3339 = (d = new Date()): string => d.toISOString().replace(/\.\d{3}Z$/, 'Z');
const microTime = (d = new Date()): string => d.toISOString().replace(/Z$/, '000Z');
const shellQuote = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;
const REAL_HOST_PATHS = ['/dev', '/proc', '/sys'];

/** A container status as written on the wire (timestamps as RFC 3339 strings). */
interface ContainerStatusWire {
  name: string;
  image: string;
  imageID: string;
  containerID?: string;
  ready: boolean;
  restartCount: number;
  started: boolean;
  state: Record<string, Record<string, unknown>>;
  lastState?: Record<string, Record<string, unknown>>;
}

type Pod = V1Pod & { metadata: { name: string; namespace: string; uid: string } };
type DaemonSet = { metadata: { name: string; namespace: string; uid: string }; spec: { template: { metadata?: { labels?: Record<string, string> }; spec: V1Pod['spec'] } } };

/**
 * A multi-node Kubernetes cluster on one machine, for tests only, around an envtest control plane (etcd and
 * kube-apiserver, no kubelet, scheduler or controller-manager). It plays:
 *
 * - the kubelets: N Node objects with a `Ready` condition and a `kube-node-lease` Lease renewed every heartbeat; the
 *   pods bound to them run as local processes (a container's `command[0]` mapped through `images` to a Node.js script)
 *   with the pod's env (values, `$(VAR)`, fieldRef, secretKeyRef, configMapKeyRef), each in its own network namespace
 *   (veth onto one bridge, an address of a private /24) and its own mount namespace where each volume is
 *   bind-mounted at its mountPath (hostPath from the node's own host directory; secret and configMap as files);
 *   the pod's status written back (phase, podIP, Ready from the readiness probe (tcpSocket or httpGet), containerStatuses); a deleted pod's
 *   process is signalled and the pod removed; a pod whose nodeSelector does not match its node is refused
 *   (`NodeAffinity`), like the kubelet's admission;
 * - in-cluster credentials: a pod gets `KUBECONFIG` pointing at its ServiceAccount's token (TokenRequest) and the API
 *   server through a TCP relay on the bridge address;
 * - the DaemonSet controller (one pod per matching node) and the scheduler (an unbound pod goes to a live node
 *   matching its nodeSelector);
 * - the node lifecycle controller: a node whose lease is older than the grace period gets `Ready=Unknown` and its
 *   pods `Ready=False`;
 * - the garbage collector, over the collections given in `garbageCollect`: foreground deletion and orphans;
 * - kube-proxy (userspace): each Service's cluster IP (from the control plane's service range) is put on the bridge
 *   with a listener per port that relays to a ready pod of its selector; pods route the range to the bridge
 *   (`ServiceProxy`, `serviceAddress()`).
 *
 * Links: `shapeLink` (tc netem rate and delay), `cutLink` / `restoreLink` (the node's veths down: its pods and its
 * kubelet lose the network), `killNode` (its processes SIGKILLed, heartbeats stopped). `stop()` removes everything
 * (processes, namespaces, veths, bridge, mount points, directories); `start()` sweeps what a killed run left.
 */
export class TestCluster {
  readonly network: ClusterNetwork;
  readonly workDir: string;
  private readonly nodes = new Map<string, NodeState>();
  private readonly pods = new Map<string, RunningPod>();
  private readonly timers: NodeJS.Timeout[] = [];
  private relay: net.Server | undefined;
  private relayPort = 0;
  private readonly relaySockets = new Set<net.Socket>();
  private stopped = false;
  private syncing: Promise<void> | undefined;
  private readonly tokens = new Map<string, string>();
  private services: ServiceProxy | undefined;

  private constructor(
    private readonly o: TestClusterOptions,
    network: ClusterNetwork,
    workDir: string,
  ) {
    this.network = network;
    this.workDir = workDir;
  }

  static async start(o: TestClusterOptions): Promise<TestCluster> {
    const workDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-cluster-'));
    let network: ClusterNetwork | undefined;
    let cluster: TestCluster | undefined;
    try {
      network = await ClusterNetwork.create(o.controlPlane.serviceClusterIpRange);
      cluster = new TestCluster(o, network, workDir);
      await cluster.init();
      return cluster;
    } catch (err) {
      if (cluster) await cluster.stop();
      else {
        await network?.destroy();
        await fsp.rm(workDir, { recursive: true, force: true });
      }
      throw err;
    }
  }

  private log(line: string): void {
    this.o.log?.(`[cluster] ${line}`);
  }

  private get cp(): ControlPlane {
    return this.o.controlPlane;
  }

  /** The address of the bridge in the root namespace: test servers listening there are reachable from every pod. */
  get hostAddress(): string {
    return this.network.gateway;
  }

  /** The API server as pods reach it (a relay on the bridge address to the loopback API server). */
  get apiServerUrlForPods(): string {
    return `https://${this.network.gateway}:${this.relayPort}`;
  }

  node(name: string): ClusterNode {
    const n = this.nodes.get(name);
    if (!n) throw new Error(`no node ${name} in the test cluster`);
    return n.node;
  }

  get nodeNames(): string[] {
    return [...this.nodes.keys()];
  }

  private async init(): Promise<void> {
    // The relay: pods reach the API server (loopback only) at <gateway>:<port>.
    const target = new URL(this.cp.url);
    this.relay = net.createServer((c) => {
      const up = net.connect(Number(target.port), target.hostname);
      this.relaySockets.add(c).add(up);
      c.once('close', () => this.relaySockets.delete(c));
      up.once('close', () => this.relaySockets.delete(up));
      relay(c, up);
    });
    await new Promise<void>((resolve, reject) => {
      this.relay!.once('error', reject);
      this.relay!.listen(0, this.network.gateway, () => resolve());
    });
    this.relayPort = (this.relay.address() as net.AddressInfo).port;

    await this.ensureNamespace('kube-node-lease');
    for (const spec of this.o.nodes) {
      const root = path.join(this.workDir, 'nodes', spec.name, 'root');
      await fsp.mkdir(root, { recursive: true });
      const node: ClusterNode = {
        name: spec.name,
        root,
        hostPath: (p: string) => (REAL_HOST_PATHS.some((r) => p === r || p.startsWith(`${r}/`)) ? p : path.join(root, p)),
      };
      this.nodes.set(spec.name, { spec, node, killed: false, cut: false });
      await this.registerNode(spec);
    }
    this.every(this.o.heartbeatMs ?? 1000, () => this.heartbeat());
    this.every(Math.max(500, Math.floor((this.o.nodeMonitorGracePeriodMs ?? 6000) / 4)), () => this.monitorNodes());
    this.every(this.o.syncMs ?? 250, () => this.syncOnce());
    this.services = new ServiceProxy(this.cp, this.network, () => this.readyEndpoints(), (l) => this.log(l));
    this.every(1000, () => this.services!.pass());
    if (this.o.garbageCollect?.length) {
      const gc = new GarbageCollector(this.cp, this.o.garbageCollect, (l) => this.log(l));
      this.every(1000, () => gc.pass());
    }
  }

  /** The pods a Service may send to: running, ready, on a node that is neither killed nor cut off. */
  private readyEndpoints(): ServiceEndpointPod[] {
    return [...this.pods.values()]
      .filter((rp) => rp.child && rp.ready && !rp.terminating && !this.state(rp.node).killed && !this.state(rp.node).cut)
      .map((rp) => ({ namespace: rp.namespace, name: rp.name, ip: rp.net.ip, labels: rp.labels, namedPorts: rp.namedPorts }));
  }

  /** The cluster IP of a Service, once the service proxy listens on it (a Service of type ClusterIP or NodePort). */
  async serviceAddress(namespace: string, name: string): Promise<string> {
    const res = await this.req('GET', `/api/v1/namespaces/${namespace}/services/${name}`);
    if (res.status !== 200) throw new Error(`service ${namespace}/${name}: HTTP ${res.status}`);
    const ip = (res.body as { spec?: { clusterIP?: string } }).spec?.clusterIP ?? '';
    if (!this.network.inServiceRange(ip)) throw new Error(`service ${namespace}/${name} has no cluster IP in ${this.network.serviceRange ?? '(no service range)'}: "${ip}"`);
    await this.services!.pass();
    return ip;
  }

  private every(ms: number, fn: () => Promise<void>): void {
    let busy = false;
    const t = setInterval(() => {
      if (busy || this.stopped) return;
      busy = true;
      void fn()
        .catch((err: Error) => this.log(`loop error: ${err.message}`))
        .finally(() => (busy = false));
    }, ms);
    this.timers.push(t);
  }

  private async req(method: string, p: string, body?: unknown, contentType?: string, query?: Record<string, string>): Promise<{ status: number; body: unknown }> {
    return this.cp.request(method, p, { body, contentType, query });
  }

  private async ensureNamespace(name: string): Promise<void> {
    const res = await this.req('POST', '/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name } });
    if (res.status !== 201 && res.status !== 409) throw new Error(`namespace ${name}: HTTP ${res.status} ${JSON.stringify(res.body)}`);
  }

  // ---------------------------------------------------------------- nodes

  private async registerNode(spec: ClusterNodeSpec): Promise<void> {
    const labels = { 'kubernetes.io/hostname': spec.name, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64', ...(spec.labels ?? {}) };
    const res = await this.req('POST', '/api/v1/nodes', { apiVersion: 'v1', kind: 'Node', metadata: { name: spec.name, labels } });
    if (res.status !== 201 && res.status !== 409) throw new Error(`node ${spec.name}: HTTP ${res.status} ${JSON.stringify(res.body)}`);
    await this.postNodeStatus(spec.name, true);
    await this.renewLease(spec.name);
  }

  private async postNodeStatus(name: string, created = false): Promise<void> {
    const now = rfc3339();
    const cond = (type: string, status: string, reason: string, message: string) => ({ type, status, reason, message, lastHeartbeatTime: now, ...(created ? { lastTransitionTime: now } : {}) });
    const cur = created ? undefined : ((await this.req('GET', `/api/v1/nodes/${name}`)).body as { status?: { conditions?: { type: string; status: string; lastTransitionTime?: string }[] } });
    const prevReady = cur?.status?.conditions?.find((c) => c.type === 'Ready');
    const ready = cond('Ready', 'True', 'KubeletReady', 'kubelet is posting ready status');
    const withTransition = { ...ready, lastTransitionTime: prevReady?.status === 'True' ? prevReady.lastTransitionTime : now };
    const status = {
      conditions: [
        withTransition,
        cond('MemoryPressure', 'False', 'KubeletHasSufficientMemory', 'kubelet has sufficient memory available'),
        cond('DiskPressure', 'False', 'KubeletHasNoDiskPressure', 'kubelet has no disk pressure'),
        cond('PIDPressure', 'False', 'KubeletHasSufficientPID', 'kubelet has sufficient PID available'),
      ].map((c) => ({ ...c, lastTransitionTime: c.lastTransitionTime ?? now })),
      addresses: [{ type: 'Hostname', address: name }],
      capacity: { cpu: String(os.cpus().length), memory: `${Math.floor(os.totalmem() / 1024)}Ki`, pods: '110' },
      allocatable: { cpu: String(os.cpus().length), memory: `${Math.floor(os.totalmem() / 1024)}Ki`, pods: '110' },
      nodeInfo: { kubeletVersion: 'v1.20.2-bis-test-cluster', operatingSystem: 'linux', architecture: 'amd64', containerRuntimeVersion: 'bis-test-cluster://0', kernelVersion: os.release(), osImage: 'test cluster', kubeProxyVersion: '', machineID: '', systemUUID: '', bootID: '' },
    };
    const res = await this.req('PATCH', `/api/v1/nodes/${name}/status`, { status }, 'application/merge-patch+json');
    if (res.status >= 300) throw new Error(`node ${name} status: HTTP ${res.status} ${JSON.stringify(res.body)}`);
  }

  private async renewLease(name: string): Promise<void> {
    const p = `/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/${name}`;
    const spec = { holderIdentity: name, leaseDurationSeconds: 40, renewTime: microTime() };
    const cur = await this.req('GET', p);
    if (cur.status === 404) {
      const res = await this.req('POST', '/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases', {
        apiVersion: 'coordination.k8s.io/v1',
        kind: 'Lease',
        metadata: { name, namespace: 'kube-node-lease', ownerReferences: [] },
        spec,
      });
      if (res.status >= 300 && res.status !== 409) throw new Error(`lease ${name}: HTTP ${res.status} ${JSON.stringify(res.body)}`);
      return;
    }
    const res = await this.req('PATCH', p, { spec }, 'application/merge-patch+json');
    if (res.status >= 300) throw new Error(`lease ${name}: HTTP ${res.status}`);
  }

  private beats = 0;
  private async heartbeat(): Promise<void> {
    this.beats++;
    for (const [name, st] of this.nodes) {
      // A killed node's kubelet is dead; a cut node's kubelet cannot reach the API server.
      if (st.killed || st.cut) continue;
      await this.renewLease(name).catch((err: Error) => this.log(`lease ${name}: ${err.message}`));
      if (this.beats % 5 === 0) await this.postNodeStatus(name).catch((err: Error) => this.log(`node status ${name}: ${err.message}`));
    }
  }

  /** The node lifecycle controller: a stale lease turns `Ready` to `Unknown` and the node's pods to not ready. */
  private async monitorNodes(): Promise<void> {
    const grace = this.o.nodeMonitorGracePeriodMs ?? 6000;
    for (const name of this.nodes.keys()) {
      const lease = (await this.req('GET', `/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/${name}`)).body as { spec?: { renewTime?: string } };
      const renew = Date.parse(lease.spec?.renewTime ?? '');
      if (Number.isFinite(renew) && Date.now() - renew <= grace) continue;
      const node = (await this.req('GET', `/api/v1/nodes/${name}`)).body as { status?: { conditions?: { type: string; status: string }[] } };
      const ready = node.status?.conditions?.find((c) => c.type === 'Ready');
      if (ready?.status === 'Unknown') continue;
      const now = rfc3339();
      const conditions = (node.status?.conditions ?? []).map((c) => ({ ...c, status: 'Unknown', reason: 'NodeStatusUnknown', message: 'Kubelet stopped posting node status.', lastTransitionTime: now }));
      await this.req('PATCH', `/api/v1/nodes/${name}/status`, { status: { conditions } }, 'application/merge-patch+json');
      this.log(`node ${name}: lease stale, Ready=Unknown`);
      for (const pod of await this.listPods()) {
        if (pod.spec?.nodeName !== name) continue;
        const conds = (pod.status?.conditions ?? []).map((c) => (c.type === 'Ready' || c.type === 'ContainersReady' ? { ...c, status: 'False', lastTransitionTime: now } : c));
        await this.req('PATCH', `/api/v1/namespaces/${pod.metadata.namespace}/pods/${pod.metadata.name}/status`, { status: { conditions: conds } }, 'application/merge-patch+json');
      }
    }
  }

  // ---------------------------------------------------------------- links

  private podsOf(node: string): RunningPod[] {
    return [...this.pods.values()].filter((p) => p.node === node);
  }

  /** Caps every pod link of the node (existing and future) with tc netem; `{}` removes the cap. */
  async shapeLink(node: string, shape: LinkShape): Promise<void> {
    const st = this.state(node);
    st.shape = shape.rateMbit || shape.delayMs ? shape : undefined;
    for (const p of this.podsOf(node)) await this.network.shape(p.net, shape);
  }

  /** Takes the node off the network: its pods' links down, its kubelet stops reaching the API server. */
  async cutLink(node: string): Promise<void> {
    const st = this.state(node);
    st.cut = true;
    for (const p of this.podsOf(node)) await this.network.setLink(p.net, false);
    this.log(`node ${node}: link cut`);
  }

  async restoreLink(node: string): Promise<void> {
    const st = this.state(node);
    st.cut = false;
    for (const p of this.podsOf(node)) await this.network.setLink(p.net, true);
    this.log(`node ${node}: link restored`);
  }

  /** Kills the node: every process of its pods gets SIGKILL, its heartbeats stop, its pods are left as they are. */
  async killNode(node: string): Promise<void> {
    const st = this.state(node);
    st.killed = true;
    for (const p of this.podsOf(node)) if (p.child?.pid) killGroup(p.child.pid, 'SIGKILL');
    this.log(`node ${node}: killed`);
  }

  private state(node: string): NodeState {
    const st = this.nodes.get(node);
    if (!st) throw new Error(`no node ${node} in the test cluster`);
    return st;
  }

  // ---------------------------------------------------------------- pods

  private async listPods(): Promise<Pod[]> {
    const res = await this.req('GET', '/api/v1/pods');
    if (res.status !== 200) throw new Error(`list pods: HTTP ${res.status}`);
    return (res.body as { items: Pod[] }).items;
  }

  /** The address of a running pod (`namespace/name`), if it runs here. */
  podIP(namespace: string, name: string): string | undefined {
    return [...this.pods.values()].find((p) => p.namespace === namespace && p.name === name)?.net.ip;
  }

  /** The combined stdout/stderr of a pod's container so far. */
  async podLog(namespace: string, name: string): Promise<string> {
    const p = [...this.pods.values()].find((x) => x.namespace === namespace && x.name === name);
    return p ? fsp.readFile(p.logFile, 'utf8').catch(() => '') : '';
  }

  /** Every pod log file written so far (for diagnosing a failed test). */
  async logFiles(): Promise<string[]> {
    const dir = path.join(this.workDir, 'logs');
    return (await fsp.readdir(dir).catch(() => [] as string[])).map((f) => path.join(dir, f));
  }

  private syncOnce(): Promise<void> {
    this.syncing ??= this.sync().finally(() => (this.syncing = undefined));
    return this.syncing;
  }

  private async sync(): Promise<void> {
    if (this.stopped) return;
    await this.syncDaemonSets();
    const pods = await this.listPods();
    const seen = new Set<string>();
    for (const pod of pods) {
      seen.add(pod.metadata.uid);
      if (!pod.spec?.nodeName) {
        await this.schedule(pod);
        continue;
      }
      const st = this.nodes.get(pod.spec.nodeName);
      if (!st || st.killed || st.cut) continue;
      await this.syncPod(pod, st).catch((err: Error) => this.log(`pod ${pod.metadata.namespace}/${pod.metadata.name}: ${err.message}`));
    }
    // Force-deleted pods (gone from the API): stop what still runs for them.
    for (const [uid, rp] of this.pods) {
      const st = this.nodes.get(rp.node);
      if (seen.has(uid) || !st || st.killed || st.cut) continue;
      await this.teardown(rp, 0);
    }
  }

  private async schedule(pod: Pod): Promise<void> {
    const sel = pod.spec?.nodeSelector ?? {};
    const candidates = [...this.nodes.values()].filter((n) => !n.killed && !n.cut && matches(sel, nodeLabels(n.spec)));
    if (!candidates.length) return;
    const target = candidates[Math.floor(Math.random() * candidates.length)]!;
    const res = await this.req('POST', `/api/v1/namespaces/${pod.metadata.namespace}/pods/${pod.metadata.name}/binding`, {
      apiVersion: 'v1',
      kind: 'Binding',
      metadata: { name: pod.metadata.name, namespace: pod.metadata.namespace },
      target: { apiVersion: 'v1', kind: 'Node', name: target.spec.name },
    });
    if (res.status < 300) this.log(`scheduled ${pod.metadata.namespace}/${pod.metadata.name} to ${target.spec.name}`);
  }

  private async syncDaemonSets(): Promise<void> {
    for (const ns of this.o.daemonSetNamespaces ?? []) {
      const res = await this.req('GET', `/apis/apps/v1/namespaces/${ns}/daemonsets`);
      if (res.status !== 200) continue;
      const dss = (res.body as { items: DaemonSet[] }).items;
      if (!dss.length) continue;
      const pods = (await this.listPods()).filter((p) => p.metadata.namespace === ns);
      for (const ds of dss) {
        for (const st of this.nodes.values()) {
          const tpl = ds.spec.template;
          if (!matches(tpl.spec?.nodeSelector ?? {}, nodeLabels(st.spec))) continue;
          const mine = pods.filter((p) => p.spec?.nodeName === st.spec.name && p.metadata.ownerReferences?.some((r) => r.uid === ds.metadata.uid));
          // A failed daemon pod is deleted and replaced (the DaemonSet controller's behaviour).
          for (const p of mine.filter((x) => x.status?.phase === 'Failed' && !x.metadata.deletionTimestamp)) {
            if (!st.killed && !st.cut) await this.req('DELETE', `/api/v1/namespaces/${ns}/pods/${p.metadata.name}`);
          }
          if (mine.some((p) => p.status?.phase !== 'Failed')) continue;
          const name = `${ds.metadata.name}-${randomBytes(3).toString('hex').slice(0, 5)}`;
          const created = await this.req('POST', `/api/v1/namespaces/${ns}/pods`, {
            apiVersion: 'v1',
            kind: 'Pod',
            metadata: {
              name,
              namespace: ns,
              labels: tpl.metadata?.labels ?? {},
              ownerReferences: [{ apiVersion: 'apps/v1', kind: 'DaemonSet', name: ds.metadata.name, uid: ds.metadata.uid, controller: true, blockOwnerDeletion: true }],
            },
            spec: { ...tpl.spec, nodeName: st.spec.name },
          });
          if (created.status >= 300) this.log(`daemonset ${ns}/${ds.metadata.name}: create pod on ${st.spec.name}: HTTP ${created.status} ${JSON.stringify(created.body)}`);
          else this.log(`daemonset ${ns}/${ds.metadata.name}: pod ${name} on ${st.spec.name}`);
        }
      }
    }
  }

  private async syncPod(pod: Pod, st: NodeState): Promise<void> {
    const uid = pod.metadata.uid;
    let rp = this.pods.get(uid);
    if (pod.metadata.deletionTimestamp) {
      if (rp) await this.teardown(rp, Math.min((pod.spec?.terminationGracePeriodSeconds ?? 30) * 1000, this.o.maxGraceMs ?? 5000));
      const del = await this.req('DELETE', `/api/v1/namespaces/${pod.metadata.namespace}/pods/${pod.metadata.name}`, { apiVersion: 'v1', kind: 'DeleteOptions', gracePeriodSeconds: 0, preconditions: { uid } });
      if (del.status < 300 || del.status === 404) this.pods.delete(uid);
      return;
    }
    if (pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed') {
      if (rp && !rp.child) this.pods.delete(uid);
      return;
    }
    if (!rp) {
      // Admission as the kubelet does it: the pod's nodeSelector must match this node.
      if (!matches(pod.spec?.nodeSelector ?? {}, nodeLabels(st.spec))) {
        await this.writeStatus(pod, { phase: 'Failed', reason: 'NodeAffinity', message: "Pod Predicate NodeAffinity failed" });
        this.log(`pod ${pod.metadata.namespace}/${pod.metadata.name} refused on ${st.spec.name}: NodeAffinity`);
        return;
      }
      rp = await this.startPod(pod, st);
    }
    await this.observe(pod, rp);
  }

  private async startPod(pod: Pod, st: NodeState): Promise<RunningPod> {
    const uid = pod.metadata.uid;
    const dir = path.join(this.workDir, 'pods', uid);
    await fsp.mkdir(path.join(this.workDir, 'logs'), { recursive: true });
    await fsp.mkdir(dir, { recursive: true });
    const pn = await this.network.addPod(uid, { down: st.cut, shape: st.shape });
    const rp: RunningPod = {
      uid,
      namespace: pod.metadata.namespace,
      name: pod.metadata.name,
      node: st.spec.name,
      net: pn,
      labels: { ...(pod.metadata.labels ?? {}) },
      namedPorts: Object.fromEntries((pod.spec?.containers ?? []).flatMap((c) => (c.ports ?? []).filter((p) => p.name).map((p) => [p.name!, p.containerPort]))),
      dir,
      logFile: path.join(this.workDir, 'logs', `${pod.metadata.namespace}_${pod.metadata.name}.log`),
      startedAt: rfc3339(),
      restartCount: 0,
      ready: false,
    };
    this.pods.set(uid, rp);
    try {
      await this.spawnContainer(pod, rp, st);
    } catch (err) {
      rp.failedStart = (err as Error).message;
      this.log(`pod ${pod.metadata.namespace}/${pod.metadata.name}: ${rp.failedStart}`);
    }
    return rp;
  }

  private async spawnContainer(pod: Pod, rp: RunningPod, st: NodeState): Promise<void> {
    const c = pod.spec?.containers[0];
    if (!c) throw new Error('the pod has no container');
    const image = this.o.images[c.image ?? ''];
    if (!image) throw new ImagePullError(`image ${c.image} is not known to the test cluster`);
    const env = await this.resolveEnv(pod, c, rp);
    const expand = (s: string): string => s.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, k: string) => env[k] ?? m);
    const argv = [...(c.command ?? []), ...(c.args ?? [])].map(expand);
    const exe = argv[0];
    const script = exe ? image[exe] : undefined;
    if (!exe || !script) throw new Error(`image ${c.image} has no executable ${exe ?? '(no command)'}`);

    // Volumes: bind mounts in the pod's own mount namespace.
    const mounts: string[] = [];
    for (const vm of c.volumeMounts ?? []) {
      const vol = pod.spec?.volumes?.find((v) => v.name === vm.name);
      if (!vol) throw new Error(`volume ${vm.name} is not defined`);
      let src: string;
      if (vol.hostPath) {
        src = st.node.hostPath(vol.hostPath.path);
        if (!REAL_HOST_PATHS.some((r) => src === r || src.startsWith(`${r}/`))) await fsp.mkdir(src, { recursive: true });
      } else if (vol.secret || vol.configMap) {
        src = path.join(rp.dir, 'volumes', vol.name);
        await this.writeObjectVolume(pod, vol, src);
      } else if (vol.emptyDir) {
        src = path.join(rp.dir, 'volumes', vol.name);
        await fsp.mkdir(src, { recursive: true });
      } else {
        throw new Error(`volume ${vol.name}: only hostPath, secret, configMap and emptyDir are played by the test cluster`);
      }
      const dst = vm.mountPath.replace(/\/+$/, '') || '/';
      await this.network.ensureMountPoint(dst);
      mounts.push(`mount --bind ${shellQuote(src)} ${shellQuote(dst)}`);
      if (vm.readOnly) mounts.push(`mount -o remount,bind,ro ${shellQuote(dst)}`);
    }
    const sh = ['set -e', 'mount --make-rprivate /', ...mounts, 'exec "$@"'].join('\n');
    const log = createWriteStream(rp.logFile, { flags: 'a' });
    const child = spawn('ip', ['netns', 'exec', rp.net.netns, 'unshare', '--mount', '--propagation', 'private', 'sh', '-c', sh, 'pod', process.execPath, script, ...argv.slice(1)], {
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
      env,
    });
    child.stdout?.pipe(log, { end: false });
    child.stderr?.pipe(log, { end: false });
    rp.child = child;
    rp.exit = undefined;
    rp.ready = false;
    rp.probeFailures = 0;
    rp.startedAt = rfc3339();
    child.once('exit', (code, signal) => {
      rp.exit = { code, signal, at: rfc3339() };
      rp.child = undefined;
      log.end();
      void this.syncOnce();
    });
    this.log(`pod ${rp.namespace}/${rp.name} started on ${rp.node} at ${rp.net.ip}: ${argv.join(' ')}`);
  }

  private async writeObjectVolume(pod: Pod, vol: NonNullable<V1Pod['spec']>['volumes'] extends (infer V)[] | undefined ? V : never, dir: string): Promise<void> {
    await fsp.mkdir(dir, { recursive: true });
    const ns = pod.metadata.namespace;
    const isSecret = !!vol.secret;
    const name = isSecret ? vol.secret!.secretName : vol.configMap!.name;
    const res = await this.req('GET', `/api/v1/namespaces/${ns}/${isSecret ? 'secrets' : 'configmaps'}/${name}`);
    if (res.status !== 200) throw new Error(`volume ${vol.name}: ${isSecret ? 'secret' : 'configmap'} ${name}: HTTP ${res.status}`);
    const data = (res.body as { data?: Record<string, string> }).data ?? {};
    const items: { key: string; path: string; mode?: number }[] = (isSecret ? vol.secret!.items : vol.configMap!.items) ?? Object.keys(data).map((key) => ({ key, path: key }));
    const mode = (isSecret ? vol.secret!.defaultMode : vol.configMap!.defaultMode) ?? 0o644;
    for (const it of items) {
      const raw = data[it.key];
      if (raw === undefined) throw new Error(`volume ${vol.name}: key ${it.key} missing in ${name}`);
      const file = path.join(dir, it.path);
      await fsp.mkdir(path.dirname(file), { recursive: true });
      await fsp.writeFile(file, isSecret ? Buffer.from(raw, 'base64') : raw, { mode: it.mode ?? mode });
      await fsp.chmod(file, it.mode ?? mode);
    }
  }

  private async resolveEnv(pod: Pod, c: V1Container, rp: RunningPod): Promise<Record<string, string>> {
    const env: Record<string, string> = { PATH: process.env['PATH'] ?? '/usr/bin:/bin', HOME: '/root', HOSTNAME: pod.metadata.name };
    const field = (p: string): string => {
      const map: Record<string, string | undefined> = {
        'metadata.name': pod.metadata.name,
        'metadata.namespace': pod.metadata.namespace,
        'metadata.uid': pod.metadata.uid,
        'spec.nodeName': pod.spec?.nodeName,
        'spec.serviceAccountName': pod.spec?.serviceAccountName,
        'status.podIP': rp.net.ip,
        'status.hostIP': this.network.gateway,
      };
      if (!(p in map)) throw new Error(`fieldRef ${p} is not played by the test cluster`);
      return map[p] ?? '';
    };
    const keyRef = async (kind: 'secrets' | 'configmaps', name: string, key: string): Promise<string> => {
      const res = await this.req('GET', `/api/v1/namespaces/${pod.metadata.namespace}/${kind}/${name}`);
      const v = res.status === 200 ? (res.body as { data?: Record<string, string> }).data?.[key] : undefined;
      if (v === undefined) throw new Error(`${kind} ${name} key ${key} not found`);
      return kind === 'secrets' ? Buffer.from(v, 'base64').toString('utf8') : v;
    };
    for (const e of c.env ?? ([] as V1EnvVar[])) {
      if (e.value !== undefined) env[e.name] = e.value.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, k: string) => env[k] ?? m);
      else if (e.valueFrom?.fieldRef) env[e.name] = field(e.valueFrom.fieldRef.fieldPath);
      else if (e.valueFrom?.secretKeyRef) env[e.name] = await keyRef('secrets', e.valueFrom.secretKeyRef.name ?? '', e.valueFrom.secretKeyRef.key);
      else if (e.valueFrom?.configMapKeyRef) env[e.name] = await keyRef('configmaps', e.valueFrom.configMapKeyRef.name ?? '', e.valueFrom.configMapKeyRef.key);
      else env[e.name] = '';
    }
    // In-cluster credentials: the pod's ServiceAccount token, the API server through the relay.
    const sa = pod.spec?.serviceAccountName;
    if (sa && pod.spec?.automountServiceAccountToken !== false) {
      const token = await this.serviceAccountToken(pod.metadata.namespace, sa);
      if (token) {
        const file = path.join(rp.dir, 'kubeconfig');
        await fsp.writeFile(file, this.kubeConfigYaml(token), { mode: 0o600 });
        env['KUBECONFIG'] = file;
      }
    }
    return env;
  }

  private async serviceAccountToken(ns: string, sa: string): Promise<string | undefined> {
    const key = `${ns}/${sa}`;
    const cached = this.tokens.get(key);
    if (cached) return cached;
    const res = await this.req('POST', `/api/v1/namespaces/${ns}/serviceaccounts/${sa}/token`, { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 7200 } });
    if (res.status !== 201) return undefined;
    const token = (res.body as { status: { token: string } }).status.token;
    this.tokens.set(key, token);
    return token;
  }

  private kubeConfigYaml(token: string): string {
    return JSON.stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'test-cluster', cluster: { server: this.apiServerUrlForPods, 'certificate-authority-data': Buffer.from(this.cp.caPem).toString('base64'), 'tls-server-name': 'localhost' } }],
      users: [{ name: 'sa', user: { token } }],
      contexts: [{ name: 'in-cluster', context: { cluster: 'test-cluster', user: 'sa' } }],
      'current-context': 'in-cluster',
    });
  }

  /** Readiness probe, exits and restarts, and the pod status when it changed. */
  private async observe(pod: Pod, rp: RunningPod): Promise<void> {
    const c = pod.spec?.containers[0];
    if (rp.failedStart) {
      const pull = /is not known to the test cluster/.test(rp.failedStart);
      await this.writeStatusIfChanged(pod, rp, {
        phase: pull ? 'Pending' : 'Failed',
        ...(pull ? {} : { reason: 'StartError', message: rp.failedStart }),
        containerStatuses: [{ name: c?.name ?? '', image: c?.image ?? '', imageID: '', ready: false, restartCount: 0, started: false, state: { waiting: { reason: pull ? 'ErrImagePull' : 'CreateContainerError', message: rp.failedStart } } }],
      });
      if (!pull) this.pods.delete(rp.uid);
      return;
    }
    if (rp.exit && !rp.child) {
      const policy = pod.spec?.restartPolicy ?? 'Always';
      const ok = rp.exit.code === 0;
      if (policy === 'Always' || (policy === 'OnFailure' && !ok)) {
        rp.restartAt ??= Date.now() + Math.min(10_000, 1000 * 2 ** rp.restartCount);
        if (Date.now() >= rp.restartAt) {
          rp.restartAt = undefined;
          rp.restartCount++;
          await this.spawnContainer(pod, rp, this.state(rp.node)).catch((err: Error) => (rp.failedStart = err.message));
        }
      } else {
        const terminated = { exitCode: rp.exit.code ?? 137, reason: ok ? 'Completed' : 'Error', startedAt: rp.startedAt, finishedAt: rp.exit.at, ...(rp.exit.signal ? { signal: 0 } : {}) };
        await this.writeStatusIfChanged(pod, rp, {
          phase: ok ? 'Succeeded' : 'Failed',
          containerStatuses: [{ name: c?.name ?? '', image: c?.image ?? '', imageID: '', ready: false, restartCount: rp.restartCount, started: false, state: { terminated } }],
        });
        await this.network.removePod(rp.uid);
        this.pods.delete(rp.uid);
        return;
      }
    }
    if (rp.child) {
      // The kubelet's readiness probes: tcpSocket (connects) and httpGet (an answer 200–399); a named port is looked
      // up in the container's ports. No probe: ready once started.
      const probe = c?.readinessProbe;
      const portOf = (p: number | string | undefined): number => (typeof p === 'string' && !/^\d+$/.test(p) ? Number(c?.ports?.find((x) => x.name === p)?.containerPort) : Number(p));
      // As the kubelet: ready after a success, not ready after failureThreshold (default 3) failures in a row.
      let ok = true;
      if (probe?.httpGet) ok = await probeHttp(rp.net.ip, portOf(probe.httpGet.port as number | string), probe.httpGet.path ?? '/');
      else if (probe?.tcpSocket) ok = await probeTcp(rp.net.ip, portOf(probe.tcpSocket.port as number | string));
      rp.probeFailures = ok ? 0 : (rp.probeFailures ?? 0) + 1;
      if (ok) rp.ready = true;
      else if (rp.probeFailures >= (probe?.failureThreshold ?? 3)) rp.ready = false;
    }
    const running = !!rp.child;
    await this.writeStatusIfChanged(pod, rp, {
      phase: 'Running',
      containerStatuses: [
        {
          name: c?.name ?? '',
          image: c?.image ?? '',
          imageID: `bis-test-cluster://${c?.image ?? ''}`,
          containerID: `bis-test-cluster://${rp.uid}-${rp.restartCount}`,
          ready: running && rp.ready,
          restartCount: rp.restartCount,
          started: running,
          state: running ? { running: { startedAt: rp.startedAt } } : { waiting: { reason: 'CrashLoopBackOff' } },
          ...(rp.exit ? { lastState: { terminated: { exitCode: rp.exit.code ?? 137, reason: 'Error', startedAt: rp.startedAt, finishedAt: rp.exit.at } } } : {}),
        },
      ],
    });
  }

  private async writeStatusIfChanged(pod: Pod, rp: RunningPod, s: { phase: string; reason?: string; message?: string; containerStatuses: ContainerStatusWire[] }): Promise<void> {
    const ready = s.containerStatuses.every((x) => x.ready);
    const key = JSON.stringify([s.phase, s.reason, ready, s.containerStatuses.map((x) => [x.restartCount, Object.keys(x.state ?? {})])]);
    // Unchanged, unless somebody else (the node lifecycle controller) changed the Ready condition meanwhile.
    const apiReady = pod.status?.conditions?.find((c) => c.type === 'Ready')?.status === 'True';
    if (rp.lastStatus === key && pod.status?.podIP === rp.net.ip && apiReady === ready) return;
    const now = rfc3339();
    const prev = pod.status?.conditions ?? [];
    const cond = (type: string, status: boolean): Record<string, unknown> => {
      const old = prev.find((c) => c.type === type);
      const st = status ? 'True' : 'False';
      return { type, status: st, lastProbeTime: null, lastTransitionTime: old?.status === st ? old.lastTransitionTime : now };
    };
    await this.writeStatus(pod, {
      phase: s.phase,
      ...(s.reason ? { reason: s.reason, message: s.message } : {}),
      hostIP: this.network.gateway,
      podIP: rp.net.ip,
      podIPs: [{ ip: rp.net.ip }],
      startTime: pod.status?.startTime ?? now,
      conditions: [cond('Initialized', true), cond('Ready', ready), cond('ContainersReady', ready), cond('PodScheduled', true)],
      containerStatuses: s.containerStatuses,
    });
    rp.lastStatus = key;
  }

  private async writeStatus(pod: Pod, status: Record<string, unknown>): Promise<void> {
    const res = await this.req('PATCH', `/api/v1/namespaces/${pod.metadata.namespace}/pods/${pod.metadata.name}/status`, { status }, 'application/merge-patch+json');
    if (res.status >= 300 && res.status !== 404) throw new Error(`status: HTTP ${res.status} ${JSON.stringify(res.body)}`);
  }

  /** SIGTERM, SIGKILL after the grace period, then the namespace goes. */
  private async teardown(rp: RunningPod, graceMs: number): Promise<void> {
    if (rp.terminating) return;
    rp.terminating = true;
    const child = rp.child;
    if (child?.pid) {
      const exited = new Promise<void>((r) => child.once('exit', () => r()));
      killGroup(child.pid, graceMs > 0 ? 'SIGTERM' : 'SIGKILL');
      const t = setTimeout(() => killGroup(child.pid!, 'SIGKILL'), graceMs);
      await exited;
      clearTimeout(t);
    }
    await this.network.removePod(rp.uid);
    this.pods.delete(rp.uid);
    this.log(`pod ${rp.namespace}/${rp.name} stopped`);
  }

  /** Stops the loops, kills every pod process, removes namespaces, veths, bridge, mount points and the work dir. */
  async stop(opts: { keepWorkDir?: boolean } = {}): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    for (const t of this.timers) clearInterval(t);
    await this.syncing?.catch(() => undefined);
    for (const rp of this.pods.values()) if (rp.child?.pid) killGroup(rp.child.pid, 'SIGKILL');
    const deadline = Date.now() + 10_000;
    while ([...this.pods.values()].some((p) => p.child) && Date.now() < deadline) await sleep(50);
    this.pods.clear();
    await this.services?.stop();
    for (const s of this.relaySockets) s.destroy();
    await new Promise<void>((r) => (this.relay ? this.relay.close(() => r()) : r()));
    await this.network.destroy();
    if (!opts.keepWorkDir) await fsp.rm(this.workDir, { recursive: true, force: true });
  }
}

class ImagePullError extends Error {}

function killGroup(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(-pid, sig);
  } catch {
    try {
      process.kill(pid, sig);
    } catch {
      // gone
    }
  }
}

function nodeLabels(spec: ClusterNodeSpec): Record<string, string> {
  return { 'kubernetes.io/hostname': spec.name, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64', ...(spec.labels ?? {}) };
}

function matches(selector: Record<string, string>, labels: Record<string, string>): boolean {
  return Object.entries(selector).every(([k, v]) => labels[k] === v);
}

function probeHttp(host: string, port: number, path: string, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const req = http.get({ host, port, path, timeout: timeoutMs, agent: false }, (res) => {
      res.resume();
      resolve((res.statusCode ?? 0) >= 200 && (res.statusCode ?? 0) < 400);
    });
    req.once('timeout', () => req.destroy(new Error('probe timed out')));
    req.once('error', () => resolve(false));
  });
}

function probeTcp(host: string, port: number, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    const done = (ok: boolean): void => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(timeoutMs, () => done(false));
    s.once('connect', () => done(true));
    s.once('error', () => done(false));
  });
}
