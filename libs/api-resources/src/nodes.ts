import { isNotFound, type Datastore } from '@bis/datastore';
import { BackingImageKind, BackingImageManagerKind, NodeKind, ReplicaKind, type BackingImageManager, type Node, type StoredNode } from '@bis/controllers';
import { ApiError, type ApiInput, type ResourceDefinition, type TypeSchema } from '@bis/rest-api';
import { changesOf } from './backing-image-resources.js';
import { refused, retryOnConflict } from './errors.js';

export const NODE_SCHEMAS: TypeSchema[] = [
  {
    id: 'diskUpdate',
    resourceFields: {
      path: { type: 'string' },
      allowScheduling: { type: 'boolean' },
      evictionRequested: { type: 'boolean' },
      storageReserved: { type: 'int', min: 0 },
      tags: { type: 'array[string]' },
      diskType: { type: 'enum', options: ['filesystem', 'block'] },
    },
  },
  { id: 'diskUpdateInput', resourceFields: { disks: { type: 'map[diskUpdate]' } } },
];

export const NODE_SCHEMA: TypeSchema = {
  id: 'node',
  collectionMethods: ['GET'],
  resourceMethods: ['GET', 'PUT'],
  resourceActions: { diskUpdate: { input: 'diskUpdateInput', output: 'node' } },
  resourceFields: {
    name: { type: 'string' },
    address: { type: 'string' },
    allowScheduling: { type: 'boolean', update: true },
    evictionRequested: { type: 'boolean', update: true },
    tags: { type: 'array[string]', update: true },
    disks: { type: 'map[json]' },
    conditions: { type: 'json' },
    region: { type: 'string' },
    zone: { type: 'string' },
  },
};

/** Longhorn's tag rule (util.ValidateTags): letters, digits, `-`, `_`, `.`; sorted and de-duplicated. */
const TAG_RE = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
export function normalizeTags(what: string, v: unknown): string[] {
  if (v === null || v === undefined) return [];
  if (!Array.isArray(v)) throw new ApiError(400, `invalid ${what}: must be an array of strings`);
  for (const t of v) if (typeof t !== 'string' || !TAG_RE.test(t)) throw refused(`invalid tag ${JSON.stringify(t)} in ${what}: tags use letters, digits, '-', '_' and '.', and start and end with a letter or digit`);
  return [...new Set(v as string[])].sort();
}

/** The last background scrub of a disk, as its manager reports it (`BackingImageManager.status.diskScrub`). */
export type DiskScrub = NonNullable<NonNullable<BackingImageManager['status']>['diskScrub']>;

/**
 * Each disk's scrub (by disk UUID) from the managers' statuses; of several managers of one disk (an old one being
 * replaced), the one with the latest pass.
 */
export function scrubByDisk(managers: readonly BackingImageManager[]): Map<string, DiskScrub> {
  const out = new Map<string, DiskScrub>();
  for (const m of managers) {
    const uuid = m.spec?.diskUUID ?? '';
    const s = m.status?.diskScrub;
    if (!uuid || !s) continue;
    const prev = out.get(uuid);
    if (!prev || (s.lastScrubTime ?? '') > (prev.lastScrubTime ?? '')) out.set(uuid, s);
  }
  return out;
}

function nodeFields(n: StoredNode, scrub: ReadonlyMap<string, DiskScrub> = new Map()): Record<string, unknown> {
  const spec = n.spec ?? {};
  const status = n.status ?? {};
  const disks: Record<string, unknown> = {};
  for (const [name, d] of Object.entries(spec.disks ?? {})) {
    const st = status.diskStatus?.[name];
    disks[name] = {
      path: d.path ?? '',
      allowScheduling: d.allowScheduling ?? false,
      evictionRequested: d.evictionRequested ?? false,
      storageReserved: d.storageReserved ?? 0,
      tags: d.tags ?? [],
      diskType: d.diskType ?? 'filesystem',
      diskUUID: st?.diskUUID ?? '',
      storageAvailable: st?.storageAvailable ?? 0,
      storageMaximum: st?.storageMaximum ?? 0,
      storageScheduled: st?.storageScheduled ?? 0,
      scheduledReplica: st?.scheduledReplica ?? {},
      scheduledBackingImage: st?.scheduledBackingImage ?? {},
      conditions: st?.conditions ?? [],
      // our extension: the disk's last scrub (null before its manager reported one)
      scrub: scrubFields(scrub.get(st?.diskUUID ?? '')),
    };
  }
  return {
    name: n.metadata.name,
    address: n.metadata.annotations?.['bis.longhorn.io/node-address'] ?? '',
    allowScheduling: spec.allowScheduling ?? false,
    evictionRequested: spec.evictionRequested ?? false,
    tags: spec.tags ?? [],
    disks,
    conditions: status.conditions ?? [],
    region: status.region ?? '',
    zone: status.zone ?? '',
    autoEvicting: status.autoEvicting ?? false,
  };
}

function scrubFields(s: DiskScrub | undefined): Record<string, unknown> | null {
  if (!s) return null;
  return {
    lastScrubTime: s.lastScrubTime ?? '',
    lastScrubResult: s.lastScrubResult ?? '',
    lastScrubMessage: s.lastScrubMessage ?? '',
    lastScrubFiles: s.lastScrubFiles ?? 0,
    scrubbing: s.scrubbing ?? '',
  };
}

type DiskSpec = NonNullable<NonNullable<Node['spec']>['disks']>[string];

/** The `node` resource: list/get, `PUT` of allowScheduling / evictionRequested / tags, and the `diskUpdate` action. */
export class NodeService {
  constructor(
    private readonly store: Datastore,
    private readonly namespace: string,
  ) {}

  /** The disks' scrubs as last read (by `list` and `get`), shown with each disk. */
  #scrub: ReadonlyMap<string, DiskScrub> = new Map();

  /** Reads the disks' scrubs from the managers' statuses. */
  async refreshScrub(): Promise<ReadonlyMap<string, DiskScrub>> {
    this.#scrub = scrubByDisk((await this.store.list(BackingImageManagerKind, { namespace: this.namespace })).items);
    return this.#scrub;
  }

  get scrub(): ReadonlyMap<string, DiskScrub> {
    return this.#scrub;
  }

  async list(): Promise<StoredNode[]> {
    await this.refreshScrub();
    return (await this.store.list(NodeKind, { namespace: this.namespace })).items;
  }

  async get(name: string): Promise<StoredNode | undefined> {
    await this.refreshScrub();
    try {
      return await this.store.get(NodeKind, name, this.namespace);
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  /** Only the fields present in the body change (the Python client sends just what it updates). */
  async update(name: string, input: ApiInput): Promise<StoredNode> {
    return retryOnConflict(async () => {
      const n = await this.store.get(NodeKind, name, this.namespace);
      const spec = { ...(n.spec ?? {}) };
      if (input.allowScheduling !== undefined) spec.allowScheduling = input.allowScheduling === true;
      if (input.evictionRequested !== undefined) spec.evictionRequested = input.evictionRequested === true;
      if (input.tags !== undefined) spec.tags = normalizeTags(`tags of node ${name}`, input.tags);
      return this.store.update(NodeKind, { ...n, spec });
    });
  }

  /**
   * `diskUpdate`: the new disk map of the node. Disks keep their names; a new name adds a disk (its path must be
   * set and not used by another disk of the node); a missing name removes the disk, which is refused while
   * scheduling is enabled on it or replicas or backing-image copies are on it.
   */
  async diskUpdate(name: string, input: ApiInput): Promise<StoredNode> {
    const wanted = input.disks;
    if (!wanted || typeof wanted !== 'object' || Array.isArray(wanted)) throw new ApiError(400, 'invalid input for action diskUpdate: field "disks" is required and must be an object');
    return retryOnConflict(async () => {
      const n = await this.store.get(NodeKind, name, this.namespace);
      const current = n.spec?.disks ?? {};
      const next: Record<string, DiskSpec> = {};
      const paths = new Map<string, string>();
      for (const [diskName, raw] of Object.entries(wanted as Record<string, Record<string, unknown>>)) {
        const old = current[diskName];
        const path = typeof raw.path === 'string' && raw.path !== '' ? raw.path : (old?.path ?? '');
        if (!path) throw refused(`invalid disk ${diskName} on node ${name}: path is required`);
        if (old && old.path && path !== old.path) throw refused(`invalid disk ${diskName} on node ${name}: the path of an existing disk cannot change (${old.path} -> ${path})`);
        const other = paths.get(path);
        if (other) throw refused(`invalid disks on node ${name}: disks ${other} and ${diskName} have the same path ${path}`);
        paths.set(path, diskName);
        const reserved = raw.storageReserved ?? old?.storageReserved ?? 0;
        if (typeof reserved !== 'number' || !Number.isSafeInteger(reserved) || reserved < 0) throw refused(`invalid disk ${diskName} on node ${name}: storageReserved must be a non-negative integer`);
        next[diskName] = {
          ...(old ?? {}),
          path,
          allowScheduling: typeof raw.allowScheduling === 'boolean' ? raw.allowScheduling : (old?.allowScheduling ?? true),
          evictionRequested: typeof raw.evictionRequested === 'boolean' ? raw.evictionRequested : (old?.evictionRequested ?? false),
          storageReserved: reserved,
          tags: raw.tags !== undefined ? normalizeTags(`tags of disk ${diskName}`, raw.tags) : (old?.tags ?? []),
          diskType: (raw.diskType === 'block' ? 'block' : (old?.diskType ?? 'filesystem')) as DiskSpec['diskType'],
        };
      }
      for (const [diskName, old] of Object.entries(current)) {
        if (diskName in next) continue;
        const uuid = n.status?.diskStatus?.[diskName]?.diskUUID ?? '';
        if (old.allowScheduling) throw refused(`cannot remove disk ${diskName} from node ${name}: scheduling is still enabled on it; disable it first`);
        if (uuid && (await this.diskInUse(uuid))) throw refused(`cannot remove disk ${diskName} from node ${name}: replicas or backing image copies are still on it; evict them first`);
      }
      return this.store.update(NodeKind, { ...n, spec: { ...(n.spec ?? {}), disks: next } });
    });
  }

  private async diskInUse(diskUUID: string): Promise<boolean> {
    const replicas = await this.store.list(ReplicaKind, { namespace: this.namespace });
    if (replicas.items.some((r) => r.spec.diskID === diskUUID)) return true;
    const bis = await this.store.list(BackingImageKind, { namespace: this.namespace });
    return bis.items.some((bi) => diskUUID in (bi.spec?.diskFileSpecMap ?? {}) || diskUUID in (bi.status?.diskFileStatusMap ?? {}));
  }
}

export function nodeResource(service: NodeService, store: Datastore, namespace: string): ResourceDefinition<StoredNode> {
  return {
    schema: NODE_SCHEMA,
    handlers: {
      id: (n) => n.metadata.name,
      toFields: (n) => nodeFields(n, service.scrub),
      list: () => service.list(),
      get: (_ctx, id) => service.get(id),
      update: (_ctx, id, input) => service.update(id, input),
      actions: { diskUpdate: (_ctx, id, input) => service.diskUpdate(id, input) },
      changes: (signal) => changesOf(store, NodeKind, namespace, signal),
    },
  };
}
