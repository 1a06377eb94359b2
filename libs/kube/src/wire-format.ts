import { KINDS, LONGHORN_API_VERSION, type KindDefinition, type Schema } from '@bis/crd-types';

/**
 * How objects of the Longhorn kinds travel to and from the API server: Go's `omitempty` for optional strings.
 *
 * Longhorn's Go types never hand the API server an empty optional string it would have to validate as such, and some
 * API servers cannot: kube-apiserver 1.20 built with Go >= 1.16 rejects every empty string in a custom resource as
 * `"null"` (kubernetes/kubernetes#99804, fixed in 1.21). So, driven by the `@bis/crd-types` schema of the kind:
 *
 * - **on write** (`toWire`): a string property that the schema does not list in its object's `required` is left out
 *   when it is `''`, at any depth (inside nested objects, array items and map values that are objects). Required
 *   properties are always sent, even empty; map values and array items are data, never dropped.
 * - **on read** (`fromWire`): a non-nullable optional string property that is absent from an object present in the
 *   answer reads as `''`, as a Go struct field does after unmarshalling. So what a controller wrote reads back the
 *   same, and comparing the stored status with a recomputed one does not see a difference that is only the wire's.
 *   Nullable strings (Go pointers, e.g. `lastSyncedAt`) are not filled: absent stays absent.
 *
 * `metadata`, `apiVersion` and `kind` are not in the kinds' schemas and pass unchanged; kinds without a schema here
 * (other groups, the contract suite's kinds) pass unchanged.
 */
export class WireFormat {
  private readonly roots = new Map<string, Schema>();

  constructor(defs: readonly KindDefinition[] = KINDS, apiVersion: string = LONGHORN_API_VERSION) {
    for (const d of defs) this.roots.set(`${apiVersion}/${d.kind}`, d.root);
  }

  private rootOf(obj: unknown, kind?: { apiVersion: string; kind: string }): Schema | undefined {
    const o = obj as { apiVersion?: unknown; kind?: unknown } | null;
    const apiVersion = kind?.apiVersion ?? (typeof o?.apiVersion === 'string' ? o.apiVersion : '');
    const k = kind?.kind ?? (typeof o?.kind === 'string' ? o.kind : '');
    return this.roots.get(`${apiVersion}/${k}`);
  }

  /** Whether objects of this kind are transformed. */
  knows(kind: { apiVersion: string; kind: string }): boolean {
    return this.roots.has(`${kind.apiVersion}/${kind.kind}`);
  }

  /** The body to send for `obj` (a new object; `obj` is not modified). */
  toWire<T>(obj: T, kind?: { apiVersion: string; kind: string }): T {
    const root = this.rootOf(obj, kind);
    return root ? (omitEmpty(root, obj) as T) : obj;
  }

  /** The object as the code reads it (a new object; `obj` is not modified). */
  fromWire<T>(obj: T, kind?: { apiVersion: string; kind: string }): T {
    const root = this.rootOf(obj, kind);
    return root ? (fillEmpty(root, obj) as T) : obj;
  }
}

const isPlainObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

function omitEmpty(schema: Schema, value: unknown): unknown {
  if (value === null || value === undefined) return value;
  switch (schema.type) {
    case 'object': {
      if (!isPlainObject(value)) return value;
      const required = new Set<string>(schema.required);
      const out: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(value)) {
        const p = schema.properties[k];
        if (!p) {
          out[k] = v;
          continue;
        }
        if (p.type === 'string' && v === '' && !required.has(k)) continue;
        out[k] = omitEmpty(p, v);
      }
      return out;
    }
    case 'array':
      return Array.isArray(value) ? value.map((v) => omitEmpty(schema.items, v)) : value;
    case 'map':
      return isPlainObject(value) ? Object.fromEntries(Object.entries(value).map(([k, v]) => [k, omitEmpty(schema.values, v)])) : value;
    default:
      return value;
  }
}

function fillEmpty(schema: Schema, value: unknown): unknown {
  if (value === null || value === undefined) return value;
  switch (schema.type) {
    case 'object': {
      if (!isPlainObject(value)) return value;
      const out: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(value)) {
        const p = schema.properties[k];
        out[k] = p ? fillEmpty(p, v) : v;
      }
      for (const [k, p] of Object.entries(schema.properties)) {
        if (p.type === 'string' && !p.nullable && !(k in out)) out[k] = '';
      }
      return out;
    }
    case 'array':
      return Array.isArray(value) ? value.map((v) => fillEmpty(schema.items, v)) : value;
    case 'map':
      return isPlainObject(value) ? Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fillEmpty(schema.values, v)])) : value;
    default:
      return value;
  }
}
