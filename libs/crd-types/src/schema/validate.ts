import type { Schema } from './model.js';
import { childPath, describeValue, issue, mapEntryPath, type ValidationIssue } from './errors.js';

export interface SchemaValidationOptions {
  /**
   * What to do with members that the schema does not declare. `reject` (the default) reports them, which catches
   * typos in hand-written objects; `ignore` accepts them, which is what the Kubernetes API server does (it prunes them).
   */
  readonly unknownFields?: 'reject' | 'ignore';
}

/** RFC 3339 date-time, as Kubernetes' `format: date-time` accepts it. */
const DATE_TIME = /^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;

function jsonType(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'number') return Number.isInteger(value) ? 'integer' : 'number';
  return typeof value;
}

/**
 * Checks `value` against `schema` and returns every issue found (an empty array when the value is valid).
 * `path` is the field path of `value` inside the whole object (e.g. `spec`).
 */
export function validateAgainstSchema(
  schema: Schema,
  value: unknown,
  path: string,
  options: SchemaValidationOptions = {},
): ValidationIssue[] {
  const issues: ValidationIssue[] = [];
  walk(schema, value, path, options, issues);
  return issues;
}

function walk(schema: Schema, value: unknown, path: string, options: SchemaValidationOptions, out: ValidationIssue[]): void {
  if (value === null) {
    if (!schema.nullable) out.push(issue(path, 'nullable', 'must not be null'));
    return;
  }
  switch (schema.type) {
    case 'string': {
      if (typeof value !== 'string') {
        out.push(issue(path, 'type', `must be a string (got ${jsonType(value)})`));
        return;
      }
      if (schema.enum && !schema.enum.includes(value)) {
        out.push(issue(path, 'enum', `must be one of ${schema.enum.map((v) => JSON.stringify(v)).join(', ')} (got ${JSON.stringify(value)})`));
      }
      if (schema.format === 'date-time' && !DATE_TIME.test(value)) {
        out.push(issue(path, 'format', `must be an RFC 3339 date-time (got ${JSON.stringify(value)})`));
      }
      return;
    }
    case 'integer': {
      if (typeof value !== 'number' || !Number.isInteger(value)) {
        out.push(issue(path, 'type', `must be an integer (got ${describeValue(value)})`));
        return;
      }
      if (!Number.isSafeInteger(value)) {
        out.push(issue(path, 'maximum', `must be a safe integer between -(2^53-1) and 2^53-1 (got ${value})`));
      }
      if (schema.minimum !== undefined && value < schema.minimum) {
        out.push(issue(path, 'minimum', `must be >= ${schema.minimum} (got ${value})`));
      }
      if (schema.maximum !== undefined && value > schema.maximum) {
        out.push(issue(path, 'maximum', `must be <= ${schema.maximum} (got ${value})`));
      }
      return;
    }
    case 'boolean': {
      if (typeof value !== 'boolean') out.push(issue(path, 'type', `must be a boolean (got ${jsonType(value)})`));
      return;
    }
    case 'array': {
      if (!Array.isArray(value)) {
        out.push(issue(path, 'type', `must be an array (got ${jsonType(value)})`));
        return;
      }
      value.forEach((item, i) => walk(schema.items, item, childPath(path, i), options, out));
      return;
    }
    case 'map': {
      if (jsonType(value) !== 'object') {
        out.push(issue(path, 'type', `must be an object (got ${jsonType(value)})`));
        return;
      }
      for (const [key, item] of Object.entries(value as Record<string, unknown>)) {
        walk(schema.values, item, mapEntryPath(path, key), options, out);
      }
      return;
    }
    case 'object': {
      if (jsonType(value) !== 'object') {
        out.push(issue(path, 'type', `must be an object (got ${jsonType(value)})`));
        return;
      }
      const record = value as Record<string, unknown>;
      for (const name of schema.required) {
        if (record[name] === undefined) out.push(issue(childPath(path, name), 'required', 'is required'));
      }
      for (const [name, member] of Object.entries(record)) {
        if (member === undefined) continue;
        const memberSchema = Object.hasOwn(schema.properties, name) ? schema.properties[name] : undefined;
        if (memberSchema === undefined) {
          if (!schema.preserveUnknownFields && (options.unknownFields ?? 'reject') === 'reject') {
            out.push(issue(childPath(path, name), 'unknown-field', 'is not a known field'));
          }
          continue;
        }
        walk(memberSchema, member, childPath(path, name), options, out);
      }
      return;
    }
  }
}
