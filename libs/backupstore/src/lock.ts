import { randomUUID } from 'node:crypto';
import { readFileSync, readlinkSync } from 'node:fs';
import os from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { decodeLockFile, encodeLockFile, type LockFileContent, type LockOwner } from './config.js';
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

/** Options of a lock beyond its timing (tests inject the clock; a process without /proc records no owner). */
export interface LockOptions {
  /** Local clock (ms since the epoch) that lock heartbeats (store modification times) are compared with. Default Date.now. */
  now?: () => number;
  /** Where a broken lock is reported. Default: a line on stderr (the process's log). */
  log?: (message: string) => void;
  /** The owner written into this process's lock files. Default: {@link currentLockOwner}; null writes none (as Longhorn). */
  owner?: LockOwner | null;
}

function procStat(pid: number): { state: string; startTime: string } | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
    return f[0] && f[19] ? { state: f[0], startTime: f[19] } : undefined;
  } catch {
    return undefined;
  }
}

let ownerCache: { owner: LockOwner | undefined } | undefined;

/** This process as a lock owner; undefined where /proc cannot tell (then no owner is recorded). */
export function currentLockOwner(): LockOwner | undefined {
  if (!ownerCache) {
    let owner: LockOwner | undefined;
    try {
      const stat = procStat(process.pid);
      const bootID = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
      const pidNS = readlinkSync('/proc/self/ns/pid');
      if (stat && bootID) owner = { host: os.hostname(), bootID, pidNS, pid: process.pid, startTime: stat.startTime };
    } catch {
      owner = undefined;
    }
    ownerCache = { owner };
  }
  return ownerCache.owner;
}

/**
 * True when `owner` is certainly dead: it ran on this machine, in this boot and in this pid namespace, and its pid no
 * longer names it (no such process, a zombie, or another process). Owners elsewhere are never judged dead here.
 */
export function isLockOwnerDead(owner: LockOwner, self: LockOwner | undefined = currentLockOwner()): boolean {
  if (!self || owner.host !== self.host || owner.bootID !== self.bootID || owner.pidNS !== self.pidNS) return false;
  if (owner.pid === self.pid) return owner.startTime !== self.startTime;
  const stat = procStat(owner.pid);
  return !stat || stat.state === 'Z' || stat.startTime !== owner.startTime;
}

function hasPriority(a: SeenLock, b: SeenLock): boolean {
  if (a.acquired !== b.acquired) return a.acquired;
  if (a.serverTime !== b.serverTime) return a.serverTime < b.serverTime;
  return a.name < b.name;
}

/**
 * Longhorn's file lock on the `BACKINGIMAGE` pseudo-volume: write own lock file (not acquired), wait, then fail if any
 * live lock of another type has priority; otherwise mark it acquired and keep refreshing it until released.
 *
 * The heartbeat of a lock is its file's modification time on the store (server time, as in Longhorn): the holder
 * rewrites the file every `refreshMs`. A lock whose heartbeat is older than `durationMs` (Longhorn: 150 s = 2.5 × the
 * 60 s refresh) is stale: its holder stopped refreshing it, so it is ignored and removed. A lock whose recorded owner
 * is a process of this machine that no longer runs is dead and removed at once, whatever its heartbeat (so a store is
 * usable right after its writer was killed, not 150 s later). Longhorn's lock files carry no owner: for them only
 * the heartbeat counts.
 */
export class BackupStoreLock {
  readonly name = 'lock-' + randomUUID().replace(/-/g, '').slice(0, 16);
  private refresher: NodeJS.Timeout | undefined;
  private refreshing: Promise<void> = Promise.resolve();
  private held = false;
  private readonly now: () => number;
  private readonly log: (message: string) => void;
  private readonly owner: LockOwner | undefined;

  constructor(
    private readonly driver: BackupStoreDriver,
    readonly type: number,
    private readonly timing: LockTiming = LONGHORN_LOCK_TIMING,
    opts: LockOptions = {},
  ) {
    this.now = opts.now ?? Date.now;
    this.log = opts.log ?? ((m) => process.stderr.write(`${new Date().toISOString()} ${m}\n`));
    this.owner = opts.owner === null ? undefined : (opts.owner ?? currentLockOwner());
  }

  get path(): string {
    return `${lockDir()}/${this.name}.lck`;
  }

  private async writeSelf(acquired: boolean): Promise<void> {
    await this.driver.write(this.path, encodeLockFile({ name: this.name, type: this.type, acquired, ...(this.owner ? { owner: this.owner } : {}) }));
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
      const now = this.now();
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
        if (other.owner && isLockOwnerDead(other.owner, this.owner)) {
          await this.breakLock(file, `its owner, process ${other.owner.pid} on ${other.owner.host}, no longer runs`, signal);
          continue;
        }
        const age = now - other.serverTime;
        if (age > this.timing.durationMs) {
          await this.breakLock(file, `its heartbeat is ${Math.round(age / 1000)} s old (stale after ${Math.round(this.timing.durationMs / 1000)} s)`, signal, other.serverTime);
          continue;
        }
        if (hasPriority(other, self)) {
          const holder = other.owner ? `process ${other.owner.pid} on ${other.owner.host}` : 'an owner it does not name';
          throw new BackupStoreError(
            'LockConflict',
            `failed to acquire lock ${this.path} when performing ${operation}, please try again later ` +
              `(${other.acquired ? 'held' : 'requested'} by ${file}, type ${other.type}, ${holder}, heartbeat ${Math.max(0, Math.round(age / 1000))} s ago)`,
          );
        }
      }
      await this.writeSelf(true);
    } catch (err) {
      await this.driver.remove(this.path).catch(() => undefined); // best effort: the acquire error is what matters; a leftover lock goes stale
      throw err;
    }
    this.held = true;
    this.refresher = setInterval(() => {
      // A failed refresh is retried at the next interval; the lock only goes stale after the lock duration.
      this.refreshing = this.writeSelf(true).catch(() => undefined);
    }, this.timing.refreshMs);
    this.refresher.unref();
  }

  /**
   * Removes another holder's lock file found dead or stale. A stale one is removed only if its heartbeat has not moved
   * since it was judged (a holder that came back and refreshed it keeps it); a removal that fails is only logged:
   * the lock is ignored either way.
   */
  private async breakLock(file: string, why: string, signal: AbortSignal | undefined, seenServerTime?: number): Promise<void> {
    const p = `${lockDir()}/${file}`;
    try {
      if (seenServerTime !== undefined && (await this.driver.modificationTime(p, signal)).getTime() !== seenServerTime) return;
      await this.driver.remove(p);
      this.log(`backupstore: broke lock ${p}: ${why}`);
    } catch (err) {
      if (err instanceof BackupStoreError && err.code === 'NotFound') return;
      this.log(`backupstore: ignoring lock ${p} (${why}); removing it failed: ${(err as Error).message}`);
    }
  }

  async release(): Promise<void> {
    if (this.refresher) clearInterval(this.refresher);
    this.refresher = undefined;
    if (!this.held) return;
    this.held = false;
    await this.refreshing; // a refresh still in flight would re-create the file after the removal
    try {
      await this.driver.remove(this.path);
    } catch (err) {
      if (err instanceof BackupStoreError && err.code === 'NotFound') return;
      // E.g. the target is unreachable: the file would block other operations until stale. Keep trying in the
      // background until it is gone or stale anyway.
      this.retryRemoval(this.now() + this.timing.durationMs);
      throw err;
    }
  }

  private retryRemoval(until: number): void {
    const t = setTimeout(() => {
      this.driver.remove(this.path).then(
        () => this.log(`backupstore: removed lock ${this.path} after a failed release`),
        (err: unknown) => {
          if (err instanceof BackupStoreError && err.code === 'NotFound') return;
          if (this.now() < until) this.retryRemoval(until);
          else this.log(`backupstore: gave up removing lock ${this.path} (stale from now on): ${(err as Error).message}`);
        },
      );
    }, Math.min(this.timing.refreshMs, 5_000));
    t.unref();
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
  opts?: LockOptions,
): Promise<T> {
  const lock = new BackupStoreLock(driver, type, timing, opts);
  await lock.acquire(operation, signal);
  try {
    return await fn();
  } finally {
    await lock.release().catch(() => undefined); // a lock that cannot be removed goes stale; fn's outcome stands
  }
}
