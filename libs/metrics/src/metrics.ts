import { Counter, Gauge, Registry } from 'prom-client';
import type { Datastore } from '@bis/datastore';
import { BackingImageKind, BackingImageManagerKind, BackupBackingImageKind, NodeKind } from '@bis/controllers';

/** Longhorn's numeric encoding of a disk file state (`longhorn_backing_image_state`). */
export const BACKING_IMAGE_STATE_VALUES: Readonly<Record<string, number>> = {
  pending: 0,
  starting: 1,
  'in-progress': 2,
  'ready-for-transfer': 3,
  ready: 4,
  failed: 5,
  'failed-and-cleanup': 6,
  unknown: 7,
};

/** Longhorn's numeric encoding of a backup state (`longhorn_backup_backing_image_state`). */
export const BACKUP_STATE_VALUES: Readonly<Record<string, number>> = { '': 0, Pending: 1, InProgress: 2, Completed: 3, Error: 4, Unknown: 5 };

export type TransferKind = 'upload' | 'download' | 'sync' | 'backup' | 'restore';
export type TransferResult = 'succeeded' | 'failed' | 'cancelled';

export interface BackingImageMetricsOptions {
  store: Datastore;
  namespace: string;
  /** Only images whose `status.ownerID` is this node are exported (Longhorn: the owner node's manager). Default: all. */
  ownerID?: string;
  /** Clock for the bytes/s estimate (tests). */
  now?: () => number;
  /** Registry to register into (default: a new one). */
  registry?: Registry;
}

const STATES = Object.keys(BACKING_IMAGE_STATE_VALUES);

/**
 * The `/metrics` of the backing-image system: Longhorn's four backing-image metrics, plus per-copy progress and an
 * estimated transfer rate, per-disk counts by state, and counters other components increment (transfers, bytes,
 * retries, backups). Gauges are refreshed from the datastore at each scrape.
 */
export class BackingImageMetrics {
  readonly registry: Registry;
  private readonly actualSize: Gauge<'node' | 'disk' | 'backing_image'>;
  private readonly state: Gauge<'node' | 'disk' | 'backing_image'>;
  private readonly progress: Gauge<'node' | 'disk' | 'backing_image'>;
  private readonly rate: Gauge<'node' | 'disk' | 'backing_image'>;
  private readonly diskFiles: Gauge<'node' | 'disk' | 'state'>;
  private readonly backupSize: Gauge<'backup_backing_image'>;
  private readonly backupState: Gauge<'backup_backing_image'>;
  private readonly backupProgress: Gauge<'backup_backing_image' | 'backing_image'>;
  private readonly transfers: Counter<'kind' | 'result'>;
  private readonly transferBytes: Counter<'kind'>;
  private readonly transfersActive: Gauge<'kind'>;
  private readonly retries: Counter<'kind'>;
  private readonly backups: Counter<'result'>;
  /** Last (time, processed bytes) per copy, for the rate estimate. */
  private readonly lastProcessed = new Map<string, { t: number; bytes: number }>();

  constructor(private readonly opts: BackingImageMetricsOptions) {
    const r = (this.registry = opts.registry ?? new Registry());
    const copy = ['node', 'disk', 'backing_image'] as const;
    this.actualSize = new Gauge({ name: 'longhorn_backing_image_actual_size_bytes', help: 'Actual size of the backing image file on a disk', labelNames: copy, registers: [r] });
    this.state = new Gauge({
      name: 'longhorn_backing_image_state',
      help: 'State of the backing image file on a disk: 0=pending 1=starting 2=in-progress 3=ready-for-transfer 4=ready 5=failed 6=failed-and-cleanup 7=unknown',
      labelNames: copy,
      registers: [r],
    });
    this.progress = new Gauge({ name: 'bis_backing_image_progress_percent', help: 'Progress (0-100) of the backing image file on a disk', labelNames: copy, registers: [r] });
    this.rate = new Gauge({
      name: 'bis_backing_image_transfer_bytes_per_second',
      help: 'Bytes per second a copy in progress advanced between the last two scrapes (progress x size)',
      labelNames: copy,
      registers: [r],
    });
    this.diskFiles = new Gauge({ name: 'bis_disk_backing_image_files', help: 'Backing image files on a disk by state', labelNames: ['node', 'disk', 'state'], registers: [r] });
    this.backupSize = new Gauge({ name: 'longhorn_backup_backing_image_actual_size_bytes', help: 'Size of the backup backing image', labelNames: ['backup_backing_image'], registers: [r] });
    this.backupState = new Gauge({
      name: 'longhorn_backup_backing_image_state',
      help: 'State of the backup backing image: 0="" 1=Pending 2=InProgress 3=Completed 4=Error 5=Unknown',
      labelNames: ['backup_backing_image'],
      registers: [r],
    });
    this.backupProgress = new Gauge({ name: 'bis_backup_backing_image_progress_percent', help: 'Progress (0-100) of a backup backing image', labelNames: ['backup_backing_image', 'backing_image'], registers: [r] });
    this.transfers = new Counter({ name: 'bis_backing_image_transfers_total', help: 'Finished transfers by kind and result', labelNames: ['kind', 'result'], registers: [r] });
    this.transferBytes = new Counter({ name: 'bis_backing_image_transfer_bytes_total', help: 'Bytes moved by transfers, by kind', labelNames: ['kind'], registers: [r] });
    this.transfersActive = new Gauge({ name: 'bis_backing_image_transfers_active', help: 'Transfers under way, by kind', labelNames: ['kind'], registers: [r] });
    this.retries = new Counter({ name: 'bis_backing_image_retries_total', help: 'Retries of transfers and reconciliations, by kind', labelNames: ['kind'], registers: [r] });
    this.backups = new Counter({ name: 'bis_backing_image_backups_total', help: 'Finished backups of backing images, by result', labelNames: ['result'], registers: [r] });
  }

  // ---------------------------------------------------------------- counters for other components

  transferStarted(kind: TransferKind, _backingImage?: string): void {
    this.transfersActive.inc({ kind });
  }

  transferFinished(kind: TransferKind, _backingImage: string | undefined, result: TransferResult, bytes: number): void {
    this.transfersActive.dec({ kind });
    this.transfers.inc({ kind, result });
    if (bytes > 0) this.transferBytes.inc({ kind }, bytes);
  }

  retried(kind: string): void {
    this.retries.inc({ kind });
  }

  backupFinished(result: 'completed' | 'error'): void {
    this.backups.inc({ result });
  }

  // ---------------------------------------------------------------- scrape

  /** Re-reads the datastore into the gauges. */
  async refresh(): Promise<void> {
    const { store, namespace, ownerID } = this.opts;
    const now = (this.opts.now ?? Date.now)();
    const [bis, bims, nodes, bbis] = await Promise.all([
      store.list(BackingImageKind, { namespace }),
      store.list(BackingImageManagerKind, { namespace }),
      store.list(NodeKind, { namespace }),
      store.list(BackupBackingImageKind, { namespace }),
    ]);
    const nodeOfDisk = new Map<string, string>();
    for (const n of nodes.items) for (const d of Object.values(n.status?.diskStatus ?? {})) if (d.diskUUID) nodeOfDisk.set(d.diskUUID, n.metadata.name);
    for (const m of bims.items) if (m.spec?.diskUUID && m.spec.nodeID && !nodeOfDisk.has(m.spec.diskUUID)) nodeOfDisk.set(m.spec.diskUUID, m.spec.nodeID);

    for (const g of [this.actualSize, this.state, this.progress, this.rate, this.diskFiles, this.backupSize, this.backupState, this.backupProgress]) g.reset();
    const perDisk = new Map<string, Map<string, number>>();
    const seen = new Set<string>();
    for (const bi of bis.items) {
      if (ownerID && bi.status?.ownerID && bi.status.ownerID !== ownerID) continue;
      const size = bi.status?.size ?? 0;
      for (const [disk, f] of Object.entries(bi.status?.diskFileStatusMap ?? {})) {
        const labels = { node: nodeOfDisk.get(disk) ?? '', disk, backing_image: bi.metadata.name };
        const st = f.state ?? '';
        this.actualSize.set(labels, size);
        if (st in BACKING_IMAGE_STATE_VALUES) this.state.set(labels, BACKING_IMAGE_STATE_VALUES[st]!);
        const pct = st === 'ready' || st === 'ready-for-transfer' ? 100 : (f.progress ?? 0);
        this.progress.set(labels, pct);
        const key = `${bi.metadata.name}\u0000${bi.status?.uuid ?? ''}\u0000${disk}`;
        seen.add(key);
        const processed = (size * pct) / 100;
        const last = this.lastProcessed.get(key);
        const inProgress = st === 'in-progress' || st === 'starting' || st === 'pending';
        this.rate.set(labels, inProgress && last && now > last.t && processed >= last.bytes ? Math.round(((processed - last.bytes) * 1000) / (now - last.t)) : 0);
        this.lastProcessed.set(key, { t: now, bytes: processed });
        const dkey = `${labels.node}\u0000${disk}`;
        const counts = perDisk.get(dkey) ?? new Map<string, number>();
        counts.set(st || 'unknown', (counts.get(st || 'unknown') ?? 0) + 1);
        perDisk.set(dkey, counts);
      }
    }
    for (const k of [...this.lastProcessed.keys()]) if (!seen.has(k)) this.lastProcessed.delete(k);
    for (const [dkey, counts] of perDisk) {
      const [node, disk] = dkey.split('\u0000') as [string, string];
      for (const st of STATES) this.diskFiles.set({ node, disk, state: st }, counts.get(st) ?? 0);
    }
    for (const b of bbis.items) {
      const name = b.metadata.name;
      this.backupSize.set({ backup_backing_image: name }, b.status?.size ?? 0);
      this.backupState.set({ backup_backing_image: name }, BACKUP_STATE_VALUES[b.status?.state ?? ''] ?? BACKUP_STATE_VALUES['Unknown']!);
      this.backupProgress.set({ backup_backing_image: name, backing_image: b.spec?.backingImage ?? '' }, b.status?.progress ?? 0);
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
