import http from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A minimal stand-in for the data-source service's `/v1/file` (GET info, POST ?action=transfer), enough for a
 * manager's Fetch. The manager under test is real; this only plays the peer that prepared the tmp file.
 */
export async function startFakeDataSource(info: { filePath: string; uuid: string; state: string; size: number }): Promise<{
  address: string;
  transfers: number;
  /** The `authorization` header of each request (undefined when none was sent). */
  authorizations: (string | undefined)[];
  close(): Promise<void>;
}> {
  const self = { address: '', transfers: 0, authorizations: [] as (string | undefined)[], close: async () => undefined as void };
  const server = http.createServer((req, res) => {
    self.authorizations.push(req.headers.authorization);
    if (req.method === 'GET' && req.url === '/v1/file') {
      res.setHeader('Content-Type', 'application/json');
      res.end(JSON.stringify({ ...info, sourceType: 'download', parameters: {}, progress: 100, message: '' }));
    } else if (req.method === 'POST' && req.url === '/v1/file?action=transfer') {
      self.transfers++;
      res.end();
    } else {
      res.statusCode = 404;
      res.end('not found\n');
    }
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  self.address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  self.close = () => new Promise<void>((r) => server.close(() => r()));
  return self;
}
