import type http from 'node:http';
import type { AddressInfo } from 'node:net';

/** Listens on 127.0.0.1 (any free port); `close` ends every connection and resolves once the server closed. */
export async function listenOnLoopback(server: http.Server): Promise<{ port: number; close: () => Promise<void> }> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const close = () => {
    server.closeAllConnections();
    return new Promise<void>((r) => server.close(() => r()));
  };
  return { port: (server.address() as AddressInfo).port, close };
}
