import { Agent as HttpAgent } from 'node:http';
import { Agent as HttpsAgent } from 'node:https';
import { rootCertificates } from 'node:tls';
import {
  DeleteObjectCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  type DeleteObjectCommandOutput,
  type DeleteObjectsCommandOutput,
  type GetObjectCommandOutput,
  type HeadObjectCommandOutput,
  type ListObjectsV2CommandOutput,
  type PutObjectCommandOutput,
} from '@aws-sdk/client-s3';
import { HttpProxyAgent, HttpsProxyAgent } from 'hpagent';
import { BackupStoreError, throwIfAborted } from '../names.js';
import { proxyFor } from './proxy.js';
import type { S3TargetLocation } from '../url.js';
import type { BackupCredential, BackupStoreDriver } from './driver.js';

export interface S3DriverOptions {
  /** Attempts per request inside the SDK (first try included), before the driver's own retry window. Default 3. */
  maxAttempts?: number;
  /**
   * How long the driver keeps retrying a request that fails with a transient error (network errors, throttling,
   * HTTP 5xx), with exponential backoff from 250 ms to 10 s, before the operation fails. Default: the
   * `BACKUPSTORE_S3_RETRY_WINDOW_SECONDS` environment variable, else 120 s. 0 disables it.
   */
  retryWindowMs?: number;
  /** Socket pool size per driver. Default 32. */
  maxSockets?: number;
}

function httpStatus(err: unknown): number | undefined {
  return (err as { $metadata?: { httpStatusCode?: number } })?.$metadata?.httpStatusCode;
}

function isNotFound(err: unknown): boolean {
  const name = (err as { name?: string })?.name;
  return name === 'NotFound' || name === 'NoSuchKey' || httpStatus(err) === 404;
}

const TRANSIENT_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN', 'ECONNABORTED', 'UND_ERR_SOCKET']);
const TRANSIENT_NAMES = new Set(['TimeoutError', 'RequestTimeout', 'RequestTimeoutException', 'SlowDown', 'Throttling', 'ThrottlingException', 'TooManyRequestsException', 'InternalError', 'ServiceUnavailable']);

/** Network errors, throttling and HTTP 5xx: worth retrying while the retry window lasts. */
export function isTransientS3Error(err: unknown): boolean {
  const status = httpStatus(err);
  if (status !== undefined) return status >= 500 || status === 429;
  const e = err as { code?: string; name?: string; cause?: unknown; errno?: string };
  if ((e?.code && TRANSIENT_CODES.has(e.code)) || (e?.errno && TRANSIENT_CODES.has(e.errno))) return true;
  if (e?.name && TRANSIENT_NAMES.has(e.name)) return true;
  // The SDK wraps errors from another realm ("AWS SDK error wrapper for Error: connect ECONNREFUSED …") without a code.
  const message = (err as Error)?.message ?? '';
  if (/\b(ECONNREFUSED|ECONNRESET|EPIPE|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH|EAI_AGAIN|socket hang up)\b/.test(message)) return true;
  return e?.cause !== undefined && e.cause !== err ? isTransientS3Error(e.cause) : false;
}

/** The default retry window: `BACKUPSTORE_S3_RETRY_WINDOW_SECONDS` or 120 s. */
export function defaultS3RetryWindowMs(env: NodeJS.ProcessEnv = process.env): number {
  const v = Number(env['BACKUPSTORE_S3_RETRY_WINDOW_SECONDS']);
  return env['BACKUPSTORE_S3_RETRY_WINDOW_SECONDS'] !== undefined && Number.isFinite(v) && v >= 0 ? v * 1000 : 120_000;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason ?? new Error('aborted'));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** Node's codes for a server certificate that does not chain to a trusted CA (or does not name the host). */
const TLS_VERIFY_CODES = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'CERT_UNTRUSTED',
  'ERR_TLS_CERT_ALTNAME_INVALID',
]);

/** A TLS verification failure, possibly wrapped by the SDK (`cause`) or carried only in the message. */
export function tlsVerificationFailed(err: unknown, depth = 0): boolean {
  const e = err as { code?: string; cause?: unknown; message?: string } | undefined;
  if (!e || depth > 4) return false;
  if (e.code && TLS_VERIFY_CODES.has(e.code)) return true;
  if (/unable to verify the first certificate|self[- ]signed certificate|unable to get (local )?issuer certificate/i.test(e.message ?? '')) return true;
  return e.cause !== undefined && e.cause !== err ? tlsVerificationFailed(e.cause, depth + 1) : false;
}

function isAbort(err: unknown): boolean {
  return (err as { name?: string })?.name === 'AbortError';
}

/**
 * S3 driver. Configuration comes only from the per-call credential (Longhorn's keys): `AWS_ACCESS_KEY_ID`,
 * `AWS_SECRET_ACCESS_KEY`, optional `AWS_SESSION_TOKEN`, `AWS_ENDPOINTS` (one URL), `AWS_CERT` (PEM bundle added to
 * the default roots), `VIRTUAL_HOSTED_STYLE` (`true`/`false`; default: path style when an endpoint is set),
 * `HTTP_PROXY` / `HTTPS_PROXY` / `NO_PROXY` (Go's rules, see `proxy.ts`; requests are tunnelled with CONNECT).
 */
export class S3Driver implements BackupStoreDriver {
  readonly url: string;
  private readonly client: S3Client;
  private readonly bucket: string;
  private readonly prefix: string;
  private readonly agent: HttpAgent | HttpsAgent;
  /** The proxy in use (`scheme://host:port`, no credentials), or '' for direct connections. */
  readonly proxy: string;

  private readonly retryWindowMs: number;
  /** Whether the credential has an AWS_CERT (for the message of a TLS verification failure). */
  private readonly hasCert: boolean;

  constructor(location: S3TargetLocation, credential: BackupCredential, options: S3DriverOptions = {}) {
    this.retryWindowMs = options.retryWindowMs ?? defaultS3RetryWindowMs();
    this.bucket = location.bucket;
    this.prefix = location.prefix;
    this.url = `s3://${location.bucket}${location.region ? '@' + location.region : ''}/${location.prefix}`;
    const accessKeyId = credential['AWS_ACCESS_KEY_ID'] ?? '';
    const secretAccessKey = credential['AWS_SECRET_ACCESS_KEY'] ?? '';
    if ((accessKeyId === '') !== (secretAccessKey === '')) {
      throw new BackupStoreError('InvalidArgument', 'S3 credential needs both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither');
    }
    if (accessKeyId === '') {
      throw new BackupStoreError(
        'InvalidArgument',
        'S3 credential is missing AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (credentials are passed per call, not read from the process environment)',
      );
    }
    const endpoint = credential['AWS_ENDPOINTS']?.trim() ?? '';
    if (endpoint !== '') {
      try {
        new URL(endpoint);
      } catch {
        throw new BackupStoreError('InvalidArgument', `AWS_ENDPOINTS ${JSON.stringify(endpoint)} is not a URL`);
      }
    }
    const virtualHosted = credential['VIRTUAL_HOSTED_STYLE'];
    const forcePathStyle = virtualHosted === 'true' ? false : virtualHosted === 'false' ? true : endpoint !== '';
    const cert = credential['AWS_CERT']?.trim() ?? '';
    if (cert !== '' && !/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/.test(cert)) {
      throw new BackupStoreError('InvalidArgument', 'AWS_CERT does not contain a PEM certificate');
    }
    const maxSockets = options.maxSockets ?? 32;
    const useHttp = endpoint.startsWith('http://');
    const region = location.region !== '' ? location.region : (credential['AWS_REGION'] ?? credential['AWS_DEFAULT_REGION'] ?? 'us-east-1');
    // The one host this driver talks to, for HTTP_PROXY / HTTPS_PROXY / NO_PROXY.
    const host = endpoint !== ''
      ? new URL(endpoint)
      : new URL(forcePathStyle ? `https://s3.${region}.amazonaws.com` : `https://${location.bucket}.s3.${region}.amazonaws.com`);
    if (!forcePathStyle && endpoint !== '') host.hostname = `${location.bucket}.${host.hostname}`;
    const proxy = proxyFor(host, credential);
    this.proxy = proxy ? `${proxy.protocol}//${proxy.host}` : '';
    this.hasCert = cert !== '';
    const tls = cert !== '' ? { ca: [...rootCertificates, cert] } : {};
    this.agent = useHttp
      ? proxy
        ? new HttpProxyAgent({ keepAlive: true, maxSockets, proxy })
        : new HttpAgent({ keepAlive: true, maxSockets })
      : proxy
        ? new HttpsProxyAgent({ keepAlive: true, maxSockets, proxy, ...tls })
        : new HttpsAgent({ keepAlive: true, maxSockets, ...tls });
    this.client = new S3Client({
      region,
      ...(endpoint !== '' ? { endpoint } : {}),
      forcePathStyle,
      credentials: {
        accessKeyId,
        secretAccessKey,
        ...(credential['AWS_SESSION_TOKEN'] ? { sessionToken: credential['AWS_SESSION_TOKEN'] } : {}),
      },
      maxAttempts: options.maxAttempts ?? 3,
      retryMode: 'standard',
      // No aws-chunked uploads with CRC trailers: Longhorn computes checksums only when required, too.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
      requestHandler: useHttp ? { httpAgent: this.agent as HttpAgent } : { httpsAgent: this.agent as HttpsAgent },
    });
  }

  /**
   * Sends a command; a transient failure is retried with exponential backoff until the retry window, counted from
   * the first failure, has passed.
   */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- any S3 command; the caller names its output type
  private async send<T>(make: () => any, signal?: AbortSignal): Promise<T> {
    let firstFailure: number | undefined;
    let delay = 250;
    for (;;) {
      try {
        return (await this.client.send(make() as GetObjectCommand, { abortSignal: signal })) as unknown as T;
      } catch (err) {
        if (signal?.aborted || isAbort(err) || !isTransientS3Error(err)) throw err;
        const now = Date.now();
        firstFailure ??= now;
        if (now - firstFailure >= this.retryWindowMs) throw err;
        await sleep(Math.min(delay, Math.max(0, firstFailure + this.retryWindowMs - now)), signal);
        delay = Math.min(delay * 2, 10_000);
      }
    }
  }

  private key(p: string): string {
    return this.prefix === '' ? p : `${this.prefix}/${p}`;
  }

  private fail(op: string, p: string, err: unknown, signal?: AbortSignal): never {
    if (signal?.aborted || isAbort(err)) {
      throwIfAborted(signal);
    }
    if (err instanceof BackupStoreError) throw err;
    const status = httpStatus(err);
    const detail = (err as Error)?.message || (err as { name?: string })?.name || String(err);
    const hint = tlsVerificationFailed(err) ? `; the endpoint's TLS certificate is not trusted: ${this.hasCert ? 'AWS_CERT does not hold the CA that signed it' : 'put the PEM of its CA in the credential secret as AWS_CERT'}` : '';
    throw new BackupStoreError('Io', `s3 ${op} ${this.key(p)} in bucket ${this.bucket} failed${status ? ` (HTTP ${status})` : ''}: ${detail}${hint}`, {
      cause: err,
    });
  }

  async read(p: string, signal?: AbortSignal): Promise<Buffer> {
    throwIfAborted(signal);
    try {
      const out = await this.send<GetObjectCommandOutput>(() => new GetObjectCommand({ Bucket: this.bucket, Key: this.key(p) }), signal);
      if (!out.Body) throw new BackupStoreError('Io', `s3 get ${this.key(p)}: empty response body`);
      const bytes = await out.Body.transformToByteArray();
      return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    } catch (err) {
      if (isNotFound(err)) throw new BackupStoreError('NotFound', `cannot find ${p} in backupstore`, { cause: err });
      this.fail('get', p, err, signal);
    }
  }

  async readInto(p: string, target: Uint8Array, signal?: AbortSignal): Promise<number> {
    throwIfAborted(signal);
    try {
      const out = await this.send<GetObjectCommandOutput>(() => new GetObjectCommand({ Bucket: this.bucket, Key: this.key(p) }), signal);
      if (!out.Body) throw new BackupStoreError('Io', `s3 get ${this.key(p)}: empty response body`);
      if (out.ContentLength !== undefined && out.ContentLength > target.byteLength) {
        (out.Body as unknown as { destroy?: () => void }).destroy?.();
        throw new BackupStoreError('Corrupt', `${p} holds ${out.ContentLength} bytes, more than the ${target.byteLength} a stored block can have`);
      }
      let got = 0;
      for await (const chunk of out.Body as AsyncIterable<Uint8Array>) {
        if (got + chunk.byteLength > target.byteLength) {
          throw new BackupStoreError('Corrupt', `${p} holds more than the ${target.byteLength} bytes a stored block can have`);
        }
        target.set(chunk, got);
        got += chunk.byteLength;
      }
      return got;
    } catch (err) {
      if (isNotFound(err)) throw new BackupStoreError('NotFound', `cannot find ${p} in backupstore`, { cause: err });
      this.fail('get', p, err, signal);
    }
  }

  async write(p: string, data: Uint8Array | string | readonly Uint8Array[], signal?: AbortSignal): Promise<void> {
    throwIfAborted(signal);
    const body = typeof data === 'string' ? Buffer.from(data) : Array.isArray(data) ? Buffer.concat(data as readonly Uint8Array[]) : (data as Uint8Array);
    try {
      await this.send<PutObjectCommandOutput>(() => new PutObjectCommand({ Bucket: this.bucket, Key: this.key(p), Body: body, ContentLength: body.byteLength }), signal);
    } catch (err) {
      this.fail('put', p, err, signal);
    }
  }

  async exists(p: string, signal?: AbortSignal): Promise<boolean> {
    try {
      await this.send<HeadObjectCommandOutput>(() => new HeadObjectCommand({ Bucket: this.bucket, Key: this.key(p) }), signal);
      return true;
    } catch (err) {
      if (isNotFound(err)) return false;
      this.fail('head', p, err, signal);
    }
  }

  private async listKeys(prefix: string, delimiter: string | undefined, signal?: AbortSignal): Promise<ListObjectsV2CommandOutput[]> {
    const pages: ListObjectsV2CommandOutput[] = [];
    let token: string | undefined;
    do {
      const page = await this.send<ListObjectsV2CommandOutput>(() => new ListObjectsV2Command({ Bucket: this.bucket, Prefix: prefix, Delimiter: delimiter, ContinuationToken: token }), signal);
      pages.push(page);
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
    return pages;
  }

  async list(dir: string, signal?: AbortSignal): Promise<string[]> {
    const prefix = this.key(dir).replace(/\/+$/, '') + '/';
    try {
      const names = new Set<string>();
      for (const page of await this.listKeys(prefix, '/', signal)) {
        for (const o of page.Contents ?? []) if (o.Key && o.Key !== prefix) names.add(o.Key.slice(prefix.length));
        for (const cp of page.CommonPrefixes ?? []) if (cp.Prefix) names.add(cp.Prefix.slice(prefix.length).replace(/\/$/, ''));
      }
      return [...names].filter((n) => n !== '').sort();
    } catch (err) {
      this.fail('list', dir, err, signal);
    }
  }

  async modificationTime(p: string, signal?: AbortSignal): Promise<Date> {
    try {
      const out = await this.send<HeadObjectCommandOutput>(() => new HeadObjectCommand({ Bucket: this.bucket, Key: this.key(p) }), signal);
      if (!out.LastModified) throw new BackupStoreError('Io', `s3 head ${this.key(p)}: no LastModified`);
      return out.LastModified;
    } catch (err) {
      if (isNotFound(err)) throw new BackupStoreError('NotFound', `cannot find ${p} in backupstore`, { cause: err });
      this.fail('head', p, err, signal);
    }
  }

  /** Deletes the object `path` and every object under `path/`. */
  async remove(p: string, signal?: AbortSignal): Promise<void> {
    try {
      await this.send<DeleteObjectCommandOutput>(() => new DeleteObjectCommand({ Bucket: this.bucket, Key: this.key(p) }), signal);
      const keys: string[] = [];
      for (const page of await this.listKeys(this.key(p).replace(/\/+$/, '') + '/', undefined, signal)) {
        for (const o of page.Contents ?? []) if (o.Key) keys.push(o.Key);
      }
      for (let i = 0; i < keys.length; i += 1000) {
        const batch = keys.slice(i, i + 1000);
        const out = await this.send<DeleteObjectsCommandOutput>(() => new DeleteObjectsCommand({ Bucket: this.bucket, Delete: { Objects: batch.map((Key) => ({ Key })), Quiet: true } }), signal);
        if (out.Errors && out.Errors.length > 0) {
          const first = out.Errors[0];
          throw new BackupStoreError('Io', `s3 delete failed for ${out.Errors.length} objects, e.g. ${first?.Key}: ${first?.Message}`);
        }
      }
    } catch (err) {
      this.fail('delete', p, err, signal);
    }
  }

  async close(): Promise<void> {
    this.client.destroy();
    this.agent.destroy();
  }
}
