import { backupTargetOperations } from '@bis/backupstore';
import { parseHostPort } from '@bis/net-address';
import { randomUUID } from 'node:crypto';
import { mkdir, readFile, stat, statfs, writeFile } from 'node:fs/promises';
import path from 'node:path';
import Fastify, { type FastifyInstance } from 'fastify';
import {
  ControllerManager,
  DATA_SOURCE_MALLOC_ENV,
  DISK_HEALTHY_CONDITION,
  ensureDefaultBackupTarget,
  EventKind,
  EventLogRecorder,
  NodeKind,
  recordedEventOf,
  type EventSink,
  SettingName,
  SettingsReader,
  type ControllerManagerOptions,
  type Logger,
  type Node,
} from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { EmbeddedDatastore, isConflict, isNotFound, type Stored } from '@bis/datastore';
import {
  annotationEndpoints,
  backingImageHttpPlugin,
  downloadUrlPolicyFor,
  eventResource,
  registerBackingImageResources,
  SecretService,
  secretResource,
  type BackingImageApi,
} from '@bis/api-resources';
import { ensureTokenFile } from '@bis/internal-auth';
import { ApiRegistry, controllersHealthCheck, isLoopbackHost, registerHealthz, restApiPlugin, restAuthHook, settingsResource, SettingsService, storeHealthCheck } from '@bis/rest-api';
import { ActivityObserver, BackingImageMetrics, metricsPlugin } from '@bis/metrics';
import { endRecordedProcesses, LocalProcessRuntime } from '@bis/runtime';
import { uiServerPlugin } from '@bis/ui-server';
import { ProcessDataPlane, type DataPlaneBinaries } from './process-data-plane.js';
import { DataSourceHosts } from './data-source-hosts.js';
import { PortReservations } from './ports.js';

/** Data sources per shared host process by default. */
export const DEFAULT_DATA_SOURCES_PER_PROCESS = 8;

export const STANDALONE_NAMESPACE = 'longhorn-system';
export const STANDALONE_NODE = 'local';
/** The manager "image" of the local processes; recorded in the default-backing-image-manager-image setting. */
export const STANDALONE_MANAGER_IMAGE = 'bis/backing-image-manager:local';

export interface StandaloneDisk {
  name: string;
  uuid: string;
  path: string;
}

/** Everything that runs, for the REST resources a caller registers. */
export interface StandaloneSystem {
  store: EmbeddedDatastore;
  controllers: ControllerManager;
  dataPlane: ProcessDataPlane;
  settings: SettingsService;
  /** Events kept in the store (bounded), served at `/v1/events`. */
  events: EventSink;
  namespace: string;
  disks: StandaloneDisk[];
  /** What `GET /metrics` serves. */
  metrics: BackingImageMetrics;
}

export interface StandaloneOptions {
  dataDir: string;
  /** `host:port` of the REST API (default 127.0.0.1:9500; port 0 picks one). */
  listen?: string;
  /** Number of disk directories of the node (default 3). */
  disks?: number;
  /** Hosts or CIDRs download URLs may point to although loopback or private (e.g. `127.0.0.1`). */
  allowSourceHosts?: readonly string[];
  binaries: DataPlaneBinaries;
  /** At most this many data sources at once (default 8). */
  maxDataSources?: number;
  /**
   * Data sources run by one shared host process (default 8): hosts start when the others are full and stop after
   * 30 s without data sources. 1: one process per data source (as a pod per data source in Kubernetes).
   */
  dataSourcesPerProcess?: number;
  log?: Logger;
  /** Adds more resources to the API (the backing-image resources of `@bis/api-resources` are always registered). */
  registerResources?: (registry: ApiRegistry, system: StandaloneSystem) => void;
  controllerOptions?: Partial<Pick<ControllerManagerOptions, 'timing' | 'resyncMs' | 'workers'>>;
  /** Directory of the built web UI (apps/ui/dist), served at `/`; skipped with a log line when it has no index.html. */
  uiDir?: string;
  /**
   * Bearer token of the REST API and the UI: API requests without `authorization: Bearer <token>` get 401. Required
   * when `listen` is not a loopback address, unless `insecure`.
   */
  authToken?: string;
  /** Allows a non-loopback `listen` without `authToken` (anyone reaching the port controls the system). */
  insecure?: boolean;
  /**
   * File of the internal token the managers and data sources require (default `<dataDir>/internal-token`, created
   * with mode 0600 on the first start and reused afterwards).
   */
  internalTokenFile?: string;
  /** Managers and data sources also admit calls without a token (for Longhorn components); off by default. */
  allowUnauthenticatedInternalCalls?: boolean;
  /** Events kept per object (default 50) and in all (default 5000). */
  eventsPerObject?: number;
  eventsTotal?: number;
  /** How often each disk's filesystem is measured into the node's disk status (default 30 s, Longhorn's). */
  diskCheckIntervalMs?: number;
}

/**
 * Refuses a REST listen address reachable from other machines without a token (or an explicit `insecure`).
 * Throws `StandaloneConfigError` with the reason.
 */
export function checkRestExposure(listen: string, opts: Pick<StandaloneOptions, 'authToken' | 'insecure'>): void {
  const { host } = parseListen(listen);
  if (isLoopbackHost(host) || opts.authToken || opts.insecure) return;
  throw new StandaloneConfigError(
    `refusing to serve the REST API on ${listen} without authentication: ${host} is reachable from other machines. ` +
      'Give --auth-token-file FILE (clients then send authorization: Bearer <token>), or --insecure to serve it to anyone who can reach the port.',
  );
}

export class StandaloneConfigError extends Error {
  override readonly name = 'StandaloneConfigError';
}

export interface StandaloneHandle extends StandaloneSystem {
  /** `http://host:port` of the REST API. */
  url: string;
  /** The directory the web UI is served from at `url`/, when it is. */
  uiDir?: string;
  /** The services behind the backing-image REST resources. */
  api: BackingImageApi;
  dataDir: string;
  storeDir: string;
  logsDir: string;
  backupTargetURL: string;
  /** The file of the internal token the data-plane processes require. */
  internalTokenFile: string;
  /** Replaces the controllers with fresh ones (workloads keep running): what a controller-manager restart does. */
  restartControllers(): Promise<void>;
  /** Stops the API, the controllers and every child process; the store is flushed and closed. */
  stop(): Promise<void>;
}

function parseListen(listen: string): { host: string; port: number } {
  return parseHostPort(listen, { what: '--listen', defaultHost: '127.0.0.1' });
}

/** Creates (or reuses) `<dataDir>/disks/disk-<i>` with its `longhorn-disk.cfg`. The UUID survives restarts. */
async function prepareDisk(dataDir: string, i: number): Promise<StandaloneDisk> {
  const dir = path.join(dataDir, 'disks', `disk-${i}`);
  await mkdir(dir, { recursive: true });
  const cfg = path.join(dir, 'longhorn-disk.cfg');
  try {
    const parsed = JSON.parse(await readFile(cfg, 'utf8')) as { diskUUID?: unknown };
    if (typeof parsed.diskUUID === 'string' && parsed.diskUUID) return { name: `disk-${i}`, uuid: parsed.diskUUID, path: dir };
    throw new Error(`${cfg} has no diskUUID`);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const uuid = randomUUID();
  await writeFile(cfg, JSON.stringify({ diskUUID: uuid }));
  return { name: `disk-${i}`, uuid, path: dir };
}

const cond = (type: string, now: string) => ({ type, status: 'True', reason: '', message: '', lastProbeTime: '', lastTransitionTime: now });

/** Writes the Node record of this machine: its disks, all schedulable and ready. Keeps user changes (tags, eviction). */
async function ensureNode(store: EmbeddedDatastore, disks: StandaloneDisk[]): Promise<void> {
  const now = new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');
  let node: Stored<Node> | undefined;
  try {
    node = await store.get(NodeKind, STANDALONE_NODE, STANDALONE_NAMESPACE);
  } catch (err) {
    if (!isNotFound(err)) throw err;
  }
  const specDisks = { ...(node?.spec?.disks ?? {}) };
  for (const d of disks) {
    specDisks[d.name] = { diskType: 'filesystem', allowScheduling: true, evictionRequested: false, storageReserved: 0, tags: [], ...(specDisks[d.name] ?? {}), path: d.path };
  }
  for (const name of Object.keys(specDisks)) if (!disks.some((d) => d.name === name)) delete specDisks[name];
  const spec: Node['spec'] = { name: STANDALONE_NODE, allowScheduling: true, evictionRequested: false, tags: [], ...(node?.spec ?? {}), disks: specDisks };
  // A disk error's `Healthy` condition stays across restarts: it clears when a write on the disk succeeds.
  const kept = (name: string) => (node?.status?.diskStatus?.[name]?.conditions ?? []).filter((c) => c.type === DISK_HEALTHY_CONDITION);
  const status: Node['status'] = {
    conditions: [cond('Ready', now), cond('Schedulable', now)],
    diskStatus: Object.fromEntries(
      disks.map((d) => [d.name, { diskUUID: d.uuid, diskName: d.name, diskPath: d.path, diskType: 'filesystem', conditions: [cond('Ready', now), cond('Schedulable', now), ...kept(d.name)] }]),
    ),
  };
  const saved = node
    ? await store.update(NodeKind, { ...node, spec })
    : await store.create(NodeKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Node', metadata: { name: STANDALONE_NODE, namespace: STANDALONE_NAMESPACE }, spec });
  await store.updateStatus(NodeKind, { ...saved, status });
  await measureDisks(store, disks);
}

/**
 * Measures each disk's filesystem (statfs) into the node's disk status: `storageMaximum` (its size) and
 * `storageAvailable` (bytes free to an unprivileged writer), as Longhorn's node controller does. Writes only on a
 * change; a disk that cannot be measured keeps its last figures and the failure is logged.
 */
async function measureDisks(store: EmbeddedDatastore, disks: readonly StandaloneDisk[], log?: Logger): Promise<void> {
  const measured = new Map<string, { storageMaximum: number; storageAvailable: number }>();
  for (const d of disks) {
    try {
      const fs = await statfs(d.path);
      measured.set(d.name, { storageMaximum: fs.blocks * fs.bsize, storageAvailable: fs.bavail * fs.bsize });
    } catch (err) {
      log?.warn(`disk ${d.name} (${d.path}) cannot be measured: ${(err as Error).message}`);
    }
  }
  for (let attempt = 0; attempt < 5; attempt++) {
    const node = await store.get(NodeKind, STANDALONE_NODE, STANDALONE_NAMESPACE);
    const prev = node.status?.diskStatus ?? {};
    const diskStatus = { ...prev };
    let changed = false;
    for (const [name, m] of measured) {
      const old = prev[name];
      if (!old) continue;
      if (old.storageMaximum === m.storageMaximum && old.storageAvailable === m.storageAvailable) continue;
      diskStatus[name] = { ...old, ...m };
      changed = true;
    }
    if (!changed) return;
    try {
      await store.updateStatus(NodeKind, { ...node, status: { ...node.status, diskStatus } });
      return;
    } catch (err) {
      if (!isConflict(err)) throw err;
    }
  }
}

/**
 * Starts the whole system on this machine: the embedded store under `<dataDir>/store`, one node with `disks` disk
 * directories under `<dataDir>/disks`, a filesystem backup target under `<dataDir>/backups`, the controllers, the
 * data-plane processes (logs under `<dataDir>/logs`, pid records under `<dataDir>/processes`) and the REST API.
 */
export async function startStandalone(opts: StandaloneOptions): Promise<StandaloneHandle> {
  checkRestExposure(opts.listen ?? '127.0.0.1:9500', opts);
  const dataDir = path.resolve(opts.dataDir);
  const storeDir = path.join(dataDir, 'store');
  const logsDir = path.join(dataDir, 'logs');
  const backupsDir = path.join(dataDir, 'backups');
  await mkdir(logsDir, { recursive: true });
  await mkdir(backupsDir, { recursive: true });
  const diskCount = opts.disks ?? 3;
  if (!Number.isInteger(diskCount) || diskCount < 1) throw new Error(`invalid number of disks ${opts.disks}: at least 1`);
  const disks: StandaloneDisk[] = [];
  for (let i = 1; i <= diskCount; i++) disks.push(await prepareDisk(dataDir, i));

  const internalTokenFile = path.resolve(opts.internalTokenFile ?? path.join(dataDir, 'internal-token'));
  const internalToken = await ensureTokenFile(internalTokenFile);
  const store = await EmbeddedDatastore.open({ dataDir: storeDir });
  // Holding the store's lock makes this the only controller of dataDir: the managers and data sources a previous run
  // left behind (recorded under processesDir; after a crash they stop by themselves, see exitWithParent) are ended
  // before new ones start, so that every disk has exactly one manager.
  const processesDir = path.join(dataDir, 'processes');
  try {
    const ended = await endRecordedProcesses(processesDir, { graceMs: 10_000, log: (m) => opts.log?.warn(m) });
    const left = ended.filter((e) => e.outcome !== 'gone');
    if (left.length) opts.log?.warn(`ended ${left.length} data-plane process(es) of a previous run: ${left.map((e) => `${e.name} (pid ${e.pid}, ${e.outcome})`).join(', ')}`);
    const survivors = left.filter((e) => e.outcome === 'survived');
    if (survivors.length) throw new Error(`data-plane process(es) of a previous run survived SIGKILL: ${survivors.map((e) => `${e.name} (pid ${e.pid})`).join(', ')}`);
  } catch (err) {
    await store.close();
    throw err;
  }
  const runtime = new LocalProcessRuntime({ probeIntervalMs: 200, terminationGracePeriodMs: 10_000, pidDir: processesDir });
  const ports = new PortReservations('127.0.0.1');
  const perProcess = opts.dataSourcesPerProcess ?? DEFAULT_DATA_SOURCES_PER_PROCESS;
  const dataSourceHosts =
    perProcess > 1
      ? new DataSourceHosts({
          base: runtime,
          node: opts.binaries.node ?? process.execPath,
          binary: opts.binaries.dataSource,
          logsDir,
          instancesPerHost: perProcess,
          host: '127.0.0.1',
          ports,
          internalAuth: { tokenFile: internalTokenFile, token: internalToken },
          env: { ...DATA_SOURCE_MALLOC_ENV },
        })
      : undefined;
  const dataPlane = new ProcessDataPlane({
    runtime,
    ports,
    ...(dataSourceHosts ? { dataSourceRuntime: dataSourceHosts } : {}),
    backupTarget: backupTargetOperations,
    binaries: opts.binaries,
    nodeID: STANDALONE_NODE,
    logsDir,
    allowSourceHosts: opts.allowSourceHosts,
    maxDataSources: opts.maxDataSources,
    internalAuth: { tokenFile: internalTokenFile, token: internalToken, allowUnauthenticated: opts.allowUnauthenticatedInternalCalls },
  });
  let app: FastifyInstance | undefined;
  let controllers: ControllerManager | undefined;
  let diskTimer: NodeJS.Timeout | undefined;
  let observer: ActivityObserver | undefined;
  let eventLog: EventLogRecorder | undefined;
  // Shutting down: a part that fails to stop is logged, and the others are still stopped.
  const stopFailed = (what: string) => (err: unknown) =>
    opts.log?.warn(`shutdown: ${what} did not stop cleanly: ${err instanceof Error ? err.message : String(err)}`);
  const cleanup = async () => {
    clearInterval(diskTimer);
    await app?.close().catch(stopFailed('the HTTP server'));
    await observer?.stop().catch(stopFailed('the activity observer'));
    await controllers?.stop().catch(stopFailed('the controllers'));
    await controllers?.events.flush().catch(stopFailed('the event recorder'));
    await eventLog?.close().catch(stopFailed('the event log'));
    dataPlane.close();
    await dataSourceHosts?.stopAll().catch(stopFailed('the data sources'));
    dataSourceHosts?.close();
    await runtime.stopAll().catch(stopFailed('the data-plane processes'));
    await store.close();
  };
  try {
    const settings = new SettingsService({ store, namespace: STANDALONE_NAMESPACE });
    // One node: no more copies than disks can ever exist (only when the setting is created; a user's value stays).
    await settings.ensureDefaults({ [SettingName.DefaultMinNumberOfBackingImageCopies]: String(Math.min(3, diskCount)) });
    await settings.set(SettingName.DefaultBackingImageManagerImage, STANDALONE_MANAGER_IMAGE, { system: true });
    await ensureNode(store, disks);
    const backupTargetURL = `vfs://${backupsDir}`;
    await ensureDefaultBackupTarget(store, STANDALONE_NAMESPACE, { backupTargetURL, credentialSecret: '', pollInterval: '5m0s' });

    const log = opts.log;
    // Kept in their own file (`<dataDir>/events/events.log`), not in the store: they survive restarts; the newest 50
    // per object and 5000 in all are kept.
    const opened = await EventLogRecorder.open({
      file: path.join(dataDir, 'events', 'events.log'),
      namespace: STANDALONE_NAMESPACE,
      perObject: opts.eventsPerObject ?? 50,
      total: opts.eventsTotal ?? 5000,
      log: (l, type) => (type === 'Warning' ? log?.warn(l) : log?.info(l)),
    });
    const events = (eventLog = opened.recorder);
    await moveStoredEvents(store, events, log);
    const metrics = new BackingImageMetrics({ store, namespace: STANDALONE_NAMESPACE });
    const makeControllers = () =>
      new ControllerManager({
        store,
        dataPlane,
        nodeID: STANDALONE_NODE,
        namespace: STANDALONE_NAMESPACE,
        allowSourceHosts: opts.allowSourceHosts,
        log,
        events,
        controllerMetrics: (name) => metrics.controllerMetrics(name),
        ...opts.controllerOptions,
      });
    observer = new ActivityObserver({ store, namespace: STANDALONE_NAMESPACE, log: log ?? { debug() {}, info() {}, warn() {}, error() {} }, metrics });
    await observer.start();
    controllers = makeControllers();
    await controllers.start();
    diskTimer = setInterval(() => {
      measureDisks(store, disks, log).catch((err: unknown) => log?.warn(`measuring the disks failed: ${(err as Error).message}`));
    }, opts.diskCheckIntervalMs ?? 30_000);
    diskTimer.unref();

    const system: StandaloneSystem = { store, controllers, dataPlane, settings, events, namespace: STANDALONE_NAMESPACE, disks, metrics };
    const registry = new ApiRegistry().addResource(settingsResource(settings));
    const api = registerBackingImageResources(registry, {
      store,
      namespace: STANDALONE_NAMESPACE,
      settings: new SettingsReader(store, STANDALONE_NAMESPACE),
      endpoints: annotationEndpoints((address) => dataPlane.managerClient(address)),
      downloadUrlPolicy: downloadUrlPolicyFor(opts.allowSourceHosts ?? []),
      internalToken,
      observer: metrics,
    });
    // Standalone keeps credential secrets (backup targets' `credentialSecret`) in its store: `/v1/secrets`.
    registry.addResource(secretResource(new SecretService(store, STANDALONE_NAMESPACE), store, STANDALONE_NAMESPACE));
    registry.addResource(eventResource(events));
    opts.registerResources?.(registry, system);
    app = Fastify({ logger: false, bodyLimit: 1 << 20 });
    app.addHook('onRequest', restAuthHook(opts.authToken));
    await app.register(backingImageHttpPlugin, { api });
    await app.register(restApiPlugin, { registry });
    registerHealthz(app, { checks: [storeHealthCheck(store, STANDALONE_NAMESPACE), controllersHealthCheck(() => controllers?.isRunning ?? false)] });
    await app.register(metricsPlugin, { metrics });
    const uiDir = opts.uiDir === undefined ? undefined : path.resolve(opts.uiDir);
    const uiBuilt = uiDir !== undefined && (await stat(path.join(uiDir, 'index.html')).then((s) => s.isFile(), () => false));
    if (uiBuilt) await app.register(uiServerPlugin, { root: uiDir });
    else if (uiDir !== undefined) log?.warn(`web UI not served: ${uiDir} has no index.html (build it with: npx nx run ui:build)`);
    const { host, port } = parseListen(opts.listen ?? '127.0.0.1:9500');
    await app.listen({ host, port });
    const addr = app.server.address();
    const actualPort = typeof addr === 'object' && addr ? addr.port : port;
    const url = `http://${host.includes(':') ? `[${host}]` : host}:${actualPort}`;
    let stopped: Promise<void> | undefined;
    const handle: StandaloneHandle = {
      ...system,
      api,
      url,
      ...(uiBuilt ? { uiDir } : {}),
      dataDir,
      storeDir,
      logsDir,
      backupTargetURL,
      internalTokenFile,
      async restartControllers() {
        await controllers!.stop();
        controllers = makeControllers();
        handle.controllers = controllers;
        system.controllers = controllers;
        await controllers.start();
      },
      stop: () => (stopped ??= cleanup()),
    };
    return handle;
  } catch (err) {
    await cleanup();
    throw err;
  }
}

/**
 * Moves the events an earlier version kept in the store (core/v1 Event objects) into the event log, oldest first, and
 * deletes them from the store. Runs at every start; after the first it finds none.
 */
async function moveStoredEvents(store: EmbeddedDatastore, events: EventLogRecorder, log: Logger | undefined): Promise<void> {
  const { items } = await store.list(EventKind, { namespace: STANDALONE_NAMESPACE });
  if (items.length === 0) return;
  const recorded = items.map(recordedEventOf).sort((a, b) => a.time.localeCompare(b.time) || a.id.localeCompare(b.id));
  await events.import(recorded);
  for (const e of items) {
    await store.delete(EventKind, e.metadata.name, STANDALONE_NAMESPACE).catch((err: unknown) => {
      if (!isNotFound(err)) throw err;
    });
  }
  log?.info(`moved ${items.length} event(s) from the store into the event log`);
}
