import {
  BackingImageDataSourceType,
  CloneEncryption,
  DataEngineType,
  DataSourceParameter,
  ExportType,
} from './enums.js';
import type { BackingImage } from './kinds/backing-image.js';
import type { BackingImageDataSource } from './kinds/backing-image-data-source.js';
import type { BackingImageManager } from './kinds/backing-image-manager.js';
import type { BackupBackingImage } from './kinds/backup-backing-image.js';
import type { ObjectMeta } from './meta.js';
import { normalizeChecksum } from './checksum.js';
import {
  autoCorrectName,
  backingImageLabels,
  backupBackingImageLabels,
  DEFAULT_BACKUP_TARGET_NAME,
  LONGHORN_FINALIZER,
} from './names.js';
import { SETTINGS } from './settings.js';

/*
 * Mutator-style defaulting (control plane §4). Every function returns a new object and leaves its input untouched.
 * The composite functions apply the same steps, in the same order, as Longhorn's mutating webhook.
 */

type WithMeta = { metadata: ObjectMeta };

/** Adds the `longhorn.io` finalizer unless the object is being deleted (or already has it). */
export function withFinalizer<T extends WithMeta>(obj: T): T {
  const finalizers = obj.metadata.finalizers ?? [];
  if (obj.metadata.deletionTimestamp || finalizers.includes(LONGHORN_FINALIZER)) return obj;
  return { ...obj, metadata: { ...obj.metadata, finalizers: [...finalizers, LONGHORN_FINALIZER] } };
}

/** Adds `labels` to the object's labels; existing values of other keys are kept, the given keys are overwritten. */
export function withLabels<T extends WithMeta>(obj: T, labels: Readonly<Record<string, string>>): T {
  return { ...obj, metadata: { ...obj.metadata, labels: { ...(obj.metadata.labels ?? {}), ...labels } } };
}

function spec(bi: BackingImage): NonNullable<BackingImage['spec']> {
  return bi.spec ?? {};
}
function withSpec(bi: BackingImage, patch: NonNullable<BackingImage['spec']>): BackingImage {
  return { ...bi, spec: { ...spec(bi), ...patch } };
}

/** Lower-cases the name and shortens it to 40 characters with a hash suffix when longer. */
export function defaultBackingImageName(bi: BackingImage): BackingImage {
  const name = bi.metadata.name;
  if (name === undefined) return bi;
  const corrected = autoCorrectName(name);
  return corrected === name ? bi : { ...bi, metadata: { ...bi.metadata, name: corrected } };
}

/** Trims (and lower-cases) `spec.checksum`. */
export function defaultBackingImageChecksum(bi: BackingImage): BackingImage {
  const checksum = spec(bi).checksum;
  return checksum === undefined ? bi : withSpec(bi, { checksum: normalizeChecksum(checksum) });
}

/** Trims every `spec.sourceParameters` value. */
export function trimSourceParameters(bi: BackingImage): BackingImage {
  const params = spec(bi).sourceParameters;
  if (!params) return bi;
  return withSpec(bi, { sourceParameters: Object.fromEntries(Object.entries(params).map(([k, v]) => [k, v.trim()])) });
}

/** export-from-volume: `export-type` defaults to `raw`. */
export function defaultExportType(bi: BackingImage): BackingImage {
  const sp = spec(bi);
  if (sp.sourceType !== BackingImageDataSourceType.ExportFromVolume) return bi;
  if (sp.sourceParameters?.[DataSourceParameter.ExportType]) return bi;
  return withSpec(bi, { sourceParameters: { ...(sp.sourceParameters ?? {}), [DataSourceParameter.ExportType]: ExportType.Raw } });
}

/** clone: `encryption` defaults to `ignore`. */
export function defaultCloneEncryption(bi: BackingImage): BackingImage {
  const sp = spec(bi);
  if (sp.sourceType !== BackingImageDataSourceType.Clone) return bi;
  if (sp.sourceParameters?.[DataSourceParameter.Encryption]) return bi;
  return withSpec(bi, {
    sourceParameters: { ...(sp.sourceParameters ?? {}), [DataSourceParameter.Encryption]: CloneEncryption.Ignore },
  });
}

/**
 * clone: with `encryption=ignore` the clone inherits the source's secret, secretNamespace and current checksum (an
 * error if the source has no checksum yet); with encrypt or decrypt the checksum is cleared (the bytes change).
 */
export function defaultCloneFromSource(bi: BackingImage, source: BackingImage): BackingImage {
  const sp = spec(bi);
  if (sp.sourceType !== BackingImageDataSourceType.Clone) return bi;
  const encryption = sp.sourceParameters?.[DataSourceParameter.Encryption] ?? CloneEncryption.Ignore;
  if (encryption === CloneEncryption.Ignore) {
    const checksum = source.status?.checksum ?? '';
    if (checksum === '') {
      throw new Error(`source backing image ${source.metadata.name ?? ''} has no checksum yet; it cannot be cloned before it is ready`);
    }
    return withSpec(bi, {
      secret: source.spec?.secret ?? '',
      secretNamespace: source.spec?.secretNamespace ?? '',
      checksum,
    });
  }
  return withSpec(bi, { checksum: '' });
}

/** restore: `concurrent-limit` (from setting `backup-concurrent-limit`) and `backup-target-name` when missing. */
export function defaultRestoreParameters(
  bi: BackingImage,
  values: { readonly backupConcurrentLimit: number; readonly backupTargetName: string },
): BackingImage {
  const sp = spec(bi);
  if (sp.sourceType !== BackingImageDataSourceType.Restore) return bi;
  const params = { ...(sp.sourceParameters ?? {}) };
  if (!params[DataSourceParameter.ConcurrentLimit]) params[DataSourceParameter.ConcurrentLimit] = String(values.backupConcurrentLimit);
  if (!params[DataSourceParameter.BackupTargetName]) params[DataSourceParameter.BackupTargetName] = values.backupTargetName;
  return withSpec(bi, { sourceParameters: params });
}

/** `spec.disks` and `spec.diskFileSpecMap` become `{}` when missing or null. */
export function defaultDiskMaps(bi: BackingImage): BackingImage {
  const sp = spec(bi);
  if (sp.disks && sp.diskFileSpecMap) return bi;
  return withSpec(bi, { disks: sp.disks ?? {}, diskFileSpecMap: sp.diskFileSpecMap ?? {} });
}

/** The managed-by and component labels. */
export function defaultBackingImageLabels(bi: BackingImage): BackingImage {
  return withLabels(bi, backingImageLabels());
}

/** `spec.minNumberOfCopies` 0 (or missing) → setting `default-min-number-of-backing-image-copies`. */
export function defaultMinNumberOfCopies(
  bi: BackingImage,
  settingValue: number = SETTINGS['default-min-number-of-backing-image-copies'].default,
): BackingImage {
  const n = spec(bi).minNumberOfCopies;
  return n === undefined || n === 0 ? withSpec(bi, { minNumberOfCopies: settingValue }) : bi;
}

/** `spec.dataEngine` "" (or missing) → `v1`. */
export function defaultDataEngine(bi: BackingImage): BackingImage {
  const engine = spec(bi).dataEngine as string | undefined;
  return engine === undefined || engine === '' ? withSpec(bi, { dataEngine: DataEngineType.V1 }) : bi;
}

export interface BackingImageCreateDefaultsContext {
  /** Setting `default-min-number-of-backing-image-copies`. */
  readonly defaultMinNumberOfCopies: number;
  /** Setting `backup-concurrent-limit` (restore only). */
  readonly backupConcurrentLimit: number;
  /** The source backing image (clone only); required when the type is clone. */
  readonly cloneSource?: BackingImage;
  /** The backup target that holds the backup (restore only), e.g. from {@link backupTargetNameForBackupUrl}. */
  readonly restoreBackupTargetName?: string;
}

/** Every create-time default of the BackingImage mutator, in Longhorn's order. Throws when a lookup is missing. */
export function applyBackingImageCreateDefaults(bi: BackingImage, ctx: BackingImageCreateDefaultsContext): BackingImage {
  let out = withFinalizer(bi);
  out = defaultBackingImageName(out);
  out = defaultBackingImageChecksum(out);
  out = trimSourceParameters(out);
  out = defaultExportType(out);
  const sourceType = spec(out).sourceType;
  if (sourceType === BackingImageDataSourceType.Restore) {
    const existing = spec(out).sourceParameters?.[DataSourceParameter.BackupTargetName];
    const target = existing || ctx.restoreBackupTargetName;
    if (!target) {
      throw new Error(`cannot find the backup target of backup ${spec(out).sourceParameters?.[DataSourceParameter.BackupUrl] ?? ''}`);
    }
    out = defaultRestoreParameters(out, { backupConcurrentLimit: ctx.backupConcurrentLimit, backupTargetName: target });
  }
  if (sourceType === BackingImageDataSourceType.Clone) {
    out = defaultCloneEncryption(out);
    if (!ctx.cloneSource) {
      throw new Error(`source backing image ${spec(out).sourceParameters?.[DataSourceParameter.BackingImage] ?? ''} not found`);
    }
    out = defaultCloneFromSource(out, ctx.cloneSource);
  }
  out = defaultDiskMaps(out);
  out = defaultBackingImageLabels(out);
  out = defaultMinNumberOfCopies(out, ctx.defaultMinNumberOfCopies);
  out = defaultDataEngine(out);
  return out;
}

/** Update-time defaults of the BackingImage mutator: finalizer, `sourceType` "" → download, nil maps → {}. */
export function applyBackingImageUpdateDefaults(bi: BackingImage): BackingImage {
  let out = withFinalizer(bi);
  const sp = spec(out);
  out = withSpec(out, {
    sourceType: (sp.sourceType as string | undefined) ? sp.sourceType : BackingImageDataSourceType.Download,
    disks: sp.disks ?? {},
    diskFileSpecMap: sp.diskFileSpecMap ?? {},
    sourceParameters: sp.sourceParameters ?? {},
  });
  return out;
}

/** BIDS mutator (create and update): finalizer, `sourceType` "" → download, `parameters` nil → {}. */
export function applyBackingImageDataSourceDefaults(bids: BackingImageDataSource): BackingImageDataSource {
  const out = withFinalizer(bids);
  const sp = out.spec ?? {};
  return {
    ...out,
    spec: {
      ...sp,
      sourceType: (sp.sourceType as string | undefined) ? sp.sourceType : BackingImageDataSourceType.Download,
      parameters: sp.parameters ?? {},
    },
  };
}

/** BIM mutator (create and update): finalizer, `backingImages` nil → {}. */
export function applyBackingImageManagerDefaults(bim: BackingImageManager): BackingImageManager {
  const out = withFinalizer(bim);
  return { ...out, spec: { ...(out.spec ?? {}), backingImages: out.spec?.backingImages ?? {} } };
}

/**
 * BBI create mutator: finalizer; `backupTargetName` defaults to `default`; a named target that does not exist is
 * replaced by the default target (an error if that is missing too); labels `backup-target` and `backing-image`.
 */
export function applyBackupBackingImageCreateDefaults(
  bbi: BackupBackingImage,
  backupTargetExists: (name: string) => boolean,
): BackupBackingImage {
  let out = withFinalizer(bbi);
  let target = out.spec?.backupTargetName || DEFAULT_BACKUP_TARGET_NAME;
  if (target !== DEFAULT_BACKUP_TARGET_NAME && !backupTargetExists(target)) target = DEFAULT_BACKUP_TARGET_NAME;
  if (!backupTargetExists(target)) throw new Error(`backup target ${target} not found`);
  out = { ...out, spec: { ...out.spec, backingImage: out.spec?.backingImage ?? '', userCreated: out.spec?.userCreated ?? false, backupTargetName: target } };
  return withLabels(out, backupBackingImageLabels(target, out.spec?.backingImage ?? ''));
}

/** BBI update mutator: finalizer only. */
export function applyBackupBackingImageUpdateDefaults(bbi: BackupBackingImage): BackupBackingImage {
  return withFinalizer(bbi);
}

const BACKUP_URL_SCHEMES = new Set(['s3:', 'nfs:', 'cifs:', 'azblob:']);

/**
 * Finds the backup target of a restore's `backup-url`: the BBI whose `status.url` has the same URL without its query
 * and the same `backingImage` query parameter (schemes s3, nfs, cifs, azblob). Returns its `spec.backupTargetName`.
 */
export function backupTargetNameForBackupUrl(
  backupUrl: string,
  backupBackingImages: readonly BackupBackingImage[],
): string | undefined {
  const key = backupUrlKey(backupUrl);
  if (!key) return undefined;
  for (const bbi of backupBackingImages) {
    const other = backupUrlKey(bbi.status?.url ?? '');
    if (other && other.base === key.base && other.backingImage === key.backingImage) {
      return bbi.spec?.backupTargetName || DEFAULT_BACKUP_TARGET_NAME;
    }
  }
  return undefined;
}

function backupUrlKey(raw: string): { base: string; backingImage: string } | undefined {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return undefined;
  }
  if (!BACKUP_URL_SCHEMES.has(url.protocol)) return undefined;
  const q = raw.indexOf('?');
  return { base: q < 0 ? raw : raw.slice(0, q), backingImage: url.searchParams.get('backingImage') ?? '' };
}
