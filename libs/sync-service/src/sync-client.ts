import { authHeaders } from '@bis/internal-auth';
import { formatHostPort, parseHostPort } from '@bis/net-address';
import got from 'got';
import http from 'node:http';
import type { Readable } from 'node:stream';
import { SYNC_FILES_PATH, SyncFileAction, SyncFilesAction, syncFileDownloadPath, syncFilePath } from './sync-api.js';
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

/** A download under way: the sync service's answer headers and the body stream. */
export interface SyncDownload {
  headers: http.IncomingHttpHeaders;
  body: Readable;
}

/** Bodies pass as they are (a gzip download stays gzip); no retries: every call says itself what failed. */
const client = got.extend({ retry: { limit: 0 }, throwHttpErrors: false, followRedirect: false, decompress: false });

/** The one typed HTTP client of a sync service (`/v1/files`, see `sync-api.ts`), for peers and the control plane. */
export class SyncClient {
  readonly #base: string;
  readonly #short: number;
  readonly #auth: Record<string, string>;
  readonly #agent = new http.Agent({ keepAlive: true });

  constructor(
    readonly address: string,
    opts: SyncClientOptions = {},
  ) {
    const { host, port } = parseHostPort(address, { what: 'sync service address', defaultHost: '127.0.0.1', allowScheme: true });
    this.#base = `http://${formatHostPort(host, port)}`;
    this.#short = opts.shortTimeoutMs ?? 10_000;
    this.#auth = authHeaders(opts.token);
  }

  close(): void {
    this.#agent.destroy();
  }

  async list(): Promise<Record<string, FileInfo>> {
    return JSON.parse(await this.#text('GET', SYNC_FILES_PATH, {}, this.#short)) as Record<string, FileInfo>;
  }

  async get(filePath: string): Promise<FileInfo> {
    return JSON.parse(await this.#text('GET', syncFilePath(filePath), {}, this.#short)) as FileInfo;
  }

  async delete(filePath: string): Promise<void> {
    await this.#text('DELETE', syncFilePath(filePath), {}, this.#short);
  }

  async forget(filePath: string): Promise<void> {
    await this.#text('POST', syncFilePath(filePath), { action: SyncFileAction.Forget }, this.#short);
  }

  async sendToPeer(filePath: string, toAddress: string): Promise<void> {
    await this.#text('POST', syncFilePath(filePath), { action: SyncFileAction.SendToPeer, 'to-address': toAddress });
  }

  async fetch(p: { srcFilePath: string; dstFilePath: string; uuid: string; diskUUID: string; expectedChecksum?: string; size: number }): Promise<void> {
    await this.#text('POST', SYNC_FILES_PATH, {
      action: SyncFilesAction.Fetch,
      'src-file-path': p.srcFilePath,
      'dst-file-path': p.dstFilePath,
      uuid: p.uuid,
      'disk-uuid': p.diskUUID,
      'expected-checksum': p.expectedChecksum,
      size: p.size,
    });
  }

  async downloadFromURL(p: { filePath: string; uuid: string; url: string; diskUUID?: string; expectedChecksum?: string }): Promise<void> {
    await this.#text('POST', SYNC_FILES_PATH, {
      action: SyncFilesAction.DownloadFromURL,
      'file-path': p.filePath,
      uuid: p.uuid,
      url: p.url,
      'disk-uuid': p.diskUUID,
      'expected-checksum': p.expectedChecksum,
    });
  }

  async receiveFromPeer(p: { filePath: string; uuid: string; size: number; port: number; diskUUID?: string; expectedChecksum?: string; fileType?: string }): Promise<void> {
    await this.#text('POST', SYNC_FILES_PATH, {
      action: SyncFilesAction.ReceiveFromPeer,
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
      SYNC_FILES_PATH,
      {
        action: SyncFilesAction.RestoreFromBackupURL,
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
      SYNC_FILES_PATH,
      {
        action: SyncFilesAction.CloneFromBackingImage,
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
      SYNC_FILES_PATH,
      { action: SyncFilesAction.Upload, 'file-path': p.filePath, uuid: p.uuid, size: p.size, 'disk-uuid': p.diskUUID, 'expected-checksum': p.expectedChecksum },
      undefined,
      p.body,
    );
  }

  /**
   * Opens the download stream (raw with `raw`, else gzip, passed on compressed). Resolves once the answer's headers
   * are in; an answer other than 200 rejects with {@link SyncClientError}. `signal` aborts the transfer.
   */
  download(filePath: string, opts: { raw?: boolean; signal?: AbortSignal } = {}): Promise<SyncDownload> {
    const q = opts.raw ? '?forV2Creation=true' : '';
    const stream = client.stream(`${this.#base}${syncFileDownloadPath(filePath)}${q}`, {
      agent: { http: this.#agent },
      headers: this.#auth,
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    return new Promise((resolve, reject) => {
      // stays attached: an error after the answer came is the reader's (its pipeline sees it too)
      stream.on('error', reject);
      stream.once('response', (res: http.IncomingMessage) => {
        if (res.statusCode === 200) return resolve({ headers: res.headers, body: stream });
        const chunks: Buffer[] = [];
        stream.on('data', (c: Buffer) => chunks.push(c));
        stream.on('end', () => reject(new SyncClientError(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'))));
      });
    });
  }

  async #text(method: 'GET' | 'POST' | 'DELETE', path: string, params: Params, timeoutMs?: number, body?: string | Readable): Promise<string> {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') qs.set(k, String(v));
    const url = `${this.#base}${path}${qs.size > 0 ? `?${qs.toString()}` : ''}`;
    const headers: Record<string, string> = { ...this.#auth };
    if (typeof body === 'string') headers['content-type'] = 'application/json';
    else if (body) headers['content-type'] = 'application/octet-stream';
    const res = await client(url, {
      method,
      headers,
      agent: { http: this.#agent },
      responseType: 'text',
      ...(body !== undefined ? { body } : {}),
      ...(timeoutMs ? { timeout: { request: timeoutMs } } : {}),
    });
    if (res.statusCode !== 200) throw new SyncClientError(res.statusCode, res.body);
    return res.body;
  }
}
