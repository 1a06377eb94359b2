import { isIP } from 'node:net';
import { rootCertificates } from 'node:tls';
import { readFileSync } from 'node:fs';
import got, { type Got, type Options } from 'got';
import { HttpProxyAgent, HttpsProxyAgent } from 'hpagent';
import { SourceHostPolicy } from './ip-policy.js';
import { guardedLookup, matchesNoProxy, resolveAll } from './origin-rules.js';
import type { FileSourcesOptions } from './source-provider.js';

export interface DownloadClientOptions {
  policy: SourceHostPolicy;
  /** Extra request headers sent to the origin (e.g. Authorization); dropped on a redirect to another origin. */
  headers?: Record<string, string>;
  /** PEM file with extra CA certificates trusted for HTTPS sources (added to the system roots). */
  caBundlePath?: string;
  /** Proxy for the origin (download sources only; in-cluster calls never use it). */
  proxy?: { http?: string; https?: string; noProxy?: string };
  /** Connect and response-header timeout. */
  connectTimeoutMs?: number;
  /** User-Agent header. */
  userAgent?: string;
}

const CREDENTIAL_HEADERS = ['authorization', 'cookie', 'proxy-authorization'];

/**
 * A got instance for download sources: no automatic retries or decompression (the download source handles both),
 * every connect checked against the SSRF policy, credentials sent only to the first origin, optional CA bundle
 * and proxy.
 */
export function createDownloadClient(o: DownloadClientOptions): Got {
  const ca = o.caBundlePath ? [...rootCertificates, readFileSync(o.caBundlePath, 'utf8')] : undefined;
  const useProxy = Boolean(o.proxy?.http || o.proxy?.https);
  const agent = useProxy
    ? {
        http: o.proxy?.http ? new HttpProxyAgent({ proxy: o.proxy.http, keepAlive: true }) : undefined,
        https: o.proxy?.https ? new HttpsProxyAgent({ proxy: o.proxy.https, keepAlive: true, ca }) : undefined,
      }
    : undefined;
  const lookup = guardedLookup(o.policy);
  return got.extend({
    retry: { limit: 0 },
    decompress: false,
    throwHttpErrors: false,
    followRedirect: true,
    maxRedirects: 10,
    timeout: { connect: o.connectTimeoutMs ?? 30_000, response: o.connectTimeoutMs ?? 30_000 },
    headers: { 'user-agent': o.userAgent ?? 'backing-image-data-source', ...lowerKeys(o.headers ?? {}) },
    dnsLookup: lookup as unknown as Options['dnsLookup'],
    https: ca ? { certificateAuthority: ca } : {},
    hooks: {
      beforeRequest: [
        async (options) => {
          const url = options.url as URL;
          if (url.protocol !== 'http:' && url.protocol !== 'https:') {
            throw new Error(`unsupported URL scheme ${url.protocol} (only http and https are allowed)`);
          }
          const host = url.hostname.replace(/^\[|\]$/g, '');
          const viaProxy = useProxy && !matchesNoProxy(host, o.proxy?.noProxy);
          options.agent = viaProxy && agent ? { http: agent.http, https: agent.https } : {};
          // IP literals never reach `lookup`; through a proxy the proxy resolves, so check here as well.
          if (isIP(host)) o.policy.check(host, host);
          else if (viaProxy) for (const a of await resolveAll(host)) o.policy.check(host, a);
        },
      ],
      beforeRedirect: [
        (options, response) => {
          const from = new URL(response.url);
          const to = options.url as URL;
          if (from.origin !== to.origin) {
            for (const h of CREDENTIAL_HEADERS) delete options.headers[h];
            for (const h of Object.keys(o.headers ?? {})) delete options.headers[h.toLowerCase()];
          }
          delete options.headers.referer;
        },
      ],
    },
  });
}

function lowerKeys(h: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(h).map(([k, v]) => [k.toLowerCase(), v]));
}

/** The download client a file source provider uses, from its options. */
export function createDownloadClientFor(options: FileSourcesOptions): Got {
  return createDownloadClient({
    policy: new SourceHostPolicy(options.allowSourceHosts ?? []),
    headers: options.downloadHeaders,
    caBundlePath: options.caBundlePath,
    proxy: options.proxy,
    connectTimeoutMs: options.connectTimeoutMs,
  });
}
