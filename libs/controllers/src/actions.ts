/**
 * The business logic of the backing-image REST actions (Longhorn's manager/ package plus the admission webhooks'
 * defaults and checks, from `@bis/crd-types`), as functions a REST handler calls. The REST resources of
 * `@bis/api-resources` are thin callers of this class. Errors carry Longhorn's messages.
 */
import { createHash } from 'node:crypto';
import { isAlreadyExists, isConflict, isNotFound, NotFoundError, type Datastore, type Stored } from '@bis/datastore';
import {
  applyBackingImageCreateDefaults,
  applyBackupBackingImageCreateDefaults,
  backupBackingImageName,
  backupTargetNameForBackupUrl,
  BackingImageDataSourceType,
  DataSourceParameter,
  LabelKey,
  LONGHORN_API_VERSION,
  validateBackingImageCreate,
  validateBackingImageUpdate,
  validateBackupBackingImageCreate,
  type BackingImage as BackingImageCrd,
  type BackupBackingImage as BackupBackingImageCrd,
  type DownloadUrlPolicy,
  type ValidationIssue,
  type VolumeForExport,
} from '@bis/crd-types';
import type { ManagerApi } from './data-plane.js';
import {
  BackingImageDataSourceKind,
  BackingImageKind,
  BackingImageManagerKind,
  BackupBackingImageKind,
  BackupTargetKind,
  ReplicaKind,
  type BackingImage,
  type BackupBackingImage,
} from './kinds.js';
import { Annotation, Label } from './names.js';
import { cleanupRefusal, countCopies } from './rules.js';
import { describeImageCopies, diskNamesByUUID } from './copies-text.js';
import { SettingName } from './settings.js';
import type { ControllerContext } from './base-controller.js';

/** A request the caller got wrong or that is refused (a REST handler answers it like Longhorn: 500 with the message). */
export class ActionError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ActionError';
  }
}

/** Longhorn's webhook names: rejections carry them like the Kubernetes API server renders a webhook denial. */
export const VALIDATOR = 'validator.longhorn.io';
export const MUTATOR = 'mutator.longhorn.io';

/** `admission webhook "<webhook>" denied the request: <message>`. */
export function admissionDenied(webhook: string, message: string): ActionError {
  return new ActionError(`admission webhook "${webhook}" denied the request: ${message}`);
}
/** The issues as one message. */
export function issuesMessage(issues: readonly ValidationIssue[]): string {
  return issues.map((i) => i.message).join('; ');
}
function denyIfIssues(issues: readonly ValidationIssue[], webhook = VALIDATOR): void {
  if (issues.length > 0) throw admissionDenied(webhook, issuesMessage(issues));
}

/** Retries `fn` on a write conflict (someone else updated the object in between). */
export async function retryOnConflict<T>(fn: () => Promise<T>, attempts = 5): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await fn();
    } catch (err) {
      if (i + 1 >= attempts || !isConflict(err)) throw err;
    }
  }
}

/** The fields of `POST /v1/backingimages` (Longhorn's `api.BackingImage` as decoded from a request: any JSON). */
export interface CreateBackingImageInput {
  name?: unknown;
  sourceType?: unknown;
  parameters?: unknown;
  expectedChecksum?: unknown;
  minNumberOfCopies?: unknown;
  nodeSelector?: unknown;
  diskSelector?: unknown;
  secret?: unknown;
  secretNamespace?: unknown;
  dataEngine?: unknown;
}

const str = (v: unknown): string => (typeof v === 'string' ? v : '');
const strArray = (v: unknown): string[] => (Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : []);
const strMap = (v: unknown): Record<string, string> => {
  const out: Record<string, string> = {};
  if (v && typeof v === 'object' && !Array.isArray(v)) for (const [k, x] of Object.entries(v)) out[k] = typeof x === 'string' ? x : String(x);
  return out;
};

/** The mutator's name rule: lowercase, and longer than 40 characters → first 31 + `-` + 8 hex of its SHA-512. */
export function normalizeBackingImageName(name: string): string {
  const lower = name.toLowerCase();
  if (lower.length <= 40) return lower;
  const hash = createHash('sha512').update(lower).digest('hex').slice(0, 8);
  return `${lower.slice(0, 31)}-${hash}`;
}

/** The settings the actions read (satisfied by `SettingsReader`). */
export interface ActionSettings {
  get(name: SettingName): Promise<string>;
  int(name: SettingName): Promise<number>;
}

export interface ActionDeps {
  store: Datastore;
  namespace: string;
  settings: ActionSettings;
  /** For `downloadURL` (PrepareDownload on the manager). */
  dataPlane?: { managerClient(address: string): Pick<ManagerApi, 'prepareDownload'> };
  /** Policy for `download` URLs (Longhorn always rejects loopback hosts). */
  downloadUrlPolicy?: DownloadUrlPolicy;
  /** Whether a Secret exists (Kubernetes mode). Without it, secret references are not checked for existence. */
  secretExists?: (namespace: string, name: string) => Promise<boolean>;
  /**
   * The volumes an `export-from-volume` image can be exported from. This system runs no volumes or engines, so the
   * default finds none and such a creation is refused with a clear message instead of waiting forever.
   */
  getVolume?: (name: string) => VolumeForExport | undefined;
}

export class BackingImageActions {
  constructor(private readonly d: ActionDeps) {}

  /** `allowSourceHosts`: hosts (or `host:port`) accepted as download sources although loopback (CIDRs are ignored). */
  static fromContext(ctx: ControllerContext, allowSourceHosts?: readonly string[]): BackingImageActions {
    return new BackingImageActions({
      store: ctx.store,
      namespace: ctx.namespace,
      settings: ctx.settings,
      dataPlane: ctx.dataPlane,
      downloadUrlPolicy: { allowedHosts: (allowSourceHosts ?? []).filter((h) => !h.includes('/')).map((h) => h.toLowerCase()) },
    });
  }

  private get ns(): string {
    return this.d.namespace;
  }

  private async getOrUndefined<T>(p: Promise<T>): Promise<T | undefined> {
    try {
      return await p;
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  /** Names of the disks where replicas use the image (Longhorn's replica labels). */
  async replicaDisks(name: string): Promise<Set<string>> {
    const { items } = await this.d.store.list(ReplicaKind, { namespace: this.ns, labelSelector: { matchLabels: { [LabelKey.ReplicaBackingImage]: name } } });
    return new Set(items.map((r) => r.metadata.labels?.[LabelKey.ReplicaLegacyDiskUUID] || r.spec.diskID));
  }

  /**
   * Create (§2.4): the mutating webhook's defaults, then the CRD schema and validating webhook's checks (all from
   * `@bis/crd-types`), then the store. Rejections carry the webhook's name like Longhorn's apiserver errors.
   */
  async create(req: CreateBackingImageInput): Promise<Stored<BackingImage>> {
    const { store, settings } = this.d;
    const draft: BackingImageCrd = {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImage',
      metadata: { name: str(req.name), namespace: this.ns },
      spec: {
        disks: {},
        diskFileSpecMap: {},
        checksum: str(req.expectedChecksum),
        sourceType: str(req.sourceType) as NonNullable<BackingImageCrd['spec']>['sourceType'],
        sourceParameters: strMap(req.parameters),
        minNumberOfCopies: typeof req.minNumberOfCopies === 'number' ? req.minNumberOfCopies : 0,
        nodeSelector: strArray(req.nodeSelector),
        diskSelector: strArray(req.diskSelector),
        secret: str(req.secret),
        secretNamespace: str(req.secretNamespace),
        dataEngine: str(req.dataEngine) as NonNullable<BackingImageCrd['spec']>['dataEngine'],
      },
    };
    const sourceType = draft.spec?.sourceType as string;
    const params = draft.spec?.sourceParameters ?? {};
    // Lookups the webhooks make.
    let cloneSource: Stored<BackingImage> | undefined;
    if (sourceType === BackingImageDataSourceType.Clone && params[DataSourceParameter.BackingImage]) {
      cloneSource = await this.getOrUndefined(store.get(BackingImageKind, params[DataSourceParameter.BackingImage].trim(), this.ns));
    }
    let restoreTarget: string | undefined;
    if (sourceType === BackingImageDataSourceType.Restore && !params[DataSourceParameter.BackupTargetName]) {
      const bbis = (await store.list(BackupBackingImageKind, { namespace: this.ns })).items;
      restoreTarget = backupTargetNameForBackupUrl((params[DataSourceParameter.BackupUrl] ?? '').trim(), bbis as BackupBackingImageCrd[]);
    }
    let mutated: BackingImageCrd;
    try {
      mutated = applyBackingImageCreateDefaults(draft, {
        defaultMinNumberOfCopies: await settings.int(SettingName.DefaultMinNumberOfBackingImageCopies),
        backupConcurrentLimit: await settings.int(SettingName.BackupConcurrentLimit),
        cloneSource: cloneSource as BackingImageCrd | undefined,
        restoreBackupTargetName: restoreTarget,
      });
    } catch (err) {
      throw admissionDenied(MUTATOR, (err as Error).message);
    }
    const issues = validateBackingImageCreate(mutated, {
      downloadUrlPolicy: this.d.downloadUrlPolicy,
      getBackingImage: (n) => (cloneSource && cloneSource.metadata.name === n ? (cloneSource as BackingImageCrd) : undefined),
      getVolume: this.d.getVolume ?? (() => undefined),
    });
    denyIfIssues(issues);
    await this.checkSecrets(mutated);
    return store.create(BackingImageKind, mutated as BackingImage);
  }

  private async checkSecrets(bi: BackingImageCrd): Promise<void> {
    const exists = this.d.secretExists;
    if (!exists) return;
    const refs: [string, string][] = [];
    if (bi.spec?.secret && bi.spec.secretNamespace) refs.push([bi.spec.secretNamespace, bi.spec.secret]);
    const p = bi.spec?.sourceParameters ?? {};
    if (p[DataSourceParameter.Secret] && p[DataSourceParameter.SecretNamespace]) refs.push([p[DataSourceParameter.SecretNamespace], p[DataSourceParameter.Secret]]);
    for (const [ns, name] of refs) if (!(await exists(ns, name))) throw admissionDenied(VALIDATOR, `secret ${ns}/${name} not found`);
  }

  async get(name: string): Promise<Stored<BackingImage>> {
    return this.d.store.get(BackingImageKind, name, this.ns);
  }

  /** DELETE: the validator refuses it while replicas use the image; Foreground propagation like Longhorn. */
  async delete(name: string): Promise<void> {
    await this.get(name);
    if ((await this.replicaDisks(name)).size > 0) throw admissionDenied(VALIDATOR, `cannot delete backing image ${name} since there are replicas using it`);
    await this.d.store.delete(BackingImageKind, name, this.ns, { propagationPolicy: 'Foreground' });
  }

  /**
   * `backingImageCleanup` (§2.5): removes the given disks from `spec.diskFileSpecMap` unless a replica (or the
   * unfinished data source) uses them, or too few copies would remain (`cleanupRefusal`, which fixes Longhorn's
   * counting fault).
   */
  async cleanupDiskFiles(name: string, disks: readonly string[]): Promise<Stored<BackingImage>> {
    return retryOnConflict(async () => {
      const bi = await this.get(name);
      const specMap = bi.spec?.diskFileSpecMap;
      if (bi.metadata.deletionTimestamp || !specMap) return bi;
      const bids = await this.getOrUndefined(this.d.store.get(BackingImageDataSourceKind, name, this.ns));
      const inUse = await this.replicaDisks(name);
      if (bids && !bids.spec?.fileTransferred && bids.spec?.diskUUID) inUse.add(bids.spec.diskUUID);
      const next = { ...specMap };
      const removed = new Set<string>();
      for (const disk of disks) {
        if (inUse.has(disk)) throw new ActionError(`cannot clean up backing image ${name} in disk ${disk} since there is at least one replica using it`);
        if (!(disk in next)) continue;
        delete next[disk];
        removed.add(disk);
      }
      const statusMap = bi.status?.diskFileStatusMap ?? {};
      const why = cleanupRefusal(countCopies(Object.keys(specMap), (d) => statusMap[d]?.state, removed), bi.spec?.minNumberOfCopies ?? 1);
      if (why) throw new ActionError(why);
      if (removed.size === 0) return bi;
      return this.d.store.update(BackingImageKind, { ...bi, spec: { ...bi.spec, diskFileSpecMap: next } });
    });
  }

  /**
   * `updateMinNumberOfCopies`, checked by the update validator. Longhorn's handler dereferences a nil result when the
   * update fails and the client sees a dropped connection; here every failure is an error.
   */
  async updateMinNumberOfCopies(name: string, n: unknown): Promise<Stored<BackingImage>> {
    if (typeof n !== 'number' || !Number.isSafeInteger(n)) throw new ActionError(`invalid input for action updateMinNumberOfCopies: field "minNumberOfCopies" must be an integer`);
    return retryOnConflict(async () => {
      const bi = await this.get(name);
      const next: Stored<BackingImage> = { ...bi, spec: { ...bi.spec, minNumberOfCopies: n } };
      denyIfIssues(validateBackingImageUpdate(bi as BackingImageCrd, next as BackingImageCrd, { downloadUrlPolicy: this.d.downloadUrlPolicy }));
      return this.d.store.update(BackingImageKind, next);
    });
  }

  /** `backupBackingImageCreate`: a BBI `<bi>-<8 hex>` for the target (default `default`), through the BBI webhooks. */
  async createBackup(biName: string, backupTargetName = ''): Promise<Stored<BackupBackingImage>> {
    const { store } = this.d;
    const bi = await this.get(biName);
    const name = backupBackingImageName(biName);
    const targets = new Map((await store.list(BackupTargetKind, { namespace: this.ns })).items.map((t) => [t.metadata.name, t]));
    let bbi: BackupBackingImageCrd = {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackupBackingImage',
      metadata: { name, namespace: this.ns },
      spec: { userCreated: true, backingImage: biName, backupTargetName },
    };
    try {
      bbi = applyBackupBackingImageCreateDefaults(bbi, (t) => targets.has(t));
    } catch (err) {
      throw admissionDenied(MUTATOR, (err as Error).message);
    }
    const all = (await store.list(BackupBackingImageKind, { namespace: this.ns })).items;
    // A failed backup of the same image to the same target is replaced by the new one (a retry): Longhorn refuses
    // the create until the failed one is deleted; here the create does that delete itself. Being deleted already, or
    // in any other state, the other backup still refuses the create (validator below).
    const target = bbi.spec?.backupTargetName || 'default';
    const failed = all.filter(
      (o) =>
        !o.metadata.deletionTimestamp &&
        o.spec?.backingImage === biName &&
        (o.spec?.backupTargetName || 'default') === target &&
        (o.status?.state === 'Error' || o.status?.state === 'Unknown'),
    );
    const others = all.filter((o) => !failed.includes(o));
    const issues = validateBackupBackingImageCreate(bbi, {
      backingImage: bi as BackingImageCrd,
      otherBackupBackingImages: others as BackupBackingImageCrd[],
      backupTarget: targets.get(bbi.metadata.labels?.[LabelKey.BackupTarget] ?? ''),
    });
    denyIfIssues(issues);
    await this.requireReadyCopy(bi);
    for (const f of failed) {
      // Only the custom resource goes: the failed backup's data in the target is the new backup's location, which
      // the new backup overwrites; removing it remotely could race with the new backup's writes.
      await retryOnConflict(async () => {
        const cur = await store.get(BackupBackingImageKind, f.metadata.name, this.ns);
        await store.update(BackupBackingImageKind, { ...cur, metadata: { ...cur.metadata, labels: { ...cur.metadata.labels, [Label.DeleteCustomResourceOnly]: 'true' } } });
      }).catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      });
      await store.delete(BackupBackingImageKind, f.metadata.name, this.ns).catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      });
    }
    try {
      return await store.create(BackupBackingImageKind, bbi as BackupBackingImage);
    } catch (err) {
      if (isAlreadyExists(err)) throw new ActionError(`backup backing image ${name} already exists`);
      throw err;
    }
  }

  /**
   * Refuses a backup of an image without a ready copy (Longhorn accepts it and the backup fails later with "failed
   * to find a ready backing image manager"): the message lists each copy's disk, state and progress.
   */
  private async requireReadyCopy(bi: Stored<BackingImage>): Promise<void> {
    if (Object.values(bi.status?.diskFileStatusMap ?? {}).some((f) => f?.state === 'ready')) return;
    const copies = await describeImageCopies(this.d.store, this.ns, bi);
    throw new ActionError(`backing image ${bi.metadata.name} has no ready copy to back up yet (copies: ${copies}); wait until a copy is ready, then create the backup`);
  }

  /** `backupBackingImageRestore` (§2.5): creates BI `bbi.spec.backingImage` of type restore (undefined when it raced with another create). */
  async restoreBackup(bbiName: string, input: { secret?: unknown; secretNamespace?: unknown; dataEngine?: unknown }): Promise<Stored<BackingImage> | undefined> {
    const dataEngine = str(input.dataEngine);
    if (!bbiName || !dataEngine) throw new ActionError(`missing parameters for restoring backing image, name=${bbiName} dataEngine=${dataEngine}`);
    const bbi = await this.d.store.get(BackupBackingImageKind, bbiName, this.ns);
    const biName = bbi.spec?.backingImage ?? '';
    if (await this.getOrUndefined(this.get(biName))) throw new ActionError(`backing image ${biName} already exists`);
    if (dataEngine !== 'v1' && dataEngine !== 'v2') throw new ActionError(`invalid data engine ${dataEngine}: must be v1 or v2`);
    try {
      return await this.create({
        name: biName,
        sourceType: BackingImageDataSourceType.Restore,
        dataEngine,
        expectedChecksum: bbi.status?.checksum ?? '',
        parameters: {
          [DataSourceParameter.BackupTargetName]: bbi.spec?.backupTargetName || 'default',
          [DataSourceParameter.BackupUrl]: bbi.status?.url ?? '',
          [DataSourceParameter.ConcurrentLimit]: String(await this.d.settings.int(SettingName.BackupConcurrentLimit)),
        },
        secret: str(input.secret),
        secretNamespace: str(input.secretNamespace),
      });
    } catch (err) {
      if (isAlreadyExists(err)) return undefined;
      throw err;
    }
  }

  async deleteBackup(bbiName: string): Promise<void> {
    await this.d.store.delete(BackupBackingImageKind, bbiName, this.d.namespace);
  }

  /**
   * Where an upload for this image must be sent (§2.6): the data source's HTTP address, only while it waits for the
   * upload (`pending`).
   */
  async uploadTarget(name: string): Promise<string> {
    const { store, namespace } = this.d;
    const bids = await store.get(BackingImageDataSourceKind, name, namespace).catch((err) => {
      if (isNotFound(err)) throw new ActionError(`cannot find pod for backing image data source ${name}`);
      throw err;
    });
    const address = bids.metadata.annotations?.[Annotation.Address];
    if (!address || !bids.status?.ip) throw new ActionError('backing image data source pod is not ready for uploading');
    if (bids.status?.currentState !== 'pending') throw new ActionError(`upload server for backing image ${name} has not been initiated`);
    return address;
  }

  /** Where a download is served (§2.6): `http://<sync address>/v1/files/<escaped path>/download`. */
  async downloadURL(name: string): Promise<string> {
    const { store, namespace, settings, dataPlane } = this.d;
    if (!dataPlane) throw new ActionError(`downloads of backing image ${name} need a data plane`);
    const bi = await store.get(BackingImageKind, name, namespace);
    const image = await settings.get(SettingName.DefaultBackingImageManagerImage);
    const disk = Object.entries(bi.status?.diskFileStatusMap ?? {}).find(([, s]) => s.state === 'ready')?.[0];
    const managers = (await store.list(BackingImageManagerKind, { namespace, labelSelector: { matchLabels: { [Label.DiskUUID]: disk ?? '' } } })).items;
    const bim = managers.find((m) => m.spec?.image === image && !m.metadata.deletionTimestamp);
    const address = bim?.metadata.annotations?.[Annotation.Address];
    if (!disk) throw new ActionError(`backing image ${name} has no ready copy to download yet (copies: ${await describeImageCopies(store, namespace, bi)})`);
    if (!bim || !address) {
      const where = (await diskNamesByUUID(store, namespace)).get(disk) ?? `disk ${disk}`;
      throw new ActionError(`no backing image manager is running on ${where}, which holds the ready copy of backing image ${name}; check that disk (bictl node ls) and its manager's state and log`);
    }
    const r = await dataPlane.managerClient(address).prepareDownload(name, bi.status?.uuid ?? '');
    const syncAddress = bim.metadata.annotations?.[Annotation.SyncAddress] || r.address;
    return `http://${syncAddress}/v1/files/${encodeURIComponent(r.srcFilePath)}/download`;
  }
}

export { NotFoundError };

/** IPv4 CIDR membership (IPv6 CIDRs match only exactly). */
export function cidrContains(cidr: string, ip: string): boolean {
  const [base, bitsS] = cidr.split('/');
  const bits = Number(bitsS);
  const toInt = (s: string) => {
    const p = s.split('.').map(Number);
    if (p.length !== 4 || p.some((x) => !Number.isInteger(x) || x < 0 || x > 255)) return undefined;
    return ((p[0]! << 24) | (p[1]! << 16) | (p[2]! << 8) | p[3]!) >>> 0;
  };
  const a = toInt(base ?? ''),
    b = toInt(ip);
  if (a === undefined || b === undefined || !Number.isInteger(bits) || bits < 0 || bits > 32) return base === ip;
  const mask = bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0;
  return (a & mask) === (b & mask);
}
