import http from 'node:http';
import type { Server, Socket } from 'node:net';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import { httpAuthHook, type InternalAuth } from '@bis/internal-auth';
import { buildSyncApp, lazySchemaCompilers } from '@bis/sync-service/server';
import type { SyncService } from '@bis/sync-service/service';
import type { DataSource } from './data-source.js';
import { dataSourceRoutes, type DataSourceRoutesOptions } from './routes.js';

/**
 * The fastify app of a data source's `/v1/file` routes, not listening: the routes of one data source, or of several
 * sharing it (`routes.dataSourceOf`). With `opts.auth.token` every request needs it; a refusal goes to `onRefused`.
 */
export async function buildDataSourceApp(
  routes: DataSourceRoutesOptions,
  opts: { auth?: InternalAuth; onRefused?: (req: FastifyRequest, reason: string) => void } = {},
): Promise<FastifyInstance> {
  const app = Fastify({ logger: false, forceCloseConnections: true, schemaController: lazySchemaCompilers() });
  app.addHook('onRequest', httpAuthHook(opts.auth, { ...(opts.onRefused ? { onRefused: (req, reason) => opts.onRefused?.(req as FastifyRequest, reason) } : {}) }));
  await app.register(dataSourceRoutes, routes);
  return app;
}

/** One server of one data source (its `/v1/file` or its sync routes). */
export interface InstanceServer {
  readonly server: http.Server;
  /** Stops listening and ends every connection (as fastify's `forceCloseConnections`). */
  close(): Promise<void>;
}

interface Target {
  dataSource?: DataSource;
  sync?: SyncService;
  log?: (line: string) => void;
}

/**
 * The servers of the data sources of one data-source host. Every data source keeps its own two ports (its `/v1/file`
 * API and its sync routes, as a data source pod has), but the fastify apps behind them are built once per host and
 * internal-auth setting, and each request finds its data source by the server that accepted its connection. Building
 * two fastify apps (routes, plugins, schema controller) per data source was about a third of a host's CPU at 1,000
 * images and most of a data source's start.
 */
export class SharedInstanceServers {
  readonly #apps = new Map<string, Promise<{ dataSource: FastifyInstance; sync: FastifyInstance }>>();
  readonly #targets = new WeakMap<Server, Target>();

  #targetOf(req: FastifyRequest): Target | undefined {
    const server = (req.raw.socket as Socket & { server?: Server }).server;
    return server ? this.#targets.get(server) : undefined;
  }

  #appsFor(auth: InternalAuth | undefined): Promise<{ dataSource: FastifyInstance; sync: FastifyInstance }> {
    const key = auth?.token ? `${auth.allowUnauthenticated ? 'open' : 'strict'}\0${auth.token}` : '';
    let apps = this.#apps.get(key);
    if (!apps) {
      apps = (async () => {
        const [dataSource, sync] = await Promise.all([
          buildDataSourceApp(
            { dataSourceOf: (req) => this.#targetOf(req)?.dataSource },
            { ...(auth ? { auth } : {}), onRefused: (req, reason) => this.#targetOf(req)?.log?.(`refused ${req.url}: ${reason}`) },
          ),
          buildSyncApp({ serviceOf: (req) => this.#targetOf(req)?.sync }, auth ? { auth } : {}),
        ]);
        await Promise.all([dataSource.ready(), sync.ready()]);
        return { dataSource, sync };
      })();
      apps.catch(() => this.#apps.delete(key));
      this.#apps.set(key, apps);
    }
    return apps;
  }

  /** Listens at `at` for the `/v1/file` API of `dataSource` (refusals logged to `log`). */
  async listenDataSource(dataSource: DataSource, at: { host: string; port: number }, auth: InternalAuth | undefined, log?: (line: string) => void): Promise<InstanceServer> {
    const { dataSource: app } = await this.#appsFor(auth);
    return this.#listen(app, { dataSource, ...(log ? { log } : {}) }, at);
  }

  /** Listens at `at` for the sync routes of `sync`. */
  async listenSync(sync: SyncService, at: { host: string; port: number }, auth: InternalAuth | undefined): Promise<InstanceServer> {
    const { sync: app } = await this.#appsFor(auth);
    return this.#listen(app, { sync }, at);
  }

  /** Closes the shared apps (after every instance server is closed). */
  async close(): Promise<void> {
    const all = [...this.#apps.values()];
    this.#apps.clear();
    for (const apps of await Promise.allSettled(all)) {
      if (apps.status === 'fulfilled') await Promise.all([apps.value.dataSource.close(), apps.value.sync.close()]);
    }
  }

  async #listen(app: FastifyInstance, target: Target, at: { host: string; port: number }): Promise<InstanceServer> {
    const server = http.createServer((req, res) => app.routing(req, res));
    // fastify's server defaults: no limit on a request's duration (an upload may take hours), idle keep-alive 72 s
    server.requestTimeout = 0;
    server.keepAliveTimeout = 72_000;
    this.#targets.set(server, target);
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(at.port, at.host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    return {
      server,
      close: () =>
        new Promise<void>((resolve) => {
          server.close(() => resolve());
          server.closeAllConnections();
        }),
    };
  }
}
