import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { Readable } from 'node:stream';
import { access, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createFileSources, loadFileSources } from './provider.js';
import { ImageSink, dataRuns, SLAB_BYTES, SLAB_COUNT } from './image-sink.js';
import { parseExpectedChecksum, ChecksumMismatchError } from './checksum.js';
import { startImageServer, type ImageServer } from './test-support/image-server.js';
import { startTestProxy, type TestProxy } from './testing/proxy.js';
import { padTo512, RecordingProgress, sha, sparseImage } from './test-support/images.js';

let dir: string;
const closers: Array<() => Promise<void>> = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'src-'));
});
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
  await rm(dir, { recursive: true, force: true });
});

const exists = (p: string): Promise<boolean> => access(p).then(() => true, () => false);
const never = (): AbortSignal => new AbortController().signal;

/** A body that yields `data` in pieces of `piece` bytes. */
function bodyOf(data: Buffer, piece = 65536): Readable {
  const parts: Buffer[] = [];
  for (let i = 0; i < data.length; i += piece) parts.push(data.subarray(i, i + piece));
  return Readable.from(parts);
}

describe('upload source', () => {
  it('stores a whole upload, hashes it in the same pass and keeps zero blocks as holes', async () => {
    const img = sparseImage(0);
    const dest = join(dir, 'up.tmp');
    const sink = new RecordingProgress();
    const r = await createFileSources().upload({ dest, body: bodyOf(img), size: img.length, sink, signal: never() });
    expect(r).toEqual({
      size: img.length, sha512: sha('sha512', img), virtualSize: img.length, format: 'raw',
      chain: expect.objectContaining({ size: img.length, checksum: sha('sha512', img) }),
    });
    expect((await readFile(dest)).equals(img)).toBe(true);
    expect(sink.sizes[0]).toBe(img.length);
    expect(sink.last).toBe(img.length);
    // 1 MiB + 64 KiB of zeros are not allocated
    expect((await stat(dest)).blocks * 512).toBeLessThanOrEqual(img.length - (1 << 20));
  });

  it('fails a short upload with the sizes named and removes the partial file', async () => {
    const dest = join(dir, 'up.tmp');
    await expect(
      createFileSources().upload({ dest, body: bodyOf(randomBytes(1000)), size: 4096, sink: new RecordingProgress(), signal: never() }),
    ).rejects.toThrow('processed data size 1000 does not match the expected file size 4096');
    expect(await exists(dest)).toBe(false);
  });

  it('fails an upload with more bytes than declared', async () => {
    const dest = join(dir, 'up.tmp');
    await expect(
      createFileSources().upload({ dest, body: bodyOf(randomBytes(5000)), size: 4096, sink: new RecordingProgress(), signal: never() }),
    ).rejects.toThrow('the upload has more bytes than the declared size (more than 4096 bytes)');
    expect(await exists(dest)).toBe(false);
  });

  it('continues a partial upload at an offset and hashes the whole file', async () => {
    const img = randomBytes(3 * 1024 * 1024 + 512);
    const dest = join(dir, 'up.tmp');
    const cut = 1_234_567;
    // the first part as an earlier request left it, plus bytes beyond the offset that must be dropped
    await writeFile(dest, Buffer.concat([img.subarray(0, cut), randomBytes(999)]));
    const r = await createFileSources().upload({ dest, body: bodyOf(img.subarray(cut)), size: img.length, offset: cut, sink: new RecordingProgress(), signal: never() });
    expect(r.sha512).toBe(sha('sha512', img));
    expect((await readFile(dest)).equals(img)).toBe(true);
  });

  it('checks an expected sha256 and reports a mismatch with both values', async () => {
    const img = randomBytes(8192);
    const dest = join(dir, 'up.tmp');
    const ok = await createFileSources().upload({ dest, body: bodyOf(img), size: img.length, sink: new RecordingProgress(), signal: never(), expectedChecksum: `sha256:${sha('sha256', img)}` });
    expect(ok.sha512).toBe(sha('sha512', img));
    const wrong = `sha256:${'0'.repeat(64)}`;
    const err = await createFileSources()
      .upload({ dest, body: bodyOf(img), size: img.length, sink: new RecordingProgress(), signal: never(), expectedChecksum: wrong })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ChecksumMismatchError);
    expect((err as Error).message).toBe(`the expected checksum ${wrong} doesn't match the file actual checksum sha256:${sha('sha256', img)}`);
    expect(await exists(dest)).toBe(false);
  });

  it('stops on cancellation and removes the partial file', async () => {
    const dest = join(dir, 'up.tmp');
    const ctl = new AbortController();
    async function* slow(): AsyncGenerator<Buffer> {
      yield randomBytes(65536);
      ctl.abort(new Error('stop'));
      await new Promise((r) => setTimeout(r, 50));
      yield randomBytes(65536);
    }
    await expect(
      createFileSources().upload({ dest, body: Readable.from(slow()), size: 1 << 20, sink: new RecordingProgress(), signal: ctl.signal }),
    ).rejects.toThrow('cancelled: stop');
    expect(await exists(dest)).toBe(false);
  });
});

describe('clone source', () => {
  it('clones a ready file (encryption ignore) with the same bytes, checksum and holes', async () => {
    const src = join(dir, 'backing');
    const img = padTo512(sparseImage());
    await writeFile(src, img);
    const dest = join(dir, 'clone.tmp');
    const sink = new RecordingProgress();
    const r = await createFileSources().clone({ sourcePath: src, encryption: 'ignore', credential: {}, dest, sink, signal: never(), expectedChecksum: sha('sha512', img) });
    expect(r).toEqual({
      size: img.length, sha512: sha('sha512', img), virtualSize: img.length, format: 'raw', expectedChecksumVerified: true,
      chain: expect.objectContaining({ size: img.length, checksum: sha('sha512', img) }),
    });
    expect((await readFile(dest)).equals(img)).toBe(true);
    expect((await stat(dest)).blocks * 512).toBeLessThanOrEqual(img.length - (1 << 20));
    expect(sink.sizes[0]).toBe(img.length);
    expect(sink.last).toBe(img.length);
  });

  it('names a missing source file', async () => {
    await expect(
      createFileSources().clone({ sourcePath: join(dir, 'nope'), encryption: 'ignore', credential: {}, dest: join(dir, 'c.tmp'), sink: new RecordingProgress(), signal: never() }),
    ).rejects.toThrow(`cannot clone from ${join(dir, 'nope')}: the source backing file does not exist`);
  });

  it('fails a clone whose expected checksum differs and removes the file', async () => {
    const src = join(dir, 'backing');
    await writeFile(src, randomBytes(4096));
    const dest = join(dir, 'clone.tmp');
    await expect(
      createFileSources().clone({ sourcePath: src, encryption: 'ignore', credential: {}, dest, sink: new RecordingProgress(), signal: never(), expectedChecksum: 'f'.repeat(128) }),
    ).rejects.toThrow(ChecksumMismatchError);
    expect(await exists(dest)).toBe(false);
  });
});

describe('image sink', () => {
  it('finds data runs on absolute 4 KiB boundaries, probing 64 KiB of zeros at once', () => {
    const b = Buffer.alloc(256 << 10);
    b[10] = 1; // block 0
    b[(64 << 10) + 4096 * 3 + 5] = 1; // block 19
    b[(64 << 10) + 4096 * 4] = 1; // block 20 (adjacent: same run)
    b[b.length - 1] = 1; // last block
    expect(dataRuns(b, 0)).toEqual([
      [0, 4096],
      [(64 << 10) + 4096 * 3, (64 << 10) + 4096 * 5],
      [b.length - 4096, b.length],
    ]);
    // the buffer starts 100 bytes before a block boundary: the first "block" is those 100 bytes
    const c = Buffer.alloc(8192 + 100);
    c[50] = 7;
    c[100 + 4096] = 7;
    expect(dataRuns(c, 4096 - 100)).toEqual([
      [0, 100],
      [4196, 8292],
    ]);
    expect(dataRuns(Buffer.alloc(1 << 20), 0)).toEqual([]);
  });

  it('keeps bytes and order across more slabs than are in flight (backpressure), with holes', async () => {
    const parts: Buffer[] = [];
    for (let i = 0; i < SLAB_COUNT * 2 + 1; i++) parts.push(i % 3 === 1 ? Buffer.alloc(SLAB_BYTES) : randomBytes(SLAB_BYTES));
    parts.push(randomBytes(777));
    const img = Buffer.concat(parts);
    const dest = join(dir, 'big.tmp');
    const sink = await ImageSink.create(dest, { expected: parseExpectedChecksum(sha('sha512', padTo512(img))) });
    for (let i = 0; i < img.length; i += 100_003) await sink.write(img.subarray(i, i + 100_003));
    const r = await sink.finish();
    expect(r.size).toBe(padTo512(img).length);
    expect(r.sha512).toBe(sha('sha512', padTo512(img)));
    expect((await readFile(dest)).equals(padTo512(img))).toBe(true);
    const zeroSlabs = parts.filter((p) => p.length === SLAB_BYTES && p.every((x) => x === 0)).length;
    expect((await stat(dest)).blocks * 512).toBeLessThanOrEqual(img.length - zeroSlabs * SLAB_BYTES + SLAB_BYTES);
  });

  it('writes zero blocks too when asked (block devices)', async () => {
    const dest = join(dir, 'dense.tmp');
    const img = Buffer.concat([randomBytes(4096), Buffer.alloc(1 << 20)]);
    const sink = await ImageSink.create(dest, { writeZeros: true });
    await sink.write(img);
    const r = await sink.finish();
    expect(r.sha512).toBe(sha('sha512', img));
    expect((await stat(dest)).blocks * 512).toBeGreaterThanOrEqual(img.length);
  });

  it('discards with slabs in flight: waits for them, stops the hash worker and removes the file', async () => {
    const dest = join(dir, 'gone.tmp');
    const sink = await ImageSink.create(dest);
    for (let i = 0; i < SLAB_COUNT; i++) await sink.write(randomBytes(SLAB_BYTES));
    await sink.discard();
    expect(await exists(dest)).toBe(false);
    await expect(sink.write(randomBytes(10))).rejects.toThrow(`image sink for ${dest} is closed`);
  });
});

describe('download through a proxy', () => {
  let img: Buffer;
  let origin: ImageServer;
  let proxy: TestProxy;
  beforeEach(async () => {
    img = padTo512(sparseImage());
    origin = await startImageServer({ body: img });
    proxy = await startTestProxy();
    closers.push(() => origin.close(), () => proxy.close());
  });

  it('sends origin traffic through HTTP_PROXY and bypasses it for NO_PROXY hosts', async () => {
    const sources = createFileSources({
      allowSourceHosts: ['127.0.0.1', 'localhost'],
      proxy: { http: proxy.url, noProxy: 'localhost' },
    });
    const dest = join(dir, 'p.tmp');
    const r = await sources.download({ url: `${origin.url}/img`, dest, sink: new RecordingProgress(), signal: never() });
    expect(r.sha512).toBe(sha('sha512', img));
    // hpagent tunnels plain HTTP through CONNECT as well
    expect(proxy.requests).toEqual([{ method: 'CONNECT', target: `127.0.0.1:${origin.port}` }]);
    expect(origin.requests).toHaveLength(1);
    const r2 = await sources.download({ url: `http://localhost:${origin.port}/img`, dest, sink: new RecordingProgress(), signal: never() });
    expect(r2.sha512).toBe(sha('sha512', img));
    expect(proxy.requests).toHaveLength(1); // NO_PROXY: direct
    expect(origin.requests).toHaveLength(2);
  });

  it('still applies the SSRF policy to the origin behind a proxy', async () => {
    const sources = createFileSources({ proxy: { http: proxy.url } });
    await expect(
      sources.download({ url: `${origin.url}/img`, dest: join(dir, 'p.tmp'), sink: new RecordingProgress(), signal: never() }),
    ).rejects.toThrow(/127\.0\.0\.1/);
    expect(proxy.requests).toEqual([]);
  });
});

describe('loadFileSources', () => {
  it('refuses a missing CA bundle or a proxy that is not a URL at once, before any download', async () => {
    await expect(loadFileSources({ caBundlePath: join(dir, 'missing.pem') }, ['download'])).rejects.toThrow(/ENOENT.*missing\.pem/);
    await expect(loadFileSources({ proxy: { https: 'not a url' } }, ['download'])).rejects.toThrow('invalid https proxy URL "not a url"');
    // without downloads neither is looked at
    await expect(loadFileSources({ caBundlePath: join(dir, 'missing.pem') }, ['upload'])).resolves.toBeDefined();
  });

  it('downloads over the direct path and through the HTTP client it loads when first needed', async () => {
    const img = padTo512(sparseImage());
    const origin = await startImageServer({ body: img, noContentLength: true });
    closers.push(() => origin.close());
    const sources = await loadFileSources({ allowSourceHosts: ['127.0.0.1'] }, ['download']);
    // chunked: the direct answer is dropped and the HTTP client, loaded now, asks again
    const r = await sources.download({ url: `${origin.url}/img`, dest: join(dir, 'l.tmp'), sink: new RecordingProgress(), signal: never() });
    expect(r.sha512).toBe(sha('sha512', img));
    expect(origin.requests.map((q) => q.connection)).toEqual(['close', 'keep-alive']);
  });
});
