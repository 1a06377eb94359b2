import { constants as fsConstants, promises as fsp } from 'node:fs';
import { alignedBuffer, DirectTarget } from '@bis/direct-io';
import { AUTHORIZATION_HEADER, checkInternalCaller } from '@bis/internal-auth';
import { decodeChain, nativeSha512ChainAvailable, type Sha512Chain } from '@bis/sha512-chain';
import { ChainCheck } from './chain-check.js';
import { IntervalSet, subtractRanges } from './interval-set.js';
import { DeferredPieces, SlabPool, processReceiveBudget, type ProcessReceiveBudget, type SlabSource } from './process-receive-budget.js';
import { PieceWriter } from './piece-writer.js';
import { RECEIVE_SLAB_SIZE, ReceivedFileHasher, type Slab, type SlabAllocator } from './received-hasher.js';
import { SsyncReceiveError } from './receive-error.js';
import { HttpProtocolError, type ReceiverHttpReply, type ReceiverHttpRequest, type ReceiverServer } from './receiver-http.js';
import { createReceiverServer } from './receiver-node-http.js';
import type { SsyncReceiveResult, SsyncReceiverOptions } from './receiver-types.js';

/** Largest chain segment verified from request bodies in flight (larger ones are verified from the file at close). */
const MAX_INFLIGHT_SEGMENT = 16 << 20;
/** The slowest sender still taken as progress, in bytes/s (`minSenderRate`). */
const DEFAULT_MIN_SENDER_RATE = 1 << 20;
/** Largest accepted `sha512Chain` body (64 bytes of state per segment: 32 MiB is 1 TiB in 2 MiB segments). */
const MAX_CHAIN_BODY = 64 << 20;
/** How long a receive failed after its answers waits for the sender to be told (SsyncReceiverOptions.fatalLingerMs). */
const FATAL_LINGER_MS = 10_000;

/**
 * Opens the target for reading and writing (created and truncated unless it existed) with `O_NOFOLLOW`: its path was
 * confined when the receive was launched, and a symbolic link planted at that name since then must not make the
 * received bytes land in the link's target. A link there is refused (400, naming the file).
 */
async function openTarget(filePath: string, exists: boolean): Promise<fsp.FileHandle> {
  const flags = fsConstants.O_RDWR | fsConstants.O_NOFOLLOW | (exists ? 0 : fsConstants.O_CREAT | fsConstants.O_TRUNC);
  try {
    return await fsp.open(filePath, flags, 0o644);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ELOOP') {
      throw new HttpProtocolError(400, `refusing to write ${filePath}: it is a symbolic link (a link at the target's path is never followed)`);
    }
    throw err;
  }
}

/** One received piece of a writeData request: its range, and its slab while the in-order hasher may still want it. */
interface Piece {
  begin: number;
  end: number;
  slab: Slab | null;
}

/** The progress of one writeData request: the body goes from the socket into slabs, a full slab to the file. */
interface WriteDataRequest {
  readonly begin: number;
  readonly end: number;
  readonly fh: fsp.FileHandle;
  readonly check: ChainCheck | undefined;
  /** Pieces written so far. */
  readonly pieces: Piece[];
  /** Writes and verifications of this request's pieces (they may end after the answer). */
  readonly settling: Promise<void>[];
  /** The slab being filled, from file offset `pos`, with `fill` bytes so far. */
  slab: Slab | undefined;
  pos: number;
  fill: number;
}

/**
 * One receive: the state of the target file and of the transfer, and the handlers of the `/v1-ssync/` requests
 * that change it. The receive ends (`done`) at a complete `close`, or fails on bad data, an idle sender, a
 * cancellation or a failed write or verification after its answer (then every later request is answered with it).
 */
export class ReceiveSession {
  /** Settles with the result of the receive. */
  readonly done: Promise<SsyncReceiveResult>;
  /**
   * Settles once it is known how the receive is checked: with the sender's SHA-512 chain (its check, whose
   * `whenFinal` tells when each segment may be forwarded), or without one (undefined: data or a hole came first, or
   * the receive completed without one). Rejects when the receive fails first.
   */
  readonly chainKnown: Promise<ChainCheck | undefined>;
  #settleChainKnown!: (c: ChainCheck | undefined, err?: Error) => void;
  #resolveDone!: (r: SsyncReceiveResult) => void;
  #rejectDone!: (e: Error) => void;

  readonly #opts: SsyncReceiverOptions;
  /** The target existed before (then holes are punched, and `open` answers true). */
  readonly #fileAlreadyExists: boolean;
  readonly #idleTimeoutMs: number;
  readonly #server: ReceiverServer;
  readonly #direct: DirectTarget | undefined;
  readonly #allocate: SlabAllocator;
  readonly #acceptChain: boolean;
  readonly #writer: PieceWriter;
  readonly #budget: ProcessReceiveBudget;

  // ---- the file
  #fh: fsp.FileHandle | undefined;
  /** The size announced by `open` (-1 before it). */
  #size = -1;
  #openedAt = 0;
  #closedAt = 0;

  // ---- what was received
  readonly #coverage = new IntervalSet();
  /** What came as `sendHole` and as `writeData`, for a forwarder to send a segment's holes on as holes. */
  readonly #holeRanges = new IntervalSet();
  readonly #dataRanges = new IntervalSet();
  #dataBytes = 0;
  #holeBytes = 0;

  // ---- how it is checked: the in-order hash (which also provides the slabs), or the sender's chain
  #hasher: ReceivedFileHasher | undefined;
  #slabs: SlabSource;
  #chainCheck: ChainCheck | undefined;
  /** Bytes per in-flight verified piece (the chain's segment size), 0 = no in-flight verification. */
  #segmentCut = 0;

  // ---- lifecycle
  /**
   * Set when the received data failed verification or a deferred write failed: every request still running or
   * arriving is answered with it (so every sender worker learns why), then the receive ends.
   */
  #fatalError: Error | undefined;
  /** Settles once a reply carrying the fatal error has gone out: a lingering #finish() may then close the port. */
  #resolveFatalSent!: () => void;
  readonly #fatalSent = new Promise<void>((resolve) => (this.#resolveFatalSent = resolve));
  /** A reply's `onSent` for the fatal error (after the write is flushed: the next turn of the event loop). */
  readonly #onFatalSent = (): void => {
    setImmediate(this.#resolveFatalSent);
  };
  #finished = false;
  /** Requests being handled. */
  readonly #inflight = new Set<Promise<unknown>>();
  /** Pieces written or verified after their answer (each holds its slab). */
  readonly #deferred: DeferredPieces;
  #idleTimer: NodeJS.Timeout | undefined;
  /** Requests currently reading a body from the sender (the stall timer counts only while every request waits on it). */
  #readingFromSender = 0;
  readonly #onAbort = (): void => {
    // #finish() settles `done` with the outcome; callers wait on `done`.
    void this.#finish(new SsyncReceiveError('receiving cancelled'));
  };

  constructor(opts: SsyncReceiverOptions, fileAlreadyExists: boolean, budget: ProcessReceiveBudget = processReceiveBudget) {
    this.#opts = opts;
    this.#fileAlreadyExists = fileAlreadyExists;
    this.#idleTimeoutMs = opts.idleTimeoutMs ?? 30_000;
    this.done = new Promise<SsyncReceiveResult>((res, rej) => {
      this.#resolveDone = res;
      this.#rejectDone = rej;
    });
    this.done.catch(() => undefined); // awaited by whoever asks; this only keeps a rejection nobody waits for from being unhandled
    let chainSettled = false;
    this.chainKnown = new Promise<ChainCheck | undefined>((res, rej) => {
      this.#settleChainKnown = (c, err) => {
        if (chainSettled) return;
        chainSettled = true;
        if (err) rej(err);
        else res(c);
      };
    });
    this.chainKnown.catch(() => undefined); // as for `done`
    this.#budget = budget;
    this.#deferred = new DeferredPieces(budget);
    const direct = opts.directIO === false ? undefined : new DirectTarget();
    this.#direct = direct;
    this.#allocate = direct
      ? (n, shared) => alignedBuffer(n, { shared })
      : (n, shared) => Buffer.from(shared ? new SharedArrayBuffer(n) : new ArrayBuffer(n));
    this.#hasher = opts.computeChecksum ? new ReceivedFileHasher({ fileHandle: () => this.#fh, slabSize: opts.slabSize, allocate: this.#allocate }) : undefined;
    this.#slabs = this.#hasher ?? new SlabPool(opts.slabSize ?? RECEIVE_SLAB_SIZE, direct !== undefined, this.#allocate, budget);
    this.#acceptChain = opts.acceptChain ?? nativeSha512ChainAvailable();
    this.#writer = new PieceWriter(direct);
    this.#server = createReceiverServer((req) => this.#serve(req), { keepAliveTimeoutMs: 240_000, headerTimeoutMs: opts.headerTimeoutMs, kind: opts.httpServer });
    opts.signal?.addEventListener('abort', this.#onAbort, { once: true });
  }

  /** Resolves when the HTTP server is closed and the port is free again. */
  get closed(): Promise<void> {
    return this.#server.closed;
  }

  /** Starts listening (and the idle timer); resolves with the port. If it cannot listen, releases what it holds. */
  async listen(port: number, host: string): Promise<number> {
    try {
      await this.#server.listen(port, host);
    } catch (err) {
      // not listening (e.g. the port is taken): release what was set up for the receive
      this.#finished = true;
      this.#opts.signal?.removeEventListener('abort', this.#onAbort);
      await this.#hasher?.close();
      await this.#direct?.close();
      throw err;
    }
    this.#armIdle();
    return this.#server.address().port;
  }

  /**
   * The sender answered that it is busy (it sends this file to as many peers as it may) and will be asked again: the
   * stall timer starts again, as a request would start it. Nothing changes once the receive is over or a request has
   * come in.
   */
  keepWaiting(): void {
    if (this.#finished || this.#inflight.size > 0 || this.#openedAt) return;
    this.#armIdle();
  }

  /**
   * The parts of [begin, end) that came as `sendHole` and not (also) as `writeData`, in order: holes in the file.
   * Asked by a forwarder once the range's segment is final, so that it sends them on as holes.
   */
  holesIn(begin: number, end: number): Array<[number, number]> {
    const holes = this.#holeRanges.within(begin, end);
    return holes.length === 0 ? holes : subtractRanges(holes, this.#dataRanges.within(begin, end));
  }

  // ---------------------------------------------------------------- requests

  /** Answers one request (the server calls it for each, in order per connection). */
  async #serve(req: ReceiverHttpRequest): Promise<ReceiverHttpReply> {
    const allowed = checkInternalCaller(this.#opts.auth, req.headers.get(AUTHORIZATION_HEADER));
    if (!allowed.ok) {
      // before arming the idle timer: an unauthenticated caller neither keeps the receiver alive nor is read further
      return { status: 401, body: `unauthorized: ${allowed.reason}\n`, contentType: 'text/plain; charset=utf-8', close: true };
    }
    this.#armIdle();
    const text = (status: number, message: string, close: boolean): ReceiverHttpReply => ({
      status,
      body: `${message}\n`,
      contentType: 'text/plain; charset=utf-8',
      close,
    });
    if (this.#fatalError) return { ...text(400, this.#fatalError.message, true), onSent: this.#onFatalSent };
    if (this.#finished) return text(503, 'receiver is closed', false);
    const p = this.#route(req);
    this.#inflight.add(p);
    // Both outcomes are handled; `p` itself is awaited below.
    void p.then(
      () => this.#inflight.delete(p),
      () => this.#inflight.delete(p),
    );
    try {
      return await p;
    } catch (err) {
      const e = err as Error;
      const reply = text(e instanceof HttpProtocolError ? e.status : 500, e.message, !req.complete);
      // a body not read to its end: the server tells the client this connection ends
      return this.#isFatal(e) ? { ...reply, onSent: this.#onFatalSent } : reply;
    }
  }

  /** Whether a request's failure is the receive's fatal error (set while the request ran). */
  #isFatal(e: Error): boolean {
    return this.#fatalError !== undefined && e.message === this.#fatalError.message;
  }

  async #route(req: ReceiverHttpRequest): Promise<ReceiverHttpReply> {
    const url = new URL(req.target, 'http://receiver');
    const route = url.pathname.replace(/^\/v1-ssync\/?/, '');
    if (url.pathname === route) throw new HttpProtocolError(404, `unknown path ${url.pathname}`);
    switch (route) {
      case 'open':
        return this.#open(req, url);
      case 'writeData':
        return this.#writeData(req, url);
      case 'sendHole':
        return this.#sendHole(req, url);
      case 'sha512Chain':
        // our extension: the sender's SHA-512 chain, before any data
        if (!this.#acceptChain || req.method !== 'POST') throw new HttpProtocolError(404, `unknown ssync operation ${route}`);
        return this.#receiveChain(req);
      case 'getChecksum':
        await discardBody(req);
        return json(null);
      case 'getRecordedMetadata':
        await discardBody(req);
        throw new HttpProtocolError(404, 'no recorded metadata');
      case 'close':
        return this.#close(req);
      default:
        throw new HttpProtocolError(404, `unknown ssync operation ${route}`);
    }
  }

  async #open(req: ReceiverHttpRequest, url: URL): Promise<ReceiverHttpReply> {
    const opts = this.#opts;
    const begin = intParam(url, 'begin');
    const end = intParam(url, 'end');
    if (begin !== 0) throw new HttpProtocolError(400, `invalid open range begin ${begin}: must be 0`);
    if (opts.size > 0 && end !== opts.size) {
      throw new HttpProtocolError(400, `invalid file size ${end}: the receiver expects ${opts.size} bytes`);
    }
    if (url.searchParams.get('directIO') === 'true' && end % 4096 !== 0) {
      throw new HttpProtocolError(400, `invalid file size ${end} for directIO`);
    }
    if (!this.#fh) this.#fh = await openTarget(opts.filePath, this.#fileAlreadyExists);
    await this.#fh.truncate(end);
    await this.#direct?.open(opts.filePath);
    if (!this.#openedAt) this.#openedAt = performance.now();
    this.#size = end;
    await discardBody(req);
    return json(this.#fileAlreadyExists);
  }

  async #writeData(req: ReceiverHttpRequest, url: URL): Promise<ReceiverHttpReply> {
    const begin = intParam(url, 'begin');
    const end = intParam(url, 'end');
    this.#checkRange(begin, end);
    // the hasher is read anew at each use: a chain accepted meanwhile drops it
    this.#hasher?.beginWrite(begin, end);
    const check = this.#chainCheck;
    check?.beginWrite(begin, end);
    // a chain comes before any data or not at all
    this.#settleChainKnown(check);
    // Bodies are read straight into slabs, and a slab goes to the file in one positioned write; with the in-order
    // hash a written slab goes to the hasher, which keeps it until its range is hashed in file order.
    const w: WriteDataRequest = { begin, end, fh: this.#fh!, check, pieces: [], settling: [], slab: undefined, pos: begin, fill: 0 };
    try {
      await this.#receiveBody(req, w);
    } catch (err) {
      if (w.slab) this.#slabs.release(w.slab);
      for (const p of w.pieces) if (p.slab) this.#slabs.release(p.slab);
      throw err;
    } finally {
      this.#hasher?.endWrite(begin);
      if (check && w.settling.length > 0) {
        // the request's range counts as being written until its writes and verifications end (a failure is kept by
        // track)
        check.track(
          Promise.all(w.settling)
            .then(() => undefined)
            .finally(() => check.endWrite(begin, end)),
        );
      } else {
        check?.endWrite(begin, end);
      }
    }
    const hasher = this.#hasher;
    if (hasher) for (const p of w.pieces) hasher.dataWritten(p.begin, p.end, p.slab);
    else for (const p of w.pieces) if (p.slab) this.#slabs.release(p.slab);
    this.#coverage.add(begin, end);
    this.#dataRanges.add(begin, end);
    this.#dataBytes += end - begin;
    this.#opts.onProgress?.(this.#dataBytes);
    return {};
  }

  /** Reads the request's body into slabs and writes each full slab (or whole chain segment) as one piece. */
  async #receiveBody(req: ReceiverHttpRequest, w: WriteDataRequest): Promise<void> {
    // the body goes from the socket straight into the slab
    while (w.pos + w.fill < w.end) {
      if (this.#fatalError) throw new HttpProtocolError(400, this.#fatalError.message);
      // at most a few pieces written or verified after their answer, per receiver and for the process: beyond, the
      // sender waits
      while (!w.slab && this.#deferred.full) await this.#deferred.anySettled();
      w.slab ??= await this.#slabs.acquire(w.pos);
      const slab = w.slab;
      let n = Math.min(w.end - w.pos - w.fill, slab.buffer.length - w.fill);
      // with a chain, pieces end at segment boundaries so that whole segments are verified in flight
      const cut = this.#segmentCut;
      if (cut > 0) n = Math.min(n, cut - ((w.pos + w.fill) % cut));
      const got = await this.#readFromSender(req, slab.buffer.subarray(w.fill, w.fill + n));
      w.fill += got;
      if (got < n) throw new HttpProtocolError(400, `short writeData body: got ${w.pos + w.fill - w.begin} of ${w.end - w.begin} bytes`);
      if (w.fill === slab.buffer.length || (this.#segmentCut > 0 && (w.pos + w.fill) % this.#segmentCut === 0)) await this.#writeSlab(w);
    }
    if (w.fill > 0) await this.#writeSlab(w);
    // like Longhorn, at most end - begin bytes of the body are used
    await discardBody(req);
  }

  /** Writes the filled part of the request's slab at its offset (and verifies it when it is a whole chain segment). */
  async #writeSlab(w: WriteDataRequest): Promise<void> {
    const s = w.slab!;
    const at = w.pos;
    const length = w.fill;
    w.pos += w.fill;
    w.fill = 0;
    w.slab = undefined;
    const check = w.check;
    const segment = check && this.#segmentCut > 0 ? check.wholeSegment(at, length) : undefined;
    // The segment is verified from the body while it is written. Without the in-order hash neither has to end before
    // the answer: the slab is kept until both have, the request's segments stay "being written" for the chain check
    // until then, and a failure fails the whole receive (the later requests and the close get it).
    const verifying = check && segment !== undefined ? check.verifyInFlight(segment, s.buffer.subarray(0, length)) : undefined;
    const writing = this.#writer.write(w.fh, s.buffer, length, at);
    if (verifying) {
      w.settling.push(verifying);
      verifying.catch((e: unknown) => this.#failDeferred("the received data does not match the sender's SHA-512 chain", e as Error));
    }
    if (this.#hasher) {
      // the in-order hash takes the written slab (at most one per request is held: an earlier one is released and its
      // range read back if needed)
      try {
        await writing;
      } catch (err) {
        this.#slabs.release(s);
        throw err;
      }
      const prev = w.pieces[w.pieces.length - 1];
      if (prev?.slab) {
        this.#slabs.release(prev.slab);
        prev.slab = null;
      }
      w.pieces.push({ begin: at, end: at + length, slab: s });
      return;
    }
    w.settling.push(writing);
    writing.catch((e: unknown) => this.#failDeferred('writing the received data failed', e as Error));
    this.#deferred.hold(verifying ? [writing, verifying] : [writing], () => this.#slabs.release(s));
    w.pieces.push({ begin: at, end: at + length, slab: null });
  }

  async #sendHole(req: ReceiverHttpRequest, url: URL): Promise<ReceiverHttpReply> {
    const opts = this.#opts;
    const begin = intParam(url, 'begin');
    const end = intParam(url, 'end');
    this.#checkRange(begin, end);
    await discardBody(req);
    // the hasher is read anew at each use: a chain accepted meanwhile drops it
    this.#hasher?.beginWrite(begin, end);
    const check = this.#chainCheck;
    check?.beginWrite(begin, end);
    this.#settleChainKnown(check);
    try {
      if (this.#fileAlreadyExists && end > begin) {
        if (!opts.punchHole) throw new HttpProtocolError(500, 'cannot punch holes into an existing file: no hole puncher');
        await opts.punchHole(opts.filePath, begin, end - begin);
      }
      // whole hole segments are verified as zeros in the background (the request does not wait for it)
      if (check) check.track(check.verifyHoles(begin, end).finally(() => check.endWrite(begin, end)));
    } catch (err) {
      check?.endWrite(begin, end);
      throw err;
    } finally {
      this.#hasher?.endWrite(begin);
    }
    this.#hasher?.holeRecorded(begin, end);
    this.#coverage.add(begin, end);
    this.#holeRanges.add(begin, end);
    this.#holeBytes += end - begin;
    return {};
  }

  async #receiveChain(req: ReceiverHttpRequest): Promise<ReceiverHttpReply> {
    const body = await req.readAll(MAX_CHAIN_BODY);
    if (this.#dataBytes > 0 || this.#holeBytes > 0 || this.#coverage.covered > 0) {
      throw new HttpProtocolError(409, 'the SHA-512 chain must be sent before any data');
    }
    let chain: Sha512Chain;
    try {
      chain = decodeChain(body);
    } catch (err) {
      throw new HttpProtocolError(400, (err as Error).message);
    }
    const expectedSize = this.#size >= 0 ? this.#size : this.#opts.size;
    if (expectedSize > 0 && chain.size !== expectedSize) {
      throw new HttpProtocolError(400, `the SHA-512 chain is for ${chain.size} bytes, the file has ${expectedSize}`);
    }
    this.#chainCheck = new ChainCheck(chain);
    // a segment received in pieces is read back early when a forwarder waits for it
    this.#chainCheck.setFile(() => this.#fh);
    this.#segmentCut = chain.segmentSize <= MAX_INFLIGHT_SEGMENT ? chain.segmentSize : 0;
    // the sequential hash is not needed any more
    if (this.#hasher) {
      const h = this.#hasher;
      this.#hasher = undefined;
      await h.close();
    }
    const slabSize = this.#segmentCut > 0 ? this.#segmentCut : (this.#opts.slabSize ?? RECEIVE_SLAB_SIZE);
    this.#slabs = new SlabPool(slabSize, this.#direct !== undefined, this.#allocate, this.#budget);
    this.#settleChainKnown(this.#chainCheck);
    return {};
  }

  async #close(req: ReceiverHttpRequest): Promise<ReceiverHttpReply> {
    await discardBody(req);
    const fh = this.#fh;
    const size = this.#size;
    if (!fh) throw new HttpProtocolError(400, 'file is not open: call open first');
    if (this.#chainCheck && this.#chainCheck.chain.size !== size) {
      throw new HttpProtocolError(400, `the SHA-512 chain is for ${this.#chainCheck.chain.size} bytes, the file has ${size}`);
    }
    // answered pieces still being written or checked: the sender learns a failure from its close
    await this.#deferred.drain();
    if (this.#fatalError) throw new HttpProtocolError(400, this.#fatalError.message);
    await fh.sync();
    this.#closedAt = performance.now();
    const coverage = this.#coverage;
    const complete = coverage.covers(0, size);
    return {
      onSent: () => {
        // #finish() settles `done` with the outcome; callers wait on `done`.
        void this.#finish(
          complete ? undefined : new SsyncReceiveError(`the sender closed an incomplete transfer: ${coverage.covered} of ${this.#size} bytes received`),
        );
      },
    };
  }

  #checkRange(begin: number, end: number): void {
    if (!this.#fh) throw new HttpProtocolError(400, 'file is not open: call open first');
    if (end < begin || end > this.#size) throw new HttpProtocolError(400, `invalid range [${begin}, ${end}) for a file of size ${this.#size}`);
  }

  // ---------------------------------------------------------------- lifecycle

  // The stall timer: re-armed by every request and every piece of a body read from the sender; it fails the receive
  // only while the receiver waits for the sender (requests in flight that are not reading from it mean the receiver is
  // busy, and the timer starts again). A connection closed in the middle of a body shortens it: the sender is gone.
  #armIdle(ms = this.#idleTimeoutMs, why: () => string = () => `no request from the sender in ${Math.round(this.#idleTimeoutMs / 1000)} seconds`): void {
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#idleTimer = setTimeout(() => {
      if (this.#finished) return;
      if (this.#inflight.size > this.#readingFromSender) return this.#armIdle();
      // #finish() settles `done` with the outcome; callers wait on `done`.
      void this.#finish(new SsyncReceiveError(why()));
    }, ms);
    this.#idleTimer.unref();
  }

  #senderGone(err: unknown): void {
    const ms = this.#opts.senderGoneTimeoutMs ?? 2000;
    this.#armIdle(
      ms,
      () => `no request from the sender in ${Math.round(ms / 1000)} seconds after its connection closed in the middle of a request (${(err as Error).message}): the sender is gone`,
    );
  }

  /** The stall timeout while a piece of `bytes` is read from the sender: the idle timeout, or longer at the floor rate. */
  #pieceTimeoutMs(bytes: number): number {
    const rate = this.#opts.minSenderRate ?? DEFAULT_MIN_SENDER_RATE;
    return Math.max(this.#idleTimeoutMs, rate > 0 ? Math.ceil((bytes / rate) * 1000) : 0);
  }

  async #readFromSender(req: ReceiverHttpRequest, into: Buffer): Promise<number> {
    this.#readingFromSender++;
    const ms = this.#pieceTimeoutMs(into.length);
    if (ms > this.#idleTimeoutMs) this.#armIdle(ms, () => `no ${into.length}-byte piece of a request body from the sender in ${Math.round(ms / 1000)} seconds`);
    try {
      const got = await req.readInto(into);
      if (got < into.length) this.#senderGone(new Error(`the body ended after ${got} of ${into.length} bytes`));
      else this.#armIdle();
      return got;
    } catch (err) {
      this.#senderGone(err);
      throw err;
    } finally {
      this.#readingFromSender--;
    }
  }

  /**
   * A write or a verification that ended after its request was answered failed: the receive fails, every later
   * request too.
   */
  #failDeferred(what: string, err: Error): void {
    if (this.#fatalError || this.#finished) return;
    const fatal = new SsyncReceiveError(`${what}: ${err.message}`);
    this.#fatalError = fatal;
    // The server keeps answering (every request gets the fatal error) until #finish(): a sender between two requests
    // learns why instead of finding the port closed.
    // #finish() settles `done` with the outcome; callers wait on `done`.
    void Promise.allSettled([...this.#inflight]).then(() => this.#finish(fatal));
  }

  /** Ends the receive once: stops the server, waits for running work, computes the checksum, settles `done`. */
  async #finish(failure: Error | undefined): Promise<void> {
    let err = failure;
    if (this.#finished) return;
    this.#finished = true;
    const opts = this.#opts;
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    if (err && err === this.#fatalError && !opts.signal?.aborted) {
      // The failure came after the answers (a deferred verification or write): until a reply has carried it to the
      // sender, wait briefly for the sender's next request, which gets it, rather than close the port under the
      // sender, which would only see a refused connection (and not know its copy may be bad).
      await new Promise<void>((resolve) => {
        const done = (): void => {
          clearTimeout(timer);
          opts.signal?.removeEventListener('abort', done);
          resolve();
        };
        const timer = setTimeout(done, opts.fatalLingerMs ?? FATAL_LINGER_MS);
        opts.signal?.addEventListener('abort', done, { once: true });
        void this.#fatalSent.then(done);
      });
    }
    opts.signal?.removeEventListener('abort', this.#onAbort);
    this.#server.close();
    this.#server.closeAllConnections();
    this.#hasher?.stopAcquiring(new SsyncReceiveError('the receiver is finishing'));
    await Promise.allSettled([...this.#inflight]);
    // pieces still being written or verified after their answer (the file is not closed under them)
    await this.#deferred.drain();
    const hasher = this.#hasher;
    const chainCheck = this.#chainCheck;
    let sha512: string | undefined;
    let chain: Sha512Chain | undefined;
    if (!err && chainCheck && this.#fh) {
      try {
        sha512 = await chainCheck.finish(this.#fh, opts.signal);
        chain = chainCheck.chain;
      } catch (e) {
        err = opts.signal?.aborted
          ? new SsyncReceiveError('receiving cancelled')
          : new SsyncReceiveError(`the received data does not match the sender's SHA-512 chain: ${(e as Error).message}`);
      }
    } else if (!err && hasher) {
      try {
        sha512 = await hasher.digest(this.#size, opts.signal);
        chain = hasher.chain;
      } catch (e) {
        err = opts.signal?.aborted ? new SsyncReceiveError('receiving cancelled') : new SsyncReceiveError(`hashing the received file failed: ${(e as Error).message}`);
      }
    }
    // a forwarding sender waiting for segments learns the outcome (on success every segment is final)
    chainCheck?.settle(err);
    this.#settleChainKnown(undefined, err);
    await hasher?.close();
    await this.#direct?.close();
    if (this.#fh) {
      const h = this.#fh;
      this.#fh = undefined;
      await h.close().catch(() => undefined); // the data was synced when the sender closed (or the session failed): a close error adds nothing
    }
    const closedAt = this.#closedAt;
    const timings = { receiveMs: closedAt && this.#openedAt ? closedAt - this.#openedAt : 0, checksumTailMs: closedAt ? performance.now() - closedAt : 0 };
    if (err) this.#rejectDone(err);
    else {
      this.#resolveDone({
        size: this.#size,
        dataBytes: this.#dataBytes,
        holeBytes: this.#holeBytes,
        sha512,
        chain,
        hashStats: hasher ? { ...hasher.stats } : undefined,
        chainStats: chainCheck ? { ...chainCheck.stats } : undefined,
        writeStats: { ...this.#writer.stats },
        timings,
      });
    }
  }
}

const json = (value: unknown): ReceiverHttpReply => ({ body: JSON.stringify(value), contentType: 'application/json' });

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
