import { parseHostPort } from '@bis/net-address';
import { createServer, request, type Server } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';

export interface ProxiedRequest {
  /** `GET`, `HEAD`, … for forwarded HTTP requests; `CONNECT` for tunnels. */
  method: string;
  /** The absolute URL (HTTP) or `host:port` (CONNECT) the client asked for. */
  target: string;
}

export interface TestProxy {
  /** `http://127.0.0.1:<port>` */
  url: string;
  requests: ProxiedRequest[];
  close(): Promise<void>;
}

/**
 * A minimal forward proxy on 127.0.0.1: forwards absolute-form HTTP requests and opens CONNECT tunnels, recording
 * every request, so tests can check which traffic went through a proxy and which did not.
 */
export async function startTestProxy(): Promise<TestProxy> {
  const requests: ProxiedRequest[] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((req, res) => {
    const target = req.url ?? '';
    requests.push({ method: req.method ?? '', target });
    let url: URL;
    try {
      url = new URL(target);
    } catch {
      res.writeHead(400).end('proxy: absolute URL required');
      return;
    }
    const headers = { ...req.headers };
    delete headers['proxy-connection'];
    delete headers['proxy-authorization'];
    const up = request(
      { host: url.hostname, port: url.port || 80, method: req.method, path: `${url.pathname}${url.search}`, headers },
      (upRes) => {
        res.writeHead(upRes.statusCode ?? 502, upRes.headers);
        upRes.pipe(res);
      },
    );
    up.on('error', () => res.destroy());
    res.on('close', () => up.destroy());
    req.pipe(up);
  });
  server.on('connect', (req, client: Socket, head: Buffer) => {
    const target = req.url ?? '';
    requests.push({ method: 'CONNECT', target });
    let host: string;
    let port: number;
    try {
      ({ host, port } = parseHostPort(target, { what: 'CONNECT target' }));
    } catch (e) {
      client.end(`HTTP/1.1 400 Bad Request\r\n\r\n${(e as Error).message}\n`);
      return;
    }
    const upstream = connect(port, host, () => {
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length > 0) upstream.write(head);
      upstream.pipe(client);
      client.pipe(upstream);
    });
    sockets.add(upstream);
    upstream.on('close', () => sockets.delete(upstream));
    upstream.on('error', () => client.destroy());
    client.on('error', () => upstream.destroy());
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}
