import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { readFile, stat, access } from 'node:fs/promises';
import { mkdtemp, rm } from 'node:fs/promises';
import { gzipSync } from 'node:zlib';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createFileSources, type FileSourcesOptions } from './provider.js';
import { startImageServer, type ImageServer, type ImageServerOptions } from './test-support/image-server.js';
import { compressWith, padTo512, qcow2Header, RecordingProgress, sha, sparseImage } from './test-support/images.js';
import { SourceHostRefusedError } from './ip-policy.js';
import { computeFileChain } from '@bis/sha512-chain';
import { ChecksumMismatchError } from './checksum.js';
import type { DownloadRequest, DownloadRetry } from './contract.js';

let dir: string;
const servers: ImageServer[] = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'dl-'));
});
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
  await rm(dir, { recursive: true, force: true });
});

async function serve(o: ImageServerOptions): Promise<ImageServer> {
  const s = await startImageServer(o);
  servers.push(s);
  return s;
}

const FAST: FileSourcesOptions = { allowSourceHosts: ['127.0.0.1'], retry: { baseDelayMs: 10, maxDelayMs: 50, limit: 3 } };

async function download(url: string, opts: FileSourcesOptions = FAST, extra: { expectedChecksum?: string; signal?: AbortSignal; onRetry?: DownloadRequest['onRetry'] } = {}) {
  const sink = new RecordingProgress();
  const dest = join(dir, 'img.tmp');
  const result = await createFileSources(opts).download({ url, dest, sink, signal: extra.signal ?? new AbortController().signal, expectedChecksum: extra.expectedChecksum, onRetry: extra.onRetry });
  return { result, sink, dest, bytes: await readFile(dest) };
}

async function exists(p: string): Promise<boolean> {
  return access(p).then(() => true, () => false);
}

describe('download source', () => {
  it('streams, hashes, zero-pads to 512 and keeps zero runs as holes', async () => {
    const img = sparseImage();
    const srv = await serve({ body: img });
    const { result, sink, dest, bytes } = await download(`${srv.url}/img`, FAST, { expectedChecksum: `sha256:${sha('sha256', img)}` });
    const want = padTo512(img);
    expect(bytes.equals(want)).toBe(true);
    expect(result).toEqual({
      size: want.length, sha512: sha('sha512', want), virtualSize: want.length, format: 'raw', expectedChecksumVerified: true,
      chain: expect.objectContaining({ size: want.length, checksum: sha('sha512', want), segmentSize: 2 * 1024 * 1024 }),
    });
    // the chain was recorded in the same pass: its states are those of the stored file
    const again = await computeFileChain(dest);
    expect(again.states.map((s) => s.toString('hex'))).toEqual(result.chain!.states.map((s) => Buffer.from(s).toString('hex')));
    expect(sink.size).toBe(img.length);
    expect(sink.sizes.at(-1)).toBe(want.length); // the final (padded) size is announced at the end
    expect(sink.last).toBe(want.length);
    const st = await stat(dest);
    expect(st.blocks * 512).toBeLessThan(want.length - (1 << 20) + 65536); // the 1 MiB zero run is a hole
    expect(srv.requests.map((r) => r.method)).toEqual(['GET']); // no HEAD needed
  });

  it('accepts the SHA-512 of the image as published for an image that gets zero-padded, and names both on a mismatch', async () => {
    const img = sparseImage(); // not a multiple of 512
    const want = padTo512(img);
    expect(want.length).toBeGreaterThan(img.length);
    const srv = await serve({ body: img });
    const published = await download(`${srv.url}/img`, FAST, { expectedChecksum: sha('sha512', img) });
    expect(published.result).toMatchObject({ sha512: sha('sha512', want), expectedChecksumVerified: true });
    const stored = await download(`${srv.url}/img`, FAST, { expectedChecksum: sha('sha512', want) });
    expect(stored.result.sha512).toBe(sha('sha512', want));
    const wrong = 'ab'.repeat(64);
    const err = await download(`${srv.url}/img`, FAST, { expectedChecksum: wrong }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ChecksumMismatchError);
    expect((err as Error).message).toBe(`the expected checksum ${wrong} doesn't match the file actual checksum ${sha('sha512', want)}`);
    expect(await exists(join(dir, 'img.tmp'))).toBe(false);
  });

  it('works with a server that refuses HEAD, also when parallel download is enabled (longhorn#7892)', async () => {
    const img = sparseImage(512);
    const srv = await serve({ body: img, refuseHead: true });
    const { bytes } = await download(`${srv.url}/img`, { ...FAST, parallel: { connections: 4, minSize: 0, segmentBytes: 65536 } });
    expect(bytes.equals(img)).toBe(true);
    expect(srv.requests.filter((r) => r.method === 'GET')).toHaveLength(1);
  });

  it('resumes a dropped connection with a Range request from the bytes already written', async () => {
    const img = sparseImage(4096);
    const srv = await serve({ body: img, dropAfterBytes: 400_000, drops: 2 });
    const { bytes, result } = await download(`${srv.url}/img`);
    expect(bytes.equals(img)).toBe(true);
    expect(result.sha512).toBe(sha('sha512', img));
    const gets = srv.requests.filter((r) => r.method === 'GET');
    expect(gets.length).toBe(3);
    expect(gets[0]!.range).toBeUndefined();
    expect(gets[1]!.range).toBe('bytes=400000-');
    expect(gets[2]!.range).toBe('bytes=800000-');
  });

  it('restarts from byte 0 when the server has no Range support', async () => {
    const img = sparseImage(4096);
    const srv = await serve({ body: img, noRanges: true, dropAfterBytes: 500_000, drops: 1 });
    const { bytes, result } = await download(`${srv.url}/img`);
    expect(bytes.equals(img)).toBe(true);
    expect(result.sha512).toBe(sha('sha512', img));
    expect(srv.requests.map((r) => r.range)).toEqual([undefined, undefined]);
  });

  it('says why it waits while an origin answers HTTP 500: the status, the attempt and when the next one starts', async () => {
    const img = sparseImage();
    const srv = await serve({ body: img, failFirst: { status: 500, times: 2 } });
    const before = Date.now();
    const { bytes, sink } = await download(`${srv.url}/img`);
    expect(bytes.equals(padTo512(img))).toBe(true);
    expect(sink.notes).toHaveLength(2);
    expect(sink.notes[0]).toMatch(new RegExp(`^origin answered HTTP 500; attempt 1 of 4 failed, next attempt at (\\S+): expected status code 200 from ${srv.url}/img, got 500$`));
    expect(sink.notes[1]).toMatch(/^origin answered HTTP 500; attempt 2 of 4 failed, next attempt at /);
    const at = Date.parse(/next attempt at (\S+):/.exec(sink.notes[0]!)![1]!);
    expect(at).toBeGreaterThanOrEqual(before);
  });

  it('fails after the retry limit with a message naming the attempts', async () => {
    const srv = await serve({ body: sparseImage(), dropAfterBytes: 1000, drops: 100, noRanges: true });
    const dest = join(dir, 'img.tmp');
    const retries: DownloadRetry[] = [];
    await expect(download(`${srv.url}/img`, { ...FAST, retry: { limit: 2, baseDelayMs: 5 } }, { onRetry: (r) => retries.push(r) })).rejects.toThrow(/failed after 3 attempts/);
    expect(await exists(dest)).toBe(false);
    // Each failed attempt that is tried again is reported (the data source logs it); the last one fails the download.
    expect(retries.map((r) => [r.attempt, r.limit, r.retryInMs])).toEqual([
      [1, 2, 5],
      [2, 2, 10],
    ]);
    expect(retries[0]!.error).toMatch(/connection closed after|aborted|socket|ECONNRESET|terminated/i);
  });

  it('follows redirects and drops credentials on a redirect to another origin', async () => {
    const img = sparseImage(512);
    const other = await serve({ body: img });
    const srv = await serve({
      body: img,
      redirects: { '/same': '/img', '/away': `http://127.0.0.1:${other.port}/img` },
    });
    const opts = { ...FAST, downloadHeaders: { Authorization: 'Bearer secret' } };
    const same = await download(`${srv.url}/same`, opts);
    expect(same.bytes.equals(img)).toBe(true);
    expect(srv.requests.map((r) => r.authorization)).toEqual(['Bearer secret', 'Bearer secret']);
    const away = await download(`${srv.url}/away`, opts);
    expect(away.bytes.equals(img)).toBe(true);
    expect(other.requests[0]!.authorization).toBeUndefined();
    expect(other.requests[0]!.referer).toBeUndefined();
  });

  it.each(['gzip', 'xz', 'zstd'] as const)('decompresses %s transparently (detected by magic bytes)', async (kind) => {
    const img = sparseImage(2048);
    const body = kind === 'gzip' ? gzipSync(img) : compressWith(kind, img);
    const srv = await serve({ body, dropAfterBytes: Math.floor(body.length / 2), drops: 1 });
    const { bytes, result, sink } = await download(`${srv.url}/img`, FAST, { expectedChecksum: sha('sha512', img) });
    expect(bytes.equals(img)).toBe(true);
    expect(result.size).toBe(img.length);
    expect(sink.size).toBe(body.length); // progress is counted in transferred (compressed) bytes
    // a compressed stream cannot be resumed mid-way: the retry starts again from byte 0
    expect(srv.requests.filter((r) => r.method === 'GET').map((r) => r.range)).toEqual([undefined, undefined]);
  });

  it('fails a corrupt compressed stream with a decompression error and removes the file', async () => {
    const img = sparseImage(2048);
    const body = compressWith('xz', img);
    body[body.length - 30] ^= 0xff;
    const srv = await serve({ body });
    await expect(download(`${srv.url}/img`)).rejects.toThrow(/xz decompression failed/);
    expect(await exists(join(dir, 'img.tmp'))).toBe(false);
  });

  it('rejects a checksum mismatch with both values and removes the file', async () => {
    const img = sparseImage(512);
    const srv = await serve({ body: img });
    const wrong = 'sha1:' + '0'.repeat(40);
    const err = await download(`${srv.url}/img`, FAST, { expectedChecksum: wrong }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ChecksumMismatchError);
    expect((err as Error).message).toContain(wrong);
    expect((err as Error).message).toContain(`sha1:${sha('sha1', img)}`);
    expect(await exists(join(dir, 'img.tmp'))).toBe(false);
  });

  it('rejects a malformed expected checksum before downloading', async () => {
    const srv = await serve({ body: sparseImage() });
    await expect(download(`${srv.url}/img`, FAST, { expectedChecksum: 'sha256:abc' })).rejects.toThrow(/64 hexadecimal/);
    expect(srv.requests).toHaveLength(0);
  });

  it('fails on HTTP errors with Longhorn\'s message and without retrying 4xx', async () => {
    const srv = await serve({ body: sparseImage() });
    await expect(download(`${srv.url}/missing`)).rejects.toThrow(`expected status code 200 from ${srv.url}/missing, got 404`);
    expect(srv.requests).toHaveLength(1);
  });

  it('rejects non-http URLs', async () => {
    await expect(download('file:///etc/passwd')).rejects.toThrow(/only http and https/);
    await expect(download('not a url')).rejects.toThrow(/invalid download URL/);
  });

  it('reports an unknown size as -1 when there is no Content-Length', async () => {
    const img = sparseImage(512);
    const srv = await serve({ body: img, noContentLength: true });
    const { bytes, sink } = await download(`${srv.url}/img`);
    expect(bytes.equals(img)).toBe(true);
    expect(sink.size).toBe(-1);
  });

  it('cancels a stalled transfer after the stall timeout and removes the partial file', async () => {
    const srv = await serve({ body: sparseImage(), stallAfterBytes: 100_000 });
    // the message names the 0.3 s stall timeout: that timer, not another one, ended the transfer
    await expect(download(`${srv.url}/img`, { ...FAST, stallTimeoutMs: 300, retry: { limit: 0 } })).rejects.toThrow(/no data was processed for 0.3 s/);
    expect(await exists(join(dir, 'img.tmp'))).toBe(false);
  });

  it('stops on cancellation and removes the partial file', async () => {
    const srv = await serve({ body: sparseImage(), bytesPerTick: 16384 });
    const ac = new AbortController();
    setTimeout(() => ac.abort(new Error('deleted')), 100);
    await expect(download(`${srv.url}/img`, FAST, { signal: ac.signal })).rejects.toThrow(/cancelled: deleted/);
    expect(await exists(join(dir, 'img.tmp'))).toBe(false);
  });

  it('downloads with parallel ranged requests when the server supports ranges', async () => {
    const img = sparseImage(3000);
    const srv = await serve({ body: img });
    const { bytes, result } = await download(`${srv.url}/img`, { ...FAST, parallel: { connections: 3, minSize: 0, segmentBytes: 100_000 } });
    expect(bytes.equals(padTo512(img))).toBe(true);
    expect(result.sha512).toBe(sha('sha512', padTo512(img)));
    const ranges = srv.requests.filter((r) => r.method === 'GET').map((r) => r.range);
    expect(ranges).toHaveLength(Math.ceil(img.length / 100_000));
    expect(ranges[1]).toBe('bytes=100000-199999');
  });

  it('recognises qcow2, reports its virtual size, and refuses backing or external data files', async () => {
    const ok = await serve({ body: qcow2Header(10 * 2 ** 30) });
    const r = await download(`${ok.url}/img`);
    expect(r.result.format).toBe('qcow2');
    expect(r.result.virtualSize).toBe(10 * 2 ** 30);
    const backing = await serve({ body: qcow2Header(2 ** 30, { backing: true }) });
    await expect(download(`${backing.url}/img`)).rejects.toThrow(/names a backing file/);
    const data = await serve({ body: gzipSync(qcow2Header(2 ** 30, { externalData: true })) });
    await expect(download(`${data.url}/img`)).rejects.toThrow(/external data file/);
    expect(await exists(join(dir, 'img.tmp'))).toBe(false);
  });
});

describe('SSRF guard', () => {
  it('refuses loopback by default, for IP literals and names', async () => {
    const srv = await serve({ body: sparseImage() });
    const opts = { retry: { limit: 0 } };
    await expect(download(`${srv.url}/img`, opts)).rejects.toBeInstanceOf(SourceHostRefusedError);
    await expect(download(`http://localhost:${srv.port}/img`, opts)).rejects.toThrow(/loopback addresses are not allowed/);
    await expect(download(`http://169.254.169.254/latest/meta-data`, opts)).rejects.toThrow(/metadata addresses are not allowed/);
    expect(srv.requests).toHaveLength(0);
  });

  it('allows a host or CIDR from the allowlist', async () => {
    const img = sparseImage(512);
    const srv = await serve({ body: img });
    expect((await download(`http://localhost:${srv.port}/img`, { allowSourceHosts: ['localhost'] })).bytes.equals(img)).toBe(true);
    expect((await download(`${srv.url}/img`, { allowSourceHosts: ['127.0.0.0/8'] })).bytes.equals(img)).toBe(true);
  });

  it('checks every redirect target', async () => {
    const srv = await serve({ body: sparseImage(), redirects: { '/hop': 'http://127.0.0.2:1/img' } });
    await expect(download(`${srv.url}/hop`, { allowSourceHosts: ['127.0.0.1/32'], retry: { limit: 0 } })).rejects.toThrow(
      /refusing to connect to 127\.0\.0\.2: loopback/,
    );
    expect(srv.requests).toHaveLength(1);
  });
});
