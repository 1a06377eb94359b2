import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { getFileLayout } from '@bis/block-mapping';
import { SyncService } from './sync-service.js';
import { sendFile } from './ssync/sender.js';
import { backingFilePath, cfgPathOf } from './layout.js';
import { readSyncingFileConfig } from './backing-cfg.js';
import { freePort } from './test-support/free-port.js';

/** Polls until `fn` gives a value (every 25 ms), failing after `timeoutMs`. */
async function waitFor<T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 10_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}
import net from 'node:net';

const MiB = 1 << 20;
const sha = (f: string) => createHash('sha512').update(readFileSync(f)).digest('hex');

function hasQemuImg(): boolean {
  try {
    execFileSync('qemu-img', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

async function waitSettled(svc: SyncService, filePath: string): Promise<void> {
  await svc.settled(filePath);
}

let dir: string;
let svc: SyncService;
beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sync-rx-'));
  svc = new SyncService({ diskPath: dir, receiverHost: '127.0.0.1', monitorIntervalMs: 0 });
});
afterEach(async () => {
  await svc.close();
  await fsp.rm(dir, { recursive: true, force: true });
});

async function rawImage(pattern: string): Promise<string> {
  const f = path.join(dir, 'source.raw');
  const fh = await fsp.open(f, 'w');
  await fh.truncate(pattern.length * MiB);
  for (let i = 0; i < pattern.length; i++) if (pattern[i] === 'd') await fh.write(randomBytes(MiB), 0, MiB, i * MiB);
  await fh.close();
  return f;
}

describe('SyncService.receiveFromPeer', () => {
  it('raw: the checksum computed while receiving is the stored file SHA-512 and lands in backing.cfg', async () => {
    const src = await rawImage('dhhddhdh');
    const filePath = backingFilePath(dir, 'img', 'u1');
    const port = await freePort();
    await svc.receiveFromPeer({ filePath, uuid: 'u1', size: 8 * MiB, port, expectedChecksum: sha(src) });
    await sendFile({ path: src, toAddress: `127.0.0.1:${port}`, layout: (p) => getFileLayout(p) });
    await waitSettled(svc, filePath);
    const info = svc.get(filePath);
    expect(info.state).toBe('ready');
    expect(info.currentChecksum).toBe(sha(src));
    expect(sha(filePath)).toBe(sha(src));
    expect((await readSyncingFileConfig(cfgPathOf(filePath)))!.currentChecksum).toBe(sha(src));
  });

  it('raw: a wrong expected checksum fails with both values and removes the tmp file', async () => {
    const src = await rawImage('dd');
    const filePath = backingFilePath(dir, 'img', 'u2');
    const port = await freePort();
    const wrong = 'ef'.repeat(64);
    await svc.receiveFromPeer({ filePath, uuid: 'u2', size: 2 * MiB, port, expectedChecksum: wrong });
    await sendFile({ path: src, toAddress: `127.0.0.1:${port}`, layout: (p) => getFileLayout(p) });
    await waitSettled(svc, filePath);
    const info = svc.get(filePath);
    expect(info.state).toBe('failed');
    expect(info.message).toBe(`failed to process sync file: the expected checksum ${wrong} doesn't match the file actual checksum ${sha(src)}`);
    await expect(fsp.stat(filePath + '.tmp')).rejects.toThrow();
  });

  const qemu = hasQemuImg();
  // qemu-img (Debian qemu-utils) is installed by .ci/run; without it the conversion cannot be exercised at all.
  (qemu ? it : it.skip)('file-type=qcow2: received raw bytes are stored as a qcow2 image that converts back to the same raw data', async () => {
    const src = await rawImage('dhhdhhhd');
    const filePath = backingFilePath(dir, 'img', 'u3');
    const port = await freePort();
    await svc.receiveFromPeer({ filePath, uuid: 'u3', size: 8 * MiB, port, fileType: 'qcow2' });
    await sendFile({ path: src, toAddress: `127.0.0.1:${port}`, layout: (p) => getFileLayout(p) });
    await waitSettled(svc, filePath);
    const info = svc.get(filePath);
    expect(info.message).toBe('');
    expect(info.state).toBe('ready');
    const head = readFileSync(filePath).subarray(0, 4);
    expect(head.readUInt32BE(0)).toBe(0x514649fb); // "QFI\xfb"
    expect(info.virtualSize).toBe(8 * MiB);
    expect(info.size).toBe((await fsp.stat(filePath)).size);
    expect(info.currentChecksum).toBe(sha(filePath));
    const back = path.join(dir, 'back.raw');
    execFileSync('qemu-img', ['convert', '-f', 'qcow2', '-O', 'raw', filePath, back]);
    expect(sha(back)).toBe(sha(src));
    await expect(fsp.stat(filePath + '.tmp.qcow2tmp')).rejects.toThrow();
  });

  /**
   * A sender that opens the file and starts a 4 MiB writeData, sends 1 MiB of its body, then either dies (its socket
   * destroyed: what a kill -9 of its process does to the connection) or stalls (the socket stays open, nothing more).
   */
  async function partialSender(port: number, then: 'die' | 'stall'): Promise<net.Socket> {
    // the receiver starts listening shortly after receiveFromPeer returns: connect once it does
    let s: net.Socket;
    for (;;) {
      const c = net.connect({ host: '127.0.0.1', port });
      const ok = await new Promise<boolean>((resolve) => c.once('connect', () => resolve(true)).once('error', () => resolve(false)));
      if (ok) {
        s = c;
        break;
      }
      c.destroy();
      await new Promise((r) => setTimeout(r, 20));
    }
    s.on('error', () => undefined);
    const answers: string[] = [];
    s.on('data', (b: Buffer) => answers.push(b.toString('latin1')));
    s.write(`GET /v1-ssync/open?begin=0&end=${4 * MiB} HTTP/1.1\r\nHost: rx\r\n\r\n`);
    // the open is answered before the data starts
    while (!answers.join('').includes('\r\n\r\n')) await new Promise((r) => setTimeout(r, 10));
    s.write(`POST /v1-ssync/writeData?begin=0&end=${4 * MiB} HTTP/1.1\r\nHost: rx\r\nContent-Length: ${4 * MiB}\r\n\r\n`);
    await new Promise<void>((resolve) => s.write(randomBytes(MiB), () => resolve()));
    if (then === 'die') s.destroy();
    return s;
  }

  it('a sender killed mid-transfer fails the receive within the sender-gone time, with a clear message, and the tmp file is removed', async () => {
    // the stall timeout stays long: only the closed connection can end this receive promptly
    const svc2 = new SyncService({ diskPath: dir, receiverHost: '127.0.0.1', monitorIntervalMs: 0, receiverIdleTimeoutMs: 600_000 });
    try {
      const filePath = backingFilePath(dir, 'img', 'k1');
      const port = await freePort();
      await svc2.receiveFromPeer({ filePath, uuid: 'k1', size: 4 * MiB, port });
      await partialSender(port, 'die');
      await svc2.settled(filePath);
      const info = svc2.get(filePath);
      expect(info.state).toBe('failed');
      expect(info.message).toMatch(/connection closed in the middle of a request .*the sender is gone/);
      await expect(fsp.stat(filePath + '.tmp')).rejects.toThrow();
    } finally {
      await svc2.close();
    }
  });

  it('a sender that stalls (connection open, no byte) fails the receive after the stall timeout and the tmp file is removed', async () => {
    const svc2 = new SyncService({ diskPath: dir, receiverHost: '127.0.0.1', monitorIntervalMs: 0, receiverIdleTimeoutMs: 500 });
    let sock: net.Socket | undefined;
    try {
      const filePath = backingFilePath(dir, 'img', 'k2');
      const port = await freePort();
      await svc2.receiveFromPeer({ filePath, uuid: 'k2', size: 4 * MiB, port });
      sock = await partialSender(port, 'stall');
      await svc2.settled(filePath);
      const info = svc2.get(filePath);
      expect(info.state).toBe('failed');
      // the stall came while reading a 2 MiB piece: its timeout is 2 MiB at the default floor of 1 MiB/s
      expect(info.message).toContain('no 2097152-byte piece of a request body from the sender in 2 seconds');
      await expect(fsp.stat(filePath + '.tmp')).rejects.toThrow();
    } finally {
      sock?.destroy();
      await svc2.close();
    }
  });

  it('a receiver whose sender says it is busy is kept waiting past the stall timeout, and stalls again once that stops', async () => {
    const svc2 = new SyncService({ diskPath: dir, receiverHost: '127.0.0.1', monitorIntervalMs: 0, receiverIdleTimeoutMs: 1000 });
    let keeping: NodeJS.Timeout | undefined;
    try {
      const filePath = backingFilePath(dir, 'img', 'k5');
      expect(svc2.keepReceiverWaiting(filePath)).toBe(false);
      await svc2.receiveFromPeer({ filePath, uuid: 'k5', size: 4 * MiB, port: await freePort() });
      await waitFor('the receiver listening', async () => (svc2.keepReceiverWaiting(filePath) ? true : undefined));
      // What the manager does on each "busy" answer of its sender (every 0.25 to 2 s there; every 50 ms here).
      keeping = setInterval(() => svc2.keepReceiverWaiting(filePath), 50);
      const started = performance.now();
      await waitFor('three stall timeouts to pass', async () => (performance.now() - started > 3000 ? true : undefined), 60_000);
      // still waiting for its sender's first request
      expect(svc2.get(filePath).state).toBe('starting');
      clearInterval(keeping);
      keeping = undefined;
      await svc2.settled(filePath);
      expect(svc2.get(filePath).state).toBe('failed');
      expect(svc2.get(filePath).message).toContain('no request from the sender in 1 seconds');
      expect(svc2.keepReceiverWaiting(filePath)).toBe(false);
    } finally {
      if (keeping) clearInterval(keeping);
      await svc2.close();
    }
  });

  it('a receive cut short by the service shutting down leaves neither its file nor its directory (no Delete will come for it)', async () => {
    const svc2 = new SyncService({ diskPath: dir, receiverHost: '127.0.0.1', monitorIntervalMs: 0 });
    const filePath = backingFilePath(dir, 'img', 'k3');
    const kept = backingFilePath(dir, 'other', 'k4');
    await fsp.mkdir(path.dirname(kept), { recursive: true });
    await fsp.writeFile(kept + '.note', 'not ours to remove');
    await svc2.receiveFromPeer({ filePath, uuid: 'k3', size: 4 * MiB, port: await freePort() });
    await svc2.receiveFromPeer({ filePath: kept, uuid: 'k4', size: 4 * MiB, port: await freePort() });
    // the receive has begun: its directory is made
    for (let i = 0; i < 1000 && !(await fsp.stat(path.dirname(filePath)).catch(() => undefined)); i++) await new Promise((r) => setTimeout(r, 10));
    expect((await fsp.stat(path.dirname(filePath))).isDirectory()).toBe(true);
    await svc2.close();
    expect(svc2.get(filePath).message).toContain('the sync service is shutting down');
    await expect(fsp.stat(path.dirname(filePath))).rejects.toMatchObject({ code: 'ENOENT' });
    // a directory that holds something else is left alone
    expect(await fsp.readFile(kept + '.note', 'utf8')).toBe('not ours to remove');
  });

  it('a slow but steady sender is not a stall: a piece may take max(idle timeout, piece / minimum sender rate)', async () => {
    // the idle timeout alone (300 ms) is far shorter than reading one 2 MiB slab at ~1.3 MiB/s; the floor rate of
    // 256 KiB/s gives each slab 8 s
    const svc2 = new SyncService({ diskPath: dir, receiverHost: '127.0.0.1', monitorIntervalMs: 0, receiverIdleTimeoutMs: 300, receiverMinSenderRate: 256 * 1024 });
    let s: net.Socket | undefined;
    try {
      const filePath = backingFilePath(dir, 'img', 'k3');
      const port = await freePort();
      const body = randomBytes(4 * MiB);
      await svc2.receiveFromPeer({ filePath, uuid: 'k3', size: 4 * MiB, port });
      for (;;) {
        const c = net.connect({ host: '127.0.0.1', port });
        if (await new Promise<boolean>((resolve) => c.once('connect', () => resolve(true)).once('error', () => resolve(false)))) {
          s = c;
          break;
        }
        c.destroy();
        await new Promise((r) => setTimeout(r, 20));
      }
      const sock = s;
      sock.on('error', () => undefined);
      let answers = '';
      sock.on('data', (b: Buffer) => (answers += b.toString('latin1')));
      const answered = async (n: number): Promise<void> => {
        while (answers.split('HTTP/1.1 ').length - 1 < n) {
          if (svc2.get(filePath).state === 'failed') throw new Error(`the receive failed: ${svc2.get(filePath).message}`);
          await new Promise((r) => setTimeout(r, 10));
        }
      };
      sock.write(`GET /v1-ssync/open?begin=0&end=${4 * MiB} HTTP/1.1\r\nHost: rx\r\n\r\n`);
      await answered(1);
      sock.write(`POST /v1-ssync/writeData?begin=0&end=${4 * MiB} HTTP/1.1\r\nHost: rx\r\nContent-Length: ${4 * MiB}\r\n\r\n`);
      for (let at = 0; at < body.length; at += 128 * 1024) {
        await new Promise<void>((resolve) => sock.write(body.subarray(at, at + 128 * 1024), () => resolve()));
        await new Promise((r) => setTimeout(r, 100));
      }
      await answered(2);
      sock.write(`POST /v1-ssync/close HTTP/1.1\r\nHost: rx\r\nContent-Length: 0\r\n\r\n`);
      await svc2.settled(filePath);
      const info = svc2.get(filePath);
      expect(info.message).toBe('');
      expect(info.state).toBe('ready');
      expect(answers.match(/HTTP\/1\.1 (\d+)/g)).toEqual(['HTTP/1.1 200', 'HTTP/1.1 200', 'HTTP/1.1 200']);
      expect(sha(filePath)).toBe(createHash('sha512').update(body).digest('hex'));
    } finally {
      s?.destroy();
      await svc2.close();
    }
  });

  it('refuses an unknown file type with a message naming it', async () => {
    await expect(
      svc.receiveFromPeer({ filePath: backingFilePath(dir, 'img', 'u4'), uuid: 'u4', size: MiB, port: 1, fileType: 'vmdk' }),
    ).rejects.toThrow('invalid file type "vmdk" for receiving: must be raw or qcow2');
  });
});

describe('SyncService: forwarding a copy while it is received', () => {
  it('a copy asked to send while it receives forwards its verified segments; both copies end ready with the same checksum', async () => {
    const { computeFileChain } = await import('@bis/sha512-chain');
    const { isSendingLimitRefusal } = await import('./sync-service.js');
    const src = await rawImage('dd'.repeat(8) + 'hh'.repeat(8)); // 32 MiB: 8 data and 8 hole segments
    const size = 32 * MiB;
    const chain = await computeFileChain(src);
    const logs: string[] = [];
    const b = new SyncService({ diskPath: path.join(dir, 'b'), receiverHost: '127.0.0.1', monitorIntervalMs: 0, log: (m) => logs.push(m) });
    const c = new SyncService({ diskPath: path.join(dir, 'c'), receiverHost: '127.0.0.1', monitorIntervalMs: 0 });
    try {
      const onB = backingFilePath(path.join(dir, 'b'), 'img', 'u9');
      const onC = backingFilePath(path.join(dir, 'c'), 'img', 'u9');
      const [portB, portC] = [await freePort(), await freePort()];
      await b.receiveFromPeer({ filePath: onB, uuid: 'u9', size, port: portB, expectedChecksum: sha(src) });
      await c.receiveFromPeer({ filePath: onC, uuid: 'u9', size, port: portC, expectedChecksum: sha(src) });
      // asked before B's own sender has begun: the sends wait for B's receive to know its chain; of three asked at
      // once, the first is taken and the others are refused as busy
      const asked = [b.sendToPeer(onB, `127.0.0.1:${portC}`), b.sendToPeer(onB, '127.0.0.1:2'), b.sendToPeer(onB, '127.0.0.1:3')];
      const fromA = sendFile({ path: src, toAddress: `127.0.0.1:${portB}`, layout: (p) => getFileLayout(p), chain });
      const outcomes = await Promise.allSettled(asked);
      expect(outcomes[0]!.status).toBe('fulfilled');
      for (const o of outcomes.slice(1)) {
        expect(o.status).toBe('rejected');
        expect(isSendingLimitRefusal(((o as PromiseRejectedResult).reason as Error).message)).toBe(true);
      }
      expect(b.get(onB).state).not.toBe('ready');
      expect(b.get(onB).sendingReference).toBe(1);
      // one forwarding send per copy being received: another is refused as busy (the receiver asks again or another)
      const second = await b.sendToPeer(onB, '127.0.0.1:1').then(
        () => 'sent',
        (e: Error) => e.message,
      );
      expect(isSendingLimitRefusal(second)).toBe(true);
      await fromA;
      await Promise.all([b.settled(onB), c.settled(onC)]);
      await waitFor('the forwarding send to end', async () => (b.get(onB).sendingReference === 0 ? true : undefined));
      for (const [svc_, f] of [[b, onB], [c, onC]] as const) {
        expect(svc_.get(f)).toMatchObject({ state: 'ready', currentChecksum: sha(src) });
        expect(sha(f)).toBe(sha(src));
      }
      expect(logs.some((l) => l.startsWith(`forwarding ${onB} to 127.0.0.1:${portC} while it is received`))).toBe(true);
      expect(logs.some((l) => l.startsWith(`forwarded ${onB} to 127.0.0.1:${portC}: ${16 * MiB} data bytes, ${16 * MiB} hole bytes`))).toBe(true);
    } finally {
      await Promise.all([b.close(), c.close()]);
    }
  });

  it('a copy received without a SHA-512 chain (from a Longhorn sender) is not forwarded before it is complete', async () => {
    const src = await rawImage('dddd');
    const onB = backingFilePath(dir, 'img', 'u10');
    const port = await freePort();
    await svc.receiveFromPeer({ filePath: onB, uuid: 'u10', size: 4 * MiB, port, expectedChecksum: sha(src) });
    // a sender that offers no chain and stops after its first request (its sendHole): the receive goes on without one
    const { default: http } = await import('node:http');
    const ask = (op: string) =>
      new Promise<number>((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port, method: op === 'open' ? 'GET' : 'POST', path: `/v1-ssync/${op}`, agent: false }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode!));
        });
        req.on('error', reject);
        req.end();
      });
    await waitFor('the receiver to listen', async () => ((await ask(`open?begin=0&end=${4 * MiB}&directIO=false`).catch(() => 0)) === 200 ? true : undefined));
    expect(await ask(`sendHole?begin=0&end=${MiB}`)).toBe(200);
    await expect(svc.sendToPeer(onB, '127.0.0.1:1')).rejects.toThrow(`cannot forward ${onB} before it is complete: it is received without a SHA-512 chain`);
    expect(svc.get(onB).sendingReference).toBe(0);
    svc.cancel(onB, 'test over');
  });
});
