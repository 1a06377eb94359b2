import { readFileSync } from 'node:fs';
import type { Got } from 'got';
import type { CloneRequest, DownloadRequest, FileSourceProvider, ProgressSink, RestoreRequest, SourceResult, UploadRequest } from './contract.js';
import { DEFAULT_PARALLEL, DEFAULT_RETRY, downloadToFile, type ParallelPolicy, type RetryPolicy } from './download.js';
import { SourceError } from './errors.js';
import type { DirectGetOptions } from './direct-get.js';
import { SourceHostPolicy } from './ip-policy.js';
import type { SizeLimitPolicy } from './size-limit.js';
import { cloneToFile, restoreToFile, uploadToFile, type RestoreBackupFn } from './sources.js';

/** Longhorn's copy stall timeout (`types.HTTPTimeout`, 30 s since longhorn#11309). */
export const DEFAULT_STALL_TIMEOUT_MS = 30_000;

export interface FileSourcesOptions {
  /** Hosts, IPs or CIDRs that download sources may reach even if loopback/private/link-local/metadata. */
  allowSourceHosts?: readonly string[];
  /** Headers added to download requests for the origin (e.g. from `--credential Authorization=...`). */
  downloadHeaders?: Record<string, string>;
  /** PEM bundle of extra CAs for HTTPS download sources. */
  caBundlePath?: string;
  /** Proxy for download origins only. */
  proxy?: { http?: string; https?: string; noProxy?: string };
  /** Cancel a transfer when no byte was processed for this long (default 30 s). */
  stallTimeoutMs?: number;
  retry?: Partial<RetryPolicy>;
  parallel?: Partial<ParallelPolicy>;
  connectTimeoutMs?: number;
  /**
   * Read plain-HTTP download bodies straight from the socket into the image's slabs (default true; see
   * `direct-get.ts`); `false` sends every request through the HTTP client.
   */
  directHttp?: boolean;
  /**
   * Bounds every image a source writes (downloads after decompression, uploads by their declared size, clones,
   * restores by the backup's declared size):
   * the destination disk's free space less `reservedBytes`, at most `maxImageSize` (default 2 TiB).
   */
  sizeLimit?: SizeLimitPolicy;
  /** The backup engine's restore; without it `restore` fails with a clear error. */
  restoreBackup?: RestoreBackupFn;
  /** encrypt/decrypt clones; default `luksCloneToFile` (cryptsetup + loop devices), loaded when first used. */
  encryptedClone?: (req: CloneRequest) => Promise<SourceResult>;
}

/** What the direct HTTP path sends and checks: the same policy, headers, timeout and proxy rules as the HTTP client. */
function directGetOptions(options: FileSourcesOptions): DirectGetOptions {
  const configured: Record<string, string> = {};
  for (const [k, v] of Object.entries(options.downloadHeaders ?? {})) configured[k.toLowerCase()] = v;
  return {
    policy: new SourceHostPolicy(options.allowSourceHosts ?? []),
    headers: { 'user-agent': 'backing-image-data-source', ...configured },
    configuredHeaders: configured,
    connectTimeoutMs: options.connectTimeoutMs ?? 30_000,
    ...(options.proxy ? { proxy: { http: options.proxy.http, noProxy: options.proxy.noProxy } } : {}),
  };
}

/** The kinds of source a {@link FileSourceProvider} launches. */
export type FileSourceKind = 'download' | 'upload' | 'clone' | 'restore';

/**
 * The provider around an HTTP client for downloads (`undefined`: this provider does no downloads and its `download`
 * fails naming why). The HTTP client (got) is the one heavy part, so it is built by the caller.
 */
export function assembleFileSources(options: FileSourcesOptions, client: (() => Promise<Got>) | undefined): FileSourceProvider {
  const stallTimeoutMs = options.stallTimeoutMs ?? DEFAULT_STALL_TIMEOUT_MS;
  const download = client && {
    client,
    stallTimeoutMs,
    retry: { ...DEFAULT_RETRY, ...options.retry },
    parallel: { ...DEFAULT_PARALLEL, ...options.parallel },
    sizeLimit: options.sizeLimit,
    ...(options.directHttp === false ? {} : { direct: directGetOptions(options) }),
  };
  const encryption = options.encryptedClone ?? (async (req: CloneRequest) => (await import('./luks.js')).luksCloneToFile(req));
  // The final size can differ from the announced one (decompression, zero-padding): report it at the end.
  const settle = async (sink: ProgressSink, work: Promise<SourceResult>): Promise<SourceResult> => {
    const r = await work;
    sink.setSize(r.size);
    sink.updateProgress(r.size);
    return r;
  };
  return {
    download: (req: DownloadRequest) =>
      download
        ? settle(req.sink, downloadToFile(req, download))
        : Promise.reject(new SourceError('download sources are not available: this file source provider was loaded without the download client')),
    upload: (req: UploadRequest) => settle(req.sink, uploadToFile(req, { stallTimeoutMs, sizeLimit: options.sizeLimit })),
    clone: (req: CloneRequest) => settle(req.sink, cloneToFile(req, { stallTimeoutMs, encryption, sizeLimit: options.sizeLimit })),
    restore: (req: RestoreRequest) => settle(req.sink, restoreToFile(req, options.restoreBackup, { sizeLimit: options.sizeLimit })),
  };
}

/**
 * Like `createFileSources`, but a process that never downloads does not pay for loading the download client (got,
 * the proxy agents): without `download` in `kinds` there is none, and with it got is loaded at the first request
 * the direct path does not serve (`https:`, a proxy, a redirect there, a chunked body, parallel ranges). A bad
 * `caBundlePath` or proxy URL still fails now, as with `createFileSources`.
 */
export async function loadFileSources(options: FileSourcesOptions, kinds: readonly FileSourceKind[]): Promise<FileSourceProvider> {
  if (!kinds.includes('download')) return assembleFileSources(options, undefined);
  checkDownloadClientOptions(options);
  let client: Promise<Got> | undefined;
  return assembleFileSources(options, () => (client ??= import('./http-client.js').then((m) => m.createDownloadClientFor(options))));
}

/** What building the download client would refuse: an unreadable CA bundle, a proxy address that is not a URL. */
function checkDownloadClientOptions(options: FileSourcesOptions): void {
  if (options.caBundlePath) readFileSync(options.caBundlePath, 'utf8');
  for (const [scheme, proxy] of Object.entries({ http: options.proxy?.http, https: options.proxy?.https })) {
    if (proxy === undefined || proxy === '') continue;
    try {
      new URL(proxy);
    } catch {
      throw new TypeError(`invalid ${scheme} proxy URL ${JSON.stringify(proxy)}`);
    }
  }
}
