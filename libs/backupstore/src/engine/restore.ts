import { randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { isAllZero } from '@bis/block-mapping';
import { decompressAndVerifyBlock } from '../compression.js';
import { ImageHasher } from '../image-hash.js';
import { effectiveCompressionMethod, type BackingImageBackupConfig } from '../config.js';
import type { BackupStoreDriver } from '../drivers/driver.js';
import { RESTORE_LOCK, withLock } from '../lock.js';
import {
  abortError,
  BACKUP_BLOCK_SIZE,
  backingImageConfigPath,
  BackupStoreError,
  blockPath,
  throwIfAborted,
} from '../names.js';
import { parseBackupUrl } from '../url.js';
import { assertConcurrency, loadConfig, throttle, withDriver, type StoreAccessOptions } from './common.js';

export interface RestoreBackupOptions extends StoreAccessOptions {
  /** `<target>?backingImage=<name>` */
  backupUrl: string;
  /** The file to produce. It is written beside it under a temporary name and renamed into place when verified. */
  output: string;
  /** Blocks fetched and decompressed at once. Default 2. */
  concurrency?: number;
  onProgress?: (progress: RestoreProgress) => void;
}

export interface RestoreProgress {
  name: string;
  /** Bytes of the image restored and verified so far, in order (holes included). */
  processedBytes: number;
  totalBytes: number;
  /** 0–100 */
  progress: number;
}

export interface RestoreResult {
  name: string;
  size: number;
  /** SHA-512 of the restored file, equal to the backup's recorded checksum. */
  sha512: string;
  blockCount: number;
}

function checkBlockList(config: BackingImageBackupConfig): void {
  const where = backingImageConfigPath(config.name);
  let previous = -1;
  for (const b of config.blocks) {
    if (b.offset % BACKUP_BLOCK_SIZE !== 0 || b.offset >= config.size) {
      throw new BackupStoreError('Corrupt', `${where}: block ${b.blockChecksum} has invalid offset ${b.offset} for an image of ${config.size} bytes`);
    }
    if (b.offset <= previous) {
      throw new BackupStoreError('Corrupt', `${where}: block offsets are not strictly ascending at ${b.offset}`);
    }
    previous = b.offset;
  }
}

async function fetchBlock(
  driver: BackupStoreDriver,
  config: BackingImageBackupConfig,
  offset: number,
  checksum: string,
  signal: AbortSignal | undefined,
): Promise<Buffer> {
  const p = blockPath(checksum);
  let stored: Buffer;
  try {
    stored = await driver.read(p, signal);
  } catch (err) {
    if (err instanceof BackupStoreError && err.code === 'NotFound') {
      throw new BackupStoreError('Corrupt', `block ${p} (offset ${offset}) of backup ${config.name} is missing from the backupstore`, { cause: err });
    }
    throw err;
  }
  const data = await decompressAndVerifyBlock(effectiveCompressionMethod(config), stored, checksum, p);
  const expected = Math.min(BACKUP_BLOCK_SIZE, config.size - offset);
  if (data.length !== expected) {
    throw new BackupStoreError('Corrupt', `block ${p} at offset ${offset} holds ${data.length} bytes, expected ${expected}`);
  }
  return data;
}

/**
 * Restores a backing-image backup into `output`: the file is truncated to the image size (so unlisted blocks stay
 * holes), every block is fetched, decompressed, verified against its name and written at its offset (all-zero blocks
 * are left as holes), and the SHA-512 of the whole image, computed in order while restoring, must equal the
 * recorded checksum. The output appears only when everything matched.
 */
export async function restoreBackup(opts: RestoreBackupOptions): Promise<RestoreResult> {
  const { signal } = opts;
  const concurrency = opts.concurrency ?? 2;
  assertConcurrency(concurrency);
  const { name, targetUrl } = parseBackupUrl(opts.backupUrl);
  const report = throttle(opts.onProgress);
  try {
    return await withDriver(targetUrl, opts, (driver) =>
      withLock(driver, RESTORE_LOCK, 'backup restore', opts.lockTiming, signal, async () => {
        const config = await loadConfig(driver, name, signal);
        if (config.completeTime === '') {
          throw new BackupStoreError('InProgress', `backup backing image ${name} is still in progress or failed: it cannot be restored`);
        }
        effectiveCompressionMethod(config);
        checkBlockList(config);
        const output = path.resolve(opts.output);
        const tmp = path.join(path.dirname(output), `.${path.basename(output)}.restore-${randomBytes(4).toString('hex')}`);
        const fh = await fs.open(tmp, 'wx', 0o644);
        let renamed = false;
        try {
          await fh.truncate(config.size);
          const image = new ImageHasher();
          let hashed = 0;
          const hashHoleUntil = async (end: number) => {
            if (end > hashed) await image.zeros(end - hashed);
            hashed = Math.max(hashed, end);
          };
          const progress = (force = false) =>
            report(
              {
                name,
                processedBytes: hashed,
                totalBytes: config.size,
                progress: config.size === 0 ? 100 : Math.floor((hashed / config.size) * 100),
              },
              force,
            );
          // A window of `concurrency` blocks is fetched, verified and written in parallel; the whole-image hash
          // consumes them in offset order.
          const queue: Promise<Buffer>[] = [];
          let next = 0;
          const launch = () => {
            const b = config.blocks[next++];
            if (!b) return;
            const task = fetchBlock(driver, config, b.offset, b.blockChecksum, signal).then(async (data) => {
              throwIfAborted(signal);
              if (!isAllZero(data)) {
                let written = 0;
                while (written < data.length) {
                  const { bytesWritten } = await fh.write(data, written, data.length - written, b.offset + written);
                  written += bytesWritten;
                }
              }
              return data;
            });
            task.catch(() => undefined);
            queue.push(task);
          };
          try {
            while (queue.length < concurrency && next < config.blocks.length) launch();
            for (let i = 0; i < config.blocks.length; i++) {
              const b = config.blocks[i]!;
              const data = await queue.shift()!;
              launch();
              await hashHoleUntil(b.offset);
              await image.update(data);
              hashed += data.length;
              progress();
            }
            await hashHoleUntil(config.size);
          } finally {
            // Let every launched fetch settle before the file handle closes.
            await Promise.allSettled(queue);
            if (hashed < config.size) await image.close();
          }
          const sha512 = await image.digest().finally(() => image.close());
          if (config.checksum !== '' && sha512 !== config.checksum) {
            throw new BackupStoreError(
              'ChecksumMismatch',
              `restored image ${name} has SHA-512 ${sha512}, but the backup records ${config.checksum}`,
            );
          }
          await fh.sync();
          await fh.close();
          throwIfAborted(signal);
          await fs.rename(tmp, output);
          renamed = true;
          progress(true);
          return { name, size: config.size, sha512, blockCount: config.blocks.length };
        } finally {
          await fh.close().catch(() => undefined);
          if (!renamed) await fs.rm(tmp, { force: true }).catch(() => undefined);
        }
      }),
    );
  } catch (err) {
    if (signal?.aborted && !(err instanceof BackupStoreError && err.code === 'Aborted')) throw abortError(signal);
    throw err;
  }
}
