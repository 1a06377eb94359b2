import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import Fastify, { type FastifyInstance } from 'fastify';
import { EmbeddedDatastore, type Stored } from '@bis/datastore';
import { ManagerClient } from '@bis/bimrpc';
import {
  Annotation,
  BackingImageDataSourceKind,
  BackingImageKind,
  BackingImageManagerKind,
  BackupTargetKind,
  NodeKind,
  SettingsReader,
  backingImageManagerName,
  type BackingImage,
  type BackingImageDataSource,
  type StoredBI,
} from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { ApiRegistry, restApiPlugin, SettingsService, settingsResource } from '@bis/rest-api';
import { annotationEndpoints, type BackingImageApiDeps, type TransferObserver } from '../deps.js';
import { backingImageHttpPlugin, registerBackingImageResources, type BackingImageApi } from '../register.js';

export const NS = 'longhorn-system';
export const MANAGER_IMAGE = 'longhornio/backing-image-manager:bis';

export interface Harness {
  dir: string;
  store: EmbeddedDatastore;
  app: FastifyInstance;
  api: BackingImageApi;
  /** `http://127.0.0.1:<port>` */
  url: string;
  events: string[];
  close(): Promise<void>;
}

/** A real embedded datastore in a temp dir and a real fastify server on loopback serving the REST API. */
export async function startHarness(extra: Partial<BackingImageApiDeps> = {}): Promise<Harness> {
  const dir = await mkdtemp(path.join(tmpdir(), 'api-resources-'));
  const store = await EmbeddedDatastore.open({ dataDir: path.join(dir, 'store') });
  const clients = new Map<string, ManagerClient>();
  const events: string[] = [];
  const observer: TransferObserver = {
    transferStarted: (kind, bi) => events.push(`start ${kind} ${bi}`),
    transferFinished: (kind, bi, result, bytes) => events.push(`end ${kind} ${bi} ${result} ${bytes}`),
  };
  const deps: BackingImageApiDeps = {
    store,
    namespace: NS,
    settings: new SettingsReader(store, NS, { 'default-backing-image-manager-image': MANAGER_IMAGE }),
    endpoints: annotationEndpoints((address) => {
      let c = clients.get(address);
      if (!c) clients.set(address, (c = new ManagerClient(address, { callTimeoutMs: 5000 })));
      return c;
    }),
    observer,
    ...extra,
  };
  const registry = new ApiRegistry();
  registry.addResource(settingsResource(new SettingsService({ store, namespace: NS })));
  const api = registerBackingImageResources(registry, deps);
  const app = Fastify({ forceCloseConnections: true });
  await app.register(backingImageHttpPlugin, { api });
  await app.register(restApiPlugin, { registry, keepAliveMs: 60_000, defaultStreamPeriodMs: 50 });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  return {
    dir,
    store,
    app,
    api,
    url,
    events,
    close: async () => {
      await app.close();
      for (const c of clients.values()) c.close();
      await store.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** JSON request against the harness. */
export async function call(h: Harness, method: string, p: string, body?: unknown): Promise<{ status: number; json: any; text: string; headers: Headers }> {
  const res = await fetch(`${h.url}${p}`, {
    method,
    // What Longhorn's Python client sends: `Accept: application/json` and a JSON body without a Content-Type (a
    // Buffer body makes fetch add none).
    headers: { accept: 'application/json' },
    body: body === undefined ? undefined : Buffer.from(JSON.stringify(body)),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text, headers: res.headers };
}

/** Writes the status of a backing image as the controllers would (disk → state). */
export async function setDiskStates(h: Harness, name: string, states: Record<string, string>, extra: Partial<NonNullable<BackingImage['status']>> = {}): Promise<StoredBI> {
  const bi = await h.store.get(BackingImageKind, name, NS);
  const diskFileSpecMap: Record<string, { evictionRequested: boolean; dataEngine: 'v1' }> = {};
  const diskFileStatusMap: Record<string, { dataEngine: 'v1'; state: any; progress: number; message: string; lastStateTransitionTime: string }> = {};
  for (const [disk, state] of Object.entries(states)) {
    diskFileSpecMap[disk] = { evictionRequested: false, dataEngine: 'v1' };
    if (state !== '-') diskFileStatusMap[disk] = { dataEngine: 'v1', state, progress: state === 'ready' ? 100 : 0, message: '', lastStateTransitionTime: '2026-11-22T10:00:00Z' };
  }
  const updated = await h.store.update(BackingImageKind, { ...bi, spec: { ...bi.spec, diskFileSpecMap } });
  return h.store.updateStatus(BackingImageKind, { ...updated, status: { ...(updated.status ?? {}), uuid: 'abcd1234', diskFileStatusMap, ...extra } });
}

/** A BIDS record as the data-source controller keeps it. */
export async function putDataSource(h: Harness, name: string, state: string, address: string, spec: Partial<NonNullable<BackingImageDataSource['spec']>> = {}): Promise<void> {
  const obj: BackingImageDataSource = {
    apiVersion: LONGHORN_API_VERSION,
    kind: 'BackingImageDataSource',
    metadata: { name, namespace: NS, annotations: { [Annotation.Address]: address } },
    spec: { nodeID: 'node-1', diskUUID: 'disk-a', diskPath: '/data', uuid: 'abcd1234', sourceType: 'upload', parameters: {}, fileTransferred: false, checksum: '', ...spec },
  };
  let cur: Stored<BackingImageDataSource>;
  try {
    cur = await h.store.get(BackingImageDataSourceKind, name, NS);
    cur = await h.store.update(BackingImageDataSourceKind, { ...cur, metadata: { ...cur.metadata, annotations: obj.metadata.annotations }, spec: obj.spec });
  } catch {
    cur = await h.store.create(BackingImageDataSourceKind, obj);
  }
  await h.store.updateStatus(BackingImageDataSourceKind, { ...cur, status: { currentState: state as any, ip: '127.0.0.1', size: 0, progress: 0, checksum: '', message: '', runningParameters: {}, storageIP: '127.0.0.1', ownerID: 'node-1' } });
}

export async function putManager(h: Harness, diskUUID: string, address: string, image = MANAGER_IMAGE): Promise<void> {
  await h.store.create(BackingImageManagerKind, {
    apiVersion: LONGHORN_API_VERSION,
    kind: 'BackingImageManager',
    metadata: { name: backingImageManagerName(image, diskUUID), namespace: NS, labels: { 'longhorn.io/disk-uuid': diskUUID, 'longhorn.io/node': 'node-1' }, annotations: { [Annotation.Address]: address } },
    spec: { image, nodeID: 'node-1', diskUUID, diskPath: '/data', backingImages: {} },
  });
}

export async function putBackupTarget(h: Harness, name: string, available: boolean, url = 's3://bucket@us-east-1/'): Promise<void> {
  const t = await h.store.create(BackupTargetKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackupTarget', metadata: { name, namespace: NS }, spec: { backupTargetURL: url, credentialSecret: '', pollInterval: '5m0s' } });
  await h.store.updateStatus(BackupTargetKind, { ...t, status: { available, ownerID: 'node-1' } });
}

export async function putNode(h: Harness, name: string, disks: Record<string, { path: string; uuid: string; allowScheduling?: boolean; tags?: string[] }>): Promise<void> {
  const spec: Record<string, any> = {};
  const diskStatus: Record<string, any> = {};
  for (const [dn, d] of Object.entries(disks)) {
    spec[dn] = { path: d.path, allowScheduling: d.allowScheduling ?? true, evictionRequested: false, storageReserved: 0, tags: d.tags ?? [], diskType: 'filesystem' };
    diskStatus[dn] = { diskUUID: d.uuid, storageAvailable: 100, storageMaximum: 200, storageScheduled: 0, conditions: [] };
  }
  const n = await h.store.create(NodeKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Node', metadata: { name, namespace: NS }, spec: { name, disks: spec, allowScheduling: true, evictionRequested: false, tags: [] } });
  await h.store.updateStatus(NodeKind, { ...n, status: { diskStatus, conditions: [], region: '', zone: '', autoEvicting: false } });
}

export const SHA = (c: string): string => c.repeat(128);
