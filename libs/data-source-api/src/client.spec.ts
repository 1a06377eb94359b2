import { afterEach, describe, expect, it } from '@jest/globals';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { Readable } from 'node:stream';
import { DataSourceClient, DataSourceHttpError } from './client.js';

async function waitFor(what: string, cond: () => boolean, timeoutMs = 60_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('DataSourceClient', () => {
  const servers: http.Server[] = [];
  afterEach(async () => {
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
  });
  async function serve(handler: http.RequestListener): Promise<{ address: string; sockets: Socket[] }> {
    const s = http.createServer(handler);
    const sockets: Socket[] = [];
    s.on('connection', (c) => sockets.push(c));
    servers.push(s);
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    return { address: `127.0.0.1:${(s.address() as AddressInfo).port}`, sockets };
  }

  it('reads GET /v1/file with every field, sends the token, keeps its connection for the next call, and makes a new one when the server closed it', async () => {
    const seen: Array<{ url?: string; auth?: string }> = [];
    const { address, sockets } = await serve((req, res) => {
      seen.push({ url: req.url, auth: req.headers.authorization });
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ filePath: '/data/tmp/x', uuid: 'u1', state: 'ready-for-transfer', size: '65536', progress: 100, currentChecksum: 'ab', parameters: { url: 'http://a' } }));
    });
    const c = new DataSourceClient(address, { token: 'tok' });
    expect(await c.get()).toEqual({
      sourceType: '',
      parameters: { url: 'http://a' },
      name: '',
      diskUUID: '',
      expectedChecksum: '',
      filePath: '/data/tmp/x',
      uuid: 'u1',
      size: 65536,
      virtualSize: 0,
      realSize: 0,
      state: 'ready-for-transfer',
      progress: 100,
      processedSize: 0,
      modificationTime: '',
      currentChecksum: 'ab',
      message: '',
      sendingReference: 0,
    });
    expect((await c.get()).state).toBe('ready-for-transfer');
    expect(seen).toEqual([
      { url: '/v1/file', auth: 'Bearer tok' },
      { url: '/v1/file', auth: 'Bearer tok' },
    ]);
    expect(sockets).toHaveLength(1);
    // the data source closes the kept connection (as its server does when the data source closes or it idles out)
    servers[0]!.closeIdleConnections();
    await waitFor('the kept connection closed', () => sockets[0]!.destroyed);
    await new Promise((r) => setTimeout(r, 50));
    expect((await c.get()).state).toBe('ready-for-transfer');
    expect(sockets).toHaveLength(2);
  });

  it('names the status and body of an error answer, a body that is not JSON, and an unknown state', async () => {
    let answer: 500 | 'html' | 'state' = 500;
    const { address } = await serve((_req, res) => {
      res.statusCode = answer === 500 ? 500 : 200;
      res.end(answer === 500 ? 'disk gone' : answer === 'html' ? '<html>' : '{"state":"sleeping"}');
    });
    const c = new DataSourceClient(address);
    const err = await c.get().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DataSourceHttpError);
    expect(err).toMatchObject({ statusCode: 500, body: 'disk gone', message: `GET http://${address}/v1/file: HTTP 500 disk gone` });
    answer = 'html';
    await expect(c.get()).rejects.toThrow('the answer is not JSON: <html>');
    answer = 'state';
    await expect(c.get()).rejects.toThrow('unknown file state "sleeping"');
  });

  it('refuses an answer larger than 1 MiB', async () => {
    const { address } = await serve((_req, res) => {
      res.end(Buffer.alloc(3 << 20, 0x20));
    });
    await expect(new DataSourceClient(address).get()).rejects.toThrow('is larger than 1048576 bytes');
  });

  it('fails when nothing listens, and refuses an address that is not host:port', async () => {
    const { address } = await serve(() => undefined);
    await new Promise((r) => servers.splice(0)[0]!.close(r));
    await expect(new DataSourceClient(address).get()).rejects.toThrow(/ECONNREFUSED/);
    expect(() => new DataSourceClient('127.0.0.1')).toThrow('invalid data source address "127.0.0.1": missing port');
  });

  it('transfers with POST ?action=transfer, and reads the upload offset', async () => {
    const calls: string[] = [];
    const { address } = await serve((req, res) => {
      calls.push(`${req.method} ${req.url}`);
      if (req.url === '/v1/file?action=uploadOffset') res.end('{"size":10,"offset":4}');
      else if (calls.length > 2) {
        res.statusCode = 500;
        res.end('datasource file current state is in-progress rather than ready-for-transfer, cannot do transfer');
      } else res.end();
    });
    const c = new DataSourceClient(`http://${address}`);
    await c.transfer();
    expect(await c.uploadOffset()).toEqual({ size: 10, offset: 4 });
    await expect(c.transfer()).rejects.toThrow(`POST http://${address}/v1/file?action=transfer: HTTP 500 datasource file current state is in-progress`);
    expect(calls).toEqual(['POST /v1/file?action=transfer', 'GET /v1/file?action=uploadOffset', 'POST /v1/file?action=transfer']);
  });

  it('waits for a change with ?waitWhile=&wait= (at most 30 s), and answers undefined from a data source that answered at once without saying it waits', async () => {
    const urls: string[] = [];
    let waits = true;
    const { address } = await serve((req, res) => {
      urls.push(req.url ?? '');
      if (waits) res.setHeader('x-bis-waits', 'state');
      res.end(JSON.stringify({ state: 'ready-for-transfer', size: 512 }));
    });
    const c = new DataSourceClient(address);
    expect(await c.waitForChange('in-progress', { waitSeconds: 20 })).toMatchObject({ state: 'ready-for-transfer', size: 512 });
    expect(await c.waitForChange('', { waitSeconds: 600 })).toMatchObject({ state: 'ready-for-transfer' });
    waits = false; // Longhorn's data source: the parameters are not known there, the file comes at once
    expect(await c.waitForChange('in-progress', { waitSeconds: 20 })).toBeUndefined();
    expect(urls).toEqual(['/v1/file?waitWhile=in-progress&wait=20', '/v1/file?waitWhile=&wait=30', '/v1/file?waitWhile=in-progress&wait=20']);
    const ac = new AbortController();
    ac.abort();
    await expect(c.waitForChange('ready', { waitSeconds: 1, signal: ac.signal })).rejects.toThrow();
  });

  it('streams an upload body with its query and headers, and gives back an early refusal as the answer', async () => {
    const got: Array<{ url?: string; type?: string; bytes: number }> = [];
    const { address } = await serve((req, res) => {
      if (req.url?.includes('size=999')) {
        res.setHeader('connection', 'close');
        res.statusCode = 413;
        res.end('too large\n');
        return;
      }
      let bytes = 0;
      req.on('data', (b: Buffer) => (bytes += b.length));
      req.on('end', () => {
        got.push({ url: req.url, type: req.headers['content-type'], bytes });
        res.end('{"size":3145728,"offset":3145728}');
      });
    });
    const c = new DataSourceClient(address);
    const chunks = () => Readable.from((function* () { for (let i = 0; i < 48; i++) yield Buffer.alloc(64 << 10, i); })());
    const ok = await c.postFile('?action=uploadPart&size=3145728&offset=0', chunks(), { 'content-type': 'application/octet-stream' });
    expect(ok).toEqual({ statusCode: 200, body: '{"size":3145728,"offset":3145728}' });
    expect(got).toEqual([{ url: '/v1/file?action=uploadPart&size=3145728&offset=0', type: 'application/octet-stream', bytes: 3 << 20 }]);
    const big = Readable.from((function* () { for (let i = 0; i < 400; i++) yield Buffer.alloc(64 << 10, 1); })());
    expect(await c.postFile('?action=upload&size=999', big, { 'content-type': 'application/octet-stream' })).toEqual({ statusCode: 413, body: 'too large\n' });
  });
});
