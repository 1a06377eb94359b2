/**
 * Go's `net/url.ParseRequestURI`, as far as Longhorn's download-URL validator depends on it: which URLs it accepts,
 * the scheme and host it finds, and the text of its errors (`parse "x": invalid URI for request`). WHATWG's `URL`
 * differs where it matters (it reads `http:///x.img` as host `x.img`; Go reads an empty host).
 */

export interface GoRequestUri {
  /** Lower-cased scheme, `""` when there is none (`/path`). */
  readonly scheme: string;
  /** `host[:port]` as written (`""` when there is none, e.g. `http:///x` or `http:x`). */
  readonly host: string;
  /** Go's `URL.Hostname()`: the host without port and brackets. */
  readonly hostname: string;
}

export type GoParseResult = { ok: true; url: GoRequestUri } | { ok: false; error: string };

/** Go's `%q` for the common case (printable text): a double-quoted string with `"` and `\` escaped. */
export function goQuote(s: string): string {
  let out = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (ch === '"' || ch === '\\') out += `\\${ch}`;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (c < 0x20 || c === 0x7f) out += `\\x${c.toString(16).padStart(2, '0')}`;
    else out += ch;
  }
  return `${out}"`;
}

const fail = (raw: string, cause: string): GoParseResult => ({ ok: false, error: `parse ${goQuote(raw)}: ${cause}` });
const isHex = (c: string | undefined): boolean => c !== undefined && /^[0-9a-fA-F]$/.test(c);

/** `unescape` in Go's encodeHost or encodePath mode: only the error it would return. */
function unescapeError(s: string, mode: 'host' | 'path'): string | undefined {
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (c === '%') {
      if (i + 2 >= s.length || !isHex(s[i + 1]) || !isHex(s[i + 2])) {
        const seq = s.slice(i, i + 3);
        return `invalid URL escape ${goQuote(seq)}`;
      }
      if (mode === 'host' && parseInt(s[i + 1]!, 16) < 8 && s.slice(i, i + 3) !== '%25') return `invalid URL escape ${goQuote(s.slice(i, i + 3))}`;
      i += 2;
    } else if (mode === 'host' && c.charCodeAt(0) < 0x80 && !/[A-Za-z0-9\-._~!$&'()*+,;=:[\]<>"]/.test(c)) {
      return `invalid character ${goQuote(c)} in host name`;
    }
  }
  return undefined;
}

function validOptionalPort(port: string): boolean {
  return port === '' || (port.startsWith(':') && /^[0-9]*$/.test(port.slice(1)));
}

/** `parseHost`: the host's error, if any. */
function hostError(host: string): string | undefined {
  if (host.startsWith('[')) {
    const i = host.lastIndexOf(']');
    if (i < 0) return "missing ']' in host";
    const colonPort = host.slice(i + 1);
    if (!validOptionalPort(colonPort)) return `invalid port ${goQuote(colonPort)} after host`;
  } else {
    const i = host.lastIndexOf(':');
    if (i >= 0) {
      const colonPort = host.slice(i);
      if (!validOptionalPort(colonPort)) return `invalid port ${goQuote(colonPort)} after host`;
    }
  }
  return unescapeError(host, 'host');
}

/** Go's `URL.Hostname()`. */
function hostnameOf(host: string): string {
  if (host.startsWith('[')) {
    const i = host.indexOf(']');
    return i < 0 ? host.slice(1) : host.slice(1, i);
  }
  const i = host.lastIndexOf(':');
  return i < 0 ? host : host.slice(0, i);
}

/** Parses like Go's `url.ParseRequestURI` (no fragment; the query is not validated, as in Go). */
export function goParseRequestURI(raw: string): GoParseResult {
  // eslint-disable-next-line no-control-regex -- Go refuses control characters in a URL: matching them is the point
  if (/[\x00-\x1f\x7f]/.test(raw)) return fail(raw, 'net/url: invalid control character in URL');
  if (raw === '') return fail(raw, 'empty url');
  if (raw === '*') return { ok: true, url: { scheme: '', host: '', hostname: '' } };
  // getScheme
  let scheme = '';
  let rest = raw;
  for (let i = 0; i < raw.length; i++) {
    const c = raw[i]!;
    if (/[A-Za-z]/.test(c)) continue;
    if (/[0-9+\-.]/.test(c)) {
      if (i === 0) break;
      continue;
    }
    if (c === ':') {
      if (i === 0) return fail(raw, 'missing protocol scheme');
      scheme = raw.slice(0, i).toLowerCase();
      rest = raw.slice(i + 1);
    }
    break;
  }
  if (rest.endsWith('?') && rest.split('?').length === 2) rest = rest.slice(0, -1);
  else {
    const q = rest.indexOf('?');
    if (q >= 0) rest = rest.slice(0, q);
  }
  if (!rest.startsWith('/')) {
    if (scheme !== '') return { ok: true, url: { scheme, host: '', hostname: '' } }; // opaque: no host
    return fail(raw, 'invalid URI for request');
  }
  let host = '';
  if (scheme !== '' && rest.startsWith('//')) {
    let authority = rest.slice(2);
    const slash = authority.indexOf('/');
    rest = slash >= 0 ? authority.slice(slash) : '';
    if (slash >= 0) authority = authority.slice(0, slash);
    const at = authority.lastIndexOf('@');
    host = at < 0 ? authority : authority.slice(at + 1);
    const err = hostError(host);
    if (err) return fail(raw, err);
    if (at >= 0 && !/^[A-Za-z0-9\-._:~!$&'()*+,;=%@]*$/.test(authority.slice(0, at))) return fail(raw, 'net/url: invalid userinfo');
  }
  const pathErr = unescapeError(rest, 'path');
  if (pathErr) return fail(raw, pathErr);
  return { ok: true, url: { scheme, host, hostname: hostnameOf(host) } };
}
