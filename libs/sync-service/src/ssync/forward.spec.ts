import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { promises as fsp, readFileSync } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { computeFileChain, encodeChain, type Sha512Chain } from '@bis/sha512-chain';
import { startSsyncReceiver, type SsyncReceiver, type SsyncReceiverOptions } from './receiver.js';
import { sendFile } from './sender.js';
import { sha512Of, writePatternFile } from '../test-support/pattern-file.js';

// Pipelined forwarding: a copy still being received sends each segment on once it is in its file and verified
// against the chain it is received with (sendFile's `forward`, the receiver's `forwardable`).

const MiB = 1 << 20;
const SEG = 2 * MiB; // the chain's default segment size
let dir: string;

beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'ssync-forward-'));
});
afterEach(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

/** A file of 2 MiB segments: `d` random data, `h` a hole. */
const segmentsFile = (name: string, pattern: string): Promise<string> => writePatternFile(path.join(dir, name), pattern, SEG);
const sha = sha512Of;

/** One request to a receiver, on a connection of its own. */
function ask(rx: SsyncReceiver, method: string, op: string, body?: Buffer): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: rx.port, method, path: `/v1-ssync/${op}`, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, text: Buffer.concat(chunks).toString() }));
    });
    req.on('error', (e) => reject(new Error(`${op}: ${e.message}`)));
    req.end(body);
  });
}

async function waitFor(what: string, cond: () => boolean): Promise<void> {
  for (let i = 0; !cond(); i++) {
    if (i > 3000) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Sends unit `i` of `pattern` (`d` data from `data`, else a hole) to `rx` by hand, as a sender would. */
async function sendUnit(rx: SsyncReceiver, pattern: string, data: Buffer, unit: number, i: number): Promise<void> {
  const begin = i * unit;
  const r =
    pattern[i] === 'd'
      ? await ask(rx, 'POST', `writeData?begin=${begin}&end=${begin + unit}`, data.subarray(begin, begin + unit))
      : await ask(rx, 'POST', `sendHole?begin=${begin}&end=${begin + unit}`);
  expect(r.status).toBe(200);
}

/** B's sender closes; B, C and the forwarding send end, and both copies hold the chain's checksum. */
async function closeAndCheck(b: SsyncReceiver, c: SsyncReceiver, file: FileHandle, forwarded: ReturnType<typeof sendFile>, chain: Sha512Chain) {
  expect((await ask(b, 'POST', 'close')).status).toBe(200);
  const [rb, rc, sent] = await Promise.all([b.done, c.done, forwarded]);
  await file.close();
  await Promise.all([b.closed, c.closed]);
  expect(rb.sha512).toBe(chain.checksum);
  expect(rc.sha512).toBe(chain.checksum);
  return { rc, sent };
}

/** A receiver of `size` bytes at `filePath`, opened and given the sender's chain (as B, the copy that forwards). */
async function receivingWithChain(filePath: string, size: number, chain: Sha512Chain, extra: Partial<SsyncReceiverOptions> = {}): Promise<SsyncReceiver> {
  const rx = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath, size, ...extra });
  expect((await ask(rx, 'GET', `open?begin=0&end=${size}&directIO=false`)).status).toBe(200);
  expect((await ask(rx, 'POST', 'sha512Chain', encodeChain(chain))).status).toBe(200);
  return rx;
}

/** B's forwarding send of the file it receives (open at `file`) to `to`; with `holes`, B tells which parts are holes. */
function forwardFrom(b: SsyncReceiver, file: FileHandle, to: SsyncReceiver, size: number, chain: Sha512Chain, holes: boolean): ReturnType<typeof sendFile> {
  return sendFile({
    path: 'mid',
    toAddress: `127.0.0.1:${to.port}`,
    layout: () => Promise.reject(new Error('not used')),
    chain,
    forward: { file, size, segmentFinal: (i) => b.forwardable.segmentFinal(i), ...(holes ? { holesIn: (x: number, y: number) => b.forwardable.holesIn(x, y) } : {}) },
  });
}

describe('forwarding a file while it is received', () => {
  it('sends each verified segment on before the rest has arrived; the next copy is whole, verified and sparse', async () => {
    const pattern = 'ddhdhhdd';
    const src = await segmentsFile('src', pattern);
    const chain = await computeFileChain(src);
    const size = pattern.length * SEG;
    const mid = path.join(dir, 'mid.tmp');
    const dst = path.join(dir, 'dst');
    // B: receives from a sender driven by hand, one segment at a time
    const b = await receivingWithChain(mid, size, chain);
    await expect(b.forwardable.chain).resolves.toMatchObject({ size, checksum: chain.checksum });

    // C: receives from B's forwarding send
    let cBytes = 0;
    const c = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: dst, size, onProgress: (n) => (cBytes = n) });
    const file = await fsp.open(mid, 'r');
    const forwarded = forwardFrom(b, file, c, size, chain, false);
    const data = readFileSync(src);
    const sendSegment = (i: number) => sendUnit(b, pattern, data, SEG, i);
    // the first two segments reach C while B still waits for the other six
    await sendSegment(0);
    await sendSegment(1);
    await waitFor('C to receive the first two segments from B', () => cBytes >= 2 * SEG);
    let cDone = false;
    void c.done.then(() => (cDone = true), () => (cDone = true));
    expect(cDone).toBe(false);
    for (let i = 2; i < pattern.length; i++) await sendSegment(i);
    const { rc, sent } = await closeAndCheck(b, c, file, forwarded, chain);
    // every segment C got was checked in flight against the chain (data) or as a hole: nothing read back at the end
    expect(rc.chainStats).toEqual({ segments: 8, inFlight: 5, holes: 3, readBack: 0 });
    expect(sent).toMatchObject({ chainAccepted: true, dataBytes: 5 * SEG, holeBytes: 3 * SEG });
    expect(sha(dst)).toBe(sha(src));
    expect((await fsp.stat(dst)).blocks * 512).toBeLessThanOrEqual(5 * SEG + 64 * 1024);
  });

  it('a segment received in pieces is read back and forwarded once its pieces cover it, before the receive completes', async () => {
    const src = await segmentsFile('src', 'dd');
    const chain = await computeFileChain(src);
    const size = 2 * SEG;
    const mid = path.join(dir, 'mid.tmp');
    const b = await receivingWithChain(mid, size, chain);
    const data = readFileSync(src);
    // segment 0 in two halves (not verified in flight); a forwarder waits for it after the first half
    expect((await ask(b, 'POST', `writeData?begin=0&end=${MiB}`, data.subarray(0, MiB))).status).toBe(200);
    let first: string | undefined;
    const final0 = b.forwardable.segmentFinal(0).then((k) => (first = k));
    await new Promise((r) => setTimeout(r, 50));
    expect(first).toBeUndefined();
    // the second half covers it: it is read back, verified and final while segment 1 has not arrived
    expect((await ask(b, 'POST', `writeData?begin=${MiB}&end=${SEG}`, data.subarray(MiB, SEG))).status).toBe(200);
    await final0;
    expect(first).toBe('data');
    // a segment whose pieces hold wrong bytes is no verdict early: it stays waiting, and the close fails the receive
    const bad = Buffer.from(data.subarray(SEG, SEG + MiB));
    bad[3] ^= 1;
    expect((await ask(b, 'POST', `writeData?begin=${SEG}&end=${SEG + MiB}`, bad)).status).toBe(200);
    let second: string | undefined;
    const final1 = b.forwardable.segmentFinal(1).then(
      (k) => (second = k),
      (e: Error) => (second = `rejected: ${e.message}`),
    );
    expect((await ask(b, 'POST', `writeData?begin=${SEG + MiB}&end=${2 * SEG}`, data.subarray(SEG + MiB))).status).toBe(200);
    await new Promise((r) => setTimeout(r, 100));
    expect(second).toBeUndefined();
    // the close is answered, then the read-back at the end finds the mismatch
    await ask(b, 'POST', 'close');
    await expect(b.done).rejects.toThrow(/does not match the sender's SHA-512 chain/);
    await final1;
    expect(second).toMatch(/^rejected: .*does not match the sender's SHA-512 chain/);
    await b.closed;
  });

  it('a segment that is partly holes is forwarded as its data and its holes: the next copy is as sparse', async () => {
    // 512 KiB units, 4 per segment: segment 0 data/hole/hole/data, segment 1 hole/data/hole/hole, segment 2 all data
    const UNIT = 512 * 1024;
    const pattern = 'dhhdhdhhdddd';
    const src = await writePatternFile(path.join(dir, 'src'), pattern, UNIT);
    const chain = await computeFileChain(src);
    const size = pattern.length * UNIT;
    const mid = path.join(dir, 'mid.tmp');
    const dst = path.join(dir, 'dst');
    const b = await receivingWithChain(mid, size, chain);
    const c = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: dst, size });
    const file = await fsp.open(mid, 'r');
    const forwarded = forwardFrom(b, file, c, size, chain, true);
    const data = readFileSync(src);
    for (let i = 0; i < pattern.length; i++) await sendUnit(b, pattern, data, UNIT, i);
    // what B got as holes, and nothing where data came
    expect(b.forwardable.holesIn(0, SEG)).toEqual([[UNIT, 3 * UNIT]]);
    expect(b.forwardable.holesIn(SEG, 2 * SEG)).toEqual([[SEG, SEG + UNIT], [SEG + 2 * UNIT, 2 * SEG]]);
    expect(b.forwardable.holesIn(2 * SEG, 3 * SEG)).toEqual([]);
    const { sent } = await closeAndCheck(b, c, file, forwarded, chain);
    const holeUnits = [...pattern].filter((u) => u !== 'd').length;
    expect(sent).toMatchObject({ chainAccepted: true, dataBytes: (pattern.length - holeUnits) * UNIT, holeBytes: holeUnits * UNIT });
    expect(sha(dst)).toBe(sha(src));
    // C holes where the source has them (the whole-data segment and the data units only, plus a little slack)
    expect((await fsp.stat(dst)).blocks * 512).toBeLessThanOrEqual((pattern.length - holeUnits) * UNIT + 64 * 1024);
  });

  it('a failed receive fails the forwarding send; a receive without a chain cannot be forwarded', async () => {
    const src = await segmentsFile('src', 'dd');
    const chain = await computeFileChain(src);
    const size = 2 * SEG;
    const b = await receivingWithChain(path.join(dir, 'mid.tmp'), size, chain, { fatalLingerMs: 100 });
    const c = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: path.join(dir, 'dst'), size, fatalLingerMs: 100, idleTimeoutMs: 500 });
    const file = await fsp.open(path.join(dir, 'mid.tmp'), 'r');
    const forwarded = forwardFrom(b, file, c, size, chain, false);
    const bad = Buffer.from(readFileSync(src).subarray(0, SEG));
    bad[7] ^= 1;
    await ask(b, 'POST', `writeData?begin=0&end=${SEG}`, bad);
    await expect(b.done).rejects.toThrow(/does not match the sender's SHA-512 chain/);
    await expect(forwarded).rejects.toThrow(/does not match the sender's SHA-512 chain/);
    // C got nothing of the bad segment and never completes
    await expect(c.done).rejects.toThrow();
    await file.close();
    await Promise.all([b.closed, c.closed]);

    // a receive whose sender sent data without offering a chain (Longhorn's sender)
    const d = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: path.join(dir, 'plain.tmp'), size, idleTimeoutMs: 200 });
    expect((await ask(d, 'GET', `open?begin=0&end=${size}&directIO=false`)).status).toBe(200);
    expect((await ask(d, 'POST', `sendHole?begin=0&end=${SEG}`)).status).toBe(200);
    await expect(d.forwardable.chain).resolves.toBeUndefined();
    await expect(d.forwardable.segmentFinal(0)).rejects.toThrow(/no SHA-512 chain/);
    await expect(d.done).rejects.toThrow();
    await d.closed;
  });
});
