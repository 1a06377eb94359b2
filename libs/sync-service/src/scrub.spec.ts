import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { createGunzip } from 'node:zlib';
import type { FastifyInstance } from 'fastify';
import { nativeSha512ChainAvailable } from '@bis/sha512-chain';
import { SyncService, type ScrubOptions } from './sync-service.js';
import { TokenBucket, type ScrubClock } from './integrity.js';
import { backingFilePath, cfgPathOf } from './layout.js';
import { startSyncServer } from './server.js';
import { freePort } from './test-support/free-port.js';

const MiB = 1 << 20;
const SEG = 2 * MiB;
/** Whole seconds: a restored mtime is then exactly the recorded one (utimes takes seconds as a double). */
const MTIME = 1_700_000_000;
const sha = (f: string) => createHash('sha512').update(readFileSync(f)).digest('hex');

/** A clock whose sleeps advance virtual time at once: the bandwidth cap is measured without the wall clock. */
class VirtualClock implements ScrubClock {
  t = 0;
  now(): number {
    return this.t;
  }
  async sleep(ms: number, signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    this.t += ms;
  }
}

let dir: string;
let logs: string[];
const services: SyncService[] = [];
const servers: FastifyInstance[] = [];

function service(disk: string, scrub?: ScrubOptions): SyncService {
  const s = new SyncService({ diskPath: path.join(dir, disk), receiverHost: '127.0.0.1', monitorIntervalMs: 0, scrub, log: (m) => logs.push(`${disk}: ${m}`) });
  services.push(s);
  return s;
}

/** A ready copy of `mib` MiB of random data on `svc`'s disk, made by re-adoption (hashed once, chain recorded). */
async function readyCopy(svc: SyncService, disk: string, mib = 16): Promise<string> {
  const f = backingFilePath(path.join(dir, disk), 'img', 'u1');
  await fsp.mkdir(path.dirname(f), { recursive: true });
  await fsp.writeFile(f, randomBytes(mib * MiB));
  await fsp.utimes(f, MTIME, MTIME);
  await svc.fetch({ filePath: f, srcFilePath: f, uuid: 'u1', diskUUID: disk, size: mib * MiB });
  await svc.settled(f);
  expect(svc.get(f).state).toBe('ready');
  return f;
}

/** Bit rot: one byte changed in place, the modification time put back as it was. */
async function flipByte(f: string, offset: number): Promise<void> {
  expect(offset).toBeLessThan((await fsp.stat(f)).size);
  const fh = await fsp.open(f, 'r+');
  const b = Buffer.alloc(1);
  await fh.read(b, 0, 1, offset);
  b[0] = b[0]! ^ 0xff;
  await fh.write(b, 0, 1, offset);
  await fh.close();
  await fsp.utimes(f, MTIME, MTIME);
}

/** Waits for a condition; the default deadline leaves room for a loaded machine (checks run at a lower priority). */
async function waitFor(what: () => boolean, ms = 45_000): Promise<void> {
  const end = Date.now() + ms;
  while (!what()) {
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 20));
  }
}

beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'scrub-'));
  logs = [];
});
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
  for (const s of services.splice(0)) await s.close();
  await fsp.rm(dir, { recursive: true, force: true });
});

describe('TokenBucket', () => {
  it('never lets more than burst + rate x elapsed bytes through, and does not wait while within the rate', async () => {
    const clock = new VirtualClock();
    const rate = 10 * MiB;
    const bucket = new TokenBucket(rate, SEG, clock);
    let taken = 0;
    for (let i = 0; i < 50; i++) {
      await bucket.take(SEG);
      taken += SEG;
      // after take() returns the bytes may be read: the budget holds at that instant
      expect(taken).toBeLessThanOrEqual(SEG + (rate * clock.now()) / 1000 + 1);
    }
    // and the cap is not much stricter than asked: 100 MiB at 10 MiB/s with a 2 MiB burst takes 9.8 s
    expect(clock.now()).toBeCloseTo(((taken - SEG) / rate) * 1000, 3);
    const before = clock.now();
    clock.t += 1000; // a second idle refills the burst, not more
    await bucket.take(SEG);
    expect(clock.now()).toBe(before + 1000);
  });

  it('a cancelled take rejects', async () => {
    const bucket = new TokenBucket(MiB, MiB, new VirtualClock());
    const ac = new AbortController();
    ac.abort(new Error('stop'));
    await expect(bucket.take(1, ac.signal)).rejects.toThrow('stop');
  });
});

const chainDescribe = nativeSha512ChainAvailable() ? describe : describe.skip; // the SHA-512 chain addon is built by npm install

chainDescribe('scrub', () => {
  it('finds a flipped byte under a restored mtime, marks the copy failed naming the segment, and reports it per disk', async () => {
    const clock = new VirtualClock();
    const svc = service('A', { intervalMs: 0, bandwidthBytesPerSecond: 1024 * MiB, clock });
    const f = await readyCopy(svc, 'A');
    const healthy = await svc.scrubNow();
    expect(healthy.map((r) => r.result)).toEqual(['ok']);
    expect(svc.scrubStatus()).toMatchObject({ lastScrubResult: 'ok', lastScrubFiles: 1 });

    await flipByte(f, 5 * SEG + 12_345);
    await svc.checkReadyFiles(); // the mtime did not change: the monitor sees nothing (as Longhorn's)
    expect(svc.get(f).state).toBe('ready');

    const [r] = await svc.scrubNow();
    expect(r).toMatchObject({ result: 'corrupted' });
    const info = svc.get(f);
    expect(info.state).toBe('failed');
    expect(info.message).toBe(`scrub: SHA-512 chain mismatch in segment 5 (bytes ${5 * SEG}-${6 * SEG - 1})`);
    const status = svc.scrubStatus();
    expect(status.lastScrubResult).toBe('corrupted');
    expect(status.lastScrubMessage).toContain('segment 5');
    expect(Date.parse(status.lastScrubTime)).not.toBeNaN();
    // the failed copy is not trusted again after a restart: its backing.cfg is gone
    await expect(fsp.stat(cfgPathOf(f))).rejects.toMatchObject({ code: 'ENOENT' });
    // the records survive a restart of the service
    const stored = JSON.parse(await fsp.readFile(path.join(dir, 'A', 'backing-image-scrub.json'), 'utf8')) as { status: { lastScrubResult: string } };
    expect(stored.status.lastScrubResult).toBe('corrupted');
    expect(logs.some((l) => l.includes('the copy is corrupted, marked failed: scrub: SHA-512 chain mismatch in segment 5'))).toBe(true);
  });

  it('reads at the bandwidth cap (measured on the injected clock)', async () => {
    const clock = new VirtualClock();
    const rate = 4 * MiB;
    const svc = service('A', { intervalMs: 0, bandwidthBytesPerSecond: rate, clock });
    await readyCopy(svc, 'A', 32);
    const start = clock.now();
    const [r] = await svc.scrubNow();
    expect(r).toMatchObject({ result: 'ok', bytesRead: 32 * MiB });
    const seconds = (clock.now() - start) / 1000;
    // 32 MiB at 4 MiB/s with one 2 MiB segment of burst: 7.5 s of (virtual) time, not less
    expect(seconds).toBeGreaterThanOrEqual((32 * MiB - SEG) / rate - 1e-6);
    expect(seconds).toBeLessThanOrEqual((32 * MiB) / rate);
  });

  it('runs by itself when a copy is due', async () => {
    let now = 1_000_000;
    const opts = { intervalMs: 60_000, pollMs: 20, bandwidthBytesPerSecond: 1024 * MiB, wallClock: () => now };
    const svc = service('A', opts);
    const f = await readyCopy(svc, 'A');
    await flipByte(f, 0);
    // first seen now: not due before its interval
    await new Promise((r) => setTimeout(r, 200));
    expect(svc.get(f).state).toBe('ready');
    now += 60_000;
    await waitFor(() => svc.get(f).state === 'failed');
    expect(svc.get(f).message).toBe(`scrub: SHA-512 chain mismatch in segment 0 (bytes 0-${SEG - 1})`);
  });

  it('a restarted service keeps the copies\' scrub times: a copy scrubbed before the restart is not due again', async () => {
    let now = 5_000_000;
    const opts = { intervalMs: 60_000, pollMs: 20, bandwidthBytesPerSecond: 1024 * MiB, wallClock: () => now };
    const first = service('A', opts);
    const f = await readyCopy(first, 'A', 2);
    await first.scrubNow();
    await first.close();
    now += 30_000;
    const second = service('A', opts);
    await second.fetch({ filePath: f, srcFilePath: f, uuid: 'u1', diskUUID: 'A', size: 2 * MiB });
    await second.settled(f);
    expect(second.get(f).state).toBe('ready');
    await new Promise((r) => setTimeout(r, 150));
    expect(second.scrubStatus()).toMatchObject({ lastScrubResult: 'ok', lastScrubFiles: 1 }); // the status came back from disk
    const before = second.scrubStatus().lastScrubTime;
    expect(before).toBe(new Date(now - 30_000).toISOString());
    now += 31_000; // 61 s after its scrub: due
    await waitFor(() => second.scrubStatus().lastScrubTime !== before);
    expect(second.scrubStatus().lastScrubTime).toBe(new Date(now).toISOString());
  });

  it('an interval of 0 never scrubs in the background', async () => {
    let now = 0;
    const svc = service('A', { intervalMs: 0, pollMs: 10, bandwidthBytesPerSecond: MiB, wallClock: () => now });
    const f = await readyCopy(svc, 'A', 2);
    await flipByte(f, 1);
    now += 1e12;
    await new Promise((r) => setTimeout(r, 150));
    expect(svc.get(f).state).toBe('ready');
  });
});

chainDescribe('verify on use', () => {
  it('a sender whose own copy fails the chain marks itself failed naming the segment and stops serving', async () => {
    const a = service('A');
    const b = service('B');
    const f = await readyCopy(a, 'A');
    await flipByte(f, 7 * SEG + 1);
    const fb = backingFilePath(path.join(dir, 'B'), 'img', 'u1');
    const port = await freePort();
    await b.receiveFromPeer({ filePath: fb, uuid: 'u1', size: 16 * MiB, port });
    await a.sendToPeer(f, `127.0.0.1:${port}`);
    await b.settled(fb);
    expect(b.get(fb).state).toBe('failed');
    expect(b.get(fb).message).toContain('SHA-512 chain mismatch in segment 7');
    await waitFor(() => a.get(f).state === 'failed');
    expect(a.get(f).message).toBe(`send: SHA-512 chain mismatch in segment 7 (bytes ${7 * SEG}-${8 * SEG - 1})`);
    const port2 = await freePort();
    await expect(a.sendToPeer(f, `127.0.0.1:${port2}`)).rejects.toThrow('invalid state failed for file sending');
  });

  async function startServer(svc: SyncService): Promise<number> {
    const app = await startSyncServer(svc, { host: '127.0.0.1', port: 0 });
    servers.push(app);
    return (app.server.address() as { port: number }).port;
  }

  /** GET, reading the whole body: the status, the bytes received and how the body ended. */
  function download(port: number, p: string): Promise<{ status: number; length: number | undefined; body: Buffer; ended: 'complete' | 'aborted' }> {
    return new Promise((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port, path: p }, (res) => {
        const chunks: Buffer[] = [];
        const length = res.headers['content-length'] ? Number(res.headers['content-length']) : undefined;
        const done = (ended: 'complete' | 'aborted') => resolve({ status: res.statusCode!, length, body: Buffer.concat(chunks), ended });
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => done(res.complete ? 'complete' : 'aborted'));
        res.on('aborted', () => done('aborted'));
        res.on('error', () => done('aborted'));
      });
      req.on('error', reject);
    });
  }

  it('a raw download of a corrupted copy is cut short before the bad segment and the copy is failed', async () => {
    const a = service('A');
    const f = await readyCopy(a, 'A');
    const port = await startServer(a);
    const url = `/v1/files/${encodeURIComponent(f)}/download?forV2Creation=true`;
    const good = await download(port, url);
    expect(good).toMatchObject({ status: 200, ended: 'complete', length: 16 * MiB });
    expect(createHash('sha512').update(good.body).digest('hex')).toBe(sha(f));

    await flipByte(f, 5 * SEG + 100);
    const bad = await download(port, url);
    expect(bad.status).toBe(200);
    expect(bad.ended).toBe('aborted');
    // every segment before the bad one was sent, never the bad one
    expect(bad.body.length).toBeLessThanOrEqual(5 * SEG);
    await waitFor(() => a.get(f).state === 'failed');
    expect(a.get(f).message).toBe(`download: SHA-512 chain mismatch in segment 5 (bytes ${5 * SEG}-${6 * SEG - 1})`);
    // and it is not served any more
    const after = await download(port, url);
    expect(after.status).not.toBe(200);
  });

  it('a gzip download of a corrupted copy is aborted, not completed', async () => {
    const a = service('A');
    const f = await readyCopy(a, 'A', 8);
    const port = await startServer(a);
    await flipByte(f, 3 * SEG);
    const bad = await download(port, `/v1/files/${encodeURIComponent(f)}/download`);
    expect(bad.ended).toBe('aborted');
    // whatever arrived does not gunzip to a whole image
    const out = await new Promise<number>((resolve) => {
      let n = 0;
      const gz = createGunzip();
      gz.on('data', (c: Buffer) => (n += c.length));
      gz.on('end', () => resolve(n));
      gz.on('error', () => resolve(-1));
      gz.end(bad.body);
    });
    expect(out).not.toBe(8 * MiB);
    await waitFor(() => a.get(f).state === 'failed');
    expect(a.get(f).message).toContain('download: SHA-512 chain mismatch in segment 3');
  });

  it('a copy without a chain is checked against its checksum: the last bytes are held back and the body is aborted', async () => {
    const a = service('A');
    const f = await readyCopy(a, 'A', 4);
    await fsp.rm(`${f}.sha512chain`);
    const port = await startServer(a);
    await flipByte(f, 3 * MiB);
    const bad = await download(port, `/v1/files/${encodeURIComponent(f)}/download?forV2Creation=true`);
    expect(bad.ended).toBe('aborted');
    expect(bad.body.length).toBeLessThan(4 * MiB);
    await waitFor(() => a.get(f).state === 'failed');
    expect(a.get(f).message).toMatch(/^download: SHA-512 mismatch/);
  });
});
