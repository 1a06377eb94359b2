import { BACKING_IMAGE } from './backing-image.js';
import { BACKING_IMAGE_DATA_SOURCE } from './backing-image-data-source.js';
import { BACKING_IMAGE_MANAGER } from './backing-image-manager.js';
import { BACKUP_BACKING_IMAGE } from './backup-backing-image.js';
import { BACKUP_TARGET } from './backup-target.js';
import { NODE } from './node.js';
import { REPLICA } from './replica.js';
import { SETTING } from './setting.js';

export * from './kind.js';
export * from './backing-image.js';
export * from './backing-image-data-source.js';
export * from './backing-image-manager.js';
export * from './backup-backing-image.js';
export * from './backup-target.js';
export * from './node.js';
export * from './setting.js';
export * from './replica.js';

/** Every kind this library describes, in a stable order. */
export const KINDS = [
  BACKING_IMAGE,
  BACKING_IMAGE_DATA_SOURCE,
  BACKING_IMAGE_MANAGER,
  BACKUP_BACKING_IMAGE,
  SETTING,
  NODE,
  BACKUP_TARGET,
] as const;

export type KindName = (typeof KINDS)[number]['kind'];

/**
 * Longhorn kinds this system reads but does not own (Longhorn writes them): their CRDs ship with the chart so the
 * controllers' watches work without Longhorn, with open schemas beyond the fields the controllers read.
 */
export const LONGHORN_READ_KINDS = [REPLICA] as const;

/** Every CRD the chart ships: the kinds above and the Longhorn kinds the controllers read. */
export const CHART_CRD_KINDS = [...KINDS, ...LONGHORN_READ_KINDS] as const;
