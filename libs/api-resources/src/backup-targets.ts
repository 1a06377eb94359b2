import { isNotFound, type Datastore } from '@bis/datastore';
import { BackupTargetKind, parseGoDuration, type BackupTarget, type StoredBBI } from '@bis/controllers';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import type { ApiInput, ResourceDefinition, TypeSchema } from '@bis/rest-api';
import type { Stored } from '@bis/datastore';
import { changesOf } from './backing-image-resources.js';
import { refused, retryOnConflict } from './errors.js';

export const BACKUP_TARGET_SCHEMA: TypeSchema = {
  id: 'backupTarget',
  collectionMethods: ['GET', 'POST'],
  resourceMethods: ['GET', 'PUT', 'DELETE'],
  resourceFields: {
    name: { type: 'string', required: true, unique: true, create: true },
    backupTargetURL: { type: 'string', create: true, update: true },
    credentialSecret: { type: 'string', create: true, update: true },
    pollInterval: { type: 'string', create: true, update: true },
    available: { type: 'boolean' },
    message: { type: 'string' },
    default: { type: 'boolean' },
  },
};

/** Backup target URL schemes: Longhorn's s3, nfs, cifs, azblob, and `vfs` (a mounted directory). Empty = unset. */
const SCHEMES = new Set(['s3:', 'nfs:', 'cifs:', 'azblob:', 'vfs:']);
const NAME_RE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

function checkUrl(url: string): void {
  if (url === '') return;
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw refused(`invalid backup target URL ${JSON.stringify(url)}: not a URL`);
  }
  if (!SCHEMES.has(u.protocol)) throw refused(`invalid backup target URL ${url}: the scheme must be one of s3, nfs, cifs, azblob, vfs`);
}

function checkPollInterval(v: string): void {
  if (v === '' || v === '0') return;
  if (parseGoDuration(v) === undefined) throw refused(`invalid pollInterval ${JSON.stringify(v)}: expected a Go duration such as 5m0s`);
}

type StoredTarget = Stored<BackupTarget>;

function fields(t: StoredTarget): Record<string, unknown> {
  const unavailable = (t.status?.conditions ?? []).find((c) => c.type === 'Unavailable' && c.status === 'True');
  return {
    name: t.metadata.name,
    backupTargetURL: t.spec?.backupTargetURL ?? '',
    credentialSecret: t.spec?.credentialSecret ?? '',
    pollInterval: t.spec?.pollInterval ?? '',
    available: t.status?.available ?? false,
    message: unavailable?.message ?? '',
    default: t.metadata.name === 'default',
  };
}

const str = (v: unknown): string => (typeof v === 'string' ? v.trim() : '');

export class BackupTargetService {
  constructor(
    private readonly store: Datastore,
    private readonly namespace: string,
  ) {}

  async list(): Promise<StoredTarget[]> {
    return (await this.store.list(BackupTargetKind, { namespace: this.namespace })).items;
  }

  async get(name: string): Promise<StoredTarget | undefined> {
    try {
      return await this.store.get(BackupTargetKind, name, this.namespace);
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  async create(input: ApiInput): Promise<StoredTarget> {
    const name = str(input.name);
    if (!NAME_RE.test(name)) throw refused(`invalid backup target name ${JSON.stringify(name)}: use lower-case letters, digits and '-'`);
    const url = str(input.backupTargetURL);
    const pollInterval = str(input.pollInterval) || '5m0s';
    checkUrl(url);
    checkPollInterval(pollInterval);
    return this.store.create(BackupTargetKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackupTarget',
      metadata: { name, namespace: this.namespace },
      spec: { backupTargetURL: url, credentialSecret: str(input.credentialSecret), pollInterval },
    } as BackupTarget);
  }

  async update(name: string, input: ApiInput): Promise<StoredTarget> {
    return retryOnConflict(async () => {
      const t = await this.store.get(BackupTargetKind, name, this.namespace);
      const spec = { ...(t.spec ?? {}) };
      if (input.backupTargetURL !== undefined) spec.backupTargetURL = str(input.backupTargetURL);
      if (input.credentialSecret !== undefined) spec.credentialSecret = str(input.credentialSecret);
      if (input.pollInterval !== undefined) spec.pollInterval = str(input.pollInterval);
      checkUrl(spec.backupTargetURL ?? '');
      checkPollInterval(spec.pollInterval ?? '');
      return this.store.update(BackupTargetKind, { ...t, spec });
    });
  }

  /** The default target cannot be deleted (Longhorn 1.8+); a target still holding backup records cannot either. */
  async delete(name: string, backups: () => Promise<StoredBBI[]>): Promise<void> {
    await this.store.get(BackupTargetKind, name, this.namespace);
    if (name === 'default') throw refused('cannot delete the default backup target');
    const used = (await backups()).filter((b) => (b.spec?.backupTargetName || 'default') === name);
    if (used.length) throw refused(`cannot delete backup target ${name}: backup backing images ${used.map((b) => b.metadata.name).join(', ')} belong to it`);
    await this.store.delete(BackupTargetKind, name, this.namespace);
  }
}

export function backupTargetResource(service: BackupTargetService, backups: () => Promise<StoredBBI[]>, store: Datastore, namespace: string): ResourceDefinition<StoredTarget> {
  return {
    schema: BACKUP_TARGET_SCHEMA,
    handlers: {
      id: (t) => t.metadata.name,
      toFields: fields,
      list: () => service.list(),
      get: (_ctx, id) => service.get(id),
      create: (_ctx, input) => service.create(input),
      update: (_ctx, id, input) => service.update(id, input),
      delete: (_ctx, id) => service.delete(id, backups),
      changes: (signal) => changesOf(store, BackupTargetKind, namespace, signal),
    },
  };
}
