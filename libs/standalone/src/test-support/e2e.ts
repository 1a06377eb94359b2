import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { DataPlaneBinaries } from '../process-data-plane.js';
import { waitFor as pollUntil } from '@bis/datastore/testing';

/** Repository root (libs/standalone/src/test-support → ../../../..). */
export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');

export const BINARIES: DataPlaneBinaries = {
  manager: path.join(REPO_ROOT, 'apps/backing-image-manager/bin/backing-image-manager.js'),
  dataSource: path.join(REPO_ROOT, 'apps/backing-image-data-source/bin/backing-image-data-source.js'),
};

/** Whether the data-plane apps are built (the e2e target depends on their build). */
export async function binariesBuilt(): Promise<boolean> {
  try {
    await stat(path.join(REPO_ROOT, 'apps/backing-image-manager/dist/main.js'));
    await stat(path.join(REPO_ROOT, 'apps/backing-image-data-source/dist/main.js'));
    return true;
  } catch {
    return false;
  }
}

export interface ImageServer {
  url(name: string): string;
  /** Number of GET requests per file name. */
  gets: Map<string, number>;
  /** Delay each response body by this many ms per 64 KiB chunk (to keep downloads in progress). */
  throttleMs: number;
  close(): Promise<void>;
}

/** Serves files from `dir` over HTTP on 127.0.0.1 (HEAD and GET, with Content-Length). */
export async function startImageServer(dir: string): Promise<ImageServer> {
  const gets = new Map<string, number>();
  const state = { throttleMs: 0 };
  const serve = async (req: http.IncomingMessage, res: http.ServerResponse) => {
    const name = decodeURIComponent((req.url ?? '/').split('?')[0]!.slice(1));
    const file = path.join(dir, name);
    try {
      const st = await stat(file);
      res.writeHead(200, { 'content-length': st.size, 'content-type': 'application/octet-stream', 'accept-ranges': 'none' });
      if (req.method === 'HEAD') return res.end();
      gets.set(name, (gets.get(name) ?? 0) + 1);
      const rs = createReadStream(file, { highWaterMark: 64 << 10 });
      rs.on('data', (chunk) => {
        if (!res.write(chunk) || state.throttleMs > 0) {
          rs.pause();
          const resume = () => setTimeout(() => rs.resume(), state.throttleMs);
          if (res.writableNeedDrain) res.once('drain', resume);
          else resume();
        }
      });
      rs.on('end', () => res.end());
      rs.on('error', () => res.destroy());
      res.on('close', () => rs.destroy());
    } catch {
      res.writeHead(404).end('not found');
    }
  };
  // serve() answers every request itself (a 404 included); nothing waits for it.
  const server = http.createServer((req, res) => void serve(req, res));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  return {
    url: (n) => `http://127.0.0.1:${port}/${n}`,
    gets,
    get throttleMs() {
      return state.throttleMs;
    },
    set throttleMs(v: number) {
      state.throttleMs = v;
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/** Writes a deterministic pseudo-random file of `size` bytes and returns its SHA-512. */
export async function writeImage(file: string, size: number, seed = 1): Promise<string> {
  const buf = Buffer.alloc(size);
  let x = seed;
  for (let i = 0; i < size; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    buf[i] = x >>> 24;
  }
  await writeFile(file, buf);
  return createHash('sha512').update(buf).digest('hex');
}

export async function tempDir(prefix: string): Promise<{ dir: string; remove(): Promise<void> }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), prefix));
  return { dir, remove: () => rm(dir, { recursive: true, force: true }) };
}

/** Polls `fn` (every `intervalMs`, default 100) until it returns a truthy value; fails with the last value after `timeoutMs`. */
export function waitFor<T>(what: string, fn: () => Promise<T> | T, timeoutMs = 30_000, intervalMs = 100): Promise<NonNullable<T>> {
  return pollUntil(what, fn, timeoutMs, intervalMs);
}
