import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { status } from '@grpc/grpc-js';
import { backingFilePath, backingImageDir, dataSourceFilePath, readSyncingFileConfig, writeSyncingFileConfig } from '@bis/sync-service';
import { buildDaemon, makeDisk, runDaemonExpectingFailure, startDaemonProcess, type DaemonProcess } from './test-support/daemon-process.js';
import { allocatedBytes, sha512File, waitFor, writeSparseImage } from './test-support/images.js';
import { startFakeDataSource } from './test-support/fake-data-source.js';

const MiB = 1 << 20;

async function grpcCode(p: Promise<unknown>): Promise<{ code: number; details: string }> {
  try {
    await p;
  } catch (err) {
    const e = err as { code: number; details: string };
    return { code: e.code, details: e.details };
  }
  throw new Error('expected the call to fail');
}

async function stateOf(d: DaemonProcess, name: string, uuid: string): Promise<{ state: string; checksum: string; errorMsg: string; sendingReference: number }> {
  const r = await d.client.get(name, uuid);
  return { state: r.status!.state, checksum: r.status!.checksum, errorMsg: r.status!.errorMsg, sendingReference: r.status!.sendingReference };
}

function waitState(d: DaemonProcess, name: string, uuid: string, want: string, timeoutMs = 20_000) {
  return waitFor(`${name} ${want} on ${d.disk}`, async () => {
    const s = await stateOf(d, name, uuid);
    return s.state === want ? s : undefined;
  }, timeoutMs);
}

/** Fetches a prepared tmp file into a daemon through a stand-in data source. */
async function fetchPrepared(d: DaemonProcess, name: string, uuid: string, pattern: string, checksum = ''): Promise<string> {
  await fsp.mkdir(path.join(d.disk, 'tmp'), { recursive: true });
  const src = dataSourceFilePath(d.disk, name, uuid);
  const sha = await writeSparseImage(src, pattern);
  const ds = await startFakeDataSource({ filePath: src, uuid, state: 'ready-for-transfer', size: pattern.length * MiB });
  try {
    await d.client.fetch({ spec: { name, uuid, size: pattern.length * MiB, checksum, virtualSize: 0, realSize: 0 }, dataSourceAddress: ds.address });
    expect(ds.transfers).toBe(1);
  } finally {
    await ds.close();
  }
  return sha;
}

/**
 * Makes `a` send `name` to three slow stand-in receivers that hold the sends open until `release()`, so that `a` is
 * at its sending limit; checks that a fourth send is refused for that limit.
 */
async function holdThreeSends(a: DaemonProcess, name: string, uuid: string): Promise<{ release(): void }> {
  const release: Array<() => void> = [];
  const servers: http.Server[] = [];
  const addrs: string[] = [];
  let opened = 0;
  for (let i = 0; i < 4; i++) {
    const s = http.createServer((req, res) => {
      req.resume();
      if (req.url!.startsWith('/v1-ssync/open')) {
        opened++;
        return res.end('false');
      }
      release.push(() => res.end());
    });
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    servers.push(s);
    addrs.push(`127.0.0.1:${(s.address() as AddressInfo).port}`);
  }
  const releaseAll = (): void => {
    for (const s of servers) {
      s.closeAllConnections();
      s.close();
    }
    release.forEach((f) => f());
  };
  try {
    for (let i = 0; i < 3; i++) await a.client.send(name, uuid, addrs[i]!);
    expect((await stateOf(a, name, uuid)).sendingReference).toBe(3);
    const fourth = await grpcCode(a.client.send(name, uuid, addrs[3]!));
    expect(fourth.details).toContain('reaches to the simultaneous sending limit 3');
    // the sends have reached their receivers (a sender retries `open` for up to 120 s while nobody listens)
    await waitFor('three opens', async () => (opened === 3 ? true : undefined), 10_000);
  } catch (e) {
    releaseAll();
    throw e;
  }
  return { release: releaseAll };
}

describe('backing-image-manager daemon (real processes, gRPC, files)', () => {
  let root: string;
  const daemons: DaemonProcess[] = [];
  const start = async (disk: string, args: string[] = []) => {
    const d = await startDaemonProcess(disk, args);
    daemons.push(d);
    return d;
  };

  /**
   * Daemons `<prefix>A` and `<prefix>B` holding ready copies of a 4 MiB image (fetched on A, synced to B), with A no
   * longer sending; the image's Sync spec.
   */
  const twoReadyCopies = async (prefix: string, name: string, uuid: string) => {
    const a = await start(await makeDisk(root, `${prefix}A`));
    const b = await start(await makeDisk(root, `${prefix}B`));
    const sha = await fetchPrepared(a, name, uuid, 'dddd');
    await waitState(a, name, uuid, 'ready');
    const spec = { name, uuid, size: 4 * MiB, checksum: sha, virtualSize: 0, realSize: 0 };
    await b.client.sync({ spec, fromAddress: a.grpcAddress });
    await waitState(b, name, uuid, 'ready');
    await waitFor(`${prefix}A done sending to ${prefix}B`, async () => ((await stateOf(a, name, uuid)).sendingReference === 0 ? true : undefined), 10_000);
    return { a, b, sha, spec };
  };

  beforeAll(async () => {
    buildDaemon();
    root = await fsp.mkdtemp(path.join(os.tmpdir(), 'bim-daemon-'));
  }, 120_000);

  afterAll(async () => {
    await Promise.all(daemons.map((d) => d.stop()));
    await fsp.rm(root, { recursive: true, force: true });
  });

  it("starts with Longhorn's pod command line: the global --debug before the daemon command", async () => {
    const d = await startDaemonProcess(await makeDisk(root, 'debug-first'), [], {}, { globalArgs: ['--debug'] });
    daemons.push(d);
    expect((await d.client.versionGet()).backingImageManagerApiVersion).toBe(3);
  });

  it('refuses to start on a missing disk config or another disk UUID', async () => {
    const disk = await makeDisk(root, 'refuse', 'uuid-real');
    const mismatch = await runDaemonExpectingFailure(['--listen', '127.0.0.1:0', '--sync-listen', '127.0.0.1:0', '--disk-path', disk, '--disk-uuid', 'uuid-other']);
    expect(mismatch.code).toBe(1);
    expect(mismatch.stderr).toContain("invalid input disk UUID uuid-other which doesn't match disk UUID uuid-real");
    const empty = path.join(root, 'no-cfg');
    await fsp.mkdir(empty);
    const missing = await runDaemonExpectingFailure(['--listen', '127.0.0.1:0', '--sync-listen', '127.0.0.1:0', '--disk-path', empty]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain('cannot read the disk config file');
    await fsp.writeFile(path.join(empty, 'longhorn-disk.cfg'), 'not json');
    const bad = await runDaemonExpectingFailure(['--listen', '127.0.0.1:0', '--sync-listen', '127.0.0.1:0', '--disk-path', empty]);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain('invalid disk config file');
  });

  it('answers every validation error with the reference status codes and texts', async () => {
    const disk = await makeDisk(root, 'val');
    const a = await start(disk);
    const v = await a.client.versionGet();
    expect(v.backingImageManagerApiVersion).toBe(3);
    expect(v.backingImageManagerApiMinVersion).toBe(3);
    expect(await grpcCode(a.client.get('', 'u'))).toEqual({ code: status.INVALID_ARGUMENT, details: 'missing required argument' });
    expect((await grpcCode(a.client.get('xy', 'u'))).details).toBe('cannot find backing image xy(u)');
    expect((await grpcCode(a.client.get('xy', 'u'))).code).toBe(status.NOT_FOUND);
    // a name breaking Longhorn's name rule (here: one character) is refused, not looked up
    expect(await grpcCode(a.client.get('x', 'u'))).toEqual({ code: status.INVALID_ARGUMENT, details: 'invalid name "x": a backing image name must match ^[a-z0-9][a-z0-9_.-]+$' });
    expect((await grpcCode(a.client.fetch({ dataSourceAddress: '' }))).code).toBe(status.INVALID_ARGUMENT);
    expect((await grpcCode(a.client.sync({ fromAddress: a.grpcAddress }))).code).toBe(status.INVALID_ARGUMENT);
    const spec = { name: 'vm', uuid: 'u1', size: 0, checksum: '', virtualSize: 0, realSize: 0 };
    expect((await grpcCode(a.client.sync({ spec, fromAddress: a.grpcAddress }))).code).toBe(status.INVALID_ARGUMENT);
    expect((await grpcCode(a.client.sync({ spec: { ...spec, size: 1024 }, fromAddress: '' }))).code).toBe(status.INVALID_ARGUMENT);
    expect((await grpcCode(a.client.send('vm', 'u1', ''))).code).toBe(status.INVALID_ARGUMENT);
    expect((await grpcCode(a.client.delete('', ''))).code).toBe(status.INVALID_ARGUMENT);
    expect((await grpcCode(a.client.prepareDownload('', 'u'))).code).toBe(status.INVALID_ARGUMENT);
    expect((await grpcCode(a.client.backupStatus(''))).details).toContain('empty backing image name');
    const odd = await grpcCode(a.client.fetch({ spec: { ...spec, size: 1000 }, dataSourceAddress: '' }));
    // Longhorn answers Unknown (a plain Go error); this manager answers InvalidArgument, which the control plane
    // treats as an error retrying cannot fix (docs/reliability.md, Retries).
    expect(odd.code).toBe(status.INVALID_ARGUMENT);
    expect(odd.details).toContain('should be a multiple of 512 bytes');
    const send = await grpcCode(a.client.send('vm', 'u1', '127.0.0.1:1'));
    expect(send.details).toContain('can not find sync file');
    const badSum = await grpcCode(a.client.fetch({ spec: { ...spec, size: 1024, checksum: 'sha256:xyz' }, dataSourceAddress: '' }));
    expect(badSum.details).toContain('invalid checksum');
    // the HTTP sync service: unknown file, bad action
    await expect(a.sync.get('/nope')).rejects.toThrow('invalid file id "/nope": it is outside the disk root');
    const unknown = path.join(disk, 'backing-images', 'nope-u', 'backing');
    await expect(a.sync.get(unknown)).rejects.toThrow(`can not find sync file ${unknown}`);
    await expect(a.sync.receiveFromPeer({ filePath: '/x/y', uuid: 'z', size: 1024, port: 1, fileType: 'vmdk' })).rejects.toThrow('invalid file type');
  });

  it('fetches a prepared tmp file, re-adopts it after a restart without re-hashing, and notices changes on disk', async () => {
    const disk = await makeDisk(root, 'fetch');
    let a = await start(disk);
    const sha = await fetchPrepared(a, 'img1', 'u1', 'dhdhdd');
    const ready = await waitState(a, 'img1', 'u1', 'ready');
    expect(ready.checksum).toBe(sha);
    const file = backingFilePath(disk, 'img1', 'u1');
    await expect(fsp.stat(dataSourceFilePath(disk, 'img1', 'u1'))).rejects.toThrow();
    const cfg = (await readSyncingFileConfig(file + '.cfg'))!;
    expect(cfg).toMatchObject({ name: file, uuid: 'u1', size: 6 * MiB, currentChecksum: sha });
    expect(cfg.modificationTime).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \+0000 UTC$/);
    const dup = await grpcCode(a.client.fetch({ spec: { name: 'img1', uuid: 'u1', size: 6 * MiB, checksum: '', virtualSize: 0, realSize: 0 }, dataSourceAddress: '' }));
    expect(dup.details).toContain('already exists');
    expect((await a.client.prepareDownload('img1', 'u1')).srcFilePath).toBe(file);

    // restart: the record is gone until Fetch with an empty address re-adopts the file
    expect(await a.stop()).toBe(0);
    a = await start(disk);
    expect((await grpcCode(a.client.get('img1', 'u1'))).code).toBe(status.NOT_FOUND);
    // prove the checksum is taken from backing.cfg when size and mtime match: plant a marker checksum
    const marker = 'ab'.repeat(64);
    await writeSyncingFileConfig(file + '.cfg', { ...cfg, currentChecksum: marker });
    const spec = { name: 'img1', uuid: 'u1', size: 6 * MiB, checksum: '', virtualSize: 0, realSize: 0 };
    await a.client.fetch({ spec, dataSourceAddress: '' });
    expect((await waitState(a, 'img1', 'u1', 'ready')).checksum).toBe(marker);
    // the expected checksum is still enforced on that path (Longhorn skipped it)
    await a.client.delete('img1', 'u1').catch(() => undefined);
    await expect(fsp.stat(file)).rejects.toThrow();

    // re-adoption with a stale cfg recomputes; an expected checksum that does not match fails
    await fsp.mkdir(path.dirname(file), { recursive: true });
    const sha2 = await writeSparseImage(file, 'ddhh');
    await writeSyncingFileConfig(file + '.cfg', { ...cfg, size: 4 * MiB, currentChecksum: marker, modificationTime: '2001-01-01 00:00:00 +0000 UTC' });
    await a.client.fetch({ spec: { ...spec, size: 4 * MiB, checksum: sha2 }, dataSourceAddress: '' });
    expect((await waitState(a, 'img1', 'u1', 'ready')).checksum).toBe(sha2);

    // a ready file modified on disk is noticed (unknown -> re-verified -> failed)
    const fh = await fsp.open(file, 'r+');
    await fh.write(Buffer.from('corrupted'), 0, 9, 4096);
    await fh.close();
    const failed = await waitState(a, 'img1', 'u1', 'failed', 30_000);
    expect(failed.errorMsg).toContain('failed to process sync file: ready file');
    expect(failed.errorMsg).toContain('checksum changed');

    // a touched but unchanged file is re-verified back to ready
    await a.client.delete('img1', 'u1');
    await fsp.mkdir(path.dirname(file), { recursive: true });
    const sha3 = await writeSparseImage(file, 'dd');
    await a.client.fetch({ spec: { ...spec, size: 2 * MiB }, dataSourceAddress: '' });
    await waitState(a, 'img1', 'u1', 'ready');
    const later = new Date(Date.now() + 5000);
    await fsp.utimes(file, later, later);
    const back = await waitFor('re-verification', async () => {
      const s = await stateOf(a, 'img1', 'u1');
      const c = await readSyncingFileConfig(file + '.cfg');
      return s.state === 'ready' && c?.modificationTime !== undefined && c.modificationTime.startsWith(later.toISOString().slice(0, 10)) ? s : undefined;
    }, 5000);
    expect(back.checksum).toBe(sha3);
  });

  it('fails a fetch whose data does not match the expected checksum, with the reference message', async () => {
    const a = await start(await makeDisk(root, 'wrongsum'));
    const wrong = 'cd'.repeat(64);
    const sha = await fetchPrepared(a, 'img2', 'u2', 'dh', wrong);
    const f = await waitState(a, 'img2', 'u2', 'failed');
    expect(f.errorMsg).toBe(`failed to process sync file: the expected checksum ${wrong} doesn't match the file actual checksum ${sha}`);
    await expect(fsp.stat(backingFilePath(a.disk, 'img2', 'u2') + '.tmp')).rejects.toThrow();
  });

  it('syncs a sparse image A -> B over ssync (sparse on B, same SHA-512), with Watch notifications', async () => {
    const a = await start(await makeDisk(root, 'A'));
    const b = await start(await makeDisk(root, 'B'));
    const sha = await fetchPrepared(a, 'sp', 'us', 'dhhhdhhd' + 'h'.repeat(8));
    await waitState(a, 'sp', 'us', 'ready');
    const watch = b.client.watch();
    let notes = 0;
    watch.on('data', () => notes++);
    watch.on('error', () => undefined);
    await new Promise((r) => setTimeout(r, 200));
    const t0 = Date.now();
    const r = await b.client.sync({ spec: { name: 'sp', uuid: 'us', size: 16 * MiB, checksum: sha, virtualSize: 0, realSize: 0 }, fromAddress: a.grpcAddress });
    expect(['pending', 'starting', 'in-progress', 'ready']).toContain(r.status!.state);
    const done = await waitState(b, 'sp', 'us', 'ready');
    expect(done.checksum).toBe(sha);
    const fileB = backingFilePath(b.disk, 'sp', 'us');
    expect(await sha512File(fileB)).toBe(sha);
    expect(await allocatedBytes(fileB)).toBeLessThanOrEqual(3 * MiB + 64 * 1024);
    await waitFor('a watch notification', async () => (notes > 0 ? true : undefined), 5000);
    const elapsed = Date.now() - t0;
    expect(notes).toBeLessThanOrEqual(Math.ceil(elapsed / 1000) + 2);
    watch.cancel();
    // sendingReference back to 0 on A once the send is over
    await waitFor('sender idle', async () => ((await stateOf(a, 'sp', 'us')).sendingReference === 0 ? true : undefined));
    const list = await b.client.list();
    expect(Object.keys(list.backingImages)).toEqual(['sp']);
  });

  it('Sync between daemons goes through the SHA-512 chain: stored on A by the fetch, verified per segment on B, stored on B, deleted with the copy', async () => {
    const a = await start(await makeDisk(root, 'chainA'));
    const b = await start(await makeDisk(root, 'chainB'));
    const sha = await fetchPrepared(a, 'ch', 'uc', 'ddhhdddd' + 'hhhhdhhd');
    await waitState(a, 'ch', 'uc', 'ready');
    const fileA = backingFilePath(a.disk, 'ch', 'uc');
    // the fetch hashed the file (the stand-in data source leaves no backing.cfg) and recorded the chain in the same pass
    const chainA = await fsp.readFile(fileA + '.sha512chain');
    expect(chainA.subarray(0, 18).toString()).toBe('bis-sha512chain v1');
    await b.client.sync({ spec: { name: 'ch', uuid: 'uc', size: 16 * MiB, checksum: sha, virtualSize: 0, realSize: 0 }, fromAddress: a.grpcAddress });
    const done = await waitState(b, 'ch', 'uc', 'ready');
    expect(done.checksum).toBe(sha);
    const fileB = backingFilePath(b.disk, 'ch', 'uc');
    expect(await sha512File(fileB)).toBe(sha);
    expect(await allocatedBytes(fileB)).toBeLessThanOrEqual(8 * MiB + 64 * 1024);
    expect(b.stderr()).toMatch(/SHA-512 chain: 8 segments, in flight 3, holes 3, read back 2/);
    const chainB = await fsp.readFile(fileB + '.sha512chain');
    // same states and checksum; only the bound modification time (first line) differs
    expect(chainB.subarray(chainB.indexOf(10))).toEqual(chainA.subarray(chainA.indexOf(10)));
    await b.client.delete('ch', 'uc');
    await expect(fsp.stat(fileB + '.sha512chain')).rejects.toThrow();
  });

  it('serves three concurrent receivers from one sender, refuses a fourth, and reports sendingReference', async () => {
    const a = await start(await makeDisk(root, 'fanA'));
    const sha = await fetchPrepared(a, 'fan', 'uf', 'dddd');
    await waitState(a, 'fan', 'uf', 'ready');
    const held = await holdThreeSends(a, 'fan', 'uf');
    let late: Awaited<ReturnType<typeof start>> | undefined;
    try {
      // A manager told to sync from this busy sender is not failed (Longhorn failed it, and the copy then waited out
      // the 60 s file backoff): it asks again as a send ends.
      late = await start(await makeDisk(root, 'fanLate'));
      await late.client.sync({ spec: { name: 'fan', uuid: 'uf', size: 4 * MiB, checksum: sha, virtualSize: 0, realSize: 0 }, fromAddress: a.grpcAddress });
      await waitFor('the late receiver told the sender is busy', async () => (late!.stderr().includes('asking again as a send ends') ? true : undefined), 10_000);
      expect((await stateOf(late, 'fan', 'uf')).state).not.toBe('failed');
      // the copy names its sender while it waits for it (controllers count a sender's receivers by it)
      expect((await late.client.get('fan', 'uf')).status!.senderManagerAddress).toBe(a.grpcAddress);
    } finally {
      held.release();
    }
    expect((await waitState(late!, 'fan', 'uf', 'ready')).checksum).toBe(sha);
    await waitFor('the sender no longer named once the copy is received', async () => ((await late!.client.get('fan', 'uf')).status!.senderManagerAddress === '' ? true : undefined), 10_000);
    await waitFor('sends over', async () => ((await stateOf(a, 'fan', 'uf')).sendingReference === 0 ? true : undefined), 30_000);
    // and three real receivers at once
    const receivers = await Promise.all(['fan1', 'fan2', 'fan3'].map(async (n) => start(await makeDisk(root, n))));
    await Promise.all(receivers.map((b) => b.client.sync({ spec: { name: 'fan', uuid: 'uf', size: 4 * MiB, checksum: sha, virtualSize: 0, realSize: 0 }, fromAddress: a.grpcAddress })));
    for (const b of receivers) expect((await waitState(b, 'fan', 'uf', 'ready')).checksum).toBe(sha);
  });

  it('asks the other senders the Sync names when its sender is at its sending limit, skipping one that cannot send', async () => {
    const { a, b, sha } = await twoReadyCopies('alt', 'alt', 'ua');
    const empty = await start(await makeDisk(root, 'altEmpty'));
    const held = await holdThreeSends(a, 'alt', 'ua');
    try {
      const r = await start(await makeDisk(root, 'altR'));
      // a is busy and `empty` has no such file: the copy comes from b while a's three sends are still held
      await r.client.sync({ spec: { name: 'alt', uuid: 'ua', size: 4 * MiB, checksum: sha, virtualSize: 0, realSize: 0 }, fromAddress: a.grpcAddress, alternativeFromAddresses: [empty.grpcAddress, b.grpcAddress] });
      expect((await waitState(r, 'alt', 'ua', 'ready')).checksum).toBe(sha);
      expect(await sha512File(backingFilePath(r.disk, 'alt', 'ua'))).toBe(sha);
      expect((await stateOf(a, 'alt', 'ua')).sendingReference).toBe(3);
      expect(r.stderr()).toContain(`the peer manager ${b.grpcAddress} sends this file`);
      expect(r.stderr()).toContain(`failed to ask the peer manager ${empty.grpcAddress} to send`);
    } finally {
      held.release();
    }
  });

  it('a busy sender points a receiver that names itself to the copy it sends to; the receiver asks that one', async () => {
    const { a, b, sha } = await twoReadyCopies('hint', 'hint', 'uh');
    // a sends to a held stand-in receiver on behalf of b (as if b were receiving it from a)
    let release: (() => void) | undefined;
    const held = http.createServer((req, res) => {
      req.resume();
      if (req.url!.startsWith('/v1-ssync/open')) return res.end('false');
      release = () => res.end();
    });
    await new Promise<void>((r) => held.listen(0, '127.0.0.1', r));
    try {
      await a.client.send('hint', 'uh', `127.0.0.1:${(held.address() as AddressInfo).port}`, b.grpcAddress);
      // a manager that names itself is pointed to b; one that does not (Longhorn's) is served up to the limit of 3
      const refused = await grpcCode(a.client.send('hint', 'uh', '127.0.0.1:9', '127.0.0.1:1'));
      expect(refused.details).toContain('reaches to the simultaneous sending limit 1');
      expect(refused.details).toContain(`; ask the peer manager ${b.grpcAddress}, which receives it from here`);
      const r = await start(await makeDisk(root, 'hintR'));
      await r.client.sync({ spec: { name: 'hint', uuid: 'uh', size: 4 * MiB, checksum: sha, virtualSize: 0, realSize: 0 }, fromAddress: a.grpcAddress });
      expect((await waitState(r, 'hint', 'uh', 'ready')).checksum).toBe(sha);
      expect(await sha512File(backingFilePath(r.disk, 'hint', 'uh'))).toBe(sha);
      expect(r.stderr()).toContain(`the peer manager ${b.grpcAddress} sends this file (the first choice, ${a.grpcAddress}, could not)`);
      expect((await stateOf(a, 'hint', 'uh')).sendingReference).toBe(1);
    } finally {
      held.closeAllConnections();
      held.close();
      release?.();
    }
  });

  it('a copy waiting for a busy sender asks the sender of a new Sync; for a received copy it still "already exists"', async () => {
    const { a, b, sha, spec } = await twoReadyCopies('again', 'again', 'ug');
    const held = await holdThreeSends(a, 'again', 'ug');
    try {
      const r = await start(await makeDisk(root, 'againR'));
      await r.client.sync({ spec, fromAddress: a.grpcAddress });
      await waitFor('the receiver told a is busy', async () => (r.stderr().includes('asking again as a send ends') ? true : undefined), 10_000);
      // the controller chose again: b
      await r.client.sync({ spec, fromAddress: b.grpcAddress });
      expect((await waitState(r, 'again', 'ug', 'ready')).checksum).toBe(sha);
      expect((await stateOf(a, 'again', 'ug')).sendingReference).toBe(3);
      expect(r.stderr()).toContain('chosen again by the controller');
      expect((await grpcCode(r.client.sync({ spec, fromAddress: b.grpcAddress }))).details).toMatch(/already exists/);
    } finally {
      held.release();
    }
  });

  it('cleans up a Delete during a transfer and a SIGTERM during a transfer', async () => {
    const a = await start(await makeDisk(root, 'delA'));
    const sha = await fetchPrepared(a, 'del', 'ud', 'd'.repeat(48));
    await waitState(a, 'del', 'ud', 'ready');
    const b = await start(await makeDisk(root, 'delB'));
    const spec = { name: 'del', uuid: 'ud', size: 48 * MiB, checksum: sha, virtualSize: 0, realSize: 0 };
    await b.client.sync({ spec, fromAddress: a.grpcAddress });
    await waitFor('transfer running', async () => (['in-progress', 'ready'].includes((await stateOf(b, 'del', 'ud')).state) ? true : undefined));
    await b.client.delete('del', 'ud');
    expect((await grpcCode(b.client.get('del', 'ud'))).code).toBe(status.NOT_FOUND);
    await expect(fsp.stat(backingImageDir(b.disk, 'del', 'ud'))).rejects.toThrow();
    // the receive port was released and the image can be synced again
    await waitFor('sender idle', async () => ((await stateOf(a, 'del', 'ud')).sendingReference === 0 ? true : undefined), 30_000);
    await b.client.sync({ spec, fromAddress: a.grpcAddress });
    expect((await waitState(b, 'del', 'ud', 'ready')).checksum).toBe(sha);

    // SIGTERM while receiving: temporary files go, the finished file on A stays
    const c = await startDaemonProcess(await makeDisk(root, 'termC'));
    await c.client.sync({ spec, fromAddress: a.grpcAddress });
    await waitFor('transfer running', async () => ((await stateOf(c, 'del', 'ud')).state !== 'pending' ? true : undefined));
    expect(await c.stop()).toBe(0);
    const dir = backingImageDir(c.disk, 'del', 'ud');
    const left = await fsp.readdir(dir).catch(() => [] as string[]);
    expect(left.filter((n) => n.endsWith('.tmp'))).toEqual([]);
    expect(await sha512File(backingFilePath(a.disk, 'del', 'ud'))).toBe(sha);
  });
});
