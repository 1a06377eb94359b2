import net from 'node:net';

/**
 * A TCP proxy on loopback that forwards to `target` and, each time more than `cutAfterBytes` have been sent upstream
 * since the start or the last cut (counted over all connections, so the result does not depend on whether the client
 * reuses connections), for the first `cuts` times, either cuts the connection carrying that byte (both ways, without
 * a response: a dropped upload in the middle of a request body) or, with `stall`, stops forwarding its bytes (a hung
 * network).
 */
export async function startFlakyProxy(target: string, opts: { cutAfterBytes: number; cuts: number; stall?: boolean }): Promise<{ url: string; cutsDone(): number; close(): Promise<void> }> {
  const t = new URL(target);
  let done = 0;
  let sent = 0; // bytes sent upstream since the start or the last cut, over all connections
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(t.port), t.hostname);
    sockets.add(client).add(upstream);
    let tripped = false;
    client.on('data', (chunk: Buffer) => {
      if (tripped) return;
      if (done < opts.cuts && sent + chunk.length > opts.cutAfterBytes) {
        tripped = true;
        const head = chunk.subarray(0, Math.max(0, opts.cutAfterBytes - sent));
        done++;
        sent = 0;
        upstream.write(head, () => {
          if (opts.stall) return client.pause();
          client.destroy();
          upstream.destroy();
        });
        return;
      }
      sent += chunk.length;
      upstream.write(chunk);
    });
    upstream.pipe(client);
    const end = (): void => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    cutsDone: () => done,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}
