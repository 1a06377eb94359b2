import * as http from 'node:http';
import * as net from 'node:net';

export interface ConnectProxy {
  url: string;
  /** `host:port` of every CONNECT request, in order. */
  readonly tunnels: string[];
  /** The Proxy-Authorization header values seen. */
  readonly authorizations: string[];
  stop(): Promise<void>;
}

/**
 * A tiny HTTP CONNECT proxy on loopback. Every tunnel goes to `upstreamPort` on 127.0.0.1, whatever host the client
 * asked for, so a client that reaches a server through a host name that does not resolve proves it used the proxy.
 * With `requireAuth` ("user:password"), tunnels without those Basic credentials get 407.
 */
export async function startConnectProxy(upstreamPort: number, requireAuth?: string): Promise<ConnectProxy> {
  const tunnels: string[] = [];
  const authorizations: string[] = [];
  const sockets = new Set<net.Socket>();
  const server = http.createServer((_req, res) => {
    res.writeHead(405).end('only CONNECT');
  });
  server.on('connect', (req: http.IncomingMessage, client: net.Socket, head: Buffer) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    const auth = req.headers['proxy-authorization'];
    if (auth) authorizations.push(auth);
    if (requireAuth && auth !== `Basic ${Buffer.from(requireAuth).toString('base64')}`) {
      client.end('HTTP/1.1 407 Proxy Authentication Required\r\n\r\n');
      return;
    }
    tunnels.push(req.url ?? '');
    const upstream = net.connect(upstreamPort, '127.0.0.1', () => {
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
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    tunnels,
    authorizations,
    stop: async () => {
      for (const s of sockets) s.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
