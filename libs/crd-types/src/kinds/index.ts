import { BACKING_IMAGE } from './backing-image.js';
import { BACKING_IMAGE_DATA_SOURCE } from './backing-image-data-source.js';
import { BACKING_IMAGE_MANAGER } from './backing-image-manager.js';
import { BACKUP_BACKING_IMAGE } from './backup-backing-image.js';
import { BACKUP_TARGET } from './backup-target.js';
import { NODE } from './node.js';
import { SETTING } from './setting.js';

export * from './kind.js';
export * from './backing-image.js';
export * from './backing-image-data-source.js';
export * from './backing-image-manager.js';
export * from './backup-backing-image.js';
export * from './backup-target.js';
export * from './node.js';
export * from './setting.js';

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
