import { isIP } from 'node:net';

/** A `host:port` that cannot be parsed; the message names the address, what it was for, and what is wrong. */
export class HostPortError extends Error {
  override readonly name = 'HostPortError';
}

export interface HostPort {
  /** Host name or IP address, without brackets (`::1`, not `[::1]`). */
  host: string;
  port: number;
}

export interface ParseHostPortOptions {
  /** What the address is for, used in errors (e.g. `--listen`, `sync service`). Default `address`. */
  what?: string;
  /** Host used when the address has none (`:8000`); without it, an empty host is an error. */
  defaultHost?: string;
  /** Accepts and drops a leading `http://` or `https://` (addresses written as URLs by older peers). */
  allowScheme?: boolean;
}

/**
 * Splits `host:port` (Go's `net.SplitHostPort` rules): an IPv6 address is written in brackets (`[::1]:8000`), the
 * port is a decimal number from 0 to 65535. Throws {@link HostPortError} naming the address and the problem.
 */
export function parseHostPort(address: string, opts: ParseHostPortOptions = {}): HostPort {
  const what = opts.what ?? 'address';
  const fail = (why: string): never => {
    throw new HostPortError(`invalid ${what} "${address}": ${why} (expected host:port, or [ipv6]:port)`);
  };
  let s = address.trim();
  if (opts.allowScheme) s = s.replace(/^https?:\/\//, '');
  let host: string;
  let portText: string;
  if (s.startsWith('[')) {
    const close = s.indexOf(']');
    if (close < 0) fail('missing "]"');
    host = s.slice(1, close);
    if (s[close + 1] !== ':') fail('missing port');
    portText = s.slice(close + 2);
    if (isIP(host) !== 6) fail(`"${host}" in brackets is not an IPv6 address`);
  } else {
    const i = s.lastIndexOf(':');
    if (i < 0) fail('missing port');
    host = s.slice(0, i);
    portText = s.slice(i + 1);
    if (host.includes(':')) fail('too many colons (an IPv6 address needs brackets)');
    if (host.includes(']')) fail('unexpected "]"');
  }
  if (portText === '') fail('missing port');
  if (!/^\d+$/.test(portText) || Number(portText) > 65535) fail(`port "${portText}" is not a number from 0 to 65535`);
  if (host === '') {
    if (opts.defaultHost === undefined) fail('missing host');
    host = opts.defaultHost as string;
  }
  return { host, port: Number(portText) };
}

/** The inverse of {@link parseHostPort}: `host:port`, with an IPv6 host in brackets. */
export function formatHostPort(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}
