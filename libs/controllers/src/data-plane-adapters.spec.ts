import { afterEach, describe, expect, it } from '@jest/globals';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { httpDataSourceClient } from './data-plane-adapters.js';
import { waitFor } from './test-support/harness.js';

describe('httpDataSourceClient', () => {
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

  it('reads GET /v1/file and closes its connection after each answer (no pool kept per data source)', async () => {
    const { address, sockets } = await serve((req, res) => {
      expect(req.url).toBe('/v1/file');
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ state: 'ready-for-transfer', size: '65536', progress: 100, currentChecksum: 'ab', message: '' }));
    });
    const c = httpDataSourceClient(address);
    expect(await c.get()).toEqual({ state: 'ready-for-transfer', size: 65536, progress: 100, currentChecksum: 'ab', message: '' });
    expect((await c.get()).state).toBe('ready-for-transfer');
    expect(sockets).toHaveLength(2);
    // the client closes each connection once answered: wait for that, however long a loaded machine takes
    await waitFor('both connections closed', () => sockets.every((s) => s.destroyed));
  });

  it('names the status and body of an error answer, and a body that is not JSON', async () => {
    let answer = 500;
    const { address } = await serve((_req, res) => {
      res.statusCode = answer;
      res.end(answer === 500 ? 'disk gone' : '<html>');
    });
    await expect(httpDataSourceClient(address).get()).rejects.toThrow(`GET http://${address}/v1/file: HTTP 500 disk gone`);
    answer = 200;
    await expect(httpDataSourceClient(address).get()).rejects.toThrow('the answer is not JSON: <html>');
  });

  it('fails when nothing listens', async () => {
    const { address } = await serve(() => undefined);
    servers[0].closeAllConnections();
    await new Promise((r) => servers.splice(0)[0].close(r));
    await expect(httpDataSourceClient(address).get()).rejects.toThrow(/ECONNREFUSED/);
  });
});
