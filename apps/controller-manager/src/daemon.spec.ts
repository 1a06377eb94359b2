import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { BackingImageManagerKind, EventKind, NodeKind, SecretKind, backingImageManagerName } from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { eventually } from '@bis/datastore/testing';
import { CONTROLLER_KINDS, KubeApiDouble, TestKubeNodeKind, TestPodKind } from '@bis/kube/testing';
import { runDaemonCli } from './daemon.js';

const APP = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = path.join(APP, 'bin', 'controller-manager.js');
const NS = 'bis-test';
const IMAGE = 'registry.example/backing-image-manager:v2';

describe('controller-manager daemon: usage', () => {
  it('refuses other datastores and missing flags with exit code 2', async () => {
    const err: string[] = [];
    const io = { out: () => undefined, err: (l: string) => err.push(l) };
    expect(await runDaemonCli(['--datastore', 'embedded', '--node-id', 'n', '--backing-image-manager-image', 'i'], io)).toBe(2);
    expect(await runDaemonCli(['--node-id', 'n'], io)).toBe(2);
    expect(await runDaemonCli(['--node-id', 'n', '--backing-image-manager-image', 'i', '--log-format', 'xml'], io)).toBe(2);
    expect(await runDaemonCli(['--node-id', 'n', '--backing-image-manager-image', 'i', '--internal-token-secret', 'Not_A_Name'], io)).toBe(2);
    const text = err.join('\n');
    expect(text).toContain('invalid --internal-token-secret "Not_A_Name"');
    expect(text).toContain('unsupported --datastore "embedded"');
    expect(text).toContain('--backing-image-manager-image is required');
    expect(text).toContain('invalid --log-format "xml"');
  });
});

/**
 * What the kubelet and the DaemonSet provide on a real cluster: a ready Kubernetes Node and a running, ready
 * controller-manager pod on it (the daemon's node-health monitor marks a Longhorn node down without them).
 */
async function healthyKubernetesNode(api: KubeApiDouble, node: string): Promise<void> {
  const kn = await api.store.create(TestKubeNodeKind, { apiVersion: 'v1', kind: 'Node', metadata: { name: node } });
  await api.store.updateStatus(TestKubeNodeKind, { ...kn, status: { conditions: [{ type: 'Ready', status: 'True', reason: 'KubeletReady', message: '' }] } });
  const name = `backing-image-system-manager-${node}`;
  const pod = await api.store.create(TestPodKind, {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: NS, labels: { app: 'backing-image-system-manager' } },
    spec: { nodeName: node, containers: [{ name: 'backing-image-system-manager', image: 'cm', command: ['controller-manager'] }] },
  });
  await api.store.updateStatus(TestPodKind, { ...pod, status: { phase: 'Running', podIP: '10.0.0.1', containerStatuses: [{ name: 'backing-image-system-manager', ready: true }] } });
}

describe('controller-manager daemon as a process against the API double', () => {
  let api: KubeApiDouble;
  let dir: string;
  let child: ChildProcess | undefined;
  let stdout = '';
  let stderr = '';

  beforeAll(async () => {
    await stat(path.join(APP, 'dist', 'main.js')); // built by the test target's dependencies
    api = await KubeApiDouble.start({ kinds: CONTROLLER_KINDS });
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-cm-daemon-'));
  });
  afterAll(async () => {
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await new Promise((r) => child!.once('exit', r));
    }
    await api.stop();
    await rm(dir, { recursive: true, force: true });
  });

  it("takes this node's objects only, reports its disk, creates a manager pod and answers REST", async () => {
    // Another node with a manager of its own: the daemon of node-1 must leave both alone.
    const store = api.store;
    await healthyKubernetesNode(api, 'node-1');
    await healthyKubernetesNode(api, 'node-2');
    const n2 = await store.create(NodeKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'Node',
      metadata: { name: 'node-2', namespace: NS },
      spec: { name: 'node-2', disks: { d2: { diskType: 'filesystem', diskDriver: '', path: '/var/lib/longhorn/', allowScheduling: true, evictionRequested: false, storageReserved: 0, tags: [] } }, allowScheduling: true, evictionRequested: false, tags: [], instanceManagerCPURequest: 0 },
    });
    const ready = { type: 'Ready', status: 'True', reason: '', message: '', lastProbeTime: '', lastTransitionTime: '' };
    const n2Saved = await store.updateStatus(NodeKind, { ...n2, status: { conditions: [ready], diskStatus: { d2: { diskUUID: 'uuid-of-node-2', conditions: [ready] } } } });
    const bim2 = await store.create(BackingImageManagerKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImageManager',
      metadata: { name: backingImageManagerName(IMAGE, 'uuid-of-node-2'), namespace: NS },
      spec: { image: IMAGE, nodeID: 'node-2', diskUUID: 'uuid-of-node-2', diskPath: '/var/lib/longhorn/', backingImages: {} },
    });

    const dataPath = path.join(dir, 'data');
    const kubeconfig = path.join(dir, 'kubeconfig');
    await writeFile(
      kubeconfig,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'double', cluster: { server: api.url, 'insecure-skip-tls-verify': true } }],
        users: [{ name: 'double', user: { token: api.token } }],
        contexts: [{ name: 'double', context: { cluster: 'double', user: 'double' } }],
        'current-context': 'double',
      }),
    );
    const settingsFile = path.join(dir, 'default-setting.yaml');
    await writeFile(settingsFile, `default-data-path: "${dataPath}"\nbacking-image-cleanup-wait-interval: "30"\n`);
    child = spawn(process.execPath, [
      BIN, 'daemon', '--datastore', 'kubernetes', '--namespace', NS, '--node-id', 'node-1', '--listen', '127.0.0.1:0',
      '--backing-image-manager-image', IMAGE, '--service-account', 'bis-sa', '--default-settings', settingsFile,
      '--log-format', 'json', '--kubeconfig', kubeconfig, '--disk-check-interval', '1', '--allow-source-hosts', '127.0.0.1',
    ], { stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout!.on('data', (b: Buffer) => (stdout += b.toString()));
    child.stderr!.on('data', (b: Buffer) => (stderr += b.toString()));
    const url = await eventually(() => /REST API (http:\/\/\S+)\/v1/.exec(stdout)?.[1], 20_000, `daemon start (stderr: ${stderr})`);

    // Its own Node record with the default disk, longhorn-disk.cfg on it, the disk reported ready.
    const node1 = await eventually(async () => {
      const n = await store.get(NodeKind, 'node-1', NS).catch(() => undefined);
      return n && Object.values(n.status?.diskStatus ?? {})[0]?.diskUUID ? n : undefined;
    }, 10_000, 'node-1 disk status');
    const d1 = Object.values(node1.status!.diskStatus!)[0]!;
    expect(d1.diskPath).toBe(dataPath);
    expect(JSON.parse(await readFile(path.join(dataPath, 'longhorn-disk.cfg'), 'utf8'))).toEqual({ diskUUID: d1.diskUUID });
    expect(d1.conditions?.find((c) => c.type === 'Ready')?.status).toBe('True');

    // A manager for node-1's disk gets a pod pinned to node-1.
    const bim1 = await store.create(BackingImageManagerKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImageManager',
      metadata: { name: backingImageManagerName(IMAGE, d1.diskUUID!), namespace: NS },
      spec: { image: IMAGE, nodeID: 'node-1', diskUUID: d1.diskUUID!, diskPath: dataPath, backingImages: {} },
    });
    const pod = await eventually(() => store.get(TestPodKind, bim1.metadata.name, NS).catch(() => undefined), 10_000, 'manager pod');
    expect(pod.spec.nodeName).toBe('node-1');
    expect(pod.spec.containers[0]!.image).toBe(IMAGE);
    expect((pod.spec as { serviceAccountName?: string }).serviceAccountName).toBe('bis-sa');
    // The internal token: the Secret the daemon created at start, mounted into the pod, passed by file.
    const secret = (await store.get(SecretKind, 'backing-image-system-internal-token', NS)) as unknown as { data: { token: string } };
    expect(Buffer.from(secret.data.token, 'base64').toString()).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(pod.spec.containers[0]!.command.slice(-2)).toEqual(['--internal-token-file', '/etc/backing-image-system/internal-auth/token']);
    expect(pod.spec.volumes).toContainEqual(expect.objectContaining({ name: 'internal-auth', secret: expect.objectContaining({ secretName: 'backing-image-system-internal-token', defaultMode: 0o400 }) }));
    expect(stderr).toContain('internal token created in secret backing-image-system-internal-token');
    expect(stderr).not.toContain(Buffer.from(secret.data.token, 'base64').toString());
    await eventually(async () => (await store.get(BackingImageManagerKind, bim1.metadata.name, NS)).status?.ownerID === 'node-1', 10_000, 'BIM owned by node-1');

    // The REST API answers on --listen, with the settings from the default-settings file and the image flag.
    const res = await fetch(`${url}/v1/settings`);
    expect(res.status).toBe(200);
    const body = JSON.stringify(await res.json());
    expect(body).toContain(IMAGE);
    const wait = await fetch(`${url}/v1/settings/backing-image-cleanup-wait-interval`);
    expect(((await wait.json()) as { value?: string }).value).toBe('30');
    expect((await fetch(`${url}/v1/backingimages`)).status).toBe(200);

    // The download URL policy applies at create time, as in standalone: a private address is refused at once, a
    // loopback host named in --allow-source-hosts is accepted.
    const createImage = (name: string, u: string) =>
      fetch(`${url}/v1/backingimages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ name, sourceType: 'download', parameters: { url: u }, minNumberOfCopies: 1 }) });
    const refused = await createImage('private', 'http://10.1.2.3/x.img');
    // Longhorn's REST answers a webhook denial on create with 500 and the wrapped admission message.
    expect(refused.status).toBe(500);
    expect(await refused.text()).toContain('denied the request: spec.sourceParameters[url]: download URL is not an allowed source host: refusing to connect to 10.1.2.3: private addresses are not allowed');
    expect((await createImage('allowed', 'http://127.0.0.1:1/x.img')).status).toBe(200);
    // What the controllers did shows as Kubernetes Events (core/v1) on the image, and at /v1/events.
    const evs = await eventually(async () => {
      const r = (await (await fetch(`${url}/v1/events?kind=BackingImage&name=allowed`)).json()) as { data: { reason: string; involvedObjectName: string }[] };
      return r.data.some((e) => e.reason === 'Create') ? r.data : undefined;
    }, 15_000, 'the Create event of the image');
    expect(evs.every((e) => e.involvedObjectName === 'allowed')).toBe(true);
    expect((await store.list(EventKind, { namespace: NS })).items.some((e) => e.involvedObject.name === 'allowed' && e.reason === 'Create')).toBe(true);
    // GET /metrics on the REST port (the chart's ServiceMonitor scrapes port "manager", path /metrics).
    const metrics = await eventually(async () => {
      const r = await fetch(`${url}/metrics`);
      const t = r.status === 200 ? await r.text() : '';
      return /^workqueue_adds_total\{name="BackingImageManagerController"\} [1-9]/m.test(t) ? { type: r.headers.get('content-type'), t } : undefined;
    }, 10_000, 'manager controller adds in /metrics');
    expect(metrics.type).toContain('text/plain');
    expect(metrics.t).toMatch(/^process_cpu_user_seconds_total \d/m);
    expect(metrics.t).toMatch(/^# TYPE bis_backing_image_transferred_bytes_total counter$/m);

    // node-2's objects are left alone.
    const bim2Now = await store.get(BackingImageManagerKind, bim2.metadata.name, NS);
    expect(bim2Now.status?.ownerID ?? '').toBe('');
    expect(await store.get(TestPodKind, bim2.metadata.name, NS).catch(() => undefined)).toBeUndefined();
    const n2Now = await store.get(NodeKind, 'node-2', NS);
    expect(n2Now.metadata.resourceVersion).toBe(n2Saved.metadata.resourceVersion); // node-2's record is never written
    expect(n2Now.status?.diskStatus?.['d2']?.diskUUID).toBe('uuid-of-node-2');

    // The node-health monitor runs: node-2's Kubernetes node goes away, so its Longhorn node is marked down.
    await store.delete(TestKubeNodeKind, 'node-2');
    await eventually(async () => {
      const c = (await store.get(NodeKind, 'node-2', NS)).status?.conditions?.find((x) => x.type === 'Ready');
      return c?.status === 'False' && c.reason === 'KubernetesNodeGone' ? c : undefined;
    }, 15_000, 'node-2 marked KubernetesNodeGone');

    child.kill('SIGTERM');
    const code = await new Promise<number | null>((r) => child!.once('exit', (c) => r(c)));
    expect(code).toBe(0);
    // Its log: one JSON object per line with level, time, component and its node.
    const lines = stderr.split('\n').filter((l) => l.trim());
    expect(lines.length).toBeGreaterThan(0);
    for (const l of lines) {
      const o = JSON.parse(l) as Record<string, unknown>;
      expect(o).toMatchObject({ component: 'controller-manager', node: 'node-1' });
      expect(['debug', 'info', 'warn', 'error']).toContain(o['level']);
      expect(new Date(String(o['time'])).toISOString()).toBe(o['time']);
      expect(typeof o['msg']).toBe('string');
    }
    expect(stderr).toMatch(/"level":"info"/);
  }, 60_000);
});
