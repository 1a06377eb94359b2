/** go-rancher ("cattle") API schema model, as served at /v1/schemas and read by Longhorn's Python client. */

export type HttpMethod = 'GET' | 'POST' | 'PUT' | 'DELETE';

/**
 * A field. `type` uses cattle's vocabulary: `string`, `int`, `float`, `boolean`, `date`, `password`, `json`,
 * `enum` (with `options`), `array[<t>]`, `map[<t>]`, or another schema id.
 */
export interface FieldSchema {
  type: string;
  default?: unknown;
  unique?: boolean;
  nullable?: boolean;
  create?: boolean;
  required?: boolean;
  update?: boolean;
  minLength?: number;
  maxLength?: number;
  min?: number;
  max?: number;
  options?: string[];
  validChars?: string;
  invalidChars?: string;
  description?: string;
}

export interface ActionSchema {
  input?: string;
  output?: string;
}

export interface TypeSchema {
  /** Schema id = resource `type`, e.g. `backingImage`. */
  id: string;
  /** Default `<id>s`. The URL segment is the lowercased plural (`backingImages` -> `backingimages`). */
  pluralName?: string;
  resourceFields: Record<string, FieldSchema>;
  resourceMethods?: HttpMethod[];
  collectionMethods?: HttpMethod[];
  resourceActions?: Record<string, ActionSchema>;
  collectionActions?: Record<string, ActionSchema>;
  collectionFields?: Record<string, FieldSchema>;
  collectionFilters?: Record<string, unknown>;
  includeableLinks?: string[];
}

export const pluralOf = (s: TypeSchema): string => s.pluralName ?? `${s.id}s`;
export const segmentOf = (s: TypeSchema): string => pluralOf(s).toLowerCase();

/** The JSON of one schema resource. */
export function schemaToJson(s: TypeSchema, base: string, hasCollection: boolean): Record<string, unknown> {
  return {
    id: s.id,
    type: 'schema',
    links: {
      self: `${base}/v1/schemas/${encodeURIComponent(s.id)}`,
      ...(hasCollection ? { collection: `${base}/v1/${segmentOf(s)}` } : {}),
    },
    actions: {},
    pluralName: pluralOf(s),
    resourceMethods: s.resourceMethods ?? [],
    resourceFields: s.resourceFields,
    resourceActions: s.resourceActions ?? {},
    collectionMethods: s.collectionMethods ?? [],
    collectionFields: s.collectionFields ?? {},
    collectionActions: s.collectionActions ?? {},
    collectionFilters: s.collectionFilters ?? {},
    includeableLinks: s.includeableLinks ?? [],
  };
}

/** Problems of `value` against field `f`; empty when it fits. Nested schema ids and `json` are not checked. */
function fieldProblem(name: string, f: FieldSchema, value: unknown): string | undefined {
  if (value === null) return f.nullable === false ? `field "${name}" must not be null` : undefined;
  const t = f.type;
  const describe = (v: unknown): string => (typeof v === 'string' ? JSON.stringify(v) : Array.isArray(v) ? 'an array' : v === null ? 'null' : typeof v === 'object' ? 'an object' : String(v));
  const scalar = (st: string, v: unknown, what: string): string | undefined => {
    switch (st) {
      case 'string':
      case 'password':
      case 'date':
        return typeof v === 'string' ? undefined : `${what} must be a string, got ${describe(v)}`;
      case 'int':
        return typeof v === 'number' && Number.isSafeInteger(v) ? undefined : `${what} must be an integer, got ${describe(v)}`;
      case 'float':
        return typeof v === 'number' && Number.isFinite(v) ? undefined : `${what} must be a number, got ${describe(v)}`;
      case 'boolean':
        return typeof v === 'boolean' ? undefined : `${what} must be true or false, got ${describe(v)}`;
      case 'enum':
        return typeof v === 'string' && (f.options ?? []).includes(v) ? undefined : `${what} must be one of ${(f.options ?? []).map((o) => JSON.stringify(o)).join(', ')}, got ${describe(v)}`;
      default:
        return undefined;
    }
  };
  const arr = /^array\[(.+)\]$/.exec(t);
  if (arr) {
    if (!Array.isArray(value)) return `field "${name}" must be an array, got ${describe(value)}`;
    for (const [i, v] of value.entries()) {
      const p = scalar(arr[1], v, `field "${name}[${i}]"`);
      if (p) return p;
    }
    return undefined;
  }
  const map = /^map\[(.+)\]$/.exec(t);
  if (map) {
    if (typeof value !== 'object' || Array.isArray(value)) return `field "${name}" must be an object, got ${describe(value)}`;
    for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
      const p = scalar(map[1], v, `field "${name}.${k}"`);
      if (p) return p;
    }
    return undefined;
  }
  const p = scalar(t, value, `field "${name}"`);
  if (p) return p;
  if (typeof value === 'string') {
    if (f.minLength !== undefined && value.length < f.minLength) return `field "${name}" must be at least ${f.minLength} characters`;
    if (f.maxLength !== undefined && value.length > f.maxLength) return `field "${name}" must be at most ${f.maxLength} characters`;
  }
  if (typeof value === 'number') {
    if (f.min !== undefined && value < f.min) return `field "${name}" must be >= ${f.min}, got ${value}`;
    if (f.max !== undefined && value > f.max) return `field "${name}" must be <= ${f.max}, got ${value}`;
  }
  return undefined;
}

/**
 * Checks a request body against a schema: it must be a JSON object and every known field must have the declared
 * type. Unknown fields are ignored and `required` is not enforced (Longhorn's server decodes bodies the same way;
 * semantic checks belong to the handlers / admission rules). Returns the problems.
 */
export function checkInput(schema: TypeSchema, body: unknown): string[] {
  if (body === undefined || body === null) return [];
  if (typeof body !== 'object' || Array.isArray(body)) return [`request body must be a JSON object`];
  const problems: string[] = [];
  for (const [name, value] of Object.entries(body as Record<string, unknown>)) {
    const f = schema.resourceFields[name];
    if (!f || value === undefined) continue;
    const p = fieldProblem(name, f, value);
    if (p) problems.push(p);
  }
  return problems;
}
