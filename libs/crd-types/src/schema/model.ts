/**
 * A small schema description language for the `longhorn.io/v1beta2` kinds.
 *
 * Each kind is described ONCE with these builders. From that one description the library derives:
 * - the TypeScript type of the object ({@link Infer});
 * - the runtime validator (`validateAgainstSchema` in `validate.ts`);
 * - the OpenAPI v3 schema embedded in the CustomResourceDefinition (`toOpenApi` in `openapi.ts`).
 */

interface SchemaCommon {
  readonly description?: string;
  readonly nullable?: boolean;
}

export interface StringSchema<T extends string = string> extends SchemaCommon {
  readonly type: 'string';
  readonly enum?: readonly T[];
  readonly format?: 'date-time';
  readonly default?: T;
  /**
   * `false`: the enum is checked at runtime but not written into the CRD (Longhorn's CRD declares these fields as a
   * plain string, e.g. the file states; the API server must keep accepting values a newer peer writes).
   */
  readonly enumInOpenApi?: false;
  /** Phantom member carrying the value type; never present at runtime. */
  readonly __value?: T;
}

export interface IntegerSchema extends SchemaCommon {
  readonly type: 'integer';
  /** Go `int` has no format in Longhorn's CRDs; `int64` fields carry `format: int64`. */
  readonly format?: 'int64';
  readonly minimum?: number;
  readonly maximum?: number;
  readonly default?: number;
}

export interface BooleanSchema extends SchemaCommon {
  readonly type: 'boolean';
  readonly default?: boolean;
}

export interface ArraySchema<I extends Schema = Schema> extends SchemaCommon {
  readonly type: 'array';
  readonly items: I;
}

/** A JSON object with arbitrary keys and uniformly typed values (`additionalProperties` in OpenAPI). */
export interface MapSchema<V extends Schema = Schema> extends SchemaCommon {
  readonly type: 'map';
  readonly values: V;
}

export interface ObjectSchema<
  P extends Readonly<Record<string, Schema>> = Readonly<Record<string, Schema>>,
  R extends keyof P & string = keyof P & string,
> extends SchemaCommon {
  readonly type: 'object';
  readonly properties: P;
  readonly required: readonly R[];
  /** Emit `x-kubernetes-preserve-unknown-fields: true` and accept unknown members at runtime. */
  readonly preserveUnknownFields?: boolean;
}

export type Schema =
  | StringSchema<string>
  | IntegerSchema
  | BooleanSchema
  | ArraySchema<Schema>
  | MapSchema<Schema>
  | ObjectSchema<Readonly<Record<string, Schema>>, string>;

type Simplify<T> = { [K in keyof T]: T[K] } & {};

type InferObject<P extends Readonly<Record<string, Schema>>, R extends string> = Simplify<
  { -readonly [K in keyof P as K extends R ? K : never]: Infer<P[K]> } & {
    -readonly [K in keyof P as K extends R ? never : K]?: Infer<P[K]>;
  }
>;

type InferBase<S> =
  S extends StringSchema<infer T>
    ? T
    : S extends IntegerSchema
      ? number
      : S extends BooleanSchema
        ? boolean
        : S extends ArraySchema<infer I>
          ? Infer<I>[]
          : S extends MapSchema<infer V>
            ? Record<string, Infer<V>>
            : S extends ObjectSchema<infer P, infer R>
              ? InferObject<P, R>
              : never;

/** The TypeScript type of values accepted by schema `S`. */
export type Infer<S> = S extends { readonly nullable: true } ? InferBase<S> | null : InferBase<S>;

type Opts<S> = Omit<S, 'type' | 'items' | 'values' | 'properties' | 'required' | '__value' | 'nullable' | 'enum'>;

/** Builders. Each returns a plain, serialisable schema object with a precise static type. */
export const s = {
  string(opts: Opts<StringSchema> = {}): StringSchema<string> {
    return { type: 'string', ...opts };
  },
  enumOf<const T extends string>(values: readonly T[], opts: Opts<StringSchema<T>> = {}): StringSchema<T> {
    return { type: 'string', enum: values, ...opts };
  },
  dateTime(opts: Opts<StringSchema> = {}): StringSchema<string> {
    return { type: 'string', format: 'date-time', ...opts };
  },
  /** Go `int`: an integer without a format. */
  int(opts: Opts<IntegerSchema> = {}): IntegerSchema {
    return { type: 'integer', ...opts };
  },
  /** Go `int64`: `format: int64`. */
  int64(opts: Opts<IntegerSchema> = {}): IntegerSchema {
    return { type: 'integer', format: 'int64', ...opts };
  },
  bool(opts: Opts<BooleanSchema> = {}): BooleanSchema {
    return { type: 'boolean', ...opts };
  },
  array<const I extends Schema>(items: I, opts: Opts<ArraySchema<I>> = {}): ArraySchema<I> {
    return { type: 'array', items, ...opts };
  },
  map<const V extends Schema>(values: V, opts: Opts<MapSchema<V>> = {}): MapSchema<V> {
    return { type: 'map', values, ...opts };
  },
  object<const P extends Readonly<Record<string, Schema>>, const R extends keyof P & string = never>(
    properties: P,
    opts: Opts<ObjectSchema<P, R>> & { readonly required?: readonly R[] } = {},
  ): ObjectSchema<P, R> {
    const { required, ...rest } = opts;
    return { type: 'object', properties, required: required ?? [], ...rest };
  },
  /** Marks a schema `nullable: true` (Go pointer / nil map): the value may be JSON `null`. */
  nullable<const S extends Schema>(schema: S): S & { readonly nullable: true } {
    return { ...schema, nullable: true };
  },
} as const;
