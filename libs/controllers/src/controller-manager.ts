import { SharedInformers, type ControllerMetrics, type Datastore } from '@bis/datastore';
import { BackingImageActions } from './actions.js';
import { BackingImageController } from './backing-image-controller.js';
import { BackupBackingImageController } from './backup-controller.js';
import { BackupTargetController } from './backup-target-controller.js';
import { DEFAULT_TIMING, type Controller, type ControllerContext, type ControllerTiming, type Logger } from './base-controller.js';
import type { DataPlane } from './data-plane.js';
import { BackingImageDataSourceController } from './data-source-controller.js';
import { EventRecorder, type EventSink } from './events.js';
import { BackingImageManagerController } from './manager-controller.js';
import { NodeController } from './node-controller.js';
import { DatastoreSecretStore, type SecretStore } from './secrets.js';
import { SettingsReader, type SettingName } from './settings.js';

export interface ControllerManagerOptions {
  store: Datastore;
  dataPlane: DataPlane;
  nodeID: string;
  namespace?: string;
  /** Workers per controller (Longhorn: 5). */
  workers?: number;
  /** Informer resync (Longhorn: 30 s). */
  resyncMs?: number;
  timing?: Partial<ControllerTiming>;
  /** Values used when no Setting object exists (defaults are Longhorn's). */
  settingDefaults?: Partial<Record<SettingName, string>>;
  /** Hosts/CIDRs a download URL may point to although loopback. */
  allowSourceHosts?: readonly string[];
  log?: Logger;
  /** Where events go (default: an in-memory ring, logged). */
  events?: EventSink;
  /** Where credential secrets are read (default: `Secret` objects in `store`). */
  secrets?: SecretStore;
  /** Where each controller's work-queue depth, adds, retries and reconcile durations go (`@bis/metrics`). */
  controllerMetrics?: (controller: string) => ControllerMetrics;
}

const quietLogger: Logger = { info() {}, warn() {}, error() {}, debug() {} };

/** Composes the backing-image controllers over one datastore and one data plane. */
export class ControllerManager {
  readonly ctx: ControllerContext;
  readonly events: EventSink;
  readonly actions: BackingImageActions;
  readonly backingImages: BackingImageController;
  readonly dataSources: BackingImageDataSourceController;
  readonly managers: BackingImageManagerController;
  readonly backups: BackupBackingImageController;
  readonly backupTargets: BackupTargetController;
  readonly nodes: NodeController;
  private readonly controllers: Controller[];
  private readonly informers: SharedInformers;
  private readonly workers: number;
  private running = false;
  private synced = false;

  constructor(opts: ControllerManagerOptions) {
    const namespace = opts.namespace ?? 'longhorn-system';
    const log = opts.log ?? quietLogger;
    this.events = opts.events ?? new EventRecorder(2000, (l, type) => (type === 'Warning' ? log.warn(l) : log.info(l)));
    this.informers = new SharedInformers({
      store: opts.store,
      namespace,
      resyncMs: opts.resyncMs ?? 30_000,
      retryDelayMs: 1000,
      onError: (err, kind) => log.warn(`informer of ${kind.kind}: ${err instanceof Error ? err.message : String(err)}`),
    });
    this.ctx = {
      store: opts.store,
      namespace,
      nodeID: opts.nodeID,
      dataPlane: opts.dataPlane,
      events: this.events,
      settings: new SettingsReader(opts.store, namespace, opts.settingDefaults, this.informers),
      secrets: opts.secrets ?? new DatastoreSecretStore(opts.store, namespace),
      informers: this.informers,
      log,
      now: () => new Date(),
      timing: { ...DEFAULT_TIMING, ...opts.timing },
      ...(opts.controllerMetrics ? { controllerMetrics: opts.controllerMetrics } : {}),
    };
    this.workers = opts.workers ?? 5;
    this.backingImages = new BackingImageController(this.ctx);
    this.dataSources = new BackingImageDataSourceController(this.ctx);
    this.managers = new BackingImageManagerController(this.ctx);
    this.backups = new BackupBackingImageController(this.ctx);
    this.backupTargets = new BackupTargetController(this.ctx);
    this.nodes = new NodeController(this.ctx);
    this.controllers = [this.backingImages, this.dataSources, this.managers, this.backups, this.backupTargets, this.nodes];
    this.actions = BackingImageActions.fromContext(this.ctx, opts.allowSourceHosts);
  }

  /** Starts the informers and the workers; resolves once every kind was listed once. */
  async start(): Promise<void> {
    if (this.running) return;
    this.running = true;
    for (const c of this.controllers) c.start(this.workers);
    this.informers.start();
    await this.informers.waitForSync();
    this.synced = this.running;
  }

  /** True from the end of start() (every kind listed once) until stop(): what the health endpoint reports. */
  get isRunning(): boolean {
    return this.running && this.synced;
  }

  /** Stops watches, workers and monitors. Workloads keep running (the data plane owns them). */
  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    this.synced = false;
    await this.informers.stop();
    await Promise.all(this.controllers.map((c) => c.stop()));
  }
}
