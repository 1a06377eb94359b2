import { afterEach, describe, expect, it } from '@jest/globals';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { SyncClient, SyncClientError } from './sync-client.js';

describe('SyncClient (the sync service API over got)', () => {
  const servers: http.Server[] = [];
  const clients: SyncClient[] = [];
  afterEach(async () => {
    for (const c of clients.splice(0)) c.close();
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
  });
  type Seen = { method?: string; url?: string; auth?: string; type?: string; body: Buffer };
  async function serve(answer: (s: Seen, res: http.ServerResponse) => void): Promise<{ client: SyncClient; seen: Seen[] }> {
    const seen: Seen[] = [];
    const s = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const one = { method: req.method, url: req.url, auth: req.headers.authorization, type: req.headers['content-type'], body: Buffer.concat(chunks) };
        seen.push(one);
        answer(one, res);
      });
    });
    servers.push(s);
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    const client = new SyncClient(`127.0.0.1:${(s.address() as AddressInfo).port}`, { token: 't0k', shortTimeoutMs: 5_000 });
    clients.push(client);
    return { client, seen };
  }

  it('sends paths, actions and parameters as the routes read them, with the token and a JSON credential body', async () => {
    const { client, seen } = await serve((s, res) => res.end(s.method === 'GET' ? '{"filePath":"/d/a b","state":"ready"}' : ''));
    expect(await client.get('/d/a b')).toEqual({ filePath: '/d/a b', state: 'ready' });
    await client.forget('/d/a b');
    await client.restoreFromBackupURL({ filePath: '/d/x', uuid: 'u1', backupUrl: 'vfs:///t?backingImage=x', concurrentLimit: 2, credential: { k: 'v' }, expectedChecksum: 'c' });
    await client.upload({ filePath: '/d/y', uuid: 'u2', size: 3 << 20, body: Readable.from([Buffer.alloc(1 << 20, 1), Buffer.alloc(2 << 20, 2)]) });
    expect(seen.map((s) => [s.method, s.url, s.auth, s.type])).toEqual([
      ['GET', '/v1/files/%2Fd%2Fa+b', 'Bearer t0k', undefined],
      ['POST', '/v1/files/%2Fd%2Fa+b?action=forget', 'Bearer t0k', undefined],
      ['POST', '/v1/files?action=restoreFromBackupURL&file-path=%2Fd%2Fx&uuid=u1&backup-url=vfs%3A%2F%2F%2Ft%3FbackingImage%3Dx&concurrent-limit=2&expected-checksum=c', 'Bearer t0k', 'application/json'],
      ['POST', '/v1/files?action=upload&file-path=%2Fd%2Fy&uuid=u2&size=3145728', 'Bearer t0k', 'application/octet-stream'],
    ]);
    expect(seen[2]!.body.toString()).toBe('{"k":"v"}');
    expect(seen[3]!.body.length).toBe(3 << 20);
  });

  it("words an error answer like Longhorn's client and keeps its status and body", async () => {
    const { client } = await serve((_s, res) => {
      res.statusCode = 404;
      res.end('file /d/z not found');
    });
    const err = await client.get('/d/z').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SyncClientError);
    expect(err).toMatchObject({ statusCode: 404, body: 'file /d/z not found', message: 'resp.StatusCode(404) != http.StatusOK(200), response body content: file /d/z not found' });
  });

  it('opens a download: a gzip body passes compressed with its headers; an error answer rejects before any byte', async () => {
    const gz = gzipSync(Buffer.alloc(1 << 20, 7));
    const { client, seen } = await serve((s, res) => {
      if (s.url?.includes('missing')) {
        res.statusCode = 500;
        res.end('no such file');
        return;
      }
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-encoding': 'gzip', 'content-disposition': 'attachment; filename=a.gz' });
      res.end(gz);
    });
    const d = await client.download('/d/a');
    expect(d.headers['content-encoding']).toBe('gzip');
    const chunks: Buffer[] = [];
    for await (const c of d.body) chunks.push(c as Buffer);
    expect(Buffer.concat(chunks).equals(gz)).toBe(true);
    expect(seen[0]!.url).toBe('/v1/files/%2Fd%2Fa/download');
    await client.download('/d/r', { raw: true }).then(async (r) => {
      for await (const _c of r.body) void _c;
    });
    expect(seen[1]!.url).toBe('/v1/files/%2Fd%2Fr/download?forV2Creation=true');
    await expect(client.download('/d/missing')).rejects.toThrow('resp.StatusCode(500) != http.StatusOK(200), response body content: no such file');
  });

  it('refuses an address that is not host:port', () => {
    expect(() => new SyncClient('localhost')).toThrow('invalid sync service address "localhost": missing port');
  });
});
