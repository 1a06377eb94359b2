import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { ControllerMetrics, Datastore } from '@bis/datastore';
import { BackingImageKind, BackingImageManagerKind, BackupBackingImageKind, NodeKind } from '@bis/controllers';

/** Direction of transferred bytes: `in` written to a disk of this system, `out` sent out of it (to a backup target). */
export type TransferDirection = 'in' | 'out';
/** What a failure was: a data source, a copy on a disk, a backup, or a copy found corrupt by a scrub. */
export type FailureKind = 'data-source' | 'copy' | 'backup' | 'scrub';

export interface BackingImageMetricsOptions {
  store: Datastore;
  namespace: string;
  /** Only images, backups and managers whose `status.ownerID` is this node are exported (Longhorn: the owner node's manager). Default: all. */
  ownerID?: string;
  /** Registry to register into (default: a new one). */
  registry?: Registry;
  /** Collect prom-client's default process metrics (`process_*`, `nodejs_*`) into the registry (default true). */
  processMetrics?: boolean;
}

/** A failure reason for the `reason` label, from the failure's message (a small fixed set, never free text). */
export function failureReason(message: string): string {
  const m = message.toLowerCase();
  if (/checksum/.test(m)) return 'checksum-mismatch';
  if (/enospc|no space|not enough space|insufficient (storage|space)/.test(m)) return 'no-space';
  if (/\bhttp\s*4\d\d\b|status(?: code)? 4\d\d\b|\bgot 4\d\d\b|\b4\d\d (not found|forbidden|unauthorized|gone)/.test(m)) return 'http-4xx';
  if (/\bhttp\s*5\d\d\b|status(?: code)? 5\d\d\b|\bgot 5\d\d\b|\b5\d\d (internal|bad gateway|service unavailable|gateway timeout)/.test(m)) return 'http-5xx';
  if (/timed? ?out|timeout|stall/.test(m)) return 'timeout';
  if (/econnrefused|econnreset|enotfound|ehostunreach|socket|connection/.test(m)) return 'connection';
  if (/eio\b|i\/o error|input\/output/.test(m)) return 'io-error';
  if (/cancel|abort|deleted/.test(m)) return 'cancelled';
  if (/corrupt/.test(m)) return 'corrupted';
  return 'other';
}

/**
 * The `/metrics` of the backing-image system (prom-client):
 * - the process metrics of prom-client (`process_*`, `nodejs_*`);
 * - per controller: `workqueue_depth`, `workqueue_adds_total`, `workqueue_retries_total` and
 *   `controller_runtime_reconcile_time_seconds` (the names of controller-runtime), fed by {@link controllerMetrics};
 * - per copy, read from the store at each scrape: `bis_backing_image_copy_state` (the state as a label, value 1),
 *   `bis_backing_image_copy_progress_ratio` (0-1) and Longhorn's `longhorn_backing_image_actual_size_bytes`; per disk
 *   the number of copies by state; per backup its state (label), progress ratio and size; per disk the last scrub;
 * - counters fed by the {@link ActivityObserver}: transferred bytes by direction and kind, failures by kind and reason,
 *   finished backups with their durations, scrub passes by result.
 */
export class BackingImageMetrics {
  readonly registry: Registry;
  private readonly actualSize: Gauge<'node' | 'disk' | 'backing_image'>;
  private readonly copyState: Gauge<'node' | 'disk' | 'backing_image' | 'state'>;
  private readonly progress: Gauge<'node' | 'disk' | 'backing_image'>;
  private readonly diskFiles: Gauge<'node' | 'disk' | 'state'>;
  private readonly backupSize: Gauge<'backup_backing_image' | 'backing_image'>;
  private readonly backupState: Gauge<'backup_backing_image' | 'backing_image' | 'state'>;
  private readonly backupProgress: Gauge<'backup_backing_image' | 'backing_image'>;
  private readonly scrubResult: Gauge<'node' | 'disk' | 'result'>;
  private readonly scrubFiles: Gauge<'node' | 'disk'>;
  private readonly scrubTime: Gauge<'node' | 'disk'>;
  private readonly queueDepth: Gauge<'name'>;
  private readonly queueAdds: Counter<'name'>;
  private readonly queueRetries: Counter<'name'>;
  private readonly reconcileTime: Histogram<'controller' | 'result'>;
  private readonly bytes: Counter<'direction' | 'kind'>;
  private readonly failures: Counter<'kind' | 'reason'>;
  private readonly backups: Counter<'result'>;
  private readonly backupDuration: Histogram<'result'>;
  private readonly scrubs: Counter<'result'>;
  private readonly proxyTransfers: Counter<'kind' | 'result'>;
  private readonly proxyActive: Gauge<'kind'>;

  constructor(private readonly opts: BackingImageMetricsOptions) {
    const r = (this.registry = opts.registry ?? new Registry());
    if (opts.processMetrics !== false) collectDefaultMetrics({ register: r });
    const copy = ['node', 'disk', 'backing_image'] as const;
    this.actualSize = new Gauge({ name: 'longhorn_backing_image_actual_size_bytes', help: 'Actual size of the backing image file on a disk', labelNames: copy, registers: [r] });
    this.copyState = new Gauge({
      name: 'bis_backing_image_copy_state',
      help: 'State of the backing image copy on a disk: 1 for its current state (label state), one series per copy',
      labelNames: [...copy, 'state'],
      registers: [r],
    });
    this.progress = new Gauge({ name: 'bis_backing_image_copy_progress_ratio', help: 'Progress (0-1) of the backing image copy on a disk', labelNames: copy, registers: [r] });
    this.diskFiles = new Gauge({ name: 'bis_disk_backing_image_copies', help: 'Backing image copies on a disk by state', labelNames: ['node', 'disk', 'state'], registers: [r] });
    this.backupSize = new Gauge({ name: 'bis_backup_backing_image_size_bytes', help: 'Size of the backup backing image', labelNames: ['backup_backing_image', 'backing_image'], registers: [r] });
    this.backupState = new Gauge({
      name: 'bis_backup_backing_image_state',
      help: 'State of the backup backing image: 1 for its current state (label state)',
      labelNames: ['backup_backing_image', 'backing_image', 'state'],
      registers: [r],
    });
    this.backupProgress = new Gauge({ name: 'bis_backup_backing_image_progress_ratio', help: 'Progress (0-1) of a backup backing image', labelNames: ['backup_backing_image', 'backing_image'], registers: [r] });
    this.scrubResult = new Gauge({ name: 'bis_disk_scrub_last_result', help: 'Result of the last scrub pass of a disk: 1 for its result (label result: ok, corrupted, error)', labelNames: ['node', 'disk', 'result'], registers: [r] });
    this.scrubFiles = new Gauge({ name: 'bis_disk_scrub_last_copies', help: 'Copies verified by the last scrub pass of a disk', labelNames: ['node', 'disk'], registers: [r] });
    this.scrubTime = new Gauge({ name: 'bis_disk_scrub_last_time_seconds', help: 'Unix time the last scrub pass of a disk ended', labelNames: ['node', 'disk'], registers: [r] });
    this.queueDepth = new Gauge({ name: 'workqueue_depth', help: 'Keys waiting in the work queue of a controller', labelNames: ['name'], registers: [r] });
    this.queueAdds = new Counter({ name: 'workqueue_adds_total', help: 'Keys added to the work queue of a controller', labelNames: ['name'], registers: [r] });
    this.queueRetries = new Counter({ name: 'workqueue_retries_total', help: 'Keys re-added with backoff after a failed reconcile', labelNames: ['name'], registers: [r] });
    this.reconcileTime = new Histogram({
      name: 'controller_runtime_reconcile_time_seconds',
      help: 'Duration of reconciles by controller and result (success, requeue, error)',
      labelNames: ['controller', 'result'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers: [r],
    });
    this.bytes = new Counter({
      name: 'bis_backing_image_transferred_bytes_total',
      help: 'Bytes transferred: direction in (into a disk: kind download, upload, clone, restore, export-from-volume by data sources, sync between disks) or out (kind backup; image-download through the REST API)',
      labelNames: ['direction', 'kind'],
      registers: [r],
    });
    this.failures = new Counter({ name: 'bis_backing_image_failures_total', help: 'Failed data sources, copies, backups and scrubbed copies, by reason', labelNames: ['kind', 'reason'], registers: [r] });
    this.backups = new Counter({ name: 'bis_backup_backing_images_total', help: 'Finished backups of backing images, by result (completed, error)', labelNames: ['result'], registers: [r] });
    this.backupDuration = new Histogram({
      name: 'bis_backup_backing_image_duration_seconds',
      help: 'Duration of finished backups of backing images, by result',
      labelNames: ['result'],
      buckets: [1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600],
      registers: [r],
    });
    this.scrubs = new Counter({ name: 'bis_disk_scrub_passes_total', help: 'Finished scrub passes of the disks, by result', labelNames: ['result'], registers: [r] });
    this.proxyTransfers = new Counter({
      name: 'bis_rest_transfers_total',
      help: 'Finished uploads and downloads through the REST API proxies, by kind and result (succeeded, failed, cancelled)',
      labelNames: ['kind', 'result'],
      registers: [r],
    });
    this.proxyActive = new Gauge({ name: 'bis_rest_transfers_active', help: 'Uploads and downloads through the REST API proxies under way', labelNames: ['kind'], registers: [r] });
    for (const kind of ['upload', 'download']) this.proxyActive.set({ kind }, 0);
  }

  // ---------------------------------------------------------------- the REST proxies (`TransferObserver` of @bis/api-resources)

  transferStarted(kind: 'upload' | 'download', _backingImage: string): void {
    this.proxyActive.inc({ kind });
  }

  /**
   * An upload or download through the REST API ended. A download's bytes count as sent out (`kind="image-download"`);
   * an upload's bytes are counted once, by its data source (`kind="upload"`).
   */
  transferFinished(kind: 'upload' | 'download', _backingImage: string, result: 'succeeded' | 'failed' | 'cancelled', bytes: number): void {
    this.proxyActive.dec({ kind });
    this.proxyTransfers.inc({ kind, result });
    if (kind === 'download') this.transferred('out', 'image-download', bytes);
  }

  /** The queue and reconcile metrics of one controller, for `ControllerManagerOptions.controllerMetrics`. */
  controllerMetrics(controller: string): ControllerMetrics {
    const name = controller;
    this.queueDepth.set({ name }, 0);
    this.queueAdds.inc({ name }, 0);
    this.queueRetries.inc({ name }, 0);
    return {
      added: () => this.queueAdds.inc({ name }),
      depth: (n) => this.queueDepth.set({ name }, n),
      retried: () => this.queueRetries.inc({ name }),
      reconciled: (seconds, result) => this.reconcileTime.observe({ controller, result }, seconds),
    };
  }

  // ---------------------------------------------------------------- counters the activity observer feeds

  transferred(direction: TransferDirection, kind: string, bytes: number): void {
    if (bytes > 0) this.bytes.inc({ direction, kind }, bytes);
  }

  failed(kind: FailureKind, reason: string): void {
    this.failures.inc({ kind, reason });
  }

  backupFinished(result: 'completed' | 'error', seconds: number | undefined): void {
    this.backups.inc({ result });
    if (seconds !== undefined && seconds >= 0) this.backupDuration.observe({ result }, seconds);
  }

  scrubFinished(result: string): void {
    this.scrubs.inc({ result: result || 'unknown' });
  }

  // ---------------------------------------------------------------- scrape

  /** Re-reads the datastore into the gauges. */
  async refresh(): Promise<void> {
    const { store, namespace, ownerID } = this.opts;
    const [bis, bims, nodes, bbis] = await Promise.all([
      store.list(BackingImageKind, { namespace }),
      store.list(BackingImageManagerKind, { namespace }),
      store.list(NodeKind, { namespace }),
      store.list(BackupBackingImageKind, { namespace }),
    ]);
    const nodeOfDisk = new Map<string, string>();
    for (const n of nodes.items) for (const d of Object.values(n.status?.diskStatus ?? {})) if (d.diskUUID) nodeOfDisk.set(d.diskUUID, n.metadata.name);
    for (const m of bims.items) if (m.spec?.diskUUID && m.spec.nodeID && !nodeOfDisk.has(m.spec.diskUUID)) nodeOfDisk.set(m.spec.diskUUID, m.spec.nodeID);

    for (const g of [this.actualSize, this.copyState, this.progress, this.diskFiles, this.backupSize, this.backupState, this.backupProgress, this.scrubResult, this.scrubFiles, this.scrubTime]) g.reset();
    const perDisk = new Map<string, Map<string, number>>();
    for (const bi of bis.items) {
      if (ownerID && bi.status?.ownerID && bi.status.ownerID !== ownerID) continue;
      const size = bi.status?.size ?? 0;
      for (const [disk, f] of Object.entries(bi.status?.diskFileStatusMap ?? {})) {
        const labels = { node: nodeOfDisk.get(disk) ?? '', disk, backing_image: bi.metadata.name };
        const st = f.state || 'unknown';
        this.actualSize.set(labels, size);
        this.copyState.set({ ...labels, state: st }, 1);
        const pct = st === 'ready' || st === 'ready-for-transfer' ? 100 : (f.progress ?? 0);
        this.progress.set(labels, Math.max(0, Math.min(1, pct / 100)));
        const dkey = `${labels.node}\u0000${disk}`;
        const counts = perDisk.get(dkey) ?? new Map<string, number>();
        counts.set(st, (counts.get(st) ?? 0) + 1);
        perDisk.set(dkey, counts);
      }
    }
    for (const [dkey, counts] of perDisk) {
      const [node, disk] = dkey.split('\u0000') as [string, string];
      for (const [st, n] of counts) this.diskFiles.set({ node, disk, state: st }, n);
    }
    for (const b of bbis.items) {
      if (ownerID && b.status?.ownerID && b.status.ownerID !== ownerID) continue;
      const labels = { backup_backing_image: b.metadata.name, backing_image: b.spec?.backingImage ?? '' };
      this.backupSize.set(labels, b.status?.size ?? 0);
      this.backupState.set({ ...labels, state: b.status?.state || 'Pending' }, 1);
      this.backupProgress.set(labels, Math.max(0, Math.min(1, (b.status?.progress ?? 0) / 100)));
    }
    for (const m of bims.items) {
      if (ownerID && m.status?.ownerID && m.status.ownerID !== ownerID) continue;
      const scrub = m.status?.diskScrub;
      if (!scrub?.lastScrubTime) continue;
      const labels = { node: m.spec?.nodeID ?? '', disk: m.spec?.diskUUID ?? '' };
      this.scrubResult.set({ ...labels, result: scrub.lastScrubResult || 'unknown' }, 1);
      this.scrubFiles.set(labels, scrub.lastScrubFiles ?? 0);
      const t = Date.parse(scrub.lastScrubTime);
      if (Number.isFinite(t)) this.scrubTime.set(labels, t / 1000);
    }
  }

  /** The Prometheus text exposition after a refresh. */
  async text(): Promise<string> {
    await this.refresh();
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
