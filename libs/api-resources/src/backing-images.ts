import { isNotFound, sharedReadsOf, type Stored } from '@bis/datastore';
import {
  ActionError,
  BackingImageActions,
  BackingImageDataSourceKind,
  BackingImageKind,
  BackupBackingImageKind,
  type BackupBackingImage,
  type CreateBackingImageInput,
  type StoredBI,
  type StoredBIDS,
} from '@bis/controllers';
import { ApiError, messageChain, statusOf } from '@bis/rest-api';
import type { BackingImageApiDeps } from './deps.js';

/** The fields of `POST /v1/backingimages` (Longhorn's `api.BackingImage` as decoded from the request). */
export type CreateBackingImageRequest = CreateBackingImageInput;

/** An action's refusal becomes Longhorn's REST answer: 500 with the message. Other errors (NotFound → 404, …) pass. */
async function rest<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof ActionError) throw new ApiError(500, err.message, { cause: err });
    throw err;
  }
}

/** Go's `%v` of a decoded JSON value, for the values of a create request. */
function goValue(v: unknown): string {
  if (v === undefined || v === null) return '';
  if (typeof v === 'string') return v;
  if (typeof v === 'object') return Array.isArray(v) ? `[${v.map(goValue).join(' ')}]` : goMap(v);
  return String(v);
}

/** Go's `%+v` of a `map[string]string`: `map[k1:v1 k2:v2]`, keys sorted. */
export function goMap(v: unknown): string {
  const entries = v && typeof v === 'object' && !Array.isArray(v) ? Object.entries(v as Record<string, unknown>) : [];
  entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `map[${entries.map(([k, x]) => `${k}:${goValue(x)}`).join(' ')}]`;
}

/**
 * The backing-image operations behind the REST resources. Reads are plain store reads; every write is
 * `BackingImageActions` from `@bis/controllers` (the one implementation of the actions' logic and webhooks).
 */
export class BackingImageService {
  readonly actions: BackingImageActions;

  constructor(private readonly d: BackingImageApiDeps) {
    this.actions = new BackingImageActions({
      store: d.store,
      namespace: d.namespace,
      settings: d.settings,
      downloadUrlPolicy: d.downloadUrlPolicy,
      secretExists: d.secretExists,
    });
  }

  private get ns(): string {
    return this.d.namespace;
  }

  /** The images; from an embedded store, its own objects (no copies: the REST list renders only those that changed). */
  async list(): Promise<StoredBI[]> {
    const shared = sharedReadsOf(this.d.store);
    if (shared) return [...shared.listShared(BackingImageKind, { namespace: this.ns }).items];
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
  replicaDisks(name: string): Promise<Set<string>> {
    return this.actions.replicaDisks(name);
  }

  /** Create (§2.4): `BackingImageActions.create` (mutator defaults, schema and validator checks). */
  async create(req: CreateBackingImageRequest): Promise<StoredBI> {
    try {
      return await this.actions.create(req);
    } catch (err) {
      // Longhorn's api/backingimage.go wraps every create error this way (the cause keeps its 404 when it is one).
      const message = `failed to create backing image ${goValue(req.name)} from source type ${goValue(req.sourceType)} with parameters ${goMap(req.parameters)}: ${messageChain(err)}`;
      throw new ApiError(err instanceof ActionError ? 500 : statusOf(err), message, { cause: err });
    }
  }

  /** DELETE: refused while replicas use the image; Foreground propagation like Longhorn. */
  delete(name: string): Promise<void> {
    return rest(() => this.actions.delete(name));
  }

  /** `backingImageCleanup` (§2.5), with Longhorn's counting fault fixed (see `cleanupRefusal` in `@bis/controllers`). */
  cleanup(name: string, disks: readonly string[]): Promise<StoredBI> {
    return rest(() => this.actions.cleanupDiskFiles(name, disks));
  }

  /** `updateMinNumberOfCopies`: every failure is an error body (Longhorn drops the connection on a failed update). */
  updateMinNumberOfCopies(name: string, n: unknown): Promise<StoredBI> {
    return rest(() => this.actions.updateMinNumberOfCopies(name, n));
  }

  /** `backupBackingImageCreate`: a BBI `<bi>-<8 hex>` for the target (default `default`), through the BBI webhooks. */
  createBackup(biName: string, backupTargetName: string): Promise<Stored<BackupBackingImage>> {
    return rest(() => this.actions.createBackup(biName, backupTargetName));
  }

  /** `backupBackingImageRestore` (§2.5): creates BI `bbi.spec.backingImage` of type restore. */
  async restoreBackup(bbiName: string, input: { secret?: unknown; secretNamespace?: unknown; dataEngine?: unknown }): Promise<void> {
    await rest(() => this.actions.restoreBackup(bbiName, input));
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

  deleteBackup(name: string): Promise<void> {
    return rest(() => this.actions.deleteBackup(name));
  }
}
