import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { createServer, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { access, mkdtemp, readFile, rm, statfs, writeFile } from 'node:fs/promises';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createFileSources, type FileSourcesOptions } from './provider.js';
import { imageSizeLimit, SizeLimitError, DEFAULT_MAX_IMAGE_SIZE } from './size-limit.js';
import { startImageServer, type ImageServer } from './test-support/image-server.js';
import { compressWith, RecordingProgress } from './test-support/images.js';

const MiB = 1 << 20;
let dir: string;
const closers: Array<() => Promise<void>> = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'limit-'));
});
afterEach(async () => {
  await Promise.all(closers.splice(0).map((c) => c()));
  await rm(dir, { recursive: true, force: true });
});

const exists = (p: string): Promise<boolean> => access(p).then(() => true, () => false);
const never = (): AbortSignal => new AbortController().signal;

/** A limit of 4 MiB: every test writes at most a few MiB. */
const LIMITED: FileSourcesOptions = {
  allowSourceHosts: ['127.0.0.1'],
  retry: { baseDelayMs: 10, maxDelayMs: 50, limit: 3 },
  sizeLimit: { maxImageSize: 4 * MiB },
};

interface BombServer {
  url: string;
  /** Compressed bytes handed to the socket so far. */
  sent(): number;
  gets: number;
  total: number;
  /** Resolves when the client has closed the connection of the last GET. */
  closed: Promise<void>;
}

/**
 * Serves a decompression bomb: one compressed member of 16 MiB of zeros, repeated (concatenated members/streams/frames
 * are one valid stream for gzip, xz and zstd) until `totalBytes` compressed bytes, streamed with backpressure and a
 * truthful Content-Length. Inflated, it is thousands of times larger than what it sends.
 */
async function bombServer(member: Buffer, totalBytes: number): Promise<BombServer> {
  const per = Math.max(1, Math.floor(MiB / member.length));
  const block = Buffer.concat(Array.from({ length: per }, () => member));
  const blocks = Math.ceil(totalBytes / block.length);
  const total = blocks * block.length;
  let sent = 0;
  let closedResolve!: () => void;
  const state: BombServer = {
    url: '',
    sent: () => sent,
    gets: 0,
    total,
    closed: new Promise<void>((r) => (closedResolve = r)),
  };
  const sockets = new Set<Socket>();
  const server: Server = createServer((req, res) => {
    state.gets++;
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': total });
    let i = 0;
    const pump = (): void => {
      while (i < blocks && !res.destroyed) {
        i++;
        sent += block.length;
        if (!res.write(block)) {
          res.once('drain', pump);
          return;
        }
      }
      if (i >= blocks) res.end();
    };
    res.on('close', () => closedResolve());
    pump();
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  state.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/bomb`;
  closers.push(
    () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  );
  return state;
}

async function serve(body: Buffer, o: { noContentLength?: boolean } = {}): Promise<ImageServer> {
  const s = await startImageServer({ body, ...o });
  closers.push(() => s.close());
  return s;
}

const ZEROS_16M = Buffer.alloc(16 * MiB);
const MEMBERS: Record<'gzip' | 'xz' | 'zstd', () => Buffer> = {
  gzip: () => gzipSync(ZEROS_16M, { level: 9 }),
  xz: () => compressWith('xz', ZEROS_16M),
  zstd: () => compressWith('zstd', ZEROS_16M),
};

describe('decompression bombs', () => {
  for (const kind of ['gzip', 'xz', 'zstd'] as const) {
    it(`a ${kind} bomb from a loopback server stops at the limit with a clear error, leaves no file and is not inflated`, async () => {
      // 64 MiB compressed that inflate to (64 MiB / member) × 16 MiB: 64 GiB for gzip, far more for xz and zstd.
      const bomb = await bombServer(MEMBERS[kind](), 64 * MiB);
      const dest = join(dir, 'img.tmp');
      const rssBefore = process.memoryUsage().rss;
      let rssPeak = rssBefore;
      const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, process.memoryUsage().rss)), 20);
      const err = await createFileSources(LIMITED)
        .download({ url: bomb.url, dest, sink: new RecordingProgress(), signal: never() })
        .catch((e: unknown) => e)
        .finally(() => clearInterval(sampler));
      expect(err).toBeInstanceOf(SizeLimitError);
      expect((err as Error).message).toBe(
        `the image is larger than the limit of ${4 * MiB} bytes (the backing-image-max-size setting): stopped, and the partial file was removed`,
      );
      expect(await exists(dest)).toBe(false);
      expect(bomb.gets).toBe(1); // not retried
      await bomb.closed; // the download let go of the connection
      // It stopped reading: only a fraction of the compressed stream ever left the server (socket buffers at most).
      expect(bomb.sent()).toBeLessThan(bomb.total / 2);
      // Bounded memory: the sink's slabs and the decoder's buffers, not the inflated bytes.
      expect(rssPeak - rssBefore).toBeLessThan(256 * MiB);
    });
  }

  it('a compressed image within the limit is stored', async () => {
    const img = Buffer.alloc(3 * MiB, 7);
    const srv = await serve(gzipSync(img));
    const dest = join(dir, 'ok.tmp');
    const r = await createFileSources(LIMITED).download({ url: `${srv.url}/img`, dest, sink: new RecordingProgress(), signal: never() });
    expect(r.size).toBe(img.length);
    expect((await readFile(dest)).equals(img)).toBe(true);
  });
});

describe('plain downloads', () => {
  it('refuses a Content-Length above the limit before writing anything', async () => {
    const srv = await serve(Buffer.alloc(4 * MiB + 512, 1));
    const dest = join(dir, 'img.tmp');
    const err = await createFileSources(LIMITED)
      .download({ url: `${srv.url}/img`, dest, sink: new RecordingProgress(), signal: never() })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SizeLimitError);
    expect((err as Error).message).toBe(
      `the download (Content-Length) of ${4 * MiB + 512} bytes is larger than the limit of ${4 * MiB} bytes (the backing-image-max-size setting)`,
    );
    expect(await exists(dest)).toBe(false);
    expect(srv.requests.filter((r) => r.method === 'GET')).toHaveLength(1);
  });

  it('stops a download without Content-Length once its bytes pass the limit', async () => {
    const srv = await serve(Buffer.alloc(5 * MiB, 1), { noContentLength: true });
    const dest = join(dir, 'img.tmp');
    const err = await createFileSources(LIMITED)
      .download({ url: `${srv.url}/img`, dest, sink: new RecordingProgress(), signal: never() })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SizeLimitError);
    expect((err as Error).message).toMatch(/^the image is larger than the limit of 4194304 bytes/);
    expect(await exists(dest)).toBe(false);
  });

  it('stores an image of exactly the limit', async () => {
    const img = Buffer.alloc(4 * MiB, 3);
    const srv = await serve(img);
    const r = await createFileSources(LIMITED).download({ url: `${srv.url}/img`, dest: join(dir, 'x.tmp'), sink: new RecordingProgress(), signal: never() });
    expect(r.size).toBe(img.length);
  });

  it('the free space of the disk less its reserve bounds the image too', async () => {
    const srv = await serve(Buffer.alloc(4096, 1));
    const dest = join(dir, 'img.tmp');
    // A reserve larger than any disk leaves no room at all.
    const err = await createFileSources({ ...LIMITED, sizeLimit: { reservedBytes: Number.MAX_SAFE_INTEGER } })
      .download({ url: `${srv.url}/img`, dest, sink: new RecordingProgress(), signal: never() })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SizeLimitError);
    expect((err as Error).message).toMatch(
      /^the download \(Content-Length\) of 4096 bytes is larger than the limit of 0 bytes \(the free space of the destination disk, \d+ bytes, less its reserve of 9007199254740991 bytes\)$/,
    );
    expect(await exists(dest)).toBe(false);
  });
});

describe('imageSizeLimit', () => {
  it('is the free space less the reserve, at most the setting (default 2 TiB)', async () => {
    const fs = await statfs(dir);
    const free = fs.bavail * fs.bsize;
    const byDisk = await imageSizeLimit(join(dir, 'f'), { maxImageSize: Number.MAX_SAFE_INTEGER, reservedBytes: 1000 });
    // The free space moves on a shared machine: compare within a margin.
    expect(Math.abs(byDisk.bytes - (free - 1000))).toBeLessThan(256 * MiB);
    expect(byDisk.why).toMatch(/^the free space of the destination disk, \d+ bytes, less its reserve of 1000 bytes$/);
    expect(await imageSizeLimit(join(dir, 'f'), { maxImageSize: 1 })).toEqual({ bytes: 1, why: 'the backing-image-max-size setting' });
    expect(DEFAULT_MAX_IMAGE_SIZE).toBe(2 ** 41);
  });
});

describe('uploads', () => {
  const body = (b: Buffer): Readable => Readable.from([b]);

  it('refuses a declared size above the limit before reading the body or touching the destination', async () => {
    const dest = join(dir, 'up.tmp');
    await writeFile(dest, 'earlier bytes');
    const src = body(Buffer.alloc(16));
    const err = await createFileSources(LIMITED)
      .upload({ dest, body: src, size: 4 * MiB + 512, sink: new RecordingProgress(), signal: never() })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SizeLimitError);
    expect((err as SizeLimitError).statusCode).toBe(413);
    expect((err as Error).message).toBe(
      `the upload's declared size of ${4 * MiB + 512} bytes is larger than the limit of ${4 * MiB} bytes (the backing-image-max-size setting)`,
    );
    expect(await readFile(dest, 'utf8')).toBe('earlier bytes');
  });

  it('an upload within the limit is stored; one with more bytes than declared is refused', async () => {
    const ok = await createFileSources(LIMITED).upload({ dest: join(dir, 'a.tmp'), body: body(Buffer.alloc(4 * MiB, 2)), size: 4 * MiB, sink: new RecordingProgress(), signal: never() });
    expect(ok.size).toBe(4 * MiB);
    const dest = join(dir, 'b.tmp');
    await expect(
      createFileSources(LIMITED).upload({ dest, body: body(Buffer.alloc(4096 + 1, 2)), size: 4096, sink: new RecordingProgress(), signal: never() }),
    ).rejects.toThrow('the upload has more bytes than the declared size (more than 4096 bytes)');
    expect(await exists(dest)).toBe(false);
  });
});
