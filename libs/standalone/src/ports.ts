import net from 'node:net';

/** A free TCP port on `host` (bound to 0 and released; the caller must bind it soon). */
export function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.once('error', reject);
    srv.listen(0, host, () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

/**
 * Hands out disjoint port ranges for the managers' sync receivers (`--port-range`), from a random base so two
 * standalone systems on one machine rarely overlap.
 */
export class PortRangeAllocator {
  private next: number;
  constructor(
    private readonly size = 50,
    start = 32000 + Math.floor(Math.random() * 200) * 100,
  ) {
    this.next = start;
  }
  allocate(): string {
    const a = this.next;
    this.next += this.size;
    if (this.next > 60000) this.next = 32000;
    return `${a}-${a + this.size - 1}`;
  }
}
