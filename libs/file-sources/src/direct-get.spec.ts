import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { createServer as createNetServer, type Server as NetServer, type Socket } from 'node:net';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createFileSources, type FileSourcesOptions } from './provider.js';
import { DirectResponse, directGetEligible, type DirectGetOptions, type DirectSink } from './direct-get.js';
import { SourceHostPolicy } from './ip-policy.js';
import { startImageServer, type ImageServer, type ImageServerOptions } from './test-support/image-server.js';
import { compressWith, padTo512, RecordingProgress, sha } from './test-support/images.js';

let dir: string;
const closers: Array<() => Promise<void>> = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'direct-get-'));
});
afterEach(async () => {
  await Promise.all(closers.splice(0).map((c) => c()));
  await rm(dir, { recursive: true, force: true });
});

async function serve(o: ImageServerOptions): Promise<ImageServer> {
  const s = await startImageServer(o);
  closers.push(() => s.close());
  return s;
}

/** A TCP server that answers every connection with `answer` (raw bytes), then closes. */
async function rawServer(answer: Buffer): Promise<string> {
  const sockets = new Set<Socket>();
  const srv: NetServer = createNetServer((sock) => {
    sockets.add(sock);
    sock.on('close', () => sockets.delete(sock));
    sock.once('data', () => sock.end(answer));
    sock.on('error', () => undefined);
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  closers.push(async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((r) => srv.close(() => r()));
  });
  const { port } = srv.address() as { port: number };
  return `http://127.0.0.1:${port}/img`;
}

const OPTIONS: DirectGetOptions = { policy: new SourceHostPolicy(['127.0.0.1']), headers: { 'user-agent': 'test' }, connectTimeoutMs: 5000 };
const FAST: FileSourcesOptions = { allowSourceHosts: ['127.0.0.1'], retry: { baseDelayMs: 10, maxDelayMs: 50, limit: 3 } };

/**
 * A sink with small regions whose room the test opens: `room` regions may be committed before `hasRoom` turns
 * false, and `open()` gives more.
 */
class GatedSink implements DirectSink {
  readonly received: Buffer[] = [];
  #buf = Buffer.alloc(4096);
  #room: number;
  #waiters: Array<() => void> = [];
  constructor(room: number) {
    this.#room = room;
  }
  get hasRoom(): boolean {
    return this.#room > 0;
  }
  readRegion(max: number): Buffer | undefined {
    return this.#room > 0 ? this.#buf.subarray(0, Math.min(this.#buf.length, Math.max(1, max))) : undefined;
  }
  commitRead(n: number): void {
    this.received.push(Buffer.from(this.#buf.subarray(0, n)));
    this.#room--;
  }
  async whenRoom(): Promise<void> {
    while (this.#room <= 0) await new Promise<void>((r) => this.#waiters.push(r));
  }
  async write(chunk: Buffer): Promise<void> {
    await this.whenRoom();
    this.received.push(Buffer.from(chunk));
    this.#room--;
  }
  open(regions: number): void {
    this.#room += regions;
    for (const w of this.#waiters.splice(0)) w();
  }
  get bytes(): Buffer {
    return Buffer.concat(this.received);
  }
}

describe('direct HTTP body reads', () => {
  it('reads the body into the sink regions, stops reading while the sink has no room and goes on when it has', async () => {
    const body = randomBytes(1 << 20);
    const srv = await serve({ body });
    const res = await DirectResponse.open(new URL(`${srv.url}/img`), {}, OPTIONS, new AbortController().signal);
    expect([res.status, res.contentLength, res.direct]).toEqual([200, body.length, true]);
    const sink = new GatedSink(8);
    let seen = 0;
    const done = res.pumpInto(sink, (n) => (seen += n), new AbortController().signal);
    // The sink gives room for 8 small regions at a time; the rest waits until the test opens more.
    for (let i = 0; i < 2000 && seen < body.length; i++) {
      await new Promise((r) => setTimeout(r, 1));
      if (!sink.hasRoom) sink.open(64);
    }
    await done;
    expect(sink.bytes.equals(body)).toBe(true);
    expect(seen).toBe(body.length);
    expect(res.stats.pauses).toBeGreaterThan(0);
    expect(res.stats.directBytes).toBeGreaterThan(body.length / 2);
    expect(res.stats.directBytes + res.stats.copiedBytes).toBe(body.length);
    expect(srv.requests).toHaveLength(1);
    expect(srv.requests[0]!.userAgent).toBe('test');
  });

  it('takes no byte past the Content-Length', async () => {
    const url = await rawServer(Buffer.from('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789abcdefghij'));
    const res = await DirectResponse.open(new URL(url), {}, OPTIONS, new AbortController().signal);
    const sink = new GatedSink(1000);
    await res.pumpInto(sink, () => undefined, new AbortController().signal);
    expect(sink.bytes.toString()).toBe('0123456789');
  });

  it('fails a body cut short, naming how much arrived', async () => {
    const url = await rawServer(Buffer.from('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789abcdefghij'));
    const res = await DirectResponse.open(new URL(url), {}, OPTIONS, new AbortController().signal);
    await expect(res.pumpInto(new GatedSink(1000), () => undefined, new AbortController().signal)).rejects.toThrow(
      'connection closed after 20 of 100 bytes',
    );
  });

  it('refuses what is not an HTTP/1.x response, and a head without end', async () => {
    const garbage = await rawServer(Buffer.from('SSH-2.0-OpenSSH_9.2\r\n\r\n'));
    await expect(DirectResponse.open(new URL(garbage), {}, OPTIONS, new AbortController().signal)).rejects.toThrow(/not an HTTP\/1.x response: "SSH-2.0/);
    const endless = await rawServer(Buffer.concat([Buffer.from('HTTP/1.1 200 OK\r\n'), Buffer.alloc(70_000, 'x')]));
    await expect(DirectResponse.open(new URL(endless), {}, OPTIONS, new AbortController().signal)).rejects.toThrow(/response head longer than 65536 bytes/);
  });

  it('refuses a source host outside the policy before connecting', async () => {
    const srv = await serve({ body: Buffer.alloc(10) });
    const strict = { ...OPTIONS, policy: new SourceHostPolicy([]) };
    await expect(DirectResponse.open(new URL(`${srv.url}/img`), {}, strict, new AbortController().signal)).rejects.toThrow(/loopback/);
    expect(srv.requests).toHaveLength(0);
  });

  it('is used for http: only, and not through a proxy or with credentials in the URL', () => {
    expect(directGetEligible(new URL('http://origin/img'), OPTIONS)).toBe(true);
    expect(directGetEligible(new URL('https://origin/img'), OPTIONS)).toBe(false);
    expect(directGetEligible(new URL('http://u:p@origin/img'), OPTIONS)).toBe(false);
    expect(directGetEligible(new URL('http://origin/img'), { ...OPTIONS, proxy: { http: 'http://proxy:3128' } })).toBe(false);
    expect(directGetEligible(new URL('http://origin/img'), { ...OPTIONS, proxy: { http: 'http://proxy:3128', noProxy: 'origin' } })).toBe(true);
    expect(directGetEligible(new URL('http://origin/img'), undefined)).toBe(false);
  });
});

describe('downloads through the direct path', () => {
  async function download(url: string, opts: FileSourcesOptions, name: string) {
    const dest = join(dir, name);
    const result = await createFileSources(opts).download({ url, dest, sink: new RecordingProgress(), signal: new AbortController().signal });
    return { result, bytes: await readFile(dest) };
  }

  it('stores the same file with the same checksum and chain as the HTTP client, in one request', async () => {
    // 24 MiB: more than the sink's four 4 MiB slabs, with holes and an unaligned tail
    const body = Buffer.concat([randomBytes(9 << 20), Buffer.alloc(6 << 20), randomBytes((9 << 20) + 1000)]);
    const srv = await serve({ body });
    const direct = await download(`${srv.url}/img`, FAST, 'direct.img');
    const viaClient = await download(`${srv.url}/img`, { ...FAST, directHttp: false }, 'client.img');
    expect(direct.bytes.equals(padTo512(body))).toBe(true);
    expect(viaClient.bytes.equals(direct.bytes)).toBe(true);
    expect(direct.result.sha512).toBe(sha('sha512', padTo512(body)));
    expect(direct.result.sha512).toBe(viaClient.result.sha512);
    expect(direct.result.chain).toEqual(viaClient.result.chain);
    // The direct request closes its connection; the HTTP client keeps its connection alive.
    expect(srv.requests.map((r) => r.connection)).toEqual(['close', 'keep-alive']);
  });

  it('decompresses a compressed body it read itself, without asking again', async () => {
    const image = Buffer.concat([randomBytes(300_000), Buffer.alloc(200_000)]);
    const srv = await serve({ body: compressWith('gzip', image) });
    const { bytes } = await download(`${srv.url}/img`, FAST, 'gz.img');
    expect(bytes.equals(padTo512(image))).toBe(true);
    expect(srv.requests).toHaveLength(1);
    expect(srv.requests[0]!.connection).toBe('close');
  });

  it('leaves a chunked body to the HTTP client', async () => {
    const image = randomBytes(100_000);
    const srv = await serve({ body: image, noContentLength: true });
    const { bytes } = await download(`${srv.url}/img`, FAST, 'chunked.img');
    expect(bytes.equals(padTo512(image))).toBe(true);
    expect(srv.requests.map((r) => r.connection)).toEqual(['close', 'keep-alive']);
  });
});
