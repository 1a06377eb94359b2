import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync, statfsSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { directIoSupported } from '@bis/direct-io';
import { startSsyncReceiver } from './receiver.js';
import { httpStatus as call } from '../test-support/http-call.js';

const MiB = 1 << 20;
/** /dev/shm is tmpfs on Linux machines; without it the tmpfs case has nothing to run on. */
const SHM = '/dev/shm';
const shmIsTmpfs = (() => {
  try {
    return statfsSync(SHM).type === 0x01021994;
  } catch {
    return false;
  }
})();
if (!shmIsTmpfs) console.warn(`ssync direct-io.spec: tmpfs case skipped: ${SHM} is not a tmpfs mount`);
let dir: string;
beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'ssync-dio-'));
});
afterEach(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});


describe('direct writes', () => {
  it('a receiver writes aligned ranges directly and unaligned ones buffered; the file is exact either way', async () => {
    const size = 6 * MiB;
    const data = randomBytes(size);
    // aligned 2 MiB ranges, then ranges cut at odd offsets, received in a mixed order
    const cuts = [0, 2 * MiB, 4 * MiB, 4 * MiB + 5000, 5 * MiB + 123, size];
    const ranges = cuts.slice(1).map((end, i) => [cuts[i]!, end] as const).reverse();
    const results = [];
    for (const directIO of [true, false]) {
      const dst = path.join(dir, `dst-${directIO}`);
      const rx = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: dst, size, directIO });
      expect(await call(rx.port, 'GET', `/v1-ssync/open?begin=0&end=${size}`)).toBe(200);
      for (const [b, e] of ranges) expect(await call(rx.port, 'POST', `/v1-ssync/writeData?begin=${b}&end=${e}`, data.subarray(b, e))).toBe(200);
      expect(await call(rx.port, 'POST', '/v1-ssync/close')).toBe(200);
      const got = await rx.done;
      await rx.closed;
      expect(createHash('sha512').update(readFileSync(dst)).digest('hex')).toBe(createHash('sha512').update(data).digest('hex'));
      expect(got.writeStats.directBytes + got.writeStats.bufferedBytes).toBe(size);
      results.push(got.writeStats);
    }
    const supported = await directIoSupported(dir);
    // [0, 2 MiB) and [2 MiB, 4 MiB) go direct; the three pieces after 4 MiB start or end off the 4 KiB grid
    expect(results[0]!.directBytes).toBe(supported ? 4 * MiB : 0);
    expect(results[1]).toEqual({ directBytes: 0, bufferedBytes: size });
    expect((await fsp.readdir(dir)).sort()).toEqual(['dst-false', 'dst-true']);
  });

  it('a receiver that cannot listen (port taken) fails and keeps no file open', async () => {
    const taken = http.createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
    try {
      const port = (taken.address() as { port: number }).port;
      const fds = async () => (await fsp.readdir('/proc/self/fd')).length;
      const before = await fds();
      for (const computeChecksum of [false, true]) {
        await expect(
          startSsyncReceiver({ port, host: '127.0.0.1', filePath: path.join(dir, 'dst'), size: MiB, computeChecksum }),
        ).rejects.toThrow('EADDRINUSE');
      }
      expect(await fds()).toBe(before);
      expect(await fsp.readdir(dir)).toEqual([]);
    } finally {
      await new Promise<void>((r) => taken.close(() => r()));
    }
  });

  (shmIsTmpfs ? it : it.skip)(`on tmpfs (direct I/O since Linux 6.6, EINVAL before) the receiver uses direct writes exactly when the filesystem takes them${shmIsTmpfs ? '' : ` (skipped: ${SHM} is not a tmpfs mount)`}`, async () => {
    const d = await fsp.mkdtemp(path.join(SHM, 'ssync-dio-'));
    try {
      const supported = await directIoSupported(d);
      const size = 2 * MiB;
      const data = randomBytes(size);
      const dst = path.join(d, 'dst');
      const rx = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: dst, size });
      expect(await call(rx.port, 'GET', `/v1-ssync/open?begin=0&end=${size}`)).toBe(200);
      expect(await call(rx.port, 'POST', `/v1-ssync/writeData?begin=0&end=${size}`, data)).toBe(200);
      expect(await call(rx.port, 'POST', '/v1-ssync/close')).toBe(200);
      const got = await rx.done;
      await rx.closed;
      expect(got.writeStats).toEqual(supported ? { directBytes: size, bufferedBytes: 0 } : { directBytes: 0, bufferedBytes: size });
      expect(readFileSync(dst).equals(data)).toBe(true);
    } finally {
      await fsp.rm(d, { recursive: true, force: true });
    }
  });
});
