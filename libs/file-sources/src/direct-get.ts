import { connect, isIP, type LookupFunction, type Socket } from 'node:net';
import type { IncomingHttpHeaders } from 'node:http';
import type { ImageSink } from './image-sink.js';
import type { SourceHostPolicy } from './ip-policy.js';
import { guardedLookup, matchesNoProxy } from './origin-rules.js';
import { SourceError } from './errors.js';

/**
 * A plain-HTTP GET whose body the socket reads straight into the image sink's slabs: no HTTP client streams, no
 * buffer per read, no copy between the socket and the hash and the disk. It serves the common case only, a
 * `200` (or the `206` of a resume) with a Content-Length and no transfer or content coding, on `http:` without a
 * proxy. Anything else (a redirect, an error status, chunked encoding, a compressed body, TLS, a proxy, a URL with
 * credentials) is left to the HTTP client: the caller closes this response and asks again through it.
 */

export interface DirectGetOptions {
  policy: SourceHostPolicy;
  /** Request headers, lower-case names (User-Agent and the configured origin headers). */
  headers: Record<string, string>;
  /** The configured origin headers among `headers` (lower-case names): not sent after a redirect to another origin. */
  configuredHeaders?: Record<string, string>;
  connectTimeoutMs: number;
  proxy?: { http?: string; noProxy?: string };
}

/** Most bytes of a response head; a longer one goes to the HTTP client. */
const MAX_HEAD_BYTES = 64 << 10;
/** Bytes read at once when no slab region is at hand (after a pause). */
const SCRATCH_BYTES = 64 << 10;

/** Whether `url` may be fetched directly under `o` (the caller still falls back on what the answer shows). */
export function directGetEligible(url: URL, o: DirectGetOptions | undefined): o is DirectGetOptions {
  if (!o || url.protocol !== 'http:' || url.username !== '' || url.password !== '') return false;
  const host = url.hostname.replace(/^\[|\]$/g, '');
  return !(o.proxy?.http && !matchesNoProxy(host, o.proxy.noProxy));
}

export class DirectGetError extends Error {
  override readonly name = 'DirectGetError';
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message);
  }
}

/** What a direct body is read into: an {@link ImageSink}. */
export type DirectSink = Pick<ImageSink, 'readRegion' | 'commitRead' | 'hasRoom' | 'whenRoom' | 'write'>;

/** How a direct body reached the sink. */
export interface DirectBodyStats {
  /** Bytes the socket read straight into the sink's regions. */
  directBytes: number;
  /** Bytes read into another buffer first and copied (after the head, and once after each pause). */
  copiedBytes: number;
  /** Times reading stopped because every slab of the sink was in flight. */
  pauses: number;
}

interface Pump {
  sink: DirectSink;
  remaining: number;
  onBytes: (n: number, data: Buffer) => void;
  settle: (e?: Error) => void;
}

/** A response whose head was read; its body is read by {@link pumpInto} or dropped by {@link close}. */
export class DirectResponse {
  #phase: 'head' | 'body' | 'stream' | 'done' = 'head';
  #stream: { queue: Buffer[]; remaining: number; wake: (() => void) | undefined; paused: boolean } | undefined;
  #head: Buffer = Buffer.allocUnsafe(MAX_HEAD_BYTES);
  #headFill = 0;
  #scratch: Buffer | undefined;
  #region: Buffer | undefined;
  #pending: Buffer | undefined;
  status = 0;
  headers: IncomingHttpHeaders = {};
  /** Body bytes already read with the head (at least the first 6, or the whole body when shorter). */
  leftover: Buffer = Buffer.alloc(0);
  readonly stats: DirectBodyStats = { directBytes: 0, copiedBytes: 0, pauses: 0 };
  contentLength = -1;
  #onHead: ((e?: Error) => void) | undefined;
  #pump: Pump | undefined;
  #ended = false;
  #error: Error | undefined;

  #socket!: Socket;

  private constructor() {}

  /** Connects, sends the GET and reads the head. Throws on a connection failure (SSRF refusals included). */
  static async open(url: URL, extraHeaders: Record<string, string>, o: DirectGetOptions, signal: AbortSignal): Promise<DirectResponse> {
    const host = url.hostname.replace(/^\[|\]$/g, '');
    if (isIP(host)) o.policy.check(host, host); // IP literals never reach `lookup`
    const headers = { ...o.headers, ...extraHeaders, host: url.host, connection: 'close' };
    let request = `GET ${url.pathname}${url.search} HTTP/1.1\r\n`;
    for (const [k, v] of Object.entries(headers)) {
      if (/[\r\n]/.test(k) || /[\r\n]/.test(v)) throw new SourceError(`request header ${k} has a line break`);
      request += `${k}: ${v}\r\n`;
    }
    request += '\r\n';
    const r = new DirectResponse();
    const socket = connect({
      host,
      port: Number(url.port || 80),
      lookup: guardedLookup(o.policy) as unknown as LookupFunction,
      onread: {
        buffer: () => r.#nextBuffer(),
        callback: (n: number, buf: Uint8Array) => r.#onRead(n, buf as Buffer),
      },
    });
    r.#socket = socket;
    const self = r;
    return new Promise<DirectResponse>((resolve, reject) => {
      const timer = setTimeout(() => socket.destroy(new DirectGetError(`no response head from ${url.origin} in ${o.connectTimeoutMs / 1000} s`, 'ETIMEDOUT')), o.connectTimeoutMs);
      const onAbort = (): void => void socket.destroy(signal.reason instanceof Error ? signal.reason : new Error(String(signal.reason)));
      signal.addEventListener('abort', onAbort, { once: true });
      self.#onHead = (e) => {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        self.#onHead = undefined;
        if (e) reject(e);
        else resolve(self);
      };
      socket.once('connect', () => socket.write(request));
      socket.on('error', (e) => self.#fail(e));
      socket.on('end', () => {
        self.#ended = true;
        self.#finishHeadOrBody();
      });
      socket.on('close', () => {
        self.#ended = true;
        self.#finishHeadOrBody();
      });
      if (signal.aborted) onAbort();
    });
  }

  /** Whether the body can be read directly: 200/206 with a Content-Length and no transfer or content coding. */
  get direct(): boolean {
    const te = this.headers['transfer-encoding'];
    const ce = this.headers['content-encoding'];
    return (this.status === 200 || this.status === 206) && this.contentLength >= 0 && te === undefined && (ce === undefined || ce === 'identity');
  }

  /** Drops the connection (the body is not wanted). */
  close(): void {
    this.#phase = 'done';
    this.#socket.destroy();
  }

  /**
   * Reads the rest of the body into `sink` (the leftover bytes first), calling `onBytes` with each piece as it is
   * accepted. Resolves when Content-Length bytes were taken; rejects when the connection fails or ends early (the
   * error says after how many bytes), when the sink refuses bytes, or when `signal` aborts.
   */
  async pumpInto(sink: DirectSink, onBytes: (n: number, data: Buffer) => void, signal: AbortSignal): Promise<void> {
    if (this.#phase !== 'head') throw new Error('the body of this response was already read or dropped');
    const first = this.leftover.subarray(0, this.contentLength); // bytes past the Content-Length are not the body's
    const remaining = this.contentLength - first.length;
    this.leftover = Buffer.alloc(0);
    if (first.length > 0) {
      await sink.write(first);
      this.stats.copiedBytes += first.length;
      onBytes(first.length, first);
    }
    if (remaining === 0) {
      this.close();
      return;
    }
    await new Promise<void>((resolve, reject) => {
      const onAbort = (): void => void this.#socket.destroy(signal.reason instanceof Error ? signal.reason : new Error(String(signal.reason)));
      signal.addEventListener('abort', onAbort, { once: true });
      this.#pump = {
        sink,
        remaining,
        onBytes,
        settle: (e) => {
          signal.removeEventListener('abort', onAbort);
          this.#pump = undefined;
          this.#phase = 'done';
          this.#socket.destroy();
          if (e) reject(e);
          else resolve();
        },
      };
      this.#phase = 'body';
      this.#head = Buffer.alloc(0);
      if (signal.aborted) return onAbort();
      if (this.#error) return this.#pump.settle(this.#error);
      if (this.#ended) return this.#finishHeadOrBody();
      this.#region = undefined; // the next read gets a slab region
      this.#socket.resume();
    });
  }

  /**
   * The rest of the body as chunks (the leftover bytes first), for a body that is not read into a sink directly
   * (a compressed one goes through the decompressor). Reads stop while 4 chunks wait.
   */
  async *chunks(): AsyncGenerator<Buffer> {
    if (this.#phase !== 'head') throw new Error('the body of this response was already read or dropped');
    const first = Buffer.from(this.leftover.subarray(0, this.contentLength)); // bytes past the Content-Length are not the body's
    this.leftover = Buffer.alloc(0);
    const st = { queue: [] as Buffer[], remaining: this.contentLength - first.length, wake: undefined as (() => void) | undefined, paused: true };
    this.#stream = st;
    this.#phase = 'stream';
    this.#head = Buffer.alloc(0);
    try {
      if (first.length > 0) yield first;
      for (;;) {
        const next = st.queue.shift();
        if (next) {
          yield next;
          continue;
        }
        if (st.remaining === 0) return;
        if (this.#error) throw this.#error;
        if (this.#ended) throw new DirectGetError(`connection closed after ${this.contentLength - st.remaining} of ${this.contentLength} bytes`, 'ECONNRESET');
        const woken = new Promise<void>((resolve) => (st.wake = resolve));
        if (st.paused) {
          st.paused = false;
          this.#socket.resume();
        }
        await woken;
      }
    } finally {
      this.close();
    }
  }

  #nextBuffer(): Buffer {
    if (this.#phase === 'head' && this.#headFill < this.#head.length) return this.#head.subarray(this.#headFill);
    const pump = this.#pump;
    // While bytes wait to be copied, the next read must not land in the region they will take.
    const region = pump && !this.#pending ? pump.sink.readRegion(pump.remaining) : undefined;
    this.#region = region;
    if (region) return region;
    this.#scratch ??= Buffer.allocUnsafe(SCRATCH_BYTES);
    return this.#scratch;
  }

  #onRead(n: number, buf: Buffer): boolean {
    try {
      if (this.#phase === 'head') return this.#onHeadBytes(n);
      const st = this.#stream;
      if (this.#phase === 'stream' && st) {
        const take = Math.min(n, st.remaining);
        st.remaining -= take;
        if (take > 0) st.queue.push(Buffer.from(buf.subarray(0, take)));
        st.wake?.();
        st.paused = st.queue.length >= 4 && st.remaining > 0;
        return !st.paused;
      }
      const pump = this.#pump;
      if (this.#phase !== 'body' || !pump) return false;
      if (buf === this.#region) {
        const taken = Math.min(n, pump.remaining);
        pump.sink.commitRead(taken);
        this.#region = undefined;
        this.stats.directBytes += taken;
        this.#took(pump, taken, buf);
        if (this.#pump && !pump.sink.hasRoom) {
          this.stats.pauses++;
          void pump.sink.whenRoom().then(
            () => this.#pump === pump && this.#socket.resume(),
            (e: unknown) => this.#pump === pump && pump.settle(e as Error),
          );
          return false;
        }
        return true;
      }
      // Read into another buffer (no region was at hand): copy it into the sink's regions; what does not fit waits,
      // with the socket paused, until a slab is free.
      // (The socket reads into `buf` again only after every byte of it was copied.)
      return this.#copyIn(pump, buf.subarray(0, Math.min(n, pump.remaining)));
    } catch (e) {
      if (this.#pump) this.#pump.settle(e as Error);
      else this.#fail(e as Error);
      return false;
    }
  }

  /** Copies `data` into the sink (synchronously as far as slabs are free); returns false when the socket must pause. */
  #copyIn(pump: Pump, data: Buffer): boolean {
    let off = 0;
    while (off < data.length && this.#pump === pump) {
      const region = pump.sink.readRegion(data.length - off);
      if (!region) break;
      const k = data.copy(region, 0, off);
      pump.sink.commitRead(k);
      this.stats.copiedBytes += k;
      off += k;
      this.#took(pump, k, region);
    }
    if (off === data.length || this.#pump !== pump) {
      this.#pending = undefined;
      return true;
    }
    const rest = data.subarray(off);
    this.#pending = rest;
    this.stats.pauses++;
    void pump.sink.whenRoom().then(
      () => {
        if (this.#pump !== pump || !this.#copyIn(pump, rest) || this.#pump !== pump) return;
        if (this.#ended || this.#error) this.#finishHeadOrBody();
        else this.#socket.resume();
      },
      (e: unknown) => {
        this.#pending = undefined;
        if (this.#pump === pump) pump.settle(e as Error);
      },
    );
    return false;
  }

  #took(pump: Pump, n: number, data: Buffer): void {
    pump.remaining -= n;
    pump.onBytes(n, data.subarray(0, n));
    if (pump.remaining === 0) pump.settle();
  }

  #onHeadBytes(n: number): boolean {
    this.#headFill += n;
    if (this.status === 0) {
      const end = this.#head.subarray(0, this.#headFill).indexOf('\r\n\r\n');
      if (end < 0) {
        if (this.#headFill >= this.#head.length) this.#fail(new DirectGetError(`response head longer than ${MAX_HEAD_BYTES} bytes`));
        return true;
      }
      this.#parseHead(this.#head.subarray(0, end).toString('latin1'));
      this.leftover = this.#head.subarray(end + 4, this.#headFill);
      this.#bodyStart = end + 4;
    } else {
      this.leftover = this.#head.subarray(this.#bodyStart, this.#headFill);
    }
    // The first bytes of the body tell whether it is compressed: wait for 6 of them (or the whole of a shorter body).
    const want = Math.min(6, this.contentLength >= 0 ? this.contentLength : 6);
    if (!this.direct || this.leftover.length >= want || this.#headFill >= this.#head.length) {
      this.#onHead?.();
      return false; // paused until the body is wanted
    }
    return true;
  }

  #bodyStart = 0;

  #parseHead(text: string): void {
    const lines = text.split('\r\n');
    const m = /^HTTP\/1\.[01] (\d{3})(?: .*)?$/.exec(lines[0] ?? '');
    if (!m) throw new DirectGetError(`not an HTTP/1.x response: ${JSON.stringify((lines[0] ?? '').slice(0, 80))}`);
    this.status = Number(m[1]);
    const headers: Record<string, string> = {};
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':');
      if (colon <= 0) throw new DirectGetError(`malformed response header line ${JSON.stringify(line.slice(0, 80))}`);
      const name = line.slice(0, colon).trim().toLowerCase();
      const value = line.slice(colon + 1).trim();
      headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
    }
    this.headers = headers;
    const cl = headers['content-length'];
    const n = cl !== undefined && /^\d+$/.test(cl) ? Number(cl) : NaN;
    this.contentLength = Number.isSafeInteger(n) ? n : -1;
  }

  #fail(e: Error): void {
    this.#error ??= e;
    this.#stream?.wake?.();
    if (this.#onHead) this.#onHead(e);
    else if (this.#pump) this.#pump.settle(e);
  }

  #finishHeadOrBody(): void {
    this.#stream?.wake?.();
    if (this.#onHead) {
      if (this.status === 0) this.#onHead(this.#error ?? new DirectGetError('the connection closed before a response head', 'ECONNRESET'));
      else this.#onHead(); // a body shorter than 6 bytes that ended: the caller sees its length
      return;
    }
    const pump = this.#pump;
    if (pump && !this.#pending && pump.remaining > 0 && (this.#ended || this.#error)) {
      pump.settle(this.#error ?? new DirectGetError(`connection closed after ${this.contentLength - pump.remaining} of ${this.contentLength} bytes`, 'ECONNRESET'));
    }
  }
}
