import http from 'node:http';
import { promises as fsp } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { IntervalSet } from './interval-set.js';
import type { HolePuncher } from './layout.js';
import { RECEIVE_SLAB_SIZE, ReceivedFileHasher, Slab, type ReceivedHashStats } from './received-hasher.js';

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
  /** Fail when no request arrives for this long (Longhorn: 300 s). */
  idleTimeoutMs?: number;
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
}

export interface SsyncReceiveResult {
  size: number;
  dataBytes: number;
  holeBytes: number;
  /** SHA-512 (hex) of the whole received file, when `computeChecksum` was set. */
  sha512?: string;
  /** How the checksum was computed (when `computeChecksum` was set). */
  hashStats?: ReceivedHashStats;
  /** Milliseconds from `open` to `close`, and from `close` until the checksum was final. */
  timings: { receiveMs: number; checksumTailMs: number };
}

/** Plain receive buffers for a receiver that does not hash. */
class SlabPool {
  readonly #free: Slab[] = [];
  constructor(readonly slabSize: number) {}
  async acquire(_begin: number): Promise<Slab> {
    return this.#free.pop() ?? new Slab(new SharedArrayBuffer(this.slabSize));
  }
  release(s: Slab): void {
    if (this.#free.length < 8) this.#free.push(s);
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

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

function intParam(url: URL, name: string): number {
  const raw = url.searchParams.get(name);
  const v = raw === null ? NaN : Number(raw);
  if (!Number.isSafeInteger(v) || v < 0) throw new HttpError(400, `invalid or missing query parameter ${name}: ${raw}`);
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
  const idleTimeoutMs = opts.idleTimeoutMs ?? 300_000;
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
  const hasher = opts.computeChecksum ? new ReceivedFileHasher({ fileHandle: () => fh, slabSize: opts.slabSize }) : undefined;
  const slabs = hasher ?? new SlabPool(opts.slabSize ?? RECEIVE_SLAB_SIZE);
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

  const server = http.createServer();
  server.keepAliveTimeout = 240_000;
  let resolveClosed!: () => void;
  const closed = new Promise<void>((res) => (resolveClosed = res));
  server.on('close', () => resolveClosed());

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
    let sha512: string | undefined;
    if (!err && hasher) {
      try {
        sha512 = await hasher.digest(size, opts.signal);
      } catch (e) {
        err = opts.signal?.aborted ? new SsyncReceiveError('receiving cancelled') : new SsyncReceiveError(`hashing the received file failed: ${(e as Error).message}`);
      }
    }
    await hasher?.close();
    if (fh) {
      const h = fh;
      fh = undefined;
      await h.close().catch(() => undefined);
    }
    const timings = { receiveMs: closedAt && openedAt ? closedAt - openedAt : 0, checksumTailMs: closedAt ? performance.now() - closedAt : 0 };
    if (err) rejectDone(err);
    else resolveDone({ size, dataBytes, holeBytes, sha512, hashStats: hasher ? { ...hasher.stats } : undefined, timings });
  };

  const armIdle = () => {
    if (idleTimer) clearTimeout(idleTimer);
    idleTimer = setTimeout(() => {
      void finish(new SsyncReceiveError(`no request from the sender in ${Math.round(idleTimeoutMs / 1000)} seconds`));
    }, idleTimeoutMs);
    idleTimer.unref();
  };
  const onAbort = () => {
    void finish(new SsyncReceiveError('receiving cancelled'));
  };
  opts.signal?.addEventListener('abort', onAbort, { once: true });

  const checkRange = (begin: number, end: number) => {
    if (!fh) throw new HttpError(400, 'file is not open: call open first');
    if (end < begin || end > size) throw new HttpError(400, `invalid range [${begin}, ${end}) for a file of size ${size}`);
  };

  const handle = async (req: http.IncomingMessage, res: http.ServerResponse): Promise<void> => {
    const url = new URL(req.url ?? '/', 'http://receiver');
    const route = url.pathname.replace(/^\/v1-ssync\/?/, '');
    if (url.pathname === route) throw new HttpError(404, `unknown path ${url.pathname}`);
    switch (route) {
      case 'open': {
        const begin = intParam(url, 'begin');
        const end = intParam(url, 'end');
        if (begin !== 0) throw new HttpError(400, `invalid open range begin ${begin}: must be 0`);
        if (opts.size > 0 && end !== opts.size) {
          throw new HttpError(400, `invalid file size ${end}: the receiver expects ${opts.size} bytes`);
        }
        if (url.searchParams.get('directIO') === 'true' && end % 4096 !== 0) {
          throw new HttpError(400, `invalid file size ${end} for directIO`);
        }
        if (!fh) fh = await fsp.open(opts.filePath, fileAlreadyExists ? 'r+' : 'w+');
        await fh.truncate(end);
        if (!openedAt) openedAt = performance.now();
        size = end;
        res.setHeader('Content-Type', 'application/json');
        res.end(JSON.stringify(fileAlreadyExists));
        return;
      }
      case 'writeData': {
        const begin = intParam(url, 'begin');
        const end = intParam(url, 'end');
        checkRange(begin, end);
        const handle = fh!;
        hasher?.beginWrite(begin, end);
        // Bodies are gathered into slabs and written with large positioned writes; a written slab goes to the
        // hasher, which keeps it until its range is hashed in file order.
        const pieces: Array<{ begin: number; end: number; slab: Slab | null }> = [];
        let slab: Slab | undefined;
        let fill = 0;
        let pos = begin;
        const writeSlab = async () => {
          const s = slab!;
          await writeSerially(handle, s.buffer, fill, pos);
          // hold at most one slab per request: an earlier one is released (its range is read back if needed)
          const prev = pieces[pieces.length - 1];
          if (prev?.slab) {
            slabs.release(prev.slab);
            prev.slab = null;
          }
          pieces.push({ begin: pos, end: pos + fill, slab: s });
          pos += fill;
          fill = 0;
          slab = undefined;
        };
        try {
          for await (const chunk of req as AsyncIterable<Buffer>) {
            const usable = Math.min(chunk.length, end - pos - fill);
            let off = 0;
            while (off < usable) {
              slab ??= await slabs.acquire(pos);
              const n = Math.min(usable - off, slab.buffer.length - fill);
              chunk.copy(slab.buffer, fill, off, off + n);
              fill += n;
              off += n;
              if (fill === slab.buffer.length) await writeSlab();
            }
          }
          if (fill > 0) await writeSlab();
          if (pos !== end) throw new HttpError(400, `short writeData body: got ${pos - begin} of ${end - begin} bytes`);
        } catch (err) {
          if (slab) slabs.release(slab);
          for (const p of pieces) if (p.slab) slabs.release(p.slab);
          throw err;
        } finally {
          hasher?.endWrite(begin);
        }
        if (hasher) for (const p of pieces) hasher.dataWritten(p.begin, p.end, p.slab);
        else for (const p of pieces) if (p.slab) slabs.release(p.slab);
        coverage.add(begin, end);
        dataBytes += end - begin;
        opts.onProgress?.(dataBytes);
        res.end();
        return;
      }
      case 'sendHole': {
        const begin = intParam(url, 'begin');
        const end = intParam(url, 'end');
        checkRange(begin, end);
        req.resume();
        hasher?.beginWrite(begin, end);
        try {
          if (fileAlreadyExists && end > begin) {
            if (!opts.punchHole) throw new HttpError(500, 'cannot punch holes into an existing file: no hole puncher');
            await opts.punchHole(opts.filePath, begin, end - begin);
          }
        } finally {
          hasher?.endWrite(begin);
        }
        hasher?.holeRecorded(begin, end);
        coverage.add(begin, end);
        holeBytes += end - begin;
        res.end();
        return;
      }
      case 'getChecksum': {
        req.resume();
        res.setHeader('Content-Type', 'application/json');
        res.end('null');
        return;
      }
      case 'getRecordedMetadata': {
        req.resume();
        throw new HttpError(404, 'no recorded metadata');
      }
      case 'close': {
        req.resume();
        if (!fh) throw new HttpError(400, 'file is not open: call open first');
        await fh.sync();
        closedAt = performance.now();
        res.end();
        const complete = coverage.covers(0, size);
        void finish(
          complete
            ? undefined
            : new SsyncReceiveError(
                `the sender closed an incomplete transfer: ${coverage.covered} of ${size} bytes received`,
              ),
        );
        return;
      }
      default:
        throw new HttpError(404, `unknown ssync operation ${route}`);
    }
  };

  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    armIdle();
    if (finished) {
      res.statusCode = 503;
      res.end('receiver is closed\n');
      return;
    }
    const p = handle(req, res).catch((err: unknown) => {
      const status = err instanceof HttpError ? err.status : 500;
      if (!res.headersSent) {
        res.statusCode = status;
        res.end(`${(err as Error).message}\n`);
      } else {
        res.destroy();
      }
    });
    inflight.add(p);
    void p.finally(() => inflight.delete(p));
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host ?? '0.0.0.0', () => {
      server.off('error', reject);
      resolve();
    });
  });
  armIdle();
  const port = (server.address() as AddressInfo).port;
  return { port, done, closed };
}
