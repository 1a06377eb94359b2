/**
 * The data-source host's control API: one process that runs several data sources, each with the HTTP API and the
 * sync server of a `backing-image-data-source` process, on ports of its own. The standalone data plane starts a few
 * hosts instead of one process per image (a process start costs about 0.5 s of CPU and 80 MiB).
 *
 * This module owns the contract: its types, its server routes ({@link dataSourceHostRoutes}) and its one typed client
 * ({@link DataSourceHostClient}).
 */
import http from 'node:http';
import type { FastifyInstance } from 'fastify';
import got from 'got';
import { authHeaders } from '@bis/internal-auth';
import { formatHostPort, parseHostPort } from '@bis/net-address';

export const DATA_SOURCE_HOST_INSTANCES_PATH = '/v1/instances';

/** Names of instances: the workload names of the data plane (DNS labels and dots), so that `<logs>/<name>.log` is safe. */
export const INSTANCE_NAME_PATTERN = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
/** At most this many arguments, each at most {@link MAX_ARG_LENGTH} characters. */
export const MAX_INSTANCE_ARGS = 512;
export const MAX_ARG_LENGTH = 16 * 1024;
/** At most this many environment entries per instance. */
export const MAX_INSTANCE_ENV = 32;
/** Options of the host's fastify server: names up to 253 characters reach the routes (fastify's default is 100). */
export const HOST_SERVER_OPTIONS = { routerOptions: { maxParamLength: 512 }, bodyLimit: 1 << 20 } as const;
/** Longest wait of one list call (`wait` seconds). */
export const MAX_LIST_WAIT_SECONDS = 60;

/** running: started, not ended (ready once both servers listen); succeeded: stopped with exit code 0; failed: any other end. */
export type InstancePhase = 'running' | 'succeeded' | 'failed';

export interface InstanceStatus {
  name: string;
  /** Unique per start on this host (a name started again gets another). */
  id: string;
  phase: InstancePhase;
  /** Both servers listen and the instance has not ended. */
  ready: boolean;
  exitCode?: number;
  message: string;
  /** RFC 3339 time of the start. */
  startedAt: string;
}

export interface InstanceList {
  /** Grows by one with every change of any instance; `?after=<version>` waits for a higher one. */
  version: number;
  /** The host's process id. */
  pid: number;
  maxInstances: number;
  instances: InstanceStatus[];
}

export interface StartInstanceRequest {
  /** The arguments of `backing-image-data-source` (without the program). */
  args: string[];
  /** Environment entries the instance reads on top of the host's (the credential variable). */
  env?: Record<string, string>;
}

/** The answer to a start: the instance's status and the table's version it reflects. */
export interface StartedInstance {
  version: number;
  instance: InstanceStatus;
}

/** What the routes serve (the host's instance table). */
export interface DataSourceInstanceHost {
  /** Starts an instance; resolves once it listens or has ended. Throws {@link HostRefusal} for a bad or refused request. */
  start(name: string, request: StartInstanceRequest): Promise<StartedInstance>;
  /** Stops an instance and forgets it; undefined if there is none. */
  stop(name: string, gracePeriodMs?: number): Promise<InstanceStatus | undefined>;
  list(): InstanceList;
  /** Resolves when the version is above `version`, or when `signal` aborts. */
  changed(version: number, signal: AbortSignal): Promise<void>;
}

/** A request the host refuses, with the HTTP status it answers (400 bad input, 409 name taken, 429 full). */
export class HostRefusal extends Error {
  override readonly name = 'HostRefusal';
  constructor(
    readonly statusCode: 400 | 404 | 409 | 429,
    message: string,
  ) {
    super(message);
  }
}

/** Checks a start request's shape and bounds (the host checks the name); throws {@link HostRefusal} (400). */
export function checkStartRequest(body: unknown): StartInstanceRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new HostRefusal(400, 'the body must be a JSON object');
  const { args, env } = body as { args?: unknown; env?: unknown };
  if (!Array.isArray(args) || args.length > MAX_INSTANCE_ARGS || !args.every((a) => typeof a === 'string' && a.length <= MAX_ARG_LENGTH)) {
    throw new HostRefusal(400, `args must be an array of at most ${MAX_INSTANCE_ARGS} strings of at most ${MAX_ARG_LENGTH} characters`);
  }
  const out: StartInstanceRequest = { args: args as string[] };
  if (env !== undefined) {
    if (typeof env !== 'object' || env === null || Array.isArray(env)) throw new HostRefusal(400, 'env must be an object of strings');
    const entries = Object.entries(env);
    if (entries.length > MAX_INSTANCE_ENV || !entries.every(([, v]) => typeof v === 'string' && v.length <= MAX_ARG_LENGTH)) {
      throw new HostRefusal(400, `env must hold at most ${MAX_INSTANCE_ENV} strings of at most ${MAX_ARG_LENGTH} characters`);
    }
    out.env = Object.fromEntries(entries) as Record<string, string>;
  }
  return out;
}

/**
 * The routes: `GET /v1/instances[?after=V&wait=S]`, `PUT /v1/instances/:name` (start), `DELETE /v1/instances/:name[?grace=ms]`.
 * Authentication is the caller's hook (the host registers the internal-token hook before these).
 */
export async function dataSourceHostRoutes(app: FastifyInstance, opts: { host: DataSourceInstanceHost }): Promise<void> {
  const { host } = opts;
  app.get(DATA_SOURCE_HOST_INSTANCES_PATH, async (req, reply) => {
    const q = req.query as { after?: string; wait?: string };
    const after = q.after === undefined ? undefined : Number(q.after);
    const wait = q.wait === undefined ? 0 : Number(q.wait);
    if ((after !== undefined && !Number.isSafeInteger(after)) || !Number.isFinite(wait) || wait < 0 || wait > MAX_LIST_WAIT_SECONDS) {
      return reply.code(400).send({ message: `after must be a version and wait 0 to ${MAX_LIST_WAIT_SECONDS} seconds` });
    }
    if (after !== undefined && wait > 0 && host.list().version <= after) {
      const ac = new AbortController();
      const timer = setTimeout(() => ac.abort(), wait * 1000);
      const onClose = (): void => ac.abort();
      req.raw.once('close', onClose);
      try {
        await host.changed(after, ac.signal);
      } finally {
        clearTimeout(timer);
        req.raw.off('close', onClose);
      }
    }
    return host.list();
  });
  app.put(`${DATA_SOURCE_HOST_INSTANCES_PATH}/:name`, async (req, reply) => {
    const { name } = req.params as { name: string };
    try {
      return await host.start(name, checkStartRequest(req.body));
    } catch (e) {
      if (e instanceof HostRefusal) return reply.code(e.statusCode).send({ message: e.message });
      throw e;
    }
  });
  app.delete(`${DATA_SOURCE_HOST_INSTANCES_PATH}/:name`, async (req, reply) => {
    const { name } = req.params as { name: string };
    const grace = (req.query as { grace?: string }).grace;
    const ms = grace === undefined ? undefined : Number(grace);
    if (ms !== undefined && (!Number.isSafeInteger(ms) || ms < 0 || ms > 600_000)) return reply.code(400).send({ message: 'grace must be 0 to 600000 ms' });
    const st = await host.stop(name, ms);
    if (!st) return reply.code(404).send({ message: `no instance ${name}` });
    return st;
  });
}

/** The host answered with an error status. */
export class DataSourceHostError extends Error {
  override readonly name = 'DataSourceHostError';
  constructor(
    readonly statusCode: number,
    message: string,
  ) {
    super(message);
  }
}

/** The one typed client of a data-source host at `host:port`. */
export class DataSourceHostClient {
  readonly #base: string;
  readonly #auth: Record<string, string>;
  readonly #agent = new http.Agent({ keepAlive: true, maxSockets: 32 });

  constructor(
    readonly address: string,
    opts: { token?: string } = {},
  ) {
    const { host, port } = parseHostPort(address, { what: 'data-source host address', defaultHost: '127.0.0.1' });
    this.#base = `http://${formatHostPort(host, port)}${DATA_SOURCE_HOST_INSTANCES_PATH}`;
    this.#auth = authHeaders(opts.token);
  }

  async #call<T>(method: 'GET' | 'PUT' | 'DELETE', url: string, opts: { json?: unknown; timeoutMs: number; signal?: AbortSignal }): Promise<T | undefined> {
    const res = await got(url, {
      method,
      headers: this.#auth,
      ...(opts.json !== undefined ? { json: opts.json } : {}),
      agent: { http: this.#agent },
      retry: { limit: 0 },
      throwHttpErrors: false,
      followRedirect: false,
      responseType: 'text',
      timeout: { request: opts.timeoutMs },
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    if (res.statusCode === 404 && method === 'DELETE') return undefined;
    if (res.statusCode !== 200) {
      let message = res.body.slice(0, 1024);
      try {
        message = String((JSON.parse(res.body) as { message?: unknown }).message ?? message);
      } catch {
        // not JSON: the text itself
      }
      throw new DataSourceHostError(res.statusCode, `${method} ${url}: HTTP ${res.statusCode} ${message}`);
    }
    return JSON.parse(res.body) as T;
  }

  /** Starts an instance; resolves once it listens or has ended (at most `timeoutMs`, default 120 s). */
  async start(name: string, request: StartInstanceRequest, timeoutMs = 120_000): Promise<StartedInstance> {
    return (await this.#call<StartedInstance>('PUT', `${this.#base}/${encodeURIComponent(name)}`, { json: request, timeoutMs }))!;
  }

  /** Stops an instance (the host waits up to `gracePeriodMs` for it to end); undefined if the host has none of that name. */
  async stop(name: string, gracePeriodMs = 10_000): Promise<InstanceStatus | undefined> {
    return this.#call<InstanceStatus>('DELETE', `${this.#base}/${encodeURIComponent(name)}?grace=${gracePeriodMs}`, { timeoutMs: gracePeriodMs + 30_000 });
  }

  /** The instance table; with `after`, waits up to `waitSeconds` for a version above it. */
  async list(opts: { after?: number; waitSeconds?: number; signal?: AbortSignal } = {}): Promise<InstanceList> {
    const q = opts.after === undefined ? '' : `?after=${opts.after}&wait=${opts.waitSeconds ?? 30}`;
    return (await this.#call<InstanceList>('GET', `${this.#base}${q}`, { timeoutMs: ((opts.waitSeconds ?? 0) + 30) * 1000, ...(opts.signal ? { signal: opts.signal } : {}) }))!;
  }

  close(): void {
    this.#agent.destroy();
  }
}
