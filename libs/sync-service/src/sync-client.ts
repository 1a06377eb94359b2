import { authHeaders } from '@bis/internal-auth';
import http from 'node:http';
import type { Readable } from 'node:stream';
import { encodeFileId } from './routes.js';
import type { FileInfo } from './syncing-file.js';

/** An HTTP failure of the sync service, worded like Longhorn's Go client (clients match substrings in it). */
export class SyncClientError extends Error {
  override readonly name = 'SyncClientError';
  constructor(
    readonly statusCode: number,
    readonly body: string,
  ) {
    super(`resp.StatusCode(${statusCode}) != http.StatusOK(200), response body content: ${body}`);
  }
}

export interface SyncClientOptions {
  /** Timeout of Get/List/Delete/Forget (Longhorn: 10 s). */
  shortTimeoutMs?: number;
  /** Sent as `authorization: Bearer <token>` (see `@bis/internal-auth`). */
  token?: string;
}

type Params = Record<string, string | number | undefined>;

/** Typed HTTP client of a sync service (`/v1/files`), for peers and the control plane. */
export class SyncClient {
  readonly #host: string;
  readonly #port: number;
  readonly #short: number;
  readonly #auth: Record<string, string>;
  readonly #agent = new http.Agent({ keepAlive: true });

  constructor(
    readonly address: string,
    opts: SyncClientOptions = {},
  ) {
    const m = /^\[?([^\]]*?)\]?:(\d+)$/.exec(address.replace(/^https?:\/\//, ''));
    if (!m) throw new Error(`invalid sync service address "${address}": expected host:port`);
    this.#host = m[1] || '127.0.0.1';
    this.#port = Number(m[2]);
    this.#short = opts.shortTimeoutMs ?? 10_000;
    this.#auth = authHeaders(opts.token);
  }

  close(): void {
    this.#agent.destroy();
  }

  async list(): Promise<Record<string, FileInfo>> {
    return JSON.parse(await this.#text('GET', '/v1/files', {}, this.#short)) as Record<string, FileInfo>;
  }

  async get(filePath: string): Promise<FileInfo> {
    return JSON.parse(await this.#text('GET', `/v1/files/${encodeFileId(filePath)}`, {}, this.#short)) as FileInfo;
  }

  async delete(filePath: string): Promise<void> {
    await this.#text('DELETE', `/v1/files/${encodeFileId(filePath)}`, {}, this.#short);
  }

  async forget(filePath: string): Promise<void> {
    await this.#text('POST', `/v1/files/${encodeFileId(filePath)}`, { action: 'forget' }, this.#short);
  }

  async sendToPeer(filePath: string, toAddress: string): Promise<void> {
    await this.#text('POST', `/v1/files/${encodeFileId(filePath)}`, { action: 'sendToPeer', 'to-address': toAddress });
  }

  async fetch(p: { srcFilePath: string; dstFilePath: string; uuid: string; diskUUID: string; expectedChecksum?: string; size: number }): Promise<void> {
    await this.#text('POST', '/v1/files', {
      action: 'fetch',
      'src-file-path': p.srcFilePath,
      'dst-file-path': p.dstFilePath,
      uuid: p.uuid,
      'disk-uuid': p.diskUUID,
      'expected-checksum': p.expectedChecksum,
      size: p.size,
    });
  }

  async downloadFromURL(p: { filePath: string; uuid: string; url: string; diskUUID?: string; expectedChecksum?: string }): Promise<void> {
    await this.#text('POST', '/v1/files', {
      action: 'downloadFromURL',
      'file-path': p.filePath,
      uuid: p.uuid,
      url: p.url,
      'disk-uuid': p.diskUUID,
      'expected-checksum': p.expectedChecksum,
    });
  }

  async receiveFromPeer(p: { filePath: string; uuid: string; size: number; port: number; diskUUID?: string; expectedChecksum?: string; fileType?: string }): Promise<void> {
    await this.#text('POST', '/v1/files', {
      action: 'receiveFromPeer',
      'file-path': p.filePath,
      uuid: p.uuid,
      'disk-uuid': p.diskUUID,
      'expected-checksum': p.expectedChecksum,
      'file-type': p.fileType,
      size: p.size,
      port: p.port,
    });
  }

  async restoreFromBackupURL(p: { filePath: string; uuid: string; backupUrl: string; concurrentLimit: number; credential?: Record<string, string>; diskUUID?: string; expectedChecksum?: string }): Promise<void> {
    await this.#text(
      'POST',
      '/v1/files',
      {
        action: 'restoreFromBackupURL',
        'file-path': p.filePath,
        uuid: p.uuid,
        'backup-url': p.backupUrl,
        'concurrent-limit': p.concurrentLimit,
        'disk-uuid': p.diskUUID,
        'expected-checksum': p.expectedChecksum,
      },
      undefined,
      JSON.stringify(p.credential ?? {}),
    );
  }

  async cloneFromBackingImage(p: { filePath: string; uuid: string; backingImage: string; backingImageUUID: string; encryption: string; credential?: Record<string, string>; diskUUID?: string; expectedChecksum?: string }): Promise<void> {
    await this.#text(
      'POST',
      '/v1/files',
      {
        action: 'cloneFromBackingImage',
        'file-path': p.filePath,
        uuid: p.uuid,
        'backing-image': p.backingImage,
        'backing-image-uuid': p.backingImageUUID,
        encryption: p.encryption,
        'disk-uuid': p.diskUUID,
        'expected-checksum': p.expectedChecksum,
      },
      undefined,
      JSON.stringify(p.credential ?? {}),
    );
  }

  /** Uploads a raw body (`application/octet-stream`) of exactly `size` bytes; resolves when the server finished. */
  async upload(p: { filePath: string; uuid: string; size: number; body: Readable; diskUUID?: string; expectedChecksum?: string }): Promise<void> {
    await this.#text(
      'POST',
      '/v1/files',
      { action: 'upload', 'file-path': p.filePath, uuid: p.uuid, size: p.size, 'disk-uuid': p.diskUUID, 'expected-checksum': p.expectedChecksum },
      undefined,
      p.body,
    );
  }

  /** Opens the download stream (raw with `forV2Creation`, else gzip). */
  download(filePath: string, opts: { raw?: boolean } = {}): Promise<http.IncomingMessage> {
    const q = opts.raw ? '?forV2Creation=true' : '';
    return new Promise((resolve, reject) => {
      const req = http.request(
        { host: this.#host, port: this.#port, method: 'GET', path: `/v1/files/${encodeFileId(filePath)}/download${q}`, agent: this.#agent, headers: this.#auth },
        (res) => {
          if (res.statusCode === 200) return resolve(res);
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => reject(new SyncClientError(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'))));
        },
      );
      req.on('error', reject);
      req.end();
    });
  }

  #text(method: string, path: string, params: Params, timeoutMs?: number, body?: string | Readable): Promise<string> {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') qs.set(k, String(v));
    const fullPath = qs.size > 0 ? `${path}?${qs.toString()}` : path;
    return new Promise((resolve, reject) => {
      const headers: http.OutgoingHttpHeaders = { ...this.#auth };
      if (typeof body === 'string') {
        headers['Content-Type'] = 'application/json';
        headers['Content-Length'] = Buffer.byteLength(body);
      } else if (body) headers['Content-Type'] = 'application/octet-stream';
      const req = http.request(
        {
          host: this.#host,
          port: this.#port,
          method,
          path: fullPath,
          agent: this.#agent,
          headers,
          signal: timeoutMs ? AbortSignal.timeout(timeoutMs) : undefined,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            if (res.statusCode === 200) resolve(text);
            else reject(new SyncClientError(res.statusCode ?? 0, text));
          });
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      if (body && typeof body !== 'string') body.pipe(req);
      else req.end(body);
    });
  }
}
