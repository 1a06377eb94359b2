import { decompressAndVerifyBlock } from '../compression.js';
import { effectiveCompressionMethod, type BackingImageBackupConfig, type BackupInfo } from '../config.js';
import type { BackupStoreDriver } from '../drivers/driver.js';
import { BACKUP_LOCK, DELETION_LOCK, withLock } from '../lock.js';
import {
  BACKING_IMAGE_CHAIN_FILE,
  backingImageChainPath,
  backingImageConfigPath,
  backingImageDir,
  BACKING_IMAGES_DIR,
  BackupStoreError,
  BLOCKS_DIR,
  blockPath,
  isBlockChecksum,
  throwIfAborted,
} from '../names.js';
import { encodeBackupUrl, parseBackupUrl } from '../url.js';
import { assertConcurrency, forEachConcurrent, loadConfig, withDriver, type StoreAccessOptions } from './common.js';

/** Names of the backing images with a directory on the store (in-progress and failed ones included), sorted. */
export async function listBackingImageBackupNames(driver: BackupStoreDriver, signal?: AbortSignal): Promise<string[]> {
  return (await driver.list(BACKING_IMAGES_DIR, signal)).sort();
}

export interface BackupListEntry {
  name: string;
  backupUrl: string;
  /** `complete`, `in_progress` (CompleteTime empty) or `unreadable` (config missing or corrupt). */
  state: 'complete' | 'in_progress' | 'unreadable';
  size?: number;
  checksum?: string;
  compressionMethod?: string;
  createdTime?: string;
  completeTime?: string;
  blockCount?: number;
  labels?: Record<string, string> | null;
  /** Why the config could not be read. */
  error?: string;
}

/** Every backing-image backup on a target, with its state (Longhorn's `ls-backing-image` plus details). */
export async function listBackingImageBackups(target: string, opts: StoreAccessOptions = {}): Promise<BackupListEntry[]> {
  return withDriver(target, opts, async (driver) => {
    const names = await listBackingImageBackupNames(driver, opts.signal);
    const entries: BackupListEntry[] = [];
    for (const name of names) {
      const backupUrl = safeBackupUrl(name, target);
      try {
        const c = await loadConfig(driver, name, opts.signal);
        entries.push({
          name,
          backupUrl,
          state: c.completeTime === '' ? 'in_progress' : 'complete',
          size: c.size,
          checksum: c.checksum,
          compressionMethod: c.compressionMethod,
          createdTime: c.createdTime,
          completeTime: c.completeTime,
          blockCount: c.blocks.length,
          labels: c.labels,
        });
      } catch (err) {
        if (!(err instanceof BackupStoreError) || (err.code !== 'NotFound' && err.code !== 'Corrupt')) throw err;
        entries.push({ name, backupUrl, state: 'unreadable', error: err.message });
      }
    }
    return entries;
  });
}

function safeBackupUrl(name: string, target: string): string {
  try {
    return encodeBackupUrl(name, target);
  } catch {
    return '';
  }
}

/** Longhorn's `inspect-backing-image`: the `BackupInfo` of a complete backup. */
export async function inspectBackup(backupUrl: string, opts: StoreAccessOptions = {}): Promise<BackupInfo> {
  const { name, targetUrl } = parseBackupUrl(backupUrl);
  return withDriver(targetUrl, opts, async (driver) => {
    const c = await loadConfig(driver, name, opts.signal);
    if (c.completeTime === '') throw new BackupStoreError('InProgress', `backup backing image ${name} is still in progress`);
    return {
      name: c.name,
      url: encodeBackupUrl(name, driver.url),
      completeAt: c.completeTime,
      size: c.size,
      checksum: c.checksum,
      labels: c.labels,
      compressionMethod: c.compressionMethod,
      secret: c.secret,
      secretNamespace: c.secretNamespace,
    };
  });
}

export interface GcResult {
  /** True when the sweep ran (in a dry run: would have run). */
  swept: boolean;
  /** Why the sweep was skipped: an unreadable or in-progress config, a listing error, or a concurrent change. */
  skippedReason?: string;
  /** Block files on the store (valid names only). */
  totalBlocks: number;
  referencedBlocks: number;
  /** Unreferenced block checksums removed (or, in a dry run, that would be removed). */
  removedBlocks: string[];
  dryRun: boolean;
}

async function listStoredBlocks(driver: BackupStoreDriver, signal?: AbortSignal): Promise<string[]> {
  const sums: string[] = [];
  for (const l1 of await driver.list(BLOCKS_DIR, signal)) {
    for (const l2 of await driver.list(`${BLOCKS_DIR}/${l1}`, signal)) {
      for (const file of await driver.list(`${BLOCKS_DIR}/${l1}/${l2}`, signal)) {
        if (!file.endsWith('.blk')) continue;
        const sum = file.slice(0, -4);
        if (isBlockChecksum(sum) && sum.startsWith(l1 + l2)) sums.push(sum);
      }
    }
  }
  return sums;
}

function sameNames(a: readonly string[], b: readonly string[]): boolean {
  if (a.length !== b.length) return false;
  const set = new Set(a);
  return b.every((n) => set.has(n));
}

/**
 * Mark and sweep over the shared block pool. Caller holds the deletion lock. Unlike Longhorn, a listing error is never
 * read as "no backups": it skips the sweep, as does any unreadable or in-progress config or a change in the list of
 * backups between the mark phase and the sweep.
 */
async function collectGarbage(driver: BackupStoreDriver, dryRun: boolean, signal?: AbortSignal): Promise<GcResult> {
  const result: GcResult = { swept: false, totalBlocks: 0, referencedBlocks: 0, removedBlocks: [], dryRun };
  const skip = (reason: string): GcResult => ({ ...result, skippedReason: reason });
  let blocks: string[];
  let names: string[];
  try {
    blocks = await listStoredBlocks(driver, signal);
    names = await listBackingImageBackupNames(driver, signal);
  } catch (err) {
    throwIfAborted(signal);
    return skip(`listing the backupstore failed: ${(err as Error).message}`);
  }
  result.totalBlocks = blocks.length;
  const referenced = new Set<string>();
  const orphanedChains: string[] = [];
  for (const name of names) {
    let config: BackingImageBackupConfig;
    try {
      config = await loadConfig(driver, name, signal);
    } catch (err) {
      throwIfAborted(signal);
      if (err instanceof BackupStoreError && err.code === 'NotFound' && (await onlyChainSidecar(driver, name, signal))) {
        // The leftover of a backup that failed between removing its sidecar and its marker: references no block.
        orphanedChains.push(name);
        continue;
      }
      return skip(`cannot load the config of backing image backup ${name}: ${(err as Error).message}`);
    }
    if (config.completeTime === '') return skip(`backing image backup ${name} is in progress or failed`);
    for (const b of config.blocks) referenced.add(b.blockChecksum);
  }
  let again: string[];
  try {
    again = await listBackingImageBackupNames(driver, signal);
  } catch (err) {
    throwIfAborted(signal);
    return skip(`listing the backupstore failed: ${(err as Error).message}`);
  }
  if (!sameNames(names, again)) return skip('the list of backing image backups changed during garbage collection');
  result.referencedBlocks = blocks.filter((b) => referenced.has(b)).length;
  const unreferenced = blocks.filter((b) => !referenced.has(b));
  result.swept = true;
  if (dryRun) return { ...result, removedBlocks: unreferenced };
  for (const name of orphanedChains) await driver.remove(backingImageChainPath(name), signal);
  const failed: string[] = [];
  await forEachConcurrent(unreferenced, 8, async (sum) => {
    throwIfAborted(signal);
    try {
      await driver.remove(blockPath(sum), signal);
      result.removedBlocks.push(sum);
    } catch (err) {
      throwIfAborted(signal);
      failed.push(`${sum}: ${(err as Error).message}`);
    }
  });
  if (failed.length > 0) {
    throw new BackupStoreError('Io', `failed to remove ${failed.length} unreferenced blocks: ${failed.join('; ')}`);
  }
  return result;
}

/** True when the image directory holds nothing but the SHA-512 chain sidecar (no config). */
async function onlyChainSidecar(driver: BackupStoreDriver, name: string, signal?: AbortSignal): Promise<boolean> {
  try {
    const entries = await driver.list(backingImageDir(name), signal);
    return entries.length > 0 && entries.every((e) => e === BACKING_IMAGE_CHAIN_FILE);
  } catch {
    throwIfAborted(signal);
    return false;
  }
}

export interface DeleteResult {
  name: string;
  /** False when there was no config to remove (the GC still ran). */
  configRemoved: boolean;
  gc: GcResult;
}

/** Longhorn's `rm-backing-image`: removes the config first, then collects the blocks nothing references any more. */
export async function deleteBackup(backupUrl: string, opts: StoreAccessOptions = {}): Promise<DeleteResult> {
  const { name, targetUrl } = parseBackupUrl(backupUrl);
  return withDriver(targetUrl, opts, (driver) =>
    withLock(driver, DELETION_LOCK, 'backup delete', opts.lockTiming, opts.signal, async () => {
      const configRemoved = await driver.exists(backingImageConfigPath(name), opts.signal);
      await driver.remove(backingImageDir(name), opts.signal);
      const gc = await collectGarbage(driver, false, opts.signal);
      return { name, configRemoved, gc };
    }),
  );
}

export interface GcOptions extends StoreAccessOptions {
  dryRun?: boolean;
}

/** Garbage-collects unreferenced blocks of a target under the deletion lock. */
export async function gcTarget(target: string, opts: GcOptions = {}): Promise<GcResult> {
  return withDriver(target, opts, (driver) =>
    withLock(driver, DELETION_LOCK, 'backup gc', opts.lockTiming, opts.signal, () =>
      collectGarbage(driver, opts.dryRun ?? false, opts.signal),
    ),
  );
}

export interface VerifyOptions extends StoreAccessOptions {
  /** Blocks read at once. Default 4. */
  concurrency?: number;
  onProgress?: (p: { checkedBlocks: number; totalBlocks: number }) => void;
}

export interface BlockProblem {
  blockChecksum: string;
  path: string;
  /** Backups referencing the block. */
  backups: string[];
  problem: 'missing' | 'corrupt';
  detail: string;
}

export interface VerifyResult {
  ok: boolean;
  backups: number;
  checkedBlocks: number;
  problems: BlockProblem[];
  /** Backups that were not checked (in progress, failed or unreadable) and why; an unreadable config makes `ok` false. */
  skippedBackups: { name: string; reason: string }[];
}

const IN_PROGRESS = 'in progress or failed';

/** Checks that every block referenced by a complete backup exists and decompresses to its checksum. */
export async function verifyTarget(target: string, opts: VerifyOptions = {}): Promise<VerifyResult> {
  const concurrency = opts.concurrency ?? 4;
  assertConcurrency(concurrency);
  const { signal } = opts;
  return withDriver(target, opts, (driver) =>
    withLock(driver, BACKUP_LOCK, 'backup verify', opts.lockTiming, signal, async () => {
      const names = await listBackingImageBackupNames(driver, signal);
      const users = new Map<string, { backups: string[]; method: ReturnType<typeof effectiveCompressionMethod> }>();
      const skippedBackups: { name: string; reason: string }[] = [];
      let backups = 0;
      for (const name of names) {
        let c: BackingImageBackupConfig;
        try {
          c = await loadConfig(driver, name, signal);
        } catch (err) {
          if (!(err instanceof BackupStoreError) || (err.code !== 'NotFound' && err.code !== 'Corrupt')) throw err;
          skippedBackups.push({ name, reason: err.message });
          continue;
        }
        if (c.completeTime === '') {
          skippedBackups.push({ name, reason: IN_PROGRESS });
          continue;
        }
        backups++;
        for (const b of c.blocks) {
          const u = users.get(b.blockChecksum);
          if (u) {
            if (!u.backups.includes(name)) u.backups.push(name);
          } else users.set(b.blockChecksum, { backups: [name], method: effectiveCompressionMethod(c) });
        }
      }
      const problems: BlockProblem[] = [];
      let checked = 0;
      const sums = [...users.keys()].sort();
      await forEachConcurrent(sums, concurrency, async (sum) => {
        throwIfAborted(signal);
        const u = users.get(sum)!;
        const p = blockPath(sum);
        try {
          const stored = await driver.read(p, signal);
          await decompressAndVerifyBlock(u.method, stored, sum, p);
        } catch (err) {
          throwIfAborted(signal);
          if (!(err instanceof BackupStoreError) || (err.code !== 'NotFound' && err.code !== 'Corrupt')) throw err;
          problems.push({ blockChecksum: sum, path: p, backups: u.backups, problem: err.code === 'NotFound' ? 'missing' : 'corrupt', detail: err.message });
        }
        checked++;
        opts.onProgress?.({ checkedBlocks: checked, totalBlocks: sums.length });
      });
      problems.sort((a, b) => a.blockChecksum.localeCompare(b.blockChecksum));
      const unreadable = skippedBackups.some((s) => s.reason !== IN_PROGRESS);
      return { ok: problems.length === 0 && !unreadable, backups, checkedBlocks: checked, problems, skippedBackups };
    }),
  );
}
