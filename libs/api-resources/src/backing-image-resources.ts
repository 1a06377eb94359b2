import type { Datastore, KubeObject, ResourceKind } from '@bis/datastore';
import { BackingImageKind, BackupBackingImageKind, type StoredBBI, type StoredBI } from '@bis/controllers';
import type { ApiResource, ResourceDefinition, TypeSchema } from '@bis/rest-api';
import type { BackingImageService } from './backing-images.js';
import { goTimeString } from './errors.js';
import type { UploadProxy } from './upload-proxy.js';

/** Output of the resumable-upload actions: bytes of the declared `size` the data source has accepted. */
export const UPLOAD_PROGRESS_SCHEMA: TypeSchema = {
  id: 'backingImageUploadProgress',
  resourceFields: { size: { type: 'int' }, offset: { type: 'int' } },
};

export const BACKING_IMAGE_INPUT_SCHEMAS: TypeSchema[] = [
  {
    id: 'backingImageDiskFileStatus',
    resourceFields: {
      dataEngine: { type: 'string' },
      state: { type: 'string' },
      progress: { type: 'int' },
      message: { type: 'string' },
      lastStateTransitionTime: { type: 'string' },
      retryCount: { type: 'int' },
      nextRetryAt: { type: 'string' },
    },
  },
  { id: 'backingImageCleanupInput', resourceFields: { disks: { type: 'array[string]' } } },
  { id: 'updateMinNumberOfCopiesInput', resourceFields: { minNumberOfCopies: { type: 'int' } } },
  { id: 'backingImageRestoreInput', resourceFields: { secret: { type: 'string' }, secretNamespace: { type: 'string' }, dataEngine: { type: 'string' } } },
  UPLOAD_PROGRESS_SCHEMA,
];

export const BACKING_IMAGE_SCHEMA: TypeSchema = {
  id: 'backingImage',
  collectionMethods: ['GET', 'POST'],
  resourceMethods: ['GET', 'DELETE'],
  resourceActions: {
    backingImageCleanup: { input: 'backingImageCleanupInput', output: 'backingImage' },
    upload: {},
    backupBackingImageCreate: {},
    updateMinNumberOfCopies: { input: 'updateMinNumberOfCopiesInput', output: 'backingImage' },
    uploadOffset: { output: 'backingImageUploadProgress' },
    uploadPart: { output: 'backingImageUploadProgress' },
  },
  resourceFields: {
    name: { type: 'string', required: true, unique: true, create: true },
    uuid: { type: 'string' },
    sourceType: { type: 'string', required: true, create: true },
    parameters: { type: 'map[string]', required: true, create: true },
    expectedChecksum: { type: 'string', create: true },
    minNumberOfCopies: { type: 'int', create: true },
    nodeSelector: { type: 'array[string]', create: true },
    diskSelector: { type: 'array[string]', create: true },
    secret: { type: 'string', create: true },
    secretNamespace: { type: 'string', create: true },
    dataEngine: { type: 'string', create: true },
    diskFileStatusMap: { type: 'map[backingImageDiskFileStatus]' },
    size: { type: 'int' },
    virtualSize: { type: 'int' },
    currentChecksum: { type: 'string' },
    deletionTimestamp: { type: 'string' },
    conditions: { type: 'json' },
  },
};

export const BACKUP_BACKING_IMAGE_SCHEMA: TypeSchema = {
  id: 'backupBackingImage',
  collectionMethods: ['GET'],
  resourceMethods: ['GET', 'DELETE'],
  resourceActions: { backupBackingImageRestore: { input: 'backingImageRestoreInput' } },
  resourceFields: {
    name: { type: 'string' },
    state: { type: 'string' },
    progress: { type: 'int' },
    error: { type: 'string' },
    url: { type: 'string' },
    created: { type: 'string' },
    size: { type: 'int' },
    labels: { type: 'map[string]' },
    messages: { type: 'map[string]' },
    compressionMethod: { type: 'string' },
    secret: { type: 'string' },
    secretNamespace: { type: 'string' },
    backingImageName: { type: 'string' },
    backupTargetName: { type: 'string' },
  },
};

/** `toBackingImageResource` (§2.3): every field always present; placeholders for disks not yet in the status. */
export function backingImageFields(bi: StoredBI): Record<string, unknown> {
  const spec = bi.spec ?? {};
  const status = bi.status ?? {};
  const diskFileStatusMap: Record<string, unknown> = {};
  for (const [disk, s] of Object.entries(status.diskFileStatusMap ?? {})) {
    diskFileStatusMap[disk] = {
      dataEngine: s.dataEngine ?? '',
      state: s.state ?? '',
      progress: s.progress ?? 0,
      message: s.message ?? '',
      lastStateTransitionTime: s.lastStateTransitionTime ?? '',
      // additions to Longhorn's fields, present only while a failed copy waits for its next attempt
      ...(s.retryCount ? { retryCount: s.retryCount } : {}),
      ...(s.nextRetryAt ? { nextRetryAt: s.nextRetryAt } : {}),
    };
  }
  for (const [disk, s] of Object.entries(spec.diskFileSpecMap ?? {})) {
    if (!(disk in diskFileStatusMap)) diskFileStatusMap[disk] = { dataEngine: s.dataEngine ?? spec.dataEngine ?? 'v1', state: '', progress: 0, message: 'File processing is not started', lastStateTransitionTime: '' };
  }
  return {
    name: bi.metadata.name,
    uuid: status.uuid ?? '',
    sourceType: spec.sourceType ?? '',
    parameters: spec.sourceParameters ?? null,
    diskSelector: spec.diskSelector ?? null,
    nodeSelector: spec.nodeSelector ?? null,
    minNumberOfCopies: spec.minNumberOfCopies ?? 0,
    expectedChecksum: spec.checksum ?? '',
    dataEngine: spec.dataEngine ?? '',
    diskFileStatusMap,
    size: status.size ?? 0,
    virtualSize: status.virtualSize ?? 0,
    currentChecksum: status.checksum ?? '',
    secret: spec.secret ?? '',
    secretNamespace: spec.secretNamespace ?? '',
    deletionTimestamp: bi.metadata.deletionTimestamp ? goTimeString(bi.metadata.deletionTimestamp) : '',
    // Not in Longhorn's API: MinCopiesSatisfiable (False when minNumberOfCopies exceeds the disks the selectors allow).
    conditions: (status.conditions ?? []).map((c) => ({ type: c.type ?? '', status: c.status ?? '', reason: c.reason ?? '', message: c.message ?? '', lastTransitionTime: c.lastTransitionTime ?? '' })),
  };
}

/** `toBackupBackingImageResource` (§2.3). */
export function backupBackingImageFields(bbi: StoredBBI): Record<string, unknown> {
  const spec = bbi.spec ?? { backingImage: '', userCreated: false };
  const status = bbi.status ?? {};
  return {
    name: bbi.metadata.name,
    state: status.state ?? '',
    progress: status.progress ?? 0,
    error: status.error ?? '',
    url: status.url ?? '',
    created: status.backupCreatedAt ?? '',
    size: status.size ?? 0,
    labels: status.labels ?? null,
    messages: status.messages ?? null,
    compressionMethod: status.compressionMethod ?? '',
    secret: status.secret ?? '',
    secretNamespace: status.secretNamespace ?? '',
    backingImageName: spec.backingImage ?? '',
    backupTargetName: spec.backupTargetName ?? '',
  };
}

/** Yields once per change of any object of `kind` in `namespace` (for the websocket list streams). */
export async function* changesOf<T extends KubeObject>(store: Datastore, kind: ResourceKind<T>, namespace: string, signal: AbortSignal): AsyncIterable<void> {
  const { resourceVersion } = await store.list(kind, { namespace });
  for await (const ev of store.watch(kind, { namespace, resourceVersion, signal })) if (ev.type !== 'BOOKMARK') yield;
}

export function backingImageResource(service: BackingImageService, uploads: UploadProxy, store: Datastore, namespace: string): ResourceDefinition<StoredBI> {
  return {
    schema: BACKING_IMAGE_SCHEMA,
    handlers: {
      id: (bi) => bi.metadata.name,
      toFields: (bi) => backingImageFields(bi),
      renderDependsOnObjectOnly: true,
      list: () => service.list(),
      get: (_ctx, id) => service.get(id),
      create: (_ctx, input) => service.create(input),
      delete: (_ctx, id) => service.delete(id),
      actions: {
        backingImageCleanup: (_ctx, id, input) => service.cleanup(id, Array.isArray(input.disks) ? input.disks.map(String) : []),
        updateMinNumberOfCopies: (_ctx, id, input) => service.updateMinNumberOfCopies(id, input.minNumberOfCopies),
        backupBackingImageCreate: async (_ctx, id, input) => {
          await service.createBackup(id, typeof input.backupTargetName === 'string' ? input.backupTargetName : '');
        },
        upload: async (ctx, id) => {
          await uploads.upload(ctx, id);
        },
        uploadOffset: async (ctx, id): Promise<ApiResource> => progressResource(ctx.baseUrl, id, await uploads.offset(ctx, id)),
        uploadPart: async (ctx, id): Promise<ApiResource> => progressResource(ctx.baseUrl, id, await uploads.part(ctx, id)),
      },
      changes: (signal) => changesOf(store, BackingImageKind, namespace, signal),
    },
  };
}

function progressResource(baseUrl: string, id: string, p: { size: number; offset: number }): ApiResource {
  return { id, type: UPLOAD_PROGRESS_SCHEMA.id, links: { self: `${baseUrl}/v1/backingimages/${encodeURIComponent(id)}` }, actions: {}, size: p.size, offset: p.offset };
}

export function backupBackingImageResource(service: BackingImageService, store: Datastore, namespace: string): ResourceDefinition<StoredBBI> {
  return {
    schema: BACKUP_BACKING_IMAGE_SCHEMA,
    handlers: {
      id: (b) => b.metadata.name,
      toFields: (b) => backupBackingImageFields(b),
      list: () => service.listBackups(),
      get: (_ctx, id) => service.getBackup(id),
      delete: (_ctx, id) => service.deleteBackup(id),
      actions: {
        backupBackingImageRestore: async (_ctx, id, input) => {
          await service.restoreBackup(id, input);
        },
      },
      changes: (signal) => changesOf(store, BackupBackingImageKind, namespace, signal),
    },
  };
}
