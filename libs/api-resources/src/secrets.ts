import { isNotFound, type Datastore, type Stored } from '@bis/datastore';
import { SecretKind, decodeSecretData, encodeSecretData, type Secret } from '@bis/controllers';
import { notFound, type ApiInput, type ResourceDefinition, type TypeSchema } from '@bis/rest-api';
import { changesOf } from './backing-image-resources.js';
import { refused, retryOnConflict } from './errors.js';

/**
 * Secrets of the standalone system (Kubernetes mode uses the cluster's Secrets): `PUT /v1/secrets/<name>` with
 * `{"data": {"KEY": "value"}}` creates or replaces one; reads return the names of its keys, never a value.
 */
export const SECRET_SCHEMA: TypeSchema = {
  id: 'secret',
  collectionMethods: ['GET'],
  resourceMethods: ['GET', 'PUT', 'DELETE'],
  resourceFields: {
    name: { type: 'string', required: true, unique: true },
    keys: { type: 'array[string]' },
    data: { type: 'map[string]', update: true },
  },
};

const NAME_RE = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;
const KEY_RE = /^[-._a-zA-Z0-9]+$/;
/** Bounds: a Kubernetes Secret holds at most 1 MiB. */
const MAX_KEYS = 64;
const MAX_TOTAL_BYTES = 1 << 20;

type StoredSecret = Stored<Secret>;

function fields(s: StoredSecret): Record<string, unknown> {
  return { name: s.metadata.name, keys: Object.keys(s.data ?? {}).sort() };
}

/** Checks `{"data": {...}}`; messages name keys, never values. */
export function checkSecretData(input: ApiInput): Record<string, string> {
  const data = input['data'];
  if (typeof data !== 'object' || data === null || Array.isArray(data)) throw refused('invalid secret: "data" must be an object of KEY: value strings');
  const entries = Object.entries(data as Record<string, unknown>);
  if (entries.length > MAX_KEYS) throw refused(`invalid secret: at most ${MAX_KEYS} keys`);
  let total = 0;
  for (const [k, v] of entries) {
    if (!KEY_RE.test(k) || k.length > 253) throw refused(`invalid secret key ${JSON.stringify(k.slice(0, 64))}: use letters, digits, '-', '_' and '.'`);
    if (typeof v !== 'string') throw refused(`invalid secret: the value of ${k} must be a string`);
    total += k.length + Buffer.byteLength(v);
  }
  if (total > MAX_TOTAL_BYTES) throw refused('invalid secret: more than 1 MiB of data');
  return Object.fromEntries(entries) as Record<string, string>;
}

export class SecretService {
  constructor(
    private readonly store: Datastore,
    private readonly namespace: string,
  ) {}

  async list(): Promise<StoredSecret[]> {
    return (await this.store.list(SecretKind, { namespace: this.namespace })).items;
  }

  async get(name: string): Promise<StoredSecret | undefined> {
    try {
      return await this.store.get(SecretKind, name, this.namespace);
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  }

  /** Decoded values (for the controllers' use through the store; never rendered by the API). */
  async values(name: string): Promise<Record<string, string> | undefined> {
    const s = await this.get(name);
    return s ? decodeSecretData(s.data) : undefined;
  }

  /** Creates or replaces the secret's data. */
  async put(name: string, input: ApiInput): Promise<StoredSecret> {
    if (!NAME_RE.test(name) || name.length > 253) throw refused(`invalid secret name ${JSON.stringify(name.slice(0, 64))}: use lower-case letters, digits, '-' and '.'`);
    const data = encodeSecretData(checkSecretData(input));
    return retryOnConflict(async () => {
      const existing = await this.get(name);
      if (existing) return this.store.update(SecretKind, { ...existing, data });
      return this.store.create(SecretKind, { apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace: this.namespace }, type: 'Opaque', data });
    });
  }

  async delete(name: string): Promise<void> {
    try {
      await this.store.delete(SecretKind, name, this.namespace);
    } catch (err) {
      if (isNotFound(err)) throw notFound(`secret ${name} not found`);
      throw err;
    }
  }
}

export function secretResource(service: SecretService, store: Datastore, namespace: string): ResourceDefinition<StoredSecret> {
  return {
    schema: SECRET_SCHEMA,
    handlers: {
      id: (s) => s.metadata.name,
      toFields: fields,
      list: () => service.list(),
      get: (_ctx, id) => service.get(id),
      update: (_ctx, id, input) => service.put(id, input),
      delete: (_ctx, id) => service.delete(id),
      changes: (signal) => changesOf(store, SecretKind, namespace, signal),
    },
  };
}

