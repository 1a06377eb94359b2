export class PortAllocationError extends Error {
  override readonly name = 'PortAllocationError';
}

/** Parses `30001-31000`. */
export function parsePortRange(text: string): { min: number; max: number } {
  const m = /^\s*(\d+)\s*-\s*(\d+)\s*$/.exec(text);
  if (!m) throw new PortAllocationError(`invalid port range "${text}": expected <min>-<max>`);
  const min = Number(m[1]);
  const max = Number(m[2]);
  if (!(min >= 1 && max <= 65535 && min <= max)) {
    throw new PortAllocationError(`invalid port range "${text}": need 1 <= min <= max <= 65535`);
  }
  return { min, max };
}

/**
 * Exact port bookkeeping over an inclusive range. Allocation is round-robin: it searches from just after the
 * last allocated port and wraps, so a port that was just released is not handed out again at once. Releasing frees
 * exactly the port that was allocated (Longhorn released `port..port+1`, data-plane quirk §10-3).
 */
export class PortAllocator {
  readonly min: number;
  readonly max: number;
  readonly #used = new Set<number>();
  #last: number;

  constructor(range: { min: number; max: number }) {
    if (!(range.min >= 1 && range.max <= 65535 && range.min <= range.max)) {
      throw new PortAllocationError(`invalid port range ${range.min}-${range.max}`);
    }
    this.min = range.min;
    this.max = range.max;
    this.#last = range.max;
  }

  get size(): number {
    return this.max - this.min + 1;
  }

  get inUse(): number {
    return this.#used.size;
  }

  isAllocated(port: number): boolean {
    return this.#used.has(port);
  }

  allocate(): number {
    const n = this.size;
    for (let i = 1; i <= n; i++) {
      const port = this.min + ((this.#last - this.min + i) % n);
      if (!this.#used.has(port)) {
        this.#used.add(port);
        this.#last = port;
        return port;
      }
    }
    throw new PortAllocationError(`fail to allocate 1 ports: cannot find an empty port range in ${this.min}-${this.max}`);
  }

  release(port: number): void {
    if (!this.#used.delete(port)) {
      throw new PortAllocationError(`port ${port} is not allocated`);
    }
  }
}
