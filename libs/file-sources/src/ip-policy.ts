import { isIP } from 'node:net';

/** Why an address is refused by default (SSRF guard). */
export type RestrictedAddressKind =
  | 'loopback'
  | 'link-local'
  | 'private'
  | 'metadata'
  | 'unspecified'
  | 'multicast'
  | 'carrier-grade-nat'
  | 'unique-local';

interface Cidr {
  family: 4 | 6;
  /** address as a big integer (32 or 128 bits) */
  base: bigint;
  prefix: number;
}

function ipv4ToBigInt(ip: string): bigint {
  const parts = ip.split('.').map((p) => Number(p));
  return parts.reduce((acc, p) => (acc << 8n) | BigInt(p), 0n);
}

function ipv6ToBigInt(ip: string): bigint {
  let s = ip;
  const zone = s.indexOf('%');
  if (zone >= 0) s = s.slice(0, zone);
  // embedded IPv4 tail (::ffff:1.2.3.4)
  const lastColon = s.lastIndexOf(':');
  const tail = s.slice(lastColon + 1);
  if (tail.includes('.')) {
    const v4 = ipv4ToBigInt(tail);
    s = `${s.slice(0, lastColon + 1)}${((v4 >> 16n) & 0xffffn).toString(16)}:${(v4 & 0xffffn).toString(16)}`;
  }
  const [head, rest] = s.split('::') as [string, string | undefined];
  const headParts = head === '' ? [] : head.split(':');
  const restParts = rest === undefined ? [] : rest === '' ? [] : rest.split(':');
  const missing = 8 - headParts.length - restParts.length;
  const groups = rest === undefined ? headParts : [...headParts, ...Array<string>(missing).fill('0'), ...restParts];
  return groups.reduce((acc, g) => (acc << 16n) | BigInt(parseInt(g, 16)), 0n);
}

function parseCidr(text: string): Cidr | undefined {
  const slash = text.indexOf('/');
  const addr = slash >= 0 ? text.slice(0, slash) : text;
  const fam = isIP(addr);
  if (fam === 0) return undefined;
  const bits = fam === 4 ? 32 : 128;
  const prefix = slash >= 0 ? Number(text.slice(slash + 1)) : bits;
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > bits) {
    throw new Error(`invalid CIDR "${text}": prefix must be an integer between 0 and ${bits}`);
  }
  return { family: fam as 4 | 6, base: fam === 4 ? ipv4ToBigInt(addr) : ipv6ToBigInt(addr), prefix };
}

function cidrContains(c: Cidr, family: 4 | 6, value: bigint): boolean {
  if (c.family !== family) return false;
  const bits = family === 4 ? 32 : 128;
  const shift = BigInt(bits - c.prefix);
  return value >> shift === c.base >> shift;
}

const RESTRICTED: Array<[string, RestrictedAddressKind]> = [
  ['169.254.169.254/32', 'metadata'],
  ['100.100.100.200/32', 'metadata'],
  ['fd00:ec2::254/128', 'metadata'],
  ['0.0.0.0/8', 'unspecified'],
  ['127.0.0.0/8', 'loopback'],
  ['10.0.0.0/8', 'private'],
  ['172.16.0.0/12', 'private'],
  ['192.168.0.0/16', 'private'],
  ['100.64.0.0/10', 'carrier-grade-nat'],
  ['169.254.0.0/16', 'link-local'],
  ['224.0.0.0/4', 'multicast'],
  ['240.0.0.0/4', 'private'],
  ['::/128', 'unspecified'],
  ['::1/128', 'loopback'],
  ['fe80::/10', 'link-local'],
  ['fc00::/7', 'unique-local'],
  ['ff00::/8', 'multicast'],
];
const RESTRICTED_CIDRS = RESTRICTED.map(([c, kind]) => ({ cidr: parseCidr(c)!, kind }));

function toComparable(ip: string): { family: 4 | 6; value: bigint } | undefined {
  const fam = isIP(ip);
  if (fam === 4) return { family: 4, value: ipv4ToBigInt(ip) };
  if (fam === 6) {
    const v = ipv6ToBigInt(ip);
    // IPv4-mapped (::ffff:a.b.c.d) is judged as the IPv4 address.
    if (v >> 32n === 0xffffn) return { family: 4, value: v & 0xffffffffn };
    return { family: 6, value: v };
  }
  return undefined;
}

/** The kind of restricted range an IP address falls in, or undefined for a public address. */
export function classifyAddress(ip: string): RestrictedAddressKind | undefined {
  const c = toComparable(ip);
  if (!c) return undefined;
  for (const { cidr, kind } of RESTRICTED_CIDRS) if (cidrContains(cidr, c.family, c.value)) return kind;
  return undefined;
}

export class SourceHostRefusedError extends Error {
  override readonly name = 'SourceHostRefusedError';
  constructor(
    readonly host: string,
    readonly address: string,
    readonly kind: RestrictedAddressKind,
  ) {
    super(
      `refusing to connect to ${host}${host === address ? '' : ` (${address})`}: ${kind} addresses are not allowed ` +
        `as download sources unless listed in --allow-source-hosts`,
    );
  }
}

/**
 * SSRF policy for download sources: loopback, link-local, private, CGNAT, unique-local, multicast and cloud
 * metadata addresses are refused unless the host name or a CIDR covering the address is in the allowlist.
 */
export class SourceHostPolicy {
  readonly #hosts = new Set<string>();
  readonly #cidrs: Cidr[] = [];

  /** @param allow host names, IP addresses or CIDRs (e.g. `images.internal`, `10.0.0.0/8`, `::1`). */
  constructor(allow: readonly string[] = []) {
    for (const raw of allow) {
      const entry = raw.trim().toLowerCase();
      if (entry === '') continue;
      const cidr = parseCidr(entry.replace(/^\[|\]$/g, ''));
      if (cidr) this.#cidrs.push(cidr);
      else if (entry.includes('/')) throw new Error(`invalid allowed source host "${raw}": not a CIDR`);
      else this.#hosts.add(entry);
    }
  }

  /** Parses the `--allow-source-hosts` value (comma-separated). */
  static parse(list: string | undefined): SourceHostPolicy {
    return new SourceHostPolicy((list ?? '').split(','));
  }

  /**
   * Why a URL host written as an IP address may not be contacted (the message of {@link SourceHostRefusedError}), or
   * `undefined` (also for host names: they are checked once resolved, at connect time). For admission checks.
   */
  refusal(hostname: string): string | undefined {
    const h = hostname.toLowerCase().replace(/^\[|\]$/g, '');
    if (isIP(h) === 0) return undefined;
    try {
      this.check(h, h);
      return undefined;
    } catch (err) {
      if (err instanceof SourceHostRefusedError) return err.message;
      throw err;
    }
  }

  /** Throws {@link SourceHostRefusedError} when `address` (resolved for `host`) may not be contacted. */
  check(host: string, address: string): void {
    const h = host.toLowerCase().replace(/^\[|\]$/g, '');
    if (this.#hosts.has(h)) return;
    const kind = classifyAddress(address);
    if (kind === undefined) return;
    const c = toComparable(address)!;
    if (this.#cidrs.some((cidr) => cidrContains(cidr, c.family, c.value))) return;
    throw new SourceHostRefusedError(h, address, kind);
  }
}
