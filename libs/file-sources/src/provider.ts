import type { CloneRequest, DownloadRequest, FileSourceProvider, ProgressSink, RestoreRequest, SourceResult, UploadRequest } from './contract.js';
import { DEFAULT_PARALLEL, DEFAULT_RETRY, downloadToFile, type ParallelPolicy, type RetryPolicy } from './download.js';
import { createDownloadClient } from './http-client.js';
import { SourceHostPolicy } from './ip-policy.js';
import { luksCloneToFile } from './luks.js';
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
  /** The backup engine's restore; without it `restore` fails with a clear error. */
  restoreBackup?: RestoreBackupFn;
  /** encrypt/decrypt clones; default {@link luksCloneToFile} (cryptsetup + loop devices). */
  encryptedClone?: (req: CloneRequest) => Promise<SourceResult>;
}

/** Builds the {@link FileSourceProvider} a sync service launches sources through. */
export function createFileSources(options: FileSourcesOptions = {}): FileSourceProvider {
  const stallTimeoutMs = options.stallTimeoutMs ?? DEFAULT_STALL_TIMEOUT_MS;
  const client = createDownloadClient({
    policy: new SourceHostPolicy(options.allowSourceHosts ?? []),
    headers: options.downloadHeaders,
    caBundlePath: options.caBundlePath,
    proxy: options.proxy,
    connectTimeoutMs: options.connectTimeoutMs,
  });
  const download = {
    client,
    stallTimeoutMs,
    retry: { ...DEFAULT_RETRY, ...options.retry },
    parallel: { ...DEFAULT_PARALLEL, ...options.parallel },
  };
  // The final size can differ from the announced one (decompression, zero-padding): report it at the end.
  const settle = async (sink: ProgressSink, work: Promise<SourceResult>): Promise<SourceResult> => {
    const r = await work;
    sink.setSize(r.size);
    sink.updateProgress(r.size);
    return r;
  };
  return {
    download: (req: DownloadRequest) => settle(req.sink, downloadToFile(req, download)),
    upload: (req: UploadRequest) => settle(req.sink, uploadToFile(req, { stallTimeoutMs })),
    clone: (req: CloneRequest) => settle(req.sink, cloneToFile(req, { stallTimeoutMs, encryption: options.encryptedClone ?? luksCloneToFile })),
    restore: (req: RestoreRequest) => settle(req.sink, restoreToFile(req, options.restoreBackup)),
  };
}
