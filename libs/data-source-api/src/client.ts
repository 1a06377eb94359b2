import http from 'node:http';
import type { Readable } from 'node:stream';
import got from 'got';
import { authHeaders } from '@bis/internal-auth';
import { parseHostPort, formatHostPort } from '@bis/net-address';
import { FILE_MACHINE, FILE_STATES, FileState, transition } from '@bis/state-machine';
import { DATA_SOURCE_FILE_PATH, DATA_SOURCE_MAX_WAIT_SECONDS, DATA_SOURCE_WAITS_HEADER, DataSourceAction, type DataSourceFileInfo, type UploadProgress } from './contract.js';

/** Longhorn's data-source client timeout for `GET /v1/file` and the transfer. */
export const DATA_SOURCE_CALL_TIMEOUT_MS = 10_000;

/** Largest answer read (`/v1/file` answers are a few hundred bytes of JSON; error texts are short). */
const MAX_ANSWER_BYTES = 1 << 20;

/** A data source answered with an error status; carries the status and the body (which the upload proxy passes on). */
export class DataSourceHttpError extends Error {
  override readonly name = 'DataSourceHttpError';
  constructor(
    readonly statusCode: number,
    readonly body: string,
    request: string,
  ) {
    super(`${request}: HTTP ${statusCode} ${body}`);
  }
}

export interface DataSourceClientOptions {
  /** The system's internal token, sent as `authorization: Bearer <token>`. */
  token?: string;
  /** Timeout of `get` and `transfer` (default {@link DATA_SOURCE_CALL_TIMEOUT_MS}). */
  timeoutMs?: number;
}

/** A raw answer: its status and (at most 1 MiB of) its body. */
export interface DataSourceAnswer {
  statusCode: number;
  body: string;
}

/**
 * Connections are kept alive between calls: the controller polls each data source every few seconds while it
 * prepares its file, and a new loopback connection per poll was 4 % of the controller-manager's CPU at 300 images
 * (the connect and close on both sides). A kept connection ends when its data source closes (its server closes every
 * connection) or after the idle time the server announces (`Keep-Alive: timeout=`), and the pool drops an origin's
 * entry with its last socket, so nothing is kept per data source that is gone. An upload has a connection of its own,
 * closed after the answer: an early refusal leaves its body half sent, and such a connection is not reused.
 */
const pool = new http.Agent({ keepAlive: true, scheduling: 'lifo' });
const single = new http.Agent({ keepAlive: false });
const client = got.extend({ retry: { limit: 0 }, throwHttpErrors: false, followRedirect: false, agent: { http: pool }, responseType: 'text' });

/** The one typed client of a data source's HTTP API (`/v1/file`) at `host:port`. */
export class DataSourceClient {
  readonly #base: string;
  readonly #auth: Record<string, string>;
  readonly #timeoutMs: number;

  constructor(
    readonly address: string,
    opts: DataSourceClientOptions = {},
  ) {
    const { host, port } = parseHostPort(address, { what: 'data source address', defaultHost: '127.0.0.1', allowScheme: true });
    this.#base = `http://${formatHostPort(host, port)}`;
    this.#auth = authHeaders(opts.token);
    this.#timeoutMs = opts.timeoutMs ?? DATA_SOURCE_CALL_TIMEOUT_MS;
  }

  /** `GET /v1/file`: the data source's file. */
  async get(): Promise<DataSourceFileInfo> {
    const what = `GET ${this.#base}${DATA_SOURCE_FILE_PATH}`;
    const { statusCode, body } = await this.#call('GET', '', { timeoutMs: this.#timeoutMs });
    if (statusCode !== 200) throw new DataSourceHttpError(statusCode, body, what);
    return parseFileInfo(body, what);
  }

  /**
   * `GET /v1/file?waitWhile=<state>&wait=<seconds>`: the file once its state is not `state`, or after `waitSeconds`
   * (at most {@link DATA_SOURCE_MAX_WAIT_SECONDS}) with the state unchanged; undefined when the data source answered
   * at once without waiting (one that does not know the parameters, as Longhorn's): its caller polls instead.
   */
  async waitForChange(state: FileState, opts: { waitSeconds: number; signal?: AbortSignal }): Promise<DataSourceFileInfo | undefined> {
    const wait = Math.min(Math.max(0, Math.floor(opts.waitSeconds)), DATA_SOURCE_MAX_WAIT_SECONDS);
    const search = `?waitWhile=${encodeURIComponent(state)}&wait=${wait}`;
    const what = `GET ${this.#base}${DATA_SOURCE_FILE_PATH}${search}`;
    const { statusCode, body, headers } = await this.#call('GET', search, { timeoutMs: this.#timeoutMs + wait * 1000, ...(opts.signal ? { signal: opts.signal } : {}) });
    if (statusCode !== 200) throw new DataSourceHttpError(statusCode, body, what);
    const info = parseFileInfo(body, what);
    return headers[DATA_SOURCE_WAITS_HEADER] === undefined ? undefined : info;
  }

  /** `POST /v1/file?action=transfer`: the data source hands its file over. */
  async transfer(): Promise<void> {
    const search = `?action=${DataSourceAction.Transfer}`;
    const { statusCode, body } = await this.#call('POST', search, { timeoutMs: this.#timeoutMs });
    if (statusCode !== 200) throw new DataSourceHttpError(statusCode, body, `POST ${this.#base}${DATA_SOURCE_FILE_PATH}${search}`);
  }

  /** `GET /v1/file?action=uploadOffset`: where a resumable upload continues. */
  async uploadOffset(signal?: AbortSignal): Promise<UploadProgress> {
    const search = `?action=${DataSourceAction.UploadOffset}`;
    const what = `GET ${this.#base}${DATA_SOURCE_FILE_PATH}${search}`;
    const { statusCode, body } = await this.#call('GET', search, { signal });
    if (statusCode !== 200) throw new DataSourceHttpError(statusCode, body, what);
    return parseUploadProgress(body, what);
  }

  /**
   * `POST /v1/file<search>` with a streamed body (never buffered): an `upload` or `uploadPart` whose query (`search`,
   * starting with `?`) is passed as the caller got it, so the data source judges its parameters. Answers whatever
   * status came back; an answer that comes before the body is complete (an early refusal) wins.
   */
  postFile(search: string, body: Readable, headers: Record<string, string>, signal?: AbortSignal): Promise<DataSourceAnswer> {
    return this.#call('POST', search, { body, headers, signal }).then(({ statusCode, body }) => ({ statusCode, body }));
  }

  async #call(
    method: 'GET' | 'POST',
    search: string,
    o: { body?: Readable; headers?: Record<string, string>; signal?: AbortSignal; timeoutMs?: number },
  ): Promise<DataSourceAnswer & { headers: http.IncomingHttpHeaders }> {
    const req = client(`${this.#base}${DATA_SOURCE_FILE_PATH}${search}`, {
      method,
      headers: { ...(o.headers ?? {}), ...this.#auth },
      ...(o.body ? { body: o.body, agent: { http: single } } : {}),
      ...(o.signal ? { signal: o.signal } : {}),
      ...(o.timeoutMs ? { timeout: { request: o.timeoutMs } } : {}),
    });
    let tooLarge: Error | undefined;
    // `on` returns the request itself, which is awaited below
    void req.on('downloadProgress', (p: { transferred: number }) => {
      if (p.transferred <= MAX_ANSWER_BYTES || tooLarge) return;
      tooLarge = new Error(`${method} ${this.#base}${DATA_SOURCE_FILE_PATH}${search}: the answer is larger than ${MAX_ANSWER_BYTES} bytes`);
      req.cancel();
    });
    try {
      const res = await req;
      return { statusCode: res.statusCode, body: res.body, headers: res.headers };
    } catch (e) {
      throw tooLarge ?? e;
    }
  }
}

const isFileState = (s: unknown): s is FileState => typeof s === 'string' && (FILE_STATES as readonly string[]).includes(s);

/** The JSON of `GET /v1/file`, with every field present (Go's zero values for missing ones). */
export function parseFileInfo(text: string, what = 'GET /v1/file'): DataSourceFileInfo {
  let raw: Record<string, unknown>;
  try {
    const v: unknown = JSON.parse(text);
    if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Error('not an object');
    raw = v as Record<string, unknown>;
  } catch {
    throw new Error(`${what}: the answer is not JSON: ${text.slice(0, 200)}`);
  }
  const str = (k: string): string => (typeof raw[k] === 'string' ? (raw[k] as string) : '');
  const num = (k: string): number => {
    const n = Number(raw[k] ?? 0);
    return Number.isFinite(n) ? n : 0;
  };
  const reported = raw['state'] ?? '';
  if (!isFileState(reported)) throw new Error(`${what}: unknown file state ${JSON.stringify(reported)}`);
  const params = raw['parameters'];
  return {
    sourceType: str('sourceType'),
    parameters: typeof params === 'object' && params !== null ? Object.fromEntries(Object.entries(params).map(([k, v]) => [k, String(v)])) : {},
    name: str('name'),
    diskUUID: str('diskUUID'),
    expectedChecksum: str('expectedChecksum'),
    filePath: str('filePath'),
    uuid: str('uuid'),
    size: num('size'),
    virtualSize: num('virtualSize'),
    realSize: num('realSize'),
    // the data source owns its file's state: the info mirrors what it reported
    state: transition(FILE_MACHINE, FileState.New, { reported }, what),
    progress: num('progress'),
    processedSize: num('processedSize'),
    modificationTime: str('modificationTime'),
    currentChecksum: str('currentChecksum'),
    message: str('message'),
    sendingReference: num('sendingReference'),
    ...(str('unpaddedChecksum') ? { unpaddedSize: num('unpaddedSize'), unpaddedChecksum: str('unpaddedChecksum') } : {}),
  };
}

/** The JSON of `uploadOffset` / `uploadPart`. */
export function parseUploadProgress(text: string, what = 'the data source'): UploadProgress {
  try {
    const v = JSON.parse(text) as { size?: unknown; offset?: unknown };
    if (typeof v.size === 'number' && typeof v.offset === 'number') return { size: v.size, offset: v.offset };
  } catch {
    // reported below
  }
  throw new Error(`${what}: unexpected answer: ${text.slice(0, 200)}`);
}
