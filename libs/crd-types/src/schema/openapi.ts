import type { Schema } from './model.js';

/** The subset of an OpenAPI v3 schema object (`JSONSchemaProps`) that CRDs of this project use. */
export interface OpenApiSchema {
  additionalProperties?: OpenApiSchema;
  default?: string | number | boolean;
  description?: string;
  enum?: string[];
  format?: string;
  items?: OpenApiSchema;
  maximum?: number;
  minimum?: number;
  nullable?: boolean;
  properties?: Record<string, OpenApiSchema>;
  required?: string[];
  type?: 'string' | 'integer' | 'boolean' | 'array' | 'object';
  'x-kubernetes-preserve-unknown-fields'?: boolean;
}

/**
 * Derives the OpenAPI v3 schema of a schema model. Keys come out in alphabetical order (as controller-gen writes
 * them) and properties are sorted by name, so the output is deterministic.
 */
export function toOpenApi(schema: Schema): OpenApiSchema {
  const out: OpenApiSchema = {};
  if (schema.type === 'map') out.additionalProperties = toOpenApi(schema.values);
  if ('default' in schema && schema.default !== undefined) out.default = schema.default;
  if (schema.description !== undefined) out.description = schema.description;
  if (schema.type === 'string' && schema.enum && schema.enumInOpenApi !== false) out.enum = [...schema.enum];
  if ((schema.type === 'string' || schema.type === 'integer') && schema.format !== undefined) out.format = schema.format;
  if (schema.type === 'array') out.items = toOpenApi(schema.items);
  if (schema.type === 'integer' && schema.maximum !== undefined) out.maximum = schema.maximum;
  if (schema.type === 'integer' && schema.minimum !== undefined) out.minimum = schema.minimum;
  if (schema.nullable) out.nullable = true;
  if (schema.type === 'object') {
    const names = Object.keys(schema.properties).sort();
    if (names.length > 0) {
      out.properties = Object.fromEntries(names.map((n) => [n, toOpenApi(schema.properties[n] as Schema)]));
    }
    if (schema.required.length > 0) out.required = [...schema.required].sort();
  }
  out.type = schema.type === 'map' ? 'object' : schema.type;
  if (schema.type === 'object' && schema.preserveUnknownFields) out['x-kubernetes-preserve-unknown-fields'] = true;
  return out;
}
