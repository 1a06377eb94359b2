import { decodeBackingImageConfig, type BackingImageBackupConfig } from '../config.js';
import type { BackupCredential, BackupStoreDriver } from '../drivers/driver.js';
import { openDriver, type DriverOptions } from '../drivers/index.js';
import type { LockTiming } from '../lock.js';
import { backingImageConfigPath, BackupStoreError } from '../names.js';

/** Options every engine operation accepts besides its own. */
export interface StoreAccessOptions {
  /** Longhorn's credential keys for the target (S3 keys, endpoint, CA, addressing style). */
  credential?: BackupCredential;
  /** Driver tuning (S3 retries and sockets, NFS mount root). */
  driverOptions?: DriverOptions;
  /** Lock timing; defaults to Longhorn's (150 s expiry, 60 s refresh, 2 s check wait). */
  lockTiming?: LockTiming;
  /** An already open driver for the same target (its `url` must be the target's); it is not closed afterwards. */
  driver?: BackupStoreDriver;
  signal?: AbortSignal;
}

/** Opens the target's driver (or uses the caller's), runs `fn`, closes what it opened. */
export async function withDriver<T>(
  targetUrl: string,
  opts: StoreAccessOptions,
  fn: (driver: BackupStoreDriver) => Promise<T>,
): Promise<T> {
  if (opts.driver) return fn(opts.driver);
  const driver = await openDriver(targetUrl, opts.credential ?? {}, opts.driverOptions ?? {});
  try {
    return await fn(driver);
  } finally {
    await driver.close();
  }
}

export async function loadConfig(
  driver: BackupStoreDriver,
  name: string,
  signal?: AbortSignal,
): Promise<BackingImageBackupConfig> {
  const p = backingImageConfigPath(name);
  const text = (await driver.read(p, signal)).toString('utf8');
  return decodeBackingImageConfig(text, p);
}

/** Loads a config, or returns undefined when there is none. Other failures (I/O, corrupt JSON) throw. */
export async function loadConfigIfExists(
  driver: BackupStoreDriver,
  name: string,
  signal?: AbortSignal,
): Promise<BackingImageBackupConfig | undefined> {
  try {
    return await loadConfig(driver, name, signal);
  } catch (err) {
    if (err instanceof BackupStoreError && err.code === 'NotFound') return undefined;
    throw err;
  }
}

/** Runs `worker` over `items` with at most `concurrency` in flight; the first failure stops new work and is thrown. */
export async function forEachConcurrent<T>(
  items: readonly T[],
  concurrency: number,
  worker: (item: T) => Promise<void>,
): Promise<void> {
  let next = 0;
  let failure: { err: unknown } | undefined;
  const runners = Array.from({ length: Math.min(concurrency, items.length) }, async () => {
    while (!failure && next < items.length) {
      const item = items[next++] as T;
      try {
        await worker(item);
      } catch (err) {
        failure ??= { err };
      }
    }
  });
  await Promise.all(runners);
  if (failure) throw failure.err;
}

export function assertConcurrency(concurrency: number): void {
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 256) {
    throw new BackupStoreError('InvalidArgument', `invalid concurrency ${concurrency}: must be an integer from 1 to 256`);
  }
}

/** Throttles progress callbacks to one per `intervalMs`, always delivering the final one. */
export function throttle<P>(fn: ((p: P) => void) | undefined, intervalMs = 200): (p: P, force?: boolean) => void {
  let last = 0;
  return (p, force = false) => {
    if (!fn) return;
    const now = Date.now();
    if (!force && now - last < intervalMs) return;
    last = now;
    fn(p);
  };
}
