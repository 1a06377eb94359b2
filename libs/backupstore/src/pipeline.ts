import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { decodeFrameInto, STORED_FRAME_HEADER, STORED_FRAME_TRAILER, storedFrameData, writeStoredFrameEnds, xxh32 } from './lz4-frame.js';
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

/**
 * The block workers' program (CommonJS, evaluated from a string so that it runs the same from `dist/` and from the
 * sources under jest). The frame helpers are the functions of `lz4-frame.ts`, inserted as source text.
 */
const WORKER_SOURCE = `
'use strict';
const { parentPort, workerData } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const memory = workerData.memory;
const mem = new Uint8Array(memory);
const lz4 = require(workerData.lz4Path);
const ${xxh32.name} = ${xxh32.toString()};
const ${writeStoredFrameEnds.name} = ${writeStoredFrameEnds.toString()};
const ${storedFrameData.name} = ${storedFrameData.toString()};
const ${decodeFrameInto.name} = ${decodeFrameInto.toString()};
const ZERO = Buffer.alloc(64 * 1024);
const PROBES = 4, PROBE = 16 * 1024;
function isZero(b) {
  const n = b.length;
  if (n === 0) return true;
  if (b[0] !== 0 || b[n - 1] !== 0) return false;
  for (let o = 0; o < n; o += ZERO.length) {
    const l = Math.min(ZERO.length, n - o);
    if (Buffer.compare(b.subarray(o, o + l), ZERO.subarray(0, l)) !== 0) return false;
  }
  return true;
}
function blockName(b) { return createHash('sha512').update(b).digest('hex').slice(0, 64); }
// LZ4 on a few spread samples: when even they do not shrink, the block is stored as an uncompressed frame block
// (what the LZ4 compressor would do after spending a full compression on it).
function incompressible(b) {
  if (b.length < PROBES * PROBE * 2) return false;
  const step = Math.floor((b.length - PROBE) / (PROBES - 1));
  let raw = 0, packed = 0;
  for (let k = 0; k < PROBES; k++) {
    const s = b.subarray(k * step, k * step + PROBE);
    raw += s.length;
    packed += lz4.compressSync(s).length - 4;
  }
  return packed >= raw * 0.98;
}
parentPort.on('message', (m) => {
  try {
    const view = Buffer.from(memory, m.offset, m.length);
    if (m.op === 'prepare') {
      if (isZero(view)) { parentPort.postMessage({ id: m.id, zero: true }); return; }
      const checksum = blockName(view);
      let storedLength = 0;
      let xxh = 0;
      if (m.lz4 && incompressible(view)) {
        xxh = xxh32(view, 0);
        storedLength = writeStoredFrameEnds(view.length, mem, m.outOffset, xxh);
      }
      parentPort.postMessage({ id: m.id, zero: false, checksum, storedLength, xxh });
    } else if (m.op === 'check') {
      let range;
      const lz4Frame = view.length >= 4 && view.readUInt32LE(0) === 0x184d2204;
      if (lz4Frame) range = storedFrameData(view);
      else if (view.length >= 2 && view[0] === 0x1f && view[1] === 0x8b) range = undefined;
      else range = [0, view.length];
      if (!range && lz4Frame) {
        // A compressed frame: decoded here, straight into the slot's block area, and always checked by its name.
        const out = Buffer.from(memory, m.dataOffset, m.dataCapacity);
        const n = decodeFrameInto(view, out);
        if (n < 0) { parentPort.postMessage({ id: m.id, fast: false }); return; }
        const data = out.subarray(0, n);
        parentPort.postMessage({ id: m.id, fast: true, decoded: true, checksum: m.nameDecoded ? blockName(data) : '', zero: isZero(data), dataOffset: 0, dataLength: n });
        return;
      }
      if (!range) { parentPort.postMessage({ id: m.id, fast: false }); return; }
      const data = view.subarray(range[0], range[0] + range[1]);
      const checksum = m.verify ? blockName(data) : '';
      parentPort.postMessage({ id: m.id, fast: true, checksum, zero: isZero(data), dataOffset: range[0], dataLength: range[1] });
    } else {
      parentPort.postMessage({ id: m.id, error: 'unknown block worker operation ' + String(m.op) });
    }
  } catch (e) {
    parentPort.postMessage({ id: m.id, error: e && e.message ? e.message : String(e) });
  }
});
`;

interface Reply {
  id: number;
  error?: string;
  [key: string]: unknown;
}

interface Pending {
  resolve(r: Reply): void;
  reject(e: Error): void;
}

/** One worker thread answering requests in order, by id. */
class WorkerChannel {
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  private nextId = 0;
  private failure: Error | undefined;
  private closed = false;

  constructor(source: string, workerData: unknown, what: string) {
    this.worker = new Worker(source, {
      eval: true,
      workerData,
      // The workers only hash and frame blocks in shared memory: a small heap keeps the process small.
      resourceLimits: { maxOldGenerationSizeMb: 16, maxYoungGenerationSizeMb: 4, stackSizeMb: 1 },
    });
    this.worker.unref();
    this.worker.on('message', (r: Reply) => {
      const p = this.pending.get(r.id);
      if (!p) return;
      this.pending.delete(r.id);
      if (this.pending.size === 0) this.worker.unref();
      if (r.error !== undefined) p.reject(new BackupStoreError('Io', `${what} failed: ${r.error}`));
      else p.resolve(r);
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

  send(message: Record<string, unknown>, transfer?: ArrayBuffer[]): Promise<Reply> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.closed) return Promise.reject(new BackupStoreError('Io', 'worker thread is closed'));
    const id = this.nextId++;
    return new Promise<Reply>((resolve, reject) => {
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

let lz4Path: string | undefined;
function resolveLz4(): string {
  lz4Path ??= createRequire(import.meta.url).resolve('lz4-napi');
  return lz4Path;
}

/** Threads that hash blocks in place (their SHA-512 names), check for zeros, and frame incompressible blocks. */
export class BlockWorkerPool {
  private readonly channels: WorkerChannel[];

  /** `threads` defaults to the smaller of `concurrency` and the machine's parallelism. */
  constructor(private readonly pool: SlotPool, concurrency: number, threads = Math.min(concurrency, availableParallelism())) {
    const n = Math.max(1, threads);
    this.channels = Array.from(
      { length: n },
      () => new WorkerChannel(WORKER_SOURCE, { lz4Path: resolveLz4(), memory: pool.memory }, 'block worker'),
    );
  }

  private channel(): WorkerChannel {
    let best = this.channels[0] as WorkerChannel;
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
    const r = await this.channel().send({
      op: 'prepare',
      ...this.where(slot.data.subarray(0, length)),
      lz4,
      outOffset: slot.stored.byteOffset,
    });
    if (r['zero'] === true) return { zero: true };
    const framed = Number(r['storedLength']) > 0;
    if (!framed) return { zero: false, checksum: String(r['checksum']), frame: [] };
    return { zero: false, checksum: String(r['checksum']), frame: storedFramePieces(slot, length), xxh: Number(r['xxh']) };
  }

  /**
   * For restore: when the stored bytes (`storedLength` in `slot.stored`) are raw or an uncompressed LZ4 frame, the
   * block's data range inside `slot.stored`, its SHA-512 name (with `verify`; '' otherwise) and whether it is all
   * zeros; a compressed LZ4 frame is decoded into `slot.data` (and named unless `nameDecoded` is false and `verify`
   * is off: for a caller whose own check covers the decoded bytes, e.g. the SHA-512 chain). Otherwise (gzip, or a frame this
   * decoder declines) `fast: false` and the caller decompresses it.
   */
  async check(slot: Slot, storedLength: number, verify = true, nameDecoded = true): Promise<CheckedBlock> {
    const r = await this.channel().send({
      op: 'check',
      ...this.where(slot.stored.subarray(0, storedLength)),
      verify,
      nameDecoded: verify || nameDecoded,
      dataOffset: slot.data.byteOffset,
      dataCapacity: slot.data.byteLength,
    });
    if (r['fast'] !== true) return { fast: false };
    return {
      fast: true,
      decoded: r['decoded'] === true,
      checksum: String(r['checksum']),
      zero: r['zero'] === true,
      dataOffset: Number(r['dataOffset']),
      dataLength: Number(r['dataLength']),
    };
  }

  async close(): Promise<void> {
    await Promise.all(this.channels.map((c) => c.close()));
  }
}

export { WorkerChannel };
