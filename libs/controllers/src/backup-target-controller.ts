import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { isAlreadyExists, type Datastore } from '@bis/datastore';
import { Controller, type ControllerContext } from './base-controller.js';
import { errMessage, getOrUndefined } from './common.js';
import { syncBackupTargetBackingImages } from './backup-controller.js';
import { BackupTargetKind } from './kinds.js';
import { backupTargetCredential, redactSecrets } from './secrets.js';
import { rfc3339 } from './names.js';

/** Parses a Go duration such as `5m0s`, `300s`, `1h`. Returns milliseconds, or undefined when malformed. */
export function parseGoDuration(s: string): number | undefined {
  const re = /(\d+(?:\.\d+)?)(h|ms|m|s)/g;
  let total = 0;
  let consumed = 0;
  for (const m of s.matchAll(re)) {
    const n = Number(m[1]);
    total += n * ({ h: 3600_000, m: 60_000, s: 1000, ms: 1 } as const)[m[2] as 'h' | 'm' | 's' | 'ms'];
    consumed += m[0].length;
  }
  return consumed === s.length && consumed > 0 ? total : undefined;
}

/** The default backup target's spec as a deployment configures it (Longhorn's `longhorn-default-resource`). */
export interface DefaultBackupTargetSpec {
  backupTargetURL: string;
  credentialSecret: string;
  /** A Go duration, e.g. `5m0s`. */
  pollInterval: string;
}

/**
 * Creates the backup target `default` with the deployment's spec when it does not exist yet (Longhorn's manager does
 * this from `longhorn-default-resource`). An existing target is kept as the user last set it (URL, credential secret,
 * poll interval): a restart, or another node starting at the same moment, changes nothing. Returns whether it created it.
 */
export async function ensureDefaultBackupTarget(store: Datastore, namespace: string, spec: DefaultBackupTargetSpec): Promise<boolean> {
  if (await getOrUndefined(store.get(BackupTargetKind, 'default', namespace))) return false;
  try {
    await store.create(BackupTargetKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackupTarget',
      metadata: { name: 'default', namespace },
      spec: { ...spec },
    });
    return true;
  } catch (err) {
    if (isAlreadyExists(err)) return false;
    throw err;
  }
}

/** Polls each backup target: availability (`status.available`) and the BBIs of the backups it holds. */
export class BackupTargetController extends Controller {
  readonly name = 'backup-target';

  constructor(ctx: ControllerContext) {
    super(ctx);
    ctx.informers.on(BackupTargetKind, (t, o) => {
      if (t !== 'RESYNC') this.enqueue(o.metadata.name);
    });
  }

  async reconcile(name: string): Promise<void> {
    const { store, namespace } = this.ctx;
    const t = await getOrUndefined(store.get(BackupTargetKind, name, namespace));
    if (!t || t.metadata.deletionTimestamp) return;
    const interval = parseGoDuration(t.spec?.pollInterval ?? '') ?? 300_000;
    let available = false;
    let message = '';
    if (t.spec?.backupTargetURL) {
      try {
        await syncBackupTargetBackingImages(this.ctx, t);
        available = true;
      } catch (err) {
        const credential = await backupTargetCredential(this.ctx.secrets, t).catch(() => ({}));
        message = redactSecrets(errMessage(err), credential);
        this.ctx.log.warn(`backup target ${name} is not available: ${message}`);
      }
    }
    const latest = await store.get(BackupTargetKind, name, namespace);
    const now = rfc3339(this.ctx.now());
    const conditions = available ? [] : [{ type: 'Unavailable', status: 'True', reason: 'Unavailable', message, lastProbeTime: '', lastTransitionTime: now }];
    await store.updateStatus(BackupTargetKind, { ...latest, status: { ...latest.status, ownerID: this.ctx.nodeID, available, conditions, lastSyncedAt: now } });
    if (interval > 0) this.queue.addAfter(name, interval);
  }
}
