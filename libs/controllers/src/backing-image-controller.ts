import { BackingImageDataSourceType, DataSourceParameter, type BackingImageDiskFileSpec } from '@bis/crd-types';
import { isAlreadyExists, isConflict, isNotFound, type Stored } from '@bis/datastore';
import { FILE_MACHINE, transition } from '@bis/state-machine';
import { Controller, isResponsibleFor, type ControllerContext } from './base-controller.js';
import { changed, clone, defaultManagerImage, getOrUndefined, listManagers, nodeDownChecker, replicasOf, sameValue, selectorPolicy, topology } from './common.js';
import { EventReason, EventSource } from './events.js';
import {
  BackingImageDataSourceKind,
  BackingImageKind,
  BackingImageManagerKind,
  BackupBackingImageKind,
  ReplicaKind,
  type BackingImage,
  type BackingImageDataSource,
  type BackingImageManager,
  type StoredBI,
} from './kinds.js';
import { Annotation, backingImageManagerName, Component, FINALIZER, Label, MANAGED_BY, newBackingImageUUID, rfc3339 } from './names.js';
import { allFilesUnavailable, diskEligible, disksToPrestart, eligibleDiskCount, evictionDecision, MIN_COPIES_CONDITION, minCopiesShortfall, needsReplenish, pickDiskForCopy } from './rules.js';
import { SettingName } from './settings.js';
import { ManagerSpecBatcher } from './manager-spec-batcher.js';
import { forEachChangedKey } from './map-diff.js';
import { aggregateFileStatus, onlyPassingCopyChanges, type AggregationEvent } from './status.js';
import type { Topology } from './topology.js';

const NOT_READY_DISK_MESSAGE = (d: string) =>
  `Disk ${d} is not ready or does not exist. If the disk will not come back, remove it from the BackingImage spec to stop reconciliation attempts`;

const readyCount = (bi: BackingImage): number => Object.values(bi.status?.diskFileStatusMap ?? {}).filter((f) => f.state === 'ready').length;

/** Longhorn's BackingImage controller (§3.1). */
export class BackingImageController extends Controller {
  readonly name = 'backing-image';
  private readonly managerSpecs: ManagerSpecBatcher;
  /** When this controller last wrote each image's status (ms; forgotten when the image is gone). */
  private readonly statusWrittenAt = new Map<string, number>();

  constructor(ctx: ControllerContext) {
    super(ctx);
    this.managerSpecs = new ManagerSpecBatcher(ctx.store, ctx.namespace);
    const inf = ctx.informers;
    inf.on(BackingImageKind, (t, o) => this.enqueueOn(t, o.metadata.name));
    // Longhorn enqueues every image a manager lists on any change of the manager; with many images per disk that is
    // quadratic, so only images whose entry (spec or file) changed are enqueued; the images' own resync covers the rest.
    inf.on(BackingImageManagerKind, (t, o, old) => {
      if (t === 'RESYNC') return;
      const enqueue = (n: string) => this.enqueue(n);
      if (t === 'ADDED' || t === 'DELETED' || !old || old.status?.currentState !== o.status?.currentState) {
        for (const m of old ? [o, old] : [o]) {
          for (const n of Object.keys(m.spec?.backingImages ?? {})) enqueue(n);
          for (const n of Object.keys(m.status?.backingImageFileMap ?? {})) enqueue(n);
        }
        return;
      }
      // the versions share what a write kept: an unchanged map costs one pointer check, an unchanged entry one more
      forEachChangedKey(old.spec?.backingImages, o.spec?.backingImages, sameValue, enqueue);
      forEachChangedKey(old.status?.backingImageFileMap, o.status?.backingImageFileMap, sameValue, enqueue);
    });
    // as in Longhorn, a handler for another kind has no resync (the image's own resync brings it back every 30 s)
    inf.on(BackingImageDataSourceKind, (t, o) => {
      if (t !== 'RESYNC') this.enqueue(o.metadata.name);
    });
    inf.on(ReplicaKind, (_t, o, old) => {
      if (o.spec?.backingImage) this.enqueue(o.spec.backingImage);
      if (old?.spec?.backingImage) this.enqueue(old.spec.backingImage);
    });
  }

  private event(bi: BackingImage, type: 'Normal' | 'Warning', reason: string, message: string): void {
    this.ctx.events.record(EventSource.BackingImage, bi, type, reason, message);
  }

  async reconcile(name: string): Promise<void> {
    const { store, namespace, nodeID } = this.ctx;
    const bi = await getOrUndefined(store.get(BackingImageKind, name, namespace));
    if (!bi) {
      this.statusWrittenAt.delete(name);
      return;
    }
    const isDown = await nodeDownChecker(this.ctx);
    if (!isResponsibleFor(nodeID, '', bi.status?.ownerID ?? '', isDown)) return;
    if (bi.status?.ownerID !== nodeID || !bi.status?.uuid) {
      // Claim ownership and initialise the UUID in one status write.
      const uuid = bi.status?.uuid || newBackingImageUUID();
      try {
        await store.updateStatus(BackingImageKind, { ...bi, status: { ...bi.status, ownerID: nodeID, uuid } });
      } catch (err) {
        if (isConflict(err)) return this.enqueue(name);
        throw err;
      }
      if (!bi.status?.uuid) {
        this.event(bi, 'Normal', EventReason.Create, `Backing image ${name} created from source type ${bi.spec?.sourceType || 'download'}`);
        this.event(bi, 'Normal', EventReason.Update, `Initialized UUID to ${uuid}`);
      }
      return;
    }
    if (!bi.metadata.deletionTimestamp && !bi.metadata.finalizers?.includes(FINALIZER)) {
      await store.update(BackingImageKind, { ...bi, metadata: { ...bi.metadata, finalizers: [...(bi.metadata.finalizers ?? []), FINALIZER] } });
      return;
    }

    if (bi.metadata.deletionTimestamp) return this.handleDeletion(bi);

    let cur: StoredBI = bi;
    const next = clone(bi);
    next.spec ??= {};
    next.status ??= {};
    next.status.diskFileStatusMap ??= {};
    next.status.diskLastRefAtMap ??= {};
    const topo = await topology(this.ctx);
    const replicas = await replicasOf(this.ctx, name);
    const disksInUse = new Set(replicas.map((r) => r.spec.diskID));

    // Events about what this reconcile writes are recorded once the write is done: a reconcile whose write conflicts
    // runs again and would otherwise tell the same change twice.
    const written: AggregationEvent[] = [];
    let transferred = await this.handleDataSource(next, topo);
    if (next.spec.diskFileSpecMap) {
      await this.addReplicaDisks(next, topo, replicas.map((r) => r.spec.diskID));
      await this.handleManagers(next, topo);
      const readyBefore = readyCount(next);
      written.push(...(await this.syncFileInfo(next)));
      // EXTENSION: the first copy may have become ready in this very reconcile (its manager listed it): mark the file
      // transferred now, so that replenishment places the other copies in this reconcile rather than the next one.
      if (!transferred && readyCount(next) > readyBefore) transferred = await this.handleDataSource(next, topo);
      const placed = await this.replenish(next, topo, transferred);
      if (placed) {
        // EXTENSION: the new copies are written to the image's spec now and handed to their managers in this
        // reconcile (Longhorn adds an image to a manager's spec at the reconcile after the one that placed the copy).
        cur = await this.writeSpec(cur, next);
        this.event(bi, placed.type, placed.reason, placed.message);
        await this.handleManagers(next, topo);
      }
      // after the placement: the new disks' last-reference times go in this reconcile's status write
      next.status.diskLastRefAtMap = this.lastRefMap(next, disksInUse);
      this.evict(next, disksInUse);
      await this.prestartManagers(next, topo);
    }
    await this.checkCopiesSatisfiable(bi, next, topo);
    if (await this.writeBack(cur, next)) for (const e of written) this.event(bi, e.type, e.reason, e.message);
    // Come back while copies are still being produced.
    const handling = Object.values(next.status.diskFileStatusMap ?? {}).some((s) => ['', 'pending', 'starting', 'in-progress', 'ready-for-transfer'].includes(s.state ?? ''));
    // Backpressure: with a long queue the events and the resync bring images back; polling would only add load.
    const pending = handling || Object.keys(next.spec.diskFileSpecMap ?? {}).length !== Object.keys(next.status.diskFileStatusMap ?? {}).length;
    if (pending && this.queue.length < 50) this.queue.addAfter(name, this.ctx.timing.waitRequeueMs);
  }

  /** Writes the spec if it changed; returns the object as stored (its new resourceVersion). */
  private async writeSpec(old: StoredBI, next: Stored<BackingImage>): Promise<StoredBI> {
    if (!changed(old.spec, next.spec)) return old;
    const u = await this.ctx.store.update(BackingImageKind, { ...old, spec: next.spec });
    return { ...old, spec: u.spec, metadata: u.metadata };
  }

  /**
   * Writes the spec and the status where they changed. A status whose copies only moved into a passing state waits
   * until `imageTransientWriteMs` after the last status write (the image comes back then; a later change may be
   * written with it). Returns whether the status is as computed in the store (written, or unchanged).
   */
  private async writeBack(old: StoredBI, next: Stored<BackingImage>): Promise<boolean> {
    const cur = await this.writeSpec(old, next);
    if (!changed(old.status, next.status)) return true;
    const name = old.metadata.name;
    const now = this.ctx.now().getTime();
    const wait = (this.statusWrittenAt.get(name) ?? -Infinity) + this.ctx.timing.imageTransientWriteMs - now;
    if (wait > 0 && onlyPassingCopyChanges(old.status ?? {}, next.status!)) {
      this.queue.addAfter(name, wait);
      return false;
    }
    await this.ctx.store.updateStatus(BackingImageKind, { ...old, metadata: cur.metadata, status: next.status });
    this.statusWrittenAt.set(name, now);
    return true;
  }

  private async handleDeletion(bi: StoredBI): Promise<void> {
    const { store, namespace } = this.ctx;
    const name = bi.metadata.name;
    if ((await replicasOf(this.ctx, name)).length > 0) {
      this.ctx.log.info(`backing image ${name} is being deleted but replicas still use it`);
      return;
    }
    const bids = await getOrUndefined(store.get(BackingImageDataSourceKind, name, namespace));
    const bidsCleaned = !bids || bids.spec?.fileTransferred || bids.status?.currentState === 'failed-and-cleanup';
    if (!bidsCleaned && !bids.metadata.deletionTimestamp) {
      // FIX: a reconcile that read the image just before the delete can create the data source just after it, once
      // the foreground deletion found no dependent to delete; nothing else would ever delete that data source.
      this.ctx.log.info(`backing image ${name} is being deleted: deleting its data source`);
      await store.delete(BackingImageDataSourceKind, name, namespace).catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      });
    }
    if (!bidsCleaned) {
      this.ctx.log.info(`backing image ${name} waits for its data source to be cleaned up`);
      this.queue.addAfter(name, this.ctx.timing.waitRequeueMs);
      return;
    }
    await this.cleanupManagers(bi, await defaultManagerImage(this.ctx));
    const finalizers = (bi.metadata.finalizers ?? []).filter((f) => f !== FINALIZER);
    if (finalizers.length !== (bi.metadata.finalizers ?? []).length) {
      await store.update(BackingImageKind, { ...bi, metadata: { ...bi.metadata, finalizers } });
    }
  }

  // ------------------------------------------------------------ §3.1.1

  /** Returns whether the first file is transferred, as this reconcile leaves the data source's spec. */
  private async handleDataSource(bi: Stored<BackingImage>, topo: Topology): Promise<boolean> {
    const { store, namespace } = this.ctx;
    const name = bi.metadata.name;
    const specMap = bi.spec!.diskFileSpecMap ?? {};
    const statusMap = bi.status!.diskFileStatusMap ?? {};
    const bids = await getOrUndefined(store.get(BackingImageDataSourceKind, name, namespace));
    if (!bids) {
      let chosen: { nodeID: string; diskUUID: string; path: string } | undefined;
      let fileTransferred = false;
      for (const disk of Object.keys(specMap)) {
        const f = topo.readyDisk(disk);
        if (!f) continue;
        chosen = { nodeID: f.node.name, diskUUID: disk, path: f.disk.path };
        if (statusMap[disk]?.state === 'ready') {
          fileTransferred = true;
          break;
        }
      }
      if (!chosen) chosen = await this.pickFirstDisk(bi, topo);
      const created: BackingImageDataSource = {
        apiVersion: bi.apiVersion,
        kind: 'BackingImageDataSource',
        metadata: {
          name,
          namespace,
          labels: bi.spec!.sourceType === 'export-from-volume' ? { [Label.ExportFromVolume]: bi.spec!.sourceParameters?.['volume-name'] ?? '' } : {},
          finalizers: [FINALIZER],
          ownerReferences: [{ apiVersion: bi.apiVersion, kind: 'BackingImage', name, uid: bi.metadata.uid, controller: true, blockOwnerDeletion: true }],
        },
        spec: {
          nodeID: chosen.nodeID,
          uuid: bi.status!.uuid!,
          diskUUID: chosen.diskUUID,
          diskPath: chosen.path,
          checksum: bi.spec!.checksum ?? '',
          sourceType: bi.spec!.sourceType ?? 'download',
          parameters: { ...(bi.spec!.sourceParameters ?? {}) },
          fileTransferred,
        },
        status: {},
      };
      try {
        await store.create(BackingImageDataSourceKind, created);
      } catch (err) {
        if (!isAlreadyExists(err)) throw err;
      }
      // The data source's disk joins the image's spec in this reconcile's write, as the data-source controller would
      // add it (its syncBackingImage) one write later.
      if (!fileTransferred && !specMap[chosen.diskUUID]) {
        bi.spec!.diskFileSpecMap = { ...specMap, [chosen.diskUUID]: { dataEngine: 'v1', evictionRequested: false } };
      }
      return fileTransferred;
    }
    const nextSpec = clone(bids.spec ?? {});
    if (!nextSpec.uuid) nextSpec.uuid = bi.status!.uuid!;
    const waitMs = (await this.ctx.settings.int(SettingName.BackingImageRecoveryWaitInterval)) * 1000;
    const unavailable = allFilesUnavailable(specMap, statusMap, this.ctx.now().getTime(), waitMs);
    if (!nextSpec.fileTransferred) {
      if (bids.status?.currentState === 'ready' && statusMap[nextSpec.diskUUID ?? '']?.state === 'ready') nextSpec.fileTransferred = true;
    } else if (unavailable) {
      // Every copy failed (a healthy copy would have been synced from, as a peer): prepare the first file again,
      // from a completed backup of the same content when there is one, else from the origin URL.
      const backup = await this.completedBackupOf(bi);
      if (backup) {
        this.ctx.log.warn(`every copy of backing image ${name} failed for longer than the recovery wait interval; restoring it from backup ${backup.name}`);
        this.event(bi, 'Warning', EventReason.Update, `All copies failed; restoring the first file from backup ${backup.name}`);
        nextSpec.sourceType = BackingImageDataSourceType.Restore;
        nextSpec.parameters = {
          [DataSourceParameter.BackupUrl]: backup.url,
          [DataSourceParameter.BackupTargetName]: backup.target,
          [DataSourceParameter.ConcurrentLimit]: String(await this.ctx.settings.int(SettingName.BackupConcurrentLimit)),
        };
        nextSpec.checksum = bi.status?.checksum || nextSpec.checksum;
      } else if (bi.spec!.sourceType === 'download') {
        this.ctx.log.warn(`every copy of backing image ${name} failed for longer than the recovery wait interval; downloading it again`);
        this.event(bi, 'Warning', EventReason.Update, 'All copies failed; preparing the first file again from the source');
        nextSpec.sourceType = BackingImageDataSourceType.Download;
        nextSpec.parameters = { ...(bi.spec!.sourceParameters ?? {}) };
      } else {
        this.ctx.log.warn(`every copy of backing image ${name} failed and source type ${nextSpec.sourceType} cannot be prepared again (no completed backup)`);
      }
      if (backup || bi.spec!.sourceType === 'download') {
        nextSpec.fileTransferred = false;
        nextSpec.nodeID = '';
        nextSpec.diskUUID = '';
        nextSpec.diskPath = '';
      }
    }
    if (!nextSpec.fileTransferred) {
      const f = nextSpec.diskUUID ? topo.readyDisk(nextSpec.diskUUID) : undefined;
      if (!f || f.node.name !== nextSpec.nodeID || f.disk.path !== nextSpec.diskPath) {
        const chosen = await this.pickFirstDisk(bi, topo);
        nextSpec.nodeID = chosen.nodeID;
        nextSpec.diskUUID = chosen.diskUUID;
        nextSpec.diskPath = chosen.path;
      }
    }
    if (changed(bids.spec, nextSpec)) await store.update(BackingImageDataSourceKind, { ...bids, spec: nextSpec });
    return !!nextSpec.fileTransferred;
  }

  /** A completed backup of this image whose checksum is the image's current checksum (the newest one). */
  private async completedBackupOf(bi: BackingImage): Promise<{ name: string; url: string; target: string } | undefined> {
    const checksum = bi.status?.checksum ?? '';
    if (!checksum) return undefined;
    // a backup of the image as it was before it was zero-padded (restored from it) restores to the same padded file
    const unpadded = bi.metadata.annotations?.[Annotation.UnpaddedChecksum] ?? '';
    const { items } = await this.ctx.store.list(BackupBackingImageKind, { namespace: this.ctx.namespace });
    const done = items
      .filter((b) => (b.spec?.backingImage ?? b.status?.backingImage) === bi.metadata.name && !b.metadata.deletionTimestamp)
      .filter((b) => b.status?.state === 'Completed' && !!b.status.url && (b.status.checksum === checksum || (!!unpadded && b.status.checksum === unpadded)))
      .sort((a, b) => (b.status?.backupCreatedAt ?? '').localeCompare(a.status?.backupCreatedAt ?? ''));
    const b = done[0];
    return b ? { name: b.metadata.name, url: b.status!.url!, target: b.spec?.backupTargetName || 'default' } : undefined;
  }

  private async pickFirstDisk(bi: BackingImage, topo: Topology): Promise<{ nodeID: string; diskUUID: string; path: string }> {
    if (bi.spec?.sourceType === 'clone') {
      const src = bi.spec.sourceParameters?.['backing-image'] ?? '';
      const source = await getOrUndefined(this.ctx.store.get(BackingImageKind, src, this.ctx.namespace));
      if (!source) throw new Error(`unable to find the source backing image ${src} of clone ${bi.metadata.name}`);
      for (const bim of await listManagers(this.ctx)) {
        if (bim.metadata.deletionTimestamp) continue;
        const disk = bim.spec?.diskUUID ?? '';
        if (!source.spec?.diskFileSpecMap?.[disk]) continue;
        const file = bim.status?.backingImageFileMap?.[src];
        const f = topo.readyDisk(disk);
        if (file?.state === 'ready' && f) return { nodeID: f.node.name, diskUUID: disk, path: f.disk.path };
      }
      throw new Error(`unable to find a ready copy of the source backing image ${src} of clone ${bi.metadata.name}`);
    }
    const policy = await selectorPolicy(this.ctx, bi);
    const p = pickDiskForCopy(topo, bi.spec?.diskFileSpecMap ?? {}, policy);
    if (!p) throw new Error('unable to get a ready node disk');
    return { nodeID: p.node.name, diskUUID: p.disk.diskUUID, path: p.disk.path };
  }

  /** Disks of replicas using the image join the spec map when the selectors allow it (Longhorn does this in the replica controller). */
  private async addReplicaDisks(bi: Stored<BackingImage>, topo: Topology, disks: string[]): Promise<void> {
    const specMap = bi.spec!.diskFileSpecMap!;
    const policy = await selectorPolicy(this.ctx, bi);
    for (const d of disks) {
      if (specMap[d]) continue;
      const f = topo.find(d);
      if (!f) continue;
      if (!diskEligible(f.node, f.disk, { ...policy, allowEmptyDiskSelector: true, allowEmptyNodeSelector: true })) {
        this.event(bi, 'Warning', EventReason.Update, `backing image ${bi.metadata.name} can not be put on the disk ${d}`);
        continue;
      }
      specMap[d] = { dataEngine: 'v1', evictionRequested: false };
    }
  }

  // ------------------------------------------------------------ §3.1.2

  private async cleanupManagers(bi: Stored<BackingImage>, image: string): Promise<void> {
    const { store } = this.ctx;
    const name = bi.metadata.name;
    for (const bim of await listManagers(this.ctx)) {
      if (bim.metadata.deletionTimestamp) continue;
      if (bim.spec?.image !== image) {
        await store.delete(BackingImageManagerKind, bim.metadata.name, bim.metadata.namespace);
        this.event(bi, 'Normal', EventReason.Delete, `deleting old backing image manager ${bim.metadata.name} in disk ${bim.spec?.diskUUID} on node ${bim.spec?.nodeID}`);
        continue;
      }
      const map = bim.spec?.backingImages ?? {};
      if (bi.metadata.deletionTimestamp && isPrestartedFor(bim, name)) {
        await this.deletePrestarted(bi, bim, 'the backing image is being deleted');
        continue;
      }
      if (!(name in map)) continue;
      if (!bi.metadata.deletionTimestamp && bi.spec?.diskFileSpecMap?.[bim.spec?.diskUUID ?? ''] && map[name] === bi.status?.uuid) continue;
      const nextMap = { ...map };
      delete nextMap[name];
      if (Object.keys(nextMap).length === 0) {
        await store.delete(BackingImageManagerKind, bim.metadata.name, bim.metadata.namespace);
        this.event(bi, 'Normal', EventReason.Delete, `deleting unused backing image manager ${bim.metadata.name} in disk ${bim.spec?.diskUUID} on node ${bim.spec?.nodeID}`);
      } else {
        await store.update(BackingImageManagerKind, { ...bim, spec: { ...bim.spec, backingImages: nextMap } });
      }
    }
  }

  /**
   * EXTENSION: while the first file is prepared, the managers of the disks that will receive the next copies
   * (`disksToPrestart`) are created with no image in their spec, so they have started by the time the file is ready
   * and replenishment (which prefers disks with a manager) syncs to them at once. Nothing is added to the image's spec
   * map: copies are still placed one by one once the first file is ready, and a failed first file still shows as the
   * image's only copy. A pre-started manager that no copy used is deleted once the image has all its copies, when its
   * first file failed, or with the image.
   */
  private async prestartManagers(bi: Stored<BackingImage>, topo: Topology): Promise<void> {
    const { store, namespace } = this.ctx;
    const name = bi.metadata.name;
    const bids = await getOrUndefined(store.get(BackingImageDataSourceKind, name, namespace));
    const firstDisk = bids?.spec?.fileTransferred ? '' : (bids?.spec?.diskUUID ?? '');
    // The first file's disk counts as placed even before the data source controller adds it to the spec map.
    const specMap = { ...bi.spec!.diskFileSpecMap, ...(firstDisk ? { [firstDisk]: { dataEngine: 'v1' as const, evictionRequested: false } } : {}) };
    const missing = Math.max(1, bi.spec!.minNumberOfCopies ?? 1) - Object.keys(specMap).length;
    const preparing = !!firstDisk && !['failed', 'failed-and-cleanup'].includes(bids?.status?.currentState ?? '');
    const { image, managers } = await this.defaultManagers();
    // The first file is transferred and copies are still missing: replenishment places them, preferring these managers.
    if (missing > 0 && bids?.spec?.fileTransferred) return;
    if (missing <= 0 || !preparing) {
      // A manager whose disk is in the spec map is kept: a copy was just placed there, and the image joins its spec
      // at the next reconcile (handleManagers runs before replenishment).
      for (const m of managers) {
        if (isPrestartedFor(m, name) && !bi.spec!.diskFileSpecMap?.[m.spec?.diskUUID ?? '']) await this.deletePrestarted(bi, m, missing <= 0 ? 'every copy is placed' : 'the first file failed');
      }
      return;
    }
    const withManager = new Set(managers.map((m) => m.spec?.diskUUID ?? ''));
    for (const disk of disksToPrestart(topo, specMap, await selectorPolicy(this.ctx, bi), missing, withManager)) {
      const f = topo.find(disk)!;
      const bimName = backingImageManagerName(image, disk);
      try {
        await store.create(BackingImageManagerKind, this.newManager(bi, image, disk, f.node.name, f.disk.path, {}, { [Annotation.PrestartedFor]: name }));
        this.ctx.log.info(`backing image ${name}: started manager ${bimName} on disk ${disk} of node ${f.node.name} for its next copy while the first file is prepared`);
        this.event(bi, 'Normal', EventReason.Create, `created backing image manager ${bimName} in disk ${disk} on node ${f.node.name} ahead of the next copy`);
      } catch (err) {
        if (!isAlreadyExists(err)) throw err;
      }
    }
  }

  /** The default manager image and the managers of that image that are not being deleted. */
  private async defaultManagers(): Promise<{ image: string; managers: Stored<BackingImageManager>[] }> {
    const image = await defaultManagerImage(this.ctx);
    return { image, managers: (await listManagers(this.ctx)).filter((m) => !m.metadata.deletionTimestamp && m.spec?.image === image) };
  }

  private async deletePrestarted(bi: BackingImage, bim: BackingImageManager, why: string): Promise<void> {
    try {
      await this.ctx.store.delete(BackingImageManagerKind, bim.metadata.name, bim.metadata.namespace);
    } catch (err) {
      if (!isNotFound(err)) throw err;
      return;
    }
    this.ctx.log.info(`backing image ${bi.metadata.name}: deleting manager ${bim.metadata.name} started ahead of a copy that was not placed on its disk: ${why}`);
    this.event(bi, 'Normal', EventReason.Delete, `deleting unused backing image manager ${bim.metadata.name} in disk ${bim.spec?.diskUUID} on node ${bim.spec?.nodeID}: ${why}`);
  }

  private newManager(
    bi: BackingImage,
    image: string,
    disk: string,
    nodeID: string,
    diskPath: string,
    backingImages: Record<string, string>,
    annotations?: Record<string, string>,
  ): BackingImageManager {
    return {
      apiVersion: bi.apiVersion,
      kind: 'BackingImageManager',
      metadata: {
        name: backingImageManagerName(image, disk),
        namespace: this.ctx.namespace,
        finalizers: [FINALIZER],
        labels: { [Label.ManagedBy]: MANAGED_BY, [Label.Component]: Component.BackingImageManager, [Label.DiskUUID]: disk, [Label.Node]: nodeID },
        ...(annotations ? { annotations } : {}),
      },
      spec: { image, nodeID, diskUUID: disk, diskPath, backingImages },
      status: {},
    };
  }

  private async handleManagers(bi: Stored<BackingImage>, topo: Topology): Promise<void> {
    const { store, namespace } = this.ctx;
    const name = bi.metadata.name;
    const image = await defaultManagerImage(this.ctx);
    await this.cleanupManagers(bi, image);
    const managers = await listManagers(this.ctx);
    for (const [disk, spec] of Object.entries(bi.spec!.diskFileSpecMap ?? {})) {
      if ((spec.dataEngine ?? 'v1') !== 'v1') continue;
      const onDisk = managers.filter((m) => m.spec?.diskUUID === disk);
      const def = onDisk.find((m) => !m.metadata.deletionTimestamp && m.spec?.image === image);
      if (def) {
        // several images added to one manager at once go in one write of it (its object lists every image of its disk)
        if (def.spec?.backingImages?.[name] !== bi.status!.uuid) await this.managerSpecs.add(def.metadata.name, name, bi.status!.uuid!);
        continue;
      }
      const migrated: Record<string, string> = {};
      for (const m of onDisk) Object.assign(migrated, m.spec?.backingImages ?? {});
      const f = topo.readyDisk(disk);
      if (!f) {
        const st = (bi.status!.diskFileStatusMap![disk] ??= { dataEngine: 'v1', progress: 0, message: '', lastStateTransitionTime: '' });
        const prev = st.state ?? '';
        st.state = transition(FILE_MACHINE, prev, 'disk-unavailable', `copy of backing image ${name} on disk ${disk}`);
        if (st.state !== prev) st.lastStateTransitionTime = rfc3339(this.ctx.now());
        st.message = NOT_READY_DISK_MESSAGE(disk);
        continue;
      }
      const bimName = backingImageManagerName(image, disk);
      const bim = this.newManager(bi, image, disk, f.node.name, f.disk.path, { ...migrated, [name]: bi.status!.uuid! });
      try {
        await store.create(BackingImageManagerKind, bim);
        this.event(bi, 'Normal', EventReason.Create, `created default backing image manager ${bimName} in disk ${disk} on node ${f.node.name}`);
      } catch (err) {
        if (!isAlreadyExists(err)) throw err;
      }
    }
  }

  // ------------------------------------------------------------ §3.1.3

  /** Updates the copies' status from the data source and the managers; returns the events of the changes. */
  private async syncFileInfo(bi: Stored<BackingImage>): Promise<AggregationEvent[]> {
    const { store, namespace } = this.ctx;
    const bids = await getOrUndefined(store.get(BackingImageDataSourceKind, bi.metadata.name, namespace));
    const managers = (await listManagers(this.ctx)).filter((m) => !m.metadata.deletionTimestamp);
    return aggregateFileStatus({ status: bi.status!, bids, managers, biName: bi.metadata.name, nowIso: rfc3339(this.ctx.now()) });
  }

  private lastRefMap(bi: Stored<BackingImage>, inUse: ReadonlySet<string>): Record<string, string> {
    const out: Record<string, string> = {};
    const old = bi.status!.diskLastRefAtMap ?? {};
    for (const disk of Object.keys(bi.spec!.diskFileSpecMap ?? {})) {
      if (inUse.has(disk)) continue;
      out[disk] = old[disk] ?? rfc3339(this.ctx.now());
    }
    return out;
  }

  // ------------------------------------------------------------ §3.1.4 / §3.1.5

  /**
   * `transferred`: the first file is transferred as of this reconcile. The data source read from the store may not show
   * it yet when this reconcile is the one that marked it (the copies are then placed at once, not one reconcile later).
   */
  private async replenish(bi: Stored<BackingImage>, topo: Topology, transferred: boolean): Promise<AggregationEvent | undefined> {
    if (!transferred) return undefined;
    const limit = await this.ctx.settings.int(SettingName.ConcurrentBackingImageReplenishPerNodeLimit);
    const specMap = bi.spec!.diskFileSpecMap!;
    const statusMap = bi.status!.diskFileStatusMap ?? {};
    if (!needsReplenish(specMap, statusMap, bi.spec!.minNumberOfCopies ?? 1, limit)) return undefined;
    // EXTENSION: a disk whose manager already runs (e.g. started ahead by prestartManagers) is preferred.
    const withManager = new Set((await this.defaultManagers()).managers.map((m) => m.spec?.diskUUID ?? ''));
    const policy = await selectorPolicy(this.ctx, bi);
    const evicting = Object.entries(specMap).filter(([, e]) => e.evictionRequested).map(([d]) => d);
    // EXTENSION: every missing copy is placed in this reconcile (Longhorn places one per reconcile, so the k-th copy
    // waits k reconciles before its manager may even ask for a sync). The syncs themselves stay bounded by the
    // managers' per-node replenish limit and the 3 sends per file of a sender.
    const placed: string[] = [];
    do {
      const p = pickDiskForCopy(topo, specMap, policy, undefined, withManager);
      if (!p) {
        this.ctx.log.debug(`backing image ${bi.metadata.name}: no disk available for one more copy`);
        break;
      }
      specMap[p.disk.diskUUID] = { dataEngine: bi.spec!.dataEngine ?? 'v1', evictionRequested: false } satisfies BackingImageDiskFileSpec;
      placed.push(`disk ${p.disk.diskName} (${p.disk.diskUUID}) on node ${p.node.name}`);
    } while (needsReplenish(specMap, statusMap, bi.spec!.minNumberOfCopies ?? 1, limit));
    if (placed.length === 0) return undefined;
    // The copies placed together are told in one event.
    const what = placed.length === 1 ? `a copy of backing image ${bi.metadata.name} on ${placed[0]}` : `${placed.length} copies of backing image ${bi.metadata.name}: on ${placed.join(', on ')}`;
    const why = evicting.length ? ` to replace the copy being evicted from disk ${evicting.join(', ')}` : '';
    return { type: 'Normal', reason: EventReason.Syncing, message: `Adding ${what}${why}` };
  }

  /**
   * The `MinCopiesSatisfiable` condition: `False` when `minNumberOfCopies` exceeds the disks that the selectors allow
   * (the image then keeps a copy on each of them, and says so), `True` otherwise. A change is logged and recorded
   * as an event.
   */
  private async checkCopiesSatisfiable(old: StoredBI, bi: Stored<BackingImage>, topo: Topology): Promise<void> {
    const min = Math.max(1, bi.spec!.minNumberOfCopies ?? 1);
    const allowed = eligibleDiskCount(topo, await selectorPolicy(this.ctx, bi));
    const message = minCopiesShortfall(min, allowed);
    const prev = (old.status?.conditions ?? []).find((c) => c.type === MIN_COPIES_CONDITION);
    const status = message ? 'False' : 'True';
    if (prev?.status === status && (prev.message ?? '') === (message ?? '')) return;
    const now = rfc3339(this.ctx.now());
    const cond = {
      type: MIN_COPIES_CONDITION,
      status,
      reason: message ? 'NotEnoughDisks' : '',
      message: message ?? '',
      lastProbeTime: '',
      lastTransitionTime: prev?.status === status ? (prev.lastTransitionTime ?? now) : now,
    };
    bi.status!.conditions = [...(bi.status!.conditions ?? []).filter((c) => c.type !== MIN_COPIES_CONDITION), cond];
    if (message) {
      this.ctx.log.warn(`backing image ${bi.metadata.name}: ${message}`);
      this.event(bi, 'Warning', EventReason.Update, message);
    } else if (prev?.status === 'False') {
      this.ctx.log.info(`backing image ${bi.metadata.name}: minNumberOfCopies ${min} can be satisfied again`);
    }
  }

  private evict(bi: Stored<BackingImage>, inUse: ReadonlySet<string>): void {
    const specMap = bi.spec!.diskFileSpecMap!;
    const d = evictionDecision(specMap, bi.status!.diskFileStatusMap ?? {}, inUse);
    if (d.keptLastHealthy) {
      this.event(bi, 'Normal', EventReason.FailedDeleting, `Failed to evict backing image copy on disk ${d.keptLastHealthy} for now since there is no other healthy backing image copy`);
    }
    for (const disk of d.remove) {
      if (specMap[disk]?.evictionRequested) this.event(bi, 'Normal', EventReason.Delete, `Evicting backing image copy from disk ${disk}: another healthy copy exists`);
      delete specMap[disk];
    }
  }
}

/** A manager started ahead for this image (`Annotation.PrestartedFor`) that has no image in its spec. */
export function isPrestartedFor(bim: BackingImageManager, image: string): boolean {
  return bim.metadata.annotations?.[Annotation.PrestartedFor] === image && Object.keys(bim.spec?.backingImages ?? {}).length === 0;
}
