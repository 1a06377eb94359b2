import { isGrpcStatus, MANAGER_API_MIN_VERSION, MANAGER_API_VERSION } from '@bis/bimrpc';
import type { BackingImageFileInfo, BackingImageManagerStatus } from '@bis/crd-types';
import { formatRetryDelay, isConflict, isNotFound, isPermanentError, PermanentError, getForReading, shareValue, updateStatusForReading, type Stored } from '@bis/datastore';
import { FILE_MACHINE, IllegalTransitionError, MANAGER_MACHINE, transition, type ManagerEvent } from '@bis/state-machine';
import { Backoff } from './backoff.js';
import { Controller, isResponsibleFor, type ControllerContext } from './base-controller.js';
import { DISK_PROBE_BYTES, probeDiskWrite, recordDiskHealth } from './disk-conditions.js';
import { DISK_HEALTHY_CONDITION, failedCopyMessage } from './disk-errors.js';
import { cachedOrGet, changed, defaultManagerImage, errMessage, getOrUndefined, imageRef, listManagers, nodeDownChecker, onlyProgressDiffers, topology } from './common.js';
import { nodeChangeMatters } from './topology.js';
import type { ManagerApi, WorkloadStatus } from './data-plane.js';
import { EventReason, EventSource } from './events.js';
import { BackingImageDataSourceKind, BackingImageKind, BackingImageManagerKind, NodeKind, type BackingImage, type BackingImageDataSource, type BackingImageManager } from './kinds.js';
import { ImageAttention, type Look } from './image-attention.js';
import { KeyOrder } from './map-diff.js';
import { fileMapFromList } from './manager-api.js';
import { Annotation, FINALIZER } from './names.js';
import { IN_PROGRESS, NodeSyncLimiter, pickSender, receiversBySender, SENDING_LIMIT, SenderGrants, senderIsFull } from './rules.js';
import { SettingName } from './settings.js';

export const MAX_MONITOR_RECEIVE_ERRORS = 10;

/** How often a manager that keeps waiting for the per-node replenish limit logs it again. */
const LIMIT_LOG_INTERVAL_MS = 10_000;

/** A file of a manager on the node, as the per-node replenish limit counts it (a read-only view). */
type NodeFile = { diskUUID: string; biName: string; state: string };

/**
 * How long a Fetch or Sync this controller requested is not requested again while the manager's listed files do not
 * show it yet (the monitor's next List does). Without it every reconcile in between repeats the call and gets
 * AlreadyExists (measured: ~6 Fetch calls per image under load); with it the call is repeated only if the file never
 * shows up.
 */
export const FILE_REQUEST_GRACE_MS = 30_000;

/** A manager that reported changes is Listed again after this many times what its List and status write take. */
const LIST_INTERVAL_FACTOR = 5;

/** gRPC status codes used here (grpc-js `status`). */
const grpcStatus = { INVALID_ARGUMENT: 3, NOT_FOUND: 5, ALREADY_EXISTS: 6 } as const;

interface Monitor {
  address: string;
  cancelWatch?: () => void;
  timer: NodeJS.Timeout;
  dirty: boolean;
  ticks: number;
  /** When the last List started (ms since epoch); Lists are at most one per `managerPollMs`. */
  lastListAt: number;
  /** A List requested by a notification before the List interval passed since the last one. */
  kickTimer?: NodeJS.Timeout;
  /** How long a List and its status write take (ms, smoothed): the interval between Lists follows it. */
  listMs: number;
  receiveErrors: number;
  busy: boolean;
  stopped: boolean;
  /** When the monitor last wrote the status (progress-only changes wait for `managerProgressWriteMs` after it). */
  lastWriteAt: number;
  /** The List that writes a progress-only change once its wait is over. */
  progressTimer?: NodeJS.Timeout;
}

/**
 * AlreadyExists from a Fetch/Sync means the file is already being prepared or present (a reconcile raced the
 * monitor's status update). Some managers answer it as UNKNOWN with an "already exists" message; both count.
 */
function isAlreadyExistsError(err: unknown): boolean {
  return isGrpcStatus(err, grpcStatus.ALREADY_EXISTS) || /already exists/i.test(String((err as { details?: string }).details ?? (err as Error)?.message ?? ''));
}

function workloadEvent(w: WorkloadStatus, bim: BackingImageManager): ManagerEvent {
  if (w.phase !== 'missing' && w.nodeID !== bim.spec?.nodeID) return 'workload-failed';
  switch (w.phase) {
    case 'missing':
      return 'workload-missing';
    case 'pending':
      return 'workload-pending';
    case 'ready':
      return 'workload-ready';
    case 'not-ready':
      return 'workload-not-ready';
    default:
      return 'workload-failed';
  }
}

/** Longhorn's BackingImageManager controller (§3.3). */
export class BackingImageManagerController extends Controller {
  readonly name = 'backing-image-manager';
  private readonly monitors = new Map<string, Monitor>();
  /** Per-manager file backoff (1 → 5 min), keyed by BI name inside. */
  private readonly fileBackoffs = new Map<string, Backoff>();
  /** Workload restart backoff (1 s → 120 s), keyed by manager name. */
  readonly restartBackoff: Backoff;
  readonly syncLimiter = new NodeSyncLimiter();
  /** Syncs asked for per sender, counted until the receiving copies show them (see SenderGrants). */
  readonly senderGrants = new SenderGrants();
  /** Managers with a copy to sync that found every ready copy at its sending limit: looked at again on any file change. */
  private readonly waitingForSender = new Set<string>();
  /** When a waiting copy (`manager/bi`) was last told to ask another sender. */
  private readonly syncedAgainAt = new Map<string, number>();
  /** Which images each manager's next reconcile looks at one by one (the others were steady when last looked at). */
  readonly attention = new ImageAttention();
  /** The copies in passing states of each file map object read (see passingFiles). */
  private readonly passing = new WeakMap<object, { diskUUID: string; files: NodeFile[] }>();
  /** The reconciles' file map drafts that had entries replaced or removed (their status write compares the map only then). */
  private readonly editedFileMaps = new WeakSet<object>();
  /** Per manager: the order of the images in its spec (see KeyOrder). */
  private readonly specOrders = new Map<string, KeyOrder>();
  private readonly gcTimer: NodeJS.Timeout;
  /** Fetch/Sync calls made and not yet visible in the manager's file map: manager name → BI name → when. */
  private readonly requested = new Map<string, Map<string, number>>();
  /** The attempt whose failure the monitor last saw, per manager and BI (its backoff window starts when it is seen). */
  private readonly failureSeen = new Map<string, Map<string, number>>();
  /** Managers that found the per-node replenish limit reached, by node: enqueued when a copy on the node finishes. */
  private readonly waitingForSlot = new Map<string, Set<string>>();
  /** When each waiting manager last logged the per-node limit. */
  private readonly limitLoggedAt = new Map<string, number>();
  /** How long each manager's last reconcile took (ms). */
  private readonly reconcileMs = new Map<string, number>();
  /** How long each manager's last reconcile waited for the Fetches it made (ms): not work of the controller. */
  private readonly fetchWaitMs = new Map<string, number>();
  /** When each unhealthy disk was last probed (ms). */
  private readonly lastProbe = new Map<string, number>();

  constructor(ctx: ControllerContext) {
    super(ctx);
    this.restartBackoff = new Backoff(ctx.timing.managerRestartInitialMs, ctx.timing.managerRestartMaxMs);
    this.gcTimer = setInterval(() => this.restartBackoff.gc(), 12 * 3600_000);
    this.gcTimer.unref();
    ctx.informers.on(BackingImageManagerKind, (t, o, old) => {
      if (t === 'DELETED') this.attention.forget(o.metadata.name);
      else if (t === 'MODIFIED' && old) this.attention.markChanges(old, o);
      else this.attention.all(o.metadata.name); // its first sight and its resync look at every image
      this.enqueue(o.metadata.name);
      // A changed file map may have released a per-node sync slot: the managers waiting for one look again now
      // instead of at their next 1 s retry.
      if (t === 'MODIFIED' && old?.status?.backingImageFileMap !== o.status?.backingImageFileMap) {
        const waiting = this.waitingForSlot.get(o.spec?.nodeID ?? '');
        if (waiting) for (const n of waiting) if (n !== o.metadata.name) this.enqueue(n);
        // a send may have ended or a copy become ready: a sender may have room now
        for (const n of this.waitingForSender) if (n !== o.metadata.name) this.enqueue(n);
      }
    });
    // A manager's reconcile looks at every image of its disk: the changes of images and data sources (thousands per
    // second while many images are created) reach it gathered, after 20 times its last reconcile's duration (at most
    // managerEventCoalesceMs), which keeps what they cost it to about 5 % of a core however many images it holds.
    const gathered = (name: string) => this.queue.addAfter(name, Math.min(ctx.timing.managerEventCoalesceMs, Math.floor(20 * (this.reconcileMs.get(name) ?? 0))));
    // as in Longhorn, the handlers for other kinds have no resync (the manager's own resync brings it back every 30 s)
    ctx.informers.on(BackingImageKind, (t, bi) => {
      if (t === 'RESYNC') return;
      for (const m of ctx.informers.cached(BackingImageManagerKind)) {
        const listed = m.spec?.backingImages?.[bi.metadata.name] !== undefined;
        if (listed || m.status?.backingImageFileMap?.[bi.metadata.name] !== undefined) this.attention.mark(m.metadata.name, bi.metadata.name);
        if (listed || m.metadata.annotations?.[Annotation.PrestartedFor] === bi.metadata.name) gathered(m.metadata.name);
      }
    });
    ctx.informers.on(BackingImageDataSourceKind, (t, b) => {
      if (t === 'RESYNC') return;
      for (const m of ctx.informers.cached(BackingImageManagerKind)) {
        // every manager with a copy of the image looks at it again (a failed data source asks for the file again);
        // as before, only the data source's own disk's manager is reconciled for it now
        if (m.spec?.backingImages?.[b.metadata.name] !== undefined || m.spec?.diskUUID === b.spec?.diskUUID) this.attention.mark(m.metadata.name, b.metadata.name);
        if (m.spec?.diskUUID === b.spec?.diskUUID) gathered(m.metadata.name);
      }
    });
    ctx.informers.on(NodeKind, (t, n, old) => {
      if (!nodeChangeMatters(t, n, old)) return;
      for (const m of ctx.informers.cached(BackingImageManagerKind)) {
        if (m.spec?.nodeID !== n.metadata.name) continue;
        this.attention.all(m.metadata.name);
        this.enqueue(m.metadata.name);
      }
    });
    ctx.dataPlane.onWorkloadChange((kind, name) => {
      if (kind !== 'manager') return;
      this.attention.all(name);
      this.enqueue(name);
    });
  }

  protected override async onStop(): Promise<void> {
    clearInterval(this.gcTimer);
    for (const name of [...this.monitors.keys()]) this.stopMonitor(name);
  }

  private fileBackoff(bim: string): Backoff {
    let b = this.fileBackoffs.get(bim);
    if (!b) this.fileBackoffs.set(bim, (b = new Backoff(this.ctx.timing.fileBackoffInitialMs, this.ctx.timing.fileBackoffMaxMs)));
    return b;
  }

  private event(bim: BackingImageManager, type: 'Normal' | 'Warning', reason: string, message: string): void {
    this.ctx.events.record(EventSource.BackingImageManager, bim, type, reason, message);
  }

  async reconcile(name: string): Promise<void> {
    const started = performance.now();
    try {
      await this.reconcileManager(name);
    } finally {
      // the reconcile's own time: the wait for its Fetches (the manager copying first files from their data sources)
      // would stretch the gathering of the next changes, among them the next data sources ready for transfer
      this.reconcileMs.set(name, Math.max(0, performance.now() - started - (this.fetchWaitMs.get(name) ?? 0)));
      this.fetchWaitMs.delete(name);
    }
  }

  private async reconcileManager(name: string): Promise<void> {
    const { store, namespace, nodeID } = this.ctx;
    // The embedded store hands out its committed object (a manager's object lists every image of its disk, and a copy
    // of it per reconcile was the largest single cost at 1,000 images); the reconcile never changes what it read: its
    // own top level is copied (the metadata is replaced after an annotation write), the status below.
    const read = await getOrUndefined(getForReading(store, BackingImageManagerKind, name, namespace));
    const bim = read ? { ...read } : undefined;
    if (!bim) {
      this.stopMonitor(name);
      return;
    }
    const isDown = await nodeDownChecker(this.ctx);
    if (!isResponsibleFor(nodeID, bim.spec?.nodeID ?? '', bim.status?.ownerID ?? '', isDown)) {
      this.stopMonitor(name);
      return;
    }
    if (bim.status?.ownerID !== nodeID) {
      await updateStatusForReading(store, BackingImageManagerKind, { ...bim, status: { ...bim.status, ownerID: nodeID } });
      return;
    }
    const image = await defaultManagerImage(this.ctx);
    if (bim.metadata.deletionTimestamp) return this.handleDeletion(bim, image);
    if (await this.orphanedPrestart(bim)) return;

    // A shallow copy of the status; its file map is the one read, copied only by the first edit of this reconcile
    // (editableFileMap), and entries are replaced, never edited in place. Copying the whole map of a disk with thousands
    // of files on every reconcile was one of the O(files) costs per event.
    const status: BackingImageManagerStatus = { ...bim.status, backingImageFileMap: bim.status?.backingImageFileMap ?? {} };
    try {
      await this.sync(bim, status, image);
    } finally {
      // The file map is compared only when this reconcile replaced or removed entries (a disk may hold thousands).
      const mapEdited = !bim.status?.backingImageFileMap || this.editedFileMaps.has(status.backingImageFileMap!);
      const before = { ...bim.status, backingImageFileMap: undefined };
      const after = { ...status, backingImageFileMap: undefined };
      if (changed(before, after) || (mapEdited && changed(bim.status?.backingImageFileMap ?? {}, status.backingImageFileMap))) await this.writeStatus(bim, status);
    }
  }

  /**
   * A manager started ahead of an image's next copy (EXTENSION, `Annotation.PrestartedFor`) whose image is gone or
   * being deleted while no image is in its spec: deleted here, since that image's controller no longer looks at it (a
   * reconcile that read the image just before its delete may have created it just after).
   */
  private async orphanedPrestart(bim: Stored<BackingImageManager>): Promise<boolean> {
    const image = bim.metadata.annotations?.[Annotation.PrestartedFor];
    if (!image || Object.keys(bim.spec?.backingImages ?? {}).length > 0) return false;
    const bi = await getOrUndefined(this.ctx.store.get(BackingImageKind, image, this.ctx.namespace));
    if (bi && !bi.metadata.deletionTimestamp) return false;
    this.ctx.log.info(`manager ${bim.metadata.name} was started ahead for backing image ${image}, which is ${bi ? 'being deleted' : 'gone'}: deleting it`);
    await this.ctx.store.delete(BackingImageManagerKind, bim.metadata.name, bim.metadata.namespace).catch((err: unknown) => {
      if (!isNotFound(err)) throw err;
    });
    return true;
  }

  /**
   * Writes the reconcile's status. Optimistic first (no re-read); on a conflict the latest object is read and this
   * reconcile's decisions are merged onto it: the monitor owns backingImageFileMap between reconciles, so its newer
   * map is kept unless this reconcile changed the map.
   */
  private async writeStatus(bim: Stored<BackingImageManager>, status: BackingImageManagerStatus): Promise<void> {
    const { store, namespace } = this.ctx;
    const name = bim.metadata.name;
    try {
      await updateStatusForReading(store, BackingImageManagerKind, { ...bim, status });
      return;
    } catch (err) {
      if (!isConflict(err)) throw err;
    }
    const latest = await getOrUndefined(store.get(BackingImageManagerKind, name, namespace));
    if (!latest || latest.metadata.deletionTimestamp) return;
    const merged = { ...latest.status, ...status };
    if (!changed(bim.status?.backingImageFileMap ?? {}, status.backingImageFileMap)) merged.backingImageFileMap = latest.status?.backingImageFileMap ?? {};
    if (!changed(latest.status, merged)) return;
    try {
      await updateStatusForReading(store, BackingImageManagerKind, { ...latest, status: merged });
    } catch (err) {
      if (!isConflict(err)) throw err;
      this.enqueue(name);
    }
  }

  private async handleDeletion(bim: Stored<BackingImageManager>, image: string): Promise<void> {
    const name = bim.metadata.name;
    const address = bim.metadata.annotations?.[Annotation.Address];
    if (bim.spec?.image === image && bim.status?.currentState === 'running' && address) {
      const api = this.ctx.dataPlane.managerClient(address);
      // What the manager holds now, not only what the status last showed: a Fetch that returned just before this
      // reconcile (the reconcile that asked for it waits for it) registered a file the monitor may not have reported
      // yet, and the stopped manager would leave it on the disk for good.
      const files = { ...(bim.status?.backingImageFileMap ?? {}) };
      try {
        Object.assign(files, fileMapFromList(await api.list()));
      } catch (err) {
        this.ctx.log.warn(`failed to list the files of manager ${name} before deleting it: ${errMessage(err)}`);
      }
      for (const [bi, f] of Object.entries(files)) {
        try {
          await api.delete(bi, f.uuid ?? '');
        } catch (err) {
          this.ctx.log.warn(`failed to delete backing image ${bi} from manager ${name}: ${errMessage(err)}`);
        }
      }
    }
    this.syncLimiter.dropDisk(bim.spec?.diskUUID ?? '');
    this.stopMonitor(name);
    this.fileBackoffs.delete(name);
    this.failureSeen.delete(name);
    this.requested.delete(name);
    this.specOrders.delete(name);
    for (const w of this.waitingForSlot.values()) w.delete(name);
    this.limitLoggedAt.delete(name);
    this.waitingForSender.delete(name);
    this.senderGrants.dropManager(name);
    this.restartBackoff.reset(name);
    await this.ctx.dataPlane.deleteManager(name);
    const finalizers = (bim.metadata.finalizers ?? []).filter((f) => f !== FINALIZER);
    await this.ctx.store.update(BackingImageManagerKind, { ...bim, metadata: { ...bim.metadata, finalizers } });
  }

  /** The reconcile's file map, ready to be edited: a copy of the map read, made at the first edit (copy-on-write). */
  private editableFileMap(status: BackingImageManagerStatus): Record<string, BackingImageFileInfo> {
    let map = status.backingImageFileMap!;
    if (!this.editedFileMaps.has(map)) {
      map = { ...map };
      status.backingImageFileMap = map;
      this.editedFileMaps.add(map);
    }
    return map;
  }

  private markFilesUnknown(bim: BackingImageManager, status: BackingImageManagerStatus, message: string, addPlaceholders: boolean, biUUIDs: Record<string, string>): void {
    const map = this.editableFileMap(status);
    const subject = (bi: string) => `file ${bi} of backing image manager ${bim.metadata.name}`;
    for (const [bi, f] of Object.entries(map)) {
      // A failed file stays failed (Longhorn marks every non-failed file unknown).
      if (f.state === 'failed' || f.state === 'failed-and-cleanup') continue;
      // Replaced, not edited: the entries are shared with the status read at the start of the reconcile.
      map[bi] = { ...f, state: transition(FILE_MACHINE, f.state ?? '', 'lost', subject(bi)), ...(message ? { message } : {}) };
    }
    if (addPlaceholders) {
      for (const bi of Object.keys(bim.spec?.backingImages ?? {})) {
        map[bi] ??= { name: bi, uuid: biUUIDs[bi] ?? '', state: transition(FILE_MACHINE, '', 'lost', subject(bi)), message: '', size: 0, virtualSize: 0, realSize: 0, currentChecksum: '', sendingReference: 0, senderManagerAddress: '', progress: 0 };
      }
    }
  }

  private async sync(bim: Stored<BackingImageManager>, status: BackingImageManagerStatus, image: string): Promise<void> {
    const { store, namespace } = this.ctx;
    const name = bim.metadata.name;
    const topo = await topology(this.ctx);
    const disk = bim.spec?.diskUUID ?? '';
    const f = topo.readyDisk(disk);
    if (!f || f.node.name !== bim.spec?.nodeID || f.disk.path !== bim.spec?.diskPath) {
      if (status.currentState !== 'unknown') {
        this.event(bim, 'Warning', EventReason.Unknown, `Backing image manager ${name} becomes state unknown: disk ${disk} is not ready or moved`);
        status.currentState = transition(MANAGER_MACHINE, status.currentState ?? '', 'disk-unavailable', name);
        this.stopMonitor(name);
        this.restartBackoff.reset(name);
        const uuids: Record<string, string> = {};
        for (const bi of Object.keys(bim.spec?.backingImages ?? {})) {
          const o = await getOrUndefined(store.get(BackingImageKind, bi, namespace));
          uuids[bi] = o?.status?.uuid ?? '';
        }
        this.markFilesUnknown(bim, status, '', true, uuids);
      }
      if (!f && !topo.node(bim.spec?.nodeID ?? '')?.disks.some((d) => d.diskUUID === disk)) await this.evictMissingDisk(bim);
      return;
    }

    const w = await this.ctx.dataPlane.managerStatus(bim);
    const prev = status.currentState ?? '';
    // An illegal move throws: the reconcile fails with the error (manager, state, event), logged as a warning.
    status.currentState = transition(MANAGER_MACHINE, prev, workloadEvent(w, bim), name);
    const next = status.currentState;
    if (next === 'running') {
      status.message = '';
      if (prev !== 'running') this.event(bim, 'Normal', EventReason.Running, 'Backing image manager becomes state running');
      status.ip = w.ip;
      status.storageIP = w.ip;
      const ann = bim.metadata.annotations ?? {};
      if (ann[Annotation.Address] !== w.address || ann[Annotation.SyncAddress] !== w.syncAddress) {
        const u = await store.update(BackingImageManagerKind, { ...bim, metadata: { ...bim.metadata, annotations: { ...ann, [Annotation.Address]: w.address, [Annotation.SyncAddress]: w.syncAddress } } });
        bim.metadata = u.metadata;
      }
      if (!status.apiVersion) {
        const v = await this.ctx.dataPlane.managerClient(w.address).versionGet();
        status.apiVersion = v.backingImageManagerApiVersion;
        status.apiMinVersion = v.backingImageManagerApiMinVersion;
      }
    } else {
      if (prev === 'running') this.event(bim, 'Warning', EventReason.Unknown, `Backing image manager becomes state ${next}${w.message ? `: ${w.message}` : ''}`);
      status.ip = '';
      status.storageIP = '';
      status.apiVersion = 0;
      status.apiMinVersion = 0;
    }
    if (bim.spec?.image !== image) return;
    if (next === 'running') this.startMonitor(name, w.address);
    else this.stopMonitor(name);

    if (next === 'error' || next === 'stopped') {
      this.markFilesUnknown(bim, status, 'Backing image manager pod is not running', false, {});
      if (w.phase !== 'missing' && w.phase !== 'deleting') {
        await this.ctx.dataPlane.deleteManager(name);
        this.queue.addAfter(name, 200);
      } else if (w.phase === 'missing' && bim.spec?.nodeID === this.ctx.nodeID) {
        if (this.restartBackoff.isInBackOffSinceUpdate(name)) {
          this.queue.addAfter(name, this.restartBackoff.remaining(name) + 10);
        } else {
          this.restartBackoff.next(name);
          try {
            await this.ctx.dataPlane.startManager(bim, {
              scrubIntervalSeconds: await this.ctx.settings.int(SettingName.BackingImageScrubInterval),
              scrubBandwidth: await this.ctx.settings.int(SettingName.BackingImageScrubBandwidth),
            });
          } catch (err) {
            // Operators see why in the object (the reconcile's finally writes it), the log and an event.
            status.message = `failed to start the backing image manager: ${errMessage(err)}`;
            this.event(bim, 'Warning', EventReason.FailedStarting, status.message);
            throw err;
          }
          status.message = '';
          status.currentState = transition(MANAGER_MACHINE, next, 'workload-created', name);
          this.event(bim, 'Normal', EventReason.Create, `Starting backing image manager ${name} on node ${bim.spec?.nodeID} disk ${bim.spec?.diskUUID}`);
        }
      }
      return;
    }
    if (next === 'starting') {
      this.queue.addAfter(name, 300);
      return;
    }
    if (next !== 'running') return;
    const compatible = !status.apiVersion || (MANAGER_API_MIN_VERSION <= (status.apiVersion ?? 0) && MANAGER_API_VERSION >= (status.apiMinVersion ?? 0));
    if (!compatible) {
      this.ctx.log.warn(`backing image manager ${name} speaks API [${status.apiMinVersion}, ${status.apiVersion}], incompatible with [${MANAGER_API_MIN_VERSION}, ${MANAGER_API_VERSION}]`);
      return;
    }
    const api = this.ctx.dataPlane.managerClient(w.address);
    // The images whose copy here is not steady after the passes are looked at again by the next reconcile; a pass
    // that failed leaves the next one looking at every image.
    const look = this.attention.take(name);
    const again = new Set<string>();
    try {
      await this.deleteInvalidFiles(bim, status, api, look, again);
      await this.prepareFiles(bim, status, api, image, look, again);
    } catch (err) {
      this.attention.all(name);
      throw err;
    }
    for (const image of again) this.attention.mark(name, image);
    await this.probeUnhealthyDisk(bim);
  }

  /**
   * A disk marked unhealthy (ENOSPC, EIO, permissions) is probed once per file backoff window (the longest wait of a
   * failed copy): a probe write that succeeds marks it healthy again, also when no copy on it is retried any more.
   */
  private async probeUnhealthyDisk(bim: BackingImageManager): Promise<void> {
    const diskUUID = bim.spec?.diskUUID ?? '';
    const node = this.ctx.informers.cached(NodeKind).find((n) => n.metadata.name === bim.spec?.nodeID);
    const cond = Object.values(node?.status?.diskStatus ?? {})
      .find((d) => d.diskUUID === diskUUID)
      ?.conditions?.find((c) => c.type === DISK_HEALTHY_CONDITION && c.status === 'False');
    if (!cond || !bim.spec?.diskPath) return;
    const window = this.ctx.timing.fileBackoffMaxMs;
    const since = Math.max(Date.parse(cond.lastTransitionTime ?? '') || 0, this.lastProbe.get(diskUUID) ?? 0);
    const wait = since + window - this.ctx.now().getTime();
    if (wait > 0) {
      this.queue.addAfter(bim.metadata.name, wait + 10);
      return;
    }
    this.lastProbe.set(diskUUID, this.ctx.now().getTime());
    const failure = await probeDiskWrite(bim.spec.diskPath);
    if (failure) {
      this.ctx.log.debug(`disk ${diskUUID}: the probe write failed, it stays unhealthy: ${failure}`);
      this.queue.addAfter(bim.metadata.name, window);
      return;
    }
    await recordDiskHealth(this.ctx, bim.spec?.nodeID ?? '', diskUUID, undefined, `a probe write of ${DISK_PROBE_BYTES} bytes succeeded after the backoff window`);
  }

  private async evictMissingDisk(bim: BackingImageManager): Promise<void> {
    const { store, namespace } = this.ctx;
    const disk = bim.spec?.diskUUID ?? '';
    for (const biName of Object.keys(bim.spec?.backingImages ?? {})) {
      const bi = await getOrUndefined(store.get(BackingImageKind, biName, namespace));
      const e = bi?.spec?.diskFileSpecMap?.[disk];
      if (!bi || !e || e.evictionRequested) continue;
      await store.update(BackingImageKind, { ...bi, spec: { ...bi.spec, diskFileSpecMap: { ...bi.spec!.diskFileSpecMap, [disk]: { ...e, evictionRequested: true } } } });
    }
  }

  /** `keepBackoff`: a failed copy removed to be tried again keeps its backoff (resetting it made a retry storm). */
  private async deleteFile(bim: BackingImageManager, status: BackingImageManagerStatus, api: ReturnType<typeof this.ctx.dataPlane.managerClient>, biName: string, uuid: string, keepBackoff = false): Promise<void> {
    try {
      await api.delete(biName, uuid);
    } catch (err) {
      if (!isGrpcStatus(err, grpcStatus.NOT_FOUND)) throw err;
    }
    delete this.editableFileMap(status)[biName];
    this.requested.get(bim.metadata.name)?.delete(biName);
    if (!keepBackoff) this.fileBackoff(bim.metadata.name).reset(biName);
    this.event(bim, 'Normal', EventReason.Delete, `Deleted backing image ${biName} in disk ${bim.spec?.diskUUID} on node ${bim.spec?.nodeID}`);
    this.ctx.events.record(EventSource.BackingImageManager, imageRef(this.ctx, biName), 'Normal', EventReason.Delete, `Deleted the copy of backing image ${biName} on disk ${this.diskText(bim)}`);
  }

  /**
   * Deletes the files of images that are gone, of another UUID, or failed here while a copy elsewhere is healthy.
   * `look`: the images to look at (see ImageAttention); those that still need a look are added to `again`.
   */
  private async deleteInvalidFiles(
    bim: Stored<BackingImageManager>,
    status: BackingImageManagerStatus,
    api: ReturnType<typeof this.ctx.dataPlane.managerClient>,
    look: Look,
    again: Set<string>,
  ): Promise<void> {
    const { store, namespace } = this.ctx;
    const disk = bim.spec?.diskUUID ?? '';
    // once the cache has synced it is read without an await per image (a disk may hold thousands)
    const cached = this.ctx.informers.hasSynced(BackingImageKind);
    // read from the status each time: a deleteFile replaces the map (copy-on-write)
    for (const biName of look === 'all' ? Object.keys(status.backingImageFileMap!) : [...look]) {
      const file = status.backingImageFileMap![biName];
      if (!file) continue;
      const bi = cached ? this.ctx.informers.cachedGet(BackingImageKind, biName) : await cachedOrGet(this.ctx, BackingImageKind, biName);
      if (!bi) {
        await this.deleteFile(bim, status, api, biName, file.uuid ?? '');
        continue;
      }
      const uuid = bi.status?.uuid ?? '';
      if (!uuid) {
        again.add(biName);
        continue;
      }
      if (bim.spec?.backingImages?.[biName] !== uuid || file.uuid !== uuid) {
        await this.deleteFile(bim, status, api, biName, file.uuid ?? '');
        continue;
      }
      const own = bi.status?.diskFileStatusMap?.[disk];
      const failedHere = own ? own.state === 'failed' : file.state === 'failed';
      if (!failedHere) continue;
      again.add(biName);
      const otherHealthy = Object.entries(bi.status?.diskFileStatusMap ?? {}).some(([d, s]) => d !== disk && s.state !== 'failed');
      if (!otherHealthy) continue;
      // The failed copy stays (its state and message visible) until its backoff window ends; then it is removed and
      // synced again in this reconcile.
      const backoff = this.fileBackoff(bim.metadata.name);
      if (file.state === 'failed' && backoff.isInBackOffSinceUpdate(biName)) {
        this.queue.addAfter(bim.metadata.name, backoff.remaining(biName) + 10);
        continue;
      }
      await this.deleteFile(bim, status, api, biName, file.uuid ?? '', true);
    }
  }

  /**
   * The sender for a copy of `biName` on manager `name`, and the other ready copies to name. A sender's count is the
   * largest of its status, the copies listed as received from it (by the controllers of every node), and the Syncs
   * this controller asked of it that its receivers do not show done.
   */
  private chooseSender(all: readonly Stored<BackingImageManager>[], biName: string, name: string, image: string) {
    const stateOn = (receiver: string): string | undefined => all.find((x) => x.metadata.name === receiver)?.status?.backingImageFileMap?.[biName]?.state;
    const receiving = receiversBySender(all.map((x) => x.status?.backingImageFileMap?.[biName]));
    const byAddress = new Map(all.map((m) => [m.metadata.annotations?.[Annotation.Address] ?? '', m.metadata.name]));
    const candidates = all
      .filter((m) => !m.metadata.deletionTimestamp && m.metadata.name !== name)
      .map((m) => {
        const file = m.status?.backingImageFileMap?.[biName] as BackingImageFileInfo | undefined;
        const address = m.metadata.annotations?.[Annotation.Address] ?? '';
        // a copy being received from a peer, by its status or by a Sync this controller just asked for: it can forward
        let receivesFrom: string | undefined;
        if (file && IN_PROGRESS.has(file.state ?? '') && file.senderManagerAddress) receivesFrom = byAddress.get(file.senderManagerAddress) ?? '';
        else if (!file) receivesFrom = this.senderGrants.upstreamOf(biName, m.metadata.name);
        const counts = file?.state === 'ready' || receivesFrom !== undefined;
        const granted = counts ? Math.max(this.senderGrants.live(m.metadata.name, biName, stateOn), receiving.get(address) ?? 0) : 0;
        // a copy only this controller knows of (its Sync was just asked for) has no file yet: no state, its sends counted
        const base: Pick<BackingImageFileInfo, 'state' | 'sendingReference'> | undefined = file ?? (receivesFrom !== undefined ? { sendingReference: 0 } : undefined);
        const counted = base && granted > (base.sendingReference ?? 0) ? { ...base, sendingReference: granted } : base;
        return { m, name: m.metadata.name, running: m.status?.currentState === 'running', defaultImage: m.spec?.image === image, file: counted, receivesFrom };
      });
    const { sender, alternatives = [], anyReady } = pickSender(candidates, name);
    return { sender, alternatives, anyReady };
  }

  /**
   * A copy whose receive waits for its sender: when that sender sends to as many peers as it may (3 copies listed as
   * being received from it) or more copies wait for it than for another ready copy with room, the manager is told to
   * ask that one (a Sync again, which gives a waiting receive new senders). Several controllers chose that sender at
   * once, before any of them saw the others' Syncs; meanwhile more copies became ready. At most once per 5 s per copy.
   */
  private async syncAgainIfSenderFull(
    bim: Stored<BackingImageManager>,
    api: ManagerApi,
    all: readonly Stored<BackingImageManager>[],
    bi: Stored<BackingImage>,
    bids: Stored<BackingImageDataSource>,
    file: BackingImageFileInfo,
    image: string,
  ): Promise<boolean> {
    const name = bim.metadata.name;
    const biName = bi.metadata.name;
    const current = file.senderManagerAddress ?? '';
    const key = `${name}/${biName}`;
    const t = Date.now();
    if (t - (this.syncedAgainAt.get(key) ?? -Infinity) < 5000) return false;
    const files = all.map((m) => m.status?.backingImageFileMap?.[biName]);
    const { sender, alternatives } = this.chooseSender(all, biName, name, image);
    const from = sender?.m.metadata.annotations?.[Annotation.Address];
    if (!sender || !from || from === current) return false;
    // Move when the sender is full, or when the other copy has fewer takers even with this one (the copies listed
    // as received from it, this one included): when the first copies become ready and their sender frees its slots
    // at the same moment, the copies waiting for it spread over the new ones instead of taking it again.
    const takers = receiversBySender(files);
    const full = senderIsFull(files, current);
    if (!full && (takers.get(from) ?? 0) + 1 >= (takers.get(current) ?? 0)) return false;
    this.syncedAgainAt.set(key, t);
    const size = bi.status?.size || bids.status?.size || 0;
    try {
      await api.sync({ spec: { name: biName, uuid: bi.status?.uuid ?? '', checksum: bi.status?.checksum ?? '', size, virtualSize: 0, realSize: 0 }, fromAddress: from, alternativeFromAddresses: addressesOf(alternatives, from) });
    } catch (err) {
      if (isAlreadyExistsError(err)) return false; // a sender took it meanwhile
      throw err;
    }
    this.senderGrants.grant(sender.name, biName, name);
    this.fileListChanged(name);
    const why = full ? `${current} sends to as many peers as it may` : `${takers.get(current) ?? 0} copies wait for or take ${current}`;
    this.event(bim, 'Normal', EventReason.Syncing, `Syncing backing image ${biName} in disk ${bim.spec?.diskUUID} on node ${bim.spec?.nodeID} from ${sender.name}(${from}) instead: ${why}`);
    return true;
  }

  /**
   * Fetches first files and starts syncs for the images of the disk that have no usable copy here. `look`: the images
   * to look at (see ImageAttention); those whose copy here is not steady afterwards are added to `again`.
   */
  private async prepareFiles(
    bim: Stored<BackingImageManager>,
    status: BackingImageManagerStatus,
    api: ReturnType<typeof this.ctx.dataPlane.managerClient>,
    image: string,
    look: Look,
    again: Set<string>,
  ): Promise<void> {
    const { store, namespace } = this.ctx;
    const name = bim.metadata.name;
    const disk = bim.spec?.diskUUID ?? '';
    // Computed once per reconcile: the node's files for the per-node limit and the managers for sender selection.
    let shared: { limit: number; all: Awaited<ReturnType<typeof listManagers>> } | undefined;
    const sharedView = async () => {
      if (shared) return shared;
      const all = await listManagers(this.ctx);
      shared = { limit: await this.ctx.settings.int(SettingName.ConcurrentBackingImageReplenishPerNodeLimit), all };
      this.refreshSyncLimiter(bim.spec?.nodeID ?? '', all);
      return shared;
    };
    let waiting = 0;
    let noFreeSender = 0;
    const fetches: Promise<void>[] = [];
    let requested = this.requested.get(name);
    if (!requested) this.requested.set(name, (requested = new Map()));
    const now = Date.now();
    const markRequested = (biName: string) => requested.set(biName, Date.now());
    // Once the caches have synced they are read without an await per image (a disk may hold thousands).
    const inf = this.ctx.informers;
    const cached = inf.hasSynced(BackingImageKind) && inf.hasSynced(BackingImageDataSourceKind);
    // After a sync asked again of another sender (at most one per reconcile), the images not looked at yet wait for
    // the next reconcile.
    let stopped = false;
    // this pass's own verdicts (an image it finds waiting for its data source is steady for it, whatever it found first)
    const keep = new Set<string>();
    // The images waiting for a replenish slot are looked at when the node has one free (or when a change marks them).
    let looking = look;
    const slotWaiters = look === 'all' ? 0 : this.attention.slotWaiters(name);
    // Once the node's slots are all taken in this pass, the images that only waited for one (nothing of theirs changed:
    // a change would have marked them) wait again without a look: with thousands waiting, looking at each of them for
    // the one or two slots that came free was most of the pass.
    let waitedForSlot: ReadonlySet<string> = new Set<string>();
    let nodeFull = false;
    if (slotWaiters > 0) {
      const { limit } = await sharedView();
      if (limit < 1 || this.syncLimiter.counted(bim.spec?.nodeID ?? '').length < limit) {
        waitedForSlot = this.attention.takeSlotWaiters(name);
        looking = new Set([...look, ...waitedForSlot]);
      } else waiting += slotWaiters;
    }
    // In the spec's order (the order images were added to the disk, which is the order their syncs start).
    let order = this.specOrders.get(name);
    if (!order) this.specOrders.set(name, (order = new KeyOrder()));
    for (const biName of order.keys(bim.spec?.backingImages ?? {}, looking)) {
      if (stopped) {
        keep.add(biName);
        continue;
      }
      if (nodeFull && waitedForSlot.has(biName) && look !== 'all' && !look.has(biName)) {
        this.attention.waitForSlot(name, biName);
        waiting++;
        continue;
      }
      const bi = cached ? inf.cachedGet(BackingImageKind, biName) : await cachedOrGet(this.ctx, BackingImageKind, biName);
      const bids = cached ? inf.cachedGet(BackingImageDataSourceKind, biName) : await cachedOrGet(this.ctx, BackingImageDataSourceKind, biName);
      if (!bi || !bids) {
        keep.add(biName);
        continue;
      }
      const file = status.backingImageFileMap![biName];
      if (file) requested.delete(biName);
      const requireFile = !file || file.state === 'failed' || bids.status?.currentState === 'failed';
      if (!requireFile) {
        // steady (ready, or being received from a sender that has it): no look until something it depends on changes
        if (file && (file.state === 'pending' || file.state === 'starting') && file.senderManagerAddress) {
          keep.add(biName);
          if (await this.syncAgainIfSenderFull(bim, api, (await sharedView()).all, bi, bids, file, image)) stopped = true;
        }
        continue;
      }
      keep.add(biName);
      // Requested by an earlier reconcile and not listed yet (a failed data source is still cleaned up at once).
      if (!file && bids.status?.currentState !== 'failed' && now - (requested.get(biName) ?? -Infinity) < FILE_REQUEST_GRACE_MS) continue;
      const uuid = bi.status?.uuid ?? '';
      if (!bids.spec?.fileTransferred) {
        if (bids.spec?.diskUUID !== disk) {
          // the first file is made on another disk: the data source's change when it is transferred marks it again
          keep.delete(biName);
          continue;
        }
        if (bids.status?.currentState === 'failed') {
          try {
            await api.delete(biName, uuid);
          } catch (err) {
            if (!isGrpcStatus(err, grpcStatus.NOT_FOUND)) throw err;
          }
          await store.updateStatus(BackingImageDataSourceKind, { ...bids, status: { ...bids.status, currentState: transition(FILE_MACHINE, bids.status.currentState, 'cleaned-up', `data source ${biName}`) } });
          continue;
        }
        const dsAddress = bids.metadata.annotations?.[Annotation.Address];
        if (bids.status?.currentState !== 'ready-for-transfer' || !bids.status?.storageIP || !dsAddress) {
          // waits for its data source, whose changes mark it again
          keep.delete(biName);
          continue;
        }
        // A Fetch returns once the manager has the file from its data source; the first files of several images on
        // this disk are fetched concurrently (each from its own data source), all awaited before the reconcile ends.
        fetches.push(
          (async () => {
            try {
              await api.fetch({
                spec: { name: biName, uuid, checksum: bids.status?.checksum ?? '', size: bids.status?.size ?? 0, virtualSize: 0, realSize: 0 },
                dataSourceAddress: dsAddress,
              });
            } catch (err) {
              if (isGrpcStatus(err, grpcStatus.INVALID_ARGUMENT)) {
                // The manager can never take this file (e.g. its size is not a multiple of 512): retrying is useless.
                // The first file fails now with the cause; the image's recovery takes it from there.
                const message = `the backing image manager ${name} refused the first file: ${errMessage(err)}`;
                const cur = await getOrUndefined(store.get(BackingImageDataSourceKind, biName, namespace));
                if (cur && cur.status?.currentState !== 'failed' && cur.status?.currentState !== 'failed-and-cleanup') {
                  await store.updateStatus(BackingImageDataSourceKind, { ...cur, status: { ...cur.status, currentState: transition(FILE_MACHINE, cur.status?.currentState ?? '', 'fail', `data source ${biName}`), message } });
                }
                this.event(bim, 'Warning', EventReason.Error, message);
                throw new PermanentError(message, { cause: err });
              }
              if (!isAlreadyExistsError(err)) throw err;
            }
            markRequested(biName);
            this.fileListChanged(name);
            this.event(bim, 'Normal', EventReason.Fetching, `Fetched the first file for backing image ${biName} in disk ${disk} on node ${bim.spec?.nodeID}`);
          })(),
        );
        // Handled here too: if the loop throws before the fetches are awaited, their outcome is not an unhandled rejection.
        fetches[fetches.length - 1]!.catch(() => undefined);
        continue;
      }
      const backoff = this.fileBackoff(name);
      if (backoff.isInBackOffSinceUpdate(biName)) {
        this.queue.addAfter(name, backoff.remaining(biName) + 10);
        continue;
      }
      const { limit, all } = await sharedView();
      if (!this.syncLimiter.tryAcquire(bim.spec?.nodeID ?? '', disk, biName, limit)) {
        keep.delete(biName);
        this.attention.waitForSlot(name, biName);
        waiting++;
        nodeFull = true;
        continue;
      }
      const { sender, alternatives, anyReady } = this.chooseSender(all, biName, name, image);
      const size = bi.status?.size || bids.status?.size || 0;
      if (!anyReady) {
        backoff.next(biName);
        try {
          await api.fetch({ spec: { name: biName, uuid, checksum: bi.status?.checksum ?? '', size, virtualSize: 0, realSize: 0 }, dataSourceAddress: '' });
        } catch (err) {
          if (!isAlreadyExistsError(err)) throw err;
        }
        markRequested(biName);
        this.fileListChanged(name);
        this.event(bim, 'Normal', EventReason.Fetching, `Reuse the existing file for backing image ${biName} in disk ${disk} on node ${bim.spec?.nodeID}`);
        continue;
      }
      if (!sender) {
        // every ready copy sends to as many peers as it may: the slot goes back, and a file change brings this back
        this.syncLimiter.release(bim.spec?.nodeID ?? '', disk, biName);
        noFreeSender++;
        continue;
      }
      const from = sender.m.metadata.annotations?.[Annotation.Address];
      if (!from) continue;
      backoff.next(biName);
      try {
        await api.sync({ spec: { name: biName, uuid, checksum: bi.status?.checksum ?? '', size, virtualSize: 0, realSize: 0 }, fromAddress: from, alternativeFromAddresses: addressesOf(alternatives, from) });
      } catch (err) {
        if (!isAlreadyExistsError(err)) throw err;
      }
      this.senderGrants.grant(sender.name, biName, name);
      markRequested(biName);
      this.fileListChanged(name);
      this.event(bim, 'Normal', EventReason.Syncing, `Syncing backing image ${biName} in disk ${disk} on node ${bim.spec?.nodeID} from ${sender.name}(${from})`);
      // Longhorn starts one sync per reconcile of a manager (and the next one when the manager's status changes, after
      // its List: up to a second per sync). Here a reconcile starts as many as the per-node limit and the senders'
      // SendingLimit allow: both are counted as they are granted, so neither is exceeded.
    }
    for (const n of keep) again.add(n);
    const waitStarted = performance.now();
    const settled = await Promise.allSettled(fetches);
    if (fetches.length > 0) this.fetchWaitMs.set(name, performance.now() - waitStarted);
    const rejected = settled.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    // a permanent refusal was recorded in its data source's status; another failure is retried with backoff
    const failedFetch = rejected.find((r) => !isPermanentError(r.reason)) ?? rejected[0];
    if (failedFetch) throw failedFetch.reason;
    const node = bim.spec?.nodeID ?? '';
    if (waiting > 0) {
      let w = this.waitingForSlot.get(node);
      if (!w) this.waitingForSlot.set(node, (w = new Set()));
      w.add(name);
      // One line when the manager starts waiting, then at most one per LIMIT_LOG_INTERVAL_MS while it waits (not per
      // waiting image, nor per reconcile: with many images either is a log storm).
      const now = this.ctx.now().getTime();
      const last = this.limitLoggedAt.get(name);
      if (last === undefined || now - last >= LIMIT_LOG_INTERVAL_MS) {
        this.limitLoggedAt.set(name, now);
        this.ctx.log.warn(`backing image manager ${name}: per-node replenish limit ${shared?.limit} reached (${this.syncLimiter.counted(node).join(', ')}), ${waiting} backing image(s) wait`);
      }
      this.queue.addAfter(name, 1000);
    } else {
      this.waitingForSlot.get(node)?.delete(name);
      this.limitLoggedAt.delete(name);
    }
    if (noFreeSender > 0) {
      this.waitingForSender.add(name);
      this.ctx.log.info(`backing image manager ${name}: ${noFreeSender} backing image(s) wait for a ready copy with room to send (each sends to at most ${SENDING_LIMIT} peers at once)`);
      this.queue.addAfter(name, 1000);
    } else {
      this.waitingForSender.delete(name);
    }
  }

  /**
   * Brings the node's replenish slots up to date with its managers' file maps. What counts is the copies in passing
   * states (taken per map object: a committed map is replaced, never edited, so they are found once per write of a
   * manager, not once per reconcile of every manager on the node) and the state of each copy holding a slot.
   */
  private refreshSyncLimiter(node: string, all: readonly Stored<BackingImageManager>[]): void {
    const onNode = all.filter((m) => m.spec?.nodeID === node);
    const files: NodeFile[] = onNode.flatMap((m) => this.passingFiles(m));
    const byDisk = new Map(onNode.map((m) => [m.spec?.diskUUID ?? '', m]));
    for (const key of this.syncLimiter.counted(node)) {
      const i = key.indexOf('/');
      const diskUUID = key.slice(0, i);
      const biName = key.slice(i + 1);
      const f = byDisk.get(diskUUID)?.status?.backingImageFileMap?.[biName];
      if (f && !IN_PROGRESS.has(f.state ?? '')) files.push({ diskUUID, biName, state: f.state ?? '' });
    }
    this.syncLimiter.refresh(node, files);
  }

  /** The copies of a manager in passing states (see refreshSyncLimiter). */
  private passingFiles(m: Stored<BackingImageManager>): readonly NodeFile[] {
    const map = m.status?.backingImageFileMap;
    if (!map) return [];
    const diskUUID = m.spec?.diskUUID ?? '';
    const known = this.passing.get(map);
    if (known && known.diskUUID === diskUUID) return known.files;
    const files: NodeFile[] = [];
    for (const [biName, f] of Object.entries(map)) if (IN_PROGRESS.has(f.state ?? '')) files.push({ diskUUID, biName, state: f.state ?? '' });
    this.passing.set(map, { diskUUID, files });
    return files;
  }

  // ------------------------------------------------------------ monitor: Watch() + 1 s ticker with forced List

  /**
   * A ready copy clears its backoff. A failed copy's message names the disk, the disk condition (ENOSPC, EIO, …) and
   * when it is tried again; the backoff window of the failed attempt starts when its failure is first seen, and the
   * manager is reconciled when it ends.
   */
  private describeFailures(bim: BackingImageManager, map: Record<string, BackingImageFileInfo>): void {
    const name = bim.metadata.name;
    const backoff = this.fileBackoff(name);
    let seen = this.failureSeen.get(name);
    if (!seen) this.failureSeen.set(name, (seen = new Map()));
    const diskUUID = bim.spec?.diskUUID ?? '';
    const disk = this.ctx.informers.cached(NodeKind).flatMap((n) => Object.entries(n.status?.diskStatus ?? {})).find(([, d]) => d.diskUUID === diskUUID)?.[0] ?? diskUUID;
    for (const [bi, f] of Object.entries(map)) {
      if (f.state === 'ready') {
        backoff.reset(bi);
        seen.delete(bi);
        continue;
      }
      if (f.state !== 'failed') continue;
      const attempt = backoff.attempts(bi);
      if (attempt === 0) {
        map[bi] = { ...f, message: failedCopyMessage(disk, f.message ?? '') };
        continue;
      }
      if (seen.get(bi) !== attempt) {
        seen.set(bi, attempt);
        backoff.restart(bi);
        this.queue.addAfter(name, backoff.remaining(bi) + 10);
      }
      const at = backoff.nextAt(bi);
      map[bi] = {
        ...f,
        message: failedCopyMessage(disk, f.message ?? '', { attempt, inText: formatRetryDelay(backoff.get(bi)) }),
        retryCount: attempt,
        ...(at !== undefined ? { nextRetryAt: new Date(at).toISOString() } : {}),
      };
    }
  }

  /** The disk of a manager as people name it: `disk-1 on node n1` (its UUID when no node reports it). */
  private diskText(bim: BackingImageManager): string {
    const uuid = bim.spec?.diskUUID ?? '';
    const name = this.ctx.informers.cached(NodeKind).flatMap((n) => Object.entries(n.status?.diskStatus ?? {})).find(([, d]) => d.diskUUID === uuid)?.[0];
    return `${name ?? uuid} on node ${bim.spec?.nodeID ?? ''}`;
  }

  /**
   * A copy that became ready or failed since the last listing is recorded as an event on its backing image. A failure
   * that names a disk error (ENOSPC, EIO, permissions) marks the disk unhealthy; a copy that became ready on it (a
   * write that succeeded) marks it healthy again.
   */
  private recordCopyChanges(bim: BackingImageManager, map: Record<string, BackingImageFileInfo>): void {
    const before = bim.status?.backingImageFileMap ?? {};
    const nodeID = bim.spec?.nodeID ?? '';
    const diskUUID = bim.spec?.diskUUID ?? '';
    const health = (failure: string | undefined) =>
      void recordDiskHealth(this.ctx, nodeID, diskUUID, failure).catch((err: unknown) => this.ctx.log.warn(`disk ${diskUUID} condition not written: ${errMessage(err)}`));
    for (const [bi, f] of Object.entries(map)) {
      const prev = before[bi];
      if (prev?.state === f.state && prev?.uuid === f.uuid) continue;
      if (f.state === 'ready') {
        this.ctx.events.record(EventSource.BackingImageManager, imageRef(this.ctx, bi), 'Normal', EventReason.Ready, `Copy of backing image ${bi} on disk ${this.diskText(bim)} is ready`);
        if (prev) health(undefined);
      } else if (f.state === 'failed') {
        this.ctx.events.record(EventSource.BackingImageManager, imageRef(this.ctx, bi), 'Warning', EventReason.Failed, `Copy of backing image ${bi} on disk ${this.diskText(bim)} failed: ${f.message ?? ''}`);
        health(f.message ?? '');
      }
    }
  }

  private startMonitor(name: string, address: string): void {
    const existing = this.monitors.get(name);
    if (existing && existing.address === address && !existing.stopped) return;
    if (existing) this.stopMonitor(name);
    // tick() catches its own failures (they show in the status and the log); the timer only starts it.
    const m: Monitor = { address, dirty: true, ticks: 0, lastListAt: 0, listMs: 0, lastWriteAt: 0, receiveErrors: 0, busy: false, stopped: false, timer: setInterval(() => void this.tick(name, m, true), this.ctx.timing.managerPollMs) };
    m.timer.unref();
    this.monitors.set(name, m);
    this.openWatch(name, m);
    // tick() catches its own failures (they show in the status and the log); nothing waits for it.
    void this.tick(name, m, false);
  }

  private openWatch(name: string, m: Monitor): void {
    if (m.stopped) return;
    const api = this.ctx.dataPlane.managerClient(m.address);
    m.cancelWatch = api.watch(
      () => {
        m.dirty = true;
        m.receiveErrors = 0;
        this.kick(name, m);
      },
      (err) => {
        if (m.stopped) return;
        m.receiveErrors++;
        if (m.receiveErrors >= MAX_MONITOR_RECEIVE_ERRORS) {
          this.ctx.log.warn(`backing image manager monitor ${name} stops after ${m.receiveErrors} watch errors${err ? `: ${err.message}` : ''}`);
          this.stopMonitor(name);
          this.enqueue(name);
          return;
        }
        const t = setTimeout(() => this.openWatch(name, m), 1000);
        t.unref();
      },
    );
  }

  private stopMonitor(name: string): void {
    // Requests made to a manager that stops (or is replaced by a new process) are forgotten: they are made again.
    this.requested.delete(name);
    const m = this.monitors.get(name);
    if (!m) return;
    m.stopped = true;
    clearInterval(m.timer);
    if (m.kickTimer) clearTimeout(m.kickTimer);
    if (m.progressTimer) clearTimeout(m.progressTimer);
    m.cancelWatch?.();
    this.monitors.delete(name);
  }

  /**
   * The shortest time between two Lists of a manager that reported changes: 5 times what a List and its status write
   * take (smoothed), at least `managerListMinIntervalMs`, at most `managerPollMs` (Longhorn's 1 s ticker). A copy that
   * finished is seen that much sooner, and its data source's place or its sync slot (the per-node replenish limit
   * counts the copies in passing states in the managers' status) freed; a manager with many files, whose List and
   * write cost more, Lists less often.
   */
  private listInterval(m: Monitor): number {
    const { managerPollMs, managerListMinIntervalMs } = this.ctx.timing;
    return Math.min(managerPollMs, Math.max(managerListMinIntervalMs, LIST_INTERVAL_FACTOR * m.listMs));
  }

  /**
   * A change was reported (Watch notification, or a Fetch/Sync this controller just started): List as soon as the
   * interval allows instead of waiting for the next tick (`listInterval`).
   */
  private kick(name: string, m: Monitor): void {
    if (m.stopped || m.kickTimer) return;
    m.dirty = true;
    const wait = Math.max(0, m.lastListAt + this.listInterval(m) - Date.now());
    m.kickTimer = setTimeout(() => {
      m.kickTimer = undefined;
      // tick() catches its own failures (they show in the status and the log); nothing waits for it.
      void this.tick(name, m, false);
    }, wait);
    m.kickTimer.unref();
  }

  /** Marks the manager's file list as changed after an RPC that changes it, so the monitor Lists soon. */
  private fileListChanged(name: string): void {
    const m = this.monitors.get(name);
    if (m) this.kick(name, m);
  }

  private async tick(name: string, m: Monitor, fromTicker: boolean): Promise<void> {
    if (m.stopped) return;
    if (fromTicker) m.ticks++;
    if (m.busy) return;
    if (!m.dirty && m.ticks < this.ctx.timing.managerForcedListTicks) return;
    if (Date.now() - m.lastListAt < (m.dirty ? this.listInterval(m) : this.ctx.timing.managerPollMs)) {
      // A kicked List ran less than an interval ago: the kick timer (or the next tick) covers this change.
      if (m.dirty) this.kick(name, m);
      return;
    }
    m.busy = true;
    m.dirty = false;
    m.ticks = 0;
    m.lastListAt = Date.now();
    const { store, namespace, nodeID } = this.ctx;
    try {
      // only read (the write below spreads it): the committed object where the store shares it, as in reconcileManager
      const first = await getOrUndefined(getForReading(store, BackingImageManagerKind, name, namespace));
      if (!first || first.status?.ownerID !== nodeID) return this.stopMonitor(name);
      const listed = await this.ctx.dataPlane.managerClient(m.address).list();
      const listedMap = fileMapFromList(listed);
      // the disk's scrub (absent from a Longhorn manager's answer: the status keeps what it had)
      const scrub = listed.diskScrub;
      this.describeFailures(first, listedMap);
      this.recordCopyChanges(first, listedMap);
      // The listed map shares every file entry that did not change with the stored one (the stored map itself when
      // nothing changed): the one full comparison is made here, and the checks below, the store's write and its log
      // compare the rest by reference (each was a full comparison of every file of the disk, per List).
      const map = shareValue(listedMap, first.status?.backingImageFileMap ?? {});
      // The list is fresh: a write that conflicts (the spec or the reconcile's status changed meanwhile, frequent while
      // many images are added) is retried at once on the latest object instead of a tick later.
      let bim: typeof first | undefined = first;
      const stale = (b: typeof first): boolean =>
        changed(b.status?.backingImageFileMap ?? {}, map) || (scrub !== undefined && changed(b.status?.diskScrub ?? {}, scrub));
      // Progress alone is written at most every managerProgressWriteMs (every write goes to every watcher and
      // reconciles the images again); a state, message, sender or size change is written at once.
      const progressWait = m.lastWriteAt + this.ctx.timing.managerProgressWriteMs - Date.now();
      if (
        progressWait > 0 &&
        stale(first) &&
        onlyProgressDiffers(first.status?.backingImageFileMap ?? {}, map) &&
        (scrub === undefined || !changed(first.status?.diskScrub ?? {}, scrub))
      ) {
        if (!m.progressTimer) {
          m.progressTimer = setTimeout(() => {
            m.progressTimer = undefined;
            m.dirty = true;
            void this.tick(name, m, false);
          }, progressWait);
          m.progressTimer.unref();
        }
        return;
      }
      for (let attempt = 1; bim && bim.status?.ownerID === nodeID && stale(bim); attempt++) {
        try {
          await updateStatusForReading(store, BackingImageManagerKind, {
            ...bim,
            status: { ...bim.status, backingImageFileMap: map, ...(scrub ? { diskScrub: { ...scrub } } : {}) },
          });
          m.lastWriteAt = Date.now();
          break;
        } catch (err) {
          if (!isConflict(err)) throw err;
          if (attempt >= 5) {
            m.dirty = true;
            break;
          }
          bim = await getOrUndefined(store.get(BackingImageManagerKind, name, namespace));
        }
      }
    } catch (err) {
      m.dirty = true;
      // A state the manager reports that is not a file state is worth a warning; other failures are retried quietly.
      if (err instanceof IllegalTransitionError) this.ctx.log.warn(`backing image manager monitor ${name}: ${err.message}`);
      else this.ctx.log.debug(`backing image manager monitor ${name}: ${errMessage(err)}`);
    } finally {
      m.busy = false;
      // smoothed: one List that waited behind other work does not stretch the interval on its own
      m.listMs = m.listMs === 0 ? Date.now() - m.lastListAt : 0.7 * m.listMs + 0.3 * (Date.now() - m.lastListAt);
      if (m.dirty && !m.stopped) this.kick(name, m);
    }
  }
}

/** The manager addresses of `copies`, without `except` (the sender asked first). */
function addressesOf(copies: readonly { m: Stored<BackingImageManager> }[], except: string): string[] {
  return copies.map((c) => c.m.metadata.annotations?.[Annotation.Address]).filter((a): a is string => !!a && a !== except);
}

