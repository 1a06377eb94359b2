import {
  credentials,
  Metadata,
  status,
  type CallOptions,
  type ChannelOptions,
  type ClientReadableStream,
  type ServiceError,
} from '@grpc/grpc-js';
import { AUTHORIZATION_HEADER, bearer, checkInternalCaller, type InternalAuth } from '@bis/internal-auth';
import {
  BackingImageManagerServiceClient,
  type BackingImageResponse,
  type BackupCreateRequest,
  type BackupStatusResponse,
  type FetchRequest,
  type ListResponse,
  type PrepareDownloadResponse,
  type SyncRequest,
  type VersionResponse,
} from './gen/bimrpc.js';
import type { Empty } from './gen/google/protobuf/empty.js';

/** API version spoken by this implementation (Longhorn's BackingImageManagerAPIVersion / MinVersion). */
/** A {@link SyncRequest} whose `alternativeFromAddresses` (an addition to Longhorn's message) may be left out. */
export type SyncInput = Omit<SyncRequest, 'alternativeFromAddresses'> & { alternativeFromAddresses?: string[] };

export const MANAGER_API_VERSION = 3;
export const MANAGER_API_MIN_VERSION = 3;

/** Default deadline of a unary call (Longhorn's GRPCServiceTimeout). */
export const DEFAULT_CALL_TIMEOUT_MS = 60_000;

/**
 * Channel options for manager clients: a 16 MiB HTTP/2 flow-control window (grpc-js defaults to 64 KiB, which makes
 * large streams about 5× slower) and no proxy / service config, as Longhorn's clients dial.
 */
export const MANAGER_CHANNEL_OPTIONS: ChannelOptions = {
  'grpc-node.flow_control_window': 16 << 20,
  'grpc.enable_http_proxy': 0,
  'grpc.service_config_disable_resolution': 1,
};

export interface ManagerClientOptions {
  /** Deadline of each unary call in milliseconds (default 60 s). */
  callTimeoutMs?: number;
  channelOptions?: ChannelOptions;
  /** Sent as `authorization: Bearer <token>` metadata on every call (see `@bis/internal-auth`). */
  token?: string;
}

/** Whether the API range of a server is compatible with this client (Longhorn's CheckBackingImageManagerCompatibility). */
export function isManagerApiCompatible(v: Pick<VersionResponse, 'backingImageManagerApiVersion' | 'backingImageManagerApiMinVersion'>): boolean {
  return (
    MANAGER_API_MIN_VERSION <= v.backingImageManagerApiVersion && MANAGER_API_VERSION >= v.backingImageManagerApiMinVersion
  );
}

/**
 * A promise-based client of one backing-image manager (`bimrpc.BackingImageManagerService`).
 * Errors are grpc-js `ServiceError`s (with `code` and `details`).
 */
export class ManagerClient {
  readonly #client: BackingImageManagerServiceClient;
  readonly #timeoutMs: number;
  readonly #token: string | undefined;

  constructor(
    readonly address: string,
    opts: ManagerClientOptions = {},
  ) {
    this.#client = new BackingImageManagerServiceClient(address, credentials.createInsecure(), {
      ...MANAGER_CHANNEL_OPTIONS,
      ...opts.channelOptions,
    });
    this.#timeoutMs = opts.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    this.#token = opts.token;
  }

  #metadata(): Metadata {
    const m = new Metadata();
    if (this.#token) m.set(AUTHORIZATION_HEADER, bearer(this.#token));
    return m;
  }

  #unary<Res>(
    invoke: (
      metadata: Metadata,
      options: Partial<CallOptions>,
      cb: (err: ServiceError | null, res: Res) => void,
    ) => unknown,
  ): Promise<Res> {
    return new Promise<Res>((resolve, reject) => {
      invoke(this.#metadata(), { deadline: new Date(Date.now() + this.#timeoutMs) }, (err, res) =>
        err ? reject(err) : resolve(res),
      );
    });
  }

  get(name: string, uuid: string): Promise<BackingImageResponse> {
    return this.#unary((m, o, cb) => this.#client.get({ name, uuid }, m, o, cb));
  }
  list(): Promise<ListResponse> {
    return this.#unary((m, o, cb) => this.#client.list({}, m, o, cb));
  }
  async delete(name: string, uuid: string): Promise<void> {
    await this.#unary<Empty>((m, o, cb) => this.#client.delete({ name, uuid }, m, o, cb));
  }
  versionGet(): Promise<VersionResponse> {
    return this.#unary((m, o, cb) => this.#client.versionGet({}, m, o, cb));
  }
  sync(req: SyncInput): Promise<BackingImageResponse> {
    const full: SyncRequest = { ...req, alternativeFromAddresses: req.alternativeFromAddresses ?? [] };
    return this.#unary((m, o, cb) => this.#client.sync(full, m, o, cb));
  }
  /** `fromManagerAddress`: the asking manager's own address (our extension; see `SendRequest.from_manager_address`). */
  async send(name: string, uuid: string, toAddress: string, fromManagerAddress = ''): Promise<void> {
    await this.#unary<Empty>((m, o, cb) => this.#client.send({ name, uuid, toAddress, fromManagerAddress }, m, o, cb));
  }
  fetch(req: FetchRequest): Promise<BackingImageResponse> {
    return this.#unary((m, o, cb) => this.#client.fetch(req, m, o, cb));
  }
  prepareDownload(name: string, uuid: string): Promise<PrepareDownloadResponse> {
    return this.#unary((m, o, cb) => this.#client.prepareDownload({ name, uuid }, m, o, cb));
  }
  async backupCreate(req: BackupCreateRequest): Promise<void> {
    await this.#unary<Empty>((m, o, cb) => this.#client.backupCreate(req, m, o, cb));
  }
  backupStatus(name: string): Promise<BackupStatusResponse> {
    return this.#unary((m, o, cb) => this.#client.backupStatus({ name }, m, o, cb));
  }
  /** Change notifications (no payload). Cancel with `stream.cancel()`. */
  watch(): ClientReadableStream<Empty> {
    return this.#client.watch({}, this.#metadata());
  }
  /** Resolves when the channel is connected, or rejects after `timeoutMs`. */
  waitForReady(timeoutMs: number): Promise<void> {
    return new Promise((resolve, reject) =>
      this.#client.waitForReady(Date.now() + timeoutMs, (err) => (err ? reject(err) : resolve())),
    );
  }
  close(): void {
    this.#client.close();
  }
}

/**
 * Wraps a service implementation so that every call (unary or server-streaming) without the token is refused with
 * `UNAUTHENTICATED` before its handler runs (see `@bis/internal-auth`; no check without `auth.token`).
 */
export function withInternalAuth<T extends object>(impl: T, auth: InternalAuth | undefined, onRefused?: (method: string, reason: string) => void): T {
  if (!auth?.token) return impl;
  const wrapped: Record<string, unknown> = {};
  for (const [method, handler] of Object.entries(impl)) {
    if (typeof handler !== 'function') {
      wrapped[method] = handler;
      continue;
    }
    const h = handler as (call: { metadata: Metadata; emit(e: 'error', err: unknown): boolean }, cb?: (err: unknown) => void) => void;
    wrapped[method] = (call: { metadata: Metadata; emit(e: 'error', err: unknown): boolean }, cb?: (err: unknown) => void) => {
      const values = call.metadata.get(AUTHORIZATION_HEADER).map((v) => (typeof v === 'string' ? v : v.toString('utf8')));
      const d = checkInternalCaller(auth, values.length === 0 ? undefined : values);
      if (d.ok) return h(call, cb);
      onRefused?.(method, d.reason);
      const err = grpcError(status.UNAUTHENTICATED, `unauthenticated: ${d.reason}`);
      if (typeof cb === 'function') cb(err);
      else call.emit('error', err);
    };
  }
  return wrapped as T;
}

/** Whether an error is a gRPC error with the given status code. */
export function isGrpcStatus(err: unknown, code: status): err is ServiceError {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === code;
}

/** Builds a gRPC error for a server handler's callback (or `call.emit('error', …)` on a stream, never `destroy`). */
export function grpcError(code: status, details: string): Partial<ServiceError> & { code: status; details: string } {
  return { code, details, message: details, name: 'GrpcError' };
}
