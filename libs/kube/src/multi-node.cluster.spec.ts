import { createHash, randomBytes } from 'node:crypto';
import { existsSync, promises as fsp } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { renderChart } from './chart/render-chart.js';
import { applyObject, chartDir, installChartIdentity, repoRoot, type Obj } from './test-support/chart-rbac.js';
import { ControlPlane, envtestAssets, installCrds } from './testing/envtest.js';
import { TestCluster, clusterNetworkSupport } from './testing/cluster/index.js';

/**
 * The Kubernetes mode end to end on a multi-node cluster in network namespaces: a real kube-apiserver (envtest), the
 * chart's CRDs, RBAC, ConfigMap, PriorityClass, Service and DaemonSet applied, and `TestCluster` playing kubelets,
 * scheduler, DaemonSet and node lifecycle controllers on 3 nodes × 2 disks. Every process is one of our built apps:
 * `controller-manager daemon` (one DaemonSet pod per node, with its ServiceAccount token), the backing-image-manager
 * and data-source pods it creates, each pod in its own network and mount namespace.
 */
const NS = 'longhorn-system';
const CM_IMAGE = 'backing-image-system/controller-manager:0.1.0';
const BIM_IMAGE = 'backing-image-system/backing-image-manager:0.1.0';
const DATA_PATH = '/var/lib/longhorn/';
const DISK2_PATH = '/var/lib/longhorn-disk-2/';
const NODES = ['node-1', 'node-2', 'node-3'];
const bins = {
  cm: path.join(repoRoot, 'apps/controller-manager/bin/controller-manager.js'),
  bim: path.join(repoRoot, 'apps/backing-image-manager/bin/backing-image-manager.js'),
  bids: path.join(repoRoot, 'apps/backing-image-data-source/bin/backing-image-data-source.js'),
};
const builtDist = ['apps/controller-manager/dist/main.js', 'apps/backing-image-manager/dist/main.js', 'apps/backing-image-data-source/dist/main.js'];

function skipReason(): string | undefined {
  const assets = envtestAssets();
  if (!assets.dir) return assets.reason;
  const net = clusterNetworkSupport();
  if (!net.ok) return net.reason;
  const missing = builtDist.filter((f) => !existsSync(path.join(repoRoot, f)));
  if (missing.length) return `the apps are not built (${missing.join(', ')}): run npx nx run-many -t build first`;
  if (process.env['BIS_CLUSTER_TESTS'] !== '1') return 'BIS_CLUSTER_TESTS=1 is not set (the multi-node suite takes 2 to 10 minutes on a loaded 2-core machine)';
  return undefined;
}
const reason = skipReason();
if (reason) console.warn(`multi-node.cluster.spec.ts skipped: ${reason}`);
const describeCluster = reason ? describe.skip : describe;

type LhNode = { metadata: { name: string; resourceVersion: string }; spec: { disks: Record<string, { path: string; allowScheduling: boolean; tags?: string[] }>; tags?: string[] }; status?: { diskStatus?: Record<string, { diskUUID?: string; conditions?: { type: string; status: string }[] }>; conditions?: { type: string; status: string; reason?: string }[] } };
type BI = { metadata: { name: string }; status?: { uuid?: string; diskFileStatusMap?: Record<string, { state: string; progress?: number; message?: string }> }; spec?: { diskFileSpecMap?: Record<string, unknown> } };

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
async function eventually<T>(fn: () => Promise<T | undefined>, timeoutMs: number, what: string, detail?: () => Promise<string>): Promise<T> {
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

describeCluster('multi-node cluster in network namespaces: controller-manager daemon, managers and data sources as pods (3 nodes × 2 disks)', () => {
  let cp: ControlPlane | undefined;
  let cluster: TestCluster | undefined;
  let origin: http.Server | undefined;
  let originUrl = '';
  const image = Buffer.concat([randomBytes(3 << 20), Buffer.alloc(2 << 20), randomBytes(3 << 20)]);
  const checksum = createHash('sha512').update(image).digest('hex');
  const clusterLog: string[] = [];

  const get = async <T>(p: string): Promise<T> => {
    const res = await cp!.request('GET', p);
    if (res.status !== 200) throw new Error(`GET ${p}: HTTP ${res.status}`);
    return res.body as T;
  };
  const lhNodes = async (): Promise<LhNode[]> => (await get<{ items: LhNode[] }>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes`)).items;
  const bi = (name: string): Promise<BI> => get<BI>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/backingimages/${name}`);
  /** diskUUID → { node, host path of the disk as this process sees it }. */
  const diskIndex = async (): Promise<Map<string, { node: string; dir: string; name: string }>> => {
    const out = new Map<string, { node: string; dir: string; name: string }>();
    for (const n of await lhNodes()) {
      for (const [diskName, st] of Object.entries(n.status?.diskStatus ?? {})) {
        const p = n.spec.disks[diskName]?.path;
        if (st.diskUUID && p) out.set(st.diskUUID, { node: n.metadata.name, dir: cluster!.node(n.metadata.name).hostPath(p), name: diskName });
      }
    }
    return out;
  };
  const readyCopies = async (name: string): Promise<{ disk: string; node: string; file: string }[]> => {
    const b = await bi(name);
    const idx = await diskIndex();
    return Object.entries(b.status?.diskFileStatusMap ?? {})
      .filter(([, s]) => s.state === 'ready')
      .map(([disk]) => ({ disk, node: idx.get(disk)?.node ?? '?', file: path.join(idx.get(disk)?.dir ?? '/nonexistent', 'backing-images', `${name}-${b.status?.uuid ?? ''}`, 'backing') }));
  };
  const sha512File = async (file: string): Promise<string> => createHash('sha512').update(await fsp.readFile(file)).digest('hex');
  const daemonUrl = async (node: string): Promise<string> => {
    const pods = (await get<{ items: { metadata: { name: string }; spec: { nodeName: string }; status: { podIP?: string; conditions?: { type: string; status: string }[] } }[] }>(`/api/v1/namespaces/${NS}/pods?labelSelector=app%3Dbacking-image-system-manager`)).items;
    const p = pods.find((x) => x.spec.nodeName === node && x.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'));
    if (!p?.status.podIP) throw new Error(`no ready controller-manager pod on ${node}`);
    return `http://${p.status.podIP}:9500`;
  };
  const state = async (name: string): Promise<string> => {
    const b = await bi(name).catch(() => undefined);
    const idx = await diskIndex().catch(() => new Map<string, { node: string; dir: string; name: string }>());
    const pods = (await get<{ items: { metadata: { name: string }; spec: { nodeName: string }; status: { phase: string } }[] }>(`/api/v1/namespaces/${NS}/pods`).catch(() => ({ items: [] }))).items;
    const copies = Object.entries(b?.status?.diskFileStatusMap ?? {}).map(([d, s]) => `${idx.get(d)?.node ?? '?'}/${d.slice(0, 8)}=${s.state}${s.message ? `(${s.message})` : ''}`);
    return `copies of ${name}: ${copies.join(', ') || 'none'}\npods: ${pods.map((p) => `${p.metadata.name}@${p.spec.nodeName}:${p.status.phase}`).join(', ')}\ncluster log tail:\n${clusterLog.slice(-15).join('\n')}`;
  };
  const patchNode = async (name: string, spec: Record<string, unknown>): Promise<void> => {
    const res = await cp!.request('PATCH', `/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${name}`, { body: { spec }, contentType: 'application/merge-patch+json' });
    if (res.status !== 200) throw new Error(`patch node ${name}: HTTP ${res.status} ${JSON.stringify(res.body)}`);
  };
  const nodeOfDisks = async (name: string): Promise<string[]> => {
    const b = await bi(name);
    const idx = await diskIndex();
    return Object.keys(b.spec?.diskFileSpecMap ?? {}).map((d) => idx.get(d)?.node ?? '?');
  };
  const createImage = async (node: string, body: Record<string, unknown>): Promise<void> => {
    const res = await fetch(`${await daemonUrl(node)}/v1/backingimages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    if (res.status >= 300) throw new Error(`POST /v1/backingimages: HTTP ${res.status} ${await res.text()}`);
  };

  beforeAll(async () => {
    cp = await ControlPlane.start();
    await installChartIdentity(cp, NS);
    // Longhorn's Replica CRD (Longhorn installs it, the chart does not): a schema-less stand-in.
    await installCrds(cp, [
      {
        apiVersion: 'apiextensions.k8s.io/v1',
        kind: 'CustomResourceDefinition',
        metadata: { name: 'replicas.longhorn.io' },
        spec: {
          group: 'longhorn.io',
          scope: 'Namespaced',
          names: { plural: 'replicas', singular: 'replica', kind: 'Replica', listKind: 'ReplicaList' },
          versions: [{ name: 'v1beta2', served: true, storage: true, subresources: { status: {} }, schema: { openAPIV3Schema: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true } } }],
        },
      },
    ]);
    cluster = await TestCluster.start({
      controlPlane: cp,
      nodes: NODES.map((name) => ({ name })),
      images: { [CM_IMAGE]: { 'controller-manager': bins.cm }, [BIM_IMAGE]: { 'backing-image-manager': bins.bim, 'backing-image-data-source': bins.bids } },
      daemonSetNamespaces: [NS],
      nodeMonitorGracePeriodMs: 6000,
      log: (l) => clusterLog.push(l),
    });

    // The origin of the downloads, on the bridge address (reachable from every pod, nothing else).
    origin = http.createServer((req, res) => {
      if (req.url !== '/parrot.raw') {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { 'content-length': image.length, 'content-type': 'application/octet-stream' });
      res.end(image);
    });
    await new Promise<void>((r) => origin!.listen(0, cluster!.hostAddress, () => r()));
    originUrl = `http://${cluster.hostAddress}:${(origin.address() as AddressInfo).port}`;

    // The chart, rendered with its defaults and applied; the DaemonSet gets the origin as an allowed source host
    // (a private address) and the second disk's host path, as an operator adding a disk does.
    const objs: Obj[] = [];
    for (const text of (await renderChart(chartDir, { dataPath: DATA_PATH, defaultSettings: { backingImageCleanupWaitInterval: 1, backingImageRecoveryWaitInterval: 1 } }, { name: 'backing-image-system', namespace: NS })).values()) {
      for (const d of parseAllDocuments(text)) {
        const o = d.toJS() as Obj | null;
        if (o && ['ConfigMap', 'PriorityClass', 'Service', 'DaemonSet'].includes(o.kind)) objs.push(o);
      }
    }
    for (const o of objs) {
      if (o.kind === 'DaemonSet') {
        const spec = (o as unknown as { spec: { template: { spec: { containers: { command: string[]; volumeMounts: unknown[] }[]; volumes: unknown[] } } } }).spec.template.spec;
        spec.containers[0]!.command.push('--allow-source-hosts', cluster.hostAddress, '--disk-check-interval', '2');
        spec.containers[0]!.volumeMounts.push({ name: 'disk-2', mountPath: DISK2_PATH });
        spec.volumes.push({ name: 'disk-2', hostPath: { path: DISK2_PATH, type: 'DirectoryOrCreate' } });
      }
      const plural = { ConfigMap: 'configmaps', PriorityClass: 'priorityclasses', Service: 'services', DaemonSet: 'daemonsets' }[o.kind]!;
      const base = o.kind === 'PriorityClass' ? '/apis/scheduling.k8s.io/v1' : o.kind === 'DaemonSet' ? `/apis/apps/v1/namespaces/${NS}` : `/api/v1/namespaces/${NS}`;
      await applyObject(cp, o, `${base}/${plural}/${o.metadata.name}`);
    }

    // Every node registered by its controller-manager, then a second disk added to each.
    await eventually(async () => ((await lhNodes()).length === NODES.length ? true : undefined), 120_000, 'three Longhorn Node records', () => state(''));
    for (const n of NODES) {
      await eventually(async () => {
        const node = await get<LhNode>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${n}`);
        const disks = { ...node.spec.disks, 'disk-2': { diskType: 'filesystem', path: DISK2_PATH, allowScheduling: true, evictionRequested: false, storageReserved: 0, tags: [] } };
        const res = await cp!.request('PUT', `/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${n}`, { body: { ...node, spec: { ...node.spec, disks } } });
        if (res.status !== 200) throw new Error(`HTTP ${res.status} ${JSON.stringify(res.body)}`);
        return true;
      }, 30_000, `the second disk on ${n}`);
    }
    await eventually(async () => {
      const nodes = await lhNodes();
      const ok = nodes.every((n) => Object.values(n.status?.diskStatus ?? {}).filter((d) => d.diskUUID && d.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')).length === 2);
      return ok && nodes.every((n) => n.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')) ? true : undefined;
    }, 120_000, 'every node Ready with two ready disks', async () => JSON.stringify((await lhNodes()).map((n) => [n.metadata.name, n.status])));
  }, 300_000);

  afterAll(async () => {
    if (process.env['BIS_CLUSTER_KEEP'] === '1' && cluster) console.warn(`cluster work dir kept: ${cluster.workDir}`);
    try {
      await cluster?.stop({ keepWorkDir: process.env['BIS_CLUSTER_KEEP'] === '1' });
    } finally {
      origin?.closeAllConnections();
      await new Promise<void>((r) => (origin ? origin.close(() => r()) : r()));
      await cp?.stop();
    }
  }, 120_000);

  it('a downloaded image is synced across nodes to minNumberOfCopies (3) and every copy on disk has the checksum', async () => {
    await createImage('node-1', { name: 'parrot', sourceType: 'download', parameters: { url: `${originUrl}/parrot.raw` }, expectedChecksum: checksum, minNumberOfCopies: 3 });
    const copies = await eventually(async () => {
      const c = await readyCopies('parrot');
      return c.length >= 3 ? c : undefined;
    }, 180_000, 'three ready copies of parrot', () => state('parrot'));
    // Copies on more than one node: the manager pods fetched from each other across the bridge.
    expect(new Set(copies.map((c) => c.node)).size).toBeGreaterThanOrEqual(2);
    for (const c of copies) expect(await sha512File(c.file)).toBe(checksum);
    // Each copy lives in its node's own host directory: no node holds another node's disk.
    for (const c of copies) expect(c.file.startsWith(cluster!.node(c.node).root)).toBe(true);
  }, 240_000);

  it('a node selector (Longhorn node tags) keeps every copy on the matching node, its two disks', async () => {
    await patchNode('node-2', { tags: ['fast'] });
    await createImage('node-1', { name: 'selected', sourceType: 'download', parameters: { url: `${originUrl}/parrot.raw` }, expectedChecksum: checksum, minNumberOfCopies: 2, nodeSelector: ['fast'] });
    const copies = await eventually(async () => {
      const c = await readyCopies('selected');
      return c.length >= 2 ? c : undefined;
    }, 180_000, 'two ready copies of selected', () => state('selected'));
    expect(copies.map((c) => c.node)).toEqual(['node-2', 'node-2']);
    expect(new Set(copies.map((c) => c.disk)).size).toBe(2);
    for (const c of copies) expect(await sha512File(c.file)).toBe(checksum);
    // No copy was ever asked for elsewhere (the data source's disk included).
    expect(new Set(await nodeOfDisks('selected'))).toEqual(new Set(['node-2']));
  }, 240_000);

  it('a disk selector (Longhorn disk tags) keeps every copy on the tagged disks, across nodes', async () => {
    for (const n of ['node-1', 'node-3']) await patchNode(n, { disks: { 'disk-2': { tags: ['ssd'] } } });
    let copies: { disk: string; node: string; file: string }[];
    try {
      await createImage('node-1', { name: 'on-ssd', sourceType: 'download', parameters: { url: `${originUrl}/parrot.raw` }, expectedChecksum: checksum, minNumberOfCopies: 2, diskSelector: ['ssd'] });
      copies = await eventually(async () => {
        const c = await readyCopies('on-ssd');
        return c.length >= 2 ? c : undefined;
      }, 180_000, 'two ready copies of on-ssd', () => state('on-ssd'));
    } finally {
      // The tags go again: the scenarios below place untagged images on any disk.
      for (const n of ['node-1', 'node-3']) await patchNode(n, { disks: { 'disk-2': { tags: [] } } });
    }
    expect(new Set(copies.map((c) => c.node))).toEqual(new Set(['node-1', 'node-3']));
    for (const c of copies) expect(await sha512File(c.file)).toBe(checksum);
    const idx = await diskIndex();
    const specDisks = Object.keys((await bi('on-ssd')).spec?.diskFileSpecMap ?? {});
    expect(specDisks.map((d) => idx.get(d)?.name)).toEqual(specDisks.map(() => 'disk-2'));
  }, 240_000);

  it('evicting a node moves its copies to the other nodes, never below one ready copy; checksums hold', async () => {
    const before = await readyCopies('parrot');
    const victim = before.find((c) => c.node !== 'node-2')?.node ?? before[0]!.node;
    let minReady = before.length;
    let watching = true;
    const watcher = (async () => {
      while (watching) {
        minReady = Math.min(minReady, (await readyCopies('parrot').catch(() => before)).length);
        await sleep(200);
      }
    })();
    try {
      await patchNode(victim, { evictionRequested: true });
      const copies = await eventually(async () => {
        const nodes = await nodeOfDisks('parrot');
        const c = await readyCopies('parrot');
        // Off the victim in the spec and in the ready copies the status reports (the status follows the spec).
        return !nodes.includes(victim) && c.length >= 3 && c.every((x) => x.node !== victim) ? c : undefined;
      }, 180_000, `the copies of parrot off ${victim}`, () => state('parrot'));
      expect(copies.every((c) => c.node !== victim)).toBe(true);
      for (const c of copies) expect(await sha512File(c.file)).toBe(checksum);
    } finally {
      watching = false;
      await watcher;
      await patchNode(victim, { evictionRequested: false });
    }
    expect(minReady).toBeGreaterThanOrEqual(1);
  }, 240_000);

  it('cutting a node\'s link for 60 s, then restoring it: marked down, replenished elsewhere, back up, converged with no duplicate and no corrupt copy', async () => {
    const before = await readyCopies('parrot');
    const victim = before.map((c) => c.node).find((n) => n !== 'node-1')!;
    const nodeReady = async (status: string): Promise<true | undefined> => {
      const n = await get<LhNode>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${victim}`);
      return n.status?.conditions?.find((c) => c.type === 'Ready')?.status === status ? true : undefined;
    };
    await cluster!.cutLink(victim);
    const cutAt = Date.now();
    try {
      await eventually(() => nodeReady('False'), 60_000, `${victim} marked down while cut off`, () => state('parrot'));
      await eventually(async () => {
        const c = (await readyCopies('parrot')).filter((x) => x.node !== victim);
        return c.length >= 3 ? c : undefined;
      }, 120_000, `three ready copies of parrot off the cut ${victim}`, () => state('parrot'));
    } finally {
      // The cut lasts 60 s (the scenario), then the link comes back.
      await sleep(Math.max(0, 60_000 - (Date.now() - cutAt)));
      await cluster!.restoreLink(victim);
    }
    await eventually(() => nodeReady('True'), 90_000, `${victim} back up`, () => state('parrot'));
    const copies = await eventually(async () => {
      const c = await readyCopies('parrot');
      return c.length >= 3 ? c : undefined;
    }, 120_000, 'parrot converged', () => state('parrot'));
    for (const c of copies) expect(await sha512File(c.file)).toBe(checksum);
    // No duplicate: at most one directory of the image on any disk of any node.
    const b = await bi('parrot');
    for (const { dir } of (await diskIndex()).values()) {
      const entries = await fsp.readdir(path.join(dir, 'backing-images')).catch(() => [] as string[]);
      expect(entries.filter((e) => e.startsWith('parrot-')).length).toBeLessThanOrEqual(1);
      for (const e of entries.filter((x) => x.startsWith('parrot-'))) expect(e).toBe(`parrot-${b.status?.uuid}`);
    }
  }, 420_000);

  it('killing a node: the node-health monitor marks it down and the copies are replenished on the others', async () => {
    const before = await readyCopies('parrot');
    const victim = before.map((c) => c.node).find((n) => n !== 'node-1')!;
    await cluster!.killNode(victim);
    const down = await eventually(async () => {
      const n = await get<LhNode>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${victim}`);
      const r = n.status?.conditions?.find((c) => c.type === 'Ready');
      return r?.status === 'False' ? r : undefined;
    }, 60_000, `${victim} marked down`, () => state('parrot'));
    expect(down.reason).toBe('KubernetesNodeNotReady');
    const copies = await eventually(async () => {
      const c = (await readyCopies('parrot')).filter((x) => x.node !== victim);
      return c.length >= 3 ? c : undefined;
    }, 180_000, `three ready copies of parrot off the killed ${victim}`, () => state('parrot'));
    for (const c of copies) expect(await sha512File(c.file)).toBe(checksum);
    // The copies on the killed node are no longer counted as ready.
    expect((await readyCopies('parrot')).filter((x) => x.node === victim)).toEqual([]);
  }, 300_000);
});
