import { ApiClientError, errorFromResponse, transportError } from './errors.js';
import type {
  BackingImage,
  BisEvent,
  BackupBackingImage,
  BackupTarget,
  BackupTargetUpdate,
  Collection,
  CreateBackingImageRequest,
  Node,
  RestoreBackupRequest,
  SecretInfo,
  Setting,
} from './types.js';

export interface ClientOptions {
  /** Base URL of the REST API, e.g. `http://127.0.0.1:9500` (a trailing `/` or `/v1` is accepted). Empty = same origin. */
  server: string;
  /** fetch implementation (default: the global one). */
  fetch?: typeof fetch;
  /** WebSocket constructor for `watch` (default: the global one, present in browsers and Node ≥ 22). */
  WebSocket?: WebSocketConstructor;
  /** Extra headers on every request (e.g. Authorization for a proxy in front of the API). */
  headers?: Record<string, string>;
  /**
   * Bearer token of the API (`controller-manager --auth-token-file`): sent as `authorization: Bearer <token>`, and on
   * websocket streams (whose headers a browser cannot set) as the `access_token` query parameter.
   */
  token?: string;
}

/** The subset of the WHATWG WebSocket the client uses. */
export interface WebSocketLike {
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  close(): void;
}
export type WebSocketConstructor = new (url: string) => WebSocketLike;

export interface RequestOptions {
  signal?: AbortSignal;
}

/** Resources that have a websocket list stream (`/v1/ws/<period>/<resource>`). */
export type WatchedResource = 'backingimages' | 'backupbackingimages';

export interface WatchOptions {
  signal: AbortSignal;
  /** Go duration limiting how often the server sends the list (default `1s`). */
  period?: string;
  /** Connection state changes (for a "live" indicator). */
  onConnection?(connected: boolean, error?: string): void;
  /** Delay before reconnecting after a drop (default 1 s, doubling up to 15 s). */
  reconnectDelayMs?: number;
}

export interface UploadProgress {
  /** Bytes the server has accepted. */
  offset: number;
  size: number;
  /** Times the upload resumed after a failed part. */
  resumes: number;
}

export interface UploadOptions {
  signal?: AbortSignal;
  onProgress?(p: UploadProgress): void;
  /** Bytes per request (default 8 MiB). */
  partSize?: number;
  /** Consecutive failed attempts without progress before giving up (default 8). */
  maxRetries?: number;
  /** First retry delay, doubling up to 10 s (default 500 ms). */
  retryDelayMs?: number;
  /** How long to wait for the image's upload server to come up (default 120 s). */
  readyTimeoutMs?: number;
  /**
   * Asked while the upload server is not up and after a failed part (at most once a second): an error it resolves
   * with ends the upload with that error, e.g. when the server already failed the upload and its upload server will
   * not come back.
   */
  failure?(): Promise<Error | undefined>;
}

function trimBase(server: string): string {
  return server.replace(/\/+$/, '').replace(/\/v1$/, '');
}

const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });

/** The upload server of the image is not up yet (Longhorn's messages for a data source that is not `pending`). */
function uploadNotReady(err: unknown): boolean {
  return err instanceof ApiClientError && err.kind === 'server' && /has not been initiated|not ready for uploading|cannot find pod for backing image data source/.test(err.message);
}

/**
 * A typed client of the backing-image REST API. Works in browsers and in Node (global fetch). Every method
 * rejects with an `ApiClientError` carrying the server's message.
 */
export class BisClient {
  readonly base: string;
  private readonly fetchImpl: typeof fetch;
  private readonly headers: Record<string, string>;
  private readonly WS?: WebSocketConstructor;
  private token: string | undefined;

  constructor(opts: ClientOptions) {
    this.token = opts.token || undefined;
    this.base = trimBase(opts.server);
    this.fetchImpl = opts.fetch ?? ((input, init) => fetch(input, init));
    this.headers = opts.headers ?? {};
    this.WS = opts.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
  }

  url(path: string): string {
    return `${this.base}${path}`;
  }

  /** Replaces the bearer token (e.g. after the UI asked for it); `undefined` sends none. */
  setToken(token: string | undefined): void {
    this.token = token || undefined;
  }

  /** Whether a bearer token is set. */
  get hasToken(): boolean {
    return this.token !== undefined;
  }

  /** The headers every request carries (the extra headers and the bearer token), for callers doing their own I/O. */
  requestHeaders(): Record<string, string> {
    return this.token ? { ...this.headers, authorization: `Bearer ${this.token}` } : { ...this.headers };
  }

  /** Sends a request and returns the raw response when it is 2xx (throws an ApiClientError otherwise). */
  async raw(method: string, path: string, init: { body?: RequestInit['body']; headers?: Record<string, string>; signal?: AbortSignal } = {}): Promise<Response> {
    const label = `${method} ${path.split('?')[0]}`;
    let res: Response;
    try {
      res = await this.fetchImpl(this.url(path), {
        method,
        body: init.body,
        headers: { ...this.requestHeaders(), ...init.headers },
        signal: init.signal,
        ...(init.body !== undefined && typeof init.body === 'object' && 'getReader' in (init.body as object) ? { duplex: 'half' } : {}),
      } as RequestInit);
    } catch (err) {
      throw transportError(err, label, init.signal);
    }
    if (!res.ok) throw await errorFromResponse(res, label);
    return res;
  }

  /** JSON request; resolves `undefined` for an empty 200 (DELETE, actions without output). */
  async json<T>(method: string, path: string, body?: unknown, opts: RequestOptions = {}): Promise<T> {
    const res = await this.raw(method, path, {
      body: body === undefined ? undefined : JSON.stringify(body),
      headers: { accept: 'application/json', ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      signal: opts.signal,
    });
    const text = await res.text();
    if (!text) return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new ApiClientError('server', res.status, `${method} ${path}`, `${method} ${path}: the server answered with invalid JSON`);
    }
  }

  private async list<T>(segment: string, opts?: RequestOptions): Promise<T[]> {
    const c = await this.json<Collection<T>>('GET', `/v1/${segment}`, undefined, opts);
    return c?.data ?? [];
  }

  // ---- backing images -----------------------------------------------------------------------------------------

  listBackingImages(opts?: RequestOptions): Promise<BackingImage[]> {
    return this.list<BackingImage>('backingimages', opts);
  }
  /** Events about an object (`GET /v1/events?kind=&name=`), oldest first. */
  listEvents(q: { kind?: string; name?: string; reason?: string } = {}, opts?: RequestOptions): Promise<BisEvent[]> {
    const qs = new URLSearchParams(Object.entries(q).filter((e): e is [string, string] => !!e[1])).toString();
    return this.list<BisEvent>(`events${qs ? `?${qs}` : ''}`, opts);
  }
  getBackingImage(name: string, opts?: RequestOptions): Promise<BackingImage> {
    return this.json<BackingImage>('GET', `/v1/backingimages/${encodeURIComponent(name)}`, undefined, opts);
  }
  createBackingImage(req: CreateBackingImageRequest, opts?: RequestOptions): Promise<BackingImage> {
    return this.json<BackingImage>('POST', '/v1/backingimages', req, opts);
  }
  async deleteBackingImage(name: string, opts?: RequestOptions): Promise<void> {
    await this.json<void>('DELETE', `/v1/backingimages/${encodeURIComponent(name)}`, undefined, opts);
  }
  /** Removes the copies on the given disks (UUIDs); the server refuses when too few ready copies would remain. */
  cleanupBackingImage(name: string, disks: string[], opts?: RequestOptions): Promise<BackingImage> {
    return this.json<BackingImage>('POST', `/v1/backingimages/${encodeURIComponent(name)}?action=backingImageCleanup`, { disks }, opts);
  }
  updateMinNumberOfCopies(name: string, minNumberOfCopies: number, opts?: RequestOptions): Promise<BackingImage> {
    return this.json<BackingImage>('POST', `/v1/backingimages/${encodeURIComponent(name)}?action=updateMinNumberOfCopies`, { minNumberOfCopies }, opts);
  }
  /** Starts a backup of the image to a backup target (the default one when omitted). */
  async backupBackingImage(name: string, backupTargetName?: string, opts?: RequestOptions): Promise<void> {
    await this.json<void>('POST', `/v1/backingimages/${encodeURIComponent(name)}?action=backupBackingImageCreate`, backupTargetName ? { backupTargetName } : {}, opts);
  }
  /** The URL that streams the image file from a ready copy (gzip-compressed, named `<name>.gz`, as Longhorn does). */
  downloadUrl(name: string): string {
    return this.url(`/v1/backingimages/${encodeURIComponent(name)}/download`);
  }
  /** Starts the download; the caller streams `response.body` (gzip data when Content-Disposition names `<name>.gz`). */
  download(name: string, opts?: RequestOptions): Promise<Response> {
    return this.raw('GET', `/v1/backingimages/${encodeURIComponent(name)}/download`, { signal: opts?.signal });
  }

  /** `{size, offset}`: bytes of an upload the image's data source has accepted so far. */
  async uploadOffset(name: string, opts?: RequestOptions): Promise<{ size: number; offset: number }> {
    return this.json<{ size: number; offset: number }>('POST', `/v1/backingimages/${encodeURIComponent(name)}?action=uploadOffset`, undefined, opts);
  }

  /**
   * Uploads a file (a Blob: a browser File, or `fs.openAsBlob(path)` in Node, both read lazily) into an image of
   * source type `upload`. Uses the data source's resumable protocol: parts appended at the offset the server
   * reports; after a dropped connection or a failed part it asks for the offset again and continues. Waits for
   * the image's upload server to come up first. When the server has no resumable upload (405), it falls back to
   * Longhorn's single multipart request.
   */
  async uploadBackingImage(name: string, file: Blob, opts: UploadOptions = {}): Promise<void> {
    const size = file.size;
    const partSize = opts.partSize ?? 8 << 20;
    const maxRetries = opts.maxRetries ?? 8;
    const signal = opts.signal;
    const readyDeadline = Date.now() + (opts.readyTimeoutMs ?? 120_000);
    const q = encodeURIComponent(name);
    let resumes = 0;
    let failures = 0;
    let delay = opts.retryDelayMs ?? 500;
    let offset: number | undefined;
    let checkedAt = 0;
    // the server's own verdict, when it has one, ends the wait for an upload server that will not come back
    const checkFailure = async (): Promise<void> => {
      if (!opts.failure || Date.now() - checkedAt < 1000) return;
      checkedAt = Date.now();
      const failed = await opts.failure();
      if (failed) throw failed;
    };

    const backoff = async (err: unknown): Promise<void> => {
      failures++;
      if (failures > maxRetries) throw err;
      await checkFailure();
      await sleep(delay, signal);
      delay = Math.min(delay * 2, 10_000);
    };

    for (;;) {
      signal?.throwIfAborted();
      if (offset === undefined) {
        try {
          const r = await this.uploadOffset(name, { signal });
          offset = r.offset;
          if (r.size && r.size !== size) throw new ApiClientError('rejected', 400, 'upload', `the upload of ${name} was started with ${r.size} bytes, this file has ${size}`);
        } catch (err) {
          if (err instanceof ApiClientError && err.status === 405) return this.uploadWhole(name, file, opts);
          if (uploadNotReady(err) && Date.now() < readyDeadline) {
            await checkFailure();
            await sleep(500, signal);
            continue;
          }
          if (err instanceof ApiClientError && (err.kind === 'network' || (err.kind === 'server' && !uploadNotReady(err)))) {
            await backoff(err);
            continue;
          }
          throw err;
        }
        opts.onProgress?.({ offset, size, resumes });
        if (offset >= size && size > 0) return;
      }
      const end = Math.min(size, offset + partSize);
      try {
        const res = await this.raw('POST', `/v1/backingimages/${q}?action=uploadPart&size=${size}&offset=${offset}`, {
          body: file.slice(offset, end),
          headers: { 'content-type': 'application/octet-stream' },
          signal,
        });
        // A body that is not JSON carries no offset: the next offset is then the end of what was sent.
        const r = (await res.json().catch(() => undefined)) as { offset?: number } | undefined;
        offset = typeof r?.offset === 'number' ? r.offset : end;
        failures = 0;
        delay = opts.retryDelayMs ?? 500;
        opts.onProgress?.({ offset, size, resumes });
        if (offset >= size) return;
      } catch (err) {
        if (!(err instanceof ApiClientError) || err.kind === 'aborted' || err.kind === 'not-found' || (err.kind === 'rejected' && err.status !== 409)) throw err;
        if (err.status === 405 && offset === 0) return this.uploadWhole(name, file, opts);
        await backoff(err);
        resumes++;
        offset = undefined; // ask the server where to continue
      }
    }
  }

  /** Longhorn's single-request upload: `POST ?action=upload&size=N` with one multipart part `chunk`. */
  private async uploadWhole(name: string, file: Blob, opts: UploadOptions): Promise<void> {
    const form = new FormData();
    form.append('chunk', file, name);
    opts.onProgress?.({ offset: 0, size: file.size, resumes: 0 });
    await this.raw('POST', `/v1/backingimages/${encodeURIComponent(name)}?action=upload&size=${file.size}`, { body: form, signal: opts.signal });
    opts.onProgress?.({ offset: file.size, size: file.size, resumes: 0 });
  }

  // ---- backups ------------------------------------------------------------------------------------------------

  listBackups(opts?: RequestOptions): Promise<BackupBackingImage[]> {
    return this.list<BackupBackingImage>('backupbackingimages', opts);
  }
  getBackup(name: string, opts?: RequestOptions): Promise<BackupBackingImage> {
    return this.json<BackupBackingImage>('GET', `/v1/backupbackingimages/${encodeURIComponent(name)}`, undefined, opts);
  }
  async deleteBackup(name: string, opts?: RequestOptions): Promise<void> {
    await this.json<void>('DELETE', `/v1/backupbackingimages/${encodeURIComponent(name)}`, undefined, opts);
  }
  /** Creates the backing image the backup was taken from (it must not exist). */
  async restoreBackup(name: string, input: RestoreBackupRequest = {}, opts?: RequestOptions): Promise<void> {
    await this.json<void>(
      'POST',
      `/v1/backupbackingimages/${encodeURIComponent(name)}?action=backupBackingImageRestore`,
      { secret: input.secret ?? '', secretNamespace: input.secretNamespace ?? '', dataEngine: input.dataEngine ?? 'v1' },
      opts,
    );
  }
  listBackupTargets(opts?: RequestOptions): Promise<BackupTarget[]> {
    return this.list<BackupTarget>('backuptargets', opts);
  }
  getBackupTarget(name: string, opts?: RequestOptions): Promise<BackupTarget> {
    return this.json<BackupTarget>('GET', `/v1/backuptargets/${encodeURIComponent(name)}`, undefined, opts);
  }
  /** `PUT` of the target's URL, credential secret and poll interval (fields left out are kept). */
  updateBackupTarget(name: string, fields: BackupTargetUpdate, opts?: RequestOptions): Promise<BackupTarget> {
    return this.json<BackupTarget>('PUT', `/v1/backuptargets/${encodeURIComponent(name)}`, fields, opts);
  }

  // ---- credential secrets (standalone) ------------------------------------------------------------------------

  /** Secrets with the names of their keys; the API never returns a value. */
  listSecrets(opts?: RequestOptions): Promise<SecretInfo[]> {
    return this.list<SecretInfo>('secrets', opts);
  }
  /** Creates or replaces a secret's data; the answer names its keys only. */
  putSecret(name: string, data: Record<string, string>, opts?: RequestOptions): Promise<SecretInfo> {
    return this.json<SecretInfo>('PUT', `/v1/secrets/${encodeURIComponent(name)}`, { data }, opts);
  }
  async deleteSecret(name: string, opts?: RequestOptions): Promise<void> {
    await this.json<void>('DELETE', `/v1/secrets/${encodeURIComponent(name)}`, undefined, opts);
  }

  // ---- nodes and settings -------------------------------------------------------------------------------------

  listNodes(opts?: RequestOptions): Promise<Node[]> {
    return this.list<Node>('nodes', opts);
  }
  getNode(name: string, opts?: RequestOptions): Promise<Node> {
    return this.json<Node>('GET', `/v1/nodes/${encodeURIComponent(name)}`, undefined, opts);
  }
  /** `PUT` of the node's updatable fields (Longhorn's client.update(node, …)). */
  updateNode(name: string, fields: { allowScheduling?: boolean; evictionRequested?: boolean; tags?: string[] }, opts?: RequestOptions): Promise<Node> {
    return this.json<Node>('PUT', `/v1/nodes/${encodeURIComponent(name)}`, fields, opts);
  }
  /** Requests eviction of every backing-image copy from the node (and stops scheduling new ones there). */
  evictNode(name: string, opts?: RequestOptions): Promise<Node> {
    return this.updateNode(name, { allowScheduling: false, evictionRequested: true }, opts);
  }
  getSetting(name: string, opts?: RequestOptions): Promise<Setting> {
    return this.json<Setting>('GET', `/v1/settings/${encodeURIComponent(name)}`, undefined, opts);
  }
  listSettings(opts?: RequestOptions): Promise<Setting[]> {
    return this.list<Setting>('settings', opts);
  }

  // ---- live updates -------------------------------------------------------------------------------------------

  /** The websocket URL of a list stream. */
  watchUrl(resource: WatchedResource, period = '1s'): string {
    const loc = (globalThis as { location?: { protocol: string; host: string } }).location;
    const origin = this.base || (loc ? `${loc.protocol}//${loc.host}` : '');
    const q = this.token ? `?access_token=${encodeURIComponent(this.token)}` : '';
    return `${origin.replace(/^http/, 'ws')}/v1/ws/${period}/${resource}${q}`;
  }

  /**
   * Calls `onList` with the full list each time it changes, over the websocket stream, reconnecting after drops,
   * until `signal` aborts.
   */
  watch<T>(resource: WatchedResource, onList: (items: T[]) => void, opts: WatchOptions): void {
    const WS = this.WS;
    if (!WS) throw new Error('no WebSocket implementation is available (pass ClientOptions.WebSocket)');
    const first = opts.reconnectDelayMs ?? 1000;
    let delay = first;
    let socket: WebSocketLike | undefined;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const connect = (): void => {
      if (opts.signal.aborted) return;
      const ws = new WS(this.watchUrl(resource, opts.period));
      socket = ws;
      ws.onopen = () => {
        delay = first;
        opts.onConnection?.(true);
      };
      ws.onmessage = (ev) => {
        if (typeof ev.data !== 'string') return;
        try {
          const c = JSON.parse(ev.data) as Collection<T>;
          if (c && Array.isArray(c.data)) onList(c.data);
        } catch {
          // not a list message
        }
      };
      ws.onerror = () => undefined;
      ws.onclose = () => {
        if (socket !== ws) return;
        socket = undefined;
        if (opts.signal.aborted) return;
        opts.onConnection?.(false, 'live updates disconnected; reconnecting');
        timer = setTimeout(connect, delay);
        delay = Math.min(delay * 2, 15_000);
      };
    };
    opts.signal.addEventListener(
      'abort',
      () => {
        if (timer) clearTimeout(timer);
        const ws = socket;
        socket = undefined;
        ws?.close();
      },
      { once: true },
    );
    connect();
  }

  /**
   * Polls a backing image until `done` returns true (resolves the image), `failed` returns a message (rejects),
   * the timeout passes (rejects with kind `timeout`) or the signal aborts.
   */
  async waitForBackingImage(
    name: string,
    done: (bi: BackingImage) => boolean,
    opts: { timeoutMs: number; intervalMs?: number; signal?: AbortSignal; failed?: (bi: BackingImage) => string | undefined; onUpdate?: (bi: BackingImage) => void },
  ): Promise<BackingImage> {
    const deadline = Date.now() + opts.timeoutMs;
    for (;;) {
      const bi = await this.getBackingImage(name, { signal: opts.signal });
      opts.onUpdate?.(bi);
      if (done(bi)) return bi;
      const why = opts.failed?.(bi);
      if (why) throw new ApiClientError('server', 0, `wait ${name}`, why);
      if (Date.now() >= deadline) throw new ApiClientError('timeout', 0, `wait ${name}`, `timed out after ${Math.round(opts.timeoutMs / 1000)}s waiting for backing image ${name}`);
      await sleep(Math.min(opts.intervalMs ?? 1000, Math.max(0, deadline - Date.now())), opts.signal);
    }
  }
}
