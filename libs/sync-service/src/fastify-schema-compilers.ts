import { createRequire } from 'node:module';
import type { FastifyServerOptions } from 'fastify';

type SchemaControllerOptions = NonNullable<FastifyServerOptions['schemaController']>;
type Factories = NonNullable<SchemaControllerOptions['compilersFactory']>;
type ValidatorFactory = NonNullable<Factories['buildValidator']>;
type SerializerFactory = NonNullable<Factories['buildSerializer']>;

/** Requires one of fastify's own dependencies, resolved from where fastify is installed. */
function requireFromFastify<T>(id: string): T {
  const here = createRequire(import.meta.url);
  return createRequire(here.resolve('fastify'))(id) as T;
}

/**
 * Fastify's `schemaController` option with its default compilers (`@fastify/ajv-compiler`,
 * `@fastify/fast-json-stringify-compiler`) loaded only when a route with a schema is compiled. Fastify otherwise
 * loads ajv (about 90 modules) when the instance is created, although routes without schemas never use it.
 */
export function lazySchemaCompilers(): SchemaControllerOptions {
  type Factory = (...args: unknown[]) => unknown;
  const lazy = (id: string): Factory => {
    let factory: Factory | undefined;
    return (...args) => (factory ??= requireFromFastify<() => Factory>(id)())(...args);
  };
  return {
    compilersFactory: {
      buildValidator: lazy('@fastify/ajv-compiler') as ValidatorFactory,
      buildSerializer: lazy('@fastify/fast-json-stringify-compiler') as SerializerFactory,
    },
  };
}
