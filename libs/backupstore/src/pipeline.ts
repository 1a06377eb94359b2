import { availableParallelism } from 'node:os';
import type { Worker } from 'node:worker_threads';
import { startModuleWorker } from '@bis/runtime';
import type { BlockReply, BlockRequest, BlockWorkerData, CheckReply, PrepareReply } from './block-worker.js';
import { STORED_FRAME_HEADER, STORED_FRAME_TRAILER, writeStoredFrameEnds } from './lz4-frame.js';
import { BACKUP_BLOCK_SIZE, BackupStoreError } from './names.js';

/**
 * Room for a stored block: a 2 MiB block plus what any writer adds around incompressible data (an uncompressed LZ4
 * frame adds 19 bytes, gzip about 0.03 % + 18 bytes). A stored block larger than this cannot decode to 2 MiB.
 */
export const STORED_BLOCK_CAPACITY = BACKUP_BLOCK_SIZE + 64 * 1024;

/** One reusable buffer pair of a {@link SlotPool}: `data` holds a block's bytes, `stored` its stored (compressed) form. */
export interface Slot {
  readonly index: number;
  /** 2 MiB view for the uncompressed block. */
  readonly data: Buffer;
  /** {@link STORED_BLOCK_CAPACITY}-byte view for the stored block. */
  readonly stored: Buffer;
}

/**
 * A fixed set of block buffers in one SharedArrayBuffer, so that worker threads hash and frame blocks in place
 * (nothing is copied or transferred) and the memory a backup or restore uses is bounded by the slot count, whatever
 * the image size. `acquire` waits for a free slot.
 */
export class SlotPool {
  readonly memory: SharedArrayBuffer;
  private readonly free: Slot[] = [];
  private waiters: ((slot: Slot) => void)[] = [];

  constructor(readonly count: number) {
    const slotSize = BACKUP_BLOCK_SIZE + STORED_BLOCK_CAPACITY;
    this.memory = new SharedArrayBuffer(count * slotSize);
    for (let i = 0; i < count; i++) {
      const base = i * slotSize;
      this.free.push({
        index: i,
        data: Buffer.from(this.memory, base, BACKUP_BLOCK_SIZE),
        stored: Buffer.from(this.memory, base + BACKUP_BLOCK_SIZE, STORED_BLOCK_CAPACITY),
      });
    }
  }

  acquire(): Promise<Slot> {
    const slot = this.free.pop();
    if (slot) return Promise.resolve(slot);
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  release(slot: Slot): void {
    const w = this.waiters.shift();
    if (w) w(slot);
    else this.free.push(slot);
  }
}

/** What a block worker found out about a block read for backup. */
export type PreparedBlock =
  | { zero: true }
  | {
      zero: false;
      checksum: string;
      /**
       * When the block does not compress: the LZ4 frame that stores it uncompressed, as the pieces header (in the
       * slot's `stored` view), the data (the slot's `data` view) and trailer (in `stored`). Empty when the block
       * still needs compressing.
       */
      frame: Uint8Array[];
      /** The xxh32 content checksum of that frame (undefined when `frame` is empty), to rebuild it later. */
      xxh?: number;
    };

/**
 * The pieces of an uncompressed-block LZ4 frame around the `length` bytes in `slot.data`: header and trailer in
 * `slot.stored` (written there by a block worker, or by {@link writeStoredFramePieces}).
 */
function storedFramePieces(slot: Slot, length: number): Uint8Array[] {
  return [
    slot.stored.subarray(0, STORED_FRAME_HEADER),
    slot.data.subarray(0, length),
    slot.stored.subarray(STORED_FRAME_HEADER, STORED_FRAME_HEADER + STORED_FRAME_TRAILER),
  ];
}

/**
 * Rebuilds the uncompressed-block frame of a block prepared earlier (its data read again into `slot.data`), from the
 * content checksum `xxh` the block worker computed then: no byte of the data is hashed again.
 */
export function writeStoredFramePieces(slot: Slot, length: number, xxh: number): Uint8Array[] {
  writeStoredFrameEnds(length, slot.stored, 0, xxh);
  return storedFramePieces(slot, length);
}

/** What a block worker found out about a stored block read for restore. */
export type CheckedBlock =
  | {
      fast: true;
      /** True when a compressed LZ4 frame was decoded into the slot's `data` view (its name is then always computed). */
      decoded: boolean;
      checksum: string;
      zero: boolean;
      /** Where the block's bytes are: in `slot.data` when `decoded`, else in `slot.stored`. */
      dataOffset: number;
      dataLength: number;
    }
  | { fast: false };

/** A worker's answer to a request: identified by the request's id; `error` when the request failed. */
interface Reply {
  id: number;
}

type Answer<R extends Reply> = Exclude<R, { error: string }>;
type WithoutId<T> = T extends unknown ? Omit<T, 'id'> : never;

interface Pending<R extends Reply> {
  resolve(r: Answer<R>): void;
  reject(e: Error): void;
}

/**
 * One worker thread answering requests in order, by id. `Q` and `R` are the requests and replies of the worker's
 * program (`url`, a module next to this one such as `block-worker.ts`).
 */
class WorkerChannel<Q extends { id: number }, R extends Reply> {
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending<R>>();
  private nextId = 0;
  private failure: Error | undefined;
  private closed = false;

  constructor(url: URL, workerData: unknown, what: string) {
    this.worker = startModuleWorker(url, {
      workerData,
      // The workers only hash and frame blocks in shared memory: a small heap keeps the process small.
      resourceLimits: { maxOldGenerationSizeMb: 16, maxYoungGenerationSizeMb: 4, stackSizeMb: 1 },
    });
    this.worker.unref();
    this.worker.on('message', (r: R) => {
      const p = this.pending.get(r.id);
      if (!p) return;
      this.pending.delete(r.id);
      if (this.pending.size === 0) this.worker.unref();
      if ('error' in r) p.reject(new BackupStoreError('Io', `${what} failed: ${String(r.error)}`));
      else p.resolve(r as Answer<R>);
    });
    this.worker.on('error', (e: Error) => this.fail(new BackupStoreError('Io', `${what} thread failed: ${e.message}`, { cause: e })));
    this.worker.on('exit', (code) => {
      if (!this.closed) this.fail(new BackupStoreError('Io', `${what} thread exited unexpectedly with code ${code}`));
    });
  }

  get load(): number {
    return this.pending.size;
  }

  private fail(e: Error): void {
    this.failure ??= e;
    for (const p of this.pending.values()) p.reject(e);
    this.pending.clear();
  }

  send(message: WithoutId<Q>, transfer?: ArrayBuffer[]): Promise<Answer<R>> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.closed) return Promise.reject(new BackupStoreError('Io', 'worker thread is closed'));
    const id = this.nextId++;
    return new Promise<Answer<R>>((resolve, reject) => {
      if (this.pending.size === 0) this.worker.ref(); // an answer is due: keep the process alive until it comes
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ ...message, id }, transfer);
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.fail(new BackupStoreError('Io', 'worker thread is closed'));
    await this.worker.terminate();
  }
}

const BLOCK_WORKER = new URL('./block-worker.js', import.meta.url);

/** Threads that hash blocks in place (their SHA-512 names), check for zeros, and frame incompressible blocks. */
export class BlockWorkerPool {
  private readonly channels: WorkerChannel<BlockRequest, BlockReply>[];

  /** `threads` defaults to the smaller of `concurrency` and the machine's parallelism. */
  constructor(private readonly pool: SlotPool, concurrency: number, threads = Math.min(concurrency, availableParallelism())) {
    const n = Math.max(1, threads);
    this.channels = Array.from(
      { length: n },
      () =>
        new WorkerChannel<BlockRequest, BlockReply>(BLOCK_WORKER, { memory: pool.memory } satisfies BlockWorkerData, 'block worker'),
    );
  }

  private channel(): WorkerChannel<BlockRequest, BlockReply> {
    let best = this.channels[0] as WorkerChannel<BlockRequest, BlockReply>;
    for (const c of this.channels) if (c.load < best.load) best = c;
    return best;
  }

  private where(view: Buffer): { offset: number; length: number } {
    if (view.buffer !== this.pool.memory) throw new Error('block buffer is not a slot of this pool');
    return { offset: view.byteOffset, length: view.byteLength };
  }

  /**
   * For backup: zero check, block name, and (with `lz4`) the header and trailer of an uncompressed frame written
   * into `slot.stored` when the block does not compress. `length` is the block's size in `slot.data`.
   */
  async prepare(slot: Slot, length: number, lz4: boolean): Promise<PreparedBlock> {
    const r = (await this.channel().send({
      op: 'prepare',
      ...this.where(slot.data.subarray(0, length)),
      lz4,
      outOffset: slot.stored.byteOffset,
    })) as PrepareReply;
    if (r.zero) return { zero: true };
    if (r.storedLength <= 0) return { zero: false, checksum: r.checksum, frame: [] };
    return { zero: false, checksum: r.checksum, frame: storedFramePieces(slot, length), xxh: r.xxh };
  }

  /**
   * For restore: when the stored bytes (`storedLength` in `slot.stored`) are raw or an uncompressed LZ4 frame, the
   * block's data range inside `slot.stored`, its SHA-512 name (with `verify`; '' otherwise) and whether it is all
   * zeros; a compressed LZ4 frame is decoded into `slot.data` (and named unless `nameDecoded` is false and `verify`
   * is off: for a caller whose own check covers the decoded bytes, e.g. the SHA-512 chain). Otherwise (gzip, or a frame this
   * decoder declines) `fast: false` and the caller decompresses it.
   */
  async check(slot: Slot, storedLength: number, verify = true, nameDecoded = true): Promise<CheckedBlock> {
    const r = (await this.channel().send({
      op: 'check',
      ...this.where(slot.stored.subarray(0, storedLength)),
      verify,
      nameDecoded: verify || nameDecoded,
      dataOffset: slot.data.byteOffset,
      dataCapacity: slot.data.byteLength,
    })) as CheckReply;
    if (!r.fast) return { fast: false };
    return {
      fast: true,
      decoded: r.decoded,
      checksum: r.checksum,
      zero: r.zero,
      dataOffset: r.dataOffset,
      dataLength: r.dataLength,
    };
  }

  async close(): Promise<void> {
    await Promise.all(this.channels.map((c) => c.close()));
  }
}

export { WorkerChannel };
