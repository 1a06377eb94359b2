import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { ChartCluster, NS, clusterSkipReason, eventually, sha512File, sleep, type LhNode, type ReadyCopy } from './testing/chart-cluster.js';

/**
 * The Kubernetes mode end to end on a multi-node cluster in network namespaces (3 nodes × 2 disks): the chart applied
 * to a real kube-apiserver, `TestCluster` playing the kubelets (see `ChartCluster`).
 */
const NODES = ['node-1', 'node-2', 'node-3'];

function skipReason(): string | undefined {
  const r = clusterSkipReason();
  if (r) return r;
  if (process.env['BIS_CLUSTER_TESTS'] === '0') return 'BIS_CLUSTER_TESTS=0 turns the multi-node suite off (it takes 2.5 to 10 minutes on a loaded 2-core machine)';
  return undefined;
}
const reason = skipReason();
if (reason) console.warn(`multi-node.cluster.spec.ts skipped: ${reason}`);
const describeCluster = reason ? describe.skip : describe;

describeCluster('multi-node cluster in network namespaces: controller-manager daemon, managers and data sources as pods (3 nodes × 2 disks)', () => {
  let cc: ChartCluster | undefined;
  let originUrl = '';
  const image = Buffer.concat([randomBytes(3 << 20), Buffer.alloc(2 << 20), randomBytes(3 << 20)]);
  const checksum = createHash('sha512').update(image).digest('hex');

  const get = <T>(p: string): Promise<T> => cc!.get<T>(p);
  const bi = (name: string) => cc!.bi(name);
  const diskIndex = () => cc!.diskIndex();
  const readyCopies = (name: string) => cc!.readyCopies(name);
  /**
   * The ready copies (by the image's status) whose files are on their disks with the image's SHA-512. The status
   * follows the disks by a manager List (1 s, longer on a loaded machine), so a copy just removed may still be listed:
   * such a copy is left out (the caller waits). A listed file with another SHA-512 is corruption: an error, which
   * the caller's wait reports when it times out.
   */
  const readyOnDisk = async (name: string): Promise<ReadyCopy[]> => {
    const out: ReadyCopy[] = [];
    for (const c of await readyCopies(name)) {
      const sum = await sha512File(c.file).catch((err: NodeJS.ErrnoException) => {
        if (err.code === 'ENOENT') return undefined;
        throw err;
      });
      if (sum === undefined) continue;
      if (sum !== checksum) throw new Error(`the copy ${c.file} is listed ready but its SHA-512 is ${sum}, not the image's`);
      out.push(c);
    }
    return out;
  };
  const state = (name: string) => cc!.state(name);
  const patchNode = (name: string, spec: Record<string, unknown>) => cc!.patchNode(name, spec);
  const nodeOfDisks = (name: string) => cc!.nodeOfDisks(name);
  const createImage = (node: string, body: Record<string, unknown>) => cc!.createImage(node, body);

  beforeAll(async () => {
    // The origin of the downloads, on the bridge address (reachable from every pod, nothing else), allowed as a
    // download source through the chart's allowSourceHosts.
    cc = await ChartCluster.start({ nodes: NODES, secondDisk: true, allowHostAddress: true });
    originUrl = await cc.serveOrigin({ '/parrot.raw': image });
  }, 300_000);

  afterAll(async () => {
    await cc?.stop();
  }, 120_000);

  it('a downloaded image is synced across nodes to minNumberOfCopies (3) and every copy on disk has the checksum', async () => {
    await createImage('node-1', { name: 'parrot', sourceType: 'download', parameters: { url: `${originUrl}/parrot.raw` }, expectedChecksum: checksum, minNumberOfCopies: 3 });
    const copies = await eventually(async () => {
      const c = await readyOnDisk('parrot');
      return c.length >= 3 ? c : undefined;
    }, 180_000, 'three ready copies of parrot', () => state('parrot'));
    // Copies on more than one node: the manager pods fetched from each other across the bridge.
    expect(new Set(copies.map((c) => c.node)).size).toBeGreaterThanOrEqual(2);
    // Each copy lives in its node's own host directory: no node holds another node's disk.
    for (const c of copies) expect(c.file.startsWith(cc!.cluster.node(c.node).root)).toBe(true);
  }, 240_000);

  it('a node selector (Longhorn node tags) keeps every copy on the matching node, its two disks', async () => {
    await patchNode('node-2', { tags: ['fast'] });
    await createImage('node-1', { name: 'selected', sourceType: 'download', parameters: { url: `${originUrl}/parrot.raw` }, expectedChecksum: checksum, minNumberOfCopies: 2, nodeSelector: ['fast'] });
    const copies = await eventually(async () => {
      const c = await readyOnDisk('selected');
      return c.length >= 2 ? c : undefined;
    }, 180_000, 'two ready copies of selected', () => state('selected'));
    expect(copies.map((c) => c.node)).toEqual(['node-2', 'node-2']);
    expect(new Set(copies.map((c) => c.disk)).size).toBe(2);
    // No copy was ever asked for elsewhere (the data source's disk included).
    expect(new Set(await nodeOfDisks('selected'))).toEqual(new Set(['node-2']));
  }, 240_000);

  it('a disk selector (Longhorn disk tags) keeps every copy on the tagged disks, across nodes', async () => {
    for (const n of ['node-1', 'node-3']) await patchNode(n, { disks: { 'disk-2': { tags: ['ssd'] } } });
    let copies: { disk: string; node: string; file: string }[];
    try {
      await createImage('node-1', { name: 'on-ssd', sourceType: 'download', parameters: { url: `${originUrl}/parrot.raw` }, expectedChecksum: checksum, minNumberOfCopies: 2, diskSelector: ['ssd'] });
      copies = await eventually(async () => {
        const c = await readyOnDisk('on-ssd');
        return c.length >= 2 ? c : undefined;
      }, 180_000, 'two ready copies of on-ssd', () => state('on-ssd'));
    } finally {
      // The tags go again: the scenarios below place untagged images on any disk.
      for (const n of ['node-1', 'node-3']) await patchNode(n, { disks: { 'disk-2': { tags: [] } } });
    }
    expect(new Set(copies.map((c) => c.node))).toEqual(new Set(['node-1', 'node-3']));
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
        const c = await readyOnDisk('parrot');
        // Off the victim in the spec and in the ready copies the status reports (the status follows the spec).
        return !nodes.includes(victim) && c.length >= 3 && c.every((x) => x.node !== victim) ? c : undefined;
      }, 180_000, `the copies of parrot off ${victim}`, () => state('parrot'));
      expect(copies.every((c) => c.node !== victim)).toBe(true);
    } finally {
      watching = false;
      await watcher;
      await patchNode(victim, { evictionRequested: false });
    }
    expect(minReady).toBeGreaterThanOrEqual(1);
  }, 240_000);

  it('cutting a node\'s link for 60 s, then restoring it: marked down, replenished elsewhere, back up, converged with no duplicate and no corrupt copy', async () => {
    const before = await readyCopies('parrot');
    const victim = before.map((c) => c.node).find((n) => n !== 'node-1');
    if (!victim) throw new Error(`the scenario needs a ready copy on a node other than node-1 (whose controller-manager the test talks to)\n${await state('parrot')}`);
    const nodeReady = async (status: string): Promise<true | undefined> => {
      const n = await get<LhNode>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${victim}`);
      return n.status?.conditions?.find((c) => c.type === 'Ready')?.status === status ? true : undefined;
    };
    await cc!.cluster.cutLink(victim);
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
      await cc!.cluster.restoreLink(victim);
    }
    await eventually(() => nodeReady('True'), 90_000, `${victim} back up`, () => state('parrot'));
    const copies = await eventually(async () => {
      const c = await readyOnDisk('parrot');
      return c.length >= 3 ? c : undefined;
    }, 120_000, 'parrot converged', () => state('parrot'));
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
    const victim = before.map((c) => c.node).find((n) => n !== 'node-1');
    if (!victim) throw new Error(`the scenario needs a ready copy on a node other than node-1 (whose controller-manager the test talks to)\n${await state('parrot')}`);
    await cc!.cluster.killNode(victim);
    const down = await eventually(async () => {
      const n = await get<LhNode>(`/apis/longhorn.io/v1beta2/namespaces/${NS}/nodes/${victim}`);
      const r = n.status?.conditions?.find((c) => c.type === 'Ready');
      return r?.status === 'False' ? r : undefined;
    }, 60_000, `${victim} marked down`, () => state('parrot'));
    expect(down.reason).toBe('KubernetesNodeNotReady');
    const copies = await eventually(async () => {
      const c = (await readyOnDisk('parrot')).filter((x) => x.node !== victim);
      return c.length >= 3 ? c : undefined;
    }, 180_000, `three ready copies of parrot off the killed ${victim}`, () => state('parrot'));
    // The copies on the killed node are no longer counted as ready (the image's status follows the managers'
    // state, which follows the node's: a few seconds, more on a loaded machine).
    await eventually(async () => ((await readyCopies('parrot')).some((x) => x.node === victim) ? undefined : true), 60_000, `no ready copy of parrot counted on the killed ${victim}`, () => state('parrot'));
  }, 300_000);
});
