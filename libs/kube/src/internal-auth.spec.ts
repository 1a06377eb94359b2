import { backupTargetOperations } from '@bis/backupstore';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { SecretKind, SettingKind } from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { checkInternalCaller, generateToken } from '@bis/internal-auth';
import { ApiAccess, API_RESOURCE_USES, rbacRules } from './api-access.js';
import { ensureInternalTokenSecret, INTERNAL_TOKEN_SECRET } from './internal-token-secret.js';
import { ALLOW_UNAUTHENTICATED_INTERNAL_CALLS_SETTING, KubeDataPlane, podSettingsFromStore } from './kube-data-plane.js';
import { KubeDatastore, kubeConfigFor } from './kube-datastore.js';
import { NodeDiskReporter } from './node-disks.js';
import { INTERNAL_AUTH_MOUNT, INTERNAL_TOKEN_FILE, dataSourcePodManifest, managerPodManifest, type PodSettings } from './pod-manifests.js';
import { startManagerOnDisk } from './test-support/manager-on-disk.js';
import { KubeApiDouble, TestPodKind } from './testing/index.js';

const NS = 'longhorn-system';
const IMAGE = 'registry.example/backing-image-manager:v1';
const decode = (b64: string) => Buffer.from(b64, 'base64').toString('utf8');

describe('the internal token Secret (against the Kubernetes API double)', () => {
  let api: KubeApiDouble;
  beforeEach(async () => {
    api = await KubeApiDouble.start({ kinds: [SecretKind] });
  });
  afterEach(async () => {
    await api.stop();
  });

  it('is created once with a random token and reused afterwards', async () => {
    const kubeConfig = kubeConfigFor(api.url, api.token);
    const first = await ensureInternalTokenSecret({ kubeConfig, namespace: NS });
    expect(first.created).toBe(true);
    expect(first.token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const stored = await api.store.get(SecretKind, INTERNAL_TOKEN_SECRET, NS);
    expect(decode((stored as unknown as { data: Record<string, string> }).data.token)).toBe(first.token);
    expect((stored as unknown as { type: string }).type).toBe('Opaque');

    const again = await ensureInternalTokenSecret({ kubeConfig, namespace: NS });
    expect(again).toEqual({ token: first.token, created: false });
    expect(api.calls).toEqual([
      { verb: 'get', group: '', resource: 'secrets', namespace: NS, name: INTERNAL_TOKEN_SECRET },
      { verb: 'create', group: '', resource: 'secrets', namespace: NS },
      { verb: 'get', group: '', resource: 'secrets', namespace: NS, name: INTERNAL_TOKEN_SECRET },
    ]);
    // Every call is granted by the chart's Role (generated from API_RESOURCE_USES).
    const access = new ApiAccess();
    for (const c of api.calls) expect(access.allows(c.group, c.resource, c.verb)).toBe(true);
  });

  it('instances starting together agree on one token (one create wins, the others read it)', async () => {
    const kubeConfig = kubeConfigFor(api.url, api.token);
    const all = await Promise.all([1, 2, 3, 4, 5].map(() => ensureInternalTokenSecret({ kubeConfig, namespace: NS, name: 'race-token' })));
    expect(new Set(all.map((r) => r.token)).size).toBe(1);
    expect(all.filter((r) => r.created)).toHaveLength(1);
    expect(decode((await api.store.get(SecretKind, 'race-token', NS) as unknown as { data: Record<string, string> }).data.token)).toBe(all[0]!.token);
  });

  it('a Secret the user created is used as it is; a bad one is an error naming it, never showing its value', async () => {
    const kubeConfig = kubeConfigFor(api.url, api.token);
    const mine = generateToken();
    await api.store.create(SecretKind, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'mine', namespace: NS }, data: { token: Buffer.from(`${mine}\n`).toString('base64') } });
    expect(await ensureInternalTokenSecret({ kubeConfig, namespace: NS, name: 'mine' })).toEqual({ token: mine, created: false });
    await api.store.create(SecretKind, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'short', namespace: NS }, data: { token: Buffer.from('s3cr3t').toString('base64') } });
    const err = await ensureInternalTokenSecret({ kubeConfig, namespace: NS, name: 'short' }).catch((e: Error) => e);
    expect(String(err)).toContain('secret short in namespace longhorn-system: the token must have at least 16 characters');
    expect(String(err)).not.toContain('s3cr3t');
    await api.store.create(SecretKind, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'nokey', namespace: NS }, data: { other: 'eA==' } });
    await expect(ensureInternalTokenSecret({ kubeConfig, namespace: NS, name: 'nokey' })).rejects.toThrow('secret nokey in namespace longhorn-system has no key "token"');
  });

  it('RBAC: secrets in the namespace only, never listed or watched (create cannot be restricted by name)', () => {
    expect(API_RESOURCE_USES.filter((u) => u.resource === 'secrets').map((u) => [u.verbs, u.usedBy])).toEqual([
      [['get'], 'KubeSecretStore'],
      [['create'], 'ensureInternalTokenSecret'],
      [['create', 'update', 'delete'], 'KubePodRuntime'], // the data sources' credential Secrets
    ]);
    expect(rbacRules().filter((r) => r.resources.includes('secrets'))).toEqual([{ apiGroups: [''], resources: ['secrets'], verbs: ['get', 'create', 'update', 'delete'] }]);
    expect(rbacRules(undefined, 'cluster').some((r) => r.resources.includes('secrets'))).toBe(false);
    for (const verb of ['list', 'watch', 'patch'] as const) expect(new ApiAccess().allows('', 'secrets', verb)).toBe(false);
  });
});

describe('manager and data-source pods carry the internal token', () => {
  const base: PodSettings = { namespace: NS, serviceAccountName: 'sa' };
  const bim = { name: 'bim-1', uid: 'u1', image: IMAGE, nodeID: 'n1', diskUUID: 'd1', diskPath: '/var/lib/longhorn/' };
  const ds = { name: 'bi-1', uid: 'u2', image: IMAGE, nodeID: 'n1', diskUUID: 'd1', diskPath: '/var/lib/longhorn/', uuid: 'abc', sourceType: 'download', parameters: { url: 'https://example.com/x.img' }, checksum: '', credentials: {} };
  const volume = { name: 'internal-auth', secret: { secretName: INTERNAL_TOKEN_SECRET, items: [{ key: 'token', path: 'token' }], defaultMode: 0o400 } };
  const mount = { name: 'internal-auth', mountPath: INTERNAL_AUTH_MOUNT, readOnly: true };

  it('mounts the Secret read-only (0400) and passes --internal-token-file', () => {
    const s = { ...base, internalTokenSecret: INTERNAL_TOKEN_SECRET };
    for (const pod of [managerPodManifest(bim, s), dataSourcePodManifest(ds, s)]) {
      const c = pod.spec!.containers[0]!;
      expect(c.command!.slice(-2)).toEqual(['--internal-token-file', INTERNAL_TOKEN_FILE]);
      expect(c.command).not.toContain('--allow-unauthenticated-internal-calls');
      expect(c.volumeMounts).toContainEqual(mount);
      expect(pod.spec!.volumes).toContainEqual(volume);
      expect(volume.secret.defaultMode).toBe(256);
      // The token itself is never in the pod spec.
      expect(JSON.stringify(pod)).not.toMatch(/[A-Za-z0-9_-]{43}/);
    }
    expect(INTERNAL_TOKEN_FILE).toBe('/etc/backing-image-system/internal-auth/token');
  });

  it('adds --allow-unauthenticated-internal-calls with the opt-in, and nothing without a Secret', () => {
    const s = { ...base, internalTokenSecret: 'my-token', allowUnauthenticatedInternalCalls: true };
    for (const pod of [managerPodManifest(bim, s), dataSourcePodManifest(ds, s)]) {
      expect(pod.spec!.containers[0]!.command!.slice(-3)).toEqual(['--internal-token-file', INTERNAL_TOKEN_FILE, '--allow-unauthenticated-internal-calls']);
      expect(pod.spec!.volumes).toContainEqual({ ...volume, secret: { ...volume.secret, secretName: 'my-token' } });
    }
    for (const pod of [managerPodManifest(bim, base), dataSourcePodManifest(ds, base)]) {
      expect(pod.spec!.containers[0]!.command).not.toContain('--internal-token-file');
      expect(pod.spec!.volumes!.some((v) => v.secret)).toBe(false);
    }
  });

  it('passes the daemon\'s --allow-source-hosts to data-source pods only, and nothing without it', () => {
    const s = { ...base, allowSourceHosts: ['10.213.0.1', 'mirror.internal', '10.0.0.0/8'] };
    const cmd = dataSourcePodManifest(ds, s).spec!.containers[0]!.command!;
    expect(cmd[cmd.indexOf('--allow-source-hosts') + 1]).toBe('10.213.0.1,mirror.internal,10.0.0.0/8');
    expect(managerPodManifest(bim, s).spec!.containers[0]!.command).not.toContain('--allow-source-hosts');
    expect(dataSourcePodManifest(ds, base).spec!.containers[0]!.command).not.toContain('--allow-source-hosts');
  });
});

/** A data source's `GET /v1/file` on loopback, refusing callers as the data-source server does (`checkInternalCaller`). */
async function startDataSourceDouble(token: string): Promise<{ address: string; seen: (string | undefined)[]; close(): Promise<void> }> {
  const seen: (string | undefined)[] = [];
  const server = http.createServer((req, res) => {
    seen.push(req.headers.authorization);
    const d = checkInternalCaller({ token }, req.headers.authorization);
    res.setHeader('content-type', 'application/json');
    if (!d.ok) {
      res.statusCode = 401;
      res.end(JSON.stringify({ message: d.reason }));
      return;
    }
    res.end(JSON.stringify({ state: 'in-progress', size: 1024, progress: 50, currentChecksum: '', message: '' }));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { address: `127.0.0.1:${(server.address() as AddressInfo).port}`, seen, close: () => new Promise<void>((r) => server.close(() => r())) };
}

describe('KubeDataPlane sends the internal token (real servers on loopback)', () => {
  let api: KubeApiDouble;
  const token = generateToken();
  const cleanups: (() => Promise<void> | void)[] = [];
  beforeEach(async () => {
    api = await KubeApiDouble.start({ kinds: [SettingKind, SecretKind, TestPodKind] });
  });
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
    await api.stop();
  });
  const plane = (internalToken?: string) => {
    const dp = new KubeDataPlane({ backupTarget: backupTargetOperations, kubeConfig: kubeConfigFor(api.url, api.token), settings: { namespace: NS, serviceAccountName: 'sa', internalTokenSecret: INTERNAL_TOKEN_SECRET }, managerImage: IMAGE, internalToken });
    cleanups.push(() => dp.close());
    return dp;
  };

  it('to a manager requiring the token (gRPC metadata); without it or with another one the manager refuses', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'kube-auth-mgr-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const probeStore = new KubeDatastore({ kubeConfig: kubeConfigFor(api.url, api.token), defaultNamespace: NS });
    cleanups.push(() => probeStore.close());
    await new NodeDiskReporter({ store: probeStore, namespace: NS, nodeID: 'none', defaultDataPath: '' }).checkDisk(dir);
    const mgr = await startManagerOnDisk(dir, { token });
    cleanups.push(() => mgr.stop());
    const address = `127.0.0.1:${mgr.grpcPort}`;

    expect((await plane(token).managerClient(address).versionGet()).backingImageManagerApiVersion).toBeGreaterThan(0);
    expect(await plane(token).managerClient(address).list()).toBeDefined();
    await expect(plane().managerClient(address).versionGet()).rejects.toMatchObject({ code: 16 }); // UNAUTHENTICATED
    await expect(plane(generateToken()).managerClient(address).versionGet()).rejects.toMatchObject({ code: 16 });
  });

  it('to a data source requiring the token (HTTP authorization header)', async () => {
    const ds = await startDataSourceDouble(token);
    cleanups.push(() => ds.close());
    expect(await plane(token).dataSourceClient(ds.address).get()).toMatchObject({ state: 'in-progress', size: 1024, progress: 50 });
    await expect(plane().dataSourceClient(ds.address).get()).rejects.toThrow('HTTP 401');
    await expect(plane(generateToken()).dataSourceClient(ds.address).get()).rejects.toThrow('HTTP 401');
    expect(ds.seen).toEqual([`Bearer ${token}`, undefined, expect.stringMatching(/^Bearer /)]);
  });

  it('creates pods with the token mount; the allow-unauthenticated-internal-calls setting adds the opt-in flag', async () => {
    const store = new KubeDatastore({ kubeConfig: kubeConfigFor(api.url, api.token), defaultNamespace: NS });
    cleanups.push(() => store.close());
    const dp = new KubeDataPlane({ backupTarget: backupTargetOperations,
      kubeConfig: kubeConfigFor(api.url, api.token),
      settings: { namespace: NS, serviceAccountName: 'sa', internalTokenSecret: INTERNAL_TOKEN_SECRET },
      settingsProvider: podSettingsFromStore(store, NS),
      managerImage: IMAGE,
      internalToken: token,
    });
    cleanups.push(() => dp.close());
    const bim = (name: string) => ({ metadata: { name, namespace: NS, uid: `uid-${name}` }, spec: { image: IMAGE, nodeID: 'n1', diskUUID: 'd1', diskPath: '/var/lib/longhorn/' } }) as Parameters<KubeDataPlane['startManager']>[0];
    await dp.startManager(bim('bim-a'));
    const a = await api.store.get(TestPodKind, 'bim-a', NS);
    expect(a.spec.containers[0]!.command.slice(-2)).toEqual(['--internal-token-file', INTERNAL_TOKEN_FILE]);
    expect(a.spec.volumes).toContainEqual(expect.objectContaining({ name: 'internal-auth', secret: expect.objectContaining({ secretName: INTERNAL_TOKEN_SECRET, defaultMode: 0o400 }) }));
    await store.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: ALLOW_UNAUTHENTICATED_INTERNAL_CALLS_SETTING, namespace: NS }, value: 'true' });
    await dp.startManager(bim('bim-b'));
    expect((await api.store.get(TestPodKind, 'bim-b', NS)).spec.containers[0]!.command.slice(-1)).toEqual(['--allow-unauthenticated-internal-calls']);
  });
});
