import { isSettingName, LONGHORN_API_VERSION, SETTING_NAMES, SETTINGS, settingDefaultValue, validateSettingValue, type SettingDefinition, type SettingName } from '@bis/crd-types';
import { defineKind, isConflict, isNotFound, type Datastore, type KubeObject, type Stored } from '@bis/datastore';
import type { ApiInput, ResourceDefinition } from './api.js';
import { ApiError, notFound } from './errors.js';
import type { TypeSchema } from './schema.js';

/** The Setting CR (`settings.longhorn.io`): named after the setting, value in a top-level `value` string. */
export interface SettingObject extends KubeObject {
  value: string;
  status?: { applied?: boolean };
}
export const SettingKind = defineKind<SettingObject>({ apiVersion: LONGHORN_API_VERSION, kind: 'Setting', plural: 'settings', namespaced: true });

/** Longhorn's `types.SettingDefinition` as the API shows it (default as a string). */
export interface SettingDefinitionBody {
  displayName: string;
  description: string;
  category: string;
  type: string;
  required: boolean;
  readOnly: boolean;
  default: string;
  options?: string[];
  valueIntRange?: { min?: number; max?: number };
}

/** A setting as the API sees it: the CR if one exists, else the built-in default. */
export interface SettingView {
  name: SettingName;
  value: string;
  applied: boolean;
  definition: SettingDefinition;
}

export const SETTING_SCHEMA: TypeSchema = {
  id: 'setting',
  resourceMethods: ['GET', 'PUT'],
  collectionMethods: ['GET'],
  resourceFields: {
    name: { type: 'string', required: true, unique: true },
    value: { type: 'string', required: true, update: true, nullable: false },
    definition: { type: 'json' },
    applied: { type: 'boolean' },
  },
};

function definitionBody(d: SettingDefinition): SettingDefinitionBody {
  const body: SettingDefinitionBody = {
    displayName: d.displayName,
    description: d.description,
    category: d.category,
    type: d.type,
    required: d.required,
    readOnly: d.readOnly,
    default: String(d.default),
  };
  if (d.type === 'string' && d.options) body.options = [...d.options];
  if (d.type === 'int' && (d.min !== undefined || d.max !== undefined)) body.valueIntRange = { ...(d.min !== undefined ? { min: d.min } : {}), ...(d.max !== undefined ? { max: d.max } : {}) };
  return body;
}

export interface SettingsServiceOptions {
  store: Datastore;
  /** Namespace of the Setting CRs (Longhorn: longhorn-system). */
  namespace: string;
}

/** Reads and writes settings in the datastore with the definitions and validation of `@bis/crd-types`. */
export class SettingsService {
  constructor(private readonly opts: SettingsServiceOptions) {}

  async get(name: string): Promise<SettingView | undefined> {
    if (!isSettingName(name)) return undefined;
    try {
      const o = await this.opts.store.get(SettingKind, name, this.opts.namespace);
      return this.view(name, o);
    } catch (err) {
      if (isNotFound(err)) return { name, value: settingDefaultValue(name), applied: false, definition: SETTINGS[name] };
      throw err;
    }
  }

  async list(): Promise<SettingView[]> {
    const { items } = await this.opts.store.list(SettingKind, { namespace: this.opts.namespace });
    const byName = new Map(items.map((o) => [o.metadata.name, o]));
    return SETTING_NAMES.map((n) => {
      const o = byName.get(n);
      return o ? this.view(n, o) : { name: n, value: settingDefaultValue(n), applied: false, definition: SETTINGS[n] };
    });
  }

  /**
   * Sets a value after validating it (type, range, options; read-only settings are refused unless `system`).
   * Creates the CR when missing and retries on write conflicts.
   */
  async set(name: string, value: string, opts: { system?: boolean } = {}): Promise<SettingView> {
    if (!isSettingName(name)) throw notFound(`setting ${name} not found`);
    const d: SettingDefinition = SETTINGS[name];
    if (d.readOnly && !opts.system) throw new ApiError(500, `setting ${name} is read-only`);
    const problems = validateSettingValue(name, value);
    if (problems.length) throw new ApiError(500, `invalid value for setting ${name}: ${problems.map((p) => p.message.replace(`${name}: `, '')).join('; ')}`);
    for (let attempt = 0; ; attempt++) {
      try {
        let cur: Stored<SettingObject> | undefined;
        try {
          cur = await this.opts.store.get(SettingKind, name, this.opts.namespace);
        } catch (err) {
          if (!isNotFound(err)) throw err;
        }
        const saved = cur
          ? await this.opts.store.update(SettingKind, { ...cur, value })
          : await this.opts.store.create(SettingKind, { apiVersion: SettingKind.apiVersion, kind: SettingKind.kind, metadata: { name, namespace: this.opts.namespace }, value });
        return this.view(name, saved);
      } catch (err) {
        if (attempt < 5 && (isConflict(err) || (err as { reason?: string }).reason === 'AlreadyExists')) continue;
        throw err;
      }
    }
  }

  /**
   * Creates a CR with the default value for every setting that has none (at controller-manager start). `initial`
   * replaces the built-in default of a setting created now (a deployment's own default); existing ones are kept.
   * Without `onError` the first refused create is thrown.
   */
  async ensureDefaults(initial: Partial<Record<SettingName, string>> = {}, onError?: (name: SettingName, err: Error) => void): Promise<void> {
    for (const name of SETTING_NAMES) {
      try {
        await this.opts.store.create(SettingKind, {
          apiVersion: SettingKind.apiVersion,
          kind: SettingKind.kind,
          metadata: { name, namespace: this.opts.namespace },
          value: initial[name] ?? settingDefaultValue(name),
        });
      } catch (err) {
        if ((err as { reason?: string }).reason === 'AlreadyExists') continue;
        // With `onError`, a setting the store refuses is reported and the others are still created (a missing
        // setting reads as its built-in default).
        if (!onError) throw err;
        onError(name, err as Error);
      }
    }
  }

  /** Yields once per change of any Setting CR (for the websocket list stream). */
  async *changes(signal: AbortSignal): AsyncIterable<void> {
    const { store, namespace } = this.opts;
    const { resourceVersion } = await store.list(SettingKind, { namespace });
    for await (const _ of store.watch(SettingKind, { namespace, resourceVersion, signal })) yield;
  }

  private view(name: SettingName, o: SettingObject): SettingView {
    return { name, value: o.value ?? '', applied: o.status?.applied ?? false, definition: SETTINGS[name] };
  }
}

/** The `setting` resource: `GET /v1/settings`, `GET /v1/settings/<name>`, `PUT /v1/settings/<name>` with `{"value": "..."}`. */
export function settingsResource(service: SettingsService): ResourceDefinition<SettingView> {
  return {
    schema: SETTING_SCHEMA,
    handlers: {
      id: (s) => s.name,
      toFields: (s) => ({ name: s.name, value: s.value, definition: definitionBody(s.definition), applied: s.applied }),
      list: () => service.list(),
      get: (_ctx, id) => service.get(id),
      update: async (_ctx, id, input: ApiInput) => {
        if (typeof input.value !== 'string') throw new ApiError(500, `invalid input for setting ${id}: field "value" is required and must be a string`);
        return service.set(id, input.value);
      },
      changes: (signal) => service.changes(signal),
    },
  };
}
