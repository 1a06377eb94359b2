import { createHash } from 'node:crypto';
import { existsSync, createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { parseAllDocuments } from 'yaml';
import { renderChart } from '../chart/render-chart.js';
import { applyObject, chartDir, installChartIdentity, repoRoot, schemalessCrd, type Obj } from './chart-rbac.js';
import { ControlPlane, envtestAssets, installCrds } from './envtest.js';
import { TestCluster, clusterNetworkSupport } from './cluster/index.js';

/**
 * The Kubernetes mode end to end on a cluster in network namespaces (the `*.cluster.spec.ts` suites): a real
 * kube-apiserver (envtest), the chart's CRDs, RBAC, ConfigMap, PriorityClass, Service and DaemonSet applied, and
 * `TestCluster` playing kubelets, scheduler, DaemonSet and node lifecycle controllers. Every process is one of our
 * built apps: `controller-manager daemon` (one DaemonSet pod per node, with its ServiceAccount token), the
 * backing-image-manager and data-source pods it creates, each pod in its own network and mount namespace.
 */
export const NS = 'longhorn-system';
const CM_IMAGE = 'backing-image-system/controller-manager:0.1.0';
const BIM_IMAGE = 'backing-image-system/backing-image-manager:0.1.0';
const DATA_PATH = '/var/lib/longhorn/';
const DISK2_PATH = '/var/lib/longhorn-disk-2/';
const bins = {
  cm: path.join(repoRoot, 'apps/controller-manager/bin/controller-manager.js'),
  bim: path.join(repoRoot, 'apps/backing-image-manager/bin/backing-image-manager.js'),
  bids: path.join(repoRoot, 'apps/backing-image-data-source/bin/backing-image-data-source.js'),
};
const builtDist = ['apps/controller-manager/dist/main.js', 'apps/backing-image-manager/dist/main.js', 'apps/backing-image-data-source/dist/main.js'];

/** Why a cluster suite cannot run here (undefined: it can): envtest binaries, root for namespaces, built apps. */
export function clusterSkipReason(): string | undefined {
  const assets = envtestAssets();
  if (!assets.dir) return assets.reason;
  const net = clusterNetworkSupport();
  if (!net.ok) return net.reason;
  const missing = builtDist.filter((f) => !existsSync(path.join(repoRoot, f)));
  if (missing.length) return `the apps are not built (${missing.join(', ')}): run npx nx run-many -t build first`;
  return undefined;
}

export type LhNode = { metadata: { name: string; resourceVersion: string }; spec: { disks: Record<string, { path: string; allowScheduling: boolean; tags?: string[] }>; tags?: string[] }; status?: { diskStatus?: Record<string, { diskUUID?: string; conditions?: { type: string; status: string }[] }>; conditions?: { type: string; status: string; reason?: string }[] } };
export type ClusterBI = { metadata: { name: string }; status?: { uuid?: string; checksum?: string; diskFileStatusMap?: Record<string, { state: string; progress?: number; message?: string }> }; spec?: { diskFileSpecMap?: Record<string, unknown>; sourceType?: string } };
export type ReadyCopy = { disk: string; node: string; file: string };

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `fn` every 250 ms until it returns a value; the timeout's error carries the last error and `detail()`. */
export async function eventually<T>(fn: () => Promise<T | undefined>, timeoutMs: number, what: string, detail?: () => Promise<string>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? ` (last error: ${(last as Error).message})` : ''}${detail ? `\n${await detail()}` : ''}`);
    await sleep(250);
  }
}

export async function sha512File(file: string): Promise<string> {
  const h = createHash('sha512');
  for await (const c of createReadStream(file)) h.update(c as Buffer);
  return h.digest('hex');
}

export interface ChartClusterOptions {
  nodes: readonly string[];
  /** A second disk (`disk-2`) added to every node after registration. */
  secondDisk?: boolean;
  /** The bridge address (where the tests' origins listen) in the chart's `allowSourceHosts`. */
  allowHostAddress?: boolean;
  /** Default settings the chart renders (`defaultSettings` values). */
  defaultSettings?: Record<string, unknown>;
  /**
   * How long a node's lease may go unrenewed before its `Ready` turns `Unknown` (default 6000 ms, so that the suites
   * see a killed node soon; Kubernetes' default is 40 s). A benchmark that loads the machine passes more: the test
   * kubelet's renewals then run late, and a short grace turns healthy nodes not ready.
   */
  nodeMonitorGracePeriodMs?: number;
}

/** A running cluster with the chart applied, and the reads the suites share. */
export class ChartCluster {
  private constructor(
    readonly cp: ControlPlane,
    readonly cluster: TestCluster,
    private readonly opts: ChartClusterOptions,
    /** The cluster's own log (pods started, exited, killed, links cut). */
    readonly log: string[],
  ) {}

  static async start(opts: ChartClusterOptions): Promise<ChartCluster> {
    const cp = await ControlPlane.start();
    let cc: ChartCluster | undefined;
    try {
      await installChartIdentity(cp, NS);
      // Longhorn's Replica CRD (Longhorn installs it, the chart does not): a schema-less stand-in.
      await installCrds(cp, [schemalessCrd({ group: 'longhorn.io', version: 'v1beta2', kind: 'Replica', plural: 'replicas', statusSubresource: true })]);
      const log: string[] = [];
      const cluster = await TestCluster.start({
        controlPlane: cp,
        nodes: opts.nodes.map((name) => ({ name })),
        images: { [CM_IMAGE]: { 'controller-manager': bins.cm }, [BIM_IMAGE]: { 'backing-image-manager': bins.bim, 'backing-image-data-source': bins.bids } },
        daemonSetNamespaces: [NS],
        nodeMonitorGracePeriodMs: opts.nodeMonitorGracePeriodMs ?? 6000,
        // The REST API deletes images in the foreground, as Longhorn does: the garbage collector finishes it.
        garbageCollect: [
          ...['backingimages', 'backingimagedatasources', 'backingimagemanagers', 'backupbackingimages', 'backuptargets'].map((r) => `/apis/longhorn.io/v1beta2/namespaces/${NS}/${r}`),
          `/api/v1/namespaces/${NS}/pods`,
        ],
        log: (l) => log.push(l),
      });
      cc = new ChartCluster(cp, cluster, opts, log);
      await cc.applyChart();
      return cc;
    } catch (err) {
      if (cc) await cc.stop().catch(() => undefined);
      else await cp.stop().catch(() => undefined);
      throw err;
    }
  }

  /** The chart rendered with `dataPath` and the default settings, applied; the nodes registered and Ready. */
  private async applyChart(): Promise<void> {
    const { cp, cluster, opts } = this;
    const objs: Obj[] = [];
    const values = {
      dataPath: DATA_PATH,
      defaultSettings: { backingImageCleanupWaitInterval: 1, backingImageRecoveryWaitInterval: 1, ...opts.defaultSettings },
      allowSourceHosts: opts.allowHostAddress ? [cluster.hostAddress] : [],
    };
    for (const text of (await renderChart(chartDir, values, { name: 'backing-image-system', namespace: NS })).values()) {
      for (const d of parseAllDocuments(text)) {
        const o = d.toJS() as Obj | null;
        if (o && ['ConfigMap', 'PriorityClass', 'Service', 'DaemonSet'].includes(o.kind)) objs.push(o);
      }
    }
    for (const o of objs) {
      if (o.kind === 'DaemonSet') {
        // What an operator adds: a shorter disk check interval, and the second disk's host path.
        const spec = (o as unknown as { spec: { template: { spec: { containers: { command: string[]; volumeMounts: unknown[] }[]; volumes: unknown[] } } } }).spec.template.spec;
        spec.containers[0]!.command.push('--disk-check-interval', '2');
        if (opts.secondDisk) {
          spec.containers[0]!.volumeMounts.push({ name: 'disk-2', mountPath: DISK2_PATH });
          spec.volumes.push({ name: 'disk-2', hostPath: { path: DISK2_PATH, type: 'DirectoryOrCreate' } });
        }
      }
      const plural = { ConfigMap: 'configmaps', PriorityClass: 'priorityclasses', Service: 'services', DaemonSet: 'daemonsets' }[o.kind]!;
      const base = o.kind === 'PriorityClass' ? '/apis/scheduling.k8s.io/v1' : o.kind === 'DaemonSet' ? `/apis/apps/v1/namespaces/${NS}` : `/api/v1/namespaces/${NS}`;
      await applyObject(cp, o, `${base}/${plural}/${o.metadata.name}`);
    }

    // Every node registered by its controller-manager, then (optionally) a second disk added to each.
    await eventually(async () => ((await this.lhNodes()).length === opts.nodes.length ? true : undefined), 120_000, `${opts.nodes.length} Longhorn Node records`, () => this.state(''));
    if (opts.secondDisk) {
      for (const n of opts.nodes) {
        await eventually(async () => {
          const node = await this.get<LhNode>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${n}`);
          const disks = { ...node.spec.disks, 'disk-2': { diskType: 'filesystem', path: DISK2_PATH, allowScheduling: true, evictionRequested: false, storageReserved: 0, tags: [] } };
          const res = await cp.request('PUT', `/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${n}`, { body: { ...node, spec: { ...node.spec, disks } } });
          if (res.status !== 200) throw new Error(`HTTP ${res.status} ${JSON.stringify(res.body)}`);
          return true;
        }, 30_000, `the second disk on ${n}`);
      }
    }
    const diskCount = opts.secondDisk ? 2 : 1;
    await eventually(async () => {
      const nodes = await this.lhNodes();
      const ok = nodes.every((n) => Object.values(n.status?.diskStatus ?? {}).filter((d) => d.diskUUID && d.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')).length === diskCount);
      return ok && nodes.every((n) => n.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')) ? true : undefined;
    }, 120_000, `every node Ready with ${diskCount} ready disk(s)`, async () => JSON.stringify((await this.lhNodes()).map((n) => [n.metadata.name, n.status])));
  }

  private readonly origins: http.Server[] = [];

  /**
   * An HTTP origin on the bridge address (reachable from every pod, nothing else; allowed as a download source with
   * `allowHostAddress`) serving `files` by path, e.g. `{ '/disk.raw': bytes }` or `{ '/big.raw': { file } }` (streamed
   * from that file, for images too big to hold in memory); stopped with the cluster. Returns its base URL.
   */
  async serveOrigin(files: Readonly<Record<string, Buffer | { file: string }>>): Promise<string> {
    const origin = http.createServer((req, res) => {
      const body = files[req.url ?? ''];
      if (!body) {
        res.writeHead(404).end();
        return;
      }
      if (Buffer.isBuffer(body)) {
        res.writeHead(200, { 'content-length': body.length, 'content-type': 'application/octet-stream' });
        res.end(body);
        return;
      }
      stat(body.file).then(
        (st) => {
          res.writeHead(200, { 'content-length': st.size, 'content-type': 'application/octet-stream' });
          pipeline(createReadStream(body.file, { highWaterMark: 1 << 20 }), res).catch(() => res.destroy());
        },
        (err: Error) => res.writeHead(500).end(err.message),
      );
    });
    this.origins.push(origin);
    await new Promise<void>((r) => origin.listen(0, this.cluster.hostAddress, () => r()));
    return `http://${this.cluster.hostAddress}:${(origin.address() as AddressInfo).port}`;
  }

  async stop(): Promise<void> {
    for (const o of this.origins) {
      o.closeAllConnections();
      await new Promise<void>((r) => o.close(() => r()));
    }
    const keep = process.env['BIS_CLUSTER_KEEP'] === '1';
    if (keep) console.warn(`cluster work dir kept: ${this.cluster.workDir}`);
    try {
      await this.cluster.stop({ keepWorkDir: keep });
    } finally {
      await this.cp.stop();
    }
  }

  async get<T>(p: string): Promise<T> {
    const res = await this.cp.request('GET', p);
    if (res.status !== 200) throw new Error(`GET ${p}: HTTP ${res.status}`);
    return res.body as T;
  }

  async lhNodes(): Promise<LhNode[]> {
    return (await this.get<{ items: LhNode[] }>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes`)).items;
  }

  bi(name: string): Promise<ClusterBI> {
    return this.get<ClusterBI>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/backingimages/${name}`);
  }

  /** diskUUID → { node, host path of the disk as this process sees it, disk name }. */
  async diskIndex(): Promise<Map<string, { node: string; dir: string; name: string }>> {
    const out = new Map<string, { node: string; dir: string; name: string }>();
    for (const n of await this.lhNodes()) {
      for (const [diskName, st] of Object.entries(n.status?.diskStatus ?? {})) {
        const p = n.spec.disks[diskName]?.path;
        if (st.diskUUID && p) out.set(st.diskUUID, { node: n.metadata.name, dir: this.cluster.node(n.metadata.name).hostPath(p), name: diskName });
      }
    }
    return out;
  }

  async readyCopies(name: string): Promise<ReadyCopy[]> {
    const b = await this.bi(name);
    const idx = await this.diskIndex();
    return Object.entries(b.status?.diskFileStatusMap ?? {})
      .filter(([, s]) => s.state === 'ready')
      .map(([disk]) => ({ disk, node: idx.get(disk)?.node ?? '?', file: path.join(idx.get(disk)?.dir ?? '/nonexistent', 'backing-images', `${name}-${b.status?.uuid ?? ''}`, 'backing') }));
  }

  /** The REST API of the controller-manager pod on `node`, once one is ready (up to 60 s). */
  daemonUrl(node: string): Promise<string> {
    return eventually(() => this.readyDaemonUrl(node), 60_000, `a ready controller-manager pod on ${node}`, () => this.state(''));
  }

  private async readyDaemonUrl(node: string): Promise<string> {
    const pods = (await this.get<{ items: { metadata: { name: string }; spec: { nodeName: string }; status: { podIP?: string; conditions?: { type: string; status: string }[] } }[] }>(`/api/v1/namespaces/${NS}/pods?labelSelector=app%3Dbacking-image-system-manager`)).items;
    const p = pods.find((x) => x.spec.nodeName === node && x.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'));
    if (!p?.status.podIP) throw new Error(`no ready controller-manager pod on ${node}`);
    return `http://${p.status.podIP}:9500`;
  }

  /** A REST call to the controller-manager on `node`; a status ≥ 300 throws with the body. */
  async rest(node: string, method: string, p: string, body?: unknown): Promise<Record<string, unknown>> {
    const res = await fetch(`${await this.daemonUrl(node)}${p}`, { method, headers: body === undefined ? {} : { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await res.text();
    if (res.status >= 300) throw new Error(`${method} ${p}: HTTP ${res.status} ${text}`);
    return text ? (JSON.parse(text) as Record<string, unknown>) : {};
  }

  /** What a failed wait prints: the image's copies, the pods, and the cluster log's tail. */
  async state(name: string): Promise<string> {
    const b = await this.bi(name).catch(() => undefined);
    const idx = await this.diskIndex().catch(() => new Map<string, { node: string; dir: string; name: string }>());
    const pods = (await this.get<{ items: { metadata: { name: string }; spec: { nodeName: string }; status: { phase: string } }[] }>(`/api/v1/namespaces/${NS}/pods`).catch(() => ({ items: [] }))).items;
    const copies = Object.entries(b?.status?.diskFileStatusMap ?? {}).map(([d, s]) => `${idx.get(d)?.node ?? '?'}/${d.slice(0, 8)}=${s.state}${s.message ? `(${s.message})` : ''}`);
    return `copies of ${name}: ${copies.join(', ') || 'none'}\npods: ${pods.map((p) => `${p.metadata.name}@${p.spec.nodeName}:${p.status.phase}`).join(', ')}\ncluster log tail:\n${this.log.slice(-15).join('\n')}`;
  }

  async patchNode(name: string, spec: Record<string, unknown>): Promise<void> {
    const res = await this.cp.request('PATCH', `/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${name}`, { body: { spec }, contentType: 'application/merge-patch+json' });
    if (res.status !== 200) throw new Error(`patch node ${name}: HTTP ${res.status} ${JSON.stringify(res.body)}`);
  }

  async nodeOfDisks(name: string): Promise<string[]> {
    const b = await this.bi(name);
    const idx = await this.diskIndex();
    return Object.keys(b.spec?.diskFileSpecMap ?? {}).map((d) => idx.get(d)?.node ?? '?');
  }

  async createImage(node: string, body: Record<string, unknown>): Promise<void> {
    await this.rest(node, 'POST', '/v1/backingimages', body);
  }
}
