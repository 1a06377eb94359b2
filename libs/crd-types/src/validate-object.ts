import { LONGHORN_API_VERSION } from './enums.js';
import type { KindDefinition, ObjectOf } from './kinds/kind.js';
import { objectMetaSchema } from './meta.js';
import { issue, ValidationError, type ValidationIssue } from './schema/errors.js';
import { validateAgainstSchema, type SchemaValidationOptions } from './schema/validate.js';

/**
 * Structural validation of a whole object of kind `def` against the kind's schema model: `apiVersion`, `kind`,
 * `metadata` and every member of the root (spec, status, ...). Returns all issues.
 */
export function validateObject(def: KindDefinition, value: unknown, options: SchemaValidationOptions = {}): ValidationIssue[] {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return [issue('(root)', 'type', `must be a ${def.kind} object`)];
  }
  const record = value as Record<string, unknown>;
  const out: ValidationIssue[] = [];
  if (record['apiVersion'] !== LONGHORN_API_VERSION) {
    out.push(issue('apiVersion', 'constant', `must be "${LONGHORN_API_VERSION}" (got ${JSON.stringify(record['apiVersion'])})`));
  }
  if (record['kind'] !== def.kind) {
    out.push(issue('kind', 'constant', `must be "${def.kind}" (got ${JSON.stringify(record['kind'])})`));
  }
  if (record['metadata'] === undefined) out.push(issue('metadata', 'required', 'is required'));
  else out.push(...validateAgainstSchema(objectMetaSchema, record['metadata'], 'metadata', { unknownFields: 'ignore' }));
  const rest: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(record)) {
    if (k !== 'apiVersion' && k !== 'kind' && k !== 'metadata') rest[k] = v;
  }
  out.push(...validateAgainstSchema(def.root, rest, '', options));
  return out;
}

/** Like {@link validateObject} but throws a {@link ValidationError} listing every issue; narrows the type. */
export function assertValidObject<D extends KindDefinition>(
  def: D,
  value: unknown,
  options: SchemaValidationOptions = {},
): asserts value is ObjectOf<D> {
  const issues = validateObject(def, value, options);
  if (issues.length > 0) throw new ValidationError(def.kind, issues);
}
