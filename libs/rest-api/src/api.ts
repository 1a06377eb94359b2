import websocket from '@fastify/websocket';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError, errorBody, notFound } from './errors.js';
import { checkInput, pluralOf, schemaToJson, segmentOf, type TypeSchema } from './schema.js';

/** What a handler gets for one request. */
export interface ApiContext {
  /** `<scheme>://<host>` the client used (from X-API-request-url / X-Forwarded-* / Host). */
  baseUrl: string;
  request: FastifyRequest;
  /** Aborted when the client goes away. */
  signal: AbortSignal;
  /** Builds a resource envelope (for handlers returning another type, e.g. an action's output). */
  render(type: string, obj: unknown): ApiResource;
}

/** A rendered resource: envelope + fields. */
export interface ApiResource {
  id: string;
  type: string;
  links: Record<string, string>;
  actions: Record<string, string>;
  [field: string]: unknown;
}

export type ApiInput = Record<string, unknown>;

/** Behaviour behind one resource type. `R` is the domain object (e.g. a BackingImage CR). */
export interface ResourceHandlers<R> {
  /** The resource id (Longhorn: the object name). */
  id(obj: R): string;
  /** The resource fields, without id/type/links/actions. */
  toFields(obj: R, ctx: ApiContext): Record<string, unknown>;
  /** Which of the schema's resourceActions to advertise on this object. Default: all. */
  availableActions?(obj: R): string[];
  list?(ctx: ApiContext): Promise<R[]>;
  /** Resolve `undefined` (or reject with a NotFound error) for a missing id: the API answers 404. */
  get?(ctx: ApiContext, id: string): Promise<R | undefined>;
  create?(ctx: ApiContext, input: ApiInput): Promise<R>;
  update?(ctx: ApiContext, id: string, input: ApiInput): Promise<R>;
  delete?(ctx: ApiContext, id: string): Promise<void>;
  /** Resource actions (`POST <self>?action=<name>`). Return an object to answer it (rendered with this type, or an ApiResource), or nothing for an empty 200. */
  actions?: Record<string, (ctx: ApiContext, id: string, input: ApiInput) => Promise<R | ApiResource | void>>;
  /** Collection actions (`POST <collection>?action=<name>`). */
  collectionActions?: Record<string, (ctx: ApiContext, input: ApiInput) => Promise<R | ApiResource | void>>;
  /**
   * True when `toFields` and `availableActions` read the object alone (not the request context, not other objects): a
   * list then keeps each object's rendered JSON, by base URL, for as long as the object lives, and renders only objects
   * it has not rendered before. Worth it when `list` hands out the store's own objects, which stay the same object
   * until they are written (`SharedReads` of `@bis/datastore`); with fresh copies nothing is reused.
   */
  renderDependsOnObjectOnly?: boolean;
  /** Change notifications for `/v1/ws/<plural>`: yields whenever the list may have changed. Without it the stream polls each period. */
  changes?(signal: AbortSignal): AsyncIterable<unknown>;
}

export interface ResourceDefinition<R> {
  schema: TypeSchema;
  handlers: ResourceHandlers<R>;
}

/**
 * The set of types the API serves. Register input/output-only types with `addType` and routed resources with
 * `addResource`, then register `restApiPlugin` with this registry on a fastify instance.
 */
export class ApiRegistry {
  private readonly types = new Map<string, TypeSchema>();
  private readonly resources = new Map<string, ResourceDefinition<unknown>>();

  addType(schema: TypeSchema): this {
    if (this.types.has(schema.id)) throw new Error(`schema ${schema.id} is already registered`);
    this.types.set(schema.id, schema);
    return this;
  }
  addResource<R>(def: ResourceDefinition<R>): this {
    this.addType(def.schema);
    for (const r of this.resources.values()) {
      if (segmentOf(r.schema) === segmentOf(def.schema)) throw new Error(`URL segment ${segmentOf(def.schema)} is used by ${r.schema.id} and ${def.schema.id}`);
    }
    this.resources.set(def.schema.id, def as ResourceDefinition<unknown>);
    return this;
  }
  schema(id: string): TypeSchema | undefined {
    return this.types.get(id);
  }
  allSchemas(): TypeSchema[] {
    return [...this.types.values()];
  }
  resource(id: string): ResourceDefinition<unknown> | undefined {
    return this.resources.get(id);
  }
  allResources(): ResourceDefinition<unknown>[] {
    return [...this.resources.values()];
  }
}

export interface RestApiOptions {
  registry: ApiRegistry;
  /** Serve `/v1/ws/<plural>` list streams. Default true. */
  websockets?: boolean;
  /** Websocket ping interval. Default 30 s. */
  keepAliveMs?: number;
  /** Default period of a list stream without `{period}`. Default 1 s. */
  defaultStreamPeriodMs?: number;
}

const SCHEMA_SCHEMA: TypeSchema = {
  id: 'schema',
  resourceFields: {},
  resourceMethods: ['GET'],
  collectionMethods: ['GET'],
};

/** `<scheme>://<host>` of the request, following go-rancher: X-API-request-url, then X-Forwarded-Proto/Host/Port, then Host. */
export function baseUrlOf(req: FastifyRequest): string {
  const h = (name: string): string | undefined => {
    const v = req.headers[name];
    return Array.isArray(v) ? v[0] : v;
  };
  const explicit = h('x-api-request-url');
  if (explicit) {
    try {
      const u = new URL(explicit);
      const i = u.pathname.indexOf('/v1');
      return `${u.protocol}//${u.host}${i > 0 ? u.pathname.slice(0, i) : ''}`;
    } catch {
      // fall through to the other headers
    }
  }
  const proto = h('x-forwarded-proto')?.split(',')[0].trim() || 'http';
  let host = h('x-forwarded-host')?.split(',')[0].trim() || h('host') || 'localhost';
  const port = h('x-forwarded-port');
  if (port && !/:\d+$/.test(host) && !((proto === 'http' && port === '80') || (proto === 'https' && port === '443'))) host = `${host}:${port}`;
  return `${proto}://${host}`;
}

/** Parses a Go duration as used in `/v1/ws/{period}/...` (`500ms`, `1s`, `1m30s`). */
export function parseGoDuration(s: string): number | undefined {
  const re = /(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/gy;
  const unit: Record<string, number> = { ns: 1e-6, us: 1e-3, µs: 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  let total = 0;
  let matched = 0;
  let m: RegExpExecArray | null;
  while ((m = re.exec(s))) {
    total += Number(m[1]) * unit[m[2]];
    matched += m[0].length;
  }
  return matched === s.length && matched > 0 ? total : undefined;
}

function makeContext(registry: ApiRegistry, req: FastifyRequest, reply: FastifyReply | undefined): ApiContext {
  const baseUrl = baseUrlOf(req);
  const ac = new AbortController();
  if (reply) reply.raw.once('close', () => ac.abort());
  return { baseUrl, request: req, signal: ac.signal, render: (type, obj) => renderAs(registry, baseUrl, type, obj, req) };
}

function renderAs(registry: ApiRegistry, baseUrl: string, type: string, obj: unknown, req: FastifyRequest): ApiResource {
  const def = registry.resource(type);
  if (!def) throw new Error(`no resource type ${type} is registered`);
  return render(def, baseUrl, obj, { baseUrl, request: req, signal: new AbortController().signal, render: (t, o) => renderAs(registry, baseUrl, t, o, req) });
}

function render(def: ResourceDefinition<unknown>, baseUrl: string, obj: unknown, ctx: ApiContext): ApiResource {
  const id = def.handlers.id(obj);
  const self = `${baseUrl}/v1/${segmentOf(def.schema)}/${encodeURIComponent(id)}`;
  const names = def.handlers.availableActions?.(obj) ?? Object.keys(def.schema.resourceActions ?? {});
  const actions: Record<string, string> = {};
  for (const n of names) actions[n] = `${self}?action=${n}`;
  return { ...def.handlers.toFields(obj, ctx), id, type: def.schema.id, links: { self }, actions };
}

function isApiResource(v: unknown): v is ApiResource {
  return !!v && typeof v === 'object' && typeof (v as ApiResource).type === 'string' && typeof (v as ApiResource).links === 'object' && 'id' in v;
}

function collection(def: ResourceDefinition<unknown>, baseUrl: string, items: unknown[], ctx: ApiContext): Record<string, unknown> {
  const url = `${baseUrl}/v1/${segmentOf(def.schema)}`;
  const data = items.map((o) => render(def, baseUrl, o, ctx)).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const canCreate = (def.schema.collectionMethods ?? []).includes('POST');
  const actions: Record<string, string> = {};
  for (const n of Object.keys(def.schema.collectionActions ?? {})) actions[n] = `${url}?action=${n}`;
  return { type: 'collection', resourceType: def.schema.id, links: { self: url }, createTypes: canCreate ? { [def.schema.id]: url } : {}, actions, data };
}

interface RenderedItem {
  id: string;
  /** The item's JSON, UTF-8 encoded once: a list is then one copy of these bytes, never a string to encode again. */
  json: Buffer;
  /** The base URL the links were rendered with. */
  baseUrl: string;
}

/** Per resource: each listed object's rendered JSON, while the object lives (see `renderDependsOnObjectOnly`). */
const renderCaches = new WeakMap<ResourceDefinition<unknown>, WeakMap<object, RenderedItem>>();

/** Per resource (with `renderDependsOnObjectOnly`): the last list body, and the objects and base URL it shows. */
const lastBodies = new WeakMap<ResourceDefinition<unknown>, { baseUrl: string; items: readonly unknown[]; body: Buffer }>();

const COMMA = Buffer.from(',');
const LIST_END = Buffer.from(']}');

function renderCacheOf(def: ResourceDefinition<unknown>): WeakMap<object, RenderedItem> {
  let c = renderCaches.get(def);
  if (!c) renderCaches.set(def, (c = new WeakMap()));
  return c;
}

function sameItems(a: readonly unknown[], b: readonly unknown[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * The JSON of `collection(...)` as the bytes of the reply, built one item at a time: each rendered item is serialized
 * and encoded at once and only its bytes are kept, so a list of a thousand images does not hold a thousand rendered
 * object trees until the reply is serialized (they lived long enough to be promoted to the old generation, and were
 * most of its garbage). For a resource whose rendering depends only on its object, an unchanged object's bytes are
 * reused, and so is the whole body when no object changed since the last list: a list of 1,000 images is then a
 * copy of its items' bytes (or nothing), instead of encoding a 1.5 MB string twice (its length, then its bytes).
 */
function collectionBody(def: ResourceDefinition<unknown>, baseUrl: string, items: unknown[], ctx: ApiContext): Buffer {
  const cache = def.handlers.renderDependsOnObjectOnly ? renderCacheOf(def) : undefined;
  if (cache) {
    const last = lastBodies.get(def);
    if (last && last.baseUrl === baseUrl && sameItems(last.items, items)) return last.body;
  }
  const rendered: RenderedItem[] = [];
  for (const o of items) {
    const hit = cache && typeof o === 'object' && o !== null ? cache.get(o) : undefined;
    if (hit && hit.baseUrl === baseUrl) {
      rendered.push(hit);
      continue;
    }
    const r = render(def, baseUrl, o, ctx);
    const item: RenderedItem = { id: r.id, json: Buffer.from(JSON.stringify(r), 'utf8'), baseUrl };
    if (cache && typeof o === 'object' && o !== null) cache.set(o, item);
    rendered.push(item);
  }
  rendered.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const envelope = JSON.stringify(collection(def, baseUrl, [], ctx));
  // `data` is the envelope's last member: `…"data":[]}`.
  const parts: Buffer[] = [Buffer.from(envelope.slice(0, -2), 'utf8')];
  for (let i = 0; i < rendered.length; i++) {
    if (i > 0) parts.push(COMMA);
    parts.push(rendered[i]!.json);
  }
  parts.push(LIST_END);
  const body = Buffer.concat(parts);
  if (cache) lastBodies.set(def, { baseUrl, items, body });
  return body;
}

/** A request body as JSON (`undefined` when empty); a 400 {@link ApiError} that says so when it is not JSON. */
export function parseJsonText(text: string): unknown {
  if (text.trim() === '') return undefined;
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new ApiError(400, `request body is not valid JSON: ${(err as Error).message}`);
  }
}

function inputFor(registry: ApiRegistry, def: ResourceDefinition<unknown>, action: string | undefined, body: unknown): ApiInput {
  let schema: TypeSchema | undefined = def.schema;
  if (action) {
    const a = def.schema.resourceActions?.[action] ?? def.schema.collectionActions?.[action];
    schema = a?.input ? registry.schema(a.input) : undefined;
  }
  if (schema) {
    const problems = checkInput(schema, body);
    if (problems.length) throw new ApiError(400, `invalid input for ${action ? `action ${action}` : schema.id}: ${problems.join('; ')}`);
  } else if (body !== undefined && body !== null && (typeof body !== 'object' || Array.isArray(body))) {
    throw new ApiError(400, 'request body must be a JSON object');
  }
  return (body && typeof body === 'object' ? body : {}) as ApiInput;
}

/**
 * The cattle-style REST API as a fastify plugin: `/v1`, `/v1/schemas[/<id>]`, and for every registered resource
 * `GET/POST /v1/<plural>`, `GET/PUT/DELETE /v1/<plural>/<id>`, `POST …?action=<name>` and the websocket list
 * streams `/v1/ws/<plural>` and `/v1/ws/<period>/<plural>`. Register it without a prefix.
 */
export async function restApiPlugin(app: FastifyInstance, opts: RestApiOptions): Promise<void> {
  const { registry } = opts;
  const allSchemas = (): TypeSchema[] => [SCHEMA_SCHEMA, ...registry.allSchemas()];

  // Bodies are JSON whatever their Content-Type, as Longhorn's handlers decode them (`json.NewDecoder`): Longhorn's
  // Python client sends JSON with no Content-Type at all. Only multipart bodies (and the octet-stream bodies of the
  // upload actions, parsed by the upload plugin registered before this one) are not JSON here. Empty bodies on
  // POST/PUT/DELETE are fine (Python client actions without arguments).
  const parseJsonBody = (_req: FastifyRequest, body: string | Buffer, done: (err: Error | null, body?: unknown) => void): void => {
    const text = typeof body === 'string' ? body : body.toString('utf8');
    try {
      done(null, parseJsonText(text));
    } catch (err) {
      done(err as Error, undefined);
    }
  };
  app.addContentTypeParser(['application/json', 'text/plain'], { parseAs: 'string' }, parseJsonBody);
  // The catch-all parser also serves requests without a Content-Type (fastify looks it up for `''`).
  app.addContentTypeParser('*', { parseAs: 'string' }, parseJsonBody);

  app.addHook('onSend', async (req, reply, payload) => {
    reply.header('X-API-Schemas', `${baseUrlOf(req)}/v1/schemas`);
    return payload;
  });

  app.setErrorHandler((err, req, reply) => {
    const self = `${baseUrlOf(req)}${req.url}`;
    const body = errorBody(err, self);
    if (body.status >= 500) req.log.warn({ err }, 'API request failed');
    // The reply is sent by fastify; the returned promise only resolves to the reply itself.
    void reply.status(body.status).type('application/json').send(body);
  });

  app.setNotFoundHandler((req, reply) => {
    // The reply is sent by fastify; the returned promise only resolves to the reply itself.
    void reply.status(404).send(errorBody(notFound(`no route for ${req.method} ${req.url.split('?')[0]}`), `${baseUrlOf(req)}${req.url}`));
  });

  const versionLinks = (base: string): Record<string, string> => {
    const links: Record<string, string> = { self: `${base}/v1`, schemas: `${base}/v1/schemas` };
    for (const r of registry.allResources()) if ((r.schema.collectionMethods ?? []).includes('GET')) links[pluralOf(r.schema)] = `${base}/v1/${segmentOf(r.schema)}`;
    return links;
  };
  app.get('/', async (req) => {
    const base = baseUrlOf(req);
    return { type: 'collection', resourceType: 'apiVersion', links: { self: `${base}/` }, createTypes: {}, actions: {}, data: [{ id: 'v1', type: 'apiVersion', links: versionLinks(base), actions: {} }] };
  });
  app.get('/v1', async (req) => ({ id: 'v1', type: 'apiVersion', links: versionLinks(baseUrlOf(req)), actions: {} }));

  app.get('/v1/schemas', async (req) => {
    const base = baseUrlOf(req);
    return {
      type: 'collection',
      resourceType: 'schema',
      links: { self: `${base}/v1/schemas` },
      createTypes: {},
      actions: {},
      data: allSchemas().map((s) => schemaToJson(s, base, s.id === 'schema' ? true : !!registry.resource(s.id))),
    };
  });
  app.get<{ Params: { id: string } }>('/v1/schemas/:id', async (req) => {
    const s = allSchemas().find((x) => x.id === req.params.id);
    if (!s) throw notFound(`schema ${req.params.id} not found`);
    return schemaToJson(s, baseUrlOf(req), s.id === 'schema' ? true : !!registry.resource(s.id));
  });

  // Method not allowed on an existing path: plain 405 with an empty body, like gorilla/mux.
  const methodNotAllowed = async (_req: FastifyRequest, reply: FastifyReply): Promise<void> => {
    await reply.status(405).type('text/plain').send('');
  };

  if (opts.websockets !== false) await app.register(websocket);

  for (const def of registry.allResources()) {
    const h = def.handlers;
    const seg = segmentOf(def.schema);
    const cm = def.schema.collectionMethods ?? [];
    const rm = def.schema.resourceMethods ?? [];
    const collectionUrl = `/v1/${seg}`;
    const itemUrl = `/v1/${seg}/:id`;

    app.route({
      method: ['GET', 'POST', 'PUT', 'DELETE'],
      url: collectionUrl,
      handler: async (req: FastifyRequest<{ Querystring: { action?: string } }>, reply) => {
        const ctx = makeContext(registry, req, reply);
        const action = req.query.action;
        if (req.method === 'GET' && cm.includes('GET') && h.list) {
          return reply.type('application/json; charset=utf-8').send(collectionBody(def, ctx.baseUrl, await h.list(ctx), ctx));
        }
        if (req.method === 'POST' && action !== undefined) {
          const fn = h.collectionActions?.[action];
          if (!fn || !def.schema.collectionActions?.[action]) return methodNotAllowed(req, reply);
          const out = await fn(ctx, inputFor(registry, def, action, req.body));
          if (out === undefined) return reply.status(200).send('');
          return isApiResource(out) ? out : render(def, ctx.baseUrl, out, ctx);
        }
        if (req.method === 'POST' && cm.includes('POST') && h.create) {
          const created = await h.create(ctx, inputFor(registry, def, undefined, req.body));
          return render(def, ctx.baseUrl, created, ctx);
        }
        return methodNotAllowed(req, reply);
      },
    });

    app.route({
      method: ['GET', 'POST', 'PUT', 'DELETE'],
      url: itemUrl,
      handler: async (req: FastifyRequest<{ Params: { id: string }; Querystring: { action?: string } }>, reply) => {
        const ctx = makeContext(registry, req, reply);
        const id = req.params.id;
        const action = req.query.action;
        switch (req.method) {
          case 'GET': {
            if (!rm.includes('GET') || !h.get) break;
            const obj = await h.get(ctx, id);
            if (obj === undefined) throw notFound(`${def.schema.id} ${id} not found`);
            return render(def, ctx.baseUrl, obj, ctx);
          }
          case 'PUT': {
            if (!rm.includes('PUT') || !h.update) break;
            return render(def, ctx.baseUrl, await h.update(ctx, id, inputFor(registry, def, undefined, req.body)), ctx);
          }
          case 'DELETE': {
            if (!rm.includes('DELETE') || !h.delete) break;
            await h.delete(ctx, id);
            return reply.status(200).send('');
          }
          case 'POST': {
            const fn = action !== undefined ? h.actions?.[action] : undefined;
            if (!fn || !def.schema.resourceActions?.[action as string]) break;
            const out = await fn(ctx, id, inputFor(registry, def, action, req.body));
            if (out === undefined) return reply.status(200).send('');
            return isApiResource(out) ? out : render(def, ctx.baseUrl, out, ctx);
          }
        }
        return methodNotAllowed(req, reply);
      },
    });

    if (opts.websockets !== false && h.list) {
      const list = h.list;
      const stream = (req: FastifyRequest<{ Params: { period?: string } }>, socket: WsSocket): void => {
        const periodMs = req.params.period !== undefined ? parseGoDuration(req.params.period) : (opts.defaultStreamPeriodMs ?? 1000);
        if (periodMs === undefined) {
          socket.close(1008, `invalid period ${req.params.period}`);
          return;
        }
        runListStream(socket, periodMs, opts.keepAliveMs ?? 30_000, async (signal) => {
          const ctx = { ...makeContext(registry, req, undefined), signal };
          return collectionBody(def, ctx.baseUrl, await list(ctx), ctx);
        }, h.changes?.bind(h));
      };
      app.get(`/v1/ws/${seg}`, { websocket: true }, (socket, req) => stream(req as FastifyRequest<{ Params: { period?: string } }>, socket as unknown as WsSocket));
      app.get(`/v1/ws/:period/${seg}`, { websocket: true }, (socket, req) => stream(req as FastifyRequest<{ Params: { period?: string } }>, socket as unknown as WsSocket));
    }
  }
}

/** The part of a `ws` WebSocket the list stream uses. */
interface WsSocket {
  readonly readyState: number;
  send(data: Buffer, options: { binary: boolean }, cb?: (err?: Error) => void): void;
  ping(): void;
  close(code?: number, reason?: string): void;
  on(event: 'close' | 'error', listener: () => void): void;
}

/**
 * Sends the rendered list at once, then again whenever it changed, at most once per period; pings every
 * keepAliveMs. With a change feed, a change triggers a check (rate-limited by the period); without one it polls.
 */
function runListStream(
  socket: WsSocket,
  periodMs: number,
  keepAliveMs: number,
  renderList: (signal: AbortSignal) => Promise<Buffer>,
  changes: ((signal: AbortSignal) => AsyncIterable<unknown>) | undefined,
): void {
  const ac = new AbortController();
  let last: Buffer | undefined;
  let dirty = true;
  let running = false;
  let lastSent = 0;
  let timer: NodeJS.Timeout | undefined;
  const ping = setInterval(() => socket.readyState === 1 && socket.ping(), keepAliveMs);
  const stop = (): void => {
    ac.abort();
    clearInterval(ping);
    if (timer) clearTimeout(timer);
  };
  socket.on('close', stop);
  socket.on('error', stop);
  const schedule = (): void => {
    if (ac.signal.aborted || timer || running) return;
    const wait = Math.max(0, lastSent + periodMs - Date.now());
    timer = setTimeout(() => {
      timer = undefined;
      // tick() catches its own failures: the next change or poll retries.
      void tick();
    }, wait);
  };
  const tick = async (): Promise<void> => {
    if (ac.signal.aborted) return;
    running = true;
    try {
      dirty = false;
      const body = await renderList(ac.signal);
      if ((!last || (body !== last && !body.equals(last))) && socket.readyState === 1) {
        last = body;
        // a text frame, as Longhorn's list streams send
        socket.send(body, { binary: false });
      }
      lastSent = Date.now();
    } catch {
      // The next change or poll retries.
    } finally {
      running = false;
    }
    if (!changes || dirty) schedule();
  };
  // tick() catches its own failures: the next change or poll retries.
  void tick();
  if (changes) {
    // Runs until the socket closes; its body handles its own failures.
    void (async () => {
      try {
        for await (const _ of changes(ac.signal)) {
          dirty = true;
          schedule();
        }
      } catch {
        // The stream falls back to polling if the change feed fails.
        if (!ac.signal.aborted) {
          changes = undefined;
          schedule();
        }
      }
    })();
  }
}
