import type { BackupCreateRequest, BackupStatusResponse } from '@bis/bimrpc';
import type { BackupProgressState } from '@bis/state-machine';

/** What the manager asks of a backup engine (implemented over `@bis/backupstore` by the composition root). */
export interface BackupRunner {
  createBackup(req: {
    target: string;
    name: string;
    filePath: string;
    compression: string;
    concurrency: number;
    labels: Record<string, string>;
    credential: Record<string, string>;
    parameters: Record<string, string>;
    checksum: string;
    signal: AbortSignal;
    onProgress: (progress: number) => void;
  }): Promise<{ backupUrl: string }>;
}

interface Entry {
  name: string;
  progress: number;
  backupUrl: string;
  error: string;
  state: BackupProgressState;
  controller: AbortController;
}

const NAME_RE = /^[a-zA-Z0-9][a-zA-Z0-9_.-]+$/;
const KEEP_COMPLETED = 5;

export function parseLabels(labels: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const l of labels) {
    const i = l.indexOf('=');
    if (i <= 0) throw new Error(`invalid label "${l}": expected key=value`);
    out[l.slice(0, i)] = l.slice(i + 1);
  }
  return out;
}

/**
 * Backups started by BackupCreate, keyed by backing-image name. BackupStatus reports the **newest** entry of a name
 * (Longhorn returned the oldest, quirk §10-13); at most 5 finished entries are kept.
 */
export class BackupTracker {
  readonly #entries: Entry[] = [];

  async start(runner: BackupRunner, req: BackupCreateRequest, filePath: string, checksum: string): Promise<void> {
    if (!req.backupTarget) throw new Error('missing input parameter: backup target');
    if (req.name.length > 64 || !NAME_RE.test(req.name)) {
      throw new Error(`invalid backing image name ${req.name}: must match ${NAME_RE.source} and not be longer than 64`);
    }
    const labels = parseLabels(req.labels);
    if (this.#entries.some((e) => e.name === req.name && e.state === 'in_progress')) {
      throw new Error(`backup of backing image ${req.name} is already in progress`);
    }
    const e: Entry = { name: req.name, progress: 0, backupUrl: '', error: '', state: 'in_progress', controller: new AbortController() };
    this.#entries.push(e);
    // Both outcomes are handled below (they become the entry's state, polled by the controller).
    void runner
      .createBackup({
        target: req.backupTarget,
        name: req.name,
        filePath,
        compression: req.compressionMethod || 'lz4',
        concurrency: req.concurrentLimit > 0 ? req.concurrentLimit : 1,
        labels,
        credential: req.credential,
        parameters: req.parameters,
        checksum,
        signal: e.controller.signal,
        onProgress: (p) => {
          e.progress = Math.min(99, Math.max(e.progress, Math.trunc(p)));
        },
      })
      .then(
        (r) => {
          e.backupUrl = r.backupUrl;
          e.progress = 100;
          e.state = 'complete';
        },
        (err: unknown) => {
          e.error = err instanceof Error ? err.message : String(err);
          e.state = 'error';
        },
      )
      .finally(() => this.#trim());
  }

  status(name: string): BackupStatusResponse | undefined {
    for (let i = this.#entries.length - 1; i >= 0; i--) {
      const e = this.#entries[i]!;
      if (e.name === name) return { progress: e.progress, backupUrl: e.backupUrl, error: e.error, state: e.state };
    }
    return undefined;
  }

  cancelAll(): void {
    for (const e of this.#entries) if (e.state === 'in_progress') e.controller.abort(new Error('the manager is shutting down'));
  }

  #trim(): void {
    let finished = this.#entries.filter((e) => e.state !== 'in_progress').length;
    for (let i = 0; i < this.#entries.length && finished > KEEP_COMPLETED; ) {
      if (this.#entries[i]!.state !== 'in_progress') {
        this.#entries.splice(i, 1);
        finished--;
      } else i++;
    }
  }
}
