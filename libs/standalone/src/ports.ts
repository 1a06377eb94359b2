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

/**
 * Free ports that are never handed out twice while reserved: the OS may return the same ephemeral port to two
 * probes in a row, before either workload binds it.
 */
export class PortReservations {
  private readonly reserved = new Map<number, string>();

  constructor(private readonly host = '127.0.0.1') {}

  async reserve(owner: string, count: number): Promise<number[]> {
    const out: number[] = [];
    for (let attempts = 0; out.length < count; attempts++) {
      if (attempts > 100) throw new Error(`could not find ${count} free ports on ${this.host}`);
      const p = await freePort(this.host);
      if (this.reserved.has(p)) continue;
      this.reserved.set(p, owner);
      out.push(p);
    }
    return out;
  }

  release(owner: string): void {
    for (const [p, o] of [...this.reserved]) if (o === owner) this.reserved.delete(p);
  }
}
