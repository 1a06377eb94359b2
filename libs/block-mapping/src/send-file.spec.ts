import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, openSync, readSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { sendFileAvailable, sendFileToSocket, type SendFileTransfer } from './send-file.js';
import { makeTempDir, noise, removeTempDir } from './test-support/sparse-files.js';

const MiB = 1 << 20;

// sendFileToSocket needs the native addon built with startSendFile (node libs/block-mapping/native/build.mjs). Without
// it (addon not built, or disabled with BIS_BLOCK_MAPPING_NATIVE=0) there is nothing to test: the suite is skipped.
const available = sendFileAvailable();
if (!available) {
  console.warn('send-file.spec: skipped, the block_mapping addon is not loaded or lacks startSendFile (run native/build.mjs)');
}
const describeSendFile = available ? describe : describe.skip;

/** The descriptor of a connected net.Socket (libuv keeps it non-blocking). */
function fdOf(sock: net.Socket): number {
  const fd = (sock as unknown as { _handle?: { fd?: unknown } | null })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) throw new Error('no socket descriptor');
  return fd;
}

interface Connection {
  /** Our end (the one sendfile writes to). */
  client: net.Socket;
  /** The server's end of the same connection. */
  peer: net.Socket;
  /** Everything the peer received until the connection ended (or closed). */
  received: Promise<Buffer>;
}

let dir: string;
const cleanups: Array<() => void | Promise<void>> = [];

beforeEach(async () => {
  dir = await makeTempDir();
});
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
  await removeTempDir(dir);
});

/** A loopback TCP connection; the peer starts paused when `paused` (it reads nothing until resumed). */
async function connect(paused = false): Promise<Connection> {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as net.AddressInfo;
  const peerP = new Promise<net.Socket>((r) => server.once('connection', r));
  // half-open allowed: our end never shuts its sending side down by itself when the peer's side ends
  const client = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true });
  client.on('error', () => {}); // a reset connection is what some tests cause
  await new Promise<void>((r, j) => {
    client.once('connect', r);
    client.once('error', j);
  });
  const peer = await peerP;
  peer.on('error', () => {});
  if (paused) peer.pause();
  const received = new Promise<Buffer>((resolve) => {
    const chunks: Buffer[] = [];
    peer.on('data', (c: Buffer) => chunks.push(c));
    peer.on('close', () => resolve(Buffer.concat(chunks)));
  });
  cleanups.push(async () => {
    client.destroy();
    peer.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  });
  return { client, peer, received };
}

async function dataFile(name: string, bytes: Buffer): Promise<string> {
  const file = path.join(dir, name);
  await writeFile(file, bytes);
  return file;
}

/** Opens `file` read-only; closed after the test unless the test closes it first. */
function openForTest(file: string): { fd: number; close(): void } {
  const fd = openSync(file, 'r');
  let open = true;
  const close = () => {
    if (open) closeSync(fd);
    open = false;
  };
  cleanups.push(close);
  return { fd, close };
}

/** Whether `done` is still pending after `ms`. */
async function stillPending(done: Promise<unknown>, ms: number): Promise<boolean> {
  let settled = false;
  done.then(
    () => (settled = true),
    () => (settled = true),
  );
  await new Promise((r) => setTimeout(r, ms));
  return !settled;
}

/** Settles a transfer a failed test left running, so that no thread keeps the worker alive. */
function cancelAfterTest(t: SendFileTransfer): SendFileTransfer {
  cleanups.push(async () => {
    t.cancel();
    await t.done.catch(() => undefined);
  });
  return t;
}

const sha512 = (b: Buffer) => createHash('sha512').update(b).digest('hex');

describeSendFile('sendFileToSocket', () => {
  it('sends a range at an unaligned offset with an odd length byte-exact; done resolves with the length', async () => {
    const content = noise(4 * MiB + 8193, 7);
    const file = openForTest(await dataFile('src', content));
    const conn = await connect();
    const offset = 4097;
    const length = 3 * MiB + 17;
    const t = cancelAfterTest(sendFileToSocket(fdOf(conn.client), file.fd, offset, length));
    await expect(t.done).resolves.toBe(length);
    conn.client.end();
    const got = await conn.received;
    expect(got.length).toBe(length);
    expect(got.equals(content.subarray(offset, offset + length))).toBe(true);
    expect(t.cancel()).toBe(false); // settled: nothing left to cancel
    // sendfile with an explicit offset leaves the descriptor's file position alone
    const head = Buffer.alloc(8);
    expect(readSync(file.fd, head, 0, 8, null)).toBe(8);
    expect(head.equals(content.subarray(0, 8))).toBe(true);
  });

  it('a 0-length range resolves 0 and sends nothing', async () => {
    const file = openForTest(await dataFile('src', noise(4096)));
    const conn = await connect();
    await expect(sendFileToSocket(fdOf(conn.client), file.fd, 100, 0).done).resolves.toBe(0);
    conn.client.end();
    expect((await conn.received).length).toBe(0);
  });

  it('a large range to a peer that stops reading for a while waits for the socket (EAGAIN, poll) and arrives complete', async () => {
    const content = randomBytes(32 * MiB);
    const file = openForTest(await dataFile('src', content));
    const conn = await connect(true);
    const t = cancelAfterTest(sendFileToSocket(fdOf(conn.client), file.fd, 0, content.length));
    // 32 MiB cannot fit into the loopback socket buffers: with the peer not reading, the transfer must be waiting
    expect(await stillPending(t.done, 300)).toBe(true);
    conn.peer.resume();
    await expect(t.done).resolves.toBe(content.length);
    conn.client.end();
    const got = await conn.received;
    expect(got.length).toBe(content.length);
    expect(sha512(got)).toBe(sha512(content));
  });

  it('runs on duplicated descriptors: closing the file and destroying the socket object right after starting does not stop it', async () => {
    const content = randomBytes(8 * MiB + 5);
    const file = openForTest(await dataFile('src', content));
    const conn = await connect(true);
    const t = cancelAfterTest(sendFileToSocket(fdOf(conn.client), file.fd, 0, content.length));
    file.close();
    conn.client.destroy();
    await new Promise<void>((r) => conn.client.once('close', () => r()));
    // new descriptors may now take the numbers the caller gave up: the transfer must not write to them
    const decoy = openForTest(await dataFile('decoy', Buffer.alloc(16, 1)));
    conn.peer.resume();
    await expect(t.done).resolves.toBe(content.length);
    // the transfer's own duplicate was the last reference to the connection: closing it ends the stream with a FIN
    const got = await conn.received;
    expect(got.length).toBe(content.length);
    expect(sha512(got)).toBe(sha512(content));
    decoy.close();
  });

  it('cancel() during a transfer to a peer that does not read rejects done promptly; cancel is false once settled', async () => {
    const content = randomBytes(32 * MiB);
    const file = openForTest(await dataFile('src', content));
    const conn = await connect(true);
    const t = cancelAfterTest(sendFileToSocket(fdOf(conn.client), file.fd, 0, content.length));
    expect(await stillPending(t.done, 200)).toBe(true);
    expect(t.cancel()).toBe(true);
    const err = await t.done.then(
      () => undefined,
      (e: unknown) => e as Error & { code?: unknown; errno?: unknown; syscall?: unknown },
    );
    // (the peer never reads: without the cancel, done would never settle and the test's timeout would fail it)
    expect(err).toBeDefined();
    expect(err!.message).toMatch(/^sendfile: /);
    expect(typeof err!.code).toBe('string');
    expect(['EPIPE', 'ECONNRESET']).toContain(err!.code);
    expect(err!.syscall).toBe('sendfile');
    expect(typeof err!.errno).toBe('number');
    expect(t.cancel()).toBe(false);
    expect(t.cancel()).toBe(false);
  });

  it('cancel() after the transfer finished, before done settles, returns false and leaves the connection alone', async () => {
    const file = openForTest(await dataFile('src', noise(100)));
    const conn = await connect();
    const t = cancelAfterTest(sendFileToSocket(fdOf(conn.client), file.fd, 0, 100));
    // block the JS thread: the transfer thread sends its 100 bytes and queues the settle behind this call
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 100);
    expect(t.cancel()).toBe(false);
    await expect(t.done).resolves.toBe(100);
    // the connection still carries what is written after the transfer
    await new Promise<void>((resolve, reject) => conn.client.write('after', (err) => (err ? reject(err) : resolve())));
    conn.client.end();
    const got = await conn.received;
    expect(got.length).toBe(105);
    expect(got.subarray(100).toString()).toBe('after');
  });

  it('a range past the end of the file rejects with ENODATA naming the bytes sent', async () => {
    const content = noise(MiB, 3);
    const file = openForTest(await dataFile('src', content));
    const conn = await connect();
    const t = sendFileToSocket(fdOf(conn.client), file.fd, MiB / 2, MiB);
    await expect(t.done).rejects.toMatchObject({
      code: 'ENODATA',
      message: `sendfile: the file ended after ${MiB / 2} of ${MiB} bytes`,
    });
    // what was there was sent
    conn.client.end();
    expect((await conn.received).equals(content.subarray(MiB / 2))).toBe(true);

    const conn2 = await connect();
    await expect(sendFileToSocket(fdOf(conn2.client), file.fd, 2 * MiB, 10).done).rejects.toMatchObject({
      code: 'ENODATA',
      message: 'sendfile: the file ended after 0 of 10 bytes',
    });
  });

  it('bad arguments throw with a message naming the argument', async () => {
    const file = openForTest(await dataFile('src', noise(4096)));
    const conn = await connect();
    const sock = fdOf(conn.client);
    const attempt = (...args: unknown[]) => () =>
      (sendFileToSocket as unknown as (...a: unknown[]) => SendFileTransfer)(...args);
    const range = { name: 'RangeError', code: 'ERR_OUT_OF_RANGE' };
    const type = { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE' };
    const thrown = (f: () => unknown): unknown => {
      try {
        f();
      } catch (e) {
        return e;
      }
      return 'nothing thrown';
    };
    expect(thrown(attempt(-1, file.fd, 0, 1))).toMatchObject({ ...range, message: 'socketFd must be a non-negative integer' });
    expect(thrown(attempt(sock, 1.5, 0, 1))).toMatchObject({ ...range, message: 'fileFd must be a non-negative integer' });
    expect(thrown(attempt(sock, file.fd, Number.NaN, 1))).toMatchObject({ ...range, message: 'offset must be a non-negative safe integer' });
    expect(thrown(attempt(sock, file.fd, 0, 2 ** 53 + 2))).toMatchObject({ ...range, message: 'length must be a non-negative safe integer' });
    expect(thrown(attempt(sock, file.fd, 0, -4096))).toMatchObject({ ...range, message: 'length must be a non-negative safe integer' });
    expect(thrown(attempt(String(sock), file.fd, 0, 1))).toMatchObject({ ...type, message: 'socketFd must be a non-negative integer' });
    expect(thrown(attempt(sock, file.fd, 0))).toMatchObject({ ...type, message: 'length must be a non-negative safe integer' });
    expect(thrown(attempt(sock, file.fd, 10n, 1))).toMatchObject({ ...type, message: 'offset must be a non-negative safe integer' });
    // a descriptor that is not open fails at once, naming which one
    // (a number no descriptor can have: a just-closed number may be taken again by another open at any moment)
    const closedFd = 2 ** 31 - 1;
    expect(thrown(attempt(closedFd, file.fd, 0, 1))).toMatchObject({ code: 'EBADF', message: expect.stringContaining('dup(socket)') });
    expect(thrown(attempt(sock, closedFd, 0, 1))).toMatchObject({ code: 'EBADF', message: expect.stringContaining('dup(file)') });
    // nothing was started by the failed calls: the connection carries no bytes
    conn.client.end();
    expect((await conn.received).length).toBe(0);
  });

  it('a connection the peer closed rejects (EPIPE / ECONNRESET) and the process survives (SIGPIPE is ignored)', async () => {
    const content = randomBytes(16 * MiB);
    const file = openForTest(await dataFile('src', content));
    const conn = await connect();
    const sock = fdOf(conn.client);
    conn.peer.destroy();
    await conn.received; // the peer's end is closed
    await new Promise((r) => setTimeout(r, 50)); // its FIN has reached our end
    const t = cancelAfterTest(sendFileToSocket(sock, file.fd, 0, content.length));
    // the first bytes reach a closed socket, which answers with a reset; the writes after it fail
    await expect(t.done).rejects.toMatchObject({ code: expect.stringMatching(/^(EPIPE|ECONNRESET)$/) });
    expect(t.cancel()).toBe(false);
    // the process got SIGPIPE (sendfile has no MSG_NOSIGNAL) and is still here because Node ignores it
    expect(process.listenerCount('SIGPIPE')).toBe(0);
  });
});
