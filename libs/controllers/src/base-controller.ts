import { Controller as Reconciler, isNotFound, type ControllerMetrics, type Datastore, type RateLimiterOptions, type SharedInformers, type WorkQueue } from '@bis/datastore';
import type { DataPlane } from './data-plane.js';
import type { EventSink } from './events.js';
import type { SecretStore } from './secrets.js';
import type { SettingsReader } from './settings.js';

/**
 * The log of the controllers (implemented by `@bis/logging`'s pino logger): a message and optional structured fields
 * (`image`, `disk`, `uuid`, `controller`, `key`, ...).
 */
export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  debug(msg: string, fields?: Record<string, unknown>): void;
}

/** Everything a controller needs; built once by the ControllerManager. */
export interface ControllerContext {
  store: Datastore;
  namespace: string;
  /** The node this controller-manager runs for (Longhorn's controllerID). */
  nodeID: string;
  dataPlane: DataPlane;
  events: EventSink;
  settings: SettingsReader;
  /** Credential secrets (backup targets): the embedded store's or the Kubernetes API's. */
  secrets: SecretStore;
  informers: SharedInformers;
  log: Logger;
  now: () => Date;
  /** Timers (ms) that tests shorten; defaults are Longhorn's. */
  timing: ControllerTiming;
  /** Where each controller's queue and reconcile metrics go, by controller name (none by default). */
  controllerMetrics?: (controller: string) => ControllerMetrics;
}

export interface ControllerTiming {
  /** BIDS monitor poll (3 s). */
  dataSourcePollMs: number;
  /** BIM monitor tick (1 s) and forced list every `managerForcedListTicks` ticks (60). */
  managerPollMs: number;
  managerForcedListTicks: number;
  /**
   * A manager that reported changes (Watch) is Listed again after 5 times what its List and status write take, at
   * least this long (100 ms), at most `managerPollMs`.
   */
  managerListMinIntervalMs: number;
  /**
   * A manager's status whose files changed only in their progress is written at most this often (3 s, the rate of
   * Longhorn's monitor); any other change at once.
   */
  managerProgressWriteMs: number;
  /**
   * A backing image's status whose copies changed only into a passing state ('', pending, starting, in-progress: their
   * state, progress, message, times) is written at most once per this interval after its last status write (1 s); any
   * other change (a copy ready or failed, a size, a checksum, a condition) at once.
   */
  imageTransientWriteMs: number;
  /**
   * A data source whose poll found it moved only into or within `in-progress` (from starting or in-progress: its
   * progress, size) is written at most once per this interval after the last status write of its monitor (1 s); any
   * other change (pending, ready-for-transfer, failed, a message) at once. A small image is ready within that time,
   * and its in-progress version was a status write and a round of reconciles nobody needed.
   */
  dataSourceTransientWriteMs: number;
  /**
   * Changes of images and data sources enqueue the managers concerned after 20 times the manager's last reconcile
   * duration, at most this long, so that a burst of them makes one manager reconcile (which looks at every image of
   * its disk) instead of one each (1 s).
   */
  managerEventCoalesceMs: number;
  /** BBI backup status poll (2 s). */
  backupPollMs: number;
  /** BIDS pod retry backoff 1 min → 5 min. */
  dataSourceRetryInitialMs: number;
  dataSourceRetryMaxMs: number;
  /**
   * A data source waiting for room in the data plane retries on its own after this long, doubling per wait, at most 5
   * min (1 s); it is woken at once when a data-source workload changes.
   */
  dataSourceDeferredRetryMs: number;
  /** BIM file backoff 1 min → 5 min. */
  fileBackoffInitialMs: number;
  fileBackoffMaxMs: number;
  /** BIM pod-recreate backoff 1 s → 120 s. */
  managerRestartInitialMs: number;
  managerRestartMaxMs: number;
  /** Requeue interval for objects that wait on something with no event (the reference relies on 30 s resyncs). */
  waitRequeueMs: number;
  rateLimiter?: RateLimiterOptions;
}

export const DEFAULT_TIMING: ControllerTiming = {
  dataSourcePollMs: 3000,
  managerPollMs: 1000,
  managerForcedListTicks: 60,
  managerListMinIntervalMs: 100,
  managerProgressWriteMs: 3000,
  imageTransientWriteMs: 1000,
  dataSourceTransientWriteMs: 1000,
  managerEventCoalesceMs: 1000,
  backupPollMs: 2000,
  dataSourceRetryInitialMs: 60_000,
  dataSourceRetryMaxMs: 300_000,
  dataSourceDeferredRetryMs: 1000,
  fileBackoffInitialMs: 60_000,
  fileBackoffMaxMs: 300_000,
  managerRestartInitialMs: 1000,
  managerRestartMaxMs: 120_000,
  waitRequeueMs: 5000,
};

/**
 * A level-triggered controller: keys (object names) go through `@bis/datastore`'s rate-limited work queue and
 * reconciler loop to `reconcile`. On error a key is requeued with backoff (`RETRY_BOUNDS.reconcile`: exponential with
 * jitter, capped, never dropped); a `PermanentError` is not retried (the reconcile recorded it in the status).
 * Conflicts requeue at once without counting as errors.
 */
export abstract class Controller {
  private readonly loop: Reconciler;
  abstract readonly name: string;

  constructor(protected readonly ctx: ControllerContext) {
    this.loop = new Reconciler({
      name: new.target.name,
      reconcile: async (key) => {
        await this.reconcile(key);
      },
      rateLimiter: ctx.timing.rateLimiter,
      quietDrop: isNotFound,
      metrics: ctx.controllerMetrics?.(new.target.name),
      logger: { error: (msg, err) => ctx.log.warn(`${msg}: ${err instanceof Error ? err.message : String(err)}`, { controller: new.target.name }) },
    });
  }

  get queue(): WorkQueue<string> {
    return this.loop.queue;
  }

  abstract reconcile(key: string): Promise<void>;

  enqueue(name: string): void {
    this.queue.add(name);
  }

  /**
   * Enqueues an object after an informer event about it: a new object (`ADDED`, e.g. thousands created at once) and a
   * resync go behind the changes that move work along (the work queue's low priority), any other event not.
   */
  enqueueOn(type: string, name: string): void {
    this.queue.add(name, type === 'ADDED' || type === 'RESYNC');
  }

  start(workers: number): void {
    this.loop.start(undefined, workers);
  }

  async stop(): Promise<void> {
    await this.loop.stop();
    await this.onStop();
  }

  protected async onStop(): Promise<void> {}
}

/** Longhorn's isControllerResponsibleFor. */
export function isResponsibleFor(controllerID: string, preferredOwner: string, currentOwner: string, isDown: (node: string) => boolean): boolean {
  const preferredDown = !preferredOwner || isDown(preferredOwner);
  const currentDown = !currentOwner || isDown(currentOwner);
  if (controllerID === preferredOwner) return true;
  if (controllerID === currentOwner && preferredDown) return true;
  if (preferredDown && currentDown) return true;
  return false;
}
