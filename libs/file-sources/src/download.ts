import type { IncomingHttpHeaders } from 'node:http';
import type { Got } from 'got';
import { checksumCoversStoredFile, parseExpectedChecksum, SourceChecksum } from './checksum.js';
import type { DownloadRequest, ProgressSink, SourceResult } from './contract.js';
import { COMPRESSION_MAGIC_BYTES, decompress, detectCompression, peek, type Compression } from './decompress.js';
import { SourceCancelledError, SourceError, StallError, throwIfAborted } from './errors.js';
import { ImageSink } from './image-sink.js';
import { DirectResponse, directGetEligible, type DirectGetOptions } from './direct-get.js';
import { SourceHostRefusedError } from './ip-policy.js';
import { UnsafeImageError } from './qcow2.js';
import { imageSizeLimit, SizeLimitError, type SizeLimit, type SizeLimitPolicy } from './size-limit.js';

export interface RetryPolicy {
  /** Consecutive failed attempts (without any new byte) allowed before the download fails. */
  limit: number;
  /** First backoff delay; doubles per consecutive failure. */
  baseDelayMs: number;
  maxDelayMs: number;
}

export interface ParallelPolicy {
  /** Concurrent ranged requests; 1 disables parallel download. */
  connections: number;
  /** Bytes per ranged request. */
  segmentBytes: number;
  /** Smallest Content-Length for which parallel download is used. */
  minSize: number;
}

export interface DownloadSettings {
  /**
   * The HTTP client (got), for what the direct path does not serve; a loader, so that a process whose downloads all
   * go the direct way never loads got.
   */
  client: () => Promise<Got>;
  stallTimeoutMs: number;
  retry: RetryPolicy;
  parallel: ParallelPolicy;
  /** Bounds the stored (decompressed) image; default: the destination disk's free space, at most 2 TiB. */
  sizeLimit?: SizeLimitPolicy;
  /** Plain-HTTP bodies are read straight into the sink (`direct-get.ts`); without it every request goes through `client`. */
  direct?: DirectGetOptions;
}

export const DEFAULT_RETRY: RetryPolicy = { limit: 5, baseDelayMs: 1000, maxDelayMs: 30_000 };
export const DEFAULT_PARALLEL: ParallelPolicy = { connections: 1, segmentBytes: 16 << 20, minSize: 64 << 20 };

/** An attempt failed in a way another attempt may fix (dropped connection, 5xx, stall). */
class TransientError extends Error {
  override readonly name = 'TransientError';
  constructor(
    message: string,
    /** The HTTP status the origin answered, when that was the failure. */
    readonly httpStatus?: number,
  ) {
    super(message);
  }
}

/** What a failed download attempt tells an operator while the next one waits. */
export function retryNote(err: Error, attempt: number, attempts: number, nextAt: Date): string {
  const what = err instanceof TransientError && err.httpStatus ? `origin answered HTTP ${err.httpStatus}` : err.message;
  return `${what}; attempt ${attempt} of ${attempts} failed, next attempt at ${nextAt.toISOString()}${err instanceof TransientError && err.httpStatus ? `: ${err.message}` : ''}`;
}

const NETWORK_CODES = new Set([
  'ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'ETIMEDOUT', 'EAI_AGAIN', 'ENETUNREACH', 'EHOSTUNREACH',
  'ERR_STREAM_PREMATURE_CLOSE', 'ECONNABORTED', 'ERR_HTTP2_STREAM_ERROR',
]);

function findCause<T>(e: unknown, type: abstract new (...a: never[]) => T): T | undefined {
  let cur: unknown = e;
  for (let i = 0; i < 5 && cur; i++) {
    if (cur instanceof type) return cur;
    cur = (cur as { cause?: unknown }).cause;
  }
  return undefined;
}

function isTransient(e: unknown): boolean {
  if (e instanceof TransientError || e instanceof StallError) return true;
  if (findCause(e, SourceHostRefusedError) || findCause(e, UnsafeImageError)) return false;
  const err = e as { name?: string; code?: string };
  if (err.name === 'ReadError' || err.name === 'TimeoutError') return true;
  return typeof err.code === 'string' && NETWORK_CODES.has(err.code);
}

function normalise(e: unknown): Error {
  return findCause(e, SourceHostRefusedError) ?? (e instanceof Error ? e : new Error(String(e)));
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(t);
      reject(new SourceCancelledError(signal.reason));
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/** Progress reporting at most every 100 ms (got delivers one chunk per 64 KiB), plus the final value. */
export class ThrottledProgress {
  #last = 0;
  #value = 0;
  constructor(private readonly sink: ProgressSink) {}
  update(v: number): void {
    this.#value = v;
    const now = Date.now();
    if (now - this.#last >= 100) {
      this.#last = now;
      this.sink.updateProgress(v);
    }
  }
  flush(): void {
    this.sink.updateProgress(this.#value);
  }
}

interface OpenedResponse {
  status: number;
  headers: IncomingHttpHeaders;
  body: AsyncIterable<Buffer>;
}

async function openGet(client: Got, url: string, headers: Record<string, string>, signal: AbortSignal): Promise<OpenedResponse> {
  const stream = client.stream(url, { headers, signal });
  return new Promise((resolve, reject) => {
    stream.once('error', reject);
    stream.once('response', (res: { statusCode: number; headers: IncomingHttpHeaders }) => {
      stream.off('error', reject);
      resolve({ status: res.statusCode, headers: res.headers, body: stream as AsyncIterable<Buffer> });
    });
  }).catch((e: unknown) => {
    stream.destroy();
    throw e;
  }) as Promise<OpenedResponse>;
}

/** The body of an OpenedResponse whose bytes a direct response reads instead. */
const NO_BODY: AsyncIterable<Buffer> = { async *[Symbol.asyncIterator]() {} };

function statusError(url: string, status: number, expected = 200): Error {
  const msg = `expected status code ${expected} from ${url}, got ${status}`;
  return status >= 500 || status === 408 || status === 429 ? new TransientError(msg, status) : new SourceError(msg);
}

function contentLength(h: IncomingHttpHeaders): number {
  const v = h['content-length'];
  const n = v === undefined ? NaN : Number(v);
  return Number.isSafeInteger(n) && n >= 0 ? n : -1;
}

function contentRangeStart(h: IncomingHttpHeaders): number | undefined {
  const m = /^bytes (\d+)-\d+\/(\d+|\*)$/.exec(h['content-range'] ?? '');
  return m ? Number(m[1]) : undefined;
}

/** Resets a timer on every chunk; aborts the attempt when no chunk arrived for `ms`. */
function stallWatch(ms: number, ctl: AbortController): { touch(): void; stop(): void } {
  const t = setTimeout(() => ctl.abort(new StallError(ms)), ms);
  return { touch: () => void t.refresh(), stop: () => clearTimeout(t) };
}

export function linkedController(parent: AbortSignal): { ctl: AbortController; unlink(): void } {
  const ctl = new AbortController();
  const onAbort = (): void => ctl.abort(parent.reason);
  if (parent.aborted) ctl.abort(parent.reason);
  else parent.addEventListener('abort', onAbort, { once: true });
  return { ctl, unlink: () => parent.removeEventListener('abort', onAbort) };
}

/**
 * Downloads `req.url` into `req.dest`: bytes are decompressed when gzip/xz/zstd magic is found, hashed and written
 * sparsely in one pass. A dropped connection is resumed with a Range request from the bytes already written (when
 * the server supports ranges and the stream is not compressed; otherwise it restarts from 0), with exponential
 * backoff and a retry limit. HEAD is only used (and may fail) to decide on a parallel ranged download.
 */
export async function downloadToFile(req: DownloadRequest, s: DownloadSettings): Promise<SourceResult> {
  const expected = parseExpectedChecksum(req.expectedChecksum);
  let parsed: URL;
  try {
    parsed = new URL(req.url);
  } catch {
    throw new SourceError(`invalid download URL "${req.url}"`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw new SourceError(`invalid download URL "${req.url}": only http and https are supported`);
  }
  throwIfAborted(req.signal);
  const limit = await imageSizeLimit(req.dest, s.sizeLimit);
  const sink = await ImageSink.create(req.dest, { expected: checksumCoversStoredFile(expected) ? expected : undefined, limit });
  const sourceChecksum = new SourceChecksum(expected);
  const progress = new ThrottledProgress(req.sink);
  try {
    const parallel = s.parallel.connections > 1 ? await probeRanges(s, req.url, req.signal) : undefined;
    if (parallel) {
      req.sink.setSize(parallel.size);
      const { ctl, unlink } = linkedController(req.signal);
      try {
        let sourceBytes = 0;
        const body = countBytes(rangedBody(s, req.url, parallel.size, ctl.signal, req.onRetry), (n, c) => {
          sourceBytes = n;
          sourceChecksum.update(c);
        });
        const { head, all } = await peek(body, COMPRESSION_MAGIC_BYTES);
        const compression = detectCompression(head);
        if (!compression) refuseDeclaredSize(limit, parallel.size);
        const bytes = compression ? decompress(compression, all, ctl.signal) : all;
        await pumpOnce(bytes, sink, s, req.signal, () => progress.update(sourceBytes), ctl);
      } finally {
        unlink();
      }
    } else {
      await singleStream(req, s, sink, progress, sourceChecksum, limit);
    }
    progress.flush();
    throwIfAborted(req.signal);
    sourceChecksum.verify();
    const result = await sink.finish();
    return expected ? { ...result, expectedChecksumVerified: true } : result;
  } catch (e) {
    await sink.discard();
    if (req.signal.aborted) throw new SourceCancelledError(req.signal.reason);
    throw normalise(e);
  }
}

/** An uncompressed download stores what it transfers: a Content-Length past the limit is refused before any write. */
function refuseDeclaredSize(limit: SizeLimit, contentLength: number): void {
  if (contentLength > limit.bytes) throw SizeLimitError.declared(limit, 'the download (Content-Length)', contentLength);
}

async function probeRanges(s: DownloadSettings, url: string, signal: AbortSignal): Promise<{ size: number } | undefined> {
  try {
    const res = await (await s.client()).head(url, { signal });
    if (res.statusCode !== 200) return undefined; // e.g. a server that refuses HEAD (longhorn#7892): single stream
    const size = contentLength(res.headers);
    if (res.headers['accept-ranges'] !== 'bytes' || size < s.parallel.minSize) return undefined;
    return { size };
  } catch (e) {
    if (findCause(e, SourceHostRefusedError)) throw e;
    return undefined;
  }
}

/** Feeds one body into the sink with stall detection. Returns the number of source bytes consumed. */
export async function pumpOnce(
  body: AsyncIterable<Buffer>,
  sink: Pick<ImageSink, 'write'>,
  s: { stallTimeoutMs: number },
  signal: AbortSignal,
  onProgress: (consumed: number) => void,
  ctl?: AbortController,
): Promise<number> {
  const { ctl: own, unlink } = ctl ? { ctl, unlink: () => undefined } : linkedController(signal);
  const watch = stallWatch(s.stallTimeoutMs, own);
  let n = 0;
  try {
    for await (const chunk of body) {
      if (own.signal.aborted) break;
      n += chunk.length;
      await sink.write(chunk);
      watch.touch();
      onProgress(n);
    }
    if (own.signal.aborted) throw own.signal.reason;
    return n;
  } catch (e) {
    if (own.signal.reason instanceof StallError) throw own.signal.reason;
    throw e;
  } finally {
    watch.stop();
    unlink();
  }
}

async function singleStream(
  req: DownloadRequest,
  s: DownloadSettings,
  sink: ImageSink,
  progress: ThrottledProgress,
  sourceChecksum: SourceChecksum,
  limit: SizeLimit,
): Promise<void> {
  let failures = 0;
  let attempts = 0;
  let rangesSupported = false;
  let compression: Compression | undefined | null = null; // null = not known yet
  let sourceDone = 0; // source (possibly compressed) bytes consumed in the current run from byte 0
  let highWater = 0; // most source bytes ever reached: an attempt that gets further counts as progress
  let total = -1;
  for (;;) {
    attempts++;
    const resumeAt = compression === undefined && rangesSupported && sink.position > 0 ? sink.position : 0;
    if (resumeAt === 0 && (sink.position > 0 || sourceDone > 0)) {
      await sink.reset();
      sourceChecksum.reset();
    }
    sourceDone = resumeAt;
    const { ctl, unlink } = linkedController(req.signal);
    let direct: DirectResponse | undefined;
    try {
      const headers: Record<string, string> = resumeAt > 0 ? { range: `bytes=${resumeAt}-` } : {};
      const watch = stallWatch(s.stallTimeoutMs, ctl);
      let res: OpenedResponse;
      try {
        direct = await openDirect(req.url, headers, s.direct, ctl.signal);
        res = direct ? { status: direct.status, headers: direct.headers, body: NO_BODY } : await openGet(await s.client(), req.url, headers, ctl.signal);
      } finally {
        watch.stop();
      }
      let offset = resumeAt;
      if (resumeAt > 0) {
        if (res.status === 206 && contentRangeStart(res.headers) === resumeAt) {
          // resumed
        } else if (res.status === 200) {
          await sink.reset();
          sourceChecksum.reset();
          sourceDone = offset = 0;
        } else {
          throw statusError(req.url, res.status, 206);
        }
      } else if (res.status !== 200) {
        throw statusError(req.url, res.status);
      }
      if (offset === 0) {
        total = contentLength(res.headers);
        req.sink.setSize(total);
      }
      rangesSupported = res.headers['accept-ranges'] === 'bytes';
      // A direct body without compression is read straight into the sink; a compressed one goes through the
      // decompressor below like the HTTP client's.
      if (direct && (offset > 0 || !detectCompression(direct.leftover))) {
        if (offset === 0) {
          compression = undefined;
          refuseDeclaredSize(limit, total);
        }
        await pumpDirect(direct, sink, s.stallTimeoutMs, ctl, (n, c) => {
          sourceDone += n;
          sourceChecksum.update(c);
          progress.update(sourceDone);
        });
        return;
      }
      let body: AsyncIterable<Buffer> = countBytes(direct ? direct.chunks() : res.body, (n, c) => {
        sourceDone = offset + n;
        sourceChecksum.update(c);
      });
      if (offset === 0) {
        const { head, all } = await peek(body, COMPRESSION_MAGIC_BYTES);
        compression = detectCompression(head);
        if (!compression) refuseDeclaredSize(limit, total);
        body = compression ? decompress(compression, all, ctl.signal) : all;
      }
      await pumpOnce(body, sink, s, req.signal, () => progress.update(sourceDone), ctl);
      if (total >= 0 && sourceDone !== total) {
        throw new TransientError(`connection closed after ${sourceDone} of ${total} bytes`);
      }
      return;
    } catch (e) {
      direct?.close(); // not held open through the backoff
      if (req.signal.aborted) throw new SourceCancelledError(req.signal.reason);
      const err = ctl.signal.reason instanceof StallError ? ctl.signal.reason : e;
      if (!isTransient(err)) throw err;
      if (sourceDone > highWater) failures = 0;
      highWater = Math.max(highWater, sourceDone);
      failures++;
      if (failures > s.retry.limit) {
        throw new SourceError(
          `download from ${req.url} failed after ${attempts} attempts: ${(err as Error).message}`,
        );
      }
      const delay = Math.min(s.retry.maxDelayMs, s.retry.baseDelayMs * 2 ** (failures - 1));
      req.sink.note?.(retryNote(err as Error, attempts, attempts - failures + s.retry.limit + 1, new Date(Date.now() + delay)));
      req.onRetry?.({ attempt: failures, limit: s.retry.limit, error: (err as Error).message, retryInMs: delay });
      await sleep(delay, req.signal);
    } finally {
      direct?.close();
      unlink();
    }
  }
}

const REDIRECT_STATUSES = new Set([301, 302, 303, 307, 308]);
const MAX_REDIRECTS = 10;
/** Dropped on a redirect to another origin (as the HTTP client does), with the configured origin headers. */
const CREDENTIAL_HEADERS = ['authorization', 'cookie', 'proxy-authorization'];

/**
 * A GET through the direct path when it can serve this attempt: `http:` without a proxy, redirects followed (up to
 * 10; credentials and the configured origin headers dropped on a move to another origin, every target checked
 * against the SSRF policy). Returns the answer to use, or `undefined` when the HTTP client must take the attempt
 * over (a redirect to `https:` or through a proxy, or a 200/206 body without a Content-Length or with a transfer or
 * content coding): that answer is dropped, and the client starts again from `url`.
 */
async function openDirect(
  url: string,
  headers: Record<string, string>,
  o: DirectGetOptions | undefined,
  signal: AbortSignal,
): Promise<DirectResponse | undefined> {
  let at = new URL(url);
  if (!directGetEligible(at, o)) return undefined;
  let sent: DirectGetOptions = o;
  let extra = headers;
  for (let hop = 0; ; hop++) {
    const res = await DirectResponse.open(at, extra, sent, signal);
    const location = res.headers.location;
    if (REDIRECT_STATUSES.has(res.status) && location !== undefined && hop < MAX_REDIRECTS) {
      res.close();
      const next = new URL(location, at);
      if (next.origin !== at.origin) {
        const drop = new Set([...CREDENTIAL_HEADERS, ...Object.keys(o.configuredHeaders ?? {})]);
        sent = { ...sent, headers: Object.fromEntries(Object.entries(sent.headers).filter(([k]) => !drop.has(k))) };
        extra = Object.fromEntries(Object.entries(extra).filter(([k]) => !drop.has(k.toLowerCase())));
      }
      at = next;
      if (!directGetEligible(at, o)) return undefined;
      continue;
    }
    if ((res.status === 200 || res.status === 206) && !res.direct) {
      res.close();
      return undefined;
    }
    return res;
  }
}

/** Reads a direct response's body into the sink with stall detection (`ctl` aborts the attempt). */
async function pumpDirect(res: DirectResponse, sink: ImageSink, stallTimeoutMs: number, ctl: AbortController, onBytes: (n: number, data: Buffer) => void): Promise<void> {
  const watch = stallWatch(stallTimeoutMs, ctl);
  try {
    await res.pumpInto(
      sink,
      (n, data) => {
        watch.touch();
        onBytes(n, data);
      },
      ctl.signal,
    );
  } catch (e) {
    if (ctl.signal.reason instanceof StallError) throw ctl.signal.reason;
    throw e;
  } finally {
    watch.stop();
    res.close();
  }
}

async function* countBytes(body: AsyncIterable<Buffer>, onCount: (n: number, chunk: Buffer) => void): AsyncGenerator<Buffer> {
  let n = 0;
  for await (const chunk of body) {
    n += chunk.length;
    onCount(n, chunk);
    yield chunk;
  }
}

/** Fetches `[0,size)` with concurrent ranged requests and yields the bytes in order (bounded memory). */
async function* rangedBody(s: DownloadSettings, url: string, size: number, signal: AbortSignal, onRetry?: DownloadRequest['onRetry']): AsyncGenerator<Buffer> {
  const seg = s.parallel.segmentBytes;
  const count = Math.ceil(size / seg);
  const inflight = new Map<number, Promise<Buffer>>();
  const { ctl, unlink } = linkedController(signal);
  let next = 0;
  let completed = false;
  const launch = (): void => {
    while (next < count && inflight.size < s.parallel.connections) {
      const i = next++;
      const p = fetchSegment(s, url, i * seg, Math.min(size, (i + 1) * seg) - 1, ctl.signal, onRetry);
      p.catch(() => undefined); // awaited in order below; this only keeps a rejection from being unhandled meanwhile
      inflight.set(i, p);
    }
  };
  try {
    for (let i = 0; i < count; i++) {
      launch();
      const buf = await inflight.get(i)!;
      inflight.delete(i);
      yield buf;
    }
    completed = true;
  } finally {
    if (!completed) ctl.abort(new SourceCancelledError('parallel download stopped'));
    unlink();
  }
}

async function fetchSegment(s: DownloadSettings, url: string, start: number, end: number, signal: AbortSignal, onRetry?: DownloadRequest['onRetry']): Promise<Buffer> {
  let failures = 0;
  for (;;) {
    const { ctl, unlink } = linkedController(signal);
    try {
      const res = await openGet(await s.client(), url, { range: `bytes=${start}-${end}` }, ctl.signal);
      if (res.status !== 206 || contentRangeStart(res.headers) !== start) {
        for await (const _ of res.body) break;
        throw statusError(url, res.status, 206);
      }
      const buf = Buffer.allocUnsafe(end - start + 1);
      let at = 0;
      for await (const chunk of res.body) {
        if (at + chunk.length > buf.length) throw new SourceError(`server sent more than the requested range ${start}-${end}`);
        chunk.copy(buf, at);
        at += chunk.length;
      }
      if (at !== buf.length) throw new TransientError(`range ${start}-${end}: connection closed after ${at} bytes`);
      return buf;
    } catch (e) {
      if (signal.aborted || !isTransient(e)) throw e;
      if (++failures > s.retry.limit) throw new SourceError(`download of range ${start}-${end} from ${url} failed: ${(e as Error).message}`);
      const delay = Math.min(s.retry.maxDelayMs, s.retry.baseDelayMs * 2 ** (failures - 1));
      onRetry?.({ attempt: failures, limit: s.retry.limit, error: `range ${start}-${end}: ${(e as Error).message}`, retryInMs: delay });
      await sleep(delay, signal);
    } finally {
      unlink();
    }
  }
}
