import { isGrpcStatus } from '@bis/bimrpc';
import type { BackingImageDataSourceStatus } from '@bis/crd-types';
import { isConflict, type Stored } from '@bis/datastore';
import { setTimeout as sleepFor } from 'node:timers/promises';
import { FILE_MACHINE, FileState, transition } from '@bis/state-machine';
import { Backoff } from './backoff.js';
import { Controller, isResponsibleFor, type ControllerContext } from './base-controller.js';
import { changed, clone, errMessage, getOrUndefined, imageRef, listManagers, nodeDownChecker, topology } from './common.js';
import { nodeChangeMatters } from './topology.js';
import type { DataSourceFileInfo } from '@bis/data-source-api/contract';
import type { DataSourceLaunch, WorkloadStatus } from './data-plane.js';
import { EventReason, EventSource } from './events.js';
import { BackingImageDataSourceKind, BackingImageKind, BackingImageManagerKind, BackupTargetKind, NodeKind, type BackingImage, type BackingImageDataSource } from './kinds.js';
import { recordDiskHealth } from './disk-conditions.js';
import { Annotation, FINALIZER } from './names.js';
import { backupTargetCredential } from './secrets.js';
import { SettingName } from './settings.js';

/** After this many consecutive failed polls the monitor stops (the reconcile restarts it while the workload is ready). */
export const MAX_MONITOR_RETRY_COUNT = 10;

const GRPC_NOT_FOUND = 5;
const DELETED_MESSAGE = 'backing image is deleted, requesting manager to clean up the tmp file of backing image data source';
/** The note a waiting retry adds to the failure message: ` [attempt 3 failed; next attempt at <RFC 3339>]`. */
const RETRY_NOTE = / \[attempt \d+ failed; next attempt at [^\]]*\]$/;
const RETRIED_NOTE = /^retrying \(attempt \d+\) after: /;
/** The failure message without the notes of earlier retries. */
const failureOf = (message: string | undefined) => (message ?? '').replace(RETRY_NOTE, '').replace(RETRIED_NOTE, '');
const NOT_READY_MESSAGE = 'failed to prepare the first backing image file: the dedicated data source process is not ready or gone';

interface Monitor {
  timer: NodeJS.Timeout;
  address: string;
  /** The disk the data source prepares the first file on. */
  diskUUID: string;
  failures: number;
  busy: boolean;
  /** Whether the watch (or, for a data source that does not wait, the first poll and the ramp) has started. */
  watching: boolean;
  /** The state the watch saw last: it waits at the data source for another one. */
  seenState?: FileState;
  /** A poll was asked for while one ran: it runs again after it, with a fresh answer. */
  again: boolean;
  /** Ends the watch's wait when the monitor stops. */
  readonly stop: AbortController;
  /** The next of the first polls (close together, then further apart up to the poll interval). */
  rampTimer?: NodeJS.Timeout;
  /** When the status was last written with what a poll found (or the monitor started: the start's write). */
  lastWriteAt: number;
}

/**
 * Whether a change of an image concerns its data source's reconcile, which reads of the image only whether it exists,
 * whether it is being deleted and its spec (the data source's disk in diskFileSpecMap): a change of the image's status
 * alone (its copies, their last-reference times, its conditions; about 5 writes per image) does not. Nor does the
 * image's resync: as in Longhorn, a handler for another kind has no resync (the data source's own resync brings it
 * back every 30 s); at 1,000 images the two resyncs were a third of the data-source reconciles.
 */
export function imageChangeConcernsDataSource(type: string, now: Stored<BackingImage>, old: Stored<BackingImage> | undefined): boolean {
  if (type === 'RESYNC') return false;
  if (type !== 'MODIFIED' || !old) return true;
  return changed(old.spec, now.spec) || old.metadata.deletionTimestamp !== now.metadata.deletionTimestamp;
}

/**
 * A data source that does not wait for a change (`waitForChange`) is polled this long after it starts, then at
 * doubling intervals up to the poll interval; the watch waits this long again after a failed wait, doubling too.
 */
const FIRST_POLL_MS = 100;
/** One wait of the watch at the data source (a new wait follows at once). */
const WATCH_WAIT_SECONDS = 20;

/** Longhorn's BackingImageDataSource controller (§3.2). */
export class BackingImageDataSourceController extends Controller {
  readonly name = 'backing-image-data-source';
  private readonly monitors = new Map<string, Monitor>();
  /** Data sources waiting for room in the data plane, oldest first. */
  private readonly deferred = new Set<string>();
  /** How many times in a row each waiting data source found no room (its fallback retry backs off with it). */
  private readonly deferrals = new Map<string, number>();
  /** Data-source workload changes seen so far: a start told to wait retries at once when one came while it was asked. */
  private workloadChanges = 0;
  readonly retryBackoff: Backoff;

  constructor(ctx: ControllerContext) {
    super(ctx);
    this.retryBackoff = new Backoff(ctx.timing.dataSourceRetryInitialMs, ctx.timing.dataSourceRetryMaxMs);
    // A data source waiting for room is woken when room may have freed, and retries on its own with a backoff: the
    // informers' resync (every object every 30 s) does not bring it back as well (10,000 waiting: 333 a second).
    const wanted = (t: string, name: string) => {
      if (t !== 'RESYNC' || !this.deferred.has(name)) this.enqueueOn(t, name);
    };
    ctx.informers.on(BackingImageDataSourceKind, (t, o) => wanted(t, o.metadata.name));
    ctx.informers.on(BackingImageKind, (t, o, old) => {
      if (imageChangeConcernsDataSource(t, o, old)) wanted(t, o.metadata.name);
    });
    // FIX: Longhorn's node handler selects on a label BIDS never carry; here node changes enqueue the BIDS on that node.
    ctx.informers.on(NodeKind, (t, n, old) => {
      if (!nodeChangeMatters(t, n, old)) return;
      for (const b of ctx.informers.cached(BackingImageDataSourceKind)) if (b.spec?.nodeID === n.metadata.name) this.enqueue(b.metadata.name);
    });
    ctx.dataPlane.onWorkloadChange((kind, name) => {
      if (kind !== 'data-source') return;
      this.workloadChanges++;
      this.enqueue(name);
      // A data-source workload changed (it may have ended and made room): the oldest waiting ones try again now
      // instead of at their next retry. A few, not all: each that still finds no room just waits again.
      let n = 0;
      for (const d of this.deferred) {
        if (n++ >= 2) break;
        this.deferred.delete(d);
        this.enqueue(d);
      }
    });
    // The manager on a data source's disk changed the listed file of that image (a Fetch from the data source went on
    // or finished): poll the data source now, so its `ready` (transferred) is seen without waiting up to a poll
    // interval. Only the monitored data sources (at most the data plane's capacity) are looked at.
    ctx.informers.on(BackingImageManagerKind, (t, o, old) => {
      if (t !== 'MODIFIED' || !old || old.status?.backingImageFileMap === o.status?.backingImageFileMap) return;
      for (const [name, m] of this.monitors) {
        if (m.diskUUID !== o.spec?.diskUUID) continue;
        const file = o.status?.backingImageFileMap?.[name];
        if (!changed(old.status?.backingImageFileMap?.[name], file)) continue;
        // poll() catches its own failures (counted, shown in the status); nothing waits for it.
        void this.poll(name, m);
        // the file is with the manager now: the reconcile releases the data source once it is `ready` (see sync)
        if (file?.state === 'ready') this.enqueue(name);
      }
    });
  }

  protected override async onStop(): Promise<void> {
    for (const name of [...this.monitors.keys()]) this.stopMonitor(name);
  }

  async reconcile(name: string): Promise<void> {
    const { store, namespace, nodeID } = this.ctx;
    const bids = await getOrUndefined(store.get(BackingImageDataSourceKind, name, namespace));
    if (!bids) {
      this.stopMonitor(name);
      this.deferrals.delete(name);
      return;
    }
    const isDown = await nodeDownChecker(this.ctx);
    if (!isResponsibleFor(nodeID, bids.spec?.nodeID ?? '', bids.status?.ownerID ?? '', isDown)) {
      this.stopMonitor(name);
      return;
    }
    // The data source's own node (its preferred owner) claims it in the status write of this reconcile; a node taking
    // over from another one, or a data source being deleted, writes the claim first and goes on at the next reconcile.
    const claiming = bids.status?.ownerID !== nodeID;
    if (claiming && (bids.spec?.nodeID !== nodeID || bids.metadata.deletionTimestamp)) {
      await store.updateStatus(BackingImageDataSourceKind, { ...bids, status: { ...bids.status, ownerID: nodeID } });
      return;
    }

    if (bids.metadata.deletionTimestamp) return this.handleDeletion(bids);

    const status = clone(bids.status ?? {});
    if (claiming) status.ownerID = nodeID;
    try {
      await this.sync(bids, status);
    } finally {
      const latest = await getOrUndefined(store.get(BackingImageDataSourceKind, name, namespace));
      if (latest && changed(latest.status, status) && latest.metadata.resourceVersion === bids.metadata.resourceVersion) {
        await store.updateStatus(BackingImageDataSourceKind, { ...bids, status });
      } else if (latest && changed(bids.status, status)) {
        // The monitor or another writer changed the object meanwhile: merge our decision onto the latest status.
        await store.updateStatus(BackingImageDataSourceKind, { ...latest, status: { ...latest.status, ...diff(bids.status ?? {}, status) } });
      }
      // A monitor started by this reconcile watches now that the status (with the data source's ip) is written: a
      // look before the write found no ip and waited a whole interval (3 s) for its first look at the data source.
      const m = this.monitors.get(name);
      if (m && !m.watching) {
        m.watching = true;
        // watch() catches its own failures; nothing waits for it.
        void this.watch(name, m);
      }
    }
  }

  private async handleDeletion(bids: Stored<BackingImageDataSource>): Promise<void> {
    const { store } = this.ctx;
    await this.cleanup(bids.metadata.name);
    const removeFinalizer = async () => {
      // The first file was never fetched: whatever path released the data source (no manager, a manager without the
      // image, a manager that cleaned up), nothing of it may stay on the disk.
      if (!bids.spec?.fileTransferred && this.ctx.dataPlane.discardDataSourceFiles) {
        try {
          await this.ctx.dataPlane.discardDataSourceFiles(bids);
        } catch (err) {
          this.ctx.log.warn(`data source ${bids.metadata.name}: cannot remove its files from disk ${bids.spec?.diskUUID ?? ''}: ${errMessage(err)}`);
          this.queue.addAfter(bids.metadata.name, this.ctx.timing.waitRequeueMs);
          return;
        }
      }
      const finalizers = (bids.metadata.finalizers ?? []).filter((f) => f !== FINALIZER);
      await store.update(BackingImageDataSourceKind, { ...bids, metadata: { ...bids.metadata, finalizers } });
    };
    if (bids.spec?.fileTransferred || bids.status?.currentState === 'failed-and-cleanup') return removeFinalizer();
    // The manager on the BIDS disk removes the temporary file and then marks the BIDS failed-and-cleanup.
    // FIX: when no manager is responsible for that disk (it was never created), nobody would; the data source's
    // leftovers are then removed with its workload and the BIDS is released here.
    const manager = (await listManagers(this.ctx)).find(
      (m) => !m.metadata.deletionTimestamp && m.spec?.diskUUID === bids.spec?.diskUUID && m.status?.currentState === 'running',
    );
    if (!manager) return removeFinalizer();
    // FIX: the manager cleans up only the images of its spec. An image deleted before it was added there (a delete
    // right after the create, e.g. a clone on a disk whose manager already runs) would wait for it forever, and its
    // image with it. The temporary file is removed here through that manager, then the BIDS is released.
    const name = bids.metadata.name;
    if (!manager.spec?.backingImages?.[name]) {
      const address = manager.metadata.annotations?.[Annotation.Address];
      if (address && bids.spec?.uuid) {
        try {
          await this.ctx.dataPlane.managerClient(address).delete(name, bids.spec.uuid);
        } catch (err) {
          if (!isGrpcStatus(err, GRPC_NOT_FOUND)) {
            this.ctx.log.warn(`data source ${name}: cannot remove its temporary file through manager ${manager.metadata.name}: ${errMessage(err)}`);
            this.queue.addAfter(name, this.ctx.timing.waitRequeueMs);
            return;
          }
        }
      }
      return removeFinalizer();
    }
    if (bids.status?.currentState !== 'failed' || bids.status?.message !== DELETED_MESSAGE) {
      const subject = `data source ${bids.metadata.name}`;
      await store.updateStatus(BackingImageDataSourceKind, {
        ...bids,
        status: { ...bids.status, currentState: transition(FILE_MACHINE, bids.status?.currentState ?? '', 'deleted', subject), message: DELETED_MESSAGE, ip: '', storageIP: '' },
      });
    }
    this.queue.addAfter(bids.metadata.name, this.ctx.timing.waitRequeueMs);
  }

  private async cleanup(name: string): Promise<void> {
    this.stopMonitor(name);
    this.deferrals.delete(name);
    await this.ctx.dataPlane.deleteDataSource(name);
  }

  private async sync(bids: Stored<BackingImageDataSource>, status: BackingImageDataSourceStatus): Promise<void> {
    const { store, namespace } = this.ctx;
    const name = bids.metadata.name;
    const spec = bids.spec ?? {};
    // syncBackingImage: the BIDS disk is part of the BI's spec while the first file is not transferred.
    const bi = await getOrUndefined(store.get(BackingImageKind, name, namespace));
    if (bi && !spec.fileTransferred && spec.diskUUID && !bi.spec?.diskFileSpecMap?.[spec.diskUUID]) {
      await store.update(BackingImageKind, {
        ...bi,
        spec: { ...bi.spec, diskFileSpecMap: { ...(bi.spec?.diskFileSpecMap ?? {}), [spec.diskUUID]: { dataEngine: 'v1', evictionRequested: false } } },
      });
    }
    if (spec.fileTransferred) {
      status.currentState = transition(FILE_MACHINE, status.currentState ?? '', 'transferred', `data source ${name}`);
      status.ip = '';
      status.storageIP = '';
      await this.cleanup(name);
      return;
    }
    const topo = await topology(this.ctx);
    const f = spec.diskUUID ? topo.readyDisk(spec.diskUUID) : undefined;
    if (!f || f.node.name !== spec.nodeID || f.disk.path !== spec.diskPath) {
      status.currentState = transition(FILE_MACHINE, status.currentState ?? '', 'disk-unavailable', `data source ${name}`);
      return;
    }

    // FIX (early release): the manager has the first file, the data source has nothing left to do. Its workload is
    // deleted now, not when the image marks the file transferred: that took 0.7 s (median at 300 images) during
    // which the finished workload held one of the data plane's places (16 by default). A `ready` data source whose
    // file its manager lists as ready is one released so, not one whose workload was lost (Longhorn fails a `ready`
    // data source without its pod, which a release would otherwise be taken for).
    if ((status.currentState ?? '') === 'ready' && this.handedOver(bids)) {
      status.ip = '';
      status.storageIP = '';
      await this.cleanup(name);
      return;
    }

    const w = await this.ctx.dataPlane.dataSourceStatus(bids);
    const isNew = (status.currentState ?? '') === '';
    const mismatch = w.phase !== 'missing' && (w.nodeID !== spec.nodeID || w.diskUUID !== spec.diskUUID);
    if (w.phase === 'ready' && !mismatch) {
      await this.adoptRunning(bids, status, w);
    } else {
      status.ip = '';
      status.storageIP = '';
      const state = status.currentState ?? '';
      if (state !== 'failed' && state !== 'failed-and-cleanup') {
        if (mismatch) {
          status.currentState = transition(FILE_MACHINE, state, 'source-gone', `data source ${name}`);
          status.message = `the data source workload of ${name} runs on node ${w.nodeID} disk ${w.diskUUID} instead of node ${spec.nodeID} disk ${spec.diskUUID}; it will be deleted`;
        } else if (w.phase === 'failed') {
          status.currentState = transition(FILE_MACHINE, state, 'source-gone', `data source ${name}`);
          status.message = `the pod dedicated to prepare the first backing image file failed: ${w.message || 'pod log is not found'}`;
        } else if (['starting', 'in-progress', 'ready-for-transfer', 'ready', 'unknown'].includes(state)) {
          // Also a `ready` first file not yet marked transferred: its data source is gone with it.
          status.currentState = transition(FILE_MACHINE, state, 'source-gone', `data source ${name}`);
          status.message = NOT_READY_MESSAGE;
        }
      }
      this.stopMonitor(name);
    }
    if (status.currentState === 'failed' && bids.status?.currentState !== 'failed' && status.message) {
      this.ctx.events.record(EventSource.BackingImageDataSource, imageRef(this.ctx, name), 'Warning', EventReason.Failed, `The data source of backing image ${name} failed: ${status.message}`);
    }
    if (status.currentState === 'failed' || status.currentState === 'failed-and-cleanup') {
      await this.cleanup(name);
      if (w.phase !== 'missing') {
        this.queue.addAfter(name, 500);
        return;
      }
    }
    if (w.phase === 'missing') {
      // A restore can run again like a download (the backup does not change); Longhorn retries only download and export.
      const retriable = spec.sourceType === 'download' || spec.sourceType === 'export-from-volume' || spec.sourceType === 'restore';
      const retry = !isNew && retriable && !this.retryBackoff.isInBackOffSinceUpdate(name);
      if (!isNew && retriable && !retry) {
        this.queue.addAfter(name, this.retryBackoff.remaining(name) + 10);
        // The failure stays readable, with the attempt it ended and when the next one starts.
        const at = this.retryBackoff.nextAt(name);
        const attempts = this.retryBackoff.attempts(name);
        if (at !== undefined && attempts > 0) {
          status.retryCount = attempts;
          status.nextRetryAt = new Date(at).toISOString();
          const failure = failureOf(status.message);
          status.message = `${failure || 'the data source stopped'} [attempt ${attempts} failed; next attempt at ${status.nextRetryAt}]`;
        }
      }
      if (isNew || retry) {
        const failure = isNew ? '' : failureOf(status.message);
        const attempt = this.retryBackoff.attempts(name) + 1;
        status.currentState = transition(FILE_MACHINE, status.currentState ?? '', 'retried', `data source ${name}`);
        // A retry says what it retries: `starting 0%` with an empty message hid every failure of a flaky origin.
        status.message = failure ? `retrying (attempt ${attempt}) after: ${failure}` : '';
        if (!isNew) status.retryCount = attempt - 1;
        delete status.nextRetryAt;
        status.progress = 0;
        status.checksum = '';
        status.runningParameters = { ...(spec.parameters ?? {}) };
        const launch: DataSourceLaunch = {
          name,
          uuid: spec.uuid ?? '',
          sourceType: spec.sourceType ?? 'download',
          diskPath: spec.diskPath ?? '',
          parameters: await this.runningParameters(bids),
          checksum: spec.checksum ?? '',
          credentials: {},
          maxImageSize: await this.ctx.settings.int(SettingName.BackingImageMaxSize),
          storageReserved: f.disk.storageReserved,
        };
        status.runningParameters = launch.parameters;
        let started: 'started' | 'deferred' = 'started';
        const changesBefore = this.workloadChanges;
        try {
          launch.credentials = await this.launchCredentials(launch);
          started = await this.ctx.dataPlane.startDataSource(bids, launch);
        } catch (err) {
          status.currentState = transition(FILE_MACHINE, status.currentState, 'fail', `data source ${name}`);
          status.message = `failed to start the data source: ${errMessage(err)}`;
          this.ctx.events.record(EventSource.BackingImageDataSource, imageRef(this.ctx, name), 'Warning', EventReason.FailedStarting, status.message);
        }
        if (started === 'deferred') {
          const n = (this.deferrals.get(name) ?? 0) + 1;
          this.deferrals.set(name, n);
          this.deferred.add(name);
          status.message = 'waiting for the data plane to have room for one more data source';
          // The oldest waiting data sources are woken as soon as a data-source workload changes; this retry is only the
          // fallback, and it backs off (1 s, doubling to 5 min) so that thousands waiting do not each come back every second.
          // A change that came while the data plane was asked found this one not yet waiting: it tries again now
          // (otherwise that wake-up would be lost, and the wait last until the fallback).
          if (this.workloadChanges !== changesBefore) this.enqueue(name);
          else this.queue.addAfter(name, Math.min(this.ctx.timing.dataSourceDeferredRetryMs * 2 ** Math.min(n - 1, 9), 300_000));
          return;
        }
        this.deferrals.delete(name);
        this.retryBackoff.next(name);
        if (status.currentState !== 'failed') {
          const what = launch.sourceType === 'restore' ? `restore from backup ${launch.parameters['backup-url'] ?? ''}` : launch.sourceType;
          this.ctx.events.record(
            EventSource.BackingImageDataSource,
            imageRef(this.ctx, name),
            'Normal',
            EventReason.Started,
            `Started the data source (${what}) of backing image ${name} on node ${spec.nodeID} disk ${spec.diskUUID}${isNew ? '' : ` (attempt ${this.retryBackoff.attempts(name)})`}`,
          );
          // EXTENSION: a workload that runs as soon as it started (a data-source host answers once the instance
          // listens) gets its address, ip and monitor in this reconcile, in the same status write as the start,
          // instead of in the reconcile its workload change brings next (one status write and one reconcile fewer).
          const now = await this.ctx.dataPlane.dataSourceStatus(bids);
          if (now.phase === 'ready' && now.nodeID === spec.nodeID && now.diskUUID === spec.diskUUID) await this.adoptRunning(bids, status, now);
        }
      }
    } else if (w.phase !== 'ready') {
      this.queue.addAfter(name, 500);
    }
  }

  /** The data source's workload runs: its address (annotation), its ip in the status, and its monitor. */
  /**
   * Whether the data source's file is with its manager: the manager on the data source's disk lists the image's
   * file, of the data source's uuid, as ready.
   */
  private handedOver(bids: Stored<BackingImageDataSource>): boolean {
    const disk = bids.spec?.diskUUID;
    if (!disk) return false;
    return this.ctx.informers.cached(BackingImageManagerKind).some((m) => {
      const f = m.spec?.diskUUID === disk && !m.metadata.deletionTimestamp ? m.status?.backingImageFileMap?.[bids.metadata.name] : undefined;
      return f?.state === 'ready' && f.uuid === bids.spec?.uuid;
    });
  }

  private async adoptRunning(bids: Stored<BackingImageDataSource>, status: BackingImageDataSourceStatus, w: WorkloadStatus): Promise<void> {
    status.ip = w.ip;
    status.storageIP = w.ip;
    if (bids.metadata.annotations?.[Annotation.Address] !== w.address) {
      await this.ctx.store.update(BackingImageDataSourceKind, { ...bids, metadata: { ...bids.metadata, annotations: { ...bids.metadata.annotations, [Annotation.Address]: w.address } } });
    }
    this.startMonitor(bids.metadata.name, w.address, bids.spec?.diskUUID ?? '');
  }

  /** A restore reads its backup target's credential secret (Longhorn passes it as the data source's credential). */
  private async launchCredentials(launch: DataSourceLaunch): Promise<Record<string, string>> {
    if (launch.sourceType !== 'restore') return {};
    const targetName = launch.parameters['backup-target-name'] || 'default';
    const target = await getOrUndefined(this.ctx.store.get(BackupTargetKind, targetName, this.ctx.namespace));
    return backupTargetCredential(this.ctx.secrets, target);
  }

  private async runningParameters(bids: BackingImageDataSource): Promise<Record<string, string>> {
    const params = { ...(bids.spec?.parameters ?? {}) };
    if (bids.spec?.sourceType === 'clone') {
      const src = await getOrUndefined(this.ctx.store.get(BackingImageKind, params['backing-image'] ?? '', this.ctx.namespace));
      if (src?.status?.uuid) params['backing-image-uuid'] = src.status.uuid;
    }
    return params;
  }

  // ------------------------------------------------------------ monitor (GET /v1/file every 3 s)

  private startMonitor(name: string, address: string, diskUUID: string): void {
    const existing = this.monitors.get(name);
    if (existing && existing.address === address) return;
    if (existing) this.stopMonitor(name);
    // poll() catches its own failures (counted, shown in the status); the timer only starts it.
    const m: Monitor = {
      address,
      diskUUID,
      failures: 0,
      busy: false,
      watching: false,
      again: false,
      stop: new AbortController(),
      lastWriteAt: Date.now(),
      timer: setInterval(() => void this.poll(name, m), this.ctx.timing.dataSourcePollMs),
    };
    m.timer.unref();
    this.monitors.set(name, m);
  }

  /**
   * The monitor's look at each state of the file the moment the data source reaches it (the reconcile that started
   * the monitor starts this once its status write is done). A small file is ready within a fraction of a second, and
   * its data source holds a place in the data plane until the controller sees it: polls 100 ms, 200 ms, 400 ms …
   * after the start saw `ready-for-transfer` 411 ms (median) after the data source had started, and its `ready`
   * (taken over by the manager) 270 ms after the manager's Fetch. So the watch waits at the data source for a state
   * other than the last one it saw (`waitForChange`) and hands each answer to {@link poll}; the interval poll still
   * brings the progress. A data source that answers without waiting is polled at doubling intervals from 100 ms up
   * to the poll interval instead, as one that cannot wait was before.
   */
  private async watch(name: string, m: Monitor): Promise<void> {
    const api = this.ctx.dataPlane.dataSourceClient(m.address);
    let retryMs = FIRST_POLL_MS;
    while (this.monitors.get(name) === m) {
      let info: DataSourceFileInfo | undefined;
      const asked = Date.now();
      try {
        if (!api.waitForChange) break;
        info = await api.waitForChange(m.seenState ?? FileState.New, { waitSeconds: WATCH_WAIT_SECONDS, signal: m.stop.signal });
        if (!info) break;
        retryMs = FIRST_POLL_MS;
      } catch (err) {
        // not listening yet, or gone: the interval poll counts the failures (and stops the monitor)
        if (this.monitors.get(name) !== m) return;
        this.ctx.log.debug(`data source watch ${name}: ${errMessage(err)}`);
        await sleep(retryMs, m.stop.signal);
        retryMs = Math.min(retryMs * 2, this.ctx.timing.dataSourcePollMs);
        continue;
      }
      if (info.state === m.seenState) {
        // the wait's time ran out; or the data source answers at once with the same state (it is closing): not again
        // at once
        if (Date.now() - asked < 1000) await sleep(this.ctx.timing.dataSourcePollMs, m.stop.signal);
        continue;
      }
      // the data source owns its file's state: the watch mirrors what it reported
      m.seenState = transition(FILE_MACHINE, m.seenState ?? FileState.New, { reported: info.state }, `data source ${name}`);
      // poll() catches its own failures (counted, shown in the status)
      await this.poll(name, m, info);
    }
    if (this.monitors.get(name) !== m) return;
    // a data source that answers at once: polls close together first, then the interval poll alone
    const ramp = (delay: number) => {
      if (delay >= this.ctx.timing.dataSourcePollMs) return;
      m.rampTimer = setTimeout(() => {
        if (this.monitors.get(name) !== m) return;
        // poll() catches its own failures (counted, shown in the status); nothing waits for it.
        void this.poll(name, m);
        ramp(delay * 2);
      }, delay);
      m.rampTimer.unref();
    };
    void this.poll(name, m);
    ramp(Math.min(FIRST_POLL_MS, this.ctx.timing.dataSourcePollMs / 2));
  }

  private stopMonitor(name: string): void {
    this.deferred.delete(name);
    const m = this.monitors.get(name);
    if (m) {
      clearInterval(m.timer);
      clearTimeout(m.rampTimer);
      m.stop.abort();
    }
    this.monitors.delete(name);
  }

  /**
   * A first file zero-padded to a multiple of 512 bytes (a restore of an unaligned backup): both checksums go into an
   * event and a log line, and the unpadded one onto the image (annotation), once.
   */
  private async recordUnpadded(name: string, info: DataSourceFileInfo): Promise<void> {
    const { store, namespace } = this.ctx;
    const bi = await getOrUndefined(store.get(BackingImageKind, name, namespace));
    if (!bi || bi.metadata.annotations?.[Annotation.UnpaddedChecksum] === info.unpaddedChecksum) return;
    await store.update(BackingImageKind, { ...bi, metadata: { ...bi.metadata, annotations: { ...(bi.metadata.annotations ?? {}), [Annotation.UnpaddedChecksum]: info.unpaddedChecksum! } } });
    const text = `restored image was ${info.unpaddedSize} bytes (SHA-512 ${info.unpaddedChecksum}), zero-padded to ${info.size} bytes (SHA-512 ${info.currentChecksum})`;
    this.ctx.log.info(`backing image ${name}: ${text}`);
    this.ctx.events.record(EventSource.BackingImage, bi, 'Normal', 'Update', text);
  }

  /** Writes what the data source reports (`answer`: what the watch was just told; otherwise asked now). */
  private async poll(name: string, m: Monitor, answer?: DataSourceFileInfo): Promise<void> {
    if (this.monitors.get(name) !== m) return;
    if (m.busy) {
      m.again = true;
      return;
    }
    m.busy = true;
    const { store, namespace, nodeID } = this.ctx;
    try {
      const bids = await getOrUndefined(store.get(BackingImageDataSourceKind, name, namespace));
      if (!bids || bids.status?.ownerID !== nodeID) return this.stopMonitor(name);
      if (!bids.status?.ip) return;
      const info = answer ?? (await this.ctx.dataPlane.dataSourceClient(m.address).get());
      m.failures = 0;
      if (info.state === 'ready' || info.state === 'ready-for-transfer') this.retryBackoff.reset(name);
      if (info.state === 'ready-for-transfer' && info.unpaddedChecksum) await this.recordUnpadded(name, info);
      // The answer is fresh: a write that conflicts with a reconcile's write is retried at once on the latest object
      // (dropping it cost a whole poll interval, 3 s, e.g. before the manager saw ready-for-transfer).
      let cur: typeof bids | undefined = bids;
      for (let attempt = 1; cur && cur.status?.ownerID === nodeID && cur.status?.ip; attempt++) {
        if (cur.status?.currentState === 'failed' || cur.status?.currentState === 'failed-and-cleanup') return;
        // The data source owns its file's state: the BIDS mirrors what it reports.
        const prevState = cur.status?.currentState ?? '';
        const status: BackingImageDataSourceStatus = {
          ...cur.status,
          currentState: transition(FILE_MACHINE, prevState, { reported: info.state }, `data source ${name}`),
          size: info.size,
          progress: info.progress,
          checksum: info.currentChecksum,
          message: info.message,
        };
        const currentState = status.currentState ?? '';
        const done = currentState === 'ready' || currentState === 'ready-for-transfer';
        // Before the data source says anything, the retry note (what the last attempt failed with) stays.
        if (!info.message && (currentState === 'starting' || currentState === 'pending' || currentState === '')) status.message = cur.status?.message ?? '';
        if (done) {
          delete status.retryCount;
          delete status.nextRetryAt;
        }
        if (!changed(cur.status, status)) return;
        // Only into or within in-progress, soon after the last write: a later poll writes it (or what came next).
        if (
          currentState === 'in-progress' &&
          ['', 'starting', 'in-progress'].includes(prevState) &&
          status.message === (cur.status?.message ?? '') &&
          Date.now() - m.lastWriteAt < this.ctx.timing.dataSourceTransientWriteMs
        ) {
          return;
        }
        try {
          await store.updateStatus(BackingImageDataSourceKind, { ...cur, status });
          m.lastWriteAt = Date.now();
          if (currentState !== prevState && currentState === 'failed') {
            this.ctx.events.record(EventSource.BackingImageDataSource, imageRef(this.ctx, name), 'Warning', EventReason.Failed, `The data source of backing image ${name} failed: ${info.message}`);
            // A full, failing or forbidden disk is marked on the disk: no new copy goes there until it recovers.
            await recordDiskHealth(this.ctx, cur.spec?.nodeID ?? '', cur.spec?.diskUUID ?? '', info.message).catch(() => false);
          } else if (currentState !== prevState && currentState === 'ready-for-transfer') {
            await recordDiskHealth(this.ctx, cur.spec?.nodeID ?? '', cur.spec?.diskUUID ?? '', undefined).catch(() => false);
            this.ctx.events.record(EventSource.BackingImageDataSource, imageRef(this.ctx, name), 'Normal', EventReason.Completed, `The data source of backing image ${name} prepared the first file (${info.size} bytes, SHA-512 ${info.currentChecksum.slice(0, 16)}…)`);
          }
          return;
        } catch (err) {
          if (!isConflict(err) || attempt >= 5) throw err;
        }
        cur = await getOrUndefined(store.get(BackingImageDataSourceKind, name, namespace));
      }
    } catch (err) {
      m.failures++;
      this.ctx.log.debug(`data source monitor ${name}: ${errMessage(err)}`);
      if (m.failures >= MAX_MONITOR_RETRY_COUNT) {
        this.ctx.log.warn(`data source monitor ${name} stops after ${m.failures} failed polls`);
        this.stopMonitor(name);
        this.enqueue(name);
      }
    } finally {
      m.busy = false;
      if (m.again) {
        m.again = false;
        // a fresh answer: what was asked for while this poll ran
        void this.poll(name, m);
      }
    }
  }
}

/** Waits `ms`, or less when `signal` aborts. */
async function sleep(ms: number, signal: AbortSignal): Promise<void> {
  await sleepFor(ms, undefined, { signal }).catch(() => undefined);
}

function diff<T extends object>(before: T, after: T): Partial<T> {
  const out: Partial<T> = {};
  for (const k of Object.keys(after) as (keyof T)[]) if (changed(before[k], after[k])) out[k] = after[k];
  return out;
}
