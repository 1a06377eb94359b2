import { SharedInformers, type Datastore, type Stored } from '@bis/datastore';
import { BackingImageDataSourceKind, BackingImageManagerKind, BackupBackingImageKind, NodeKind, type Logger } from '@bis/controllers';
import type { BackingImageDataSource, BackingImageManager, BackupBackingImage } from '@bis/controllers';
import { failureReason, type BackingImageMetrics } from './metrics.js';

/** Source types whose failed data source the controllers start again after a backoff (Longhorn's retried types). */
const RETRIED_SOURCE_TYPES = new Set(['download', 'export-from-volume', 'restore']);

export interface ActivityObserverOptions {
  store: Datastore;
  namespace: string;
  /** The controller-manager's log: a warning per failed attempt, an error per terminal failure. */
  log: Logger;
  metrics?: BackingImageMetrics;
  /** Only objects owned by this node are reported (Kubernetes mode: one controller-manager per node). Default: all. */
  ownerID?: string;
}

interface Seen {
  uuid: string;
  bytes: number;
  state: string;
  message: string;
}

/**
 * Watches the status the controllers write (data sources, each disk's copies, backups, scrubs) and turns its changes
 * into what an operator reads:
 * - in the controller-manager's log, a warning for every failed attempt (a data source that is started again, a copy
 *   that is tried again, a retry message) and an error for every terminal failure (a data source that is not started
 *   again, a failed backup), each naming the image, the disk and the UUID as fields and in the text;
 * - the counters of {@link BackingImageMetrics}: bytes transferred (from the progress of data sources, copies and
 *   backups), failures by reason, finished backups and their durations, scrub passes.
 */
export class ActivityObserver {
  private readonly informers: SharedInformers;
  private readonly dataSources = new Map<string, Seen>();
  /** Each manager's copies, by image. */
  private readonly copies = new Map<string, Map<string, Seen>>();
  /** How many data sources and copies carry each image UUID (a `dataSourceDisk` entry goes with the last of them). */
  private readonly uuidUses = new Map<string, number>();
  private readonly backups = new Map<string, Seen & { startedAt?: number }>();
  private readonly scrubs = new Map<string, string>();
  /** The disk each image's data source ran on, by image UUID: its first copy is moved there, not transferred. */
  private readonly dataSourceDisk = new Map<string, string>();
  /** False while the informers deliver what already existed at start: counted as a baseline, not as news. */
  private synced = false;

  constructor(private readonly opts: ActivityObserverOptions) {
    this.informers = new SharedInformers({
      store: opts.store,
      namespace: opts.namespace,
      resyncMs: 0,
      retryDelayMs: 1000,
      onError: (err, kind) => opts.log.debug(`activity observer: watch of ${kind.kind}: ${err instanceof Error ? err.message : String(err)}`),
    });
    this.informers.informerFor(NodeKind);
    this.informers.on(BackingImageDataSourceKind, (type, o) => (type === 'DELETED' ? this.forgetDataSource(o.metadata.name) : this.onDataSource(o)));
    this.informers.on(BackingImageManagerKind, (type, o, old) => (type === 'DELETED' ? this.forgetManager(o) : this.onManager(o, type === 'MODIFIED' ? old : undefined)));
    this.informers.on(BackupBackingImageKind, (type, o) => (type === 'DELETED' ? this.backups.delete(o.metadata.name) : this.onBackup(o)));
  }

  async start(): Promise<void> {
    this.informers.start();
    await this.informers.waitForSync();
    this.synced = true;
  }

  async stop(): Promise<void> {
    await this.informers.stop();
  }

  /** The disk's name on its node (`disk-1`), or its UUID when no node lists it. */
  private diskName(diskUUID: string): string {
    for (const n of this.informers.cached(NodeKind)) for (const [name, d] of Object.entries(n.status?.diskStatus ?? {})) if (d.diskUUID === diskUUID) return name;
    return diskUUID;
  }

  private mine(ownerID: string | undefined): boolean {
    return !this.opts.ownerID || !ownerID || ownerID === this.opts.ownerID;
  }

  private onDataSource(o: Stored<BackingImageDataSource>): void {
    if (!this.mine(o.status?.ownerID)) return;
    const image = o.metadata.name;
    const uuid = o.spec?.uuid ?? '';
    const diskUUID = o.spec?.diskUUID ?? '';
    const sourceType = o.spec?.sourceType ?? '';
    const state = o.status?.currentState ?? '';
    const message = o.status?.message ?? '';
    const prev = this.dataSources.get(image);
    const fresh = !prev || prev.uuid !== uuid;
    const size = o.status?.size ?? 0;
    const progress = o.status?.progress ?? 0;
    const bytes = size > 0 ? Math.floor((size * Math.max(0, Math.min(100, progress))) / 100) : 0;
    if (uuid && diskUUID) this.dataSourceDisk.set(uuid, diskUUID);
    const before = !this.synced ? bytes : fresh ? 0 : prev.bytes;
    // A restart from 0 (a new attempt) counts again from its own start.
    if (bytes > before) this.opts.metrics?.transferred('in', sourceType || 'unknown', bytes - before);
    this.setSeen(this.dataSources, image, { uuid, bytes: bytes < before ? bytes : Math.max(bytes, before), state, message });
    // What existed at start (e.g. after a restart of the controller-manager) was logged by the run that saw it happen.
    if (!this.synced) return;
    const disk = this.diskName(diskUUID);
    const fields = { image, uuid, disk, diskUUID, sourceType };
    const where = `backing image ${image} (${uuid}) on disk ${disk}`;
    if (state === 'failed' && (fresh || prev.state !== 'failed')) {
      this.opts.metrics?.failed('data-source', failureReason(message));
      if (RETRIED_SOURCE_TYPES.has(sourceType)) this.opts.log.warn(`${sourceType} data source of ${where} failed, it is started again after a backoff: ${message || 'no message'}`, fields);
      else this.opts.log.error(`${sourceType} data source of ${where} failed: ${message || 'no message'}`, fields);
      return;
    }
    if (state !== 'failed' && state !== 'ready' && state !== 'ready-for-transfer' && message && (fresh || message !== prev.message)) {
      // A data source that keeps going after a failed attempt says so in its message (e.g. a retried download).
      this.opts.log.warn(`${sourceType} data source of ${where}: ${message}`, fields);
    }
  }

  /** Sets or replaces an entry of `map`, counting the UUIDs in use. */
  private setSeen<T extends Seen>(map: Map<string, T>, key: string, seen: T): void {
    const prev = map.get(key);
    map.set(key, seen);
    if (prev?.uuid === seen.uuid) return;
    this.useUuid(seen.uuid, 1);
    if (prev) this.useUuid(prev.uuid, -1);
  }

  private useUuid(uuid: string, delta: number): void {
    const n = (this.uuidUses.get(uuid) ?? 0) + delta;
    if (n > 0) {
      this.uuidUses.set(uuid, n);
      return;
    }
    this.uuidUses.delete(uuid);
    this.dataSourceDisk.delete(uuid);
  }

  private forgetDataSource(image: string): void {
    const prev = this.dataSources.get(image);
    if (!prev) return;
    this.dataSources.delete(image);
    this.useUuid(prev.uuid, -1);
  }

  private forgetManager(o: Stored<BackingImageManager>): void {
    for (const c of this.copies.get(o.metadata.name)?.values() ?? []) this.useUuid(c.uuid, -1);
    this.copies.delete(o.metadata.name);
    this.scrubs.delete(o.metadata.name);
  }

  /** `old`: the version before this change, whose file entries were seen already (the same entry object is skipped). */
  private onManager(o: Stored<BackingImageManager>, old?: Stored<BackingImageManager>): void {
    if (!this.mine(o.status?.ownerID)) return;
    const diskUUID = o.spec?.diskUUID ?? '';
    const files = o.status?.backingImageFileMap ?? {};
    let copies = this.copies.get(o.metadata.name);
    if (!copies) this.copies.set(o.metadata.name, (copies = new Map()));
    // A new version shares its unchanged file entries with the one before (the store's versions do): those were seen
    // with the same values, and only the changed ones cost (it looked at every file of the disk per write).
    const seenFiles = old && this.mine(old.status?.ownerID) && old.spec?.diskUUID === diskUUID ? old.status?.backingImageFileMap : undefined;
    for (const [image, f] of Object.entries(files)) {
      if (seenFiles?.[image] === f && copies.has(image)) continue;
      const uuid = f.uuid ?? '';
      const state = f.state ?? '';
      const message = f.message ?? '';
      const prev = copies.get(image);
      const fresh = !prev || prev.uuid !== uuid;
      const size = f.size ?? 0;
      const bytes = state === 'ready' ? size : size > 0 ? Math.floor((size * Math.max(0, Math.min(100, f.progress ?? 0))) / 100) : 0;
      // What existed at start was transferred before; the copy on the data source's disk is moved there, not sent.
      const before = !this.synced || this.dataSourceDisk.get(uuid) === diskUUID ? bytes : fresh ? 0 : prev.bytes;
      if (bytes > before) this.opts.metrics?.transferred('in', 'sync', bytes - before);
      this.setSeen(copies, image, { uuid, bytes: bytes < before ? bytes : Math.max(bytes, before), state, message });
      if (state !== 'failed' || !this.synced) continue;
      if (!fresh && prev.state === 'failed' && prev.message === message) continue;
      const disk = this.diskName(diskUUID);
      if (fresh || prev.state !== 'failed') this.opts.metrics?.failed('copy', failureReason(message));
      this.opts.log.warn(`copy of backing image ${image} (${uuid}) on disk ${disk} failed: ${message || 'no message'}`, { image, uuid, disk, diskUUID, manager: o.metadata.name });
    }
    // Copies no longer listed are forgotten (with the data source's disk of a UUID nothing carries any more).
    for (const [k, c] of copies) {
      if (k in files) continue;
      copies.delete(k);
      this.useUuid(c.uuid, -1);
    }

    const scrub = o.status?.diskScrub;
    if (scrub?.lastScrubTime) {
      const last = this.scrubs.get(o.metadata.name);
      this.scrubs.set(o.metadata.name, scrub.lastScrubTime);
      if (this.synced && last !== scrub.lastScrubTime) {
        this.opts.metrics?.scrubFinished(scrub.lastScrubResult ?? '');
        if (scrub.lastScrubResult && scrub.lastScrubResult !== 'ok') {
          const disk = this.diskName(diskUUID);
          this.opts.metrics?.failed('scrub', scrub.lastScrubResult === 'corrupted' ? 'corrupted' : 'io-error');
          this.opts.log.warn(`scrub of disk ${disk}: ${scrub.lastScrubResult}: ${scrub.lastScrubMessage ?? ''}`, { disk, diskUUID, manager: o.metadata.name });
        }
      }
    }
  }

  private onBackup(o: Stored<BackupBackingImage>): void {
    if (!this.mine(o.status?.ownerID)) return;
    const name = o.metadata.name;
    const image = o.spec?.backingImage ?? '';
    const state = o.status?.state ?? '';
    const message = o.status?.error ?? '';
    const prev = this.backups.get(name);
    const size = o.status?.size ?? 0;
    const bytes = state === 'Completed' ? size : size > 0 ? Math.floor((size * Math.max(0, Math.min(100, o.status?.progress ?? 0))) / 100) : 0;
    const before = prev ? prev.bytes : !this.synced || state === 'Completed' || state === 'Error' ? bytes : 0;
    if (bytes > before) this.opts.metrics?.transferred('out', 'backup', bytes - before);
    const startedAt = prev?.startedAt ?? (state === 'InProgress' || state === 'Pending' || state === '' ? Date.now() : undefined);
    this.backups.set(name, { uuid: '', bytes: Math.max(bytes, before), state, message, startedAt });
    if (!this.synced || !prev || prev.state === state) return;
    const seconds = startedAt !== undefined ? (Date.now() - startedAt) / 1000 : undefined;
    const fields = { image, backup: name };
    if (state === 'Completed') {
      this.opts.metrics?.backupFinished('completed', seconds);
      this.opts.log.info(`backup ${name} of backing image ${image} completed (${size} bytes)`, fields);
    } else if (state === 'Error') {
      this.opts.metrics?.backupFinished('error', seconds);
      this.opts.metrics?.failed('backup', failureReason(message));
      this.opts.log.error(`backup ${name} of backing image ${image} failed: ${message || 'no message'}`, fields);
    }
  }
}
