import { readFileSync } from 'node:fs';
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

/** The first port of the OS's ephemeral (outgoing connection) range: Linux's ip_local_port_range, else 32768. */
export function ephemeralPortStart(): number {
  try {
    const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    if (Number.isInteger(low) && low > 1024) return low;
  } catch {
    // not Linux, or not readable
  }
  return 32768;
}

/**
 * Hands out disjoint port ranges for the managers' sync receivers (`--port-range`), from a random base so two
 * standalone systems on one machine rarely overlap. The ranges lie below the OS's ephemeral range: a receiver port
 * inside it can already be the local end of one of the thousands of loopback connections the system makes (seen as
 * EADDRINUSE when 1,000 images were synced).
 */
export class PortRangeAllocator {
  private next: number;
  private readonly first: number;
  private readonly end: number;
  constructor(
    private readonly size = 50,
    end = ephemeralPortStart(),
    first = Math.min(10000, end - 2 * size),
  ) {
    this.first = first;
    this.end = end;
    const slots = Math.max(1, Math.floor((end - first) / size));
    this.next = first + Math.floor(Math.random() * slots) * size;
  }
  allocate(): string {
    if (this.next + this.size > this.end) this.next = this.first;
    const a = this.next;
    this.next += this.size;
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
