import { describe, it, expect, afterEach, jest } from '@jest/globals';
import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { promises as fsp } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import {
  HttpProtocolError,
  ReceiverHttpServer,
  type ReceiverHttpHandler,
  type ReceiverHttpReply,
  type ReceiverHttpRequest,
  type ReceiverHttpServerOptions,
  type ReceiverServer,
} from './receiver-http.js';
import { NodeHttpReceiverServer } from './receiver-node-http.js';

// every test here finishes in well under a second; a hang fails fast instead of after the default 60 s
jest.setTimeout(15_000);

const HOST = '127.0.0.1';
const KiB = 1024;
const MiB = 1 << 20;
/** Fill of every read target before the read: bytes the read must not touch stay this value. */
const SENTINEL = 0xa5;
/** Bytes after each read target that no read may write. */
const GUARD = 16;

const sha256 = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

// ---------------------------------------------------------------------------------------------------------------------
// servers, sockets and temp dirs of the running test, cleaned up after it

const servers: ReceiverServer[] = [];
const sockets: net.Socket[] = [];
const agents: http.Agent[] = [];
const tempDirs: string[] = [];

afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  for (const a of agents.splice(0)) a.destroy();
  for (const server of servers.splice(0)) {
    server.close();
    server.closeAllConnections();
    await server.closed;
  }
  for (const d of tempDirs.splice(0)) await fsp.rm(d, { recursive: true, force: true });
});

/**
 * The servers under test: the receiver's own server reading into the handler's buffers (zero-copy, the default), the
 * same server reading with 'data' events (where sockets cannot be moved into onread mode), and its conservative twin
 * on Node's `http` (`BIS_SSYNC_RECEIVER_SERVER=node-http`). Every conformance test below runs against each.
 */
type Variant = 'own, zero-copy' | 'own, copying' | 'node-http';
const VARIANTS: readonly Variant[] = ['own, zero-copy', 'own, copying', 'node-http'];

async function serve(handler: ReceiverHttpHandler, options: ReceiverHttpServerOptions, variant: Variant = 'own, zero-copy'): Promise<{ server: ReceiverServer; port: number }> {
  const server =
    variant === 'node-http'
      ? new NodeHttpReceiverServer(handler, options)
      : new ReceiverHttpServer(handler, { ...options, zeroCopy: variant === 'own, zero-copy' });
  servers.push(server);
  await server.listen(0, HOST);
  return { server, port: server.address().port };
}

function keepAliveAgent(): http.Agent {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  agents.push(agent);
  return agent;
}

/** A promise with its resolve function (for handlers that wait on the test, and the test on handlers). */
function signal<T = void>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** Whether every byte of buf[from, to) is the sentinel. */
function untouched(buf: Uint8Array, from: number, to: number): boolean {
  for (let i = from; i < to; i++) if (buf[i] !== SENTINEL) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------------------------------
// the handler side: read a body with a plan of target sizes, checking every promise the request API makes

interface BodyReport {
  method: string;
  target: string;
  httpVersion: string;
  chunked: boolean;
  expectsContinue: boolean;
  keepAlive: boolean;
  length: number;
  sha256: string;
  reads: number;
  problems: string[];
}

/**
 * Reads the whole body with `readInto`, cycling through `sizes` for the target sizes; each target is a sentinel-filled
 * buffer with a guard after it. Records every broken promise: a read that is short before the end, writes outside
 * its result, wrong `bodyLeft` / `complete`, a non-zero read after the end.
 */
async function readBody(req: ReceiverHttpRequest, sizes: readonly number[]): Promise<{ body: Buffer; reads: number; problems: string[] }> {
  const problems: string[] = [];
  const declared = req.contentLength;
  if (req.chunked !== (declared === undefined)) problems.push('chunked does not match contentLength');
  if (req.bodyLeft !== declared) problems.push(`bodyLeft ${req.bodyLeft} before reading, expected ${declared}`);
  // a chunked body is complete before reading only when it is empty and the server has parsed its end already
  const completeBefore = req.complete;
  if (declared !== undefined && completeBefore !== (declared === 0)) problems.push(`complete ${completeBefore} before reading a body of ${declared}`);
  const scratch = new Map<number, Buffer>();
  const parts: Buffer[] = [];
  let total = 0;
  let reads = 0;
  for (;;) {
    const size = sizes[reads % sizes.length]!;
    let buf = scratch.get(size);
    if (!buf) scratch.set(size, (buf = Buffer.alloc(size + GUARD, SENTINEL)));
    else buf.fill(SENTINEL, 0, size);
    const left = req.bodyLeft;
    const n = await req.readInto(buf.subarray(0, size));
    reads++;
    if (!untouched(buf, size, size + GUARD)) problems.push(`read ${reads} wrote past the end of its ${size}-byte target`);
    if (n < size && !untouched(buf, n, size)) problems.push(`read ${reads} returned ${n} but wrote beyond that`);
    if (n === 0) break;
    if (left !== undefined && n !== Math.min(size, left)) problems.push(`read ${reads} returned ${n} of ${size} with ${left} left`);
    if (left === undefined && n < size && !req.complete) problems.push(`chunked read ${reads} returned ${n} of ${size} before the end`);
    parts.push(Buffer.from(buf.subarray(0, n)));
    total += n;
    if (declared !== undefined && req.bodyLeft !== declared - total) problems.push(`bodyLeft ${req.bodyLeft} after ${total} bytes`);
  }
  if (!req.complete) problems.push('readInto returned 0 before the body was complete');
  if (declared === undefined && completeBefore && total > 0) problems.push(`complete before reading a chunked body of ${total} bytes`);
  if (declared !== undefined && total !== declared) problems.push(`read ${total} bytes of ${declared}`);
  if (req.bodyLeft !== (declared === undefined ? undefined : 0)) problems.push(`bodyLeft ${req.bodyLeft} at the end`);
  const again = await req.readInto(Buffer.alloc(8));
  if (again !== 0) problems.push(`a read after the end returned ${again}`);
  return { body: Buffer.concat(parts), reads, problems };
}

function report(req: ReceiverHttpRequest, r: { body: Buffer; reads: number; problems: string[] }): BodyReport {
  return {
    method: req.method,
    target: req.target,
    httpVersion: req.httpVersion,
    chunked: req.chunked,
    expectsContinue: req.expectsContinue,
    keepAlive: req.keepAlive,
    length: r.body.length,
    sha256: sha256(r.body),
    reads: r.reads,
    problems: r.problems,
  };
}

const json = (value: unknown): ReceiverHttpReply => ({ body: JSON.stringify(value), contentType: 'application/json' });

/** Reads the body with the target sizes named in `x-plan` (comma separated; default 64 KiB) and answers a BodyReport. */
const echo: ReceiverHttpHandler = async (req) => {
  const plan = (req.headers.get('x-plan') ?? String(64 * KiB)).split(',').map(Number);
  return json(report(req, await readBody(req, plan)));
};

// ---------------------------------------------------------------------------------------------------------------------
// the client side: raw sockets with an HTTP/1.1 response parser, node:http, curl

interface RawResponse {
  status: number;
  headers: Map<string, string>;
  body: Buffer;
}

/** Parses the complete responses at the start of `data` (1xx included); every final response must have a Content-Length. */
function parseResponses(data: Buffer): RawResponse[] {
  const out: RawResponse[] = [];
  let p = 0;
  for (;;) {
    const at = data.indexOf('\r\n\r\n', p, 'latin1');
    if (at < 0) break;
    const lines = data.toString('latin1', p, at).split('\r\n');
    const m = /^HTTP\/1\.1 (\d{3}) [^\r\n]*$/.exec(lines[0]!);
    if (!m) throw new Error(`bad status line ${JSON.stringify(lines[0])}`);
    const headers = new Map<string, string>();
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':');
      headers.set(line.slice(0, colon).toLowerCase(), line.slice(colon + 1).trim());
    }
    const status = Number(m[1]);
    let length = 0;
    if (status >= 200) {
      const cl = headers.get('content-length');
      if (cl === undefined) throw new Error(`response ${status} has no Content-Length`);
      length = Number(cl);
    }
    if (at + 4 + length > data.length) break;
    out.push({ status, headers, body: data.subarray(at + 4, at + 4 + length) });
    p = at + 4 + length;
  }
  return out;
}

class RawClient {
  data = Buffer.alloc(0);
  ended = false;
  isClosed = false;
  error: Error | undefined;
  readonly closed: Promise<void>;
  #waiters: (() => void)[] = [];

  private constructor(readonly socket: net.Socket) {
    socket.on('data', (d: Buffer) => {
      this.data = Buffer.concat([this.data, d]);
      this.#wake();
    });
    socket.on('end', () => {
      this.ended = true;
      this.#wake();
    });
    socket.on('error', (e) => {
      this.error = e;
      this.#wake();
    });
    this.closed = new Promise<void>((resolve) =>
      socket.on('close', () => {
        this.isClosed = true;
        this.#wake();
        resolve();
      }),
    );
  }

  static async connect(port: number): Promise<RawClient> {
    const s = net.connect(port, HOST);
    sockets.push(s);
    await once(s, 'connect');
    s.setNoDelay(true);
    return new RawClient(s);
  }

  #wake(): void {
    for (const w of this.#waiters.splice(0)) w();
  }

  /** Resolves once the bytes are handed to the kernel. */
  write(b: string | Uint8Array): Promise<void> {
    return new Promise<void>((resolve, reject) => this.socket.write(b, (err) => (err ? reject(err) : resolve())));
  }

  /** Writes `data` in pieces cut at `cuts`, yielding between pieces so the server can read each on its own. */
  async writeSplit(data: Buffer, cuts: readonly number[]): Promise<void> {
    let from = 0;
    for (const cut of [...cuts, data.length]) {
      await this.write(data.subarray(from, cut));
      from = cut;
      // bounded pause: lets the server read this piece before the next one arrives (correctness never depends on it)
      await delay(5);
    }
  }

  async until(done: () => boolean, what: string): Promise<void> {
    while (!done()) {
      if (this.ended || this.isClosed || this.error) {
        throw new Error(`the connection ended (${this.error?.message ?? 'EOF'}) before ${what}; received ${JSON.stringify(this.data.toString('latin1').slice(0, 300))}`);
      }
      await new Promise<void>((r) => this.#waiters.push(r));
    }
  }

  /** Waits for `n` final (non-1xx) responses and returns them. */
  async responses(n: number): Promise<RawResponse[]> {
    await this.until(() => parseResponses(this.data).filter((r) => r.status >= 200).length >= n, `${n} responses`);
    return parseResponses(this.data).filter((r) => r.status >= 200);
  }

  /** Waits until the server ended the connection (and it closed). */
  async endOfStream(): Promise<void> {
    await this.closed;
    expect(this.ended || this.error !== undefined).toBe(true);
  }
}

/** A request's bytes: a Content-Length body, a chunked body (given chunks), or none. */
function rawRequest(method: string, target: string, opts: { body?: Buffer; chunks?: Buffer[]; headers?: string[]; version?: string } = {}): Buffer {
  const lines = [`${method} ${target} HTTP/${opts.version ?? '1.1'}`, 'Host: test'];
  if (opts.body) lines.push(`Content-Length: ${opts.body.length}`);
  if (opts.chunks) lines.push('Transfer-Encoding: chunked');
  lines.push(...(opts.headers ?? []));
  const parts: Buffer[] = [Buffer.from(lines.join('\r\n') + '\r\n\r\n', 'latin1')];
  if (opts.body) parts.push(opts.body);
  if (opts.chunks) {
    for (const c of opts.chunks) parts.push(Buffer.from(`${c.length.toString(16)}\r\n`), c, Buffer.from('\r\n'));
    parts.push(Buffer.from('0\r\n\r\n'));
  }
  return Buffer.concat(parts);
}

const reportOf = (r: RawResponse | { body: Buffer }): BodyReport => JSON.parse(r.body.toString('utf8')) as BodyReport;

interface HttpResult {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  localPort: number;
}

/** One request with node:http; `body` as one Buffer (Content-Length) or several (chunked: one chunk per write). */
function httpCall(
  port: number,
  opts: { method?: string; path?: string; headers?: http.OutgoingHttpHeaders; body?: Buffer | Buffer[]; agent?: http.Agent },
): Promise<HttpResult> {
  return new Promise<HttpResult>((resolve, reject) => {
    const headers: http.OutgoingHttpHeaders = { ...opts.headers };
    if (Buffer.isBuffer(opts.body)) headers['content-length'] = opts.body.length;
    const req = http.request({ host: HOST, port, method: opts.method ?? 'PUT', path: opts.path ?? '/', headers, agent: opts.agent ?? false }, (res) => {
      const parts: Buffer[] = [];
      const localPort = res.socket.localPort!;
      res.on('data', (d: Buffer) => parts.push(d));
      res.on('error', reject);
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(parts), localPort }));
    });
    req.on('error', reject);
    if (Array.isArray(opts.body)) {
      for (const b of opts.body) req.write(b);
      req.end();
    } else req.end(opts.body);
  });
}

/** Runs curl with the async execFile (the server runs in this process); resolves with stdout. */
function curl(args: string[], stdin?: Buffer): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    const child = execFile('curl', ['-sS', '--fail-with-body', ...args], { maxBuffer: 4 * MiB, timeout: 30_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`curl failed: ${err.message} ${stderr} ${stdout}`));
      else resolve(stdout);
    });
    if (stdin) child.stdin!.end(stdin);
    else child.stdin!.end();
  });
}

function expectGoodReport(r: BodyReport, body: Buffer): void {
  expect(r.problems).toEqual([]);
  expect(r.length).toBe(body.length);
  expect(r.sha256).toBe(sha256(body));
}

// ---------------------------------------------------------------------------------------------------------------------

describe.each(VARIANTS)('receiver HTTP server: %s', (variant) => {
  const own = variant !== 'node-http';
  const zeroCopy = variant === 'own, zero-copy';
  const start = (handler: ReceiverHttpHandler, options: ReceiverHttpServerOptions = {}) => serve(handler, options, variant);

  // the read mode is a property of the own server; Node's http has one way of reading
  const modeTitle = !own
    ? 'read mode: skipped, the read mode is a property of the own server (Node\'s http has one)'
    : zeroCopy ? 'moves every accepted socket into onread mode on this runtime' : 'reads every connection with data events';
  (own ? it : it.skip)(modeTitle, async () => {
    const { server, port } = await start(echo);
    const agent = new http.Agent({ keepAlive: false });
    agents.push(agent);
    for (let i = 0; i < 3; i++) expect((await httpCall(port, { path: '/mode', body: Buffer.from('x'), agent })).status).toBe(200);
    expect((server as ReceiverHttpServer).stats).toEqual(zeroCopy ? { zeroCopyConnections: 3, copyingConnections: 0 } : { zeroCopyConnections: 0, copyingConnections: 3 });
  });

  describe('bodies arrive byte-exact', () => {
    const sizes = [0, 1, 65535, 65536, 65537, 2 * MiB, 2 * MiB + 1, 5 * MiB];
    it.each(sizes)('a %d-byte body, read with targets of 1 byte (small bodies), 4 KiB, 1 MiB, mixed and larger than the body', async (size) => {
      const { port } = await start(echo);
      const agent = keepAliveAgent();
      const body = randomBytes(size);
      const plans = [String(4 * KiB), String(MiB), `1,${4 * KiB},${MiB},7,${64 * KiB}`, String(size + 4 * KiB)];
      if (size <= 65537) plans.unshift('1');
      for (const plan of plans) {
        const res = await httpCall(port, { path: `/size/${size}`, body, agent, headers: { 'x-plan': plan } });
        expect(res.status).toBe(200);
        expect(res.headers['content-length']).toBe(String(res.body.length));
        const r = reportOf(res);
        expectGoodReport(r, body);
        expect(r).toMatchObject({ method: 'PUT', target: `/size/${size}`, chunked: false });
        if (plan === String(size + 4 * KiB)) expect(r.reads).toBe(size === 0 ? 1 : 2);
      }
      // the same body chunked (node:http sends one chunk per write), read with 4 KiB and mixed targets
      const parts = [body.subarray(0, size >> 2), body.subarray(size >> 2, size - 1), body.subarray(size - 1)].filter((p) => p.length > 0);
      for (const plan of [String(4 * KiB), `1,${4 * KiB},${MiB},7`]) {
        const res = await httpCall(port, { path: '/chunked', body: parts.length ? parts : [Buffer.alloc(0)], agent, headers: { 'x-plan': plan } });
        expect(res.status).toBe(200);
        const r = reportOf(res);
        expectGoodReport(r, body);
        expect(r.chunked).toBe(true);
      }
    });

    it('readAll returns the body, and answers 413 beyond its limit', async () => {
      const { port } = await start(async (req) => {
        const body = await req.readAll(Number(req.headers.get('x-limit')));
        return { body: sha256(body) };
      });
      const body = randomBytes(300 * KiB);
      const ok = await httpCall(port, { body, headers: { 'x-limit': String(300 * KiB) } });
      expect(ok.status).toBe(200);
      expect(ok.body.toString()).toBe(sha256(body));
      const chunkedOk = await httpCall(port, { body: [body.subarray(0, 1000), body.subarray(1000)], headers: { 'x-limit': String(300 * KiB) } });
      expect(chunkedOk.body.toString()).toBe(sha256(body));
      const tooBig = await httpCall(port, { body, headers: { 'x-limit': String(300 * KiB - 1) } });
      expect(tooBig.status).toBe(413);
      expect(tooBig.headers.connection).toBe('close');
      expect(tooBig.body.toString()).toMatch(/larger than 307199 bytes/);
      const chunkedTooBig = await httpCall(port, { body: [body.subarray(0, 1000), body.subarray(1000)], headers: { 'x-limit': String(100 * KiB) } });
      expect(chunkedTooBig.status).toBe(413);
    });
  });

  describe('keep-alive', () => {
    it('serves several requests on one node:http keep-alive connection, each reply with a Content-Length', async () => {
      const { port } = await start(echo);
      const agent = keepAliveAgent();
      const ports = new Set<number>();
      for (let i = 0; i < 5; i++) {
        const body = randomBytes(i * 1000);
        const res = await httpCall(port, { path: `/r${i}`, body, agent });
        expect(res.status).toBe(200);
        expect(res.headers['content-length']).toBe(String(res.body.length));
        // HTTP/1.1 is persistent by default; Node's http says so explicitly
        expect(res.headers.connection).toBe(own ? undefined : 'keep-alive');
        expectGoodReport(reportOf(res), body);
        ports.add(res.localPort);
      }
      expect(ports.size).toBe(1);
    });

    it('serves several requests one after the other on one raw socket, then Connection: close ends it', async () => {
      const { port } = await start(echo);
      const c = await RawClient.connect(port);
      const bodies = [randomBytes(10), Buffer.alloc(0), randomBytes(100 * KiB)];
      for (let i = 0; i < bodies.length; i++) {
        await c.write(rawRequest('POST', `/n${i}`, { body: bodies[i]! }));
        const res = (await c.responses(i + 1))[i]!;
        expect(res.status).toBe(200);
        expect(res.headers.get('connection')).toBe(own ? undefined : 'keep-alive');
        expectGoodReport(reportOf(res), bodies[i]!);
      }
      expect(c.ended).toBe(false);
      const last = randomBytes(5000);
      await c.write(rawRequest('POST', '/last', { body: last, headers: ['Connection: close'] }));
      const res = (await c.responses(4))[3]!;
      expect(res.headers.get('connection')).toBe('close');
      expectGoodReport(reportOf(res), last);
      await c.endOfStream();
      expect(c.error).toBeUndefined();
    });

    it('closes an HTTP/1.0 connection without keep-alive, keeps one with Connection: keep-alive (Host not required)', async () => {
      const { port } = await start(echo);
      const c10 = await RawClient.connect(port);
      await c10.write('GET /old HTTP/1.0\r\n\r\n');
      const [plain] = await c10.responses(1);
      expect(plain!.status).toBe(200);
      expect(plain!.headers.get('connection')).toBe('close');
      expect(reportOf(plain!).httpVersion).toBe('1.0');
      await c10.endOfStream();

      const ka = await RawClient.connect(port);
      for (let i = 1; i <= 2; i++) {
        const body = randomBytes(i * 777);
        await ka.write(rawRequest('POST', '/ka', { body, version: '1.0', headers: ['Connection: keep-alive'] }));
        const res = (await ka.responses(i))[i - 1]!;
        expect(res.headers.get('connection')).toBe('keep-alive');
        expectGoodReport(reportOf(res), body);
        expect(reportOf(res).keepAlive).toBe(true);
      }
      expect(ka.ended).toBe(false);
    });
  });

  describe('pipelining', () => {
    /** Three requests (Content-Length body, chunked body over 64 KiB, no body) and their expected bodies. */
    function pipeline(): { bytes: Buffer; bodies: Buffer[]; heads: number[] } {
      const b1 = randomBytes(1000);
      const b2 = randomBytes(70_000);
      const chunks = [b2.subarray(0, 5000), b2.subarray(5000, 65000), b2.subarray(65000)];
      const r1 = rawRequest('POST', '/one', { body: b1 });
      const r2 = rawRequest('PUT', '/two', { chunks });
      const r3 = rawRequest('GET', '/three');
      return { bytes: Buffer.concat([r1, r2, r3]), bodies: [b1, b2, Buffer.alloc(0)], heads: [0, r1.length, r1.length + r2.length] };
    }

    async function runPipeline(split: (p: ReturnType<typeof pipeline>) => number[]): Promise<void> {
      let inFlight = 0;
      let maxInFlight = 0;
      const { port } = await start(async (req) => {
        maxInFlight = Math.max(maxInFlight, ++inFlight);
        try {
          await delay(1); // a handler that takes a moment: the next request must still wait its turn
          return await echo(req);
        } finally {
          inFlight--;
        }
      });
      const p = pipeline();
      const c = await RawClient.connect(port);
      const cuts = split(p);
      if (cuts.length === 0) await c.write(p.bytes);
      else await c.writeSplit(p.bytes, cuts);
      const res = await c.responses(3);
      expect(res.map((r) => reportOf(r).target)).toEqual(['/one', '/two', '/three']);
      res.forEach((r, i) => {
        expect(r.status).toBe(200);
        expectGoodReport(reportOf(r), p.bodies[i]!);
      });
      expect(maxInFlight).toBe(1);
      expect(c.ended).toBe(false);
    }

    it('answers three requests written in one socket write in order', async () => {
      await runPipeline(() => []);
    });
    it('… split inside the request lines', async () => {
      await runPipeline((p) => [p.heads[0]! + 3, p.heads[1]! + 6, p.heads[2]! + 1]);
    });
    it('… split inside CRLF CRLF', async () => {
      await runPipeline((p) => [0, 1, 2].map((i) => p.bytes.indexOf('\r\n\r\n', p.heads[i]) + 2 + (i % 2)));
    });
    it('… split inside the bodies and the chunk framing', async () => {
      await runPipeline((p) => {
        const body1 = p.bytes.indexOf('\r\n\r\n') + 4;
        const body2 = p.bytes.indexOf('\r\n\r\n', p.heads[1]) + 4;
        return [body1 + 1, body1 + 999, body2 + 2, body2 + 3000, p.heads[2]! - 3];
      });
    });
    it('… written one byte at a time (small requests)', async () => {
      const { port } = await start(echo);
      const bodies = [randomBytes(20), randomBytes(7)];
      const bytes = Buffer.concat([rawRequest('POST', '/a', { body: bodies[0]! }), rawRequest('POST', '/b', { chunks: [bodies[1]!.subarray(0, 3), bodies[1]!.subarray(3)] })]);
      const c = await RawClient.connect(port);
      for (let i = 0; i < bytes.length; i++) {
        await c.write(bytes.subarray(i, i + 1));
        await new Promise((r) => setImmediate(r));
      }
      const res = await c.responses(2);
      expectGoodReport(reportOf(res[0]!), bodies[0]!);
      expectGoodReport(reportOf(res[1]!), bodies[1]!);
    });
    it('answers pipelined requests with 1 MiB bodies in order', async () => {
      const { port } = await start(echo);
      const bodies = [randomBytes(MiB + 3), randomBytes(MiB - 3), randomBytes(10)];
      const c = await RawClient.connect(port);
      await c.write(Buffer.concat(bodies.map((b, i) => rawRequest('POST', `/big${i}`, { body: b, headers: [`X-Plan: ${i === 1 ? 100_000 : MiB}`] }))));
      const res = await c.responses(3);
      res.forEach((r, i) => {
        expect(reportOf(r).target).toBe(`/big${i}`);
        expectGoodReport(reportOf(r), bodies[i]!);
      });
    });
  });

  describe('chunked bodies', () => {
    it('curl -T - from a pipe', async () => {
      const { port } = await start(echo);
      const body = randomBytes(3 * MiB + 5);
      const out = await curl(['-T', '-', '-H', `X-Plan: ${MiB},${4 * KiB}`, `http://${HOST}:${port}/piped`], body);
      const r = JSON.parse(out) as BodyReport;
      expect(r.chunked).toBe(true);
      expect(r.method).toBe('PUT');
      expectGoodReport(r, body);
    });

    it('chunk extensions, upper-case hex with leading zeros and trailers', async () => {
      const { port } = await start(echo);
      const c = await RawClient.connect(port);
      const head = 'POST /ext HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n';
      // Node's parser refuses whitespace before a chunk extension (a stricter reading of RFC 9112 §7.1.1)
      const framed = `5;name=value\r\nhello\r\n6${own ? ' ; ' : ';'}x="y"\r\n world\r\n000A\r\n0123456789\r\n0;last\r\nTrailer-A: 1\r\nTrailer-B: two\r\n\r\n`;
      await c.write(head + framed);
      const [res] = await c.responses(1);
      expect(res!.status).toBe(200);
      expectGoodReport(reportOf(res!), Buffer.from('hello world0123456789'));
      // the connection stays usable after a body with trailers
      await c.write(rawRequest('POST', '/after', { body: Buffer.from('x') }));
      expect(reportOf((await c.responses(2))[1]!).target).toBe('/after');
    });

    it('many tiny chunks, read with 1-byte and 4 KiB targets', async () => {
      const { port } = await start(echo);
      const body = randomBytes(3000);
      const chunks = Array.from({ length: 3000 }, (_, i) => body.subarray(i, i + 1));
      const c = await RawClient.connect(port);
      await c.write(Buffer.concat([rawRequest('PUT', '/tiny1', { chunks, headers: ['X-Plan: 1'] }), rawRequest('PUT', '/tiny2', { chunks, headers: [`X-Plan: ${4 * KiB}`] })]));
      const res = await c.responses(2);
      expectGoodReport(reportOf(res[0]!), body);
      expectGoodReport(reportOf(res[1]!), body);
    });

    it('chunk framing split across writes at every awkward point', async () => {
      const { port } = await start(echo);
      const data = randomBytes(100);
      const bytes = Buffer.concat([
        Buffer.from('PUT /split HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nX-Plan: 7\r\n\r\n'),
        Buffer.from('3'),
        Buffer.from('2;e=1\r'),
        Buffer.from('\n'),
        data.subarray(0, 20),
        data.subarray(20, 50),
        Buffer.from('\r'),
        Buffer.from('\n3'),
        Buffer.from('2\r\n'),
        data.subarray(50, 100),
        Buffer.from('\r\n0\r'),
        Buffer.from('\nX-T: 1\r\n'),
        Buffer.from('\r'),
        Buffer.from('\n'),
      ]);
      // cut between the pieces above
      const pieces = [72, 1, 6, 1, 20, 30, 1, 2, 3, 50, 4, 9, 1, 1];
      const headLen = bytes.indexOf('\r\n\r\n') + 4;
      pieces[0] = headLen;
      const cuts: number[] = [];
      let at = 0;
      for (const len of pieces.slice(0, -1)) cuts.push((at += len));
      const c = await RawClient.connect(port);
      await c.writeSplit(bytes, cuts);
      const [res] = await c.responses(1);
      expectGoodReport(reportOf(res!), data);
    });

    it('a chunk larger than 64 KiB, and one of exactly 64 KiB', async () => {
      const { port } = await start(echo);
      const body = randomBytes(300 * KiB + 64 * KiB);
      const c = await RawClient.connect(port);
      await c.write(rawRequest('PUT', '/big', { chunks: [body.subarray(0, 300 * KiB), body.subarray(300 * KiB)], headers: [`X-Plan: ${MiB}`] }));
      expectGoodReport(reportOf((await c.responses(1))[0]!), body);
    });

    const malformed: [string, string, RegExp][] = [
      ['bad hex in the chunk size', '5\r\nhello\r\nzz\r\nabc\r\n0\r\n\r\n', /invalid chunk size line "zz"/],
      ['no CRLF after the chunk data', '5\r\nhelloXX\r\n0\r\n\r\n', /no CRLF after chunk data/],
      ['a chunk size line ended by a bare LF', '5\nhello\r\n0\r\n\r\n', /line not ended by CRLF/],
      ['an empty chunk size', '\r\nhello\r\n0\r\n\r\n', /line not ended by CRLF|invalid chunk size/],
    ];
    it.each(malformed)('%s: the read rejects with a 400, the reply is 400 and the connection closes', async (_name, framed, message) => {
      const errors: unknown[] = [];
      const { port } = await start(async (req) => {
        try {
          await readBody(req, [4 * KiB]);
        } catch (err) {
          errors.push(err);
          throw err;
        }
        return { body: 'read a malformed body' };
      });
      const c = await RawClient.connect(port);
      await c.write(`PUT /bad HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n${framed}`);
      const [res] = await c.responses(1);
      expect(res!.status).toBe(400);
      expect(res!.headers.get('connection')).toBe('close');
      // the wording is each parser's own; the status, the failed read and the closed connection are the same
      expect(res!.body.toString()).toMatch(own ? message : /malformed request body: Parse Error/);
      expect(errors).toHaveLength(1);
      expect(errors[0]).toBeInstanceOf(HttpProtocolError);
      expect((errors[0] as HttpProtocolError).status).toBe(400);
      await c.endOfStream();
    });
  });

  describe('Expect: 100-continue', () => {
    it('sends 100 Continue only once the handler reads, then reads the body', async () => {
      const entered = signal();
      const gate = signal();
      const { port } = await start(async (req) => {
        entered.resolve();
        await gate.promise;
        return echo(req);
      });
      const body = randomBytes(200 * KiB);
      const c = await RawClient.connect(port);
      await c.write(`POST /cont HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: ${body.length}\r\n\r\n`);
      await entered.promise;
      // bounded wait to show the absence of an early 100 Continue: it would have been written before the handler ran
      await delay(50);
      expect(c.data.length).toBe(0);
      gate.resolve();
      await c.until(() => c.data.length >= 25, 'the 100 Continue');
      expect(c.data.toString('latin1')).toBe('HTTP/1.1 100 Continue\r\n\r\n');
      await c.write(body);
      const res = await c.responses(1);
      expect(res[0]!.status).toBe(200);
      expectGoodReport(reportOf(res[0]!), body);
      expect(reportOf(res[0]!).expectsContinue).toBe(true);
      expect(parseResponses(c.data).map((r) => r.status)).toEqual([100, 200]);
    });

    it('sends no 100 Continue when the handler answers without reading', async () => {
      const { port } = await start(async () => ({ status: 403, body: 'no' }));
      const c = await RawClient.connect(port);
      await c.write(`POST /deny HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 1000000\r\n\r\n`);
      const [res] = await c.responses(1);
      expect(res!.status).toBe(403);
      expect(res!.headers.get('connection')).toBe('close');
      expect(parseResponses(c.data).map((r) => r.status)).toEqual([403]);
      await c.endOfStream();
    });

    it('curl --data-binary @file of more than 1 MiB with Expect: 100-continue', async () => {
      const { port } = await start(echo);
      const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'receiver-http-'));
      tempDirs.push(dir);
      const body = randomBytes(MiB + 12345);
      const file = path.join(dir, 'body');
      await fsp.writeFile(file, body);
      // a long expect100 timeout: the body is only sent once the server answered 100 Continue
      const out = await curl(['--expect100-timeout', '30', '-H', 'Expect: 100-continue', '--data-binary', `@${file}`, `http://${HOST}:${port}/curl`]);
      const r = JSON.parse(out) as BodyReport;
      expect(r.expectsContinue).toBe(true);
      expect(r.method).toBe('POST');
      expectGoodReport(r, body);
    });

    it('answers an unknown expectation with 417 and closes', async () => {
      let called = false;
      const { port } = await start(async () => {
        called = true;
        return {};
      });
      const c = await RawClient.connect(port);
      await c.write('POST /x HTTP/1.1\r\nHost: t\r\nExpect: 200-ok\r\nContent-Length: 3\r\n\r\nabc');
      const [res] = await c.responses(1);
      expect(res!.status).toBe(417);
      expect(res!.body.toString()).toMatch(/unsupported expectation "200-ok"/);
      await c.endOfStream();
      expect(called).toBe(false);
    });
  });

  describe('bad request heads get an error status and a closed connection', () => {
    const bad: [string, string, number, RegExp][] = [
      ['a garbage request line', 'HELLO THERE\r\n\r\n', 400, /malformed request line/],
      ['a bad method token', 'GE(T / HTTP/1.1\r\nHost: t\r\n\r\n', 400, /malformed request method/],
      ['a bad HTTP version', 'GET / HTTP/one\r\nHost: t\r\n\r\n', 400, /malformed HTTP version/],
      ['HTTP/2.0', 'GET / HTTP/2.0\r\nHost: t\r\n\r\n', 505, /HTTP version 2.0 is not supported/],
      ['a missing Host on HTTP/1.1', 'GET / HTTP/1.1\r\nAccept: */*\r\n\r\n', 400, /missing required Host header/],
      ['Content-Length and Transfer-Encoding', 'POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n', 400, /both Content-Length and Transfer-Encoding/],
      ['Transfer-Encoding: gzip', 'POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n', 501, /unsupported transfer encoding "gzip"/],
      ['Transfer-Encoding: gzip, chunked', 'POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n', 501, /unsupported transfer encoding/],
      ['Transfer-Encoding in HTTP/1.0', 'POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n', 400, /Transfer-Encoding in an HTTP\/1.0 request/],
      ['a non-numeric Content-Length', 'POST / HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n', 400, /invalid Content-Length "abc"/],
      ['a negative Content-Length', 'POST / HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n', 400, /invalid Content-Length "-1"/],
      ['conflicting Content-Lengths', 'POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!', 400, /repeated Content-Length header/],
      ['repeated equal Content-Lengths', 'POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello', 400, /repeated Content-Length header/],
      ['a Content-Length list', 'POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5, 5\r\n\r\nhello', 400, /invalid Content-Length "5, 5"/],
      ['a folded header', 'GET / HTTP/1.1\r\nHost: t\r\nX-Long: a\r\n  b\r\n\r\n', 400, /folded header/],
      ['a header without a colon', 'GET / HTTP/1.1\r\nHost: t\r\nNoColon\r\n\r\n', 400, /malformed header line/],
      ['a space before the colon', 'GET / HTTP/1.1\r\nHost : t\r\n\r\n', 400, /malformed header line/],
      ['a control character in a value', 'GET / HTTP/1.1\r\nHost: t\r\nX-A: a\x01b\r\n\r\n', 400, /invalid character in header X-A/],
      ['a bare LF in the head', 'GET / HTTP/1.1\nHost: t\r\n\r\n', 400, /bare LF/],
      ['a head over 32 KiB (complete)', `GET / HTTP/1.1\r\nHost: t\r\nX-Big: ${'a'.repeat(40 * KiB)}\r\n\r\n`, 431, /request head larger than 32768 bytes/],
      ['a head over 32 KiB (never ending)', `GET / HTTP/1.1\r\nHost: t\r\nX-Big: ${'a'.repeat(33 * KiB)}`, 431, /request head larger than 32768 bytes/],
    ];
    it.each(bad)('%s', async (_name, head, status, message) => {
      let called = false;
      const { port } = await start(async () => {
        called = true;
        return {};
      });
      const c = await RawClient.connect(port);
      // a valid request after the bad one must not be answered
      await c.write(head + (head.endsWith('\r\n\r\n') ? 'GET /next HTTP/1.1\r\nHost: t\r\n\r\n' : ''));
      const [res] = await c.responses(1);
      expect(res!.status).toBe(status);
      expect(res!.headers.get('connection')).toBe('close');
      expect(res!.headers.get('content-type')).toMatch(/^text\/plain/);
      // the wording is each parser's own (Node's says "Parse Error: …"); the status and the closed connection are the same
      if (own) expect(res!.body.toString()).toMatch(message);
      await c.endOfStream();
      expect(c.error).toBeUndefined();
      expect(parseResponses(c.data)).toHaveLength(1);
      expect(called).toBe(false);
    });

    it('accepts empty lines before the request line', async () => {
      const { port } = await start(echo);
      const c = await RawClient.connect(port);
      await c.write('\r\nPOST /eq HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello');
      const [res] = await c.responses(1);
      expect(res!.status).toBe(200);
      expectGoodReport(reportOf(res!), Buffer.from('hello'));
    });

    it('honours a smaller maxHeadBytes', async () => {
      const { port } = await start(echo, { maxHeadBytes: 1024 });
      const c = await RawClient.connect(port);
      await c.write(`GET / HTTP/1.1\r\nHost: t\r\nX-Big: ${'a'.repeat(2000)}\r\n\r\n`);
      const [res] = await c.responses(1);
      expect(res!.status).toBe(431);
      await c.endOfStream();
    });
  });

  describe('handler outcomes', () => {
    it('a handler that throws gets a 500 with its message and Connection: close', async () => {
      const { port } = await start(async () => {
        throw new Error('the disk caught fire');
      });
      const c = await RawClient.connect(port);
      await c.write(rawRequest('POST', '/x', { body: Buffer.from('abc') }));
      const [res] = await c.responses(1);
      expect(res!.status).toBe(500);
      expect(res!.headers.get('connection')).toBe('close');
      expect(res!.body.toString()).toBe('the disk caught fire\n');
      await c.endOfStream();
    });

    it('a handler that throws synchronously gets a 500 too', async () => {
      const { port } = await start(((): Promise<ReceiverHttpReply> => {
        throw new Error('sync failure');
      }) as ReceiverHttpHandler);
      const res = await httpCall(port, { method: 'GET' });
      expect(res.status).toBe(500);
      expect(res.body.toString()).toBe('sync failure\n');
    });

    it('a handler that throws HttpProtocolError(413) gets a 413', async () => {
      const { port } = await start(async () => {
        throw new HttpProtocolError(413, 'chunk larger than the slab');
      });
      const res = await httpCall(port, { body: randomBytes(100) });
      expect(res.status).toBe(413);
      expect(res.headers.connection).toBe('close');
      expect(res.body.toString()).toBe('chunk larger than the slab\n');
    });

    it('a reply with a status, a content type, close and onSent', async () => {
      let sent = 0;
      const { port } = await start(async () => ({ status: 201, body: new Uint8Array([1, 2, 3]), contentType: 'application/x-t', close: true, onSent: () => sent++ }));
      const c = await RawClient.connect(port);
      await c.write(rawRequest('GET', '/'));
      const [res] = await c.responses(1);
      expect(res!.status).toBe(201);
      expect(res!.headers.get('content-type')).toBe('application/x-t');
      expect(res!.headers.get('connection')).toBe('close');
      expect([...res!.body]).toEqual([1, 2, 3]);
      await c.endOfStream();
      expect(sent).toBe(1);
    });

    it('a reply that leaves an 8 MiB body unread arrives intact (raw socket) and the connection closes', async () => {
      const { port } = await start(async () => ({ status: 409, body: 'early answer' }));
      const c = await RawClient.connect(port);
      const body = randomBytes(8 * MiB);
      // the whole request in one write: the client keeps sending while the server has answered
      const written = c.write(rawRequest('PUT', '/unread', { body }));
      const [res] = await c.responses(1);
      expect(res!.status).toBe(409);
      expect(res!.body.toString()).toBe('early answer');
      expect(res!.headers.get('connection')).toBe('close');
      await written;
      await c.endOfStream();
      expect(c.error).toBeUndefined();
    });

    it('a reply given while a body read is pending arrives intact, and the rest of the body is drained (no reset)', async () => {
      const readFailed = signal<unknown>();
      const { port } = await start(async (req) => {
        // a read that cannot be satisfied yet: the reply below abandons it
        req.readInto(Buffer.alloc(4 * MiB)).catch((err: unknown) => readFailed.resolve(err));
        return { status: 503, body: 'gave up while reading' };
      });
      const c = await RawClient.connect(port);
      // a client that sends its whole body before it reads the reply
      c.socket.pause();
      await c.write(rawRequest('PUT', '/abandon', { body: randomBytes(8 * MiB) }));
      c.socket.resume();
      const [res] = await c.responses(1);
      expect(res!.status).toBe(503);
      expect(res!.body.toString()).toBe('gave up while reading');
      expect(res!.headers.get('connection')).toBe('close');
      await c.endOfStream();
      expect(c.error).toBeUndefined();
      expect(((await readFailed.promise) as Error).message).toMatch(/answered while its body was being read/);
    });

    it('a reply that leaves a body unread arrives intact at node:http', async () => {
      const { port } = await start(async (req) => {
        // read a little of it first
        await req.readInto(Buffer.alloc(1000));
        return { status: 409, body: 'partly read' };
      });
      const res = await httpCall(port, { body: randomBytes(8 * MiB) });
      expect(res.status).toBe(409);
      expect(res.body.toString()).toBe('partly read');
      expect(res.headers.connection).toBe('close');
    });
  });

  describe('request API misuse', () => {
    it('a second read while one is pending rejects; an empty target reads 0; a read after the end reads 0', async () => {
      const outcomes: string[] = [];
      const bothIssued = signal();
      const { port } = await start(async (req) => {
        expect(await req.readInto(new Uint8Array(0))).toBe(0);
        // only the head and 100 body bytes have been sent: this read stays pending
        const first = req.readInto(Buffer.alloc(2000));
        const second = req.readInto(Buffer.alloc(10)).then(
          () => 'second read resolved',
          (e: Error) => e.message,
        );
        bothIssued.resolve();
        outcomes.push(await second, `first read ${await first}`, `then ${await req.readInto(Buffer.alloc(10))}`);
        return { body: 'ok' };
      });
      const c = await RawClient.connect(port);
      const body = randomBytes(2000);
      await c.write(Buffer.concat([Buffer.from('PUT / HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n\r\n'), body.subarray(0, 100)]));
      await bothIssued.promise;
      await c.write(body.subarray(100));
      const [res] = await c.responses(1);
      expect(res!.status).toBe(200);
      expect(outcomes).toEqual(['a body read is already pending on this request', 'first read 2000', 'then 0']);
    });

    it('a read of a request that was answered rejects', async () => {
      let kept: ReceiverHttpRequest | undefined;
      const { port } = await start(async (req) => {
        kept = req;
        return { body: 'answered without reading' };
      });
      const c = await RawClient.connect(port);
      await c.write(`PUT / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n${'x'.repeat(50)}`);
      await c.responses(1);
      await expect(kept!.readInto(Buffer.alloc(10))).rejects.toThrow(/closed before the request body was read/);
    });
  });

  describe('disconnects', () => {
    it('a client that disconnects mid-body rejects the pending read; other connections are still served', async () => {
      const failed = signal<unknown>();
      const entered = signal();
      const { port } = await start(async (req) => {
        if (req.target === '/ok') return echo(req);
        entered.resolve();
        try {
          await readBody(req, [MiB]);
        } catch (err) {
          failed.resolve(err);
          throw err;
        }
        return {};
      });
      const c = await RawClient.connect(port);
      await c.write(`PUT /cut HTTP/1.1\r\nHost: t\r\nContent-Length: ${4 * MiB}\r\n\r\n`);
      await c.write(randomBytes(100 * KiB));
      await entered.promise;
      c.socket.destroy();
      const err = await failed.promise;
      expect(err).toBeInstanceOf(Error);
      expect((err as Error).message).toMatch(/before the request body was complete|connection/);
      const body = randomBytes(12345);
      const res = await httpCall(port, { path: '/ok', body });
      expectGoodReport(reportOf(res), body);
    });

    it('a client that half-closes mid-body rejects the read and still gets the handler reply, with Connection: close', async () => {
      const { port } = await start(async (req) => {
        try {
          await readBody(req, [64 * KiB]);
          return { body: 'complete?' };
        } catch (err) {
          return { status: 400, body: `incomplete: ${(err as Error).message}` };
        }
      });
      const c = await RawClient.connect(port);
      await c.write(`PUT /half HTTP/1.1\r\nHost: t\r\nContent-Length: ${MiB}\r\n\r\n`);
      await c.write(randomBytes(1000));
      c.socket.end();
      const [res] = await c.responses(1);
      expect(res!.status).toBe(400);
      expect(res!.body.toString()).toMatch(/^incomplete: the client closed the connection before the request body was complete/);
      expect(res!.headers.get('connection')).toBe('close');
      await c.endOfStream();
    });
  });

  describe('closing', () => {
    it('close(): no new connections, idle ones close, a request in progress gets its reply with Connection: close, then closed resolves', async () => {
      const entered = signal();
      const gate = signal();
      const { server, port } = await start(async (req) => {
        if (req.target === '/slow') {
          entered.resolve();
          await gate.promise;
        }
        return echo(req);
      });
      const idle = await RawClient.connect(port);
      await idle.write(rawRequest('GET', '/quick'));
      await idle.responses(1);
      const busy = await RawClient.connect(port);
      const body = randomBytes(50 * KiB);
      await busy.write(rawRequest('POST', '/slow', { body }));
      await entered.promise;

      let closedResolved = false;
      void server.closed.then(() => (closedResolved = true));
      server.close();
      await idle.endOfStream();
      await expect(new Promise((resolve, reject) => net.connect(port, HOST).on('connect', resolve).on('error', reject))).rejects.toMatchObject({ code: 'ECONNREFUSED' });
      expect(closedResolved).toBe(false);

      gate.resolve();
      const [res] = await busy.responses(1);
      expect(res!.status).toBe(200);
      expect(res!.headers.get('connection')).toBe('close');
      expectGoodReport(reportOf(res!), body);
      await busy.endOfStream();
      await server.closed;
      expect(closedResolved).toBe(true);
    });

    it('close() with no connections resolves closed', async () => {
      const { server } = await start(echo);
      server.close();
      await server.closed;
    });

    it('closeAllConnections() rejects a pending read', async () => {
      const reading = signal();
      const failed = signal<unknown>();
      const { server, port } = await start(async (req) => {
        const p = req.readInto(Buffer.alloc(MiB));
        reading.resolve();
        try {
          await p;
        } catch (err) {
          failed.resolve(err);
        }
        return {};
      });
      const c = await RawClient.connect(port);
      await c.write(`PUT /x HTTP/1.1\r\nHost: t\r\nContent-Length: ${MiB}\r\n\r\n${'a'.repeat(100)}`);
      await reading.promise;
      server.closeAllConnections();
      expect(await failed.promise).toBeInstanceOf(Error);
      await c.closed;
      server.close();
      await server.closed;
    });

    it('keepAliveTimeoutMs closes an idle connection', async () => {
      const { port } = await start(echo, { keepAliveTimeoutMs: 200 });
      const c = await RawClient.connect(port);
      await c.write(rawRequest('GET', '/'));
      await c.responses(1);
      const t0 = Date.now();
      await c.closed;
      const idleFor = Date.now() - t0;
      expect(idleFor).toBeGreaterThanOrEqual(150);
      // (the default keep-alive is 240 s: a server that ignored the option would outlast the test's timeout)
    });

    it('keepAliveTimeoutMs rejects the read of a stalled body and closes', async () => {
      const failed = signal<unknown>();
      const { port } = await start(
        async (req) => {
          try {
            await readBody(req, [64 * KiB]);
          } catch (err) {
            failed.resolve(err);
            throw err;
          }
          return {};
        },
        { keepAliveTimeoutMs: 200 },
      );
      const c = await RawClient.connect(port);
      await c.write(`PUT /stall HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n${'a'.repeat(10)}`);
      expect(((await failed.promise) as Error).message).toMatch(/timed out/);
      await c.closed;
    });

    it('keepAliveTimeoutMs does not cut a handler that works longer than the timeout', async () => {
      const { port } = await start(
        async (req) => {
          const body = await readBody(req, [64 * KiB]);
          await delay(450); // longer than the timeout, with no body read pending
          return json(report(req, body));
        },
        { keepAliveTimeoutMs: 200 },
      );
      const body = randomBytes(1000);
      const res = await httpCall(port, { body });
      expect(res.status).toBe(200);
      expectGoodReport(reportOf(res), body);
    });
  });

  describe('concurrency', () => {
    it('4 connections × 16 × 2 MiB bodies read into separate buffers: no cross-talk (SHA-256 of every body)', async () => {
      const CONNECTIONS = 4;
      const REQUESTS = 16;
      const SIZE = 2 * MiB;
      const pieces = [MiB, 300_000, 64 * KiB, 1, 4093];
      const kept: { target: string; buf: Buffer; sha: string }[] = [];
      const problems: string[] = [];
      const { port } = await start(async (req) => {
        // a fresh buffer per request, read in pieces: every read lands exactly in its own target
        const buf = Buffer.alloc(SIZE + GUARD, SENTINEL);
        let off = 0;
        let i = 0;
        while (off < SIZE) {
          const want = Math.min(pieces[i++ % pieces.length]!, SIZE - off);
          const n = await req.readInto(buf.subarray(off, off + want));
          if (n !== want) problems.push(`${req.target}: read ${n} of ${want}`);
          if (!untouched(buf, off + n, Math.min(off + n + GUARD, SIZE + GUARD))) problems.push(`${req.target}: a read wrote past its target`);
          off += n;
        }
        if (!untouched(buf, SIZE, SIZE + GUARD)) problems.push(`${req.target}: the guard was overwritten`);
        if ((await req.readInto(Buffer.alloc(1))) !== 0 || !req.complete) problems.push(`${req.target}: not at the end`);
        const sha = sha256(buf.subarray(0, SIZE));
        kept.push({ target: req.target, buf, sha });
        return { body: `${req.target} ${sha}` };
      });

      const expected = new Map<string, string>();
      const body = (conn: number, i: number): Buffer => {
        const b = randomBytes(SIZE);
        expected.set(`/c${conn}/r${i}`, sha256(b));
        return b;
      };
      const viaAgent = async (conn: number): Promise<string[]> => {
        const agent = keepAliveAgent();
        const out: string[] = [];
        for (let i = 0; i < REQUESTS; i++) out.push((await httpCall(port, { path: `/c${conn}/r${i}`, body: body(conn, i), agent })).body.toString());
        return out;
      };
      const pipelined = async (conn: number): Promise<string[]> => {
        const c = await RawClient.connect(port);
        for (let i = 0; i < REQUESTS; i++) void c.write(rawRequest('PUT', `/c${conn}/r${i}`, { body: body(conn, i) }));
        return (await c.responses(REQUESTS)).map((r) => r.body.toString());
      };
      const answers = await Promise.all([viaAgent(0), viaAgent(1), pipelined(2), pipelined(3)]);

      expect(problems).toEqual([]);
      for (let conn = 0; conn < CONNECTIONS; conn++) {
        expect(answers[conn]).toEqual(Array.from({ length: REQUESTS }, (_, i) => `/c${conn}/r${i} ${expected.get(`/c${conn}/r${i}`)}`));
      }
      // no later read touched a buffer whose request was answered
      expect(kept).toHaveLength(CONNECTIONS * REQUESTS);
      for (const k of kept) expect(sha256(k.buf.subarray(0, SIZE))).toBe(k.sha);
      for (const k of kept) expect(untouched(k.buf, SIZE, SIZE + GUARD)).toBe(true);
    });
  });
});

