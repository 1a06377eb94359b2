import http from 'node:http';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import {
  EmbeddedDatastore,
  GoneError,
  InvalidError,
  StatusError,
  groupOf,
  type DeleteOptions,
  type KubeObject,
  type ResourceKind,
} from '@bis/datastore';
import type { ApiVerb } from '../api-access.js';

/**
 * An in-process Kubernetes API server double for tests: real HTTP on 127.0.0.1, the Kubernetes REST paths, JSON
 * `Status` errors and the watch wire format (one JSON event per line, ERROR event with a 410 `Expired` Status for a
 * compacted resourceVersion, BOOKMARK events when `allowWatchBookmarks=true`). Object semantics (resourceVersion,
 * 409 Conflict, status subresource, finalizers, deletionTimestamp, ownerReference garbage collection) come from the
 * embedded datastore, which implements the Kubernetes rules; on top of it the double enforces what the API server
 * adds at the HTTP layer: bearer authentication, path/body namespace and name agreement, and the custom-resource rule
 * that an update must carry metadata.resourceVersion.
 */
export interface KubeApiDoubleOptions {
  kinds: readonly ResourceKind[];
  token?: string;
  /** Server-side bookmark interval for watches that allow bookmarks (the real API server uses about a minute). */
  bookmarkIntervalMs?: number;
  /** Watch history kept; smaller values make 410 Gone easy to provoke. */
  historyLimit?: number;
}

export interface RecordedCall {
  verb: ApiVerb;
  group: string;
  /** Plural, with the subresource: `pods/log`, `backingimages/status`. */
  resource: string;
  namespace?: string;
  name?: string;
}

export class KubeApiDouble {
  readonly calls: RecordedCall[] = [];
  readonly podLogs = new Map<string, string>();
  private readonly kinds = new Map<string, ResourceKind>();
  private readonly watches = new Set<http.ServerResponse>();
  private readonly watchAborts = new Set<AbortController>();

  private constructor(
    readonly store: EmbeddedDatastore,
    private readonly server: http.Server,
    private readonly dir: string,
    readonly token: string,
    private readonly bookmarkIntervalMs: number,
  ) {}

  static async start(opts: KubeApiDoubleOptions): Promise<KubeApiDouble> {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kube-api-double-'));
    const store = await EmbeddedDatastore.open({ dataDir: dir, historyLimit: opts.historyLimit ?? 1000 });
    const server = http.createServer();
    const dbl = new KubeApiDouble(store, server, dir, opts.token ?? 'test-token', opts.bookmarkIntervalMs ?? 60_000);
    for (const k of opts.kinds) dbl.kinds.set(`${groupOf(k.apiVersion)}|${k.plural}`, k);
    server.on('request', (req, res) => {
      dbl.handle(req, res).catch((err: unknown) => dbl.sendError(res, err));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return dbl;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** Ends every open watch as an API server restart would (clean end of the HTTP response). */
  dropWatches(): void {
    for (const a of this.watchAborts) a.abort();
    for (const r of this.watches) r.end();
  }

  async stop(): Promise<void> {
    this.dropWatches();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    await this.store.close();
    await fsp.rm(this.dir, { recursive: true, force: true });
  }

  private sendError(res: http.ServerResponse, err: unknown): void {
    const st = err instanceof StatusError ? err.toStatus() : { apiVersion: 'v1', kind: 'Status', status: 'Failure', message: String(err), reason: 'InternalError', code: 500 };
    if (res.headersSent) {
      res.end();
      return;
    }
    res.writeHead(st.code, { 'content-type': 'application/json' });
    res.end(JSON.stringify(st));
  }

  private send(res: http.ServerResponse, code: number, body: unknown): void {
    res.writeHead(code, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  }

  private async body(req: http.IncomingMessage): Promise<Record<string, unknown> | undefined> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const text = Buffer.concat(chunks).toString('utf8');
    if (!text) return undefined;
    try {
      return JSON.parse(text) as Record<string, unknown>;
    } catch {
      throw new StatusError('BadRequest', 400, 'request body is not valid JSON');
    }
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    if (req.headers.authorization !== `Bearer ${this.token}`) {
      this.send(res, 401, { apiVersion: 'v1', kind: 'Status', status: 'Failure', message: 'Unauthorized', reason: 'Unauthorized', code: 401 });
      return;
    }
    const url = new URL(req.url ?? '/', 'http://x');
    const parts = url.pathname.split('/').filter(Boolean).map(decodeURIComponent);
    let group: string;
    let rest: string[];
    if (parts[0] === 'api' && parts[1] === 'v1') {
      group = '';
      rest = parts.slice(2);
    } else if (parts[0] === 'apis' && parts.length >= 3) {
      group = parts[1];
      rest = parts.slice(3);
    } else throw new StatusError('NotFound', 404, `the server could not find the requested resource (${url.pathname})`);
    let namespace: string | undefined;
    if (rest[0] === 'namespaces' && rest.length >= 3) {
      namespace = rest[1];
      rest = rest.slice(2);
    }
    const [plural, name, sub] = rest;
    const kind = this.kinds.get(`${group}|${plural}`);
    if (!kind || rest.length > 3) throw new StatusError('NotFound', 404, `the server could not find the requested resource (${url.pathname})`);
    if (kind.namespaced !== (namespace !== undefined) && name !== undefined) {
      throw new StatusError('NotFound', 404, `the server could not find the requested resource (${url.pathname})`);
    }
    const resource = sub ? `${plural}/${sub}` : plural;
    const method = req.method ?? 'GET';
    const record = (verb: ApiVerb): void => {
      this.calls.push({ verb, group, resource, ...(namespace ? { namespace } : {}), ...(name ? { name } : {}) });
    };

    if (sub === 'log') {
      if (method !== 'GET' || plural !== 'pods') throw new StatusError('BadRequest', 400, 'only GET pods/log is served');
      record('get');
      await this.store.get(kind, name, namespace);
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(this.podLogs.get(`${namespace}/${name}`) ?? '');
      return;
    }
    if (sub !== undefined && sub !== 'status') throw new StatusError('NotFound', 404, `no subresource ${sub}`);

    if (name === undefined) {
      if (method === 'GET' && url.searchParams.get('watch') === 'true') {
        record('watch');
        await this.watch(kind, namespace, url.searchParams, res);
        return;
      }
      if (method === 'GET') {
        record('list');
        const r = await this.store.list(kind, { namespace, labelSelector: url.searchParams.get('labelSelector') ?? undefined });
        this.send(res, 200, { apiVersion: kind.apiVersion, kind: `${kind.kind}List`, metadata: { resourceVersion: r.resourceVersion }, items: r.items });
        return;
      }
      if (method === 'POST') {
        record('create');
        const obj = ((await this.body(req)) ?? {}) as unknown as KubeObject;
        obj.metadata = obj.metadata ?? ({ name: '' } as KubeObject['metadata']);
        if (namespace !== undefined) {
          if (obj.metadata.namespace && obj.metadata.namespace !== namespace) {
            throw new StatusError('BadRequest', 400, 'the namespace of the provided object does not match the namespace sent on the request');
          }
          obj.metadata.namespace = namespace;
        }
        this.send(res, 201, await this.store.create(kind, obj));
        return;
      }
      throw new StatusError('BadRequest', 405, `method ${method} not allowed on a collection`);
    }

    if (method === 'GET') {
      record('get');
      this.send(res, 200, await this.store.get(kind, name, namespace));
      return;
    }
    if (method === 'PUT') {
      record('update');
      const obj = ((await this.body(req)) ?? {}) as unknown as KubeObject;
      const m = obj.metadata ?? ({ name: '' } as KubeObject['metadata']);
      if (m.name !== name) throw new StatusError('BadRequest', 400, `the name of the object (${m.name}) does not match the name on the URL (${name})`);
      if (namespace !== undefined && m.namespace && m.namespace !== namespace) {
        throw new StatusError('BadRequest', 400, 'the namespace of the provided object does not match the namespace sent on the request');
      }
      if (namespace !== undefined) m.namespace = namespace;
      if (group !== '' && !m.resourceVersion) {
        throw new InvalidError(kind, name, [{ field: 'metadata.resourceVersion', message: 'Invalid value: 0x0: must be specified for an update' }]);
      }
      const out = sub === 'status' ? await this.store.updateStatus(kind, obj) : await this.store.update(kind, obj);
      this.send(res, 200, out);
      return;
    }
    if (method === 'DELETE') {
      if (sub) throw new StatusError('BadRequest', 405, 'cannot delete a subresource');
      record('delete');
      const body = (await this.body(req)) as (DeleteOptions & { kind?: string }) | undefined;
      const policy = (body?.propagationPolicy ?? url.searchParams.get('propagationPolicy') ?? undefined) as DeleteOptions['propagationPolicy'];
      const out = await this.store.delete(kind, name, namespace, { propagationPolicy: policy, preconditions: body?.preconditions });
      this.send(res, 200, out);
      return;
    }
    throw new StatusError('BadRequest', 405, `method ${method} not supported by the test API server`);
  }

  private async watch(kind: ResourceKind, namespace: string | undefined, q: URLSearchParams, res: http.ServerResponse): Promise<void> {
    const ac = new AbortController();
    this.watchAborts.add(ac);
    const timeout = q.get('timeoutSeconds');
    const timer = timeout ? setTimeout(() => ac.abort(), Number(timeout) * 1000) : undefined;
    res.on('close', () => ac.abort());
    const rvParam = q.get('resourceVersion') ?? undefined;
    const it = this.store
      .watch(kind, {
        namespace,
        labelSelector: q.get('labelSelector') ?? undefined,
        resourceVersion: rvParam,
        bookmarkIntervalMs: q.get('allowWatchBookmarks') === 'true' ? this.bookmarkIntervalMs : undefined,
        signal: ac.signal,
      })[Symbol.asyncIterator]();
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    this.watches.add(res);
    try {
      let r = await it.next();
      while (!r.done && !ac.signal.aborted) {
        res.write(JSON.stringify(r.value) + '\n');
        r = await it.next();
      }
    } catch (err) {
      // Kubernetes reports a compacted resourceVersion as one ERROR event with a 410 "Expired" Status.
      if (err instanceof GoneError) res.write(JSON.stringify({ type: 'ERROR', object: { ...err.toStatus(), reason: 'Expired' } }) + '\n');
      else if (err instanceof StatusError) res.write(JSON.stringify({ type: 'ERROR', object: err.toStatus() }) + '\n');
    } finally {
      clearTimeout(timer);
      this.watches.delete(res);
      this.watchAborts.delete(ac);
      void it.return?.(undefined);
      res.end();
    }
  }
}
