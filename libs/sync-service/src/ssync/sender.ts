import { parseHostPort } from '@bis/net-address';
import http from 'node:http';
import type net from 'node:net';
import { promises as fsp } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import type { SegmentKind } from './chain-check.js';
import { createHash } from 'node:crypto';
import { encodeChain, type Sha512Chain } from '@bis/sha512-chain';
import { sendFileAvailable, sendFileToSocket, type SendFileTransfer } from '@bis/block-mapping';
import { authHeaders } from '@bis/internal-auth';
import type { Extent, FileLayoutProvider } from './layout.js';
import { sendfileSetting } from './paths.js';

export const SSYNC_CHUNK_SIZE = 2 << 20;
/** `writeData` size for a receiver that accepted the SHA-512 chain, when bodies go out with sendfile. */
export const SSYNC_CHAIN_CHUNK_SIZE = 8 << 20;
export const SSYNC_WORKERS = 4;

export interface SendFileOptions {
  /** File to send. */
  path: string;
  /** Receiver `host:port`. */
  toAddress: string;
  /** Where the file has data and holes (from `@bis/block-mapping`). Holes are sent as holes and never read. */
  layout: FileLayoutProvider;
  signal?: AbortSignal;
  /** Parallel requests (Longhorn: 4). */
  workers?: number;
  /**
   * Bytes per writeData request (Longhorn: 2 MiB; keep it toward a Longhorn receiver). 4 MiB toward ours costs the
   * sender ~10 % less CPU but 8 MB more memory per send (4 workers' buffers), which the daemon's memory budget does not
   * have with 3 sends at once.
   */
  chunkSize?: number;
  /** Attempts per request before the transfer fails (Longhorn: 1). */
  attempts?: number;
  /** How long `open` is retried while the receiver is not up yet (Longhorn: 120 s). */
  openTimeoutMs?: number;
  /**
   * Per-request timeout for a request carrying `bytes` of body. Default: 10 s + 1 s per 512 KiB, so slow disks
   * get time in proportion to the data (Longhorn: a fixed 5 s for any request, longhorn#6536).
   */
  requestTimeoutMs?: (bytes: number) => number;
  /** Data bytes acknowledged so far. */
  onProgress?: (sentDataBytes: number) => void;
  /**
   * The file's SHA-512 chain (our extension). Offered to the receiver with `POST sha512Chain` after `open`; a receiver
   * that accepts it verifies every segment in parallel instead of hashing the file sequentially, and the data is then
   * sent in pieces aligned to the chain's segments. A receiver without the route (Longhorn's answers 404) gets the
   * file exactly as without a chain.
   */
  chain?: Sha512Chain;
  /**
   * Send `writeData` bodies with sendfile(2), from the page cache straight to the socket; false reads each chunk with
   * a positioned read and writes it. Default: `BIS_SSYNC_SENDFILE` (`1` or `0`) when set, else when the block-mapping
   * addon has sendfile. Not used when the receiver's file existed before (each chunk is then hashed first).
   */
  sendfile?: boolean;
  /** Token sent as `authorization: Bearer <token>` on every request (see `@bis/internal-auth`). */
  token?: string;
  /**
   * Forwards a file that is still being received (pipelined distribution, our extension of the sender only): its
   * segments go out in file order, each as soon as `segmentFinal` says it is in `file` and verified against `chain`
   * (which is then required and offered as usual), so a receiver of this copy gets the file while this copy still
   * receives it. `layout` is not used and `path` only names the file in messages; `file` stays open (the caller's).
   */
  forward?: ForwardSource;
}

/** A file being received, as the source of a forwarding send (see {@link SendFileOptions.forward}). */
export interface ForwardSource {
  file: FileHandle;
  size: number;
  /** Resolves when segment `index` is final: `hole` (send it as a hole) or `data` (read it from `file`). */
  segmentFinal(index: number): Promise<SegmentKind>;
  /**
   * The parts of [begin, end) of a final `data` segment that are holes in `file` (received as holes), in order: they
   * are sent on as holes, the rest as data, so that the next copy is as sparse as this one. Without it a segment
   * that is partly holes is sent as data (its holes as zeros).
   */
  holesIn?(begin: number, end: number): ReadonlyArray<readonly [number, number]>;
}

export interface SendFileResult {
  size: number;
  dataBytes: number;
  holeBytes: number;
  retries: number;
  /** Whether the receiver accepted the chain. */
  chainAccepted: boolean;
  /** Data bytes sent with sendfile(2) (the rest was read into memory and written). */
  sendfileBytes: number;
}

/** A `writeData` body sent from the file with sendfile(2). */
interface FileRange {
  fd: number;
  offset: number;
  length: number;
}

const EMPTY = Buffer.alloc(0);

/** The descriptor of a connected socket, where this runtime exposes it. */
function socketFd(sock: net.Socket): number | undefined {
  const fd = (sock as unknown as { _handle?: { fd?: unknown } | null })._handle?.fd;
  return typeof fd === 'number' && fd >= 0 ? fd : undefined;
}

export class SsyncSendError extends Error {
  override readonly name = 'SsyncSendError';
  constructor(
    message: string,
    /** The receiver's HTTP status, when it answered. */
    readonly status?: number,
  ) {
    super(message);
  }
}

export function defaultRequestTimeoutMs(bytes: number): number {
  return 10_000 + Math.ceil(bytes / (512 * 1024)) * 1000;
}

interface Task {
  kind: 'data' | 'hole';
  begin: number;
  end: number;
}

/** Longhorn's plan: every hole as one `sendHole`, every data extent cut into `chunkSize` pieces. */
export function planByExtents(data: readonly Extent[], holes: readonly Extent[], chunkSize: number): Task[] {
  const tasks: Task[] = [];
  for (const h of holes) if (h.length > 0) tasks.push({ kind: 'hole', begin: h.offset, end: h.offset + h.length });
  for (const d of data) {
    for (let off = d.offset; off < d.offset + d.length; off += chunkSize) {
      tasks.push({ kind: 'data', begin: off, end: Math.min(off + chunkSize, d.offset + d.length) });
    }
  }
  return tasks.sort((a, b) => a.begin - b.begin);
}

/**
 * The plan with a chain: pieces never cross a segment boundary, so that a segment sent whole can be verified by the
 * receiver from the request body. A run of segments that are all hole is one `sendHole`; a segment that is all data is
 * one `writeData` (consecutive whole data segments are joined up to `chunkSize`); a segment with both sends its data
 * extents and its holes separately (the receiver verifies it from its file once all pieces arrived).
 */
export function planBySegments(
  data: readonly Extent[],
  holes: readonly Extent[],
  size: number,
  segmentSize: number,
  chunkSize: number,
): Task[] {
  const pieces: Task[] = [];
  const all = [
    ...data.map((e) => ({ ...e, kind: 'data' as const })),
    ...holes.map((e) => ({ ...e, kind: 'hole' as const })),
  ].sort((a, b) => a.offset - b.offset);
  // cut every extent at the segment boundaries
  for (const e of all) {
    for (let off = e.offset; off < e.offset + e.length; ) {
      const end = Math.min(e.offset + e.length, (Math.floor(off / segmentSize) + 1) * segmentSize);
      pieces.push({ kind: e.kind, begin: off, end });
      off = end;
    }
  }
  const maxData = Math.max(segmentSize, chunkSize - (chunkSize % segmentSize));
  const tasks: Task[] = [];
  const wholeSegments = (t: Task) => t.begin % segmentSize === 0 && (t.end % segmentSize === 0 || t.end === size);
  for (const t of pieces) {
    const last = tasks[tasks.length - 1];
    if (last && last.kind === t.kind && last.end === t.begin) {
      // holes merge freely; data merges only segment-wise (whole segments up to maxData), or within one segment
      const sameSegment = Math.floor(last.begin / segmentSize) === Math.floor((t.end - 1) / segmentSize);
      const whole = wholeSegments(last) && wholeSegments(t);
      if (t.kind === 'hole' || sameSegment || (whole && t.end - last.begin <= maxData)) {
        last.end = t.end;
        continue;
      }
    }
    tasks.push({ ...t });
  }
  return tasks;
}

/** `p`, or the signal's reason as soon as it aborts (the wait for a segment of a file being received can be long). */
function untilAborted<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e as Error);
      },
    );
  });
}

function parseAddress(toAddress: string): { host: string; port: number } {
  try {
    return parseHostPort(toAddress, { what: 'receiver address' });
  } catch (e) {
    throw new SsyncSendError((e as Error).message);
  }
}

const delay = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason as Error);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });

/**
 * Sender side of Longhorn's sparse file-sync protocol. Walks the file's data extents (holes are announced with
 * `sendHole` and never read), sends data in `chunkSize` pieces over `workers` parallel keep-alive connections,
 * retries a failed request, and calls `close` only after every range was acknowledged: a sender that fails or is
 * cancelled never makes the receiver believe the file is complete.
 */
export async function sendFile(opts: SendFileOptions): Promise<SendFileResult> {
  const { host, port } = parseAddress(opts.toAddress);
  // BIS_SSYNC_SENDFILE (see paths.ts) decides when the caller does not; validated before anything is set up
  let useSendfile = opts.sendfile ?? sendfileSetting(sendFileAvailable());
  const workers = opts.workers ?? SSYNC_WORKERS;
  const attempts = Math.max(1, opts.attempts ?? 3);
  const timeoutFor = opts.requestTimeoutMs ?? defaultRequestTimeoutMs;
  const openTimeoutMs = opts.openTimeoutMs ?? 120_000;
  const outer = new AbortController();
  const onOuterAbort = () => outer.abort(opts.signal!.reason);
  opts.signal?.addEventListener('abort', onOuterAbort, { once: true });
  const signal = outer.signal;
  const agent = new http.Agent({ keepAlive: true, maxSockets: workers });
  const authorization = authHeaders(opts.token);
  let retries = 0;
  let sendfileBytes = 0;

  const request = (
    method: 'GET' | 'POST',
    op: string,
    query: Record<string, string | number>,
    body?: Buffer | FileRange,
  ): Promise<string> => {
    const qs = new URLSearchParams(Object.entries(query).map(([k, v]): [string, string] => [k, String(v)])).toString();
    const range = body !== undefined && !Buffer.isBuffer(body) ? body : undefined;
    const bytes = body?.length ?? 0;
    const timeoutMs = timeoutFor(bytes);
    return new Promise<string>((resolve, reject) => {
      signal.throwIfAborted();
      // one timer and one abort listener per request (cheaper than AbortSignal.any + AbortSignal.timeout per request)
      let timedOut = false;
      /** The body being sent with sendfile: cancelled whenever the request ends early. */
      let transfer: SendFileTransfer | undefined;
      const cleanup = () => {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
      };
      const req = http.request(
        {
          host,
          port,
          method,
          path: `/v1-ssync/${op}${qs ? '?' + qs : ''}`,
          agent,
          headers: body ? { ...authorization, 'Content-Type': 'application/octet-stream', 'Content-Length': bytes } : authorization,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            cleanup();
            const text = Buffer.concat(chunks).toString('utf8');
            if (res.statusCode !== 200) {
              // a refusal may come before the whole body was sent: stop sending it (a 200 comes only after the whole
              // body, and the connection is kept for the next request)
              transfer?.cancel();
              reject(new SsyncSendError(`${op} [${query.begin ?? ''}, ${query.end ?? ''}) failed: HTTP ${res.statusCode}: ${text.trim()}`, res.statusCode));
            } else resolve(text);
          });
          res.on('error', (err) => {
            cleanup();
            reject(timedOut ? new SsyncSendError(`${op} timed out after ${timeoutMs} ms`) : err);
          });
        },
      );
      const timer = setTimeout(() => {
        timedOut = true;
        transfer?.cancel();
        req.destroy(new SsyncSendError(`${op} timed out after ${timeoutMs} ms`));
      }, timeoutMs);
      const onAbort = () => {
        transfer?.cancel();
        req.destroy(signal.reason as Error);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      req.on('error', (err) => {
        cleanup();
        transfer?.cancel();
        reject(timedOut ? new SsyncSendError(`${op} timed out after ${timeoutMs} ms`) : err);
      });
      if (!range) {
        req.end(body);
        return;
      }
      // The head goes out through the socket; then the kernel sends the body from the page cache (sendfile), and the
      // request ends with no bytes of its own. Node writes the head right after the 'socket' event: an empty write
      // queued after it calls back once the head is in the kernel.
      req.flushHeaders();
      req.once('socket', (sock: net.Socket) => {
        process.nextTick(() => {
          sock.write(EMPTY, (err) => {
            if (err || req.destroyed) return; // the request reports the failure
            const fd = socketFd(sock);
            if (fd === undefined) {
              // this runtime does not expose socket descriptors: this attempt fails, the retry reads the data
              useSendfile = false;
              req.destroy(new SsyncSendError(`${op}: cannot use sendfile here (no socket descriptor)`));
              return;
            }
            try {
              transfer = sendFileToSocket(fd, range.fd, range.offset, range.length);
            } catch (e) {
              useSendfile = false;
              req.destroy(e as Error);
              return;
            }
            transfer.done.then(
              () => {
                transfer = undefined;
                sendfileBytes += range.length;
                req.end();
              },
              (e: unknown) => {
                transfer = undefined;
                req.destroy(new SsyncSendError(`${op} [${range.offset}, ${range.offset + range.length}) failed: ${(e as Error).message}`));
              },
            );
          });
        });
      });
    });
  };

  /** `POST sha512Chain`: true when accepted; false on 404 (a Longhorn receiver, or ours refusing chains). */
  const offerChain = async (chain: Sha512Chain): Promise<boolean> => {
    try {
      await withRetries(() => request('POST', 'sha512Chain', {}, encodeChain(chain)));
      return true;
    } catch (err) {
      // 404 (no such route: Longhorn), 405 / 501 (a router that knows the path but not the method): no chain support
      if (err instanceof SsyncSendError && (err.status === 404 || err.status === 405 || err.status === 501)) return false;
      throw err;
    }
  };

  const withRetries = async <T>(what: () => Promise<T>): Promise<T> => {
    for (let attempt = 1; ; attempt++) {
      signal.throwIfAborted();
      try {
        return await what();
      } catch (err) {
        // a 4xx answer is the same on every attempt (a refused request, an unknown route)
        const refused = err instanceof SsyncSendError && err.status !== undefined && err.status >= 400 && err.status < 500;
        if (signal.aborted || attempt >= attempts || refused) throw err;
        retries++;
        await delay(200 * attempt, signal);
      }
    }
  };

  try {
    const forward = opts.forward;
    if (forward && !opts.chain) throw new SsyncSendError(`cannot forward ${opts.path}: no SHA-512 chain to verify its segments against`);
    const size = forward ? forward.size : (await fsp.stat(opts.path)).size;
    // open, retried while the receiver is not listening yet
    const openDeadline = Date.now() + openTimeoutMs;
    let openAnswer: string;
    for (;;) {
      try {
        openAnswer = await request('GET', 'open', { begin: 0, end: size, directIO: 'false' });
        break;
      } catch (err) {
        signal.throwIfAborted();
        if (Date.now() >= openDeadline || err instanceof SsyncSendError) throw err;
        await delay(1000, signal);
      }
    }
    const remoteExists = openAnswer.trim() === 'true';
    let chainAccepted = false;
    if (opts.chain) {
      if (opts.chain.size !== size) {
        throw new SsyncSendError(`the SHA-512 chain is for ${opts.chain.size} bytes but ${opts.path} has ${size}`);
      }
      chainAccepted = await offerChain(opts.chain);
    }
    // a receiver that took the chain is ours: with sendfile a larger body costs no memory on either side (the receiver
    // reads it segment by segment), and a quarter of the requests cost a quarter of the per-request work
    const chunkSize = opts.chunkSize ?? (chainAccepted && useSendfile && !remoteExists ? SSYNC_CHAIN_CHUNK_SIZE : SSYNC_CHUNK_SIZE);
    let nextTask: () => Promise<Task | undefined>;
    let largest: number;
    let taskCount: number;
    if (forward && opts.chain) {
      // one task per segment, in file order, each once the segment is final in the file being received
      const { segmentSize } = opts.chain;
      const segments = opts.chain.states.length;
      let nextSegment = 0;
      // the pieces of a segment that is partly holes, handed out before the next segment
      const pieces: Task[] = [];
      nextTask = async () => {
        const piece = pieces.shift();
        if (piece) return piece;
        if (nextSegment >= segments) return undefined;
        const i = nextSegment++;
        const kind = await untilAborted(forward.segmentFinal(i), signal);
        const begin = i * segmentSize;
        const end = Math.min(size, (i + 1) * segmentSize);
        const holes = kind === 'data' ? (forward.holesIn?.(begin, end) ?? []) : [];
        if (holes.length === 0) return { kind, begin, end };
        let at = begin;
        for (const [hs, he] of holes) {
          if (hs > at) pieces.push({ kind: 'data', begin: at, end: hs });
          pieces.push({ kind: 'hole', begin: hs, end: he });
          at = he;
        }
        if (at < end) pieces.push({ kind: 'data', begin: at, end });
        return pieces.shift();
      };
      largest = segmentSize;
      taskCount = segments;
    } else {
      const layout = await opts.layout(opts.path);
      const tasks =
        chainAccepted && opts.chain
          ? planBySegments(layout.data, layout.holes, size, opts.chain.segmentSize, chunkSize)
          : planByExtents(layout.data, layout.holes, chunkSize);
      let next = 0;
      nextTask = () => Promise.resolve(tasks[next++]);
      largest = tasks.reduce((n, t) => (t.kind === 'data' ? Math.max(n, t.end - t.begin) : n), 0);
      taskCount = tasks.length;
    }

    const fh = forward ? forward.file : await fsp.open(opts.path, 'r');
    let dataBytes = 0;
    let holeBytes = 0;
    try {
      const worker = async () => {
        let buf: Buffer | undefined;
        /** Reads [begin, begin + len) into this worker's buffer. */
        const read = async (begin: number, len: number): Promise<Buffer> => {
          buf ??= Buffer.allocUnsafe(Math.max(1, largest));
          let got = 0;
          while (got < len) {
            const { bytesRead } = await fh.read(buf, got, len - got, begin + got);
            if (bytesRead === 0) throw new SsyncSendError(`${opts.path} shrank while sending (at ${begin + got})`);
            got += bytesRead;
          }
          return buf.subarray(0, len);
        };
        for (;;) {
          signal.throwIfAborted();
          const t = await nextTask();
          if (!t) break;
          signal.throwIfAborted();
          if (t.kind === 'hole') {
            await withRetries(() => request('POST', 'sendHole', { begin: t.begin, end: t.end }));
            holeBytes += t.end - t.begin;
            continue;
          }
          const len = t.end - t.begin;
          if (useSendfile && !remoteExists) {
            // from the page cache to the socket; an attempt after sendfile turned out unusable reads the data
            await withRetries(async () =>
              request('POST', 'writeData', { begin: t.begin, end: t.end }, useSendfile ? { fd: fh.fd, offset: t.begin, length: len } : await read(t.begin, len)),
            );
            dataBytes += len;
            opts.onProgress?.(dataBytes);
            continue;
          }
          const body = await read(t.begin, len);
          if (remoteExists) {
            const remote = await withRetries(() => request('GET', 'getChecksum', { begin: t.begin, end: t.end }));
            const parsed: unknown = JSON.parse(remote || 'null');
            if (typeof parsed === 'string' && parsed === createHash('sha512').update(body).digest('base64')) {
              dataBytes += len;
              opts.onProgress?.(dataBytes);
              continue;
            }
          }
          await withRetries(() => request('POST', 'writeData', { begin: t.begin, end: t.end }, body));
          dataBytes += len;
          opts.onProgress?.(dataBytes);
        }
      };
      const running = Array.from({ length: Math.min(workers, Math.max(1, taskCount)) }, () =>
        worker().catch((err: unknown) => {
          outer.abort(err);
          throw err;
        }),
      );
      const results = await Promise.allSettled(running);
      const failures = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected').map((r) => r.reason as unknown);
      if (failures.length > 0) {
        if (opts.signal?.aborted) throw opts.signal.reason;
        // the receiver's own answer says more than a connection it closed afterwards
        const answered = failures.find((e) => e instanceof SsyncSendError && e.status !== undefined);
        throw answered ?? signal.reason ?? failures[0];
      }
    } finally {
      if (!forward) await fh.close();
    }
    await withRetries(() => request('POST', 'close', {}));
    return { size, dataBytes, holeBytes, retries, chainAccepted, sendfileBytes };
  } finally {
    opts.signal?.removeEventListener('abort', onOuterAbort);
    agent.destroy();
  }
}
