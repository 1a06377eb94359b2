import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp, readdirSync, readFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { getFileLayout, sendFileAvailable } from '@bis/block-mapping';
import { startSsyncReceiver } from './receiver.js';
import { httpStatus as call } from '../test-support/http-call.js';
import { listenOnLoopback } from '../test-support/loopback-server.js';
import { sendFile, SsyncSendError } from './sender.js';
import type { FileLayoutProvider } from './layout.js';
import { sha512Of, writePatternFile } from '../test-support/pattern-file.js';

const MiB = 1 << 20;
let dir: string;

beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'ssync-'));
});
afterEach(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

const sparseFile = (name: string, pattern: string): Promise<string> => writePatternFile(path.join(dir, name), pattern, MiB);
const sha = sha512Of;

/**
 * The transfer paths every conformance test below runs on: the fast one (the receiver's own HTTP server reading into
 * the slabs, bodies sent with sendfile) and its conservative twin (Node's http server copying, bodies read with a
 * positioned read and written), each forced explicitly, on every machine.
 */
interface TransferPath {
  rx: { httpServer: 'own' | 'node-http' };
  tx: { sendfile: boolean };
}
const PATHS: Array<[string, TransferPath]> = [
  ['own server, sendfile', { rx: { httpServer: 'own' }, tx: { sendfile: true } }],
  ['node-http server, read + write', { rx: { httpServer: 'node-http' }, tx: { sendfile: false } }],
];
const fastPathSkip = sendFileAvailable() ? undefined : 'the block_mapping addon lacks startSendFile (node libs/block-mapping/native/build.mjs)';
/** describe.each over PATHS; the sendfile path is skipped with its reason where the addon lacks it. */
function describePaths(title: string, body: (name: string, p: TransferPath) => void): void {
  for (const [name, p] of PATHS) {
    if (p.tx.sendfile && fastPathSkip) {
      console.warn(`${title.replace('%s', name)}: skipped, ${fastPathSkip}`);
      describe.skip(title.replace('%s', `${name}: skipped, ${fastPathSkip}`), () => body(name, p));
      continue;
    }
    describe(title.replace('%s', name), () => body(name, p));
  }
}

describePaths('ssync sender and receiver (%s)', (_name, path_) => {
  it('transfers a sparse file: holes as holes, data in chunks, result identical and sparse', async () => {
    const src = await sparseFile('src', 'dhhdddhhhh');
    const dst = path.join(dir, 'dst');
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: dst, size: 10 * MiB });
    const r = await sendFile({ ...path_.tx, path: src, toAddress: `127.0.0.1:${rx.port}`, layout: (p) => getFileLayout(p), chunkSize: MiB / 2 });
    const got = await rx.done;
    await rx.closed;
    expect(got).toMatchObject({ size: 10 * MiB, dataBytes: 4 * MiB, holeBytes: 6 * MiB });
    expect(got.sha512).toBeUndefined();
    expect(r.dataBytes).toBe(4 * MiB);
    expect(sha(dst)).toBe(sha(src));
    expect((await fsp.stat(dst)).blocks * 512).toBeLessThanOrEqual(4 * MiB + 64 * 1024);
  });

  it('never reads holes: only data extents are read from the source', async () => {
    const src = await sparseFile('src', 'hhdh');
    const dst = path.join(dir, 'dst');
    // a layout that declares the first 2 MiB a hole although we fill it with bytes: they must not be sent
    await (async () => {
      const fh = await fsp.open(src, 'r+');
      await fh.write(Buffer.alloc(2 * MiB, 7), 0, 2 * MiB, 0);
      await fh.close();
    })();
    const layout: FileLayoutProvider = async () => ({
      size: 4 * MiB,
      data: [{ offset: 2 * MiB, length: MiB }],
      holes: [{ offset: 0, length: 2 * MiB }, { offset: 3 * MiB, length: MiB }],
    });
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: dst, size: 4 * MiB });
    await sendFile({ ...path_.tx, path: src, toAddress: `127.0.0.1:${rx.port}`, layout });
    await rx.done;
    const out = readFileSync(dst);
    expect(out.subarray(0, 2 * MiB).every((b) => b === 0)).toBe(true);
    expect(out.subarray(2 * MiB, 3 * MiB).equals(readFileSync(src).subarray(2 * MiB, 3 * MiB))).toBe(true);
  });

  it('retries a failed chunk', async () => {
    const src = await sparseFile('src', 'dd');
    const dst = path.join(dir, 'dst');
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: dst, size: 2 * MiB });
    // a proxy that fails the first writeData with a 500
    let failed = 0;
    const proxy = http.createServer((req, res) => {
      if (req.url!.includes('writeData') && failed === 0) {
        failed++;
        req.resume();
        res.statusCode = 500;
        return res.end('injected failure\n');
      }
      const up = http.request({ host: '127.0.0.1', port: rx.port, method: req.method, path: req.url, headers: req.headers }, (r) => {
        res.statusCode = r.statusCode!;
        r.pipe(res);
      });
      req.pipe(up);
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    try {
      const r = await sendFile({ ...path_.tx, path: src, toAddress: `127.0.0.1:${(proxy.address() as AddressInfo).port}`, layout: (p) => getFileLayout(p) });
      expect(r.retries).toBe(1);
      await rx.done;
      expect(sha(dst)).toBe(sha(src));
    } finally {
      proxy.close();
    }
  });

  it('an aborted sender never makes the receiver report a complete file; a close of a partial file fails', async () => {
    const src = await sparseFile('src', 'dddd');
    const dst = path.join(dir, 'dst');
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: dst, size: 4 * MiB, idleTimeoutMs: 1500 });
    const ac = new AbortController();
    const sending = sendFile({ ...path_.tx,
      path: src,
      toAddress: `127.0.0.1:${rx.port}`,
      layout: (p) => getFileLayout(p),
      signal: ac.signal,
      workers: 1,
      chunkSize: 64 * 1024,
      onProgress: (n) => {
        if (n >= MiB) ac.abort(new Error('stop'));
      },
    });
    await expect(sending).rejects.toThrow('stop');
    await expect(rx.done).rejects.toThrow('no request from the sender');
    await rx.closed;

    // a Longhorn-style sender that calls close after a partial transfer
    const rx2 = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: path.join(dir, 'dst2'), size: 4 * MiB });
    const call = (method: string, p: string, body?: Buffer) =>
      new Promise<number>((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port: rx2.port, method, path: p }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode!));
        });
        req.on('error', reject);
        req.end(body);
      });
    expect(await call('GET', `/v1-ssync/open?begin=0&end=${4 * MiB}`)).toBe(200);
    expect(await call('POST', `/v1-ssync/writeData?begin=0&end=${MiB}`, Buffer.alloc(MiB, 1))).toBe(200);
    expect(await call('POST', `/v1-ssync/close`)).toBe(200);
    await expect(rx2.done).rejects.toThrow(`incomplete transfer: ${MiB} of ${4 * MiB} bytes`);
  });

  it('rejects a size that differs from the expected one', async () => {
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: path.join(dir, 'x'), size: 4 * MiB, idleTimeoutMs: 500 });
    const src = await sparseFile('src', 'dd');
    await expect(sendFile({ ...path_.tx, path: src, toAddress: `127.0.0.1:${rx.port}`, layout: (p) => getFileLayout(p), attempts: 1 })).rejects.toThrow(
      'the receiver expects 4194304 bytes',
    );
    await expect(rx.done).rejects.toThrow('no request from the sender');
    await rx.closed;
  }, 10_000);

  it('stops on cancellation', async () => {
    const ac = new AbortController();
    const rx2 = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: path.join(dir, 'y'), size: MiB, signal: ac.signal });
    ac.abort();
    await expect(rx2.done).rejects.toThrow('receiving cancelled');
    await rx2.closed;
  }, 10_000);
});

describePaths('checksum computed while receiving (%s)', (_name, path_) => {
  it('equals the SHA-512 of the received file for a parallel sparse transfer, hashing holes without reading them', async () => {
    const src = await sparseFile('src', 'dhhdddhhhhdd');
    const dst = path.join(dir, 'dst');
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: dst, size: 12 * MiB, computeChecksum: true });
    await sendFile({ ...path_.tx, path: src, toAddress: `127.0.0.1:${rx.port}`, layout: (p) => getFileLayout(p), chunkSize: MiB / 2, workers: 4 });
    const got = await rx.done;
    await rx.closed;
    expect(got.sha512).toBe(sha(src));
    expect(sha(dst)).toBe(sha(src));
    expect(got.hashStats!.holeBytes).toBe(6 * MiB);
    expect(got.hashStats!.inOrderBytes + got.hashStats!.readBackBytes).toBe(6 * MiB);
    expect(got.hashStats!.postPassBytes).toBe(0);
  });

  it('ranges arriving in reverse order beyond the window are read back from the file, still in one pass', async () => {
    const size = 8 * MiB;
    const data = randomBytes(size);
    const dst = path.join(dir, 'dst');
    // 2 slabs of 512 KiB: most of the 16 ranges cannot be kept in memory until their turn
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: dst, size, computeChecksum: true, slabSize: MiB / 2 });
    expect(await call(rx.port, 'GET', `/v1-ssync/open?begin=0&end=${size}`)).toBe(200);
    for (let off = size - MiB / 2; off >= 0; off -= MiB / 2) {
      expect(await call(rx.port, 'POST', `/v1-ssync/writeData?begin=${off}&end=${off + MiB / 2}`, data.subarray(off, off + MiB / 2))).toBe(200);
    }
    expect(await call(rx.port, 'POST', '/v1-ssync/close')).toBe(200);
    const got = await rx.done;
    await rx.closed;
    expect(got.sha512).toBe(createHash('sha512').update(data).digest('hex'));
    expect(got.hashStats!.readBackBytes).toBeGreaterThan(0);
    expect(got.hashStats!.inOrderBytes + got.hashStats!.readBackBytes).toBe(size);
    expect(got.hashStats!.postPassBytes).toBe(0);
  });

  it('bodies larger than a slab are written in slab-sized pieces; the hash stays exact', async () => {
    const src = await sparseFile('src', 'ddhdddhd');
    const dst = path.join(dir, 'dst');
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: dst, size: 8 * MiB, computeChecksum: true, slabSize: 256 * 1024 });
    await sendFile({ ...path_.tx, path: src, toAddress: `127.0.0.1:${rx.port}`, layout: (p) => getFileLayout(p), chunkSize: 2 * MiB, workers: 3 });
    const got = await rx.done;
    await rx.closed;
    expect(got.sha512).toBe(sha(src));
    expect(sha(dst)).toBe(sha(src));
    expect(got.hashStats!.inOrderBytes + got.hashStats!.readBackBytes).toBe(6 * MiB);
    expect(got.hashStats!.postPassBytes).toBe(0);
  });

  it('receiving never waits behind a gap: the window is reclaimed; cancelling with ranges retained ends the receive', async () => {
    const K = 64 * 1024;
    const ac = new AbortController();
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: path.join(dir, 'dst'), size: 8 * K, computeChecksum: true, slabSize: K, signal: ac.signal });
    expect(await call(rx.port, 'GET', `/v1-ssync/open?begin=0&end=${8 * K}`)).toBe(200);
    // range 0 never arrives; ranges 1..7 are more than the 4-slab window and are all acknowledged
    for (let i = 1; i < 8; i++) expect(await call(rx.port, 'POST', `/v1-ssync/writeData?begin=${i * K}&end=${(i + 1) * K}`, randomBytes(K))).toBe(200);
    ac.abort();
    await expect(rx.done).rejects.toThrow('receiving cancelled');
    await rx.closed;
  });

  it('a range written twice with different bytes drops the in-order hash: the post-pass hashes the final file', async () => {
    const size = 4 * MiB;
    const first = Buffer.alloc(MiB, 1);
    const second = randomBytes(MiB);
    const dst = path.join(dir, 'dst');
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: dst, size, computeChecksum: true });
    expect(await call(rx.port, 'GET', `/v1-ssync/open?begin=0&end=${size}`)).toBe(200);
    expect(await call(rx.port, 'POST', `/v1-ssync/writeData?begin=0&end=${MiB}`, first)).toBe(200);
    expect(await call(rx.port, 'POST', `/v1-ssync/sendHole?begin=${MiB}&end=${3 * MiB}`)).toBe(200);
    expect(await call(rx.port, 'POST', `/v1-ssync/writeData?begin=0&end=${MiB}`, second)).toBe(200);
    expect(await call(rx.port, 'POST', `/v1-ssync/writeData?begin=${3 * MiB}&end=${4 * MiB}`, first)).toBe(200);
    expect(await call(rx.port, 'POST', '/v1-ssync/close')).toBe(200);
    const got = await rx.done;
    await rx.closed;
    expect(got.sha512).toBe(sha(dst));
    expect(readFileSync(dst).subarray(0, MiB).equals(second)).toBe(true);
    expect(got.hashStats!.postPassBytes).toBe(size);
  });

  it('a short body fails the request and leaves the hash consistent with what the retry writes', async () => {
    const size = MiB;
    const data = randomBytes(size);
    const dst = path.join(dir, 'dst');
    const rx = await startSsyncReceiver({ ...path_.rx, port: 0, host: '127.0.0.1', filePath: dst, size, computeChecksum: true });
    expect(await call(rx.port, 'GET', `/v1-ssync/open?begin=0&end=${size}`)).toBe(200);
    expect(await call(rx.port, 'POST', `/v1-ssync/writeData?begin=0&end=${size}`, data.subarray(0, 1000))).toBe(400);
    expect(await call(rx.port, 'POST', `/v1-ssync/writeData?begin=0&end=${size}`, data)).toBe(200);
    expect(await call(rx.port, 'POST', '/v1-ssync/close')).toBe(200);
    const got = await rx.done;
    await rx.closed;
    expect(got.sha512).toBe(createHash('sha512').update(data).digest('hex'));
    expect(got.hashStats!.postPassBytes).toBe(0);
  });
});

describe('ssync sender requests', () => {
  /** A receiver that records every request and answers 200 (`sha512Chain` as `chainStatus`), or never answers writeData. */
  async function recordingReceiver(chainStatus: number, hangWriteData = false) {
    const seen: Array<{ op: string; begin: number; end: number; bytes: number }> = [];
    const server = http.createServer((req, res) => {
      const url = new URL(req.url!, 'http://x');
      const op = url.pathname.replace('/v1-ssync/', '');
      let bytes = 0;
      req.on('data', (c: Buffer) => (bytes += c.length));
      req.on('end', () => {
        seen.push({ op, begin: Number(url.searchParams.get('begin')), end: Number(url.searchParams.get('end')), bytes });
        if (op === 'writeData' && hangWriteData) return;
        res.statusCode = op === 'sha512Chain' ? chainStatus : 200;
        res.end(op === 'open' ? 'false' : '');
      });
    });
    return { ...(await listenOnLoopback(server)), seen };
  }

  it('sends 2 MiB writeData requests with Content-Length bodies to a receiver without chains (Longhorn), 8 MiB ones from the page cache to ours', async () => {
    const src = await sparseFile('src', 'dddddddddddd'); // 12 MiB of data
    const { computeFileChain } = await import('@bis/sha512-chain');
    const { sendFileAvailable } = await import('@bis/block-mapping');
    const chain = await computeFileChain(src);
    const twoMiB = Array(6).fill(2 * MiB);
    const cases: Array<[status: number, accepted: boolean, sendfile: boolean | undefined, sizes: number[]]> = [
      [404, false, undefined, twoMiB],
      [200, true, false, twoMiB],
      // with sendfile a larger body costs no memory on either side
      [200, true, undefined, sendFileAvailable() ? [8 * MiB, 4 * MiB] : twoMiB],
    ];
    for (const [status, accepted, sendfile, sizes] of cases) {
      const rx = await recordingReceiver(status);
      try {
        const r = await sendFile({ path: src, toAddress: `127.0.0.1:${rx.port}`, layout: (p) => getFileLayout(p), chain, sendfile });
        expect(r.chainAccepted).toBe(accepted);
        expect(r.sendfileBytes).toBe(sendfile === false || !sendFileAvailable() ? 0 : 12 * MiB);
        const writes = rx.seen.filter((s) => s.op === 'writeData');
        expect(writes.map((w) => w.end - w.begin).sort((a, b) => b - a)).toEqual(sizes); // workers finish in any order
        expect(writes.every((w) => w.bytes === w.end - w.begin)).toBe(true);
        expect(writes.reduce((n, w) => n + w.bytes, 0)).toBe(12 * MiB);
        expect(rx.seen[rx.seen.length - 1]!.op).toBe('close');
      } finally {
        await rx.close();
      }
    }
  });

  it('three receives at once in one process (sharing its slabs and its budget of pending pieces) all arrive intact', async () => {
    const { computeFileChain } = await import('@bis/sha512-chain');
    const sources = await Promise.all(['a', 'b', 'c'].map((n, i) => sparseFile(`src-${n}`, ['ddhhdddd', 'hhdddddd', 'dddddddd'][i]!.repeat(3))));
    const chains = await Promise.all(sources.map((f) => computeFileChain(f)));
    const rxs = await Promise.all(sources.map((_, i) => startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: path.join(dir, `dst-${i}`), size: 24 * MiB })));
    await Promise.all(sources.map((src, i) => sendFile({ path: src, toAddress: `127.0.0.1:${rxs[i]!.port}`, layout: (p) => getFileLayout(p), chain: chains[i] })));
    const got = await Promise.all(rxs.map((r) => r.done));
    await Promise.all(rxs.map((r) => r.closed));
    for (let i = 0; i < 3; i++) {
      expect(sha(path.join(dir, `dst-${i}`))).toBe(sha(sources[i]!));
      expect(got[i]!.sha512).toBe(sha(sources[i]!));
      expect(got[i]!.chainStats!.readBack).toBe(0);
    }
  });

  it('with a chain, answered segments are verified in fuller SHA-512 passes, and every one is checked', async () => {
    const src = await sparseFile('src', 'd'.repeat(48)); // 24 data segments of 2 MiB
    const { computeFileChain, multiBufferLanes, sharedSha512Scheduler } = await import('@bis/sha512-chain');
    const chain = await computeFileChain(src);
    const dst = path.join(dir, 'dst');
    const before = { ...sharedSha512Scheduler().stats };
    const rx = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: dst, size: 48 * MiB, computeChecksum: true });
    await sendFile({ path: src, toAddress: `127.0.0.1:${rx.port}`, layout: (p) => getFileLayout(p), chain });
    const got = await rx.done;
    await rx.closed;
    expect(got.sha512).toBe(sha(src));
    expect(got.chainStats).toEqual({ segments: 24, inFlight: 24, holes: 0, readBack: 0 });
    const calls = sharedSha512Scheduler().stats.calls - before.calls;
    expect(sharedSha512Scheduler().stats.messages - before.messages).toBe(24);
    // with several lanes (eight with AVX-512, four with AVX2) the answered segments wait for company: far fewer
    // passes than segments; one lane (OpenSSL) is one pass per segment
    const lanes = multiBufferLanes();
    if (lanes > 1) expect(calls).toBeLessThanOrEqual(Math.max(12, 2 * Math.ceil(24 / lanes)));
    else expect(calls).toBe(24);
  });

  it('a segment that fails its check after its answer: the next request, even on a new connection, is told why before the port closes', async () => {
    const src = await sparseFile('src', 'dddd'); // 2 segments of 2 MiB
    const { computeFileChain, encodeChain } = await import('@bis/sha512-chain');
    const chain = await computeFileChain(src);
    const rx = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: path.join(dir, 'dst'), size: 4 * MiB, fatalLingerMs: 60_000 });
    /** One request on a connection of its own; the status and the answer's text. */
    const ask = (method: string, op: string, body?: Buffer) =>
      new Promise<{ status: number; text: string }>((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port: rx.port, method, path: `/v1-ssync/${op}`, agent: false }, (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => resolve({ status: res.statusCode!, text: Buffer.concat(chunks).toString() }));
        });
        req.on('error', (e) => reject(new Error(`${op}: ${e.message}`)));
        req.end(body);
      });
    expect((await ask('GET', 'open?begin=0&end=' + 4 * MiB + '&directIO=false')).status).toBe(200);
    expect((await ask('POST', 'sha512Chain', encodeChain(chain))).status).toBe(200);
    const bad = readFileSync(src).subarray(0, 2 * MiB);
    bad[12345] ^= 0xff;
    // a whole segment: verified while it is written, after the answer may have gone out
    const write = await ask('POST', `writeData?begin=0&end=${2 * MiB}`, bad);
    const rejected = rx.done.then(
      () => 'completed',
      (e: Error) => e.message,
    );
    // until the check has failed a harmless request is served; from then on every request gets the failure
    let last = write;
    while (last.status === 200) {
      await new Promise((r) => setTimeout(r, 10));
      last = await ask('GET', `getChecksum?begin=${2 * MiB}&end=${4 * MiB}`);
    }
    expect(last.status).toBe(400);
    expect(last.text).toContain("the received data does not match the sender's SHA-512 chain");
    expect(last.text).toContain('segment 0');
    // the sender has been told: the receive ends without waiting out the linger
    expect(await rejected).toBe(last.text.trim());
    await rx.closed;
    await expect(ask('GET', 'getChecksum?begin=0&end=1')).rejects.toThrow(/ECONNREFUSED/);
  });

  it('a request the receiver never answers times out with the per-request timeout and is not closed as complete', async () => {
    const src = await sparseFile('src', 'dd');
    const rx = await recordingReceiver(404, true);
    try {
      // the message names the 300 ms per-request timeout: that timer, not another one, ended the request
      await expect(
        sendFile({ path: src, toAddress: `127.0.0.1:${rx.port}`, layout: (p) => getFileLayout(p), attempts: 1, requestTimeoutMs: () => 300 }),
      ).rejects.toThrow('writeData timed out after 300 ms');
      expect(rx.seen.some((s) => s.op === 'close')).toBe(false);
    } finally {
      await rx.close();
    }
  });
});

// The sendfile path needs the block-mapping addon built with startSendFile (node libs/block-mapping/native/build.mjs);
// without it `sendfile: true` only falls back to reading after a failed attempt, and there is no sendfile transfer to
// test: the suite is skipped.
const sendfileUsable = sendFileAvailable();
if (!sendfileUsable) console.warn('ssync sender with sendfile: skipped, the block_mapping addon lacks startSendFile');
const describeWithSendfile = sendfileUsable ? describe : describe.skip;

describeWithSendfile('ssync sender with sendfile', () => {
  /** Threads of this process (a sendfile transfer runs on a thread of its own). */
  const threadCount = () => readdirSync('/proc/self/task').length;
  /** Waits until no more threads run than `baseline` (every sendfile thread ended), failing after `ms`. */
  async function threadsBackTo(baseline: number, ms = 2000): Promise<void> {
    const deadline = Date.now() + ms;
    while (threadCount() > baseline) {
      if (Date.now() > deadline) throw new Error(`${threadCount() - baseline} thread(s) still running after ${ms} ms`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /**
   * A receiver that answers open (`false`), refuses chains (404), acknowledges holes and close, and handles writeData
   * with `onWriteData`. Records the operations it saw (writeData when its handler is called, the others when answered).
   */
  async function scriptedReceiver(onWriteData: (req: http.IncomingMessage, res: http.ServerResponse) => void) {
    const ops: string[] = [];
    const server = http.createServer((req, res) => {
      const op = new URL(req.url!, 'http://x').pathname.replace('/v1-ssync/', '');
      if (op === 'writeData') {
        ops.push(op);
        return onWriteData(req, res);
      }
      req.resume();
      req.on('end', () => {
        ops.push(op);
        res.statusCode = op === 'sha512Chain' ? 404 : 200;
        res.end(op === 'open' ? 'false' : '');
      });
    });
    return { ...(await listenOnLoopback(server)), ops };
  }

  it('a sparse file arrives identical with and without sendfile; sendfileBytes counts the data sent with it', async () => {
    const src = await sparseFile('src', 'dhhdddhhdd');
    // an odd-sized tail after the last whole MiB
    await fsp.appendFile(src, randomBytes(12345));
    const size = 10 * MiB + 12345;
    const dataBytes = 6 * MiB + 12345;
    const { computeFileChain } = await import('@bis/sha512-chain');
    const chain = await computeFileChain(src);
    const cases: Array<{ sendfile: boolean; withChain: boolean }> = [
      { sendfile: true, withChain: false },
      { sendfile: false, withChain: false },
      { sendfile: true, withChain: true }, // 8 MiB bodies where segments allow
    ];
    const digests: string[] = [];
    for (const [i, c] of cases.entries()) {
      const dst = path.join(dir, `dst${i}`);
      const rx = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: dst, size, computeChecksum: !c.withChain });
      const r = await sendFile({
        path: src,
        toAddress: `127.0.0.1:${rx.port}`,
        layout: (p) => getFileLayout(p),
        sendfile: c.sendfile,
        chain: c.withChain ? chain : undefined,
      });
      const got = await rx.done;
      await rx.closed;
      expect(r).toMatchObject({ size, dataBytes, retries: 0, chainAccepted: c.withChain, sendfileBytes: c.sendfile ? dataBytes : 0 });
      expect(got).toMatchObject({ size, dataBytes });
      if (!c.withChain) expect(got.sha512).toBe(sha(src));
      digests.push(sha(dst));
    }
    expect(digests).toEqual([sha(src), sha(src), sha(src)]);
  });

  it('a receiver that refuses writeData before reading the body: SsyncSendError with the status, no hang, no thread left', async () => {
    const src = await sparseFile('src', 'd'.repeat(16));
    const rx = await scriptedReceiver((req, res) => {
      // answer at once, before reading the body; then read and drop it, as a careful server does: closing with the
      // body unread makes the kernel reset the connection, which may discard the answer before the sender reads it
      // (the sender then cannot know it was refused and rightly tries again)
      res.writeHead(400, { 'Content-Type': 'text/plain' });
      res.end('writeData refused\n');
      req.resume();
    });
    const baseline = threadCount();
    try {
      const err = await sendFile({ path: src, toAddress: `127.0.0.1:${rx.port}`, layout: (p) => getFileLayout(p), sendfile: true, chunkSize: 16 * MiB }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(SsyncSendError);
      expect(err).toMatchObject({ status: 400, message: expect.stringContaining('HTTP 400: writeData refused') });
      // a refusal is not retried
      expect(rx.ops.filter((op) => op === 'writeData')).toHaveLength(1);
      expect(rx.ops).not.toContain('close');
      await threadsBackTo(baseline);
    } finally {
      await rx.close();
    }
  }, 10_000);

  it('a receiver that never reads the writeData body: the request times out promptly (the transfer is cancelled) and close is never sent', async () => {
    // one 32 MiB body: more than the loopback socket buffers hold, so the transfer is still waiting when the timer fires
    const src = await sparseFile('src', 'd'.repeat(32));
    const rx = await scriptedReceiver((req) => req.socket.pause());
    const baseline = threadCount();
    try {
      await expect(
        sendFile({
          path: src,
          toAddress: `127.0.0.1:${rx.port}`,
          layout: (p) => getFileLayout(p),
          sendfile: true,
          chunkSize: 32 * MiB,
          attempts: 1,
          requestTimeoutMs: () => 300,
        }),
      ).rejects.toThrow('writeData timed out after 300 ms');
      expect(rx.ops).toEqual(['open', 'writeData']);
      await threadsBackTo(baseline);
    } finally {
      await rx.close();
    }
  }, 10_000);

  it('aborting during a large writeData to a slow receiver rejects promptly with the reason', async () => {
    const src = await sparseFile('src', 'd'.repeat(32));
    let bodyBytes = 0;
    const rx = await scriptedReceiver((req) => {
      // reads a little, then waits: far slower than the sender
      req.on('data', (c: Buffer) => {
        bodyBytes += c.length;
        req.pause();
        setTimeout(() => req.resume(), 50);
      });
    });
    const ac = new AbortController();
    const baseline = threadCount();
    try {
      const sending = sendFile({
        path: src,
        toAddress: `127.0.0.1:${rx.port}`,
        layout: (p) => getFileLayout(p),
        sendfile: true,
        chunkSize: 32 * MiB,
        signal: ac.signal,
      });
      const outcome = sending.then(
        () => 'resolved',
        (e: unknown) => e,
      );
      // wait until the body is flowing (no fixed sleep: the machine may be loaded)
      while (bodyBytes === 0) await new Promise((r) => setTimeout(r, 20));
      ac.abort(new Error('stop sending'));
      // promptly: the sender settles while the slow receiver has read only part of the 32 MiB body
      const err = await outcome;
      expect(err).toBeInstanceOf(Error);
      expect((err as Error).message).toBe('stop sending');
      expect(bodyBytes).toBeLessThan(32 * MiB);
      expect(rx.ops).not.toContain('close');
      await threadsBackTo(baseline);
    } finally {
      await rx.close();
    }
  }, 10_000);
});
