/**
 * The business logic of the backing-image REST actions (Longhorn's manager/ package plus the admission webhooks'
 * defaults and checks), as functions a REST handler calls. Errors carry Longhorn's messages.
 */
import { createHash } from 'node:crypto';
import { isAlreadyExists, isNotFound, NotFoundError, type Datastore, type Stored } from '@bis/datastore';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import type { DataPlane } from './data-plane.js';
import {
  BackingImageDataSourceKind,
  BackingImageKind,
  BackingImageManagerKind,
  BackupBackingImageKind,
  BackupTargetKind,
  type BackingImage,
  type BackupBackingImage,
} from './kinds.js';
import { Annotation, backupBackingImageName, Component, FINALIZER, Label, MANAGED_BY } from './names.js';
import { replicasOf } from './common.js';
import { cleanupHaVerdict } from './rules.js';
import { SettingName, type SettingsReader } from './settings.js';
import type { ControllerContext } from './base-controller.js';

/** A request the caller got wrong (a REST handler answers it like Longhorn: 500 with the message, or 404 for NotFound). */
export class ActionError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ActionError';
  }
}

export interface CreateBackingImageInput {
  name: string;
  sourceType: string;
  parameters?: Record<string, string> | null;
  expectedChecksum?: string;
  minNumberOfCopies?: number;
  nodeSelector?: string[] | null;
  diskSelector?: string[] | null;
  secret?: string;
  secretNamespace?: string;
  dataEngine?: string;
}

const SOURCE_TYPES = ['download', 'upload', 'export-from-volume', 'restore', 'clone'];
const NAME_RE = /^[a-z0-9][a-z0-9_.-]+$/;
const K8S_NAME_RE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** The mutator's name rule: lowercase, and longer than 40 characters → first 31 + `-` + 8 hex of its SHA-512. */
export function normalizeBackingImageName(name: string): string {
  const lower = name.toLowerCase();
  if (lower.length <= 40) return lower;
  const hash = createHash('sha512').update(lower).digest('hex').slice(0, 8);
  return `${lower.slice(0, 31)}-${hash}`;
}

function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  return h === 'localhost' || h.endsWith('.localhost') || h === '::1' || /^127\./.test(h) || h === '0.0.0.0';
}

export interface ActionDeps {
  store: Datastore;
  namespace: string;
  settings: SettingsReader;
  dataPlane: DataPlane;
  /** Hosts or CIDRs allowed as download sources even though they are loopback (standalone tests, local mirrors). */
  allowSourceHosts?: readonly string[];
}

export class BackingImageActions {
  constructor(private readonly d: ActionDeps) {}

  static fromContext(ctx: ControllerContext, allowSourceHosts?: readonly string[]): BackingImageActions {
    return new BackingImageActions({ store: ctx.store, namespace: ctx.namespace, settings: ctx.settings, dataPlane: ctx.dataPlane, allowSourceHosts });
  }

  private hostAllowed(host: string): boolean {
    const h = host.replace(/^\[|\]$/g, '');
    return (this.d.allowSourceHosts ?? []).some((a) => a === h || (a.includes('/') && cidrContains(a, h)));
  }

  /** Create with the mutator's defaults and the validator's checks (§2.4). */
  async create(input: CreateBackingImageInput): Promise<Stored<BackingImage>> {
    const { store, namespace, settings } = this.d;
    const name = normalizeBackingImageName((input.name ?? '').trim());
    if (!NAME_RE.test(name) || !K8S_NAME_RE.test(name)) throw new ActionError(`invalid name ${JSON.stringify(input.name)}: must match ^[a-z0-9][a-z0-9_.-]+$ and be a valid Kubernetes name`);
    if (!SOURCE_TYPES.includes(input.sourceType)) {
      throw new ActionError(`BackingImage.longhorn.io "${name}" is invalid: spec.sourceType: Unsupported value: "${input.sourceType ?? ''}": supported values: ${SOURCE_TYPES.map((s) => `"${s}"`).join(', ')}`);
    }
    const dataEngine = input.dataEngine || 'v1';
    if (dataEngine === 'v2') throw new ActionError('v2 backing image is not supported');
    if (dataEngine !== 'v1') throw new ActionError(`invalid data engine ${dataEngine}`);
    let min = input.minNumberOfCopies ?? 0;
    if (min === 0) min = await settings.int(SettingName.DefaultMinNumberOfBackingImageCopies);
    if (min < 1 || !Number.isInteger(min)) throw new ActionError(`minimum number of backing image copies ${min} must larger than 0`);
    const checksum = (input.expectedChecksum ?? '').trim();
    if (checksum && !/^[0-9a-f]{128}$/.test(checksum)) throw new ActionError(`invalid checksum ${checksum}: must be a SHA-512 as 128 lowercase hex characters`);
    const parameters: Record<string, string> = {};
    for (const [k, v] of Object.entries(input.parameters ?? {})) parameters[k] = String(v).trim();
    if (input.sourceType === 'download') {
      const raw = parameters['url'];
      if (!raw) throw new ActionError('invalid parameter: url is required for source type download');
      let u: URL;
      try {
        u = new URL(raw);
      } catch {
        throw new ActionError(`invalid url ${raw}`);
      }
      if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new ActionError(`invalid url ${raw}: scheme must be http or https`);
      if (isLoopbackHost(u.hostname) && !this.hostAllowed(u.hostname)) throw new ActionError(`invalid url ${raw}: loopback addresses are not allowed`);
    }
    if (input.sourceType === 'clone') {
      const src = parameters['backing-image'] ?? '';
      const source = await store.get(BackingImageKind, src, namespace).catch((err) => {
        if (isNotFound(err)) throw new ActionError(`cannot find the source backing image ${src} to clone`);
        throw err;
      });
      const enc = (parameters['encryption'] ||= 'ignore');
      if (!['encrypt', 'decrypt', 'ignore'].includes(enc)) throw new ActionError(`invalid encryption ${enc}`);
      if (enc !== 'ignore') throw new ActionError(`encryption ${enc} needs Kubernetes secrets, which the standalone system does not provide`);
      if (!source.status?.checksum) throw new ActionError(`source backing image ${src} has no checksum yet`);
    }
    if (input.sourceType === 'restore') {
      parameters['concurrent-limit'] ||= String(await settings.int(SettingName.BackupConcurrentLimit));
      if (!parameters['backup-url']) throw new ActionError('invalid parameter: backup-url is required for source type restore');
      parameters['backup-target-name'] ||= 'default';
    }
    const bi: BackingImage = {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImage',
      metadata: { name, namespace, finalizers: [FINALIZER], labels: { [Label.ManagedBy]: MANAGED_BY, [Label.Component]: Component.BackingImage } },
      spec: {
        disks: {},
        diskFileSpecMap: {},
        checksum,
        sourceType: input.sourceType as NonNullable<BackingImage['spec']>['sourceType'],
        sourceParameters: parameters,
        minNumberOfCopies: min,
        nodeSelector: input.nodeSelector ?? [],
        diskSelector: input.diskSelector ?? [],
        secret: input.secret ?? '',
        secretNamespace: input.secretNamespace ?? '',
        dataEngine: 'v1',
      },
      status: {},
    };
    if (input.sourceType === 'clone') {
      const source = await store.get(BackingImageKind, parameters['backing-image']!, namespace);
      bi.spec!.checksum = source.status?.checksum ?? '';
      bi.spec!.secret = source.spec?.secret ?? '';
      bi.spec!.secretNamespace = source.spec?.secretNamespace ?? '';
    }
    return store.create(BackingImageKind, bi);
  }

  async get(name: string): Promise<Stored<BackingImage>> {
    return this.d.store.get(BackingImageKind, name, this.d.namespace);
  }

  /** DELETE: refused while replicas use the image; Foreground propagation. */
  async delete(name: string): Promise<void> {
    const { store, namespace } = this.d;
    await store.get(BackingImageKind, name, namespace);
    const replicas = await replicasOf({ store, namespace } as ControllerContext, name);
    if (replicas.length > 0) throw new ActionError(`cannot delete backing image ${name} since there are replicas using it`);
    await store.delete(BackingImageKind, name, namespace, { propagationPolicy: 'Foreground' });
  }

  /** `backingImageCleanup` (§2.5). */
  async cleanupDiskFiles(name: string, disks: readonly string[]): Promise<Stored<BackingImage>> {
    const { store, namespace } = this.d;
    const bi = await store.get(BackingImageKind, name, namespace);
    if (bi.metadata.deletionTimestamp || !bi.spec?.diskFileSpecMap) return bi;
    const bids = await store.get(BackingImageDataSourceKind, name, namespace).catch((err) => {
      if (isNotFound(err)) return undefined;
      throw err;
    });
    const inUse = new Set((await replicasOf({ store, namespace } as ControllerContext, name)).map((r) => r.spec.diskID));
    if (bids && !bids.spec?.fileTransferred && bids.spec?.diskUUID) inUse.add(bids.spec.diskUUID);
    const original = bi.spec.diskFileSpecMap;
    const next = { ...original };
    const cleanup = new Set<string>();
    for (const d of disks) {
      if (inUse.has(d)) throw new ActionError(`cannot clean up backing image ${name} in disk ${d} since there is at least one replica using it`);
      if (!(d in next)) continue;
      delete next[d];
      cleanup.add(d);
    }
    const verdict = cleanupHaVerdict(original, bi.status?.diskFileStatusMap ?? {}, cleanup, bi.spec.minNumberOfCopies ?? 1);
    if (!verdict.ok) throw new ActionError(verdict.message);
    if (cleanup.size === 0) return bi;
    return store.update(BackingImageKind, { ...bi, spec: { ...bi.spec, diskFileSpecMap: next } });
  }

  /** `updateMinNumberOfCopies`. */
  async updateMinNumberOfCopies(name: string, n: number): Promise<Stored<BackingImage>> {
    const { store, namespace } = this.d;
    if (!Number.isInteger(n) || n < 1) throw new ActionError(`minimum number of backing image copies ${n} must larger than 0`);
    const bi = await store.get(BackingImageKind, name, namespace);
    return store.update(BackingImageKind, { ...bi, spec: { ...bi.spec, minNumberOfCopies: n } });
  }

  /** `backupBackingImageCreate`. Returns the created BBI. */
  async createBackup(biName: string, backupTargetName = '', labels: Record<string, string> = {}): Promise<Stored<BackupBackingImage>> {
    const { store, namespace } = this.d;
    const bi = await store.get(BackingImageKind, biName, namespace);
    if (bi.spec?.dataEngine === 'v2') throw new ActionError('v2 backing image is not supported for backup');
    let targetName = backupTargetName || 'default';
    const target = await store.get(BackupTargetKind, targetName, namespace).catch(async (err) => {
      if (!isNotFound(err)) throw err;
      targetName = 'default';
      return store.get(BackupTargetKind, 'default', namespace).catch((e2) => {
        if (isNotFound(e2)) throw new ActionError(`backup target ${backupTargetName || 'default'} is not available`);
        throw e2;
      });
    });
    if (!target.spec?.backupTargetURL || !target.status?.available) throw new ActionError(`backup target ${targetName} is not available`);
    const existing = await store.list(BackupBackingImageKind, { namespace, labelSelector: { matchLabels: { [Label.BackupTarget]: targetName, [Label.BackupBackingImage]: biName } } });
    if (existing.items.length > 0) throw new ActionError(`backup backing image ${biName} for backup target ${targetName} already exists`);
    const name = backupBackingImageName(biName);
    try {
      return await store.create(BackupBackingImageKind, {
        apiVersion: LONGHORN_API_VERSION,
        kind: 'BackupBackingImage',
        metadata: { name, namespace, finalizers: [FINALIZER], labels: { [Label.BackupTarget]: targetName, [Label.BackupBackingImage]: biName } },
        spec: { backingImage: biName, backupTargetName: targetName, userCreated: true, labels },
        status: {},
      });
    } catch (err) {
      if (isAlreadyExists(err)) throw new ActionError(`backup backing image ${name} already exists`);
      throw err;
    }
  }

  /** `backupBackingImageRestore`: creates the BI of type restore. */
  async restoreBackup(bbiName: string, input: { secret?: string; secretNamespace?: string; dataEngine?: string }): Promise<Stored<BackingImage> | undefined> {
    const { store, namespace, settings } = this.d;
    const dataEngine = input.dataEngine ?? '';
    if (!bbiName || !dataEngine) throw new ActionError(`missing parameters for restoring backing image, name=${bbiName} dataEngine=${dataEngine}`);
    const bbi = await store.get(BackupBackingImageKind, bbiName, namespace);
    const biName = bbi.spec?.backingImage ?? '';
    const exists = await store.get(BackingImageKind, biName, namespace).then(
      () => true,
      (err) => {
        if (isNotFound(err)) return false;
        throw err;
      },
    );
    if (exists) throw new ActionError(`backing image ${biName} already exists`);
    if (dataEngine !== 'v1' && dataEngine !== 'v2') throw new ActionError(`invalid data engine ${dataEngine}`);
    try {
      const bi = await this.create({
        name: biName,
        sourceType: 'restore',
        dataEngine,
        expectedChecksum: bbi.status?.checksum ?? '',
        parameters: {
          'backup-target-name': bbi.spec?.backupTargetName || 'default',
          'backup-url': bbi.status?.url ?? '',
          'concurrent-limit': String(await settings.int(SettingName.BackupConcurrentLimit)),
        },
        secret: input.secret ?? '',
        secretNamespace: input.secretNamespace ?? '',
      });
      return bi;
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
    const bi = await store.get(BackingImageKind, name, namespace);
    const image = await settings.get(SettingName.DefaultBackingImageManagerImage);
    const disk = Object.entries(bi.status?.diskFileStatusMap ?? {}).find(([, s]) => s.state === 'ready')?.[0];
    const managers = (await store.list(BackingImageManagerKind, { namespace, labelSelector: { matchLabels: { [Label.DiskUUID]: disk ?? '' } } })).items;
    const bim = managers.find((m) => m.spec?.image === image && !m.metadata.deletionTimestamp);
    const address = bim?.metadata.annotations?.[Annotation.Address];
    if (!disk || !bim || !address) throw new ActionError(`failed to find a default backing image manager for backing image ${name} download`);
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
