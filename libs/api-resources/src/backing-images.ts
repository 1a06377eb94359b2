import {
  applyBackingImageCreateDefaults,
  applyBackupBackingImageCreateDefaults,
  backupBackingImageName,
  backupTargetNameForBackupUrl,
  BackingImageDataSourceType,
  DataSourceParameter,
  LONGHORN_API_VERSION,
  LabelKey,
  validateBackingImageCreate,
  validateBackingImageUpdate,
  validateBackupBackingImageCreate,
  type BackingImage as BackingImageCrd,
  type BackupBackingImage as BackupBackingImageCrd,
} from '@bis/crd-types';
import { isAlreadyExists, isNotFound, type Stored } from '@bis/datastore';
import {
  BackingImageDataSourceKind,
  BackingImageKind,
  BackupBackingImageKind,
  BackupTargetKind,
  ReplicaKind,
  SettingName,
  type BackingImage,
  type BackupBackingImage,
  type StoredBI,
  type StoredBIDS,
} from '@bis/controllers';

import { cleanupRefusal, countCopies } from './cleanup.js';
import type { BackingImageApiDeps } from './deps.js';
import { admissionDenied, denyIfIssues, issuesMessage, MUTATOR, refused, retryOnConflict, VALIDATOR } from './errors.js';

/** The fields of `POST /v1/backingimages` (Longhorn's `api.BackingImage` as decoded from the request). */
export interface CreateBackingImageRequest {
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

/** The backing-image operations behind the REST resources: Longhorn's `manager/backingimage.go` plus its webhooks. */
export class BackingImageService {
  constructor(private readonly d: BackingImageApiDeps) {}

  private get ns(): string {
    return this.d.namespace;
  }

  async list(): Promise<StoredBI[]> {
    return (await this.d.store.list(BackingImageKind, { namespace: this.ns })).items;
  }

  async get(name: string): Promise<StoredBI | undefined> {
    try {
      return await this.d.store.get(BackingImageKind, name, this.ns);
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  async mustGet(name: string): Promise<StoredBI> {
    return this.d.store.get(BackingImageKind, name, this.ns);
  }

  async dataSource(name: string): Promise<StoredBIDS | undefined> {
    try {
      return await this.d.store.get(BackingImageDataSourceKind, name, this.ns);
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
   * Create (§2.4): the mutating webhook's defaults, then the CRD schema and validating webhook's checks, then the
   * store. Rejections carry the webhook's name like Longhorn's apiserver errors.
   */
  async create(req: CreateBackingImageRequest): Promise<StoredBI> {
    const { store } = this.d;
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
    let cloneSource: StoredBI | undefined;
    if (sourceType === BackingImageDataSourceType.Clone && params[DataSourceParameter.BackingImage]) {
      cloneSource = await this.get(params[DataSourceParameter.BackingImage].trim());
    }
    let restoreTarget: string | undefined;
    if (sourceType === BackingImageDataSourceType.Restore && !params[DataSourceParameter.BackupTargetName]) {
      const bbis = (await store.list(BackupBackingImageKind, { namespace: this.ns })).items;
      restoreTarget = backupTargetNameForBackupUrl((params[DataSourceParameter.BackupUrl] ?? '').trim(), bbis as BackupBackingImageCrd[]);
    }
    let mutated: BackingImageCrd;
    try {
      mutated = applyBackingImageCreateDefaults(draft, {
        defaultMinNumberOfCopies: await this.d.settings.int(SettingName.DefaultMinNumberOfBackingImageCopies),
        backupConcurrentLimit: await this.d.settings.int(SettingName.BackupConcurrentLimit),
        cloneSource: cloneSource as BackingImageCrd | undefined,
        restoreBackupTargetName: restoreTarget,
      });
    } catch (err) {
      throw admissionDenied(MUTATOR, (err as Error).message);
    }
    const issues = validateBackingImageCreate(mutated, {
      downloadUrlPolicy: this.d.downloadUrlPolicy,
      getBackingImage: (n) => (cloneSource && cloneSource.metadata.name === n ? (cloneSource as BackingImageCrd) : undefined),
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

  /** DELETE: the validator refuses it while replicas use the image; Foreground propagation like Longhorn. */
  async delete(name: string): Promise<void> {
    await this.mustGet(name);
    if ((await this.replicaDisks(name)).size > 0) throw admissionDenied(VALIDATOR, `cannot delete backing image ${name} since there are replicas using it`);
    await this.d.store.delete(BackingImageKind, name, this.ns, { propagationPolicy: 'Foreground' });
  }

  /**
   * `backingImageCleanup` (§2.5): removes the given disks from `spec.diskFileSpecMap` unless a replica (or the
   * unfinished data source) uses them, or too few copies would remain (see `cleanupRefusal`, which fixes Longhorn's
   * counting fault).
   */
  async cleanup(name: string, disks: readonly string[]): Promise<StoredBI> {
    return retryOnConflict(async () => {
      const bi = await this.mustGet(name);
      const specMap = bi.spec?.diskFileSpecMap;
      if (bi.metadata.deletionTimestamp || !specMap) return bi;
      const bids = await this.dataSource(name);
      const inUse = await this.replicaDisks(name);
      if (bids && !bids.spec?.fileTransferred && bids.spec?.diskUUID) inUse.add(bids.spec.diskUUID);
      const next = { ...specMap };
      const removed = new Set<string>();
      for (const disk of disks) {
        if (inUse.has(disk)) throw refused(`cannot clean up backing image ${name} in disk ${disk} since there is at least one replica using it`);
        if (!(disk in next)) continue;
        delete next[disk];
        removed.add(disk);
      }
      const statusMap = bi.status?.diskFileStatusMap ?? {};
      const why = cleanupRefusal(countCopies(Object.keys(specMap), (d) => statusMap[d]?.state, removed), bi.spec?.minNumberOfCopies ?? 1);
      if (why) throw refused(why);
      if (removed.size === 0) return bi;
      return this.d.store.update(BackingImageKind, { ...bi, spec: { ...bi.spec, diskFileSpecMap: next } });
    });
  }

  /**
   * `updateMinNumberOfCopies`. Longhorn's handler dereferences a nil result when the update fails and the client
   * sees a dropped connection; here every failure is an error body.
   */
  async updateMinNumberOfCopies(name: string, n: unknown): Promise<StoredBI> {
    if (typeof n !== 'number' || !Number.isSafeInteger(n)) throw refused(`invalid input for action updateMinNumberOfCopies: field "minNumberOfCopies" must be an integer`);
    return retryOnConflict(async () => {
      const bi = await this.mustGet(name);
      const next: StoredBI = { ...bi, spec: { ...bi.spec, minNumberOfCopies: n } };
      denyIfIssues(validateBackingImageUpdate(bi as BackingImageCrd, next as BackingImageCrd, { downloadUrlPolicy: this.d.downloadUrlPolicy }));
      return this.d.store.update(BackingImageKind, next);
    });
  }

  /** `backupBackingImageCreate`: a BBI `<bi>-<8 hex>` for the target (default `default`), through the BBI webhooks. */
  async createBackup(biName: string, backupTargetName: string): Promise<Stored<BackupBackingImage>> {
    const { store } = this.d;
    const bi = await this.mustGet(biName);
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
    const others = (await store.list(BackupBackingImageKind, { namespace: this.ns })).items;
    const issues = validateBackupBackingImageCreate(bbi, {
      backingImage: bi as BackingImageCrd,
      otherBackupBackingImages: others as BackupBackingImageCrd[],
      backupTarget: targets.get(bbi.metadata.labels?.[LabelKey.BackupTarget] ?? ''),
    });
    if (issues.length) throw admissionDenied(VALIDATOR, issuesMessage(issues));
    try {
      return await store.create(BackupBackingImageKind, bbi as BackupBackingImage);
    } catch (err) {
      if (isAlreadyExists(err)) throw refused(`backup backing image ${name} already exists`);
      throw err;
    }
  }

  /** `backupBackingImageRestore` (§2.5): creates BI `bbi.spec.backingImage` of type restore. */
  async restoreBackup(bbiName: string, input: { secret?: unknown; secretNamespace?: unknown; dataEngine?: unknown }): Promise<void> {
    const dataEngine = str(input.dataEngine);
    if (!bbiName || !dataEngine) throw refused(`missing parameters for restoring backing image, name=${bbiName} dataEngine=${dataEngine}`);
    const bbi = await this.d.store.get(BackupBackingImageKind, bbiName, this.ns);
    const biName = bbi.spec?.backingImage ?? '';
    if (await this.get(biName)) throw refused(`backing image ${biName} already exists`);
    if (dataEngine !== 'v1' && dataEngine !== 'v2') throw refused(`invalid data engine ${dataEngine}: must be v1 or v2`);
    try {
      await this.create({
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
      if (!isAlreadyExists(err)) throw err;
    }
  }

  async listBackups(): Promise<Stored<BackupBackingImage>[]> {
    return (await this.d.store.list(BackupBackingImageKind, { namespace: this.ns })).items;
  }

  async getBackup(name: string): Promise<Stored<BackupBackingImage> | undefined> {
    try {
      return await this.d.store.get(BackupBackingImageKind, name, this.ns);
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  async deleteBackup(name: string): Promise<void> {
    await this.d.store.delete(BackupBackingImageKind, name, this.ns);
  }
}

