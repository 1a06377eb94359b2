import { validateChecksumField } from './checksum.js';
import { goParseRequestURI, goQuote } from './go-url.js';
import {
  BackingImageDataSourceType,
  CLONE_ENCRYPTIONS,
  CloneEncryption,
  DataEngineType,
  DataSourceParameter,
  EXPORT_TYPES,
} from './enums.js';
import { BACKING_IMAGE, type BackingImage } from './kinds/backing-image.js';
import { BACKUP_BACKING_IMAGE, type BackupBackingImage } from './kinds/backup-backing-image.js';
import type { BackupTarget } from './kinds/backup-target.js';
import { DEFAULT_BACKUP_TARGET_NAME, LabelKey } from './names.js';
import { issue, type ValidationIssue } from './schema/errors.js';
import { validateObject } from './validate-object.js';

/*
 * Webhook-equivalent admission checks (control plane §4) for BackingImage and BackupBackingImage. They run on the
 * object AFTER the mutator defaults were applied, like Longhorn's validating webhook, and return every issue.
 * Lookups (secrets, the clone source, other BBIs, the backup target) are passed in already resolved.
 */

/** `^[a-z0-9][a-z0-9_.-]+$`: Longhorn's backing image name rule. */
export const BACKING_IMAGE_NAME_PATTERN = /^[a-z0-9][a-z0-9_.-]+$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/**
 * SSRF policy for `download` URLs. Longhorn always rejects loopback hosts. The data source and the API enforce the
 * same policy at connect time (after DNS resolution); this validator checks the URL as written.
 */
export interface DownloadUrlPolicy {
  /** Reject URLs whose host is a loopback name or address. Default true. */
  readonly rejectLoopback?: boolean;
  /** Hosts (`host` or `host:port`, lower-case) accepted even if loopback, e.g. a local image mirror in tests. */
  readonly allowedHosts?: readonly string[];
  /**
   * Why a URL's host may not be downloaded from (the data sources' `--allow-source-hosts` rule, applied at
   * admission to hosts written as addresses: private, link-local, metadata, … ranges not listed), or `undefined`.
   */
  readonly refuseHost?: (hostname: string) => string | undefined;
}

export interface BackingImageAdmissionContext {
  readonly downloadUrlPolicy?: DownloadUrlPolicy;
  /** Whether a Secret exists; when given, `spec.secret`/`secretNamespace` and clone secrets are checked with it. */
  readonly secretExists?: (namespace: string, name: string) => boolean;
  /**
   * Resolves the source of a clone (`backing-image` parameter). When given, the source must exist, must not be v2,
   * and the encryption direction must make sense for it.
   */
  readonly getBackingImage?: (name: string) => BackingImage | undefined;
  /**
   * Resolves the volume of an `export-from-volume` source (`volume-name` parameter). When given, the volume must
   * exist, must not be v2 and must not be faulted, as Longhorn's validator requires. A system without volumes passes
   * `() => undefined`, so such a creation is refused instead of waiting forever for a volume that cannot appear.
   */
  readonly getVolume?: (name: string) => VolumeForExport | undefined;
}

/** What the export-from-volume rule needs to know about a volume. */
export interface VolumeForExport {
  readonly dataEngine: string;
  readonly faulted: boolean;
}

const LOOPBACK_NAMES = new Set(['localhost', 'localhost.localdomain', 'ip6-localhost', 'ip6-loopback']);

/** True for the empty host, `localhost` (and subdomains), 127.0.0.0/8, 0.0.0.0, `::1`, `::` and IPv4-mapped loopback. */
export function isLoopbackHost(hostname: string): boolean {
  let h = hostname.toLowerCase();
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1);
  if (h.endsWith('.')) h = h.slice(0, -1);
  if (h === '' || LOOPBACK_NAMES.has(h) || h.endsWith('.localhost')) return true;
  if (/^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h) || h === '0.0.0.0') return true;
  if (h === '::1' || h === '::' || h === '0:0:0:0:0:0:0:1' || h === '0:0:0:0:0:0:0:0') return true;
  const mapped = /^::ffff:(.+)$/.exec(h);
  if (mapped?.[1]) {
    const v4 = mapped[1];
    if (/^127\./.test(v4) || v4 === '0.0.0.0') return true;
    // WHATWG URL writes IPv4-mapped addresses in hex: ::ffff:7f00:1
    const hex = /^([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(v4);
    if (hex?.[1] && (parseInt(hex[1], 16) >> 8 === 127 || (parseInt(hex[1], 16) === 0 && parseInt(hex[2] ?? '0', 16) === 0))) return true;
  }
  return false;
}

/**
 * Checks a `download` URL with Longhorn's messages: non-empty (`download URL is not provided`), parseable by Go's
 * `url.ParseRequestURI` (`invalid download URL: parse "x": invalid URI for request`), http or https
 * (`invalid download URL scheme "ftp"`), not loopback nor without a host (`download URL must not target a loopback
 * address`), then, per policy, not an address outside the allowed source hosts. This project's details follow
 * Longhorn's text in parentheses.
 */
export function validateDownloadUrl(path: string, raw: string | undefined, policy: DownloadUrlPolicy = {}): ValidationIssue[] {
  if (raw === undefined || raw === '') return [issue(path, 'required', 'download URL is not provided')];
  const parsed = goParseRequestURI(raw);
  if (!parsed.ok) return [issue(path, 'url', `invalid download URL: ${parsed.error}`)];
  const { scheme, host, hostname } = parsed.url;
  if (scheme !== 'http' && scheme !== 'https') {
    return [issue(path, 'url', `invalid download URL scheme ${goQuote(scheme)} (must use scheme http or https)`)];
  }
  if (hostname === '') return [issue(path, 'url', 'download URL must not target a loopback address (the URL has no host)')];
  const allowed = new Set((policy.allowedHosts ?? []).map((h) => h.toLowerCase()));
  if (allowed.has(hostname.toLowerCase()) || allowed.has(host.toLowerCase())) return [];
  // The host as Go reads it, and as the data source's HTTP client (WHATWG) will: `http://2130706433/` is 127.0.0.1
  // there (Longhorn's resolver finds the same), so both are checked.
  const hosts = [hostname];
  try {
    const whatwg = new URL(raw).hostname;
    if (whatwg !== '' && whatwg.toLowerCase() !== hostname.toLowerCase()) hosts.push(whatwg);
  } catch {
    // Go accepted what WHATWG does not: Go's reading stands.
  }
  for (const h of hosts) {
    if ((policy.rejectLoopback ?? true) && isLoopbackHost(h)) {
      return [issue(path, 'url', `download URL must not target a loopback address (got ${JSON.stringify(h)})`)];
    }
    const refusal = policy.refuseHost?.(h);
    if (refusal) return [issue(path, 'url', `download URL is not an allowed source host: ${refusal}`)];
  }
  return [];
}

function validateName(name: string | undefined): ValidationIssue[] {
  if (name === undefined || name === '') return [issue('metadata.name', 'required', 'is required')];
  const out: ValidationIssue[] = [];
  if (!BACKING_IMAGE_NAME_PATTERN.test(name)) {
    out.push(issue('metadata.name', 'name', `invalid name ${name}: must match ${BACKING_IMAGE_NAME_PATTERN.source}`));
  } else if (name.length > 253 || !DNS1123_SUBDOMAIN.test(name)) {
    out.push(issue('metadata.name', 'name', `invalid name ${name}: must be a valid Kubernetes object name (lower-case letters, digits, '-' and '.')`));
  }
  return out;
}

function validateMinNumberOfCopies(bi: BackingImage): ValidationIssue[] {
  const n = bi.spec?.minNumberOfCopies ?? 0;
  return n < 1
    ? [issue('spec.minNumberOfCopies', 'minimum', `minimum number of backing image copies ${n} must larger than 0`)]
    : [];
}

function validateSecretReference(bi: BackingImage, ctx: BackingImageAdmissionContext): ValidationIssue[] {
  const secret = bi.spec?.secret ?? '';
  const ns = bi.spec?.secretNamespace ?? '';
  if (secret === '' && ns === '') return [];
  if (secret === '' || ns === '') {
    return [issue(secret === '' ? 'spec.secret' : 'spec.secretNamespace', 'required', 'secret and secretNamespace must be set together')];
  }
  if (ctx.secretExists && !ctx.secretExists(ns, secret)) {
    return [issue('spec.secret', 'reference', `secret ${ns}/${secret} not found`)];
  }
  return [];
}

function validateSourceParameters(bi: BackingImage, ctx: BackingImageAdmissionContext): ValidationIssue[] {
  const params = bi.spec?.sourceParameters ?? {};
  const p = (key: string) => `spec.sourceParameters[${key}]`;
  const out: ValidationIssue[] = [];
  switch (bi.spec?.sourceType) {
    case BackingImageDataSourceType.Download:
      out.push(...validateDownloadUrl(p(DataSourceParameter.Url), params[DataSourceParameter.Url], ctx.downloadUrlPolicy));
      break;
    case BackingImageDataSourceType.ExportFromVolume: {
      const volumeName = params[DataSourceParameter.VolumeName];
      if (!volumeName) {
        out.push(issue(p(DataSourceParameter.VolumeName), 'required', 'is required for source type export-from-volume'));
      } else if (ctx.getVolume) {
        const volume = ctx.getVolume(volumeName);
        if (!volume) {
          out.push(issue(p(DataSourceParameter.VolumeName), 'reference', `volume ${volumeName} not found: there is no volume to export from`));
        } else if (volume.dataEngine === DataEngineType.V2) {
          out.push(issue(p(DataSourceParameter.VolumeName), 'unsupported', `volume ${volumeName} is a v2 volume: exporting a backing image from it is not supported`));
        } else if (volume.faulted) {
          out.push(issue(p(DataSourceParameter.VolumeName), 'unsupported', `volume ${volumeName} is faulted: cannot export a backing image from it`));
        }
      }
      const exportType = params[DataSourceParameter.ExportType] ?? '';
      if (!(EXPORT_TYPES as readonly string[]).includes(exportType)) {
        out.push(issue(p(DataSourceParameter.ExportType), 'enum', `must be one of ${EXPORT_TYPES.join(', ')} (got ${JSON.stringify(exportType)})`));
      }
      break;
    }
    case BackingImageDataSourceType.Restore:
      if (!params[DataSourceParameter.BackupUrl]) out.push(issue(p(DataSourceParameter.BackupUrl), 'required', 'is required for source type restore'));
      break;
    case BackingImageDataSourceType.Clone: {
      const sourceName = params[DataSourceParameter.BackingImage] ?? '';
      const encryption = params[DataSourceParameter.Encryption] ?? CloneEncryption.Ignore;
      if (sourceName === '') out.push(issue(p(DataSourceParameter.BackingImage), 'required', 'is required for source type clone'));
      if (!(CLONE_ENCRYPTIONS as readonly string[]).includes(encryption)) {
        out.push(issue(p(DataSourceParameter.Encryption), 'enum', `must be one of ${CLONE_ENCRYPTIONS.join(', ')} (got ${JSON.stringify(encryption)})`));
      }
      if (encryption === CloneEncryption.Encrypt || encryption === CloneEncryption.Decrypt) {
        const secret = params[DataSourceParameter.Secret] ?? '';
        const ns = params[DataSourceParameter.SecretNamespace] ?? '';
        if (secret === '' || ns === '') {
          const missing = [secret === '' ? DataSourceParameter.Secret : '', ns === '' ? DataSourceParameter.SecretNamespace : ''].filter(Boolean).join(' and ');
          out.push(issue(p(secret === '' ? DataSourceParameter.Secret : DataSourceParameter.SecretNamespace), 'required', `secret is not provided for encryption or decryption during cloneing (${missing} required to ${encryption} a clone)`));
        }
        if (secret !== '' && ns !== '' && ctx.secretExists && !ctx.secretExists(ns, secret)) {
          out.push(issue(p(DataSourceParameter.Secret), 'reference', `secret ${ns}/${secret} not found`));
        }
      }
      if (sourceName !== '' && ctx.getBackingImage) {
        const source = ctx.getBackingImage(sourceName);
        if (!source) {
          out.push(issue(p(DataSourceParameter.BackingImage), 'reference', `source backing image ${sourceName} not found`));
        } else {
          if (source.spec?.dataEngine === DataEngineType.V2) {
            out.push(issue(p(DataSourceParameter.BackingImage), 'unsupported', `source backing image ${sourceName} is v2; cloning a v2 backing image is not supported`));
          }
          const sourceEncrypted = (source.spec?.secret ?? '') !== '';
          if (encryption === CloneEncryption.Encrypt && sourceEncrypted) {
            out.push(issue(p(DataSourceParameter.Encryption), 'unsupported', `source backing image ${sourceName} is already encrypted`));
          }
          if (encryption === CloneEncryption.Decrypt && !sourceEncrypted) {
            out.push(issue(p(DataSourceParameter.Encryption), 'unsupported', `source backing image ${sourceName} is not encrypted`));
          }
        }
      }
      break;
    }
    default:
      break;
  }
  return out;
}

/** The checks of Longhorn's BackingImage validator on Create, plus the schema check of the CRD. */
export function validateBackingImageCreate(bi: BackingImage, ctx: BackingImageAdmissionContext = {}): ValidationIssue[] {
  const out = validateObject(BACKING_IMAGE, bi);
  if (out.some((i) => i.path === '(root)')) return out;
  const name = bi.metadata?.name;
  out.push(...validateName(name));
  if (bi.spec?.sourceType === undefined) out.push(issue('spec.sourceType', 'required', 'is required'));
  if (bi.spec?.dataEngine === DataEngineType.V2) {
    out.push(issue('spec.dataEngine', 'unsupported', 'v2 backing image is not supported'));
  }
  out.push(...validateChecksumField('spec.checksum', bi.spec?.checksum ?? ''));
  out.push(...validateMinNumberOfCopies(bi));
  out.push(...validateSecretReference(bi, ctx));
  out.push(...validateSourceParameters(bi, ctx));
  return out;
}

function sameStringMap(a: Readonly<Record<string, string>> | undefined, b: Readonly<Record<string, string>> | undefined): boolean {
  const ea = Object.entries(a ?? {});
  const mb = b ?? {};
  return ea.length === Object.keys(mb).length && ea.every(([k, v]) => Object.hasOwn(mb, k) && mb[k] === v);
}

/**
 * The checks of Longhorn's BackingImage validator on Update:
 * - `spec.minNumberOfCopies >= 1`;
 * - a non-empty `spec.secret`/`spec.secretNamespace` cannot change;
 * - `spec.dataEngine` cannot change (`""` → `v1` is allowed: both mean v1);
 * - a download URL is re-checked.
 * This project additionally keeps `spec.sourceType`, `spec.sourceParameters` and `spec.checksum` immutable (Longhorn
 * accepts such edits but never acts on them, so the object would describe a source it was not made from);
 * `sourceType` `""` → `download` and a missing → empty `sourceParameters` are accepted, as the update mutator does.
 */
export function validateBackingImageUpdate(
  oldBi: BackingImage,
  newBi: BackingImage,
  ctx: BackingImageAdmissionContext = {},
): ValidationIssue[] {
  const out = validateObject(BACKING_IMAGE, newBi);
  if (out.some((i) => i.path === '(root)')) return out;
  const name = newBi.metadata?.name ?? oldBi.metadata?.name ?? '';
  const o = oldBi.spec ?? {};
  const n = newBi.spec ?? {};
  out.push(...validateMinNumberOfCopies(newBi));
  if (((o.secret ?? '') !== '' && o.secret !== n.secret) || ((o.secretNamespace ?? '') !== '' && o.secretNamespace !== n.secretNamespace)) {
    out.push(issue((o.secret ?? '') !== '' && o.secret !== n.secret ? 'spec.secret' : 'spec.secretNamespace', 'immutable', `changing secret for BackingImage ${name} is not supported`));
  }
  const engine = (e: string | undefined) => (e === undefined || e === '' ? DataEngineType.V1 : e);
  if (engine(o.dataEngine) !== engine(n.dataEngine)) {
    out.push(issue('spec.dataEngine', 'immutable', `changing data engine for BackingImage ${name} is not supported`));
  }
  const sourceType = (t: string | undefined) => (t === undefined || t === '' ? BackingImageDataSourceType.Download : t);
  if (sourceType(o.sourceType) !== sourceType(n.sourceType)) {
    out.push(issue('spec.sourceType', 'immutable', `changing source type for BackingImage ${name} is not supported`));
  }
  if (!sameStringMap(o.sourceParameters, n.sourceParameters)) {
    out.push(issue('spec.sourceParameters', 'immutable', `changing source parameters for BackingImage ${name} is not supported`));
  }
  if ((o.checksum ?? '') !== (n.checksum ?? '')) {
    out.push(issue('spec.checksum', 'immutable', `changing checksum for BackingImage ${name} is not supported`));
  }
  if (sourceType(n.sourceType) === BackingImageDataSourceType.Download) {
    const url = n.sourceParameters?.[DataSourceParameter.Url];
    out.push(...validateDownloadUrl(`spec.sourceParameters[${DataSourceParameter.Url}]`, url, ctx.downloadUrlPolicy));
  }
  return out;
}

/**
 * Status write rules: `status.uuid` and `status.checksum` are set once and never change afterwards.
 */
export function validateBackingImageStatusUpdate(oldBi: BackingImage, newBi: BackingImage): ValidationIssue[] {
  const out: ValidationIssue[] = [];
  for (const field of ['uuid', 'checksum'] as const) {
    const before = oldBi.status?.[field] ?? '';
    const after = newBi.status?.[field] ?? '';
    if (before !== '' && before !== after) {
      out.push(issue(`status.${field}`, 'immutable', `is immutable once set (was ${JSON.stringify(before)}, got ${JSON.stringify(after)})`));
    }
  }
  return out;
}

export interface BackupBackingImageAdmissionContext {
  /** The BackingImage named by `spec.backingImage`, if it exists. */
  readonly backingImage?: BackingImage;
  /** Every other BackupBackingImage in the namespace. */
  readonly otherBackupBackingImages: readonly BackupBackingImage[];
  /** The BackupTarget named by the `backup-target` label, if it exists. */
  readonly backupTarget?: BackupTarget;
}

/** The checks of Longhorn's BackupBackingImage validator on Create, plus the schema check of the CRD. */
export function validateBackupBackingImageCreate(
  bbi: BackupBackingImage,
  ctx: BackupBackingImageAdmissionContext,
): ValidationIssue[] {
  const out = validateObject(BACKUP_BACKING_IMAGE, bbi);
  if (out.some((i) => i.path === '(root)')) return out;
  const biName = bbi.spec?.backingImage ?? '';
  if (bbi.metadata?.name === undefined || bbi.metadata.name === '') out.push(issue('metadata.name', 'required', 'is required'));
  if (ctx.backingImage?.spec?.dataEngine === DataEngineType.V2) {
    out.push(issue('spec.backingImage', 'unsupported', `backing image ${biName} is v2; backing up a v2 backing image is not supported`));
  }
  const target = bbi.spec?.backupTargetName || DEFAULT_BACKUP_TARGET_NAME;
  const duplicate = ctx.otherBackupBackingImages.find(
    (other) =>
      other.metadata.name !== bbi.metadata.name &&
      other.spec?.backingImage === biName &&
      (other.spec?.backupTargetName || DEFAULT_BACKUP_TARGET_NAME) === target,
  );
  if (duplicate) {
    out.push(issue('spec.backingImage', 'conflict', `backup backing image ${biName} for backup target ${target} already exists`));
  }
  const labelTarget = bbi.metadata.labels?.[LabelKey.BackupTarget] ?? '';
  const bt = ctx.backupTarget;
  if (!bt || (bt.spec?.backupTargetURL ?? '') === '' || !bt.status?.available) {
    // The target's own message (its last poll's error) is the real cause: it goes with the refusal.
    const why = bt?.status?.conditions?.find((c) => c.type === 'Unavailable' && c.status === 'True')?.message ?? '';
    const reason = !bt ? 'it does not exist' : (bt.spec?.backupTargetURL ?? '') === '' ? 'it has no URL' : why;
    out.push(issue(`metadata.labels[${LabelKey.BackupTarget}]`, 'reference', `backup target ${labelTarget || target} is not available${reason ? `: ${reason}` : ''}`));
  }
  return out;
}
