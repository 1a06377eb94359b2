import { createBackup, parseCompressionMethod, restoreBackup, type LockTiming } from '@bis/backupstore';
import type { RestoreBackupFn } from '@bis/file-sources';
import type { BackupRunner } from '@bis/manager';

export interface BackupstoreRunnerOptions {
  /** Backupstore lock timing (default Longhorn's: 150 s expiry, 60 s refresh, 2 s check wait). */
  lockTiming?: LockTiming;
  /** The disk root restores are confined to (their output must lie inside it). */
  root?: string;
}

/**
 * The manager's BackupRunner over `@bis/backupstore`: backs up a ready backing file to the target. Longhorn's backup
 * `parameters` `secret` and `secret-namespace` are recorded in the backup config; credentials are passed per call
 * (Longhorn copied them into the process environment). A complete backup of the same name on the target is kept and
 * reported complete at once (Longhorn's rule, keyed by name).
 */
export function backupstoreRunner(opts: BackupstoreRunnerOptions = {}): BackupRunner {
  return {
    async createBackup(req) {
      const result = await createBackup({
        target: req.target,
        name: req.name,
        filePath: req.filePath,
        compression: parseCompressionMethod(req.compression),
        concurrency: req.concurrency,
        labels: req.labels,
        checksum: req.checksum,
        secret: req.parameters['secret'] ?? '',
        secretNamespace: req.parameters['secret-namespace'] ?? '',
        credential: req.credential,
        lockTiming: opts.lockTiming,
        signal: req.signal,
        onProgress: (p) => req.onProgress(p.progress),
      });
      return { backupUrl: result.backupUrl };
    },
  };
}

/**
 * The sync service's `restoreFromBackupURL` engine over `@bis/backupstore` (credentials per call, never through the
 * process environment). The engine verifies every block and the whole-image SHA-512 recorded in the backup.
 */
export function backupstoreRestore(opts: BackupstoreRunnerOptions = {}): RestoreBackupFn {
  return async (a) => {
    const r = await restoreBackup({
      backupUrl: a.backupUrl,
      output: a.output,
      root: opts.root,
      concurrency: a.concurrency,
      credential: a.credential,
      lockTiming: opts.lockTiming,
      signal: a.signal,
      onProgress: (p) => a.onProgress(p.processedBytes, p.totalBytes),
      checkSize: a.checkSize,
    });
    return { size: r.size, sha512: r.sha512, ...(r.chain ? { chain: r.chain } : {}) };
  };
}
