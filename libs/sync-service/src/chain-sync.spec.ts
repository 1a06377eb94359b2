import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http from 'node:http';
import { getFileLayout } from '@bis/block-mapping';
import { createFileSources } from '@bis/file-sources';
import { computeFileChain, nativeSha512ChainAvailable } from '@bis/sha512-chain';
import { SyncService } from './sync-service.js';
import { planBySegments, sendFile } from './ssync/sender.js';
import { startSsyncReceiver } from './ssync/receiver.js';
import { backingFilePath, cfgPathOf } from './layout.js';
import { readSyncingFileConfig } from './backing-cfg.js';
import { chainPathOf, readChainFile, readStoredChain, writeChainFile } from './chain-file.js';
import { statFile } from './file-util.js';
import { freePort } from './test-support/free-port.js';
import { listenOnLoopback } from './test-support/loopback-server.js';

const MiB = 1 << 20;
const SEG = 2 * MiB;
const sha = (f: string) => createHash('sha512').update(readFileSync(f)).digest('hex');
const layout = (p: string) => getFileLayout(p);

/** A sparse file: one character per MiB, 'd' = random data, 'h' = hole. */
async function sparseFile(f: string, pattern: string): Promise<void> {
  await fsp.mkdir(path.dirname(f), { recursive: true });
  const fh = await fsp.open(f, 'w');
  await fh.truncate(pattern.length * MiB);
  for (let i = 0; i < pattern.length; i++) if (pattern[i] === 'd') await fh.write(randomBytes(MiB), 0, MiB, i * MiB);
  await fh.close();
}

// 16 MiB = 8 segments: whole data, whole hole, data+data, holes, and two mixed segments (sent in pieces)
const PATTERN = 'ddhhddddhhhhdhhd';

let dir: string;
let logsA: string[];
let logsB: string[];
let a: SyncService;
let b: SyncService;
const fileA = () => backingFilePath(path.join(dir, 'A'), 'img', 'u1');
const fileB = () => backingFilePath(path.join(dir, 'B'), 'img', 'u1');

beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'chain-sync-'));
  logsA = [];
  logsB = [];
  a = new SyncService({ diskPath: path.join(dir, 'A'), receiverHost: '127.0.0.1', monitorIntervalMs: 0, log: (m) => logsA.push(m) });
  b = new SyncService({ diskPath: path.join(dir, 'B'), receiverHost: '127.0.0.1', monitorIntervalMs: 0, log: (m) => logsB.push(m) });
});
afterEach(async () => {
  await a.close();
  await b.close();
  await fsp.rm(dir, { recursive: true, force: true });
});

/** Makes A's file ready by re-adoption (Fetch with src == dst): the file is hashed once and its chain recorded. */
async function readyOnA(pattern = PATTERN): Promise<string> {
  const f = fileA();
  await sparseFile(f, pattern);
  await a.fetch({ filePath: f, srcFilePath: f, uuid: 'u1', diskUUID: 'A', size: pattern.length * MiB });
  await a.settled(f);
  expect(a.get(f).state).toBe('ready');
  return f;
}

async function receiveOnB(size: number, expectedChecksum?: string): Promise<number> {
  const port = await freePort();
  await b.receiveFromPeer({ filePath: fileB(), uuid: 'u1', size, port, expectedChecksum });
  return port;
}

async function bindingOf(f: string) {
  const cfg = (await readSyncingFileConfig(cfgPathOf(f)))!;
  return { size: cfg.size, modificationTime: cfg.modificationTime, checksum: cfg.currentChecksum };
}

async function waitFor(what: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!what()) {
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 20));
  }
}

const describeChain = nativeSha512ChainAvailable() ? describe : describe.skip;
// The chain addon is built at install (libs/sha512-chain/native/build.mjs); CI sets BIS_REQUIRE_NATIVE=1, so a missing
// addon fails the install there instead of skipping these tests.
describeChain('Sync with a SHA-512 chain', () => {
  it('re-adoption records the chain; Sync A->B verifies segments in flight; B is ready, sparse, same SHA-512, with its own chain', async () => {
    const src = await readyOnA();
    const checksum = sha(src);
    expect(a.get(src).currentChecksum).toBe(checksum);
    const chainA = await readChainFile(src, await bindingOf(src));
    expect(chainA?.checksum).toBe(checksum);
    expect(chainA?.states.length).toBe(8);

    const port = await receiveOnB(16 * MiB, checksum);
    await a.sendToPeer(src, `127.0.0.1:${port}`);
    await b.settled(fileB());
    const info = b.get(fileB());
    expect(info.message).toBe('');
    expect(info.state).toBe('ready');
    expect(info.currentChecksum).toBe(checksum);
    expect(sha(fileB())).toBe(checksum);
    // holes stayed holes: 7 MiB of data allocated (the data MiBs), not 16
    const st = await fsp.stat(fileB());
    expect(st.blocks * 512).toBeLessThan(9 * MiB);
    const chainB = await readChainFile(fileB(), await bindingOf(fileB()));
    expect(chainB?.checksum).toBe(checksum);
    expect(chainB?.states.map((s) => s.toString('hex'))).toEqual(chainA!.states.map((s) => s.toString('hex')));
    // whole data segments verified from the bodies (0, 2, 3), whole holes as zeros (1, 4, 5), mixed ones read back (6, 7)
    const line = logsB.find((l) => l.includes('SHA-512 chain:'));
    expect(line).toContain('8 segments, in flight 3, holes 3, read back 2');
    await waitFor(() => a.get(src).sendingReference === 0);
  });

  it('a corrupted chunk fails the copy with a message naming the segment and its bytes', async () => {
    const src = await readyOnA();
    const chain = (await readChainFile(src, await bindingOf(src)))!;
    // a test sender that sends the right chain but one wrong byte in segment 3 (bytes 6 MiB..8 MiB)
    const bad = await corruptedCopy(src, 7 * MiB + 5, (old) => Buffer.from([old[0]! ^ 0xff]));
    const port = await receiveOnB(16 * MiB, chain.checksum);
    // the sender fails too (usually with the receiver's answer naming the segment; a worker whose connection the
    // receiver closed mid-body may report that instead); the copy on B is what must name the segment
    await expect(sendFile({ path: bad, toAddress: `127.0.0.1:${port}`, layout, chain, attempts: 1 })).rejects.toThrow();
    await b.settled(fileB());
    const info = b.get(fileB());
    expect(info.state).toBe('failed');
    expect(info.message).toContain("does not match the sender's SHA-512 chain");
    expect(info.message).toContain('segment 3 (bytes 6291456..8388608)');
    await expect(fsp.stat(fileB() + '.tmp')).rejects.toThrow();
    await expect(fsp.stat(chainPathOf(fileB()))).rejects.toThrow();
  });

  it('a corrupted piece of a mixed segment (read back at close) fails the copy naming that segment', async () => {
    const src = await readyOnA();
    const chain = (await readChainFile(src, await bindingOf(src)))!;
    const bad = await corruptedCopy(src, 12 * MiB + 100, () => Buffer.from([1, 2, 3])); // segment 6 = 'dh'
    const port = await receiveOnB(16 * MiB);
    await sendFile({ path: bad, toAddress: `127.0.0.1:${port}`, layout, chain, attempts: 1 });
    await b.settled(fileB());
    expect(b.get(fileB()).state).toBe('failed');
    expect(b.get(fileB()).message).toContain('segment 6 (bytes 12582912..14680064)');
  });

  it('a sender without the route (Longhorn-style) still gets a ready copy through the sequential hash, which records a chain', async () => {
    const src = await readyOnA();
    const port = await receiveOnB(16 * MiB, sha(src));
    const r = await sendFile({ path: src, toAddress: `127.0.0.1:${port}`, layout });
    expect(r.chainAccepted).toBe(false);
    await b.settled(fileB());
    expect(b.get(fileB()).state).toBe('ready');
    expect(b.get(fileB()).currentChecksum).toBe(sha(src));
    expect(logsB.some((l) => l.includes('SHA-512 chain:'))).toBe(false);
    expect((await readChainFile(fileB(), await bindingOf(fileB())))?.checksum).toBe(sha(src));
  });

  it('a sender configured not to offer chains (sendChain: false) sends exactly as before', async () => {
    await a.close();
    a = new SyncService({ diskPath: path.join(dir, 'A'), receiverHost: '127.0.0.1', monitorIntervalMs: 0, sendChain: false });
    const src = await readyOnA();
    const port = await receiveOnB(16 * MiB);
    await a.sendToPeer(src, `127.0.0.1:${port}`);
    await b.settled(fileB());
    expect(b.get(fileB()).state).toBe('ready');
    expect(b.get(fileB()).currentChecksum).toBe(sha(src));
    expect(logsB.some((l) => l.includes('SHA-512 chain:'))).toBe(false);
  });

  it('a download records the chain in the pass that writes the file: the first send uses it at once, nothing is hashed again', async () => {
    // 12 MiB + 300 bytes of data with a run of zeros: the image is zero-padded to 512 bytes, and the chain covers
    // the padded file the managers store
    const image = Buffer.concat([randomBytes(5 * MiB), Buffer.alloc(3 * MiB), randomBytes(4 * MiB + 300)]);
    const server = http.createServer((_req, res) => {
      res.writeHead(200, { 'content-length': image.length });
      res.end(image);
    });
    const origin = await listenOnLoopback(server);
    const dl = new SyncService({
      diskPath: path.join(dir, 'A'),
      receiverHost: '127.0.0.1',
      monitorIntervalMs: 0,
      sources: createFileSources({ allowSourceHosts: ['127.0.0.1'] }),
      log: (m) => logsA.push(m),
    });
    try {
      const f = fileA();
      await dl.downloadFromURL({ filePath: f, uuid: 'u1', url: `http://127.0.0.1:${origin.port}/img`, diskUUID: 'A' });
      await dl.settled(f);
      expect(dl.get(f)).toMatchObject({ state: 'ready', message: '' });
      const padded = Buffer.concat([image, Buffer.alloc(512 - (image.length % 512))]);
      const sum = createHash('sha512').update(padded).digest('hex');
      expect(dl.get(f).currentChecksum).toBe(sum);
      // stored with the file, bound to its size, mtime and checksum, and it verifies the file
      const chain = await readChainFile(f, await bindingOf(f));
      expect(chain?.checksum).toBe(sum);
      expect(chain?.size).toBe(padded.length);
      expect(chain?.states.length).toBe(Math.ceil(padded.length / SEG));
      const port = await receiveOnB(padded.length);
      await dl.sendToPeer(f, `127.0.0.1:${port}`);
      await b.settled(fileB());
      expect(b.get(fileB()).state).toBe('ready');
      expect(b.get(fileB()).currentChecksum).toBe(sum);
      expect(logsA.some((l) => l.includes('computed and stored its SHA-512 chain'))).toBe(false);
      // the receiver verified segments against the chain the sender offered
      expect(logsB.some((l) => l.includes('SHA-512 chain:'))).toBe(true);
    } finally {
      await dl.close();
      await origin.close();
    }
  });

  it('a chain deleted on A is computed again when first needed for a send, stored, and used', async () => {
    const src = await readyOnA();
    await fsp.rm(chainPathOf(src));
    const port = await receiveOnB(16 * MiB);
    await a.sendToPeer(src, `127.0.0.1:${port}`);
    await b.settled(fileB());
    // the whole record on failure: its message says why
    expect(b.get(fileB())).toMatchObject({ state: 'ready' });
    expect(logsA.some((l) => l.includes('computed and stored its SHA-512 chain'))).toBe(true);
    expect(logsB.find((l) => l.includes('SHA-512 chain:'))).toContain('in flight 3');
    expect((await readChainFile(src, await bindingOf(src)))?.checksum).toBe(sha(src));
  });

  it('a stale chain (file touched) is not used; the touched file is re-verified against it and the chain re-bound', async () => {
    const src = await readyOnA();
    const before = await bindingOf(src);
    const t = new Date(Date.now() + 5000);
    await fsp.utimes(src, t, t);
    const st = await statFile(src);
    expect(st.modificationTime).not.toBe(before.modificationTime);
    // bound to the old mtime: not used any more
    expect(await readChainFile(src, { ...before, modificationTime: st.modificationTime })).toBeUndefined();
    expect(await readChainFile(src, before)).toBeDefined();
    // the monitor re-verifies the touched file (in parallel, against the stored chain) and re-binds everything
    await a.checkReadyFiles();
    expect(a.get(src).state).toBe('ready');
    const after = await bindingOf(src);
    expect(after.modificationTime).toBe(st.modificationTime);
    expect(after.checksum).toBe(before.checksum);
    expect(await readChainFile(src, after)).toBeDefined();
    expect((await readStoredChain(src))?.modificationTime).toBe(st.modificationTime);
  });

  it('a chain that does not fit the file (other content, same size) is never trusted: a modified file fails', async () => {
    const src = await readyOnA();
    const fh = await fsp.open(src, 'r+');
    await fh.write(Buffer.from('changed'), 0, 7, 100);
    await fh.close();
    await a.checkReadyFiles();
    const info = a.get(src);
    expect(info.state).toBe('failed');
    expect(info.message).toContain('was modified on disk');
    expect(logsA.some((l) => l.includes('the stored SHA-512 chain does not verify'))).toBe(true);
  });

  it('re-adoption after a restart trusts backing.cfg and keeps the chain valid', async () => {
    const src = await readyOnA();
    const binding = await bindingOf(src);
    await a.close();
    a = new SyncService({ diskPath: path.join(dir, 'A'), receiverHost: '127.0.0.1', monitorIntervalMs: 0 });
    await a.fetch({ filePath: src, srcFilePath: src, uuid: 'u1', diskUUID: 'A', size: 16 * MiB });
    await a.settled(src);
    expect(a.get(src).state).toBe('ready');
    expect(await bindingOf(src)).toEqual(binding);
    expect(await readChainFile(src, binding)).toBeDefined();
    // and it is used for the next send
    const port = await receiveOnB(16 * MiB);
    await a.sendToPeer(src, `127.0.0.1:${port}`);
    await b.settled(fileB());
    expect(b.get(fileB()).state).toBe('ready');
    expect(logsB.find((l) => l.includes('SHA-512 chain:'))).toContain('in flight 3');
  });

  it('re-adoption of a file whose mtime changed while the daemon was down verifies it in parallel against its chain', async () => {
    const src = await readyOnA();
    const before = await bindingOf(src);
    await a.close();
    const t = new Date(Date.now() + 7000);
    await fsp.utimes(src, t, t);
    const logs: string[] = [];
    a = new SyncService({ diskPath: path.join(dir, 'A'), receiverHost: '127.0.0.1', monitorIntervalMs: 0, log: (m) => logs.push(m) });
    await a.fetch({ filePath: src, srcFilePath: src, uuid: 'u1', diskUUID: 'A', size: 16 * MiB, expectedChecksum: before.checksum });
    await a.settled(src);
    expect(a.get(src).state).toBe('ready');
    expect(a.get(src).currentChecksum).toBe(sha(src));
    expect(logs.some((l) => l.includes('re-verified in parallel against its stored SHA-512 chain'))).toBe(true);
    const after = await bindingOf(src);
    expect(after.modificationTime).not.toBe(before.modificationTime);
    expect(await readChainFile(src, after)).toBeDefined();
  });

  it('re-adoption of a file changed while the daemon was down re-hashes it (the chain does not verify) and fails the expected checksum', async () => {
    const src = await readyOnA();
    const before = await bindingOf(src);
    await a.close();
    // the first byte flipped (it is random: a fixed byte was already there once in 256 runs, and the file unchanged)
    const fh = await fsp.open(src, 'r+');
    const first = Buffer.alloc(1);
    await fh.read(first, 0, 1, 0);
    await fh.write(Buffer.from([first[0]! ^ 0xff]), 0, 1, 0);
    await fh.close();
    // The change shows in the modification time, as it does when it comes later than the kernel's timestamp tick
    // (a write within the same tick as the file's last one keeps the recorded time, and the recorded checksum is
    // then trusted: the limit of a modification-time cache).
    const st = await fsp.stat(src);
    await fsp.utimes(src, st.atime, new Date(st.mtimeMs + 1000));
    const logs: string[] = [];
    a = new SyncService({ diskPath: path.join(dir, 'A'), receiverHost: '127.0.0.1', monitorIntervalMs: 0, log: (m) => logs.push(m) });
    await a.fetch({ filePath: src, srcFilePath: src, uuid: 'u1', diskUUID: 'A', size: 16 * MiB, expectedChecksum: before.checksum });
    await a.settled(src);
    // on failure, the record, the service's log and the binding it found show which way the file was taken back
    expect({ state: a.get(src).state, message: a.get(src).message, logs, found: before, now: await bindingOf(src) }).toMatchObject({ state: 'failed' });
    expect(a.get(src).message).toContain(`doesn't match the existing file checksum ${sha(src)}`);
    expect(logs.some((l) => l.includes('the stored SHA-512 chain does not verify') && l.includes('segment 0'))).toBe(true);
  });

  it('a receiver without the route (Longhorn-style, 404) gets the file as before', async () => {
    const src = await readyOnA();
    const chain = (await readChainFile(src, await bindingOf(src)))!;
    const dst = path.join(dir, 'plain-rx');
    const rx = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: dst, size: 16 * MiB, acceptChain: false, computeChecksum: true });
    const r = await sendFile({ path: src, toAddress: `127.0.0.1:${rx.port}`, layout, chain });
    expect(r.chainAccepted).toBe(false);
    const got = await rx.done;
    await rx.closed;
    expect(got.sha512).toBe(sha(src));
    expect(got.chainStats).toBeUndefined();
    expect(sha(dst)).toBe(sha(src));
  });

  it('deleting the copy deletes its chain file', async () => {
    const src = await readyOnA();
    expect((await fsp.stat(chainPathOf(src))).isFile()).toBe(true);
    await a.delete(src);
    await expect(fsp.stat(chainPathOf(src))).rejects.toThrow();
  });

  it('a malformed chain file is ignored', async () => {
    const src = await readyOnA();
    const binding = await bindingOf(src);
    await fsp.writeFile(chainPathOf(src), 'bis-sha512chain v1 {"modificationTime":"x"}\nnot a chain');
    expect(await readChainFile(src, binding)).toBeUndefined();
    const chain = await computeFileChain(src);
    await writeChainFile(src, chain, binding.modificationTime);
    expect(await readChainFile(src, binding)).toBeDefined();
    expect(await readChainFile(src, { ...binding, checksum: 'ab'.repeat(64) })).toBeUndefined();
    expect(await readChainFile(src, { ...binding, size: binding.size + 512 })).toBeUndefined();
  });
});

describeChain('the sha512Chain route', () => {
  it('refuses a chain after data (409), a malformed chain (400) and one for another size (400)', async () => {
    const src = path.join(dir, 'src');
    await sparseFile(src, 'dddd');
    const chain = await computeFileChain(src);
    const { encodeChain } = await import('@bis/sha512-chain');
    const rx = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: path.join(dir, 'dst'), size: 4 * MiB });
    const base = `http://127.0.0.1:${rx.port}/v1-ssync`;
    const post = (op: string, body: Uint8Array) => fetch(`${base}/${op}`, { method: 'POST', body });
    expect((await fetch(`${base}/open?begin=0&end=${4 * MiB}&directIO=false`)).status).toBe(200);
    const bad = await post('sha512Chain', Buffer.from('not a chain'));
    expect(bad.status).toBe(400);
    expect(await bad.text()).toContain('invalid SHA-512 chain encoding');
    const other = await computeFileChain(src, { segmentSize: MiB });
    const otherSize = { ...other, size: 2 * MiB, states: other.states.slice(0, 2) };
    const wrongSize = await post('sha512Chain', encodeChain(otherSize));
    expect(wrongSize.status).toBe(400);
    expect(await wrongSize.text()).toContain(`the SHA-512 chain is for ${2 * MiB} bytes, the file has ${4 * MiB}`);
    expect((await post(`sendHole?begin=0&end=${MiB}`, Buffer.alloc(0))).status).toBe(200);
    const late = await post('sha512Chain', encodeChain(chain));
    expect(late.status).toBe(409);
    // the receive goes on without a chain; close of an incomplete file fails it
    expect((await post('close', Buffer.alloc(0))).status).toBe(200);
    await expect(rx.done).rejects.toThrow('the sender closed an incomplete transfer');
    await rx.closed;
  });
});

/** A sparse copy of `src` (as `corrupted` in the test dir) whose bytes at `at` are replaced by `change(old bytes)`. */
async function corruptedCopy(src: string, at: number, change: (old: Buffer) => Buffer): Promise<string> {
  const bad = path.join(dir, 'corrupted');
  execFileSync('cp', ['--sparse=always', src, bad]);
  const fh = await fsp.open(bad, 'r+');
  try {
    const probe = Buffer.alloc(3);
    const { bytesRead } = await fh.read(probe, 0, probe.length, at);
    const next = change(probe.subarray(0, bytesRead));
    await fh.write(next, 0, next.length, at);
  } finally {
    await fh.close();
  }
  return bad;
}

describe('planBySegments', () => {
  it('keeps pieces inside segments, joins whole data segments up to the chunk size and hole runs freely', () => {
    const size = 10 * MiB;
    // data [0, 5 MiB), hole [5, 10 MiB)
    const tasks = planBySegments([{ offset: 0, length: 5 * MiB }], [{ offset: 5 * MiB, length: 5 * MiB }], size, SEG, 4 * MiB);
    expect(tasks).toEqual([
      { kind: 'data', begin: 0, end: 4 * MiB },
      { kind: 'data', begin: 4 * MiB, end: 5 * MiB },
      { kind: 'hole', begin: 5 * MiB, end: 10 * MiB },
    ]);
  });
});
