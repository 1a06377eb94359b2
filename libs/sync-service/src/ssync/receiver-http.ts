import net from 'node:net';
import { STATUS_CODES } from 'node:http';

/**
 * The ssync receiver's HTTP/1.1 server. It reads request bodies straight into buffers the handler provides, so a
 * `writeData` body goes from the socket into the receive slab with no intermediate buffer per socket read: Node's HTTP
 * server hands out a fresh 64 KiB buffer per read and pushes it through the stream machinery, which cost the receiver
 * about three times the CPU of the copy itself and left tens of MB of freed socket buffers behind.
 *
 * Scope: what HTTP/1.1 clients of the ssync protocol send (Go's net/http client in Longhorn's sparse-tools, Node's
 * http client, curl). Requests on one connection are handled one after the other (pipelined requests wait their
 * turn); bodies have a Content-Length or are chunked; `Expect: 100-continue` is answered when the handler first reads
 * the body; responses always carry a Content-Length. Malformed requests get 400 (431 for an oversized head, 408 for a
 * head not complete within the header timeout, 501 for an unknown transfer coding, 505 for another HTTP version) and
 * the connection is closed. Request smuggling is refused: Content-Length with Transfer-Encoding, a repeated
 * Content-Length (even with equal values) or Host, and a Content-Length that is not a plain decimal of at most 15 digits.
 *
 * Reads use the socket's `onread` mode (a user buffer per read). An accepted socket gets that mode by moving its
 * handle into a new `net.Socket`; where this Node has no such handle (`zeroCopy: false`, or another runtime), the
 * server reads with 'data' events and copies, with the same behaviour.
 *
 * Its conservative twin, `NodeHttpReceiverServer` (receiver-node-http.ts), serves the same request API on Node's own
 * `http` module; `BIS_SSYNC_RECEIVER_SERVER=node-http` selects it (paths.ts). receiver-http.spec.ts runs every
 * conformance test against both.
 */

/** Bytes kept per connection for request heads, chunk framing and the first read after a pause. */
const SPILL_SIZE = 64 * 1024;
/** Longest accepted request head (request line and headers). */
const DEFAULT_MAX_HEAD_BYTES = 32 * 1024;
/** Longest accepted chunk-size line or trailer line of a chunked body. */
const MAX_CHUNK_LINE = 4096;
/** Time a client has to send a whole request head, from its connection or from the first byte of the head (60 s). */
const DEFAULT_HEADER_TIMEOUT_MS = 60_000;
/** How long a connection closed after an unread body keeps reading (and dropping) what the client still sends. */
const LINGER_MS = 5000;

/** A request the server could not parse or serve; answered with `status` and a closed connection. */
export class HttpProtocolError extends Error {
  override readonly name = 'HttpProtocolError';
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

export interface ReceiverHttpReply {
  /** Default 200. */
  status?: number;
  body?: string | Uint8Array;
  contentType?: string;
  /** Close the connection after this reply. */
  close?: boolean;
  /** Called once the reply has been handed to the socket. */
  onSent?: () => void;
}

export type ReceiverHttpHandler = (req: ReceiverHttpRequest) => Promise<ReceiverHttpReply>;

export interface ReceiverHttpServerOptions {
  /** Idle keep-alive connections, and requests whose head or body stalls, are closed after this long (240 s). */
  keepAliveTimeoutMs?: number;
  /** Largest request head (32 KiB). */
  maxHeadBytes?: number;
  /**
   * A request head must be complete this long after the connection opened (first request) or after its first byte
   * (later requests); otherwise the client gets 408 and the connection closes (60 s).
   */
  headerTimeoutMs?: number;
  /** Read bodies straight into the handler's buffers (default true); false reads with 'data' events and copies. */
  zeroCopy?: boolean;
}

type Phase = 'head' | 'handling' | 'lingering' | 'closed';
type ChunkState = 'size' | 'data' | 'data-crlf' | 'trailer' | 'done';

interface PendingRead {
  target: Uint8Array;
  filled: number;
  resolve: (n: number) => void;
  reject: (err: Error) => void;
}

/** One request as a handler sees it: its head, and its body read on demand into the handler's buffers. */
export interface ReceiverHttpRequest {
  readonly method: string;
  /** The request target as sent: path and query. */
  readonly target: string;
  readonly httpVersion: '1.0' | '1.1';
  /** Header values by lower-case name (repeated headers joined with ", "). */
  readonly headers: ReadonlyMap<string, string>;
  /** From Content-Length; undefined for a chunked body. */
  readonly contentLength: number | undefined;
  readonly keepAlive: boolean;
  readonly expectsContinue: boolean;
  readonly chunked: boolean;
  /** Whether the whole body has been read. */
  readonly complete: boolean;
  /** Body bytes not read yet, when known (Content-Length). */
  readonly bodyLeft: number | undefined;
  /**
   * Reads body bytes into `target` until it is full or the body ends, and resolves with how many were read (0 at the
   * end of the body). Rejects when the connection fails or closes first, or a chunked body is malformed.
   */
  readInto(target: Uint8Array): Promise<number>;
  /** Reads the rest of the body; rejects with a 413 HttpProtocolError beyond `limit` bytes. */
  readAll(limit: number): Promise<Buffer>;
}

/** What the ssync receiver needs of its HTTP server (`ReceiverHttpServer`, or Node's `http` in receiver-node-http.ts). */
export interface ReceiverServer {
  listen(port: number, host: string): Promise<void>;
  address(): net.AddressInfo;
  /** Stops accepting connections; idle connections close now, busy ones after their current reply. */
  close(): void;
  /** Closes every connection now (pending body reads reject). */
  closeAllConnections(): void;
  /** Resolves once the server stopped listening and every connection is closed. */
  readonly closed: Promise<void>;
}

/** One request of `ReceiverHttpServer`: its head, and its body read on demand. */
class OwnHttpRequest implements ReceiverHttpRequest {
  /** Body bytes not read yet (Content-Length bodies). */
  #left: number;
  #chunk: ChunkState = 'size';
  #chunkLeft = 0;
  #continueSent = false;
  readonly #connection: Connection;

  constructor(
    readonly method: string,
    /** The request target as sent: path and query. */
    readonly target: string,
    readonly httpVersion: '1.0' | '1.1',
    /** Header values by lower-case name (repeated headers joined with ", "). */
    readonly headers: ReadonlyMap<string, string>,
    /** From Content-Length; undefined for a chunked body. */
    readonly contentLength: number | undefined,
    readonly keepAlive: boolean,
    readonly expectsContinue: boolean,
    connection: Connection,
  ) {
    this.#connection = connection;
    this.#left = contentLength ?? 0;
  }

  get chunked(): boolean {
    return this.contentLength === undefined;
  }

  /** Whether the whole body has been read. */
  get complete(): boolean {
    return this.chunked ? this.#chunk === 'done' : this.#left === 0;
  }

  /** Body bytes not read yet, when known (Content-Length). */
  get bodyLeft(): number | undefined {
    return this.chunked ? undefined : this.#left;
  }

  /**
   * Reads body bytes into `target` until it is full or the body ends, and resolves with how many were read (0 at the
   * end of the body). Rejects when the connection fails or closes first, or a chunked body is malformed.
   */
  readInto(target: Uint8Array): Promise<number> {
    if (this.complete || target.length === 0) return Promise.resolve(0);
    this.#sendContinue();
    const want = this.chunked ? target.length : Math.min(target.length, this.#left);
    return this.#connection.read(this, target.subarray(0, want));
  }

  /** Reads the rest of the body; rejects with a 413 HttpProtocolError beyond `limit` bytes. */
  async readAll(limit: number): Promise<Buffer> {
    if (!this.chunked && this.#left > limit) {
      throw new HttpProtocolError(413, `request body of ${this.#left} bytes is larger than ${limit} bytes`);
    }
    const parts: Buffer[] = [];
    let total = 0;
    while (!this.complete) {
      const buf = Buffer.allocUnsafe(this.chunked ? 64 * 1024 : this.#left);
      const n = await this.readInto(buf);
      total += n;
      if (total > limit) throw new HttpProtocolError(413, `request body larger than ${limit} bytes`);
      parts.push(buf.subarray(0, n));
    }
    return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
  }

  #sendContinue(): void {
    if (this.expectsContinue && !this.#continueSent) {
      this.#continueSent = true;
      this.#connection.writeRaw('HTTP/1.1 100 Continue\r\n\r\n');
    }
  }

  /** Content-Length bodies: `n` body bytes were consumed. */
  consumed(n: number): void {
    this.#left -= n;
  }

  /**
   * Chunked bodies: decodes framing and data from `src[start, end)` into `out` (from `filled`); returns the source
   * bytes used and the output bytes produced. Throws HttpProtocolError on malformed framing.
   */
  decodeChunked(src: Buffer, start: number, end: number, out: Uint8Array | undefined, filled: number): [number, number] {
    let p = start;
    let o = filled;
    while (p < end && this.#chunk !== 'done') {
      if (this.#chunk === 'data') {
        if (!out || o === out.length) break;
        const n = Math.min(end - p, this.#chunkLeft, out.length - o);
        out.set(src.subarray(p, p + n), o);
        p += n;
        o += n;
        this.#chunkLeft -= n;
        if (this.#chunkLeft === 0) this.#chunk = 'data-crlf';
        continue;
      }
      if (this.#chunk === 'data-crlf') {
        if (end - p < 2) break;
        if (src[p] !== 13 || src[p + 1] !== 10) throw new HttpProtocolError(400, 'malformed chunked body: no CRLF after chunk data');
        p += 2;
        this.#chunk = 'size';
        continue;
      }
      // a line: a chunk size (with optional extensions) or a trailer field / the final empty line
      const eol = src.indexOf(10, p);
      if (eol < 0 || eol >= end) {
        if (end - p > MAX_CHUNK_LINE) throw new HttpProtocolError(400, 'malformed chunked body: line too long');
        break;
      }
      if (eol === p || src[eol - 1] !== 13) throw new HttpProtocolError(400, 'malformed chunked body: line not ended by CRLF');
      const line = src.toString('latin1', p, eol - 1);
      p = eol + 1;
      if (this.#chunk === 'size') {
        const m = /^([0-9A-Fa-f]{1,12})[ \t]*(;.*)?$/.exec(line);
        if (!m) throw new HttpProtocolError(400, `malformed chunked body: invalid chunk size line ${JSON.stringify(line.slice(0, 40))}`);
        const size = parseInt(m[1]!, 16);
        if (size === 0) this.#chunk = 'trailer';
        else {
          this.#chunkLeft = size;
          this.#chunk = 'data';
        }
      } else if (line === '') {
        this.#chunk = 'done';
      }
    }
    return [p - start, o - filled];
  }

  /** Chunked bodies: whether the decoder is inside chunk data (the only state that produces output). */
  get wantsOutput(): boolean {
    return this.#chunk === 'data';
  }
}

let cachedDate = '';
let cachedDateAt = 0;
function httpDate(): string {
  const now = Date.now();
  if (now - cachedDateAt >= 1000) {
    cachedDate = new Date(now).toUTCString();
    cachedDateAt = now - (now % 1000);
  }
  return cachedDate;
}

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// eslint-disable-next-line no-control-regex
const BAD_TARGET = /[\x00-\x20\x7f]/;
// eslint-disable-next-line no-control-regex
const BAD_VALUE = /[\x00-\x08\x0a-\x1f\x7f]/;

/** Headers a request may carry once only. */
const SINGLE_HEADERS = new Set(['content-length', 'host']);

/** Parses a request head (without its final CRLF CRLF); throws HttpProtocolError. */
function parseHead(text: string): {
  method: string;
  target: string;
  version: '1.0' | '1.1';
  headers: Map<string, string>;
} {
  const lines = text.split('\r\n');
  // a server should ignore empty lines before the request line (RFC 9112 §2.2)
  while (lines.length > 1 && lines[0] === '') lines.shift();
  const requestLine = lines[0]!;
  if (requestLine.includes('\n')) throw new HttpProtocolError(400, 'malformed request: bare LF in the request head');
  const parts = requestLine.split(' ');
  if (parts.length !== 3) throw new HttpProtocolError(400, `malformed request line ${JSON.stringify(requestLine.slice(0, 80))}`);
  const [method, target, proto] = parts as [string, string, string];
  if (!TOKEN.test(method)) throw new HttpProtocolError(400, `malformed request method ${JSON.stringify(method.slice(0, 40))}`);
  if (target === '' || BAD_TARGET.test(target)) throw new HttpProtocolError(400, 'malformed request target');
  const v = /^HTTP\/(\d)\.(\d)$/.exec(proto);
  if (!v) throw new HttpProtocolError(400, `malformed HTTP version ${JSON.stringify(proto.slice(0, 20))}`);
  if (v[1] !== '1') throw new HttpProtocolError(505, `HTTP version ${v[1]}.${v[2]} is not supported`);
  const version = v[2] === '0' ? '1.0' : '1.1';
  const headers = new Map<string, string>();
  const seen = new Set<string>();
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i]!;
    if (line.includes('\n')) throw new HttpProtocolError(400, 'malformed request: bare LF in the request head');
    if (line.startsWith(' ') || line.startsWith('\t')) throw new HttpProtocolError(400, 'malformed request: folded header line');
    const colon = line.indexOf(':');
    const name = colon > 0 ? line.slice(0, colon) : '';
    if (!TOKEN.test(name)) throw new HttpProtocolError(400, `malformed header line ${JSON.stringify(line.slice(0, 40))}`);
    const value = line.slice(colon + 1).replace(/^[ \t]+|[ \t]+$/g, '');
    if (BAD_VALUE.test(value)) throw new HttpProtocolError(400, `invalid character in header ${name}`);
    const key = name.toLowerCase();
    if (SINGLE_HEADERS.has(key)) {
      // two framings (or two hosts) that another server might read differently: request smuggling
      if (seen.has(key)) throw new HttpProtocolError(400, `malformed request: repeated ${name} header`);
      seen.add(key);
    }
    const prev = headers.get(key);
    headers.set(key, prev === undefined ? value : `${prev}, ${value}`);
  }
  return { method, target, version, headers };
}

/** One accepted connection: parses heads, feeds bodies into the handler's buffers, writes replies. */
class Connection {
  readonly #spill = Buffer.allocUnsafeSlow(SPILL_SIZE);
  /** Unconsumed bytes are spill[#start, #end). */
  #start = 0;
  #end = 0;
  /** The buffer the next socket read goes into (zero-copy mode). */
  #installed: Uint8Array;
  #phase: Phase = 'head';
  #request: OwnHttpRequest | undefined;
  #read: PendingRead | undefined;
  #lingerTimer: NodeJS.Timeout | undefined;
  /** Runs while a request head is awaited (from the connection, or from the first byte of a later head). */
  #headTimer: NodeJS.Timeout | undefined;
  #closeAfterReply = false;
  /** The socket handle, in zero-copy mode. */
  #handle: object | undefined;
  readonly socket: net.Socket;

  constructor(
    readonly server: ReceiverHttpServer,
    socket: net.Socket,
    zeroCopy: boolean,
  ) {
    this.#installed = this.#spill;
    let adopted: net.Socket | undefined;
    if (zeroCopy) adopted = this.#adopt(socket);
    if (adopted) {
      this.socket = adopted;
      server.stats.zeroCopyConnections++;
    } else {
      this.socket = socket;
      socket.on('data', (chunk: Buffer) => this.#onData(chunk));
      server.stats.copyingConnections++;
    }
    const s = this.socket;
    s.setNoDelay(true);
    s.setTimeout(server.keepAliveTimeoutMs, () => this.#onTimeout());
    s.on('error', (err) => this.#fail(new Error(`connection failed: ${err.message}`)));
    s.on('end', () => this.#onEnd());
    s.on('close', () => this.#onClose());
    this.#startHeadTimer();
    this.#resume();
  }

  #startHeadTimer(): void {
    if (this.#headTimer || this.#phase !== 'head') return;
    const ms = this.server.headerTimeoutMs;
    this.#headTimer = setTimeout(() => {
      this.#headTimer = undefined;
      if (this.#phase === 'head') this.#reject(new HttpProtocolError(408, `request head not received within ${ms} ms`));
    }, ms);
    this.#headTimer.unref();
  }

  #stopHeadTimer(): void {
    if (this.#headTimer) clearTimeout(this.#headTimer);
    this.#headTimer = undefined;
  }

  /**
   * Moves an accepted socket's handle into a socket in `onread` mode (reads go into `#installed`). Returns undefined
   * where this runtime's sockets do not work that way; the accepted socket is then used as it is.
   */
  #adopt(socket: net.Socket): net.Socket | undefined {
    const holder = socket as unknown as { _handle?: { readStart?: unknown; readStop?: unknown } | null };
    const handle = holder._handle;
    if (!handle || typeof handle.readStart !== 'function' || typeof handle.readStop !== 'function') return undefined;
    let adopted: net.Socket;
    try {
      const options = {
        handle,
        allowHalfOpen: true,
        pauseOnCreate: true,
        onread: { buffer: () => this.#nextBuffer(), callback: (n: number) => this.#onRead(n) },
      } as net.SocketConstructorOpts;
      holder._handle = null;
      adopted = new net.Socket(options);
    } catch {
      holder._handle = handle;
      return undefined;
    }
    // the accepted socket is an empty shell now: destroying it releases the server's count of it, not the connection
    socket.destroy();
    this.#handle = handle;
    return adopted;
  }

  /** Where the next socket read goes: the pending read's target when nothing is left in the spill, else the spill. */
  #nextBuffer(): Uint8Array {
    const r = this.#directRead();
    if (r) {
      this.#start = this.#end = 0;
      this.#installed = r.target.subarray(r.filled);
      return this.#installed;
    }
    this.#compactSpill(MAX_CHUNK_LINE);
    // never an empty buffer (libuv fails a read into one); a full spill is only reached while no read is wanted
    this.#installed = this.#end < SPILL_SIZE ? this.#spill.subarray(this.#end) : this.#spill.subarray(SPILL_SIZE - 1);
    return this.#installed;
  }

  /**
   * Makes the next socket read go into the spill (after a read was abandoned while its target was the read buffer).
   * Returns false if that is not possible.
   */
  #installSpill(): boolean {
    if (!this.#handle || this.#installed.buffer === this.#spill.buffer) return true;
    const h = this.#handle as { useUserBuffer?: (buf: Uint8Array) => void };
    if (typeof h.useUserBuffer !== 'function') return false;
    this.#start = this.#end = 0;
    this.#installed = this.#spill.subarray(0);
    h.useUserBuffer(this.#installed);
    return true;
  }

  /** The pending read, when socket bytes can go straight into its target (nothing left in the spill, no chunk framing). */
  #directRead(): PendingRead | undefined {
    const r = this.#read;
    return r && this.#start === this.#end && this.#request && !this.#request.chunked ? r : undefined;
  }

  /** Empties a consumed spill, or moves its unconsumed bytes to its start when less than `minFree` bytes are free. */
  #compactSpill(minFree: number): void {
    if (this.#start === this.#end) this.#start = this.#end = 0;
    else if (this.#start > 0 && SPILL_SIZE - this.#end < minFree) {
      this.#spill.copy(this.#spill, 0, this.#start, this.#end);
      this.#end -= this.#start;
      this.#start = 0;
    }
  }

  /** zero-copy mode: `n` bytes were read into `#installed`; returns false to stop reading. */
  #onRead(n: number): boolean {
    const buf = this.#installed;
    if (buf.buffer === this.#spill.buffer && buf.byteOffset === this.#spill.byteOffset + this.#end) {
      this.#end += n;
      this.#process();
    } else if (this.#read && buf.buffer === this.#read.target.buffer) {
      this.#read.filled += n;
      this.#request!.consumed(n);
      if (this.#read.filled === this.#read.target.length) this.#completeRead();
    } else if (this.#phase !== 'lingering') {
      // cannot happen: a read into a buffer nobody waits for
      this.#fail(new Error('connection read into an unexpected buffer'));
    }
    return this.#wantsData();
  }

  /** copying mode: a chunk from a 'data' event. */
  #onData(chunk: Buffer): void {
    let off = 0;
    while (off < chunk.length && this.#phase !== 'closed') {
      if (this.#phase === 'lingering') return;
      const r = this.#directRead();
      if (r) {
        const n = Math.min(chunk.length - off, r.target.length - r.filled);
        r.target.set(chunk.subarray(off, off + n), r.filled);
        off += n;
        r.filled += n;
        this.#request!.consumed(n);
        if (r.filled === r.target.length) this.#completeRead();
        continue;
      }
      this.#compactSpill(SPILL_SIZE);
      const n = Math.min(chunk.length - off, SPILL_SIZE - this.#end);
      if (n === 0) {
        // the spill is full of bytes nobody asked for yet: wait (the socket is paused below)
        break;
      }
      chunk.copy(this.#spill, this.#end, off, off + n);
      this.#end += n;
      off += n;
      this.#process();
    }
    if (off < chunk.length && this.#phase !== 'closed' && this.#phase !== 'lingering') {
      // keep what did not fit in front of the next reads
      this.socket.unshift(chunk.subarray(off));
      this.socket.pause();
      return;
    }
    if (!this.#wantsData()) this.socket.pause();
  }

  #wantsData(): boolean {
    if (this.#phase === 'closed') return false;
    if (this.#phase === 'lingering') return true;
    if (this.#phase === 'head') return true;
    return this.#read !== undefined;
  }

  #resume(): void {
    if (this.#phase === 'closed' || this.socket.destroyed) return;
    // in onread mode this starts the handle reading again if a read callback stopped it
    this.socket.resume();
  }

  /** Uses the spill's bytes: a request head, or body bytes for the pending read. */
  #process(): void {
    if (this.#phase === 'lingering') {
      this.#start = this.#end;
      return;
    }
    if (this.#phase === 'head') {
      this.#parseHead();
      return;
    }
    if (this.#phase === 'handling' && this.#read) this.#fillFromSpill();
  }

  #parseHead(): void {
    // a later request's head has begun: it must be complete in time
    if (this.#end > this.#start) this.#startHeadTimer();
    const max = this.server.maxHeadBytes;
    const at = this.#spill.indexOf('\r\n\r\n', this.#start, 'latin1');
    if (at < 0 || at + 4 > this.#end) {
      if (this.#end - this.#start >= max || (this.#start === 0 && this.#end === SPILL_SIZE)) {
        this.#reject(new HttpProtocolError(431, `request head larger than ${max} bytes`));
      }
      return;
    }
    if (at - this.#start > max) {
      this.#reject(new HttpProtocolError(431, `request head larger than ${max} bytes`));
      return;
    }
    this.#stopHeadTimer();
    const text = this.#spill.toString('latin1', this.#start, at);
    this.#start = at + 4;
    let request: OwnHttpRequest;
    try {
      request = this.#makeRequest(text);
    } catch (err) {
      this.#reject(err as Error);
      return;
    }
    this.#request = request;
    this.#phase = 'handling';
    this.server.dispatch(this, request);
  }

  #makeRequest(text: string): OwnHttpRequest {
    const { method, target, version, headers } = parseHead(text);
    if (version === '1.1' && !headers.has('host')) throw new HttpProtocolError(400, 'missing required Host header');
    const te = headers.get('transfer-encoding');
    const cl = headers.get('content-length');
    let contentLength: number | undefined = 0;
    if (te !== undefined) {
      if (cl !== undefined) throw new HttpProtocolError(400, 'request has both Content-Length and Transfer-Encoding');
      if (version === '1.0') throw new HttpProtocolError(400, 'Transfer-Encoding in an HTTP/1.0 request');
      if (te.toLowerCase() !== 'chunked') throw new HttpProtocolError(501, `unsupported transfer encoding ${JSON.stringify(te)}`);
      contentLength = undefined;
    } else if (cl !== undefined) {
      // one plain decimal (no sign, no list, at most 15 digits: a safe integer)
      if (!/^\d{1,15}$/.test(cl)) throw new HttpProtocolError(400, `invalid Content-Length ${JSON.stringify(cl.slice(0, 40))}`);
      contentLength = Number(cl);
    }
    const connection = (headers.get('connection') ?? '').toLowerCase().split(',').map((x) => x.trim());
    const keepAlive = version === '1.1' ? !connection.includes('close') : connection.includes('keep-alive');
    const expect = headers.get('expect');
    if (expect !== undefined && expect.toLowerCase() !== '100-continue') {
      throw new HttpProtocolError(417, `unsupported expectation ${JSON.stringify(expect.slice(0, 40))}`);
    }
    return new OwnHttpRequest(method, target, version, headers, contentLength, keepAlive, expect !== undefined && version === '1.1', this);
  }

  /** Starts a read for `req` into `target` (called by ReceiverHttpRequest.readInto). */
  read(req: OwnHttpRequest, target: Uint8Array): Promise<number> {
    if (this.#phase === 'closed' || req !== this.#request) {
      return Promise.reject(new Error('the connection closed before the request body was read'));
    }
    if (this.#read) return Promise.reject(new Error('a body read is already pending on this request'));
    return new Promise<number>((resolve, reject) => {
      this.#read = { target, filled: 0, resolve, reject };
      this.#fillFromSpill();
      if (this.#read) this.#resume();
    });
  }

  #fillFromSpill(): void {
    const r = this.#read!;
    const req = this.#request!;
    if (req.chunked) {
      let used: number;
      let produced: number;
      try {
        [used, produced] = req.decodeChunked(this.#spill, this.#start, this.#end, r.target, r.filled);
      } catch (err) {
        this.#reject(err as Error);
        return;
      }
      this.#start += used;
      r.filled += produced;
      if (r.filled === r.target.length || req.complete) this.#completeRead();
      return;
    }
    const n = Math.min(this.#end - this.#start, r.target.length - r.filled);
    if (n > 0) {
      r.target.set(this.#spill.subarray(this.#start, this.#start + n), r.filled);
      this.#start += n;
      r.filled += n;
      req.consumed(n);
    }
    if (r.filled === r.target.length) this.#completeRead();
  }

  #completeRead(): void {
    const r = this.#read!;
    this.#read = undefined;
    r.resolve(r.filled);
  }

  #failRead(err: Error): void {
    const r = this.#read;
    if (!r) return;
    this.#read = undefined;
    r.reject(err);
  }

  writeRaw(text: string): void {
    if (!this.socket.destroyed && this.socket.writable) this.socket.write(text, 'latin1');
  }

  /** Sends the reply to the current request; then reads the next request or closes. */
  reply(req: OwnHttpRequest, r: ReceiverHttpReply): void {
    if (req !== this.#request || this.#phase !== 'handling') return;
    // answered while its body was still being read into the handler's buffer: no further read may land there
    const abandoned = this.#read !== undefined;
    if (abandoned) this.#failRead(new Error('the request was answered while its body was being read'));
    const status = r.status ?? 200;
    const body = r.body === undefined ? undefined : typeof r.body === 'string' ? Buffer.from(r.body, 'utf8') : r.body;
    const keepAlive = req.keepAlive && req.complete && !r.close && !this.#closeAfterReply && !this.server.closing;
    this.#writeResponse(status, body, r.contentType, !keepAlive ? 'close' : req.httpVersion === '1.0' ? 'keep-alive' : undefined);
    const s = this.socket;
    r.onSent?.();
    this.#request = undefined;
    if (abandoned && !this.#installSpill()) {
      // the next socket read would land in the abandoned buffer, and this runtime cannot point it elsewhere: stop
      // reading (the client may then see a reset instead of the rest of the exchange)
      this.#phase = 'closed';
      s.end();
      s.pause();
      setTimeout(() => s.destroy(), LINGER_MS).unref();
      return;
    }
    if (!keepAlive) {
      this.#linger();
      return;
    }
    this.#phase = 'head';
    // a pipelined request may be waiting in the spill already
    if (this.#end > this.#start) this.#parseHead();
    if (this.#phase === 'head') this.#resume();
  }

  /** Writes one response: status line, Date, Content-Type, Content-Length, Connection (when given) and body. */
  #writeResponse(status: number, body: Uint8Array | undefined, contentType: string | undefined, connection: string | undefined): void {
    const s = this.socket;
    if (s.destroyed || !s.writable) return;
    let head = `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Unknown'}\r\nDate: ${httpDate()}\r\n`;
    if (contentType) head += `Content-Type: ${contentType}\r\n`;
    head += `Content-Length: ${body?.length ?? 0}\r\n`;
    if (connection) head += `Connection: ${connection}\r\n`;
    s.cork();
    s.write(`${head}\r\n`, 'latin1');
    if (body && body.length > 0) s.write(body);
    s.uncork();
  }

  /** Answers a request that could not be parsed (or read), then closes. */
  #reject(err: Error): void {
    const status = err instanceof HttpProtocolError ? err.status : 400;
    if (this.#phase === 'handling' && this.#request) {
      // the handler is running: it learns through its read; the reply closes the connection
      this.#closeAfterReply = true;
      this.#failRead(err);
      return;
    }
    this.#writeResponse(status, Buffer.from(`${err.message}\n`, 'utf8'), 'text/plain; charset=utf-8', 'close');
    this.#linger();
  }

  /** Half-closes after the last reply and drops what the client still sends, so the reply is not lost to a reset. */
  #linger(): void {
    if (this.#phase === 'closed') return;
    this.#stopHeadTimer();
    this.#phase = 'lingering';
    this.#start = this.#end = 0;
    this.socket.end();
    this.#lingerTimer = setTimeout(() => this.socket.destroy(), LINGER_MS);
    this.#lingerTimer.unref();
    this.#resume();
  }

  #onTimeout(): void {
    // a handler that is working (no body read pending) is not a stalled client; a head in progress has its own timer
    if (this.#phase === 'handling' && !this.#read) return;
    if (this.#phase === 'head' && this.#headTimer && this.#end > this.#start) return;
    this.#fail(new Error('the connection timed out'));
  }

  #onEnd(): void {
    if (this.#phase === 'handling') {
      // the client stopped sending: a pending body read fails; a request being answered still gets its reply
      this.#closeAfterReply = true;
      // the client's fault, answered as a bad request (400), not as a server error
      this.#failRead(new HttpProtocolError(400, 'the client closed the connection before the request body was complete'));
      return;
    }
    this.socket.end();
  }

  #fail(err: Error): void {
    this.#failRead(err);
    this.socket.destroy();
  }

  #onClose(): void {
    this.#phase = 'closed';
    if (this.#lingerTimer) clearTimeout(this.#lingerTimer);
    this.#stopHeadTimer();
    this.#failRead(new Error('the connection closed before the request body was complete'));
    this.server.connectionClosed(this);
  }

  /** Whether the connection waits for a request (nothing half-read, no handler running). */
  get idle(): boolean {
    return this.#phase === 'head' && this.#end === this.#start;
  }

  /** Closes after the current request's reply (now, when idle). */
  closeWhenIdle(): void {
    this.#closeAfterReply = true;
    if (this.idle) this.socket.destroy();
  }

  destroy(): void {
    this.socket.destroy();
  }
}

/** HTTP/1.1 server of one ssync receiver (the fast one: bodies go from the socket straight into the handler's buffers). */
export class ReceiverHttpServer implements ReceiverServer {
  readonly keepAliveTimeoutMs: number;
  readonly maxHeadBytes: number;
  readonly headerTimeoutMs: number;
  readonly #zeroCopy: boolean;
  readonly #server: net.Server;
  readonly #connections = new Set<Connection>();
  /**
   * Connections accepted in each read mode: with `zeroCopy` (the default) every connection should be a zero-copy one;
   * copying ones mean this runtime's sockets cannot be moved into `onread` mode.
   */
  readonly stats = { zeroCopyConnections: 0, copyingConnections: 0 };
  #closing = false;
  #listenerClosed = false;
  #resolveClosed!: () => void;
  /** Resolves once the server stopped listening and every connection is closed. */
  readonly closed: Promise<void>;

  constructor(
    readonly handler: ReceiverHttpHandler,
    options: ReceiverHttpServerOptions = {},
  ) {
    this.keepAliveTimeoutMs = options.keepAliveTimeoutMs ?? 240_000;
    this.maxHeadBytes = Math.min(options.maxHeadBytes ?? DEFAULT_MAX_HEAD_BYTES, SPILL_SIZE - MAX_CHUNK_LINE);
    this.headerTimeoutMs = options.headerTimeoutMs ?? DEFAULT_HEADER_TIMEOUT_MS;
    this.#zeroCopy = options.zeroCopy ?? true;
    this.closed = new Promise<void>((r) => (this.#resolveClosed = r));
    this.#server = net.createServer({ pauseOnConnect: true, allowHalfOpen: true }, (socket) => {
      if (this.#closing) {
        socket.destroy();
        return;
      }
      this.#connections.add(new Connection(this, socket, this.#zeroCopy));
    });
    this.#server.on('close', () => {
      this.#listenerClosed = true;
      this.#maybeClosed();
    });
  }

  get closing(): boolean {
    return this.#closing;
  }

  listen(port: number, host: string): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.#server.once('error', reject);
      this.#server.listen(port, host, () => {
        this.#server.off('error', reject);
        resolve();
      });
    });
  }

  address(): net.AddressInfo {
    return this.#server.address() as net.AddressInfo;
  }

  /** Stops accepting connections; idle connections close now, busy ones after their current reply. */
  close(): void {
    if (!this.#closing) {
      this.#closing = true;
      if (this.#server.listening) this.#server.close();
      else {
        this.#listenerClosed = true;
        this.#maybeClosed();
      }
    }
    for (const c of this.#connections) c.closeWhenIdle();
  }

  /** Closes every connection now (pending body reads reject). */
  closeAllConnections(): void {
    for (const c of this.#connections) c.destroy();
  }

  dispatch(connection: Connection, req: OwnHttpRequest): void {
    let reply: Promise<ReceiverHttpReply>;
    try {
      reply = this.handler(req);
    } catch (err) {
      reply = Promise.reject(err);
    }
    reply.then(
      (r) => connection.reply(req, r),
      (err: unknown) => {
        const e = err as Error;
        const status = e instanceof HttpProtocolError ? e.status : 500;
        connection.reply(req, { status, body: `${e.message}\n`, contentType: 'text/plain; charset=utf-8', close: true });
      },
    );
  }

  connectionClosed(c: Connection): void {
    this.#connections.delete(c);
    this.#maybeClosed();
  }

  #maybeClosed(): void {
    if (this.#listenerClosed && this.#connections.size === 0) this.#resolveClosed();
  }
}
