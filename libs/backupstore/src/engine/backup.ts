import { promises as fs } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { getDataExtents, mapBlocks, type BlockMapping } from '@bis/block-mapping';
import type { Sha512Chain } from '@bis/sha512-chain';
import type { BackupProgressState } from '@bis/state-machine';
import { compressBlock } from '../compression.js';
import { createWholeImageHash, encodeImageChain, type WholeImageHash } from '../image-chain.js';
import { BlockWorkerPool, SlotPool, writeStoredFramePieces, type PreparedBlock, type Slot } from '../pipeline.js';
import {
  encodeBackingImageConfig,
  goTimestamp,
  parseCompressionMethod,
  type BackingImageBackupConfig,
  type BlockEntry,
  type CompressionMethod,
} from '../config.js';
import type { BackupStoreDriver } from '../drivers/driver.js';
import { BACKUP_LOCK, BackupStoreLock, LONGHORN_LOCK_TIMING } from '../lock.js';
import {
  abortError,
  assertBackingImageName,
  BACKUP_BLOCK_SIZE,
  backingImageChainPath,
  backingImageConfigPath,
  BackupStoreError,
  blockPath,
  throwIfAborted,
} from '../names.js';
import { encodeBackupUrl } from '../url.js';
import { Semaphore } from '@bis/runtime';
import { assertConcurrency, forEachConcurrent, loadConfigIfExists, throttle, withDriver, type StoreAccessOptions } from './common.js';

export interface CreateBackupOptions extends StoreAccessOptions {
  /** Backup target URL (`s3://…`, `nfs://…`, `vfs://…`). */
  target: string;
  /** Backing image name; also the backup's name on the store. */
  name: string;
  /** The image file to back up (raw bytes; holes are skipped). */
  filePath: string;
  /** Default `lz4` (Longhorn's default setting). */
  compression?: CompressionMethod;
  /** Blocks processed at once (hash, compress, upload). Default 2 (Longhorn's default). */
  concurrency?: number;
  labels?: Readonly<Record<string, string>> | null;
  /** Expected whole-image SHA-512 (hex). The engine always computes it; a mismatch fails the backup. */
  checksum?: string;
  /**
   * Record the image's SHA-512 chain in the `backing-image.sha512chain` sidecar (parallel restore verification).
   * Default true; never recorded when the native `@bis/sha512-chain` addon is unavailable.
   */
  sha512Chain?: boolean;
  /** Backup parameters `secret` and `secret-namespace`, recorded in the config. */
  secret?: string;
  secretNamespace?: string;
  onProgress?: (progress: BackupProgress) => void;
}

export interface BackupProgress {
  name: string;
  /** Bytes of the image handled so far (data blocks, zero blocks and holes). */
  processedBytes: number;
  totalBytes: number;
  /** 0–100. Longhorn's rule: 95 at most while blocks are handled, 100 once the final config is written. */
  progress: number;
  /** Block files written by this backup and their stored (compressed) bytes. */
  uploadedBlocks: number;
  uploadedBytes: number;
  /** Data blocks already in the store (from other images, earlier runs or a concurrent backup). */
  reusedBlocks: number;
  /** All-zero blocks skipped (restored as holes). */
  zeroBlocks: number;
}

export interface BackupStatus extends BackupProgress {
  state: BackupProgressState;
  backupUrl: string;
  /** '' unless state is `error`. */
  error: string;
}

export interface BackupResult {
  name: string;
  backupUrl: string;
  size: number;
  /** Whole-image SHA-512 recorded in the config. */
  sha512: string;
  /** Block positions recorded (Longhorn's `BlockCount`). */
  blockCount: number;
  uploadedBlocks: number;
  uploadedBytes: number;
  reusedBlocks: number;
  zeroBlocks: number;
  /** True when a complete backup of this name already existed, so nothing was uploaded (Longhorn's rule). */
  alreadyExisted: boolean;
}

/** A running backup: its live status, and a promise for its result. */
export interface BackupOperation {
  readonly name: string;
  readonly backupUrl: string;
  status(): BackupStatus;
  readonly done: Promise<BackupResult>;
}

const CHECKSUM_RE = /^[a-f0-9]{128}$/;

/**
 * Uploads in flight in this process, keyed by store URL and block checksum, so that two backups running at once
 * upload a shared block once: the second waits for the first's upload.
 */
const uploadsInFlight = new Map<string, Promise<boolean>>();
/** Backups running in this process, keyed by store URL and name. */
const backupsInFlight = new Set<string>();

/** Uploads a block unless the store has it; resolves true when this call wrote it. `stored` produces its stored bytes. */
function uploadBlockOnce(
  driver: BackupStoreDriver,
  checksum: string,
  stored: () => Promise<Uint8Array | Uint8Array[]>,
  signal: AbortSignal | undefined,
  onWritten: (storedBytes: number) => void,
): Promise<boolean> {
  const key = `${driver.url}\0${checksum}`;
  const pending = uploadsInFlight.get(key);
  if (pending) return pending.then(() => false);
  const upload = (async () => {
    const p = blockPath(checksum);
    if (await driver.exists(p, signal)) return false;
    const bytes = await stored();
    await driver.write(p, bytes, signal);
    onWritten(Array.isArray(bytes) ? bytes.reduce((n, b) => n + b.byteLength, 0) : bytes.byteLength);
    return true;
  })();
  uploadsInFlight.set(key, upload);
  const forget = () => {
    if (uploadsInFlight.get(key) === upload) uploadsInFlight.delete(key);
  };
  upload.then(forget, forget);
  return upload;
}

function validate(opts: CreateBackupOptions): { method: CompressionMethod; concurrency: number } {
  if (!opts.target) throw new BackupStoreError('InvalidArgument', 'missing input parameter: backup target');
  assertBackingImageName(opts.name);
  const method = parseCompressionMethod(opts.compression ?? 'lz4');
  const concurrency = opts.concurrency ?? 2;
  assertConcurrency(concurrency);
  for (const key of Object.keys(opts.labels ?? {})) {
    if (key === '') throw new BackupStoreError('InvalidArgument', 'invalid label: empty key');
  }
  if (opts.checksum !== undefined && opts.checksum !== '' && !CHECKSUM_RE.test(opts.checksum)) {
    throw new BackupStoreError('InvalidArgument', `invalid checksum ${JSON.stringify(opts.checksum)}: expected 128 lowercase hex characters (SHA-512)`);
  }
  return { method, concurrency };
}

/**
 * Starts a backing-image backup and returns at once with its live status. The result promise settles when the
 * final config is written (or the backup failed; the status then holds the error).
 */
export function startBackup(opts: CreateBackupOptions): BackupOperation {
  const { method, concurrency } = validate(opts);
  const backupUrl = encodeBackupUrl(opts.name, opts.target);
  const status: BackupStatus = {
    name: opts.name,
    backupUrl,
    state: 'in_progress',
    error: '',
    processedBytes: 0,
    totalBytes: 0,
    progress: 0,
    uploadedBlocks: 0,
    uploadedBytes: 0,
    reusedBlocks: 0,
    zeroBlocks: 0,
  };
  const report = throttle(opts.onProgress);
  const done = runBackup(opts, method, concurrency, backupUrl, status, report).then(
    (result) => {
      status.state = 'complete';
      status.progress = 100;
      status.processedBytes = status.totalBytes;
      report({ ...status }, true);
      return result;
    },
    (cause: unknown) => {
      const err = opts.signal?.aborted && !(cause instanceof BackupStoreError && cause.code === 'Aborted') ? abortError(opts.signal) : cause;
      status.state = 'error';
      status.error = err instanceof Error ? err.message : String(err);
      throw err;
    },
  );
  done.catch(() => undefined); // the caller may only poll status(); the rejection is still delivered to awaiters
  return { name: opts.name, backupUrl, status: () => ({ ...status }), done };
}

/** Backs up a file and resolves when the backup is complete. */
export async function createBackup(opts: CreateBackupOptions): Promise<BackupResult> {
  return startBackup(opts).done;
}

async function runBackup(
  opts: CreateBackupOptions,
  method: CompressionMethod,
  concurrency: number,
  backupUrl: string,
  status: BackupStatus,
  report: (p: BackupProgress, force?: boolean) => void,
): Promise<BackupResult> {
  const { signal } = opts;
  throwIfAborted(signal);
  const st = await fs.stat(opts.filePath).catch((err: unknown) => {
    throw new BackupStoreError('NotFound', `cannot back up ${opts.filePath}: ${(err as Error).message}`, { cause: err });
  });
  if (!st.isFile()) throw new BackupStoreError('InvalidArgument', `cannot back up ${opts.filePath}: not a regular file`);
  status.totalBytes = st.size;
  const timing = opts.lockTiming ?? LONGHORN_LOCK_TIMING;

  return withDriver(opts.target, opts, async (driver) => {
    const runningKey = `${driver.url}\0${opts.name}`;
    if (backupsInFlight.has(runningKey)) {
      throw new BackupStoreError('InProgress', `a backup of ${opts.name} to ${driver.url} is already running`);
    }
    backupsInFlight.add(runningKey);
    const lock = new BackupStoreLock(driver, BACKUP_LOCK, timing);
    // The source image is read and its whole-image SHA-512 started while the lock is being acquired (reading the
    // source needs no lock); the store is written only once the lock is held.
    let source: BackupSource | undefined;
    try {
      source = await BackupSource.open(opts.filePath, st.size, concurrency, method === 'lz4', opts.sha512Chain ?? true, signal);
      await lock.acquire('backup create', signal);
      const cfgPath = backingImageConfigPath(opts.name);
      const chainPath = backingImageChainPath(opts.name);
      const existing = await loadConfigIfExists(driver, opts.name, signal);
      if (existing) {
        if (existing.completeTime !== '') {
          if (opts.checksum && existing.checksum !== '' && existing.checksum !== opts.checksum) {
            throw new BackupStoreError(
              'AlreadyExists',
              `backup backing image ${opts.name} already exists in ${driver.url} with checksum ${existing.checksum}, not ${opts.checksum}`,
            );
          }
          status.totalBytes = existing.size;
          return {
            name: opts.name,
            backupUrl,
            size: existing.size,
            sha512: existing.checksum,
            blockCount: existing.blocks.length,
            uploadedBlocks: 0,
            uploadedBytes: 0,
            reusedBlocks: 0,
            zeroBlocks: 0,
            alreadyExisted: true,
          };
        }
        // An in-progress marker: a live backup refreshes it every refresh interval; an old one is a leftover of a
        // failed backup and is taken over (Longhorn would report success without uploading anything). A young one
        // is watched until one of the two is clear: refreshed (a live writer: refused), or not refreshed until it is
        // older than the lock duration (its writer died mid-backup, e.g. killed: taken over), so a backup that
        // replaces one whose writer died completes without anybody waiting for the marker by hand.
        await waitForStaleMarker(driver, cfgPath, opts.name, timing, signal);
      }
      const config: BackingImageBackupConfig = {
        name: opts.name,
        size: st.size,
        blockCount: 0,
        checksum: opts.checksum ?? '',
        labels: opts.labels ? { ...opts.labels } : null,
        compressionMethod: method,
        createdTime: goTimestamp(),
        completeTime: '',
        secret: '',
        secretNamespace: '',
        blocks: [],
      };
      const marker = encodeBackingImageConfig(config, true);
      await driver.write(cfgPath, marker, signal);
      // One refresh at a time: a write that is still being retried (the store is unreachable) must be the one awaited
      // before the final config is written, or it could land after it and turn the backup back into a marker.
      let refreshing: Promise<void> | undefined;
      const markerRefresh = setInterval(() => {
        if (refreshing) return;
        refreshing = driver
          .write(cfgPath, marker)
          // A failed refresh is not an error of the backup: the marker only goes stale, and the next refresh retries.
          .catch(() => undefined)
          .finally(() => {
            refreshing = undefined;
          });
      }, timing.refreshMs);
      markerRefresh.unref();
      let completed = false;
      try {
        const { blocks, sha512, chain } = await uploadBlocks(driver, source, opts, method, concurrency, st.size, status, report);
        if (opts.checksum && opts.checksum !== sha512) {
          throw new BackupStoreError(
            'ChecksumMismatch',
            `${opts.filePath} has SHA-512 ${sha512}, but the backup was requested for checksum ${opts.checksum}`,
          );
        }
        blocks.sort((a, b) => a.offset - b.offset);
        clearInterval(markerRefresh);
        await refreshing;
        const final: BackingImageBackupConfig = {
          ...config,
          checksum: sha512,
          blocks,
          blockCount: blocks.length,
          completeTime: goTimestamp(),
          secret: opts.secret ?? '',
          secretNamespace: opts.secretNamespace ?? '',
        };
        throwIfAborted(signal);
        // The chain sidecar goes first, so that a complete config never points at a missing chain.
        if (chain) await driver.write(chainPath, encodeImageChain(chain), signal);
        else await driver.remove(chainPath, signal); // a leftover of an earlier failed attempt
        await driver.write(cfgPath, encodeBackingImageConfig(final, false), signal);
        completed = true;
        return {
          name: opts.name,
          backupUrl,
          size: st.size,
          sha512,
          blockCount: blocks.length,
          uploadedBlocks: status.uploadedBlocks,
          uploadedBytes: status.uploadedBytes,
          reusedBlocks: status.reusedBlocks,
          zeroBlocks: status.zeroBlocks,
          alreadyExisted: false,
        };
      } finally {
        clearInterval(markerRefresh);
        await refreshing;
        if (!completed) {
          // Remove our own in-progress marker so that it neither blocks GC nor a retry. If the store is unreachable
          // the marker stays and goes stale after the lock duration. The sidecar goes first (a directory holding
          // only a sidecar is not a backup).
          // Best effort (see above): an unreachable store leaves the marker to go stale.
          await driver.remove(chainPath).catch(() => undefined);
          await driver.remove(cfgPath).catch(() => undefined);
        }
      }
    } finally {
      backupsInFlight.delete(runningKey);
      await source?.close();
      // Best effort: a lock that cannot be removed goes stale after the lock duration; the backup outcome stands.
      await lock.release().catch(() => undefined);
    }
  });
}

/** Extra slots beyond `concurrency`: blocks read ahead, and blocks waiting for the in-order whole-image hash. */
const READ_AHEAD_SLOTS = 4;

/**
 * Two streams run at once once the lock is held:
 *
 * - the blocks the lock-wait pass already named and hashed ({@link BackupSource.known}) are only uploaded, at most
 *   `concurrency` at once, each read again into a slot of a small pool of their own only when the store lacks it;
 * - the rest are read in order into a fixed set of shared slots; block worker threads check each for zeros, name it
 *   (SHA-512) and frame it when it does not compress; at most `concurrency` uploads run at once; the whole-image
 *   SHA-512 is fed in offset order on its own thread (holes and zero blocks from a shared zero buffer).
 *
 * The whole-image hash is the critical path, so it never waits behind the first stream's uploads. Memory is bounded by
 * the slot counts, whatever the image size.
 */
async function uploadBlocks(
  driver: BackupStoreDriver,
  source: BackupSource,
  opts: CreateBackupOptions,
  method: CompressionMethod,
  concurrency: number,
  size: number,
  status: BackupStatus,
  report: (p: BackupProgress, force?: boolean) => void,
): Promise<{ blocks: BlockEntry[]; sha512: string; chain: Sha512Chain | undefined }> {
  const { signal } = opts;
  const { mappings, pool, workers, image, fh } = source;
  const blocks: BlockEntry[] = [];
  let failure: { err: unknown } | undefined;
  const fail = (err: unknown) => {
    failure ??= { err };
  };
  // Blocks before `prehashed.next` are already in the whole-image hash, named and zero-checked.
  const prehashed = await source.stopPrehash();
  const uploads = new Semaphore(concurrency);
  let posted = prehashed.posted; // image bytes submitted to the whole-image hash, in order
  let pendingBytes = 0; // bytes of blocks read but not finished
  let readEnd = prehashed.posted; // end of the last block read (or handled by the lock-wait pass)
  let order: Promise<void> = Promise.resolve();
  const settled = new Set<Promise<void>>();
  const progress = () => {
    status.processedBytes = Math.max(0, Math.min(posted, readEnd) - pendingBytes);
    status.progress = size === 0 ? 95 : Math.floor((status.processedBytes / size) * 95);
    report({ ...status });
  };
  const upload = async (checksum: string, stored: () => Promise<Uint8Array | Uint8Array[]>) => {
    await uploads.run(async () => {
      const wrote = await uploadBlockOnce(driver, checksum, stored, signal, (bytes) => {
        status.uploadedBlocks++;
        status.uploadedBytes += bytes;
      });
      if (!wrote) status.reusedBlocks++;
    });
  };

  // Stream 1: uploads of the blocks handled during the lock wait.
  const knownIndexes: number[] = [];
  for (let index = 0; index < prehashed.next; index++) {
    const known = source.known(index);
    const m = mappings[index] as BlockMapping;
    if (!known) throw new BackupStoreError('Io', `internal error: block at ${m.offset} was hashed during the lock wait but not named`);
    if (known.zero) status.zeroBlocks++;
    else {
      knownIndexes.push(index);
      pendingBytes += m.size;
    }
  }
  const knownPool = knownIndexes.length > 0 ? new SlotPool(Math.min(concurrency, knownIndexes.length)) : undefined;
  const knownUploads = forEachConcurrent(knownIndexes, concurrency, async (index) => {
    if (failure) return;
    throwIfAborted(signal);
    const known = source.known(index) as Extract<KnownBlock, { zero: false }>;
    const m = mappings[index] as BlockMapping;
    const slot = await (knownPool as SlotPool).acquire();
    try {
      await upload(known.checksum, async () => {
        await readFully(fh, slot.data, m.size, m.offset, opts.filePath);
        return known.xxh !== undefined ? writeStoredFramePieces(slot, m.size, known.xxh) : compressBlock(method, slot.data.subarray(0, m.size));
      });
      blocks.push({ offset: m.offset, blockChecksum: known.checksum });
    } finally {
      (knownPool as SlotPool).release(slot);
      pendingBytes -= m.size;
      if (!failure) progress();
    }
  }).catch((err: unknown) => fail(err));

  // Stream 2: the rest, in order.
  const handle = async (offset: number, length: number, slot: Slot, prepared: PreparedBlock): Promise<void> => {
    if (prepared.zero) {
      status.zeroBlocks++;
      return;
    }
    const data = slot.data.subarray(0, length);
    const stored = (): Promise<Uint8Array | Uint8Array[]> =>
      prepared.frame.length > 0 ? Promise.resolve(prepared.frame) : compressBlock(method, data);
    await upload(prepared.checksum, stored);
    blocks.push({ offset, blockChecksum: prepared.checksum });
  };
  try {
    for (let index = prehashed.next; index < mappings.length; index++) {
      const m = mappings[index] as BlockMapping;
      const slot = await pool.acquire();
      if (failure || signal?.aborted) {
        pool.release(slot);
        break;
      }
      try {
        await readFully(fh, slot.data, m.size, m.offset, opts.filePath);
      } catch (err) {
        pool.release(slot);
        fail(err);
        break;
      }
      pendingBytes += m.size;
      readEnd = m.offset + m.size;
      const prepared = workers.prepare(slot, m.size, method === 'lz4');
      const uploaded = prepared.then((p) => handle(m.offset, m.size, slot, p));
      // The whole-image hash takes the blocks in offset order: holes before the block, then the block itself.
      const step = order.then(async () => {
        const p = await prepared;
        const gap = image.zeros(m.offset - posted);
        const own = p.zero ? image.zeros(m.size) : image.update(slot.data.subarray(0, m.size));
        posted = m.offset + m.size;
        // Wrapped: the next block is submitted without waiting for this one's hash.
        return { done: Promise.all([gap, own]).then(() => undefined) };
      });
      order = step.then(() => undefined);
      order.catch(() => undefined); // failures reach the caller through `hashed`
      const hashed = step.then((s) => s.done);
      const finished: Promise<void> = Promise.all([uploaded, hashed]).then(
        () => undefined,
        (err: unknown) => fail(err),
      );
      settled.add(finished);
      // `finished` never rejects (its failure goes to fail()); this only cleans up after it.
      void finished.finally(() => {
        settled.delete(finished);
        pool.release(slot);
        pendingBytes -= m.size;
        if (!failure) progress();
      });
    }
    await Promise.all(settled);
    await knownUploads;
    if (failure) throw failure.err;
    throwIfAborted(signal);
    await order;
    await image.zeros(size - posted);
    posted = size;
    readEnd = size;
    progress();
    return { blocks, ...(await image.finish()) };
  } finally {
    await Promise.allSettled([...settled, knownUploads]);
  }
}

/** A block the lock-wait pass has read, named and zero-checked (and, for LZ4, found incompressible: `xxh`). */
type KnownBlock = { zero: true } | { zero: false; checksum: string; xxh?: number };

/**
 * The source side of a backup: the image's block mappings, an open handle, the slot pool, the block workers and the
 * whole-image hasher. Opened before the store lock is acquired: until `stopPrehash`, it reads the mapped blocks in
 * order into free slots, feeds them to the whole-image hash and has the block workers name, zero-check and (for LZ4)
 * frame-checksum them, keeping only those small results, so that the lock's check wait is not idle time: after it
 * only the uploads of those blocks are left.
 */
class BackupSource {
  private stopRequested = false;
  /** What the lock-wait pass learnt about each block it read, by mapping index. */
  private readonly plan: (KnownBlock | undefined)[] = [];
  private prehash: Promise<{ next: number; posted: number }> = Promise.resolve({ next: 0, posted: 0 });

  private constructor(
    readonly mappings: readonly BlockMapping[],
    readonly fh: fs.FileHandle,
    readonly pool: SlotPool,
    readonly workers: BlockWorkerPool,
    readonly image: WholeImageHash,
    private readonly file: string,
    private readonly lz4: boolean,
  ) {}

  /** The block at mapping `index` as the lock-wait pass found it (undefined when that pass did not reach it). */
  known(index: number): KnownBlock | undefined {
    return this.plan[index];
  }

  static async open(
    file: string,
    size: number,
    concurrency: number,
    lz4: boolean,
    chain: boolean,
    signal: AbortSignal | undefined,
  ): Promise<BackupSource> {
    const mappings = mapBlocks(await getDataExtents(file, { signal }), size, BACKUP_BLOCK_SIZE);
    const fh = await fs.open(file, 'r');
    const pool = new SlotPool(concurrency + READ_AHEAD_SLOTS);
    const source = new BackupSource(mappings, fh, pool, new BlockWorkerPool(pool, concurrency), createWholeImageHash(pool.memory, chain), file, lz4);
    source.prehash = source.runPrehash(signal);
    source.prehash.catch(() => undefined); // awaited (failure included) by stopPrehash() before the blocks are read, and by close()
    return source;
  }

  private async runPrehash(signal: AbortSignal | undefined): Promise<{ next: number; posted: number }> {
    let next = 0;
    let posted = 0;
    const hashing: Promise<void>[] = [];
    try {
      while (next < this.mappings.length && !this.stopRequested && !signal?.aborted) {
        const m = this.mappings[next] as BlockMapping;
        const slot = await this.pool.acquire();
        if (this.stopRequested) {
          this.pool.release(slot);
          break;
        }
        try {
          await readFully(this.fh, slot.data, m.size, m.offset, this.file);
        } catch (err) {
          this.pool.release(slot);
          throw err;
        }
        const gap = this.image.zeros(m.offset - posted);
        const own = this.image.update(slot.data.subarray(0, m.size));
        const index = next;
        const prepared = this.workers.prepare(slot, m.size, this.lz4).then((p) => {
          this.plan[index] = p.zero ? { zero: true } : { zero: false, checksum: p.checksum, ...(p.xxh !== undefined ? { xxh: p.xxh } : {}) };
        });
        hashing.push(Promise.all([gap, own, prepared]).finally(() => this.pool.release(slot)).then(() => undefined));
        posted = m.offset + m.size;
        next++;
      }
    } finally {
      await Promise.allSettled(hashing);
    }
    await Promise.all(hashing);
    return { next, posted };
  }

  /** Stops reading ahead; resolves when every block read so far is hashed (their slots are free again). */
  stopPrehash(): Promise<{ next: number; posted: number }> {
    this.stopRequested = true;
    return this.prehash;
  }

  async close(): Promise<void> {
    this.stopRequested = true;
    // Closing: a prehash failure was already reported to the reads that needed it, and a close error changes nothing.
    await this.prehash.catch(() => undefined);
    await this.fh.close().catch(() => undefined);
    await Promise.all([this.image.close(), this.workers.close()]);
  }
}

/** Reads exactly `length` bytes at `position` into the start of `target`. */
async function readFully(fh: fs.FileHandle, target: Buffer, length: number, position: number, file: string): Promise<void> {
  let got = 0;
  while (got < length) {
    const { bytesRead } = await fh.read(target, got, length - got, position + got);
    if (bytesRead === 0) throw new BackupStoreError('Io', `${file} ended at ${position + got} bytes while reading the block at ${position}`);
    got += bytesRead;
  }
}


/**
 * Returns once the in-progress marker at `cfgPath` is older than the lock duration without having been refreshed;
 * throws `InProgress` as soon as it is refreshed (a live backup is writing it). Checks every quarter of the refresh
 * interval, so a live writer is seen within about one refresh interval.
 */
async function waitForStaleMarker(
  driver: BackupStoreDriver,
  cfgPath: string,
  name: string,
  timing: { durationMs: number; refreshMs: number },
  signal: AbortSignal | undefined,
): Promise<void> {
  const first = (await driver.modificationTime(cfgPath, signal)).getTime();
  const step = Math.max(10, Math.floor(timing.refreshMs / 4));
  for (;;) {
    const age = Date.now() - first;
    if (age > timing.durationMs) return;
    await sleep(Math.min(step, timing.durationMs - age + 1), undefined, signal ? { signal } : {});
    const now = (await driver.modificationTime(cfgPath, signal)).getTime();
    if (now !== first) {
      throw new BackupStoreError(
        'InProgress',
        `backup backing image ${name} is still in progress in ${driver.url} (its marker was updated ${Math.max(0, Math.round((Date.now() - now) / 1000))} s ago)`,
      );
    }
  }
}
