import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { decodeLockFile, encodeLockFile, type LockFileContent } from './config.js';
import type { BackupStoreDriver } from './drivers/driver.js';
import { BackupStoreError, lockDir, throwIfAborted } from './names.js';

/** Type 1: backup or restore (they share the value, so they never block each other). */
export const BACKUP_LOCK = 1;
export const RESTORE_LOCK = 1;
/** Type 2: delete (and GC). */
export const DELETION_LOCK = 2;

export interface LockTiming {
  /** A lock whose file is older than this is ignored. Longhorn: 150 s. */
  durationMs: number;
  /** The holder rewrites its lock file this often. Longhorn: 60 s. */
  refreshMs: number;
  /** Wait between writing one's own lock file and checking the others. Longhorn: 2 s. */
  checkWaitMs: number;
}

export const LONGHORN_LOCK_TIMING: LockTiming = { durationMs: 150_000, refreshMs: 60_000, checkWaitMs: 2_000 };

/** Environment variables that override {@link LONGHORN_LOCK_TIMING} (milliseconds): a test and operations knob. */
export const LOCK_TIMING_ENV = {
  durationMs: 'BACKUPSTORE_LOCK_DURATION_MS',
  refreshMs: 'BACKUPSTORE_LOCK_REFRESH_MS',
  checkWaitMs: 'BACKUPSTORE_LOCK_CHECK_WAIT_MS',
} as const satisfies Record<keyof LockTiming, string>;

/**
 * Lock timing from the environment: Longhorn's defaults, with each of {@link LOCK_TIMING_ENV} that is set (a
 * non-negative integer of milliseconds) replacing its value. Returns undefined when none is set. Every process that
 * shares a store must agree on the duration (it decides when another holder's lock is stale); the check wait only
 * shortens the window in which two processes see each other's lock files, which is why tests shorten it.
 * Throws a BackupStoreError (InvalidArgument) naming the variable for a bad value.
 */
export function lockTimingFromEnv(env: Readonly<Record<string, string | undefined>>): LockTiming | undefined {
  let timing: LockTiming | undefined;
  for (const key of Object.keys(LOCK_TIMING_ENV) as (keyof LockTiming)[]) {
    const name = LOCK_TIMING_ENV[key];
    const raw = env[name];
    if (raw === undefined || raw === '') continue;
    if (!/^\d+$/.test(raw.trim()) || !Number.isSafeInteger(Number(raw.trim()))) {
      throw new BackupStoreError('InvalidArgument', `invalid ${name} ${JSON.stringify(raw)}: expected a non-negative integer of milliseconds`);
    }
    timing = { ...(timing ?? LONGHORN_LOCK_TIMING), [key]: Number(raw.trim()) };
  }
  if (timing) {
    if (timing.durationMs === 0) throw new BackupStoreError('InvalidArgument', `invalid ${LOCK_TIMING_ENV.durationMs} 0: locks would expire at once`);
    if (timing.refreshMs === 0 || timing.refreshMs >= timing.durationMs) {
      throw new BackupStoreError(
        'InvalidArgument',
        `invalid lock timing: the refresh interval (${timing.refreshMs} ms) must be above 0 and below the lock duration (${timing.durationMs} ms)`,
      );
    }
  }
  return timing;
}

interface SeenLock extends LockFileContent {
  serverTime: number;
}

function hasPriority(a: SeenLock, b: SeenLock): boolean {
  if (a.acquired !== b.acquired) return a.acquired;
  if (a.serverTime !== b.serverTime) return a.serverTime < b.serverTime;
  return a.name < b.name;
}

/**
 * Longhorn's file lock on the `BACKINGIMAGE` pseudo-volume: write own lock file (not acquired), wait, then fail if any
 * unexpired lock of another type has priority; otherwise mark it acquired and keep refreshing it until released.
 */
export class BackupStoreLock {
  readonly name = 'lock-' + randomUUID().replace(/-/g, '').slice(0, 16);
  private refresher: NodeJS.Timeout | undefined;
  private refreshing: Promise<void> = Promise.resolve();
  private held = false;

  constructor(
    private readonly driver: BackupStoreDriver,
    readonly type: number,
    private readonly timing: LockTiming = LONGHORN_LOCK_TIMING,
  ) {}

  get path(): string {
    return `${lockDir()}/${this.name}.lck`;
  }

  private async writeSelf(acquired: boolean): Promise<void> {
    await this.driver.write(this.path, encodeLockFile({ name: this.name, type: this.type, acquired }));
  }

  /**
   * `announced` is called once this process's lock file is on the store (before the check wait): from then on any
   * conflicting operation that starts will see it, so a caller may begin work whose result it keeps only if the
   * acquisition succeeds.
   */
  async acquire(operation: string, signal?: AbortSignal, announced?: () => void): Promise<void> {
    throwIfAborted(signal);
    await this.writeSelf(false);
    announced?.();
    try {
      const self: SeenLock = {
        name: this.name,
        type: this.type,
        acquired: false,
        serverTime: (await this.driver.modificationTime(this.path, signal)).getTime(),
      };
      await sleep(this.timing.checkWaitMs, undefined, { signal }).catch(() => throwIfAborted(signal));
      const now = Date.now();
      for (const file of await this.driver.list(lockDir(), signal)) {
        if (!file.endsWith('.lck') || file === `${this.name}.lck`) continue;
        let other: SeenLock;
        try {
          const p = `${lockDir()}/${file}`;
          const content = decodeLockFile((await this.driver.read(p, signal)).toString('utf8'), p);
          other = { ...content, serverTime: (await this.driver.modificationTime(p, signal)).getTime() };
        } catch (err) {
          if (err instanceof BackupStoreError && (err.code === 'Corrupt' || err.code === 'NotFound')) continue; // unreadable or gone: skipped, as in Longhorn
          throw err;
        }
        if (other.type === this.type) continue;
        if (now - other.serverTime > this.timing.durationMs) continue;
        if (hasPriority(other, self)) {
          throw new BackupStoreError(
            'LockConflict',
            `failed to acquire lock ${this.path} when performing ${operation}, please try again later`,
          );
        }
      }
      await this.writeSelf(true);
    } catch (err) {
      await this.driver.remove(this.path).catch(() => undefined);
      throw err;
    }
    this.held = true;
    this.refresher = setInterval(() => {
      this.refreshing = this.writeSelf(true).catch(() => undefined);
    }, this.timing.refreshMs);
    this.refresher.unref();
  }

  async release(): Promise<void> {
    if (this.refresher) clearInterval(this.refresher);
    this.refresher = undefined;
    if (!this.held) return;
    this.held = false;
    await this.refreshing; // a refresh still in flight would re-create the file after the removal
    await this.driver.remove(this.path);
  }
}

/** Runs `fn` while holding a lock of `type`; the lock file is always removed afterwards. */
export async function withLock<T>(
  driver: BackupStoreDriver,
  type: number,
  operation: string,
  timing: LockTiming | undefined,
  signal: AbortSignal | undefined,
  fn: () => Promise<T>,
): Promise<T> {
  const lock = new BackupStoreLock(driver, type, timing);
  await lock.acquire(operation, signal);
  try {
    return await fn();
  } finally {
    await lock.release().catch(() => undefined);
  }
}
