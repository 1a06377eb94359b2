import { isIP } from 'node:net';
import { parseHostPort } from '@bis/net-address';
import { BackupStoreError } from '../names.js';

/** Longhorn's proxy credential keys (copied into the environment of its Go process; here they are passed per call). */
export interface ProxySettings {
  HTTP_PROXY?: string;
  HTTPS_PROXY?: string;
  NO_PROXY?: string;
}

function parseProxyUrl(key: string, value: string): URL {
  // Go's httpproxy accepts a bare host:port and means http:// then.
  const withScheme = /^[a-zA-Z][a-zA-Z0-9+.-]*:\/\//.test(value) ? value : `http://${value}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    throw new BackupStoreError('InvalidArgument', `${key} ${JSON.stringify(value)} is not a proxy URL`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new BackupStoreError('InvalidArgument', `${key} ${JSON.stringify(value)}: only http:// and https:// proxies are supported`);
  }
  return url;
}

function ipv4ToInt(ip: string): number {
  return ip.split('.').reduce((n, part) => n * 256 + Number(part), 0);
}

function inCidr(ip: string, cidr: string): boolean {
  const [base, bitsText] = cidr.split('/');
  const bits = Number(bitsText);
  if (base === undefined || isIP(base) !== 4 || isIP(ip) !== 4 || !Number.isInteger(bits) || bits < 0 || bits > 32) return false;
  if (bits === 0) return true;
  const mask = bits === 32 ? 0xffffffff : (~0 << (32 - bits)) >>> 0;
  return ((ipv4ToInt(ip) & mask) >>> 0) === ((ipv4ToInt(base) & mask) >>> 0);
}

/**
 * Go's `httpproxy` rule for whether a host is reached directly: never through a proxy for `localhost` and loopback
 * addresses; `NO_PROXY` is a comma-separated list of `*` (everything), host names (`example.com` matches it and its
 * subdomains, `.example.com` only subdomains), IP addresses and CIDR ranges, each optionally with `:port`.
 */
export function bypassesProxy(host: string, port: number, noProxy: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  if (h === 'localhost' || h.endsWith('.localhost')) return true;
  if (isIP(h) === 4 && h.startsWith('127.')) return true;
  if (isIP(h) === 6 && (h === '::1' || h === '0:0:0:0:0:0:0:1')) return true;
  for (const raw of noProxy.split(',')) {
    let entry = raw.trim().toLowerCase();
    if (entry === '') continue;
    if (entry === '*') return true;
    if (entry.includes('/')) {
      if (inCidr(h, entry)) return true;
      continue;
    }
    let entryPort: number | undefined;
    // `host:port` or `[ipv6]:port`; a bare IPv6 address or a name without a port has no port
    if (entry.includes(':') && isIP(entry) !== 6) {
      try {
        const hp = parseHostPort(entry, { what: 'NO_PROXY entry' });
        entry = hp.host;
        entryPort = hp.port;
      } catch {
        // not host:port: compared as it is
      }
    }
    entry = entry.replace(/^\[|\]$/g, '');
    if (entryPort !== undefined && entryPort !== port) continue;
    if (isIP(entry) !== 0) {
      if (entry === h) return true;
      continue;
    }
    if (entry.startsWith('.')) {
      if (h.endsWith(entry)) return true;
      continue;
    }
    if (entry.startsWith('*.')) entry = entry.slice(1);
    if (h === entry || h.endsWith(`.${entry.replace(/^\./, '')}`)) return true;
  }
  return false;
}

/**
 * The proxy to use for a request to `target` (an http:// or https:// URL), or undefined for a direct connection:
 * `HTTPS_PROXY` for https targets, `HTTP_PROXY` for http targets, unless `NO_PROXY` (or the loopback rule) says
 * direct. Keys are read in upper case first, then lower case, as Go does. Bad proxy URLs are reported by key.
 */
export function proxyFor(target: URL, settings: Readonly<Record<string, string | undefined>>): URL | undefined {
  const pick = (key: keyof ProxySettings): string => (settings[key] ?? settings[key.toLowerCase()] ?? '').trim();
  const key: keyof ProxySettings = target.protocol === 'https:' ? 'HTTPS_PROXY' : 'HTTP_PROXY';
  const value = pick(key);
  if (value === '') return undefined;
  const proxy = parseProxyUrl(key, value);
  const port = target.port !== '' ? Number(target.port) : target.protocol === 'https:' ? 443 : 80;
  if (bypassesProxy(target.hostname, port, pick('NO_PROXY'))) return undefined;
  return proxy;
}
