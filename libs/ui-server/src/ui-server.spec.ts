import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import Fastify, { type FastifyInstance } from 'fastify';
import { uiServerPlugin } from './index.js';

describe('uiServerPlugin', () => {
  let dir: string;
  let app: FastifyInstance;
  let base: string;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'ui-server-'));
    await mkdir(join(dir, 'assets'));
    await writeFile(join(dir, 'index.html'), '<!doctype html><title>ui</title>');
    await writeFile(join(dir, 'assets', 'app-1234.js'), 'console.log(1)');
    await writeFile(join(dir, 'favicon.svg'), '<svg/>');
    await writeFile(join(dir, '..', 'secret-ui-server.txt'), 'nope').catch(() => undefined);
    app = Fastify();
    // The API's own routes, as the controller manager registers them.
    app.get('/', async () => ({ type: 'collection', resourceType: 'apiVersion' }));
    app.get('/v1/backingimages', async () => ({ type: 'collection', data: [] }));
    await app.register(uiServerPlugin, { root: dir });
    base = await app.listen({ host: '127.0.0.1', port: 0 });
  });
  afterAll(async () => {
    await app.close();
    await rm(dir, { recursive: true, force: true });
    await rm(join(dir, '..', 'secret-ui-server.txt'), { force: true });
  });

  it('answers a browser at / and at UI paths with index.html, and API clients with JSON', async () => {
    const html = await fetch(`${base}/`, { headers: { accept: 'text/html,application/xhtml+xml' } });
    expect(html.headers.get('content-type')).toContain('text/html');
    expect(html.headers.get('cache-control')).toBe('no-cache');
    expect(await html.text()).toContain('<title>ui</title>');
    const deep = await fetch(`${base}/images/foo`, { headers: { accept: 'text/html' } });
    expect(await deep.text()).toContain('<title>ui</title>');
    const api = await fetch(`${base}/`, { headers: { accept: 'application/json' } });
    expect(await api.json()).toEqual({ type: 'collection', resourceType: 'apiVersion' });
    const list = await fetch(`${base}/v1/backingimages`, { headers: { accept: 'text/html' } });
    expect(await list.json()).toEqual({ type: 'collection', data: [] });
  });

  it('serves assets with types and caching, revalidates with ETag, and refuses paths outside the directory', async () => {
    const js = await fetch(`${base}/assets/app-1234.js`);
    expect(js.status).toBe(200);
    expect(js.headers.get('content-type')).toBe('text/javascript; charset=utf-8');
    expect(js.headers.get('cache-control')).toContain('immutable');
    const svg = await fetch(`${base}/favicon.svg`);
    expect(svg.headers.get('content-type')).toBe('image/svg+xml');
    const etag = svg.headers.get('etag')!;
    const again = await fetch(`${base}/favicon.svg`, { headers: { 'if-none-match': etag } });
    expect(again.status).toBe(304);
    const escape = await fetch(`${base}/..%2Fsecret-ui-server.txt`);
    expect(escape.status).toBe(404);
    const missing = await fetch(`${base}/assets/nothing.js`);
    expect(missing.status).toBe(404);
  });

  it('refuses a directory without index.html', async () => {
    const other = Fastify();
    await expect(other.register(uiServerPlugin, { root: join(dir, 'assets') }).ready()).rejects.toThrow('has no index.html');
    await other.close();
  });
});
