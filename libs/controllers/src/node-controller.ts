import { Controller, type ControllerContext } from './base-controller.js';
import { cachedOrGet, getOrUndefined, listImages } from './common.js';
import { EventReason, EventSource } from './events.js';
import { BackingImageDataSourceKind, BackingImageKind, NodeKind, ReplicaKind, SettingKind, type Node } from './kinds.js';
import { unusedCopiesToRemove } from './rules.js';
import { SettingName } from './settings.js';
import { nodeInfo } from './topology.js';

/**
 * The backing-image parts of Longhorn's node controller (§3.5) for the node this manager runs on: trimming unused
 * copies after the cleanup wait interval, and propagating node/disk eviction requests to the images' spec maps.
 */
export class NodeController extends Controller {
  readonly name = 'node';

  constructor(ctx: ControllerContext) {
    super(ctx);
    const mine = () => this.enqueue(ctx.nodeID);
    // The node sync walks every image; image and replica changes are coalesced (at most one pass a second).
    const soon = () => this.queue.addAfter(ctx.nodeID, 1000);
    ctx.informers.on(NodeKind, (_t, n) => {
      if (n.metadata.name === ctx.nodeID) mine();
    });
    ctx.informers.on(SettingKind, mine);
    ctx.informers.on(ReplicaKind, soon);
    ctx.informers.on(BackingImageKind, (t) => {
      if (t !== 'RESYNC') soon();
    });
  }

  async reconcile(name: string): Promise<void> {
    if (name !== this.ctx.nodeID) return;
    const { store, namespace } = this.ctx;
    const node = await getOrUndefined(store.get(NodeKind, name, namespace));
    if (!node) return;
    await this.cleanupUnusedCopies(name);
    await this.syncEvictionRequested(node);
  }

  private async cleanupUnusedCopies(nodeName: string): Promise<void> {
    const { store, namespace } = this.ctx;
    let waitMin: number;
    try {
      waitMin = await this.ctx.settings.int(SettingName.BackingImageCleanupWaitInterval);
    } catch {
      return;
    }
    const node = await store.get(NodeKind, nodeName, namespace);
    const nodeDisks = nodeInfo(node).disks.map((d) => d.diskUUID);
    const now = this.ctx.now().getTime();
    const waitMs = waitMin * 60_000;
    let earliest = Infinity;
    for (const bi of await listImages(this.ctx)) {
      if (bi.metadata.deletionTimestamp) continue;
      const bids = await cachedOrGet(this.ctx, BackingImageDataSourceKind, bi.metadata.name);
      if (!bids?.spec?.fileTransferred) continue;
      const spec = bi.spec?.diskFileSpecMap;
      const lastRef = bi.status?.diskLastRefAtMap;
      if (!spec || !lastRef) continue;
      const remove = unusedCopiesToRemove(spec, bi.status?.diskFileStatusMap ?? {}, lastRef, nodeDisks, bi.spec?.minNumberOfCopies ?? 1, now, waitMs);
      if (remove.length > 0) {
        const next = { ...spec };
        for (const d of remove) {
          delete next[d];
          this.ctx.log.info(`Cleaning up the unused file in disk ${d} for backing image ${bi.metadata.name}`);
        }
        try {
          await store.update(BackingImageKind, { ...bi, spec: { ...bi.spec, diskFileSpecMap: next } });
        } catch (err) {
          this.ctx.log.warn(`failed to clean up unused copies of ${bi.metadata.name}: ${(err as Error).message}`);
          this.queue.addRateLimited(nodeName);
        }
      }
      // Come back when the next unused copy on this node passes the wait interval (Longhorn relies on its 30 s resync).
      if (Object.keys(spec).length - remove.length > Math.max(1, bi.spec?.minNumberOfCopies ?? 1)) {
        for (const d of nodeDisks) if (lastRef[d] && spec[d] && !remove.includes(d)) earliest = Math.min(earliest, Date.parse(lastRef[d]) + waitMs);
      }
    }
    if (earliest !== Infinity) this.queue.addAfter(nodeName, Math.max(1000, earliest - now + 1000));
  }

  private async syncEvictionRequested(node: Node): Promise<void> {
    const { store, namespace } = this.ctx;
    const info = nodeInfo(node);
    // FIX: Longhorn returns early when no eviction flag remains, so cancelled requests are never cleared from the
    // images' spec maps. Here the flags are always made to follow the node and disk settings.
    for (const bi of await listImages(this.ctx)) {
      if (bi.metadata.deletionTimestamp) continue;
      const spec = bi.spec?.diskFileSpecMap ?? {};
      let next: typeof spec | undefined;
      for (const disk of info.disks) {
        if (!bi.status?.diskFileStatusMap?.[disk.diskUUID]) continue;
        const e = spec[disk.diskUUID];
        if (!e) continue;
        const required = disk.evictionRequested || info.evictionRequested;
        if (!!e.evictionRequested === required) continue;
        next ??= { ...spec };
        next[disk.diskUUID] = { ...e, evictionRequested: required };
        this.ctx.events.record(
          EventSource.Node,
          bi,
          'Normal',
          required ? EventReason.EvictionUserRequested : EventReason.EvictionCanceled,
          `${required ? 'Requesting' : 'Cancelling'} backing image copy eviction from node ${info.name} and disk ${disk.diskUUID}`,
        );
      }
      if (next) await store.update(BackingImageKind, { ...bi, spec: { ...bi.spec, diskFileSpecMap: next } });
    }
  }
}
