import { conditionSchema } from '../meta.js';
import { s, type Infer } from '../schema/model.js';
import { defineKind, type ObjectOf } from './kind.js';

export const backupTargetSpecSchema = s.object(
  {
    backupTargetURL: s.string({ description: 'URL of the backup target (s3://, nfs://, cifs://, azblob://, vfs://).' }),
    credentialSecret: s.string({ description: 'Secret holding the credentials of the backup target.' }),
    pollInterval: s.string({ description: 'How often the backup target is synchronised (Go duration, e.g. 5m0s).' }),
    syncRequestedAt: s.nullable(s.dateTime({ description: 'Time at which a sync was last requested.' })),
  },
  { description: 'BackupTargetSpec is the desired state of a backup target.' },
);
export type BackupTargetSpec = Infer<typeof backupTargetSpecSchema>;

export const backupTargetStatusSchema = s.object(
  {
    ownerID: s.string(),
    available: s.bool({ description: 'The backup target can be reached.' }),
    conditions: s.nullable(s.array(conditionSchema, { description: 'Why the backup target is unavailable.' })),
    lastSyncedAt: s.nullable(s.dateTime({ description: 'Last sync with the backup target.' })),
  },
  { description: 'BackupTargetStatus is the observed state of a backup target.' },
);
export type BackupTargetStatus = Infer<typeof backupTargetStatusSchema>;

export const BACKUP_TARGET = defineKind({
  kind: 'BackupTarget',
  listKind: 'BackupTargetList',
  plural: 'backuptargets',
  singular: 'backuptarget',
  shortNames: ['lhbt'],
  description: 'BackupTarget is a remote store that holds backups.',
  printerColumns: [
    { name: 'URL', type: 'string', jsonPath: '.spec.backupTargetURL', description: 'URL of the backup target' },
    { name: 'Credential', type: 'string', jsonPath: '.spec.credentialSecret', description: 'Credential secret' },
    // Longhorn names this column LastBackupAt although it shows the poll interval; kept for identical `kubectl get`.
    { name: 'LastBackupAt', type: 'string', jsonPath: '.spec.pollInterval', description: 'Poll interval' },
    { name: 'Available', type: 'boolean', jsonPath: '.status.available', description: 'Whether the target is available' },
    { name: 'LastSyncedAt', type: 'string', jsonPath: '.status.lastSyncedAt', description: 'Last sync with the target' },
  ],
  root: s.object({ spec: backupTargetSpecSchema, status: backupTargetStatusSchema }),
});
// An interface (not an alias) so that the compiler resolves the inferred type once and names it in messages.
export interface BackupTarget extends ObjectOf<typeof BACKUP_TARGET> {}
