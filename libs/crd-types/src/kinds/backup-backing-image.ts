import { BACKUP_STATES } from '@bis/state-machine';
import { BACKUP_COMPRESSION_METHODS } from '../enums.js';
import { s, type Infer } from '../schema/model.js';
import { defineKind, type ObjectOf } from './kind.js';

export const backupBackingImageSpecSchema = s.object(
  {
    backingImage: s.string({ description: 'Name of the backing image that is backed up.' }),
    backupTargetName: s.nullable(s.string({ description: 'Backup target that holds the backup.' })),
    syncRequestedAt: s.nullable(
      s.dateTime({ description: 'Setting it later than status.lastSyncedAt requests a sync from the backup target.' }),
    ),
    userCreated: s.bool({ description: 'True when a user requested the backup (API or UI).' }),
    labels: s.map(s.string(), { description: 'Labels recorded with the backup.' }),
  },
  {
    required: ['backingImage', 'userCreated'],
    description: 'BackupBackingImageSpec is the desired state of a backing image backup.',
  },
);
export type BackupBackingImageSpec = Infer<typeof backupBackingImageSpecSchema>;

export const backupBackingImageStatusSchema = s.object(
  {
    backingImage: s.string(),
    ownerID: s.string(),
    checksum: s.string(),
    url: s.string({ description: 'URL of the backup in the backup target.' }),
    size: s.int64(),
    labels: s.nullable(s.map(s.string())),
    state: s.enumOf(BACKUP_STATES, { enumInOpenApi: false }),
    progress: s.int(),
    error: s.string(),
    messages: s.nullable(s.map(s.string())),
    managerAddress: s.string(),
    backupCreatedAt: s.string(),
    lastSyncedAt: s.nullable(s.dateTime()),
    compressionMethod: s.enumOf(['', ...BACKUP_COMPRESSION_METHODS], { enumInOpenApi: false }),
    secret: s.string(),
    secretNamespace: s.string(),
  },
  { description: 'BackupBackingImageStatus is the observed state of a backing image backup.' },
);
export type BackupBackingImageStatus = Infer<typeof backupBackingImageStatusSchema>;

export const BACKUP_BACKING_IMAGE = defineKind({
  kind: 'BackupBackingImage',
  listKind: 'BackupBackingImageList',
  plural: 'backupbackingimages',
  singular: 'backupbackingimage',
  shortNames: ['lhbbi'],
  description: 'BackupBackingImage is a backup of a backing image in a backup target.',
  printerColumns: [
    { name: 'BackingImage', type: 'string', jsonPath: '.status.backingImage', description: 'Backing image name' },
    { name: 'Size', type: 'string', jsonPath: '.status.size', description: 'Size of the backed-up image' },
    { name: 'BackupCreatedAt', type: 'string', jsonPath: '.status.backupCreatedAt', description: 'When the backup was created' },
    { name: 'State', type: 'string', jsonPath: '.status.state', description: 'State of the backup' },
    { name: 'LastSyncedAt', type: 'string', jsonPath: '.status.lastSyncedAt', description: 'Last sync with the backup target' },
  ],
  root: s.object({ spec: backupBackingImageSpecSchema, status: backupBackingImageStatusSchema }),
});
// An interface (not an alias) so that the compiler resolves the inferred type once and names it in messages.
export interface BackupBackingImage extends ObjectOf<typeof BACKUP_BACKING_IMAGE> {}
