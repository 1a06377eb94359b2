import { httpAuthHook, type InternalAuth } from '@bis/internal-auth';
import Fastify, { type FastifyInstance } from 'fastify';
import { lazySchemaCompilers } from './fastify-schema-compilers.js';
import { syncRoutes } from './routes.js';
import type { SyncService } from './sync-service.js';

export { lazySchemaCompilers } from './fastify-schema-compilers.js';

/**
 * A fastify server with only the sync routes (plus `GET /` for startup probes, open to any caller). With
 * `opts.auth.token`, every other request without `authorization: Bearer <token>` is answered 401.
 */
export async function startSyncServer(
  service: SyncService,
  listen: { host: string; port: number },
  opts: { auth?: InternalAuth } = {},
): Promise<FastifyInstance> {
  const app = Fastify({ logger: false, bodyLimit: 1 << 20, forceCloseConnections: true, schemaController: lazySchemaCompilers() });
  app.addHook('onRequest', httpAuthHook(opts.auth, { openPaths: ['/'] }));
  app.get('/', async () => ({}));
  await app.register(syncRoutes, { service });
  await app.listen({ host: listen.host, port: listen.port });
  return app;
}
