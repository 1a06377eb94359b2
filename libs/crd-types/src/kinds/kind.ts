import { LONGHORN_API_VERSION } from '../enums.js';
import type { ObjectMeta } from '../meta.js';
import type { Infer, ObjectSchema, Schema } from '../schema/model.js';

/** `additionalPrinterColumns[*]` of a CRD version. */
export interface PrinterColumn {
  readonly name: string;
  readonly type: 'string' | 'integer' | 'number' | 'boolean' | 'date';
  readonly jsonPath: string;
  readonly description?: string;
}

export const AGE_COLUMN: PrinterColumn = { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp' };

/**
 * Everything about one kind: its names, its printer columns and its schema model. `root` describes the members of
 * the object besides `apiVersion`, `kind` and `metadata` (normally `spec` and `status`; Setting has `value`).
 */
export interface KindDefinition<K extends string = string, R extends ObjectSchema<Readonly<Record<string, Schema>>, string> = ObjectSchema<Readonly<Record<string, Schema>>, string>> {
  readonly kind: K;
  readonly listKind: `${K}List`;
  readonly plural: string;
  readonly singular: string;
  readonly shortNames: readonly string[];
  readonly description: string;
  readonly printerColumns: readonly PrinterColumn[];
  readonly root: R;
}

export function defineKind<const K extends string, const R extends ObjectSchema<Readonly<Record<string, Schema>>, string>>(
  def: KindDefinition<K, R>,
): KindDefinition<K, R> {
  return def;
}

/** A `longhorn.io/v1beta2` object of kind `K` whose spec/status are described by `R`. */
export type LonghornObject<K extends string, R> = {
  apiVersion: typeof LONGHORN_API_VERSION;
  kind: K;
  metadata: ObjectMeta;
} & Infer<R>;

/** The object type described by a kind definition. */
export type ObjectOf<D> = D extends KindDefinition<infer K, infer R> ? LonghornObject<K, R> : never;
