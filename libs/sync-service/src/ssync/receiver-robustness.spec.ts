import { describe, it, expect, afterEach, beforeEach, jest } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { startSsyncReceiver, type SsyncReceiver } from './receiver.js';

// Hostile clients against the ssync receiver's own HTTP/1.1 server, over raw loopback sockets. Every refusal must come
// with the right status and a closed connection, and must leave the target file as it was.

jest.setTimeout(60_000);

const HOST = '127.0.0.1';
const KiB = 1024;
const SIZE = 64 * KiB;
const HEADER_TIMEOUT_MS = 200;

let dir: string;
let target: string;
let original: Buffer;
const receivers: Array<{ rx: SsyncReceiver; abort: AbortController }> = [];

beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'ssync-robust-'));
  target = path.join(dir, 'target');
  original = randomBytes(SIZE);
  await fsp.writeFile(target, original);
});

afterEach(async () => {
  for (const { rx, abort } of receivers.splice(0)) {
    abort.abort();
    await rx.done.catch(() => undefined);
    await rx.closed;
  }
  await fsp.rm(dir, { recursive: true, force: true });
});

const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

async function receiver(): Promise<{ rx: SsyncReceiver; settled: () => boolean }> {
  const abort = new AbortController();
  const rx = await startSsyncReceiver({ port: 0, host: HOST, filePath: target, size: SIZE, signal: abort.signal, headerTimeoutMs: HEADER_TIMEOUT_MS, acceptChain: false });
  let settled = false;
  rx.done.then(
    () => (settled = true),
    () => (settled = true),
  );
  receivers.push({ rx, abort });
  return { rx, settled: () => settled };
}

/** The target file's bytes once the receiver has stopped (writes may end after their answer). */
async function finalFile(): Promise<Buffer> {
  for (const { rx, abort } of receivers.splice(0)) {
    abort.abort();
    await rx.done.catch(() => undefined);
    await rx.closed;
  }
  return fsp.readFile(target);
}

interface Exchange {
  /** Status codes of the responses, in order. */
  statuses: number[];
  /** Whether the server ended the connection (we never end it first unless `halfClose`). */
  serverClosed: boolean;
  raw: string;
}

/**
 * Sends `parts` (one socket write each) and collects the answer until the connection closes. With `halfClose`, our
 * side ends after the last part (a client that has nothing more to say); otherwise only the server may end it.
 */
function exchange(port: number, parts: Array<string | Buffer>, o: { halfClose?: boolean; untilStatuses?: number } = {}): Promise<Exchange> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: HOST, port });
    const chunks: Buffer[] = [];
    let serverClosed = false;
    const statuses = (): number[] => [...Buffer.concat(chunks).toString('latin1').matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
    s.on('data', (c: Buffer) => {
      chunks.push(c);
      if (o.untilStatuses !== undefined && statuses().length >= o.untilStatuses) s.destroy();
    });
    s.on('end', () => (serverClosed = true));
    s.on('error', (e: NodeJS.ErrnoException) => {
      // a reset after the server's answer still counts as the server closing
      if (e.code === 'ECONNRESET' || e.code === 'EPIPE') serverClosed = true;
      else reject(e);
    });
    s.on('close', () => resolve({ statuses: statuses(), serverClosed, raw: Buffer.concat(chunks).toString('latin1') }));
    s.on('connect', () => {
      for (const p of parts) s.write(p);
      if (o.halfClose) s.end();
    });
  });
}

interface FuzzExchange {
  statuses: number[];
  /** The server ended the connection while our side was still open (we had neither ended nor destroyed it). */
  closedByServer: boolean;
  /** We ended our side first (nothing was refused within `quietMs`). */
  endedByUs: boolean;
  raw: string;
}

/**
 * Sends `input` in one write and keeps our side open, so that only the server can end the connection after a
 * refusal. With `quietMs`, when no refusal has arrived and nothing came for that long (the input may be a valid
 * request, served and kept alive, or one whose body is still awaited), our side ends instead. A connection the
 * server keeps open `deadlineMs` after a refusal is destroyed and reported as not closed by the server.
 */
function fuzzExchange(port: number, input: Buffer, o: { quietMs?: number; deadlineMs: number }): Promise<FuzzExchange> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: HOST, port });
    const chunks: Buffer[] = [];
    let closedByServer = false;
    let endedByUs = false;
    let destroyedByUs = false;
    let quiet: NodeJS.Timeout | undefined;
    const statuses = (): number[] => [...Buffer.concat(chunks).toString('latin1').matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
    const refused = (): boolean => statuses().some((st) => st !== 200);
    const deadline = setTimeout(() => {
      destroyedByUs = true;
      s.destroy();
    }, o.deadlineMs);
    const armQuiet = (): void => {
      if (o.quietMs === undefined || endedByUs) return;
      if (quiet) clearTimeout(quiet);
      quiet = setTimeout(() => {
        if (refused()) return;
        endedByUs = true;
        s.end();
      }, o.quietMs);
    };
    s.on('data', (c: Buffer) => {
      chunks.push(c);
      armQuiet();
    });
    const byServer = (): void => {
      if (!endedByUs && !destroyedByUs) closedByServer = true;
    };
    s.on('end', byServer);
    s.on('error', (e: NodeJS.ErrnoException) => {
      if (e.code === 'ECONNRESET' || e.code === 'EPIPE') byServer();
      else reject(e);
    });
    s.on('close', () => {
      clearTimeout(deadline);
      if (quiet) clearTimeout(quiet);
      resolve({ statuses: statuses(), closedByServer, endedByUs, raw: Buffer.concat(chunks).toString('latin1') });
    });
    s.on('connect', () => {
      s.write(input);
      armQuiet();
    });
  });
}

const OPEN = `GET /v1-ssync/open?begin=0&end=${SIZE} HTTP/1.1\r\nHost: rx\r\n\r\n`;
/** A writeData head for [begin, end) with the given extra header lines (each ending in CRLF). */
const writeHead = (begin: number, end: number, headers: string): string => `POST /v1-ssync/writeData?begin=${begin}&end=${end} HTTP/1.1\r\nHost: rx\r\n${headers}\r\n`;
const fill = (n: number, byte: number): Buffer => Buffer.alloc(n, byte);
const chunked = (b: Buffer): string => `${b.length.toString(16)}\r\n${b.toString('latin1')}\r\n0\r\n\r\n`;

/** Opens the file on a connection, then sends `attack` on the same connection: expects 200 then `status` and a close. */
async function refusedAfterOpen(attack: Array<string | Buffer>, status: number): Promise<Exchange> {
  const { rx } = await receiver();
  const ex = await exchange(rx.port, [OPEN, ...attack]);
  expect(ex.statuses).toEqual([200, status]);
  expect(ex.serverClosed).toBe(true);
  expect(sha(await finalFile())).toBe(sha(original));
  return ex;
}

describe('ssync receiver HTTP robustness: framing (request smuggling)', () => {
  it('refuses Content-Length together with Transfer-Encoding, in either order', async () => {
    const body = fill(4 * KiB, 0xee);
    await refusedAfterOpen([writeHead(0, 4 * KiB, `Content-Length: ${body.length}\r\nTransfer-Encoding: chunked\r\n`), chunked(body)], 400);
    const ex = await refusedAfterOpen([writeHead(0, 4 * KiB, `Transfer-Encoding: chunked\r\nContent-Length: ${body.length}\r\n`), chunked(body)], 400);
    expect(ex.raw).toContain('request has both Content-Length and Transfer-Encoding');
  });

  const badLengths: Array<[string, string]> = [
    ['a repeated Content-Length with equal values', 'Content-Length: 4096\r\nContent-Length: 4096\r\n'],
    ['a repeated Content-Length with different values', 'Content-Length: 4096\r\nContent-Length: 100\r\n'],
    ['a Content-Length list', 'Content-Length: 4096, 4096\r\n'],
    ['a negative Content-Length', 'Content-Length: -4096\r\n'],
    ['a signed Content-Length', 'Content-Length: +4096\r\n'],
    ['a non-numeric Content-Length', 'Content-Length: abc\r\n'],
    ['a hexadecimal Content-Length', 'Content-Length: 0x1000\r\n'],
    ['an empty Content-Length', 'Content-Length: \r\n'],
    ['a Content-Length past 2^53', 'Content-Length: 9007199254740993\r\n'],
    ['an overflowing Content-Length', 'Content-Length: 99999999999999999999999999999999\r\n'],
    ['a repeated Host', 'Host: other\r\nContent-Length: 4096\r\n'],
  ];
  for (const [what, headers] of badLengths) {
    it(`refuses ${what} with 400`, async () => {
      await refusedAfterOpen([writeHead(0, 4 * KiB, headers), fill(4 * KiB, 0xee)], 400);
    });
  }

  it('refuses an unknown transfer coding with 501', async () => {
    await refusedAfterOpen([writeHead(0, 4 * KiB, 'Transfer-Encoding: gzip, chunked\r\n'), chunked(fill(4 * KiB, 0xee))], 501);
  });
});

describe('ssync receiver HTTP robustness: oversized and slow heads', () => {
  it('refuses a header line larger than the head limit with 431', async () => {
    const ex = await refusedAfterOpen([writeHead(0, 4 * KiB, `X-Big: ${'a'.repeat(40 * KiB)}\r\nContent-Length: 4096\r\n`), fill(4 * KiB, 0xee)], 431);
    expect(ex.raw).toContain('request head larger than');
  });

  it('refuses many headers adding up past the head limit with 431', async () => {
    const many = Array.from({ length: 2000 }, (_, i) => `X-H${i}: ${'v'.repeat(20)}\r\n`).join('');
    await refusedAfterOpen([writeHead(0, 4 * KiB, `${many}Content-Length: 4096\r\n`), fill(4 * KiB, 0xee)], 431);
  });

  it('refuses a head that never ends with 431 (it does not wait for the end)', async () => {
    const { rx } = await receiver();
    const ex = await exchange(rx.port, [`GET /v1-ssync/open?begin=0&end=${SIZE} HTTP/1.1\r\nX: ${'b'.repeat(70 * KiB)}`]);
    expect(ex.statuses).toEqual([431]);
    expect(ex.serverClosed).toBe(true);
    expect(sha(await finalFile())).toBe(sha(original));
  });

  it('answers a client that sends its head too slowly with 408 and closes, on a new connection', async () => {
    const { rx } = await receiver();
    // part of a head, then nothing: the header timeout (injected: 200 ms) answers
    const ex = await exchange(rx.port, [`POST /v1-ssync/writeData?begin=0&end=4096 HTTP/1.1\r\nHost: rx\r\nContent-Le`]);
    expect(ex.statuses).toEqual([408]);
    expect(ex.raw).toContain(`request head not received within ${HEADER_TIMEOUT_MS} ms`);
    expect(ex.serverClosed).toBe(true);
    expect(sha(await finalFile())).toBe(sha(original));
  });

  it('answers a slow head after a served request on the same connection with 408, and writes nothing of it', async () => {
    const { rx } = await receiver();
    const ex = await exchange(rx.port, [OPEN, writeHead(0, 4 * KiB, 'Content-Length: 4096\r\n').slice(0, 50)]);
    expect(ex.statuses).toEqual([200, 408]);
    expect(ex.serverClosed).toBe(true);
    expect(sha(await finalFile())).toBe(sha(original));
  });

  it('a connection that sends no head at all is answered 408 too', async () => {
    const { rx } = await receiver();
    const ex = await exchange(rx.port, []);
    expect(ex.statuses).toEqual([408]);
    expect(ex.serverClosed).toBe(true);
  });
});

describe('ssync receiver HTTP robustness: pipelining', () => {
  it('serves pipelined valid requests in order on one connection', async () => {
    const { rx } = await receiver();
    const a = fill(4 * KiB, 0x11);
    const b = fill(4 * KiB, 0x22);
    const all = Buffer.concat([
      Buffer.from(OPEN, 'latin1'),
      Buffer.from(writeHead(0, 4 * KiB, `Content-Length: ${a.length}\r\n`), 'latin1'),
      a,
      Buffer.from(writeHead(4 * KiB, 8 * KiB, `Transfer-Encoding: chunked\r\n`), 'latin1'),
      Buffer.from(chunked(b), 'latin1'),
      Buffer.from(`GET /v1-ssync/nothing HTTP/1.1\r\nHost: rx\r\n\r\n`, 'latin1'),
    ]);
    // one write: every request is in the server's buffer before the first is answered
    const ex = await exchange(rx.port, [all], { untilStatuses: 4 });
    expect(ex.statuses).toEqual([200, 200, 200, 404]);
    expect(ex.serverClosed).toBe(false); // keep-alive: we closed it after the fourth answer
    const file = await finalFile();
    expect(sha(file)).toBe(sha(Buffer.concat([a, b, original.subarray(8 * KiB)])));
  });

  it('refuses a bad request in a pipeline, closes, and writes nothing of what follows it', async () => {
    const { rx } = await receiver();
    const a = fill(4 * KiB, 0x33);
    const after = fill(4 * KiB, 0x44);
    const all = Buffer.concat([
      Buffer.from(OPEN, 'latin1'),
      Buffer.from(writeHead(0, 4 * KiB, `Content-Length: ${a.length}\r\n`), 'latin1'),
      a,
      // smuggling attempt: the second writeData hides in a body one framing sees and the other does not
      Buffer.from(writeHead(4 * KiB, 8 * KiB, `Content-Length: 4\r\nTransfer-Encoding: chunked\r\n`), 'latin1'),
      Buffer.from('0\r\n\r\n', 'latin1'),
      Buffer.from(writeHead(8 * KiB, 12 * KiB, `Content-Length: ${after.length}\r\n`), 'latin1'),
      after,
    ]);
    const ex = await exchange(rx.port, [all]);
    expect(ex.statuses).toEqual([200, 200, 400]);
    expect(ex.serverClosed).toBe(true);
    const file = await finalFile();
    expect(sha(file)).toBe(sha(Buffer.concat([a, original.subarray(4 * KiB)])));
  });
});

/** mulberry32: a small seeded PRNG, so a failing input can be reproduced from its index. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe('ssync receiver HTTP robustness: fuzz', () => {
  it('a few hundred seeded random and mutated inputs: each refusal is followed by the server closing the connection, never a crash or a write', async () => {
    const { rx, settled } = await receiver();
    // the file is open, so a request that parsed as a valid writeData would write
    expect((await exchange(rx.port, [OPEN], { halfClose: true })).statuses).toEqual([200]);
    const rnd = prng(0x5eed);
    const int = (n: number): number => Math.floor(rnd() * n);
    const bytes = (n: number): Buffer => Buffer.from(Array.from({ length: n }, () => int(256)));
    // a valid writeData whose body is the file's own bytes: if a mutant still parses as valid, writing it changes
    // nothing; any byte written from elsewhere in the input (a misframed body) changes the file
    const valid = (): Buffer => {
      const begin = int(15) * 4 * KiB;
      const body = original.subarray(begin, begin + 4 * KiB);
      const te = rnd() < 0.5;
      return Buffer.concat([
        Buffer.from(writeHead(begin, begin + body.length, te ? 'Transfer-Encoding: chunked\r\n' : `Content-Length: ${body.length}\r\n`), 'latin1'),
        te ? Buffer.from(chunked(body), 'latin1') : body,
      ]);
    };
    const mutate = (b: Buffer): Buffer => {
      const out = Buffer.from(b);
      const headEnd = out.indexOf('\r\n\r\n') + 4;
      const edits = 1 + int(4);
      let cur = out;
      for (let i = 0; i < edits; i++) {
        const at = int(Math.max(1, Math.min(cur.length, headEnd + 16)));
        const kind = int(4);
        if (kind === 0) cur[at] = int(256);
        else if (kind === 1) cur = Buffer.concat([cur.subarray(0, at), bytes(1 + int(8)), cur.subarray(at)]);
        else if (kind === 2) cur = Buffer.concat([cur.subarray(0, at), cur.subarray(at + 1 + int(8))]);
        else cur = Buffer.concat([cur.subarray(0, at), Buffer.from(['\r\n', ':', ' ', '\r\n\r\n', '\n', 'Content-Length: 1\r\n', 'Transfer-Encoding: chunked\r\n'][int(7)]!, 'latin1'), cur.subarray(at)]);
      }
      return cur;
    };
    const REFUSALS = new Set([400, 404, 408, 413, 417, 431, 501, 505]);
    const odd: string[] = [];
    let randomRefusedAndClosed = 0;
    let mutantsRefusedAndClosed = 0;
    for (let i = 0; i < 300; i++) {
      const kind = i % 3;
      const input = kind === 0 ? bytes(1 + int(2048)) : kind === 1 ? mutate(valid()) : Buffer.concat([valid(), mutate(valid())]);
      // Our side stays open: after a refusal only the server may end the connection. Random bytes always end in a
      // refusal (at the latest the header timeout's 408), so for them we never end first; a mutant may be a valid
      // request (served, then kept alive) or wait for more body bytes, so after a quiet spell without a refusal we end
      // our side and the server answers the truncated request.
      const ex = await fuzzExchange(rx.port, input, { quietMs: kind === 0 ? undefined : 300, deadlineMs: 20_000 });
      const what = `input ${i} (kind ${kind}): statuses ${ex.statuses.join(',') || 'none'}: ${JSON.stringify(ex.raw.slice(0, 300))}`;
      for (const st of ex.statuses) {
        // random bytes are never a valid request; a mutant may still be one (its write changes nothing, see above)
        if (st === 200 && kind !== 0) continue;
        if (!REFUSALS.has(st)) odd.push(`${what}: status ${st} is not a refusal`);
      }
      // The answers, and which announce that the server ends the connection (a refused request: malformed framing or
      // head, a timeout, a body not read to its end). An application error on a request read to its end (an unknown
      // path, a bad query, a body shorter than its range) keeps the connection, like any keep-alive answer.
      const answers = [...ex.raw.matchAll(/HTTP\/1\.1 (\d{3}) [^\r\n]*\r\n((?:[^\r\n]+\r\n)*)\r\n/g)].map((m) => ({
        status: Number(m[1]),
        close: /^connection: close\r?$/im.test(m[2]!),
      }));
      const closing = answers.findIndex((a) => a.close);
      if (closing >= 0 && closing !== answers.length - 1) odd.push(`${what}: answers after one that closes the connection`);
      if (kind === 0) {
        // every random input is refused, once, and the server closes the connection after that answer
        if (answers.length !== 1 || !answers[0]!.close) odd.push(`${what}: expected exactly one refusal that closes the connection`);
        if (!ex.closedByServer) odd.push(`${what}: the server did not close the connection after the refusal`);
        else randomRefusedAndClosed++;
      } else if (!ex.endedByUs && answers.some((a) => a.status !== 200)) {
        // refused while our side was open: the last answer is a refusal that closes, and the server did close
        const last = answers[answers.length - 1]!;
        if (last.status === 200 || !last.close) odd.push(`${what}: the last answer is not a refusal that closes the connection`);
        if (!ex.closedByServer) odd.push(`${what}: the server did not close the connection after the refusal`);
        else mutantsRefusedAndClosed++;
      }
    }
    expect(odd).toEqual([]);
    expect(randomRefusedAndClosed).toBe(100);
    // most mutants are refused on their own (a broken head), not only once we end our side
    expect(mutantsRefusedAndClosed).toBeGreaterThan(100);
    // still serving, never failed
    expect((await exchange(rx.port, [`GET /v1-ssync/nothing HTTP/1.1\r\nHost: rx\r\n\r\n`], { halfClose: true })).statuses).toEqual([404]);
    expect(settled()).toBe(false);
    expect(sha(await finalFile())).toBe(sha(original));
  }, 240_000); // inputs that wait for the header timeout or a quiet spell add up on a loaded machine
});
