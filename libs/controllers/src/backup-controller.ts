import { isAlreadyExists, type Stored } from '@bis/datastore';
import { Backoff } from './backoff.js';
import { Controller, isResponsibleFor, type ControllerContext } from './base-controller.js';
import { changed, clone, errMessage, getOrUndefined, listManagers, nodeDownChecker } from './common.js';
import { EventSource } from './events.js';
import { BackingImageKind, BackupBackingImageKind, BackupTargetKind, type BackupBackingImage, type BackupTarget } from './kinds.js';
import { Annotation, backupBackingImageName, FINALIZER, Label, rfc3339 } from './names.js';
import { backupTargetCredential, redactSecrets } from './secrets.js';
import { SettingName } from './settings.js';
import type { BackupBackingImageStatus } from '@bis/crd-types';
import { BACKUP_MACHINE, backupEventForProgress, transition, type BackupEvent } from '@bis/state-machine';

interface BackupMonitor {
  timer: NodeJS.Timeout;
  address: string;
  /** What the last poll found (§3.4 step 5.4: the manager's progress state, or `error` when the poll failed). */
  event: BackupEvent;
  progress: number;
  url: string;
  error: string;
  busy: boolean;
  /** The target's credential: its values are removed from the errors the manager reports. */
  credential: Record<string, string>;
}

/**
 * How long a new backup waits for a manager with a ready copy of its image before it fails. Right after a restart
 * the managers are not running yet (or have not listed their files): the image has a ready copy (the API checked),
 * only its manager is not back. Retries back off (1 s doubling to 15 s, jittered) within the window.
 */
export const BACKUP_MANAGER_WAIT_MS = 120_000;

/** Thrown when no running manager holds a ready copy of the image yet. */
class NoReadyManager extends Error {}

const targetAvailable = (t: BackupTarget | undefined) => !!t && !t.metadata.deletionTimestamp && !!t.spec?.backupTargetURL && !!t.status?.available;

/** Longhorn's BackupBackingImage controller (§3.4) plus the backup-target sync of BBIs. */
export class BackupBackingImageController extends Controller {
  readonly name = 'backup-backing-image';
  /** BBI keys are requeued without limit. */
  private readonly monitors = new Map<string, BackupMonitor>();
  /** Per backup: the waits for a ready manager (the project's one retry policy). */
  private readonly managerWait = new Backoff(1000, 15_000, () => this.ctx.now().getTime());

  constructor(ctx: ControllerContext) {
    super(ctx);
    ctx.informers.on(BackupBackingImageKind, (_t, o) => this.enqueue(o.metadata.name));
  }

  protected override async onStop(): Promise<void> {
    for (const n of [...this.monitors.keys()]) this.stopMonitor(n);
  }

  async reconcile(name: string): Promise<void> {
    const { store, namespace, nodeID } = this.ctx;
    const bbi = await getOrUndefined(store.get(BackupBackingImageKind, name, namespace));
    if (!bbi) {
      this.stopMonitor(name);
      return;
    }
    const isDown = await nodeDownChecker(this.ctx);
    if (!isResponsibleFor(nodeID, '', bbi.status?.ownerID ?? '', isDown)) return;
    if (bbi.status?.ownerID !== nodeID) {
      await store.updateStatus(BackupBackingImageKind, { ...bbi, status: { ...bbi.status, ownerID: nodeID } });
      return;
    }
    const target = await getOrUndefined(store.get(BackupTargetKind, bbi.spec?.backupTargetName || 'default', namespace));
    if (!target) return;
    if (bbi.metadata.deletionTimestamp) return this.handleDeletion(bbi, target);

    const status = clone(bbi.status ?? {});
    try {
      await this.sync(bbi, status, target);
    } finally {
      const latest = await getOrUndefined(store.get(BackupBackingImageKind, name, namespace));
      if (latest && changed(latest.status, status)) await store.updateStatus(BackupBackingImageKind, { ...latest, status });
    }
  }

  private async handleDeletion(bbi: Stored<BackupBackingImage>, target: BackupTarget): Promise<void> {
    const name = bbi.metadata.name;
    const remote = bbi.metadata.labels?.[Label.DeleteCustomResourceOnly] !== 'true' && targetAvailable(target);
    if (remote) {
      const biName = bbi.spec?.backingImage || bbi.status?.backingImage || '';
      const url = this.ctx.dataPlane.backupTarget.backingImageURL(target.spec!.backupTargetURL!, biName);
      await this.ctx.dataPlane.backupTarget.deleteBackingImage(url, await backupTargetCredential(this.ctx.secrets, target));
    }
    this.stopMonitor(name);
    if (bbi.status?.state === 'Error' || bbi.status?.state === 'Unknown') {
      this.ctx.events.record(EventSource.BackupBackingImage, bbi, 'Warning', bbi.status.state, `Deleted backup backing image ${name} in state ${bbi.status.state}: ${bbi.status.error ?? ''}`);
    }
    const finalizers = (bbi.metadata.finalizers ?? []).filter((f) => f !== FINALIZER);
    await this.ctx.store.update(BackupBackingImageKind, { ...bbi, metadata: { ...bbi.metadata, finalizers } });
  }

  private async sync(bbi: Stored<BackupBackingImage>, status: BackupBackingImageStatus, target: BackupTarget): Promise<void> {
    const { store, namespace } = this.ctx;
    const name = bbi.metadata.name;
    const biName = bbi.spec?.backingImage ?? '';
    const state = status.state ?? '';
    if (!status.lastSyncedAt && bbi.spec?.userCreated && !['Completed', 'Error', 'Unknown'].includes(state)) {
      const bi = await getOrUndefined(store.get(BackingImageKind, biName, namespace));
      if (!bi) {
        status.error = `cannot find the corresponding backing image: backing image ${biName} not found`;
        status.state = transition(BACKUP_MACHINE, state, 'error', `backup ${name}`);
        status.lastSyncedAt = rfc3339(this.ctx.now());
        return;
      }
      status.backingImage = biName;
      status.size = bi.status?.size ?? 0;
      status.checksum = bi.status?.checksum ?? '';
      let mon = this.monitors.get(name);
      if (!mon) {
        let credential: Record<string, string> = {};
        try {
          credential = await backupTargetCredential(this.ctx.secrets, target);
          const bim = (await listManagers(this.ctx)).find(
            (m) => !m.metadata.deletionTimestamp && !!bi.spec?.diskFileSpecMap?.[m.spec?.diskUUID ?? ''] && m.status?.backingImageFileMap?.[biName]?.uuid === bi.status?.uuid && m.status?.backingImageFileMap?.[biName]?.state === 'ready' && m.status?.currentState === 'running',
          );
          const address = bim?.metadata.annotations?.[Annotation.Address];
          if (!bim || !address) throw new NoReadyManager(`failed to find a ready backing image manager holding backing image ${biName}`);
          const compression = await this.ctx.settings.get(SettingName.BackupCompressionMethod);
          const concurrentLimit = await this.ctx.settings.int(SettingName.BackupConcurrentLimit);
          if (state === '') {
            await this.ctx.dataPlane.managerClient(address).backupCreate({
              name: biName,
              uuid: bi.status?.uuid ?? '',
              checksum: bi.status?.checksum ?? '',
              backupTarget: target.spec?.backupTargetURL ?? '',
              labels: Object.entries(bbi.spec?.labels ?? {}).map(([k, v]) => `${k}=${v}`),
              credential,
              compressionMethod: compression,
              concurrentLimit,
              parameters: { secret: bi.spec?.secret ?? '', 'secret-namespace': bi.spec?.secretNamespace ?? '' },
            });
          }
          this.managerWait.reset(name);
          status.error = '';
          status.managerAddress = address;
          status.compressionMethod = compression as BackupBackingImageStatus['compressionMethod'];
          mon = this.startMonitor(name, address, biName, credential);
        } catch (err) {
          const since = Date.parse(bbi.metadata.creationTimestamp ?? '') || this.ctx.now().getTime();
          if (err instanceof NoReadyManager && this.ctx.now().getTime() - since < BACKUP_MANAGER_WAIT_MS) {
            // Transient (a manager restarting): the backup stays new, says why, and is tried again with backoff.
            this.managerWait.next(name);
            const delay = this.managerWait.get(name);
            const attempt = this.managerWait.attempts(name);
            status.error = `${err.message}; attempt ${attempt}, next attempt at ${rfc3339(new Date(this.ctx.now().getTime() + delay))} (the backup fails if none is ready ${BACKUP_MANAGER_WAIT_MS / 1000} s after its creation)`;
            if (attempt === 1) this.ctx.log.info(`backup ${name}: ${status.error}`);
            this.queue.addAfter(name, delay);
            return;
          }
          this.managerWait.reset(name);
          status.error = redactSecrets(errMessage(err), credential);
          status.state = transition(BACKUP_MACHINE, state, 'error', `backup ${name}`);
          status.lastSyncedAt = rfc3339(this.ctx.now());
          this.ctx.log.warn(`backup ${name} of backing image ${biName} failed: ${status.error}`);
          this.ctx.events.record(EventSource.BackupBackingImage, { kind: 'BackingImage', metadata: { name: biName, namespace } }, 'Warning', 'Error', `Backup of backing image ${biName} failed: ${status.error}`);
          return;
        }
      }
      status.progress = mon.progress;
      status.url = mon.url;
      status.error = mon.error;
      status.state = transition(BACKUP_MACHINE, state, mon.event, `backup ${name}`);
      if (status.state !== state) {
        const bi2 = { kind: 'BackingImage', metadata: { name: biName, namespace } };
        this.ctx.events.record(EventSource.BackupBackingImage, bi2, mon.error ? 'Warning' : 'Normal', status.state, mon.error || `Backup of backing image ${biName} is ${status.state}`);
      }
      if (['', 'Pending', 'InProgress'].includes(status.state)) return;
      this.stopMonitor(name);
      if (status.state !== 'Completed') {
        status.lastSyncedAt = rfc3339(this.ctx.now());
        return;
      }
    }
    if (status.lastSyncedAt && !(bbi.spec?.syncRequestedAt && Date.parse(bbi.spec.syncRequestedAt) > Date.parse(status.lastSyncedAt))) return;
    try {
      const url = status.url || this.ctx.dataPlane.backupTarget.backingImageURL(target.spec?.backupTargetURL ?? '', biName);
      const info = await this.ctx.dataPlane.backupTarget.inspectBackingImage(url, await backupTargetCredential(this.ctx.secrets, target));
      Object.assign(status, {
        state: transition(BACKUP_MACHINE, status.state ?? '', 'synced', `backup ${name}`),
        backingImage: info.name,
        url: info.url,
        backupCreatedAt: info.createdAt,
        checksum: info.checksum,
        size: info.size,
        labels: info.labels,
        secret: info.secret,
        secretNamespace: info.secretNamespace,
        compressionMethod: info.compressionMethod as BackupBackingImageStatus['compressionMethod'],
        progress: 100,
        lastSyncedAt: rfc3339(this.ctx.now()),
      } satisfies Partial<BackupBackingImageStatus>);
    } catch (err) {
      this.ctx.log.warn(`failed to sync backup backing image ${name} from the backup target: ${errMessage(err)}`);
    }
  }

  private startMonitor(name: string, address: string, biName: string, credential: Record<string, string>): BackupMonitor {
    // poll() catches its own failures (they become the backup's error state).
    const m: BackupMonitor = { address, event: 'progress', progress: 0, url: '', error: '', busy: false, credential, timer: setInterval(() => void poll(), this.ctx.timing.backupPollMs) };
    m.timer.unref();
    const poll = async () => {
      if (m.busy) return;
      m.busy = true;
      try {
        const s = await this.ctx.dataPlane.managerClient(address).backupStatus(biName);
        const event = backupEventForProgress(s.state);
        const changedNow = event !== m.event || s.progress !== m.progress;
        Object.assign(m, { event, progress: s.progress, url: s.backupUrl, error: redactSecrets(s.error, m.credential) });
        if (changedNow) this.enqueue(name);
      } catch (err) {
        if (m.event !== 'error') this.enqueue(name);
        Object.assign(m, { event: 'error', error: redactSecrets(errMessage(err), m.credential) });
      } finally {
        m.busy = false;
      }
    };
    this.monitors.set(name, m);
    // poll() catches its own failures (they become the backup's error state).
    void poll();
    return m;
  }

  private stopMonitor(name: string): void {
    const m = this.monitors.get(name);
    if (m) clearInterval(m.timer);
    this.monitors.delete(name);
  }
}

/**
 * Backup-target sync of BBIs (Longhorn's backup-target controller `syncBackupBackingImage`): creates BBIs for
 * backups found in the target and removes (custom resource only) BBIs whose backup disappeared.
 */
export async function syncBackupTargetBackingImages(ctx: ControllerContext, target: Stored<BackupTarget>): Promise<void> {
  const { store, namespace } = ctx;
  const tname = target.metadata.name;
  const remote = new Set(await ctx.dataPlane.backupTarget.listBackingImages(target.spec?.backupTargetURL ?? '', await backupTargetCredential(ctx.secrets, target)));
  const bbis = (await store.list(BackupBackingImageKind, { namespace, labelSelector: { matchLabels: { [Label.BackupTarget]: tname } } })).items;
  const known = new Set(bbis.map((b) => b.spec?.backingImage ?? ''));
  for (const biName of remote) {
    if (known.has(biName)) continue;
    try {
      await store.create(BackupBackingImageKind, {
        apiVersion: target.apiVersion,
        kind: 'BackupBackingImage',
        metadata: {
          name: backupBackingImageName(biName),
          namespace,
          finalizers: [FINALIZER],
          labels: { [Label.BackupTarget]: tname, [Label.BackupBackingImage]: biName },
          ownerReferences: [{ apiVersion: target.apiVersion, kind: 'BackupTarget', name: tname, uid: target.metadata.uid, controller: true, blockOwnerDeletion: true }],
        },
        spec: { backingImage: biName, backupTargetName: tname, userCreated: false, labels: {} },
        status: {},
      });
    } catch (err) {
      if (!isAlreadyExists(err)) throw err;
    }
  }
  for (const b of bbis) {
    const biName = b.spec?.backingImage ?? '';
    if (remote.has(biName) || b.metadata.deletionTimestamp) continue;
    // A backup still being created is not in the target yet.
    if (b.spec?.userCreated && b.status?.state !== 'Completed') continue;
    await store.update(BackupBackingImageKind, { ...b, metadata: { ...b.metadata, labels: { ...b.metadata.labels, [Label.DeleteCustomResourceOnly]: 'true' } } });
    await store.delete(BackupBackingImageKind, b.metadata.name, namespace);
  }
}
