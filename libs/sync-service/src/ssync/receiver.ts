import { promises as fsp } from 'node:fs';
import { alignedBuffer, DirectTarget } from '@bis/direct-io';
import { IntervalSet } from './interval-set.js';
import { AUTHORIZATION_HEADER, checkInternalCaller, type InternalAuth } from '@bis/internal-auth';
import { HttpProtocolError, type ReceiverHttpReply, type ReceiverHttpRequest } from './receiver-http.js';
import { createReceiverServer } from './receiver-node-http.js';
import type { ReceiverServerKind } from './paths.js';
import type { HolePuncher } from './layout.js';
import { RECEIVE_SLAB_SIZE, ReceivedFileHasher, Slab, type ReceivedHashStats, type SlabAllocator } from './received-hasher.js';
import {
  decodeChain,
  nativeSha512ChainAvailable,
  Sha512ChainVerifier,
  type Sha512Chain,
} from '@bis/sha512-chain';

/** Largest chain segment verified from request bodies in flight (larger ones are verified from the file at close). */
const MAX_INFLIGHT_SEGMENT = 16 << 20;
/**
 * Received pieces written and verified after their request was answered, at most (each holds its receive buffer until
 * both are done). The sender does not wait for the disk or the hash, and with eight segments waiting the SHA-512
 * scheduler compresses them in one AVX-512 pass.
 */
const MAX_DEFERRED_PIECES = 16;
/**
 * Pieces pending after their answer in all the receivers of this process together (beyond it each receiver keeps at
 * least MIN_DEFERRED_PIECES): three receives at once would otherwise hold three times the memory of one.
 */
const PROCESS_MAX_DEFERRED_PIECES = 16;
const MIN_DEFERRED_PIECES = 2;
let processDeferredPieces = 0;
/** How long a segment may wait for a full eight-segment pass (ms): nobody waits on it any more. */
const VERIFY_PATIENCE_MS = 20;
/**
 * Free slabs kept for reuse by the receivers without the in-order hash, all receivers of the process together: one
 * per sender worker and one per pending piece. Fewer would make a receiver allocate slabs over and over (fresh
 * memory costs page faults, and every new buffer counts as external memory that pushes V8 into full garbage
 * collections).
 */
const SLAB_POOL_FREE = 4 + PROCESS_MAX_DEFERRED_PIECES;
/**
 * Direct writes in flight at once. With the writes after the answer, more of them keep the device busy: a Sync of 1 GiB
 * of data took 1.45-1.58 s with 1, about 1.25 s with 2 and 1.03-1.17 s with 6 or 8 (the daemon's thread pool has 8).
 */
const DIRECT_WRITES_IN_FLIGHT = 6;
/** Largest accepted `sha512Chain` body (64 bytes of state per segment: 32 MiB is 1 TiB in 2 MiB segments). */
const MAX_CHAIN_BODY = 64 << 20;

export interface SsyncReceiverOptions {
  /** Port to listen on (0 = any free port, for tests). */
  port: number;
  /** Address to listen on; default all interfaces like Longhorn. */
  host?: string;
  /** Target file (the record's `.tmp` file). */
  filePath: string;
  /** Expected file size; the sender's `open` must announce the same size (0 = accept the sender's). */
  size: number;
  signal?: AbortSignal;
  /**
   * Stall timeout: fail when the sender sends nothing for this long while the receiver waits for it — no request,
   * and no piece of a request's body (a piece is up to one slab, 2 MiB: a sender slower than 2 MiB per timeout counts
   * as stalled). Time the receiver itself is busy (writing, verifying, syncing to disk) does not count. Default 30 s
   * (Longhorn: 300 s without a request).
   */
  idleTimeoutMs?: number;
  /**
   * A request whose connection closed in the middle of its body means the sender is gone (killed, or its host lost):
   * the receive fails when no new request follows within this long. Default 2 s.
   */
  senderGoneTimeoutMs?: number;
  /** Called with the number of data bytes written so far. */
  onProgress?: (dataBytes: number) => void;
  /** Used for `sendHole` when the target existed before (a fresh target is already sparse after truncation). */
  punchHole?: HolePuncher;
  /**
   * Compute the SHA-512 of the received file while receiving (in file order, on a worker thread; holes hashed from
   * zeros without reading them). The result then carries `sha512`. Default false.
   */
  computeChecksum?: boolean;
  /** Receive buffer size: bodies are written to the file in positioned writes of up to this many bytes (2 MiB). */
  slabSize?: number;
  /**
   * Accept a sender's SHA-512 chain (`POST sha512Chain`, our extension) and verify the file against it segment by
   * segment in parallel, instead of hashing it sequentially. Default: when the chain addon is available. When false,
   * the route answers 404 like Longhorn's receiver.
   */
  acceptChain?: boolean;
  /**
   * Write whole 4 KiB-aligned pieces with `O_DIRECT` (no copy into the page cache, nothing left for the `fsync` at
   * close), like Longhorn's receiver. Default true; where the filesystem has no direct I/O (tmpfs) or a piece is not
   * aligned, writes are buffered.
   */
  directIO?: boolean;
  /** A request head must arrive within this long (60 s), else 408 and the connection closes. */
  headerTimeoutMs?: number;
  /** Who may send: requests without the token are refused with 401 (see `@bis/internal-auth`). */
  auth?: InternalAuth;
  /**
   * The HTTP server: `own` (reads bodies straight into the slabs) or `node-http` (Node's `http`, copying). Default:
   * `BIS_SSYNC_RECEIVER_SERVER`, else `own` (see paths.ts).
   */
  httpServer?: ReceiverServerKind;
}

export interface SsyncReceiveResult {
  size: number;
  dataBytes: number;
  holeBytes: number;
  /** SHA-512 (hex) of the whole received file, when `computeChecksum` was set. */
  sha512?: string;
  /** How the checksum was computed (when `computeChecksum` was set and no chain was accepted). */
  hashStats?: ReceivedHashStats;
  /**
   * The SHA-512 chain of the received file: the sender's, with every segment verified against the received bytes
   * (then `sha512` is the checksum computed from the verified links), or the one recorded by the sequential hash.
   */
  chain?: Sha512Chain;
  /** With an accepted chain: bytes verified from request bodies in flight, hole segments, and segments read back. */
  chainStats?: ReceivedChainStats;
  /** Data bytes written with direct I/O (`directIO`) and through the page cache. */
  writeStats: { directBytes: number; bufferedBytes: number };
  /** Milliseconds from `open` to `close`, and from `close` until the checksum was final. */
  timings: { receiveMs: number; checksumTailMs: number };
}

export interface ReceivedChainStats {
  segments: number;
  /** Segments verified from the request body while it was written. */
  inFlight: number;
  /** Segments verified as zeros from a `sendHole`. */
  holes: number;
  /** Segments verified by reading them back from the file at close (pieces, overlaps, unaligned requests). */
  readBack: number;
}

/**
 * Verification of a received file against the sender's chain. A segment verified from a request body counts only if
 * no other write touched the segment since that request started; every other segment is read back from the file at
 * close, so the checksum always describes the bytes in the file.
 */
class ChainCheck {
  readonly verifier: Sha512ChainVerifier;
  readonly stats: ReceivedChainStats;
  /** Writes started per segment, and writes running per segment. */
  readonly #epoch: Uint32Array;
  readonly #active: Uint16Array;
  /** The epoch a segment was verified at (0 = not verified). */
  readonly #verifiedAt: Uint32Array;
  readonly #running = new Set<Promise<void>>();
  #failure: Error | undefined;

  constructor(readonly chain: Sha512Chain) {
    this.verifier = new Sha512ChainVerifier(chain, { patienceMs: VERIFY_PATIENCE_MS });
    const n = chain.states.length;
    this.#epoch = new Uint32Array(n);
    this.#active = new Uint16Array(n);
    this.#verifiedAt = new Uint32Array(n);
    this.stats = { segments: n, inFlight: 0, holes: 0, readBack: 0 };
  }

  get segmentSize(): number {
    return this.chain.segmentSize;
  }

  #segments(begin: number, end: number): [number, number] {
    const s = this.chain.segmentSize;
    return [Math.floor(begin / s), Math.ceil(end / s)];
  }

  /** A write of [begin, end) starts: every segment it touches gets a new epoch and one more running write. */
  beginWrite(begin: number, end: number): void {
    const [a, b] = this.#segments(begin, end);
    for (let i = a; i < b; i++) {
      this.#epoch[i]!++;
      this.#active[i]!++;
    }
  }

  endWrite(begin: number, end: number): void {
    const [a, b] = this.#segments(begin, end);
    for (let i = a; i < b; i++) this.#active[i]!--;
  }

  /** Whether [offset, offset + length) is exactly segment `index`. */
  wholeSegment(offset: number, length: number): number | undefined {
    const s = this.chain.segmentSize;
    if (offset % s !== 0) return undefined;
    const i = offset / s;
    return i < this.chain.states.length && length === Math.min(s, this.chain.size - offset) ? i : undefined;
  }

  /**
   * Verifies segment `index` from `data` (or as zeros with null) while a write of it is running (started with
   * `beginWrite`); rejects with Sha512ChainMismatchError.
   */
  async verifyInFlight(index: number, data: Uint8Array | null): Promise<void> {
    const epoch = this.#epoch[index]!;
    const alone = this.#active[index] === 1;
    await this.verifier.verifySegment(index, data);
    // counted only if this request was the only write of the segment from before the check until after it (another
    // write of the same range, even a finished one, may have landed after ours: the segment is then read back at close)
    if (alone && this.#epoch[index] === epoch && this.#active[index] === 1) {
      this.#verifiedAt[index] = epoch;
      if (data === null) this.stats.holes++;
      else this.stats.inFlight++;
    }
  }

  /** Verifies every hole segment inside [begin, end) in the background (a failure fails the receive at close). */
  verifyHoles(begin: number, end: number): Promise<void> {
    const s = this.chain.segmentSize;
    const jobs: Promise<void>[] = [];
    for (let i = Math.ceil(begin / s); i < this.chain.states.length && i * s < end; i++) {
      const { offset, length } = this.verifier.segmentRange(i);
      if (offset + length > end) break;
      jobs.push(this.verifyInFlight(i, null));
    }
    return Promise.all(jobs).then(() => undefined);
  }

  /** Keeps a background verification; its failure is reported by `finish`. */
  track(p: Promise<void>): void {
    const q = p.catch((err: unknown) => {
      this.#failure ??= err as Error;
    });
    this.#running.add(q);
    void q.finally(() => this.#running.delete(q));
  }

  get failure(): Error | undefined {
    return this.#failure;
  }

  /**
   * After the last write: reads back and verifies every segment not verified in flight, then returns the checksum
   * computed from the verified links. Rejects with Sha512ChainMismatchError naming the first bad segment.
   */
  async finish(fh: fsp.FileHandle, signal?: AbortSignal): Promise<string> {
    while (this.#running.size > 0) await Promise.all([...this.#running]);
    if (this.#failure) throw this.#failure;
    const todo: number[] = [];
    for (let i = 0; i < this.chain.states.length; i++) {
      if (this.#verifiedAt[i] === 0 || this.#verifiedAt[i] !== this.#epoch[i]) todo.push(i);
    }
    let next = 0;
    const worker = async () => {
      const buf = Buffer.allocUnsafe(this.chain.segmentSize);
      while (next < todo.length) {
        signal?.throwIfAborted();
        const i = todo[next++]!;
        const { offset, length } = this.verifier.segmentRange(i);
        let got = 0;
        while (got < length) {
          const { bytesRead } = await fh.read(buf, got, length - got, offset + got);
          if (bytesRead === 0) throw new SsyncReceiveError(`the received file is shorter than expected at ${offset + got}`);
          got += bytesRead;
        }
        await this.verifier.verifySegment(i, buf.subarray(0, length));
        this.stats.readBack++;
      }
    };
    await Promise.all([worker(), worker()]);
    if (!this.verifier.complete()) {
      const pending = this.verifier.pending();
      throw new SsyncReceiveError(`${pending.length} segments of the SHA-512 chain are not verified (first: ${pending[0]})`);
    }
    return this.verifier.checksum();
  }
}

/** Plain receive buffers for a receiver that does not hash. */
/** Free slabs by size and kind (page-aligned or plain memory), shared by the receivers of this process. */
const freeSlabs = new Map<string, Slab[]>();
let freeSlabCount = 0;

class SlabPool {
  readonly #free: Slab[];
  constructor(
    readonly slabSize: number,
    aligned: boolean,
    readonly allocate: SlabAllocator,
  ) {
    const key = `${slabSize}:${aligned ? 'aligned' : 'plain'}`;
    let free = freeSlabs.get(key);
    if (!free) freeSlabs.set(key, (free = []));
    this.#free = free;
  }
  async acquire(_begin: number): Promise<Slab> {
    const s = this.#free.pop();
    if (s) {
      freeSlabCount--;
      return s;
    }
    return new Slab(this.allocate(this.slabSize, false));
  }
  release(s: Slab): void {
    if (freeSlabCount < SLAB_POOL_FREE) {
      this.#free.push(s);
      freeSlabCount++;
    }
  }
}

export interface SsyncReceiver {
  /** The port actually listened on. */
  readonly port: number;
  /** Settles when the sender has closed a complete file (resolve) or the transfer failed / was cancelled (reject). */
  readonly done: Promise<SsyncReceiveResult>;
  /** Resolves when the HTTP server is closed and the port is free again. */
  readonly closed: Promise<void>;
}

export class SsyncReceiveError extends Error {
  override readonly name = 'SsyncReceiveError';
}


/** Reads and drops the rest of a request body (a body longer than its range, or a body nobody expects). */
async function discardBody(req: ReceiverHttpRequest): Promise<void> {
  if (req.complete) return;
  const scratch = Buffer.allocUnsafe(64 * 1024);
  while ((await req.readInto(scratch)) > 0);
}

function intParam(url: URL, name: string): number {
  const raw = url.searchParams.get(name);
  const v = raw === null ? NaN : Number(raw);
  if (!Number.isSafeInteger(v) || v < 0) throw new HttpProtocolError(400, `invalid or missing query parameter ${name}: ${raw}`);
  return v;
}

/**
 * Receiver side of Longhorn's sparse file-sync protocol (`/v1-ssync/`: open, writeData, sendHole, getChecksum,
 * close). Differences from Longhorn, all wire-compatible:
 * - `close` completes the receive only when every byte of [0, size) was covered by writeData or sendHole; a sender
 *   that aborted half-way (Longhorn's sender still calls close) leaves an incomplete file, which fails here instead
 *   of being reported complete (data-plane quirk §10-6);
 * - `getChecksum` answers `null` (= "send the data") unless the range is data in a target that existed before.
 */
export async function startSsyncReceiver(opts: SsyncReceiverOptions): Promise<SsyncReceiver> {
  const idleTimeoutMs = opts.idleTimeoutMs ?? 30_000;
  opts.signal?.throwIfAborted();
  let fileAlreadyExists = false;
  try {
    await fsp.stat(opts.filePath);
    fileAlreadyExists = true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }

  let fh: fsp.FileHandle | undefined;
  let size = -1;
  const coverage = new IntervalSet();
  let dataBytes = 0;
  let holeBytes = 0;
  let finished = false;
  let resolveDone!: (r: SsyncReceiveResult) => void;
  let rejectDone!: (e: Error) => void;
  const done = new Promise<SsyncReceiveResult>((res, rej) => {
    resolveDone = res;
    rejectDone = rej;
  });
  done.catch(() => undefined);
  let idleTimer: NodeJS.Timeout | undefined;
  const inflight = new Set<Promise<unknown>>();
  const direct = opts.directIO === false ? undefined : new DirectTarget();
  const allocate: SlabAllocator = direct
    ? (n, shared) => alignedBuffer(n, { shared })
    : (n, shared) => Buffer.from(shared ? new SharedArrayBuffer(n) : new ArrayBuffer(n));
  let hasher = opts.computeChecksum ? new ReceivedFileHasher({ fileHandle: () => fh, slabSize: opts.slabSize, allocate }) : undefined;
  let slabs: SlabPool | ReceivedFileHasher = hasher ?? new SlabPool(opts.slabSize ?? RECEIVE_SLAB_SIZE, direct !== undefined, allocate);
  const acceptChain = opts.acceptChain ?? nativeSha512ChainAvailable();
  let chainCheck: ChainCheck | undefined;
  /** Bytes per in-flight verified piece (the chain's segment size), 0 = no in-flight verification. */
  let segmentCut = 0;
  /**
   * Set when the received data failed verification: every request still running or arriving is answered with it (so
   * every sender worker learns why), then the receive ends.
   */
  let fatalError: Error | undefined;
  /** Verifications of answered segments still running (each holds its slab). */
  const deferred = new Set<Promise<void>>();
  let openedAt = 0;
  let closedAt = 0;
  // One positioned write at a time: concurrent writes into one file contend for its inode lock in the kernel, which
  // costs more CPU (lock spinning) than the writes themselves; a 2 MiB write into the page cache takes well under 1 ms.
  let writeChain: Promise<unknown> = Promise.resolve();
  const writeSerially = (h: fsp.FileHandle, buf: Buffer, length: number, position: number): Promise<void> => {
    const run = async () => {
      let off = 0;
      while (off < length) {
        const { bytesWritten } = await h.write(buf, off, length - off, position + off);
        off += bytesWritten;
      }
    };
    const p = writeChain.then(run, run);
    writeChain = p.catch(() => undefined);
    return p;
  };
  /** Direct writes of whole aligned slabs (the device takes them without a page-cache copy); the rest is buffered. */
  const writeStats = { directBytes: 0, bufferedBytes: 0 };
  const writePiece = async (h: fsp.FileHandle, buf: Buffer, length: number, position: number): Promise<void> => {
    let done = 0;
    if (direct?.canWrite(buf, length, position)) {
      done = await writeDirectly(() => direct.write(buf, length, position));
      writeStats.directBytes += done;
    }
    if (done < length) {
      await writeSerially(h, buf.subarray(done), length - done, position + done);
      writeStats.bufferedBytes += length - done;
    }
  };
  // direct writes in flight at once (they do not contend for the page cache)
  let directRunning = 0;
  const directWaiting: Array<() => void> = [];
  const writeDirectly = async (w: () => Promise<number>): Promise<number> => {
    // a finishing write hands its slot to the next waiting one
    if (directRunning >= DIRECT_WRITES_IN_FLIGHT) await new Promise<void>((r) => directWaiting.push(r));
    else directRunning++;
    try {
      return await w();
    } finally {
      const next = directWaiting.shift();
      if (next) next();
      else directRunning--;
    }
  };

  const server = createReceiverServer((req) => serve(req), { keepAliveTimeoutMs: 240_000, headerTimeoutMs: opts.headerTimeoutMs, kind: opts.httpServer });

  const finish = async (failure: Error | undefined): Promise<void> => {
    let err = failure;
    if (finished) return;
    finished = true;
    if (idleTimer) clearTimeout(idleTimer);
    opts.signal?.removeEventListener('abort', onAbort);
    server.close();
    server.closeAllConnections();
    hasher?.stopAcquiring(new SsyncReceiveError('the receiver is finishing'));
    await Promise.allSettled([...inflight]);
    // pieces still being written or verified after their answer (the file is not closed under them)
    while (deferred.size > 0) await Promise.allSettled([...deferred]);
    let sha512: string | undefined;
    let chain: Sha512Chain | undefined;
    if (!err && chainCheck && fh) {
      try {
        sha512 = await chainCheck.finish(fh, opts.signal);
        chain = chainCheck.chain;
      } catch (e) {
        err = opts.signal?.aborted
          ? new SsyncReceiveError('receiving cancelled')
          : new SsyncReceiveError(`the received data does not match the sender's SHA-512 chain: ${(e as Error).message}`);
      }
    } else if (!err && hasher) {
      try {
        sha512 = await hasher.digest(size, opts.signal);
        chain = hasher.chain;
      } catch (e) {
        err = opts.signal?.aborted ? new SsyncReceiveError('receiving cancelled') : new SsyncReceiveError(`hashing the received file failed: ${(e as Error).message}`);
      }
    }
    await hasher?.close();
    await direct?.close();
    if (fh) {
      const h = fh;
      fh = undefined;
      await h.close().catch(() => undefined);
    }
    const timings = { receiveMs: closedAt && openedAt ? closedAt - openedAt : 0, checksumTailMs: closedAt ? performance.now() - closedAt : 0 };
    if (err) rejectDone(err);
    else {
      resolveDone({
        size,
        dataBytes,
        holeBytes,
        sha512,
        chain,
        hashStats: hasher ? { ...hasher.stats } : undefined,
        chainStats: chainCheck ? { ...chainCheck.stats } : undefined,
        writeStats: { ...writeStats },
        timings,
      });
    }
  };

  /**
   * A write or a verification that ended after its request was answered failed: the receive fails, every later
   * request too.
   */
  const failDeferred = (what: string, err: Error) => {
    if (fatalError || finished) return;
    const fatal = new SsyncReceiveError(`${what}: ${err.message}`);
    fatalError = fatal;
    server.close();
    void Promise.allSettled([...inflight]).then(() => finish(fatal));
  };

  // The stall timer: re-armed by every request and every piece of a body read from the sender; it fails the receive
  // only while the receiver waits for the sender (requests in flight that are not reading from it mean the receiver is
  // busy, and the timer starts again). A connection closed in the middle of a body shortens it: the sender is gone.
  let readingFromSender = 0;
  const stalled = () => `no request from the sender in ${Math.round(idleTimeoutMs / 1000)} seconds`;
  const armIdle = (ms = idleTimeoutMs, why: () => string = stalled) => {
    if (idleTimer) clearTimeout(idleTimer);
    idleTimer = setTimeout(() => {
      if (finished) return;
      if (inflight.size > readingFromSender) return armIdle();
      void finish(new SsyncReceiveError(why()));
    }, ms);
    idleTimer.unref();
  };
  const senderGone = (err: unknown) =>
    armIdle(
      opts.senderGoneTimeoutMs ?? 2000,
      () =>
        `no request from the sender in ${Math.round((opts.senderGoneTimeoutMs ?? 2000) / 1000)} seconds after its connection closed in the middle of a request (${(err as Error).message}): the sender is gone`,
    );
  const readFromSender = async (req: ReceiverHttpRequest, into: Buffer): Promise<number> => {
    readingFromSender++;
    try {
      const got = await req.readInto(into);
      if (got < into.length) senderGone(new Error(`the body ended after ${got} of ${into.length} bytes`));
      else armIdle();
      return got;
    } catch (err) {
      senderGone(err);
      throw err;
    } finally {
      readingFromSender--;
    }
  };
  const onAbort = () => {
    void finish(new SsyncReceiveError('receiving cancelled'));
  };
  opts.signal?.addEventListener('abort', onAbort, { once: true });

  const checkRange = (begin: number, end: number) => {
    if (!fh) throw new HttpProtocolError(400, 'file is not open: call open first');
    if (end < begin || end > size) throw new HttpProtocolError(400, `invalid range [${begin}, ${end}) for a file of size ${size}`);
  };

  const json = (value: unknown): ReceiverHttpReply => ({ body: JSON.stringify(value), contentType: 'application/json' });

  const handle = async (req: ReceiverHttpRequest): Promise<ReceiverHttpReply> => {
    const url = new URL(req.target, 'http://receiver');
    const route = url.pathname.replace(/^\/v1-ssync\/?/, '');
    if (url.pathname === route) throw new HttpProtocolError(404, `unknown path ${url.pathname}`);
    switch (route) {
      case 'open': {
        const begin = intParam(url, 'begin');
        const end = intParam(url, 'end');
        if (begin !== 0) throw new HttpProtocolError(400, `invalid open range begin ${begin}: must be 0`);
        if (opts.size > 0 && end !== opts.size) {
          throw new HttpProtocolError(400, `invalid file size ${end}: the receiver expects ${opts.size} bytes`);
        }
        if (url.searchParams.get('directIO') === 'true' && end % 4096 !== 0) {
          throw new HttpProtocolError(400, `invalid file size ${end} for directIO`);
        }
        if (!fh) fh = await fsp.open(opts.filePath, fileAlreadyExists ? 'r+' : 'w+');
        await fh.truncate(end);
        await direct?.open(opts.filePath);
        if (!openedAt) openedAt = performance.now();
        size = end;
        await discardBody(req);
        return json(fileAlreadyExists);
      }
      case 'writeData': {
        const begin = intParam(url, 'begin');
        const end = intParam(url, 'end');
        checkRange(begin, end);
        const handle = fh!;
        hasher?.beginWrite(begin, end);
        const check = chainCheck;
        check?.beginWrite(begin, end);
        // Bodies are read straight into slabs, and a slab goes to the file in one positioned write; with the in-order
        // hash a written slab goes to the hasher, which keeps it until its range is hashed in file order.
        const pieces: Array<{ begin: number; end: number; slab: Slab | null }> = [];
        /** Writes and verifications of this request's pieces (they may end after the answer). */
        const settling: Promise<void>[] = [];
        let slab: Slab | undefined;
        let fill = 0;
        let pos = begin;
        const writeSlab = async () => {
          const s = slab!;
          const at = pos;
          const length = fill;
          pos += fill;
          fill = 0;
          slab = undefined;
          const segment = check && segmentCut > 0 ? check.wholeSegment(at, length) : undefined;
          // The segment is verified from the body while it is written. Without the in-order hash neither has to end
          // before the answer: the slab is kept until both have, the request's segments stay "being written" for the
          // chain check until then, and a failure fails the whole receive (the later requests and the close get it).
          const verifying = check && segment !== undefined ? check.verifyInFlight(segment, s.buffer.subarray(0, length)) : undefined;
          const writing = writePiece(handle, s.buffer, length, at);
          if (verifying) {
            settling.push(verifying);
            verifying.catch((e: unknown) => failDeferred("the received data does not match the sender's SHA-512 chain", e as Error));
          }
          if (hasher) {
            // the in-order hash takes the written slab (at most one per request is held: an earlier one is released
            // and its range read back if needed)
            try {
              await writing;
            } catch (err) {
              slabs.release(s);
              throw err;
            }
            const prev = pieces[pieces.length - 1];
            if (prev?.slab) {
              slabs.release(prev.slab);
              prev.slab = null;
            }
            pieces.push({ begin: at, end: at + length, slab: s });
            return;
          }
          settling.push(writing);
          writing.catch((e: unknown) => failDeferred('writing the received data failed', e as Error));
          const held = Promise.allSettled(verifying ? [writing, verifying] : [writing]).then(() => {
            slabs.release(s);
            deferred.delete(held);
            processDeferredPieces--;
          });
          deferred.add(held);
          processDeferredPieces++;
          pieces.push({ begin: at, end: at + length, slab: null });
        };
        try {
          // the body goes from the socket straight into the slab
          while (pos + fill < end) {
            if (fatalError) throw new HttpProtocolError(400, fatalError.message);
            // at most MAX_DEFERRED_PIECES written or verified after their answer (and fewer while other receivers of
            // this process hold PROCESS_MAX_DEFERRED_PIECES): beyond, the sender waits
            while (
              !slab &&
              (deferred.size >= MAX_DEFERRED_PIECES ||
                (processDeferredPieces >= PROCESS_MAX_DEFERRED_PIECES && deferred.size >= MIN_DEFERRED_PIECES))
            ) {
              await Promise.race(deferred);
            }
            slab ??= await slabs.acquire(pos);
            let n = Math.min(end - pos - fill, slab.buffer.length - fill);
            // with a chain, pieces end at segment boundaries so that whole segments are verified in flight
            if (segmentCut > 0) n = Math.min(n, segmentCut - ((pos + fill) % segmentCut));
            const got = await readFromSender(req, slab.buffer.subarray(fill, fill + n));
            fill += got;
            if (got < n) throw new HttpProtocolError(400, `short writeData body: got ${pos + fill - begin} of ${end - begin} bytes`);
            if (fill === slab.buffer.length || (segmentCut > 0 && (pos + fill) % segmentCut === 0)) await writeSlab();
          }
          if (fill > 0) await writeSlab();
          // like Longhorn, at most end - begin bytes of the body are used
          await discardBody(req);
        } catch (err) {
          if (slab) slabs.release(slab);
          for (const p of pieces) if (p.slab) slabs.release(p.slab);
          throw err;
        } finally {
          hasher?.endWrite(begin);
          if (check && settling.length > 0) {
            // the request's range counts as being written until its writes and verifications end (a failure is kept
            // by track)
            check.track(
              Promise.all(settling)
                .then(() => undefined)
                .finally(() => check.endWrite(begin, end)),
            );
          } else {
            check?.endWrite(begin, end);
          }
        }
        if (hasher) for (const p of pieces) hasher.dataWritten(p.begin, p.end, p.slab);
        else for (const p of pieces) if (p.slab) slabs.release(p.slab);
        coverage.add(begin, end);
        dataBytes += end - begin;
        opts.onProgress?.(dataBytes);
        return {};
      }
      case 'sendHole': {
        const begin = intParam(url, 'begin');
        const end = intParam(url, 'end');
        checkRange(begin, end);
        await discardBody(req);
        hasher?.beginWrite(begin, end);
        const check = chainCheck;
        check?.beginWrite(begin, end);
        try {
          if (fileAlreadyExists && end > begin) {
            if (!opts.punchHole) throw new HttpProtocolError(500, 'cannot punch holes into an existing file: no hole puncher');
            await opts.punchHole(opts.filePath, begin, end - begin);
          }
          // whole hole segments are verified as zeros in the background (the request does not wait for it)
          if (check) check.track(check.verifyHoles(begin, end).finally(() => check.endWrite(begin, end)));
        } catch (err) {
          check?.endWrite(begin, end);
          throw err;
        } finally {
          hasher?.endWrite(begin);
        }
        hasher?.holeRecorded(begin, end);
        coverage.add(begin, end);
        holeBytes += end - begin;
        return {};
      }
      case 'sha512Chain': {
        // our extension: the sender's SHA-512 chain, before any data
        if (!acceptChain || req.method !== 'POST') throw new HttpProtocolError(404, `unknown ssync operation ${route}`);
        const body = await req.readAll(MAX_CHAIN_BODY);
        if (dataBytes > 0 || holeBytes > 0 || coverage.covered > 0) {
          throw new HttpProtocolError(409, 'the SHA-512 chain must be sent before any data');
        }
        let chain: Sha512Chain;
        try {
          chain = decodeChain(body);
        } catch (err) {
          throw new HttpProtocolError(400, (err as Error).message);
        }
        const expectedSize = size >= 0 ? size : opts.size;
        if (expectedSize > 0 && chain.size !== expectedSize) {
          throw new HttpProtocolError(400, `the SHA-512 chain is for ${chain.size} bytes, the file has ${expectedSize}`);
        }
        chainCheck = new ChainCheck(chain);
        segmentCut = chain.segmentSize <= MAX_INFLIGHT_SEGMENT ? chain.segmentSize : 0;
        // the sequential hash is not needed any more
        if (hasher) {
          const h = hasher;
          hasher = undefined;
          await h.close();
        }
        slabs = new SlabPool(segmentCut > 0 ? segmentCut : (opts.slabSize ?? RECEIVE_SLAB_SIZE), direct !== undefined, allocate);
        return {};
      }
      case 'getChecksum': {
        await discardBody(req);
        return json(null);
      }
      case 'getRecordedMetadata': {
        await discardBody(req);
        throw new HttpProtocolError(404, 'no recorded metadata');
      }
      case 'close': {
        await discardBody(req);
        if (!fh) throw new HttpProtocolError(400, 'file is not open: call open first');
        if (chainCheck && chainCheck.chain.size !== size) {
          throw new HttpProtocolError(400, `the SHA-512 chain is for ${chainCheck.chain.size} bytes, the file has ${size}`);
        }
        // answered pieces still being written or checked: the sender learns a failure from its close
        while (deferred.size > 0) await Promise.all([...deferred]);
        if (fatalError) throw new HttpProtocolError(400, fatalError.message);
        await fh.sync();
        closedAt = performance.now();
        const complete = coverage.covers(0, size);
        return {
          onSent: () => {
            void finish(
              complete
                ? undefined
                : new SsyncReceiveError(
                    `the sender closed an incomplete transfer: ${coverage.covered} of ${size} bytes received`,
                  ),
            );
          },
        };
      }
      default:
        throw new HttpProtocolError(404, `unknown ssync operation ${route}`);
    }
  };

  /** Answers one request (the server calls it for each, in order per connection). */
  async function serve(req: ReceiverHttpRequest): Promise<ReceiverHttpReply> {
    const allowed = checkInternalCaller(opts.auth, req.headers.get(AUTHORIZATION_HEADER));
    if (!allowed.ok) {
      // before arming the idle timer: an unauthenticated caller neither keeps the receiver alive nor is read further
      return { status: 401, body: `unauthorized: ${allowed.reason}\n`, contentType: 'text/plain; charset=utf-8', close: true };
    }
    armIdle();
    const text = (status: number, message: string, close: boolean): ReceiverHttpReply => ({
      status,
      body: `${message}\n`,
      contentType: 'text/plain; charset=utf-8',
      close,
    });
    if (fatalError && !finished) return text(400, fatalError.message, true);
    if (finished) return text(503, 'receiver is closed', false);
    const p = handle(req);
    inflight.add(p);
    void p.then(
      () => inflight.delete(p),
      () => inflight.delete(p),
    );
    try {
      return await p;
    } catch (err) {
      const e = err as Error;
      // a body not read to its end: the server tells the client this connection ends
      return text(e instanceof HttpProtocolError ? e.status : 500, e.message, !req.complete);
    }
  }

  try {
    await server.listen(opts.port, opts.host ?? '0.0.0.0');
  } catch (err) {
    // not listening (e.g. the port is taken): release what was set up for the receive
    finished = true;
    opts.signal?.removeEventListener('abort', onAbort);
    await hasher?.close();
    await direct?.close();
    throw err;
  }
  armIdle();
  const port = server.address().port;
  return { port, done, closed: server.closed };
}
