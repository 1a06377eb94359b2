/**
 * The REST download of a copy whose bytes rotted under an unchanged mtime, when it is the only copy left: the
 * manager's verifier aborts the stream (before the bad segment when the copy has a SHA-512 chain, before the last chunk
 * otherwise) and the REST proxy passes the abort on, so the client
 * gets a truncated body (short of its Content-Length), never a complete one. The scrub runs with its default interval
 * (7 days) here, so only the verify-on-use path can catch the corruption.
 */
import { open, stat, utimes } from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { BackingImageKind, type BackingImage } from '@bis/controllers';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, startImageServer, tempDir, waitFor, writeImage, type ImageServer } from './test-support/e2e.js';

const MiB = 1 << 20;
const SEG = 2 * MiB;
const SIZE = 8 * MiB;

let tmp: { dir: string; remove(): Promise<void> };
let server: ImageServer;
let sum: string;
let sys: StandaloneHandle;
const log = { info: () => {}, warn: () => {}, error: () => {}, debug: () => {} };

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-download-verify-');
  sum = await writeImage(path.join(tmp.dir, 'img.raw'), SIZE, 17);
  server = await startImageServer(tmp.dir);
  sys = await startStandalone({
    dataDir: path.join(tmp.dir, 'data'),
    listen: '127.0.0.1:0',
    disks: 1,
    allowSourceHosts: ['127.0.0.1'],
    binaries: BINARIES,
    log,
    controllerOptions: { resyncMs: 1000, timing: { dataSourcePollMs: 200, managerPollMs: 200, waitRequeueMs: 300, managerRestartInitialMs: 200 } },
  });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  await server?.close();
  await tmp?.remove();
});

/**
 * One byte changed in place, the modification time put back at once (in the same process, microseconds after the
 * write): the manager, which checks the modification time of its ready copies every 2 s, does not see the change, so
 * only the verification while streaming can find it. The time is a whole second (see `wholeSecondMtime`), which
 * `futimes` puts back exactly.
 */
async function flipByte(f: string, offset: number): Promise<void> {
  const before = await stat(f, { bigint: true });
  expect(before.mtimeNs % 1_000_000_000n).toBe(0n);
  const seconds = Number(before.mtimeNs / 1_000_000_000n);
  const fh = await open(f, 'r+');
  try {
    const b = Buffer.alloc(1);
    await fh.read(b, 0, 1, offset);
    b[0] = b[0]! ^ 0xa5;
    await fh.write(b, 0, 1, offset);
    await fh.utimes(seconds, seconds);
  } finally {
    await fh.close();
  }
  expect((await stat(f, { bigint: true })).mtimeNs).toBe(before.mtimeNs);
}

/** Sets the copy's modification time to a whole second; the manager takes it over (re-verified) on the next use. */
async function wholeSecondMtime(f: string): Promise<void> {
  const seconds = Math.floor(Date.now() / 1000) - 60;
  await utimes(f, seconds, seconds);
}

/** GET with node:http: the status, the Content-Length, the bytes received and how the body ended. */
function download(url: string): Promise<{ status: number; length: number; received: number; ended: 'complete' | 'aborted' }> {
  return new Promise((resolve, reject) => {
    http
      .get(url, (res) => {
        let received = 0;
        let done = false;
        const finish = (ended: 'complete' | 'aborted') => {
          if (done) return;
          done = true;
          resolve({ status: res.statusCode ?? 0, length: Number(res.headers['content-length'] ?? -1), received, ended });
        };
        res.on('data', (c: Buffer) => (received += c.length));
        res.on('end', () => finish(res.complete ? 'complete' : 'aborted'));
        res.on('aborted', () => finish('aborted'));
        res.on('error', () => finish('aborted'));
        res.on('close', () => finish(res.complete ? 'complete' : 'aborted'));
      })
      .on('error', reject);
  });
}

describe('REST download of a corrupted only copy', () => {
  it('is cut short (a truncated body, never a complete one), and the copy is marked failed', async () => {
    await sys.controllers.actions.create({ name: 'rotdl', sourceType: 'download', parameters: { url: server.url('img.raw') }, expectedChecksum: sum, minNumberOfCopies: 1 });
    const ready = await waitFor('a ready copy', async () => {
      const b = await sys.store.get(BackingImageKind, 'rotdl', sys.namespace);
      return Object.values(b.status?.diskFileStatusMap ?? {}).some((s) => s.state === 'ready') ? b : undefined;
    }, 60_000);
    const file = path.join(sys.disks[0]!.path, 'backing-images', `rotdl-${ready.status!.uuid}`, 'backing');
    await wholeSecondMtime(file);
    // A healthy download first: complete, with every byte. The manager re-verifies the copy under its new time first;
    // while its periodic check does that the copy is not ready and a download is refused, so this waits for a 200
    // (which also means the manager has taken the new time over).
    const good = await waitFor('a download of the copy under its new time', async () => {
      const r = await download(`${sys.url}/v1/backingimages/rotdl/download?raw=true`);
      return r.status === 200 ? r : undefined;
    }, 30_000);
    expect(good).toEqual({ status: 200, length: SIZE, received: SIZE, ended: 'complete' });

    await flipByte(file, 2 * SEG + 1234);
    const bad = await download(`${sys.url}/v1/backingimages/rotdl/download?raw=true`);
    expect(bad.status).toBe(200);
    expect(bad.length).toBe(SIZE);
    expect(bad.ended).toBe('aborted');
    expect(bad.received).toBeLessThan(SIZE);
    const failed = await waitFor('the copy failed', async () => {
      const b: BackingImage = await sys.store.get(BackingImageKind, 'rotdl', sys.namespace);
      const s = Object.values(b.status?.diskFileStatusMap ?? {})[0];
      return s?.state === 'failed' ? s : undefined;
    }, 30_000);
    // With a chain the stream stops before the bad segment; a copy without one is checked as a whole, its last
    // chunk held back: either way the message names the download and the mismatch.
    expect(failed.message).toMatch(/download: SHA-512 (chain mismatch in segment 2 |mismatch)/);
    if (/chain mismatch/.test(failed.message ?? '')) expect(bad.received).toBeLessThanOrEqual(2 * SEG);
  }, 120_000);
});
