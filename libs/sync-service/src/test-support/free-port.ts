import * as net from 'node:net';

/** A TCP port on 127.0.0.1 that was free a moment ago (for receivers that must be given a port up front). */
export async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}
