import type { Datastore, SharedInformers } from '@bis/datastore';
import { isNotFound } from '@bis/datastore';
import { SettingKind } from './kinds.js';

/** The settings the backing-image controllers read, with Longhorn's defaults (control plane §1.8). */
export const SettingName = {
  DefaultBackingImageManagerImage: 'default-backing-image-manager-image',
  BackingImageCleanupWaitInterval: 'backing-image-cleanup-wait-interval',
  BackingImageRecoveryWaitInterval: 'backing-image-recovery-wait-interval',
  DefaultMinNumberOfBackingImageCopies: 'default-min-number-of-backing-image-copies',
  ConcurrentBackingImageReplenishPerNodeLimit: 'concurrent-backing-image-replenish-per-node-limit',
  BackupConcurrentLimit: 'backup-concurrent-limit',
  BackupCompressionMethod: 'backup-compression-method',
  AllowEmptyNodeSelectorVolume: 'allow-empty-node-selector-volume',
  AllowEmptyDiskSelectorVolume: 'allow-empty-disk-selector-volume',
  BackingImageMaxSize: 'backing-image-max-size',
  BackingImageScrubInterval: 'backing-image-scrub-interval',
  BackingImageScrubBandwidth: 'backing-image-scrub-bandwidth',
} as const;
export type SettingName = (typeof SettingName)[keyof typeof SettingName];

export const SETTING_DEFAULTS: Readonly<Record<SettingName, string>> = {
  'default-backing-image-manager-image': 'longhornio/backing-image-manager:bis',
  'backing-image-cleanup-wait-interval': '60',
  'backing-image-recovery-wait-interval': '300',
  'default-min-number-of-backing-image-copies': '3',
  'concurrent-backing-image-replenish-per-node-limit': '5',
  'backup-concurrent-limit': '2',
  'backup-compression-method': 'lz4',
  'allow-empty-node-selector-volume': 'true',
  'allow-empty-disk-selector-volume': 'true',
  'backing-image-max-size': String(2 * 1024 ** 4),
  'backing-image-scrub-interval': String(7 * 24 * 3600),
  'backing-image-scrub-bandwidth': String(50 * 1024 * 1024),
};

/**
 * Reads settings (`Setting` objects named after the setting), falling back to the defaults. With `informers`, from
 * their cache of settings once it has synced (as Longhorn's controllers read settings through listers): the
 * controllers read settings many times per reconcile, and each store read was a copy of the object (in Kubernetes
 * mode, a request to the API server). Before the cache has synced, and without it, from the store.
 */
export class SettingsReader {
  constructor(
    private readonly store: Datastore,
    private readonly namespace: string,
    private readonly overrides: Partial<Record<SettingName, string>> = {},
    private readonly informers?: Pick<SharedInformers, 'hasSynced' | 'cachedGet'>,
  ) {}

  async get(name: SettingName): Promise<string> {
    const value = this.informers?.hasSynced(SettingKind) ? this.informers.cachedGet(SettingKind, name)?.value : await this.stored(name);
    if (typeof value === 'string' && value !== '') return value;
    return this.overrides[name] ?? SETTING_DEFAULTS[name];
  }

  private async stored(name: SettingName): Promise<string | undefined> {
    try {
      return (await this.store.get(SettingKind, name, this.namespace)).value;
    } catch (err) {
      if (!isNotFound(err)) throw err;
      return undefined;
    }
  }

  async int(name: SettingName): Promise<number> {
    const v = await this.get(name);
    const n = Number.parseInt(v, 10);
    if (!Number.isFinite(n)) throw new Error(`setting ${name} has a non-integer value ${JSON.stringify(v)}`);
    return n;
  }

  async bool(name: SettingName): Promise<boolean> {
    return (await this.get(name)).trim().toLowerCase() === 'true';
  }
}
