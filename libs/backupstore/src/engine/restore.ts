import { randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import { availableParallelism } from 'node:os';
import * as path from 'node:path';
import { isAllZero } from '@bis/block-mapping';
import { DirectFileWriter } from '@bis/direct-io';
import { multiBufferLanes, Sha512ChainMismatchError, Sha512ChainVerifier, type Sha512Chain } from '@bis/sha512-chain';
import { decompressAndVerifyBlock } from '../compression.js';
import { ImageHasher } from '../image-hash.js';
import { BlockWorkerPool, SlotPool, type Slot } from '../pipeline.js';
import { decodeBackingImageConfig, effectiveCompressionMethod, type BackingImageBackupConfig } from '../config.js';
import type { BackupStoreDriver } from '../drivers/driver.js';
import { BackupStoreLock, LONGHORN_LOCK_TIMING, RESTORE_LOCK } from '../lock.js';
import {
  abortError,
  BACKUP_BLOCK_SIZE,
  backingImageChainPath,
  backingImageConfigPath,
  BackupStoreError,
  blockPath,
  throwIfAborted,
} from '../names.js';
import { parseBackupUrl } from '../url.js';
import { DiskPathError, confineToRoot } from '@bis/disk-path';
import { usableImageChain } from '../image-chain.js';
import { Semaphore } from '@bis/runtime';
import { assertConcurrency, throttle, withDriver, type StoreAccessOptions } from './common.js';

export interface RestoreBackupOptions extends StoreAccessOptions {
  /** `<target>?backingImage=<name>` */
  backupUrl: string;
  /** The file to produce. It is written beside it under a temporary name and renamed into place when verified. */
  output: string;
  /**
   * Confine `output` to this directory (a disk root): it must lie inside it (a relative `output` is taken relative to
   * it), without `.`/`..` segments, NUL bytes or a symbolic link leading out of it, and must not be a link itself
   * (`@bis/disk-path` `confineToRoot`). A refusal (`DiskPathError`) comes before anything is read or written.
   */
  root?: string;
  /** Blocks fetched and decompressed at once. Default 2. */
  concurrency?: number;
  onProgress?: (progress: RestoreProgress) => void;
  /**
   * Called with the image size the backup's config declares, after the config is read and before the output's
   * temporary file is created: a throw (an image larger than the destination may take) stops the restore with that
   * error, and nothing is written.
   */
  checkSize?: (size: number) => void | Promise<void>;
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
  /**
   * How the whole-image SHA-512 was verified: `sha512-chain` (in parallel, with the backup's chain sidecar) or
   * `sequential` (one in-order pass: no usable sidecar, e.g. a Longhorn backup).
   */
  verification: 'sha512-chain' | 'sequential';
  /**
   * With `sha512-chain`: the chain every segment of the restored file was verified against, so the file can be sent
   * and verified segment by segment without being hashed again.
   */
  chain?: Sha512Chain;
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

/**
 * How long a segment of a chained restore may wait for a full eight-segment SHA-512 pass (ms): the restore keeps
 * eight blocks and many holes waiting, so passes fill up instead of starting half empty.
 */
const RESTORE_HASH_PATIENCE_MS = 10;

/** Extra slots beyond `concurrency`: blocks waiting for the in-order whole-image hash. */
const HASH_WINDOW_SLOTS = 4;

/** Reads a stored block into `slot.stored` (in place when the driver can), naming a missing block. */
async function readStoredBlock(
  driver: BackupStoreDriver,
  config: BackingImageBackupConfig,
  offset: number,
  p: string,
  slot: Slot,
  signal: AbortSignal | undefined,
): Promise<number> {
  try {
    if (driver.readInto) return await driver.readInto(p, slot.stored, signal);
    const stored = await driver.read(p, signal);
    if (stored.byteLength > slot.stored.byteLength) {
      throw new BackupStoreError('Corrupt', `${p} holds ${stored.byteLength} bytes, more than the ${slot.stored.byteLength} a stored block can have`);
    }
    slot.stored.set(stored);
    return stored.byteLength;
  } catch (err) {
    if (err instanceof BackupStoreError && err.code === 'NotFound') {
      throw new BackupStoreError('Corrupt', `block ${p} (offset ${offset}) of backup ${config.name} is missing from the backupstore`, { cause: err });
    }
    throw err;
  }
}

/**
 * Fetches one block into its slot and (with `verify`) checks it against its name. Raw blocks and uncompressed LZ4
 * frames are used (and verified) in place on a block worker; anything else is decompressed (libuv pool) into
 * `slot.data`, and always verified, because the name decides between encodings. Returns the block's data (a view of
 * the slot) and whether it is all zeros.
 */
async function fetchBlock(
  driver: BackupStoreDriver,
  workers: BlockWorkerPool,
  config: BackingImageBackupConfig,
  offset: number,
  checksum: string,
  slot: Slot,
  verify: boolean,
  signal: AbortSignal | undefined,
  coveredByChain = false,
): Promise<{ data: Buffer; zero: boolean }> {
  const p = blockPath(checksum);
  const storedLength = await readStoredBlock(driver, config, offset, p, slot, signal);
  throwIfAborted(signal);
  // With the SHA-512 chain every block's bytes are verified by their segment's link, so decoded frames need no name.
  const trustDecoded = coveredByChain && !verify;
  const checked = await workers.check(slot, storedLength, verify, !trustDecoded);
  let data: Buffer;
  let zero: boolean;
  if (checked.fast && ((!verify && (!checked.decoded || trustDecoded)) || checked.checksum === checksum)) {
    const area = checked.decoded ? slot.data : slot.stored;
    data = area.subarray(checked.dataOffset, checked.dataOffset + checked.dataLength);
    zero = checked.zero;
  } else {
    // Compressed, or not what its name says: decode (sniffing the encoding, as Longhorn's fallback does); this
    // throws Longhorn's verification error when no decoding matches the name.
    const decoded = await decompressAndVerifyBlock(effectiveCompressionMethod(config), slot.stored.subarray(0, storedLength), checksum, p);
    slot.data.set(decoded);
    data = slot.data.subarray(0, decoded.byteLength);
    zero = isAllZero(data);
  }
  const expected = Math.min(BACKUP_BLOCK_SIZE, config.size - offset);
  if (data.length !== expected) {
    throw new BackupStoreError('Corrupt', `block ${p} at offset ${offset} holds ${data.length} bytes, expected ${expected}`);
  }
  return { data, zero };
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
  if (opts.root !== undefined) opts = { ...opts, output: await confineToRoot(opts.root, opts.output, 'output') };
  else if (opts.output === '' || opts.output.includes('\0')) throw new DiskPathError('output', opts.output === '' ? 'empty' : 'nul-byte', opts.output, 'not a file path');
  const report = throttle(opts.onProgress);
  try {
    return await withDriver(targetUrl, opts, async (driver) => {
      // The restore starts as soon as this process's lock file is on the store and runs during the lock's check
      // wait; its output is kept only if the lock is then acquired and the config is unchanged. Safe because only
      // the local temporary file is written before that, and a deletion that could remove blocks under this
      // restore either already holds the lock or has priority, so the acquisition fails and the work is dropped.
      const lock = new BackupStoreLock(driver, RESTORE_LOCK, opts.lockTiming ?? LONGHORN_LOCK_TIMING);
      let announce: () => void = () => undefined;
      const announced = new Promise<void>((resolve) => (announce = resolve));
      const locked = lock.acquire('backup restore', signal, announce);
      // An acquire failure is thrown by the `await locked` below; this only keeps it from being unhandled meanwhile.
      locked.catch(() => undefined);
      try {
        await Promise.race([announced, locked]);
        const speculation = new AbortController();
        locked.catch((err: unknown) => speculation.abort(err));
        const work = signal ? AbortSignal.any([signal, speculation.signal]) : speculation.signal;
        let configText = '';
        const attempt = await restoreOnce(driver, name, opts, concurrency, work, report, (text) => (configText = text), async () => {
          await locked;
          const now = (await driver.read(backingImageConfigPath(name), signal)).toString('utf8');
          return now === configText;
        }).catch(async (err: unknown) => {
          await locked; // a lost lock explains (and replaces) whatever the dropped work ran into
          throw err;
        });
        if (attempt) return attempt;
        // The config changed during the check wait: start again, now under the lock.
        return await restoreOnce(driver, name, opts, concurrency, signal, report, () => undefined, async () => true).then((r) => {
          if (!r) throw new BackupStoreError('Io', `backup backing image ${name} changed while it was restored`);
          return r;
        });
      } finally {
        // Best effort: a lock that cannot be removed goes stale after the lock duration; the restore result stands.
        await lock.release().catch(() => undefined);
      }
    });
  } catch (err) {
    if (signal?.aborted && !(err instanceof BackupStoreError && err.code === 'Aborted')) throw abortError(signal);
    throw err;
  }
}

/**
 * One restore into a temporary file. `commit` is awaited before the file is renamed into place; when it returns false
 * the file is dropped and the result is undefined.
 */
async function restoreOnce(
  driver: BackupStoreDriver,
  name: string,
  opts: RestoreBackupOptions,
  concurrency: number,
  signal: AbortSignal | undefined,
  report: (p: RestoreProgress, force?: boolean) => void,
  sawConfig: (text: string) => void,
  commit: () => Promise<boolean>,
): Promise<RestoreResult | undefined> {
  const cfgPath = backingImageConfigPath(name);
  const text = (await driver.read(cfgPath, signal)).toString('utf8');
  sawConfig(text);
  const config = decodeBackingImageConfig(text, cfgPath);
  if (config.completeTime === '') {
    throw new BackupStoreError('InProgress', `backup backing image ${name} is still in progress or failed: it cannot be restored`);
  }
  effectiveCompressionMethod(config);
  checkBlockList(config);
  await opts.checkSize?.(config.size);
  throwIfAborted(signal);
  const output = path.resolve(opts.output);
  const tmp = path.join(path.dirname(output), `.${path.basename(output)}.restore-${randomBytes(4).toString('hex')}`);
  const fh = await fs.open(tmp, 'wx', 0o644);
  let renamed = false;
  let writer: DirectFileWriter | undefined;
  try {
    const progress = (hashed: number, force?: boolean) =>
      report(
        {
          name,
          processedBytes: hashed,
          totalBytes: config.size,
          progress: config.size === 0 ? 100 : Math.floor((hashed / config.size) * 100),
        },
        force,
      );
    await fh.truncate(config.size);
    // Blocks are written with O_DIRECT where the filesystem allows it: no page-cache copy, nothing left for the sync.
    writer = await DirectFileWriter.open(tmp, fh);
    let sha512: string | undefined;
    let verification: RestoreResult['verification'] = 'sequential';
    let verifiedChain: Sha512Chain | undefined;
    const sidecar = config.checksum === '' ? undefined : await loadImageChain(driver, config, signal);
    if (sidecar?.chain) {
      // The image's SHA-512 chain: every block's segment (and every hole's) is verified as it arrives, in parallel,
      // and the verifier computes the whole-image SHA-512 from the verified links.
      try {
        sha512 = await restoreBlocksChained(driver, config, sidecar.chain, writer, concurrency, signal, progress);
        verification = 'sha512-chain';
        verifiedChain = sidecar.chain;
      } catch (err) {
        if (!(err instanceof Sha512ChainMismatchError)) throw err;
        // A link does not hold. If the segment is a stored block that does not match its own name, that block is
        // damaged: fail naming it. Otherwise the sidecar (or the block list) is wrong: the sequential path decides.
        const block = config.blocks.find((b) => b.offset === err.offset);
        if (block) await checkBlockByName(driver, config, block.offset, block.blockChecksum, signal);
        await fh.truncate(0);
        await fh.truncate(config.size);
      }
    }
    if (sha512 === undefined) {
      // With a recorded whole-image checksum, that end-to-end check covers every block, so the blocks' own names are
      // not recomputed on the way. Only when it fails is the restore run again with every block verified, which
      // names the bad block with Longhorn's message (or resolves an ambiguous encoding by its name).
      sha512 = await restoreBlocks(driver, config, writer, concurrency, config.checksum === '', signal, progress);
      if (config.checksum !== '' && sha512 !== config.checksum) {
        await fh.truncate(0);
        await fh.truncate(config.size);
        sha512 = await restoreBlocks(driver, config, writer, concurrency, true, signal, progress);
      }
    }
    if (config.checksum !== '' && sha512 !== config.checksum) {
      throw new BackupStoreError('ChecksumMismatch', `restored image ${name} has SHA-512 ${sha512}, but the backup records ${config.checksum}`);
    }
    await writer.close();
    await fh.sync();
    await fh.close();
    throwIfAborted(signal);
    if (!(await commit())) return undefined;
    throwIfAborted(signal);
    await fs.rename(tmp, output);
    renamed = true;
    report({ name, processedBytes: config.size, totalBytes: config.size, progress: 100 }, true);
    return { name, size: config.size, sha512, blockCount: config.blocks.length, verification, ...(verifiedChain ? { chain: verifiedChain } : {}) };
  } finally {
    // Cleanup after success or a failure already being thrown: a close or removal error must not replace that outcome.
    await writer?.close().catch(() => undefined);
    await fh.close().catch(() => undefined);
    if (!renamed) await fs.rm(tmp, { force: true }).catch(() => undefined);
  }
}

/** The backup's SHA-512 chain sidecar when it exists and fits the config; undefined (sequential hashing) otherwise. */
async function loadImageChain(
  driver: BackupStoreDriver,
  config: BackingImageBackupConfig,
  signal: AbortSignal | undefined,
): Promise<{ chain?: Sha512Chain } | undefined> {
  let bytes: Buffer;
  try {
    bytes = await driver.read(backingImageChainPath(config.name), signal);
  } catch {
    // Absent (Longhorn's backups, older ones) or unreadable: the sequential whole-image hash needs no sidecar.
    throwIfAborted(signal);
    return undefined;
  }
  const usable = usableImageChain(bytes, config);
  return usable.chain ? { chain: usable.chain } : undefined;
}

/** Reads one stored block and checks it against its name; throws Longhorn's verification error naming it if not. */
async function checkBlockByName(
  driver: BackupStoreDriver,
  config: BackingImageBackupConfig,
  offset: number,
  checksum: string,
  signal: AbortSignal | undefined,
): Promise<void> {
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
  await decompressAndVerifyBlock(effectiveCompressionMethod(config), stored, checksum, p);
}

/**
 * Restores with the image's SHA-512 chain: blocks are fetched and written `concurrency` at once, and each block's
 * segment (the decompressed data, or null for an all-zero block) and each hole's segment is verified against the chain
 * on the libuv thread pool, in parallel, in whatever order they complete. Returns the SHA-512 the verifier computed
 * from the verified links, which must be the config's. A failed link rejects with `Sha512ChainMismatchError`.
 */
async function restoreBlocksChained(
  driver: BackupStoreDriver,
  config: BackingImageBackupConfig,
  chain: Sha512Chain,
  writer: DirectFileWriter,
  concurrency: number,
  signal: AbortSignal | undefined,
  progress: (verified: number, force?: boolean) => void,
): Promise<string> {
  const hashers = Math.min(concurrency, availableParallelism());
  // The process-wide scheduler compresses up to `lanes` segments per call (AVX-512): keep that many waiting for it.
  const lanes = Math.max(1, multiBufferLanes());
  const verifier = new Sha512ChainVerifier(chain, { patienceMs: RESTORE_HASH_PATIENCE_MS });
  const listed = new Map<number, string>();
  for (const b of config.blocks) listed.set(b.offset / BACKUP_BLOCK_SIZE, b.blockChecksum);
  const pool = new SlotPool(concurrency + Math.max(HASH_WINDOW_SLOTS, lanes));
  const workers = new BlockWorkerPool(pool, concurrency);
  const flusher = new BackgroundFlusher(writer);
  const fetches = new Semaphore(concurrency);
  // Holes need no slot; at most this many wait for the verifier at once, so they interleave with the blocks.
  const holes = new Semaphore(hashers * lanes + 1);
  let failure: { err: unknown } | undefined;
  const fail = (err: unknown) => {
    failure ??= { err };
  };
  let verified = 0;
  const settled = new Set<Promise<void>>();
  const track = (work: Promise<void>, length: number, after?: () => void) => {
    const finished = work.then(
      () => {
        verified += length;
        progress(verified);
      },
      (err: unknown) => fail(err),
    );
    settled.add(finished);
    // `finished` never rejects (its failure goes to fail()); this only cleans up after it.
    void finished.finally(() => {
      settled.delete(finished);
      after?.();
    });
  };
  try {
    for (let index = 0; index < verifier.segments; index++) {
      if (failure || signal?.aborted) break;
      const { offset, length } = verifier.segmentRange(index);
      const checksum = listed.get(index);
      if (checksum === undefined) {
        await holes.acquire();
        track(verifier.verifySegment(index, null), length, () => holes.release());
        continue;
      }
      const slot = await pool.acquire();
      if (failure || signal?.aborted) {
        pool.release(slot);
        break;
      }
      await fetches.acquire();
      const work = (async () => {
        let block: { data: Buffer; zero: boolean };
        try {
          block = await fetchBlock(driver, workers, config, offset, checksum, slot, false, signal, true);
          throwIfAborted(signal);
          if (!block.zero) {
            await flusher.write(block.data, offset);
          }
        } finally {
          fetches.release();
        }
        await verifier.verifySegment(index, block.zero ? null : block.data);
      })();
      track(work, length, () => pool.release(slot));
    }
    await Promise.all(settled);
    if (failure) throw failure.err;
    throwIfAborted(signal);
    if (!verifier.complete()) {
      throw new BackupStoreError('Io', `internal error: segments ${verifier.pending().slice(0, 5).join(', ')} of ${config.name} were not verified`);
    }
    const sha512 = verifier.checksum();
    if (sha512 !== config.checksum) {
      throw new BackupStoreError('ChecksumMismatch', `restored image ${config.name} has SHA-512 ${sha512}, but the backup records ${config.checksum}`);
    }
    progress(config.size);
    return sha512;
  } finally {
    await Promise.allSettled([...settled]);
    await Promise.all([workers.close(), flusher.idle()]);
  }
}

/**
 * Fetches, (with `verifyBlocks`) verifies and writes the blocks (`concurrency` at once, each into a slot of a fixed
 * shared pool) and feeds the whole-image SHA-512 in offset order on its own thread (holes and zero blocks from a
 * shared zero buffer, which are not written). Returns the image's SHA-512.
 */
async function restoreBlocks(
  driver: BackupStoreDriver,
  config: BackingImageBackupConfig,
  writer: DirectFileWriter,
  concurrency: number,
  verifyBlocks: boolean,
  signal: AbortSignal | undefined,
  progress: (hashed: number, force?: boolean) => void,
): Promise<string> {
  const pool = new SlotPool(concurrency + HASH_WINDOW_SLOTS);
  const workers = new BlockWorkerPool(pool, concurrency);
  const image = new ImageHasher(pool.memory);
  const flusher = new BackgroundFlusher(writer);
  let fetching = 0;
  const fetchWaiters: (() => void)[] = [];
  let failure: { err: unknown } | undefined;
  const fail = (err: unknown) => {
    failure ??= { err };
  };
  let posted = 0;
  let hashed = 0;
  let order: Promise<void> = Promise.resolve();
  const settled = new Set<Promise<void>>();
  try {
    for (const b of config.blocks) {
      const slot = await pool.acquire();
      while (fetching >= concurrency) await new Promise<void>((r) => fetchWaiters.push(r));
      if (failure || signal?.aborted) {
        pool.release(slot);
        break;
      }
      fetching++;
      const ready = fetchBlock(driver, workers, config, b.offset, b.blockChecksum, slot, verifyBlocks, signal)
        .then(async (block) => {
          throwIfAborted(signal);
          if (!block.zero) {
            await flusher.write(block.data, b.offset);
          }
          return block;
        })
        .finally(() => {
          fetching--;
          fetchWaiters.shift()?.();
        });
      ready.catch(() => undefined); // delivered through the in-order step below (or superseded by an earlier failure)
      const step = order.then(async () => {
        const block = await ready;
        const gap = image.zeros(b.offset - posted);
        const own = block.zero ? image.zeros(block.data.length) : image.update(block.data);
        posted = b.offset + block.data.length;
        const end = posted;
        return {
          done: Promise.all([gap, own]).then(() => {
            hashed = end;
            progress(hashed);
          }),
        };
      });
      order = step.then(() => undefined);
      order.catch(() => undefined); // failures reach the caller through `finished`
      const finished: Promise<void> = step.then((s) => s.done).then(
        () => undefined,
        (err: unknown) => fail(err),
      );
      settled.add(finished);
      // `finished` never rejects (its failure goes to fail()); this only cleans up after it.
      void finished.finally(() => {
        settled.delete(finished);
        pool.release(slot);
      });
    }
    await Promise.all(settled);
    if (failure) throw failure.err;
    throwIfAborted(signal);
    await order;
    await image.zeros(config.size - posted);
    progress(config.size);
    return await image.digest();
  } finally {
    await Promise.allSettled([...settled]);
    await Promise.all([image.close(), workers.close(), flusher.idle()]);
  }
}

/**
 * Starts writing the output back to disk while the restore goes on (a `datasync` every {@link FLUSH_EVERY} bytes
 * written, one at a time), so that the final sync before the rename has little left to do and the page cache holds
 * few dirty pages.
 */
class BackgroundFlusher {
  private unflushed = 0;
  private running: Promise<void> | undefined;
  constructor(private readonly writer: DirectFileWriter) {}
  /**
   * Writes `data` at `position`. The writer runs one write at a time: concurrent positioned writes into one file
   * serialise on the inode lock in the kernel and burn system CPU spinning on it (2 MiB writes took 3.9 ms each with
   * 2-4 in flight, against well under 1 ms one at a time).
   */
  write(data: Buffer, position: number): Promise<void> {
    return this.writer.write(data, position).then(() => this.wrote(data.length));
  }
  /** Buffered bytes start their write-back early; direct writes leave nothing to flush. */
  private wrote(bytes: number): void {
    if (this.writer.direct) return;
    this.unflushed += bytes;
    if (this.unflushed < FLUSH_EVERY || this.running) return;
    this.unflushed = 0;
    this.running = this.writer.datasync().then(
      () => {
        this.running = undefined;
      },
      () => {
        this.running = undefined; // the final sync reports any error
      },
    );
  }
  async idle(): Promise<void> {
    await this.writer.idle();
    await this.running;
  }
}

const FLUSH_EVERY = 128 * 1024 * 1024;

