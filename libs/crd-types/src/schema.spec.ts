import { describe, expect, it } from '@jest/globals';
import { BACKING_IMAGE, BACKUP_BACKING_IMAGE, KINDS, NODE, SETTING, type KindDefinition } from './kinds/index.js';
import { ValidationError } from './schema/errors.js';
import { assertValidObject, validateObject } from './validate-object.js';
import { s } from './schema/model.js';
import { toOpenApi, type OpenApiSchema } from './schema/openapi.js';
import { validateAgainstSchema } from './schema/validate.js';
import {
  fullBackingImage,
  fullBackingImageDataSource,
  fullBackingImageManager,
  fullBackupBackingImage,
  fullBackupTarget,
  fullNode,
  fullSetting,
} from './test-support/fixtures.js';

const FULL: Record<string, () => unknown> = {
  BackingImage: fullBackingImage,
  BackingImageDataSource: fullBackingImageDataSource,
  BackingImageManager: fullBackingImageManager,
  BackupBackingImage: fullBackupBackingImage,
  Setting: fullSetting,
  Node: fullNode,
  BackupTarget: fullBackupTarget,
};

/** Every leaf and container path of a schema model (map values as `[*]`, array items as `[]`). */
function schemaFieldPaths(def: KindDefinition): string[] {
  const out: string[] = [];
  const walk = (schema: Parameters<typeof toOpenApi>[0], path: string) => {
    out.push(path);
    if (schema.type === 'object') for (const [k, v] of Object.entries(schema.properties)) walk(v, path ? `${path}.${k}` : k);
    if (schema.type === 'map') walk(schema.values, `${path}[*]`);
    if (schema.type === 'array') walk(schema.items, `${path}[]`);
  };
  walk(def.root, '');
  return out.filter((p) => p !== '');
}

/** The schema paths that a value actually populates (walks the value guided by the schema). */
function populatedPaths(schema: Parameters<typeof toOpenApi>[0], value: unknown, path: string, out: Set<string>): void {
  if (path) out.add(path);
  if (value === null || value === undefined) return;
  if (schema.type === 'object') {
    for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
      const child = schema.properties[k];
      if (child) populatedPaths(child, v, path ? `${path}.${k}` : k, out);
    }
  }
  if (schema.type === 'map') for (const v of Object.values(value as object)) populatedPaths(schema.values, v, `${path}[*]`, out);
  if (schema.type === 'array') for (const v of value as unknown[]) populatedPaths(schema.items, v, `${path}[]`, out);
}

const OPENAPI_KEYS = new Set([
  'additionalProperties', 'default', 'description', 'enum', 'format', 'items', 'maximum', 'minimum', 'nullable',
  'properties', 'required', 'type', 'x-kubernetes-preserve-unknown-fields',
]);

/** Structural OpenAPI v3 checks as the API server applies them to CRD schemas. Returns the problems found. */
function openApiProblems(schema: OpenApiSchema, path: string): string[] {
  const out: string[] = [];
  for (const key of Object.keys(schema)) if (!OPENAPI_KEYS.has(key)) out.push(`${path}: unexpected key ${key}`);
  const type = schema.type;
  if (type === undefined && !schema['x-kubernetes-preserve-unknown-fields']) out.push(`${path}: missing type`);
  if (type !== undefined && !['string', 'integer', 'boolean', 'array', 'object'].includes(type)) out.push(`${path}: bad type ${type}`);
  if (type === 'array' && !schema.items) out.push(`${path}: array without items`);
  if (type !== 'array' && schema.items) out.push(`${path}: items on ${type}`);
  if (type !== 'object' && (schema.properties || schema.additionalProperties)) out.push(`${path}: properties on ${type}`);
  if (schema.properties && schema.additionalProperties) out.push(`${path}: both properties and additionalProperties`);
  for (const r of schema.required ?? []) if (!schema.properties?.[r]) out.push(`${path}: required ${r} is not a property`);
  if (schema.enum) {
    if (type !== 'string') out.push(`${path}: enum on ${type}`);
    for (const e of schema.enum) if (typeof e !== 'string') out.push(`${path}: non-string enum value`);
  }
  if (schema.format !== undefined && !(type === 'string' && schema.format === 'date-time') && !(type === 'integer' && schema.format === 'int64')) {
    out.push(`${path}: format ${schema.format} on ${type}`);
  }
  if (schema.default !== undefined) {
    if (typeof schema.default !== (type === 'integer' ? 'number' : type)) out.push(`${path}: default of wrong type`);
    if (schema.enum && !schema.enum.includes(String(schema.default))) out.push(`${path}: default not in enum`);
  }
  if (schema.nullable !== undefined && typeof schema.nullable !== 'boolean') out.push(`${path}: nullable not boolean`);
  for (const [k, v] of Object.entries(schema.properties ?? {})) out.push(...openApiProblems(v, `${path}.${k}`));
  if (schema.items) out.push(...openApiProblems(schema.items, `${path}[]`));
  if (schema.additionalProperties) out.push(...openApiProblems(schema.additionalProperties, `${path}[*]`));
  return out;
}

describe('schema model round trip', () => {
  it.each(KINDS.map((k) => [k.kind, k] as const))('a fully populated %s validates and uses every field', (kind, def) => {
    const obj = FULL[kind]!();
    expect(validateObject(def, obj)).toEqual([]);
    expect(() => assertValidObject(def, obj)).not.toThrow();
    // The fixture exercises every field of the schema model: no field of the model is left untested.
    const { apiVersion: _a, kind: _k, metadata: _m, ...rest } = obj as Record<string, unknown>;
    const valuePaths = new Set<string>();
    populatedPaths(def.root, rest, '', valuePaths);
    const missing = schemaFieldPaths(def).filter((p) => !valuePaths.has(p));
    expect(missing).toEqual([]);
  });

  it.each(KINDS.map((k) => [k.kind, k] as const))('the OpenAPI schema of %s is structurally valid', (_kind, def) => {
    const openApi = toOpenApi(def.root);
    expect(openApiProblems(openApi, def.kind)).toEqual([]);
    // every field of the model appears in the OpenAPI schema
    const openApiPaths: string[] = [];
    const walk = (sch: OpenApiSchema, path: string) => {
      if (path) openApiPaths.push(path);
      for (const [k, v] of Object.entries(sch.properties ?? {})) walk(v, path ? `${path}.${k}` : k);
      if (sch.items) walk(sch.items, `${path}[]`);
      if (sch.additionalProperties) walk(sch.additionalProperties, `${path}[*]`);
    };
    walk(openApi, '');
    expect(openApiPaths.sort()).toEqual(schemaFieldPaths(def).sort());
  });

  it('the structural checker used above rejects broken schemas (it can fail)', () => {
    expect(openApiProblems({ type: 'object', required: ['x'], properties: {} }, 'r')).toEqual(['r: required x is not a property']);
    expect(openApiProblems({ type: 'array' }, 'r')).toEqual(['r: array without items']);
    expect(openApiProblems({ properties: { a: { type: 'string' } } }, 'r')).toContain('r: missing type');
  });
});

describe('validateObject', () => {
  it('names the field path and the rule, and collects every issue', () => {
    const bi = fullBackingImage() as unknown as Record<string, any>;
    bi.spec.sourceType = 'ftp';
    bi.spec.minNumberOfCopies = 1.5;
    bi.spec.diskFileSpecMap['disk-uuid-1'].dataEngine = 'v3';
    bi.status.diskFileStatusMap['disk-uuid-1'].state = 'bogus';
    bi.spec.nodeSelector = ['a', 7];
    bi.spec.typo = true;
    bi.spec.disks = null;
    const issues = validateObject(BACKING_IMAGE, bi);
    expect(issues.map((i) => [i.path, i.rule])).toEqual(
      expect.arrayContaining([
        ['spec.sourceType', 'enum'],
        ['spec.minNumberOfCopies', 'type'],
        ['spec.diskFileSpecMap[disk-uuid-1].dataEngine', 'enum'],
        ['status.diskFileStatusMap[disk-uuid-1].state', 'enum'],
        ['spec.nodeSelector[1]', 'type'],
        ['spec.typo', 'unknown-field'],
        ['spec.disks', 'nullable'],
      ]),
    );
    expect(issues).toHaveLength(7);
    expect(issues.find((i) => i.path === 'spec.sourceType')!.message).toBe(
      'spec.sourceType: must be one of "download", "upload", "export-from-volume", "restore", "clone" (got "ftp")',
    );
  });

  it('nullable fields accept null, date-time fields check their format', () => {
    const bi = fullBackingImage();
    bi.status!.diskFileStatusMap = null;
    expect(validateObject(BACKING_IMAGE, bi)).toEqual([]);
    const bbi = fullBackupBackingImage();
    bbi.spec!.syncRequestedAt = 'yesterday';
    expect(validateObject(BACKUP_BACKING_IMAGE, bbi).map((i) => i.message)).toEqual([
      'spec.syncRequestedAt: must be an RFC 3339 date-time (got "yesterday")',
    ]);
  });

  it('checks required members, apiVersion and kind', () => {
    const bbi = fullBackupBackingImage() as unknown as Record<string, any>;
    delete bbi.spec.userCreated;
    bbi.apiVersion = 'longhorn.io/v1beta1';
    const issues = validateObject(BACKUP_BACKING_IMAGE, bbi);
    expect(issues.map((i) => i.message)).toEqual([
      'apiVersion: must be "longhorn.io/v1beta2" (got "longhorn.io/v1beta1")',
      'spec.userCreated: is required',
    ]);
    const setting = fullSetting() as unknown as Record<string, any>;
    delete setting.value;
    setting.kind = 'Settings';
    expect(validateObject(SETTING, setting).map((i) => i.path)).toEqual(['kind', 'value']);
    expect(validateObject(NODE, 'node-1')).toEqual([{ path: '(root)', rule: 'type', message: '(root): must be a Node object' }]);
  });

  it('assertValidObject throws a ValidationError listing all issues', () => {
    const bi = fullBackingImage() as unknown as Record<string, any>;
    bi.spec.checksum = 5;
    bi.metadata.labels = { a: 1 };
    let error: unknown;
    try {
      assertValidObject(BACKING_IMAGE, bi);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ValidationError);
    expect((error as ValidationError).issues.map((i) => i.path)).toEqual(['metadata.labels[a]', 'spec.checksum']);
    expect((error as Error).message).toBe(
      'invalid BackingImage: metadata.labels[a]: must be a string (got integer); spec.checksum: must be a string (got integer)',
    );
  });

  it('unknown fields can be ignored, as the API server prunes them', () => {
    const node = fullNode() as unknown as Record<string, any>;
    node.spec.futureField = 1;
    expect(validateObject(NODE, node)).toHaveLength(1);
    expect(validateObject(NODE, node, { unknownFields: 'ignore' })).toEqual([]);
  });
});

describe('schema builders', () => {
  it('integer bounds, preserve-unknown-fields and defaults reach both the validator and OpenAPI', () => {
    const schema = s.object(
      { n: s.int({ minimum: 1, maximum: 5, default: 2 }), free: s.object({}, { preserveUnknownFields: true }) },
      { required: ['n'] },
    );
    expect(validateAgainstSchema(schema, { n: 0, free: { anything: 1 } }, 'spec').map((i) => i.message)).toEqual([
      'spec.n: must be >= 1 (got 0)',
    ]);
    expect(validateAgainstSchema(schema, { n: 9 }, 'spec').map((i) => i.message)).toEqual(['spec.n: must be <= 5 (got 9)']);
    expect(toOpenApi(schema)).toEqual({
      properties: {
        free: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true },
        n: { default: 2, maximum: 5, minimum: 1, type: 'integer' },
      },
      required: ['n'],
      type: 'object',
    });
  });

  it('Longhorn does not use x-kubernetes-preserve-unknown-fields in these v1beta2 kinds', () => {
    for (const def of KINDS) expect(JSON.stringify(toOpenApi(def.root))).not.toContain('preserve-unknown-fields');
  });
});
