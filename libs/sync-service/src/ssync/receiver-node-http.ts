import http from 'node:http';
import type net from 'node:net';
import { HttpProtocolError, ReceiverHttpServer, type ReceiverHttpHandler, type ReceiverHttpReply, type ReceiverHttpRequest, type ReceiverHttpServerOptions, type ReceiverServer } from './receiver-http.js';
import { receiverServerKind, type ReceiverServerKind } from './paths.js';

/**
 * The conservative twin of `ReceiverHttpServer`: the same request API on Node's own `http` server. Node parses the
 * requests and hands out each body in chunks of its own; `readInto` copies them into the handler's buffers (the
 * receive slabs). It costs more CPU per byte than the fast server and relies on nothing but Node's public API. Select
 * it with `httpServer: 'node-http'` or `BIS_SSYNC_RECEIVER_SERVER=node-http` (paths.ts).
 *
 * Behaviour kept from the fast server: one request at a time per connection, 100 Continue sent when the handler first
 * reads, Content-Length on every reply, a reply that leaves the body unread closes the connection, a repeated Host or
 * Content-Length is refused (400), a stalled body read or idle connection is closed after `keepAliveTimeoutMs`, a
 * request head must be complete within `headerTimeoutMs` (408 from Node, checked every second or so).
 */

const DEFAULT_MAX_HEAD_BYTES = 32 * 1024;
const DEFAULT_HEADER_TIMEOUT_MS = 60_000;
const DEFAULT_KEEP_ALIVE_TIMEOUT_MS = 240_000;
/** How long a reply that leaves a body unread waits for the rest of the body (dropped), so the client gets no reset. */
const DRAIN_MS = 5000;

interface PendingRead {
  target: Uint8Array;
  filled: number;
  resolve: (n: number) => void;
  reject: (err: Error) => void;
  timer: NodeJS.Timeout;
}

/** A request of Node's `http` server behind the receiver's request API. */
class NodeHttpRequest implements ReceiverHttpRequest {
  readonly method: string;
  readonly target: string;
  readonly httpVersion: '1.0' | '1.1';
  readonly headers: ReadonlyMap<string, string>;
  readonly contentLength: number | undefined;
  readonly keepAlive: boolean;
  readonly expectsContinue: boolean;
  /** Body bytes read so far. */
  #consumed = 0;
  /** Part of a chunk from Node not copied out yet. */
  #left: Buffer | undefined;
  #read: PendingRead | undefined;
  /** Set when the connection failed or the request was answered: every later read rejects with it. */
  #failure: Error | undefined;
  #continueSent = false;
  /** Dropping the rest of the body (the reply did not read it). */
  #draining = false;

  constructor(
    readonly message: http.IncomingMessage,
    readonly response: http.ServerResponse,
    readonly server: NodeHttpReceiverServer,
    expectsContinue: boolean,
  ) {
    this.method = message.method ?? 'GET';
    this.target = message.url ?? '/';
    this.httpVersion = message.httpVersion === '1.0' ? '1.0' : '1.1';
    const headers = new Map<string, string>();
    const raw = message.rawHeaders;
    for (let i = 0; i + 1 < raw.length; i += 2) {
      const key = raw[i]!.toLowerCase();
      const prev = headers.get(key);
      headers.set(key, prev === undefined ? raw[i + 1]! : `${prev}, ${raw[i + 1]!}`);
    }
    this.headers = headers;
    const cl = headers.get('content-length');
    this.contentLength = headers.has('transfer-encoding') ? undefined : cl === undefined ? 0 : Number(cl);
    const connection = (headers.get('connection') ?? '').toLowerCase().split(',').map((x) => x.trim());
    this.keepAlive = this.httpVersion === '1.1' ? !connection.includes('close') : connection.includes('keep-alive');
    this.expectsContinue = expectsContinue;
    message.on('readable', () => this.#pump());
    message.on('end', () => this.#pump());
    message.on('error', () => this.fail(new Error('the connection closed before the request body was complete')));
    message.on('close', () => {
      if (!this.complete) this.fail(new Error('the connection closed before the request body was complete'));
    });
  }

  get chunked(): boolean {
    return this.contentLength === undefined;
  }

  get complete(): boolean {
    if (!this.chunked) return this.#consumed === this.contentLength;
    return this.message.complete && this.message.readableLength === 0 && this.#left === undefined;
  }

  get bodyLeft(): number | undefined {
    return this.chunked ? undefined : this.contentLength! - this.#consumed;
  }

  readInto(target: Uint8Array): Promise<number> {
    if (this.#failure) return Promise.reject(this.#failure);
    if (this.complete || target.length === 0) return Promise.resolve(0);
    if (this.#read) return Promise.reject(new Error('a body read is already pending on this request'));
    if (this.expectsContinue && !this.#continueSent) {
      this.#continueSent = true;
      this.response.writeContinue();
    }
    const want = this.chunked ? target.length : Math.min(target.length, this.bodyLeft!);
    return new Promise<number>((resolve, reject) => {
      const ms = this.server.keepAliveTimeoutMs;
      const timer = setTimeout(() => {
        this.fail(new Error(`the connection timed out: no body bytes for ${ms} ms`));
        this.message.socket.destroy();
      }, ms);
      this.#read = { target: target.subarray(0, want), filled: 0, resolve, reject, timer };
      this.#pump();
    });
  }

  async readAll(limit: number): Promise<Buffer> {
    if (!this.chunked && this.bodyLeft! > limit) {
      throw new HttpProtocolError(413, `request body of ${this.bodyLeft!} bytes is larger than ${limit} bytes`);
    }
    const parts: Buffer[] = [];
    let total = 0;
    while (!this.complete) {
      const buf = Buffer.allocUnsafe(this.chunked ? 64 * 1024 : this.bodyLeft!);
      const n = await this.readInto(buf);
      if (n === 0) break;
      total += n;
      if (total > limit) throw new HttpProtocolError(413, `request body larger than ${limit} bytes`);
      parts.push(buf.subarray(0, n));
    }
    return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
  }

  /** Copies what Node has buffered into the pending read; settles it when full or at the end of the body. */
  #pump(): void {
    if (this.#draining) {
      while (this.message.read() !== null);
      return;
    }
    const r = this.#read;
    if (!r) return;
    while (r.filled < r.target.length) {
      const chunk = this.#left ?? (this.message.read() as Buffer | null);
      this.#left = undefined;
      if (chunk === null) break;
      const n = Math.min(chunk.length, r.target.length - r.filled);
      r.target.set(chunk.subarray(0, n), r.filled);
      r.filled += n;
      this.#consumed += n;
      r.timer.refresh();
      if (n < chunk.length) this.#left = chunk.subarray(n);
    }
    if (r.filled === r.target.length || this.complete || this.message.readableEnded) {
      this.#read = undefined;
      clearTimeout(r.timer);
      r.resolve(r.filled);
    }
  }

  /** Drops the rest of the body; resolves at its end, when the connection closes, or after `ms`. */
  drain(ms: number): Promise<void> {
    this.#draining = true;
    this.#left = undefined;
    if (this.message.readableEnded || this.message.destroyed) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.message.once('end', done);
      this.message.once('close', done);
      this.#pump();
    });
  }

  /** Fails the pending read with `err`, and every later one with `later` (default `err`). */
  fail(err: Error, later: Error = err): void {
    this.#failure ??= later;
    const r = this.#read;
    if (!r) return;
    this.#read = undefined;
    clearTimeout(r.timer);
    r.reject(err);
  }
}

/** The ssync receiver's routes on Node's `http` server (see the file comment). */
export class NodeHttpReceiverServer implements ReceiverServer {
  readonly keepAliveTimeoutMs: number;
  readonly #server: http.Server;
  /** The request being handled on each connection. */
  readonly #active = new Map<net.Socket, NodeHttpRequest>();
  /** The last request of each connection, handled or waiting: the next one starts after it. */
  readonly #queue = new WeakMap<net.Socket, Promise<void>>();
  /** Connections whose last reply said Connection: close. */
  readonly #closingSockets = new WeakSet<net.Socket>();
  #closing = false;
  readonly closed: Promise<void>;
  #resolveClosed!: () => void;

  constructor(
    readonly handler: ReceiverHttpHandler,
    options: ReceiverHttpServerOptions = {},
  ) {
    this.keepAliveTimeoutMs = options.keepAliveTimeoutMs ?? DEFAULT_KEEP_ALIVE_TIMEOUT_MS;
    const headerTimeoutMs = options.headerTimeoutMs ?? DEFAULT_HEADER_TIMEOUT_MS;
    this.closed = new Promise<void>((r) => (this.#resolveClosed = r));
    this.#server = http.createServer({
      keepAliveTimeout: this.keepAliveTimeoutMs,
      headersTimeout: headerTimeoutMs,
      requestTimeout: 0,
      // Node checks the head timeout at this interval: a late head is answered up to this much later than its limit
      connectionsCheckingInterval: Math.max(10, Math.min(1000, Math.floor(headerTimeoutMs / 4))),
      maxHeaderSize: options.maxHeadBytes ?? DEFAULT_MAX_HEAD_BYTES,
      // checked in #dispatch, to answer with a Content-Length like every other reply
      requireHostHeader: false,
    });
    // the receiver reads a body only when it has a buffer for it; a handler that works long is not a stalled client
    this.#server.timeout = 0;
    this.#server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => this.#dispatch(req, res, false));
    // 100 Continue is sent when the handler first reads the body, as the fast server does
    this.#server.on('checkContinue', (req: http.IncomingMessage, res: http.ServerResponse) => this.#dispatch(req, res, true));
    this.#server.on('checkExpectation', (req: http.IncomingMessage, res: http.ServerResponse) => {
      const expect = String(req.headers.expect ?? '');
      this.#dispatch(req, res, false, new HttpProtocolError(417, `unsupported expectation ${JSON.stringify(expect.slice(0, 40))}`));
    });
    this.#server.on('clientError', (err: Error & { code?: string }, socket: net.Socket) => this.#clientError(err, socket));
    this.#server.on('close', () => this.#resolveClosed());
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

  close(): void {
    if (!this.#closing) {
      this.#closing = true;
      if (this.#server.listening) this.#server.close();
      else this.#resolveClosed();
    }
    this.#server.closeIdleConnections();
  }

  closeAllConnections(): void {
    this.#server.closeAllConnections();
    for (const [socket, req] of this.#active) {
      req.fail(new Error('the connection closed before the request body was complete'));
      socket.destroy();
    }
  }

  #dispatch(message: http.IncomingMessage, response: http.ServerResponse, expectsContinue: boolean, refusal?: HttpProtocolError): void {
    const socket = message.socket;
    // the request Node parses now: a parse error of its body (#clientError) fails its reads
    const req = new NodeHttpRequest(message, response, this, expectsContinue);
    this.#active.set(socket, req);
    // one request at a time per connection, as the fast server: a pipelined request waits for the reply before it
    const previous = this.#queue.get(socket) ?? Promise.resolve();
    const turn = previous.then(() => this.#handle(req, refusal));
    this.#queue.set(socket, turn);
  }

  /** Refusals Node's parser lets through: what the fast server's parser refuses. */
  #refusal(message: http.IncomingMessage): HttpProtocolError | undefined {
    if (message.httpVersionMajor !== 1) return new HttpProtocolError(505, `HTTP version ${message.httpVersion} is not supported`);
    // smuggling: a second framing or host that another server might read differently (Node joins repeated headers)
    const counts = new Map<string, number>();
    for (let i = 0; i < message.rawHeaders.length; i += 2) {
      const k = message.rawHeaders[i]!.toLowerCase();
      if (k === 'host' || k === 'content-length') counts.set(k, (counts.get(k) ?? 0) + 1);
    }
    const repeated = [...counts].find(([, n]) => n > 1);
    if (repeated) return new HttpProtocolError(400, `malformed request: repeated ${repeated[0]} header`);
    if (message.httpVersion === '1.1' && counts.get('host') === undefined) return new HttpProtocolError(400, 'missing required Host header');
    const te = message.headers['transfer-encoding'];
    if (te !== undefined) {
      if (message.httpVersion === '1.0') return new HttpProtocolError(400, 'Transfer-Encoding in an HTTP/1.0 request');
      if (te.toLowerCase() !== 'chunked') return new HttpProtocolError(501, `unsupported transfer encoding ${JSON.stringify(te)}`);
    }
    return undefined;
  }

  /** Runs the handler for one request and replies; resolves once the reply is written. */
  async #handle(req: NodeHttpRequest, refusal?: HttpProtocolError): Promise<void> {
    const socket = req.message.socket;
    // a reply before closed the connection: requests pipelined after it are not served (as the fast server)
    if (this.#closingSockets.has(socket) || socket.destroyed) return;
    const refused = refusal ?? this.#refusal(req.message);
    let r: ReceiverHttpReply;
    try {
      if (refused) throw refused;
      r = await this.handler(req);
    } catch (err) {
      const e = err as Error;
      const status = e instanceof HttpProtocolError ? e.status : 500;
      r = { status, body: `${e.message}\n`, contentType: 'text/plain; charset=utf-8', close: true };
    }
    await this.#reply(req, socket, r);
  }

  async #reply(req: NodeHttpRequest, socket: net.Socket, r: ReceiverHttpReply): Promise<void> {
    if (this.#active.get(socket) === req) this.#active.delete(socket);
    // answered while its body was still being read into the handler's buffer: no further read may land there
    req.fail(new Error('the request was answered while its body was being read'), new Error('the connection closed before the request body was read'));
    const unread = !req.complete;
    // Node closes the connection right after a closing reply: a client still sending the body would get a reset and
    // might lose the reply, so the rest of the body is read (and dropped) first, for a bounded time
    if (unread) await req.drain(DRAIN_MS);
    const res = req.response;
    if (res.headersSent || res.writableEnded || socket.destroyed) return;
    const status = r.status ?? 200;
    const body = r.body === undefined ? undefined : typeof r.body === 'string' ? Buffer.from(r.body, 'utf8') : r.body;
    const keepAlive = req.keepAlive && !unread && !r.close && !this.#closing && !socket.destroyed;
    const headers: http.OutgoingHttpHeaders = { 'Content-Length': body?.length ?? 0 };
    if (r.contentType) headers['Content-Type'] = r.contentType;
    if (!keepAlive) {
      headers['Connection'] = 'close';
      this.#closingSockets.add(socket);
    }
    else if (req.httpVersion === '1.0') headers['Connection'] = 'keep-alive';
    res.writeHead(status, headers);
    res.end(body);
    r.onSent?.();
  }

  /** A request Node could not parse: a request being handled learns it through its read, else Node's answer. */
  #clientError(err: Error & { code?: string }, socket: net.Socket): void {
    const active = this.#active.get(socket);
    if (active) {
      // the client stopped sending mid-body: its fault, answered as a bad request by the handler's reply
      const eof = err.code === 'HPE_INVALID_EOF_STATE' || err.code === 'ECONNRESET';
      active.fail(new HttpProtocolError(400, eof ? 'the client closed the connection before the request body was complete' : `malformed request body: ${err.message}`));
      return;
    }
    if (!socket.writable) {
      socket.destroy();
      return;
    }
    const status =
      err.code === 'HPE_HEADER_OVERFLOW' ? 431 : err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? 408 : err.code === 'HPE_INVALID_TRANSFER_ENCODING' && !/Content-Length/.test(err.message)
          ? 501
          : 400;
    const text = `${err.message}\n`;
    socket.end(
      `HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? 'Bad Request'}\r\nContent-Type: text/plain; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(text)}\r\nConnection: close\r\n\r\n${text}`,
    );
    setTimeout(() => socket.destroy(), 5000).unref();
  }
}

/**
 * The receiver's HTTP server: `ReceiverHttpServer` (`own`, the default) or `NodeHttpReceiverServer` (`node-http`), as
 * `kind` or else `BIS_SSYNC_RECEIVER_SERVER` says.
 */
export function createReceiverServer(
  handler: ReceiverHttpHandler,
  options: ReceiverHttpServerOptions & { kind?: ReceiverServerKind } = {},
): ReceiverServer {
  const { kind, ...rest } = options;
  return receiverServerKind(kind) === 'node-http' ? new NodeHttpReceiverServer(handler, rest) : new ReceiverHttpServer(handler, rest);
}
