import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError, parseJsonText, type ApiRegistry } from '@bis/rest-api';
import { BACKING_IMAGE_INPUT_SCHEMAS, backingImageResource, backupBackingImageResource } from './backing-image-resources.js';
import { BackingImageService } from './backing-images.js';
import { BackupTargetService, backupTargetResource } from './backup-targets.js';
import type { BackingImageApiDeps } from './deps.js';
import { downloadErrorBody, handleDownload } from './download-proxy.js';
import { NODE_SCHEMAS, NodeService, nodeResource } from './nodes.js';
import { ReplicaService, replicaResource } from './replicas.js';
import { UploadProxy } from './upload-proxy.js';

/** The services behind the registered resources (for the composition root and tests). */
export interface BackingImageApi {
  deps: BackingImageApiDeps;
  backingImages: BackingImageService;
  uploads: UploadProxy;
  nodes: NodeService;
  backupTargets: BackupTargetService;
  replicas: ReplicaService;
}

/**
 * Registers the resources `backingImage`, `backupBackingImage`, `node`, `backupTarget`, `replica` and their input
 * types on `registry`. Serve them with `restApiPlugin` (from `@bis/rest-api`), and register
 * {@link backingImageHttpPlugin} on the same fastify instance BEFORE `restApiPlugin` (upload bodies and the
 * download route).
 */
export function registerBackingImageResources(registry: ApiRegistry, deps: BackingImageApiDeps): BackingImageApi {
  const { store, namespace } = deps;
  const backingImages = new BackingImageService(deps);
  const uploads = new UploadProxy(backingImages, deps);
  const nodes = new NodeService(store, namespace);
  const backupTargets = new BackupTargetService(store, namespace);
  const replicas = new ReplicaService(store, namespace);
  for (const s of [...BACKING_IMAGE_INPUT_SCHEMAS, ...NODE_SCHEMAS]) registry.addType(s);
  registry.addResource(backingImageResource(backingImages, uploads, store, namespace));
  registry.addResource(backupBackingImageResource(backingImages, store, namespace));
  registry.addResource(nodeResource(nodes, store, namespace));
  registry.addResource(backupTargetResource(backupTargets, () => backingImages.listBackups(), store, namespace));
  registry.addResource(replicaResource(replicas, store, namespace));
  return { deps, backingImages, uploads, nodes, backupTargets, replicas };
}

export interface BackingImageHttpPluginOptions {
  api: BackingImageApi;
}

const UPLOAD_ACTIONS = /[?&]action=(upload|uploadPart)(&|$)/;

/**
 * Upload bodies and the download route, on the instance it is registered on (not encapsulated):
 * - `multipart/form-data` and `application/octet-stream` bodies are left unread for the upload proxy, which streams
 *   them to the data source; on any other URL a multipart body is refused with 415 and an octet-stream body is read
 *   as JSON, like every other body (Longhorn decodes request bodies as JSON whatever their Content-Type);
 * - `GET /v1/backingimages/<name>/download`.
 */
export const backingImageHttpPlugin: FastifyPluginAsync<BackingImageHttpPluginOptions> = async (app: FastifyInstance, opts) => {
  const { api } = opts;
  const isUpload = (req: FastifyRequest): boolean => req.method === 'POST' && /^\/v1\/backingimages\/[^/?]+\?/.test(req.url) && UPLOAD_ACTIONS.test(req.url);
  app.addContentTypeParser('multipart/form-data', (req, _payload, done) => {
    if (isUpload(req)) return done(null, undefined);
    done(new ApiError(415, `content type ${req.headers['content-type'] ?? ''} is only accepted by the upload actions of /v1/backingimages/<name>`), undefined);
  });
  app.addContentTypeParser('application/octet-stream', (req, payload, done) => {
    if (isUpload(req)) return done(null, undefined);
    readBounded(payload, app.initialConfig.bodyLimit ?? 1024 * 1024)
      .then((text) => done(null, parseJsonText(text)))
      .catch((err: Error) => done(err, undefined));
  });
  app.get('/v1/backingimages/:id/download', async (req: FastifyRequest<{ Params: { id: string }; Querystring: Record<string, string | undefined> }>, reply: FastifyReply) => {
    try {
      await handleDownload(api.backingImages, api.deps, req, reply);
    } catch (err) {
      const body = downloadErrorBody(err, req);
      if (reply.sent || reply.raw.headersSent) return;
      await reply.status(body.status).type('application/json').send(body);
    }
  });
};
(backingImageHttpPlugin as unknown as Record<symbol, boolean>)[Symbol.for('skip-override')] = true;

/** Reads a request body as UTF-8 text, refusing (413) one longer than `limit` bytes. */
async function readBounded(payload: NodeJS.ReadableStream, limit: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of payload) {
    const b = typeof chunk === 'string' ? Buffer.from(chunk) : (chunk as Buffer);
    size += b.length;
    if (size > limit) throw new ApiError(413, `request body is larger than ${limit} bytes`);
    chunks.push(b);
  }
  return Buffer.concat(chunks).toString('utf8');
}
