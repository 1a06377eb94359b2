import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { extname, join, resolve, sep } from 'node:path';
import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';

export interface UiServerOptions {
  /** Directory of the built web UI (it must contain `index.html`). */
  root: string;
  /** Path prefixes that belong to the API and are never answered by the UI. Default `['/v1']`. */
  apiPrefixes?: string[];
}

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.woff2': 'font/woff2',
  '.txt': 'text/plain; charset=utf-8',
  '.map': 'application/json',
};

async function fileIn(root: string, urlPath: string): Promise<{ path: string; size: number; mtime: Date } | undefined> {
  let decoded: string;
  try {
    decoded = decodeURIComponent(urlPath);
  } catch {
    return undefined;
  }
  if (decoded.includes('\0')) return undefined;
  const full = resolve(root, '.' + decoded);
  if (full !== root && !full.startsWith(root + sep)) return undefined; // outside the UI directory
  try {
    const st = await stat(full);
    return st.isFile() ? { path: full, size: st.size, mtime: st.mtime } : undefined;
  } catch {
    return undefined;
  }
}

function wantsHtml(req: FastifyRequest): boolean {
  const accept = req.headers.accept ?? '';
  return accept.includes('text/html');
}

async function send(reply: FastifyReply, req: FastifyRequest, file: { path: string; size: number; mtime: Date }, immutable: boolean): Promise<void> {
  const etag = `W/"${file.size.toString(16)}-${file.mtime.getTime().toString(16)}"`;
  reply
    .header('content-type', TYPES[extname(file.path).toLowerCase()] ?? 'application/octet-stream')
    .header('cache-control', immutable ? 'public, max-age=31536000, immutable' : 'no-cache')
    .header('etag', etag)
    .header('x-content-type-options', 'nosniff');
  if (req.headers['if-none-match'] === etag) {
    await reply.status(304).send();
    return;
  }
  reply.header('content-length', file.size);
  await reply.send(req.method === 'HEAD' ? undefined : createReadStream(file.path));
}

/**
 * Serves the built web UI from a directory, next to the REST API on the same fastify instance:
 * - files of the directory (`/assets/…` with immutable caching, others revalidated);
 * - `index.html` for a browser navigation (Accept: text/html) to `/` or any path without a file extension, so the
 *   UI and the API's JSON `GET /` coexist (API clients send `Accept: application/json` or nothing);
 * - nothing under the API prefixes (`/v1` by default).
 * It works from an onRequest hook, so it needs no routes and is registered without encapsulation.
 */
export const uiServerPlugin: FastifyPluginAsync<UiServerOptions> = async (app: FastifyInstance, opts: UiServerOptions) => {
  const root = resolve(opts.root);
  const index = join(root, 'index.html');
  const indexStat = await stat(index).catch(() => undefined); // a missing index.html is reported just below
  if (!indexStat?.isFile()) throw new Error(`the web UI directory ${root} has no index.html (build the UI first)`);
  const apiPrefixes = opts.apiPrefixes ?? ['/v1'];

  app.addHook('onRequest', async (req, reply) => {
    if (req.method !== 'GET' && req.method !== 'HEAD') return;
    const path = req.url.split('?')[0];
    if (apiPrefixes.some((p) => path === p || path.startsWith(p + '/'))) return;
    if (path !== '/') {
      const file = await fileIn(root, path);
      if (file) return send(reply, req, file, path.startsWith('/assets/'));
    }
    if (wantsHtml(req) && !extname(path)) {
      const file = await fileIn(root, '/index.html');
      if (file) return send(reply, req, file, false);
    }
  });
};
(uiServerPlugin as unknown as Record<symbol, boolean>)[Symbol.for('skip-override')] = true;
