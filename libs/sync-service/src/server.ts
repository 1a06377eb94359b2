import { httpAuthHook, type InternalAuth } from '@bis/internal-auth';
import Fastify, { type FastifyInstance } from 'fastify';
import { PATH_MAX_LENGTH } from '@bis/disk-path';
import { lazySchemaCompilers } from './fastify-schema-compilers.js';
import { syncRoutes, type SyncRoutesOptions } from './routes.js';
import type { SyncService } from './sync-service.js';

export { lazySchemaCompilers } from './fastify-schema-compilers.js';

/**
 * The fastify app of the sync routes (plus `GET /` for startup probes, open to any caller), not listening: the routes of
 * one service, or of several sharing it (`routes.serviceOf`, `@bis/data-source`'s `SharedInstanceServers`). With
 * `opts.auth.token`, every other request without `authorization: Bearer <token>` is answered 401.
 */
export async function buildSyncApp(routes: SyncRoutesOptions, opts: { auth?: InternalAuth } = {}): Promise<FastifyInstance> {
  // A `{id}` is a whole percent-encoded file path: fastify's default limit (100 characters) answered 414 to ids of
  // legitimate paths under a long disk path; ids up to PATH_MAX (encoded) reach the routes, which confine them.
  const app = Fastify({
    logger: false,
    bodyLimit: 1 << 20,
    forceCloseConnections: true,
    routerOptions: { maxParamLength: 3 * PATH_MAX_LENGTH },
    schemaController: lazySchemaCompilers(),
  });
  app.addHook('onRequest', httpAuthHook(opts.auth, { openPaths: ['/'] }));
  app.get('/', async () => ({}));
  await app.register(syncRoutes, routes);
  return app;
}

/** {@link buildSyncApp} for one service, listening at `listen`. */
export async function startSyncServer(
  service: SyncService,
  listen: { host: string; port: number },
  opts: { auth?: InternalAuth } = {},
): Promise<FastifyInstance> {
  const app = await buildSyncApp({ service }, opts);
  await app.listen({ host: listen.host, port: listen.port });
  return app;
}
