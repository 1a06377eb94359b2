import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import multipart from '@fastify/multipart';
import { createGzip } from 'node:zlib';
import { Readable } from 'node:stream';
import { isDiskPathError } from '@bis/disk-path';
import { SyncServiceError, errorMessage } from './errors.js';
import type { SyncService } from './sync-service.js';
import { SYNC_FILES_PATH, SyncFileAction, SyncFilesAction, decodeFileId } from './sync-api.js';
import type { DataEngine } from './syncing-file.js';

/**
 * `service`: the one service every request goes to; or `serviceOf`: the service of each request, for one set of routes
 * shared by the servers of several services (a data-source host: `@bis/data-source`'s `SharedInstanceServers`);
 * undefined when it is gone (404).
 */
export type SyncRoutesOptions = { service: SyncService } | { serviceOf: (req: FastifyRequest) => SyncService | undefined };

type Query = Record<string, string | undefined>;

function rawFileId(req: FastifyRequest): string {
  const rawPath = (req.raw.url ?? '').split('?')[0]!;
  const m = /^\/v1\/files\/([^/]+)/.exec(rawPath);
  if (!m) throw new SyncServiceError('missing file id', 400);
  return decodeFileId(m[1]!);
}

function str(q: Query, key: string): string {
  return q[key] ?? '';
}

function int(q: Query, key: string, required: boolean): number {
  const raw = q[key];
  if (raw === undefined || raw === '') {
    if (required) throw new SyncServiceError(`missing required parameter ${key}`);
    return 0;
  }
  if (!/^-?\d+$/.test(raw)) throw new SyncServiceError(`invalid parameter ${key}=${raw}: not an integer`);
  return Number(raw);
}

function dataEngine(q: Query): DataEngine {
  const v = q['data-engine'] ?? '';
  if (v === '' || v === 'v1') return 'v1';
  if (v === 'v2') return 'v2';
  throw new SyncServiceError(`invalid data engine ${v}`);
}

function credential(body: unknown): Record<string, string> {
  if (body === undefined || body === null || body === '') return {};
  if (typeof body !== 'object' || Array.isArray(body)) throw new SyncServiceError('invalid credential body: not a JSON object');
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(body as Record<string, unknown>)) {
    if (typeof v !== 'string') throw new SyncServiceError(`invalid credential body: value of ${k} is not a string`);
    out[k] = v;
  }
  return out;
}

async function sendError(reply: FastifyReply, err: unknown): Promise<void> {
  // a refused path (`@bis/disk-path` DiskPathError) is a 400 naming the parameter
  const status = err instanceof SyncServiceError || isDiskPathError(err) ? err.httpStatus : 500;
  await reply.code(status).type('text/plain; charset=utf-8').send(`${errorMessage(err)}\n`);
}

/** Longhorn's `/v1/files` routes as an encapsulated fastify plugin. */
export const syncRoutes: FastifyPluginAsync<SyncRoutesOptions> = async (app: FastifyInstance, opts) => {
  const serviceOf = 'service' in opts ? () => opts.service : opts.serviceOf;
  const svcOf = (req: FastifyRequest): SyncService => {
    const svc = serviceOf(req);
    if (!svc) throw new SyncServiceError('no sync service listens here any more', 404);
    return svc;
  };
  // every `{id}` is confined to the disk (`@bis/disk-path`) before anything is looked up, changed or removed
  const fileIdFromRequest = (req: FastifyRequest): Promise<string> => svcOf(req).confineFileId(rawFileId(req));
  await app.register(multipart, { limits: { fileSize: Number.MAX_SAFE_INTEGER, files: 16 } });
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, body, done) => {
    const text = String(body).trim();
    if (text === '') return done(null, undefined);
    try {
      done(null, JSON.parse(text));
    } catch (err) {
      done(new SyncServiceError(`invalid JSON body: ${errorMessage(err)}`, 400), undefined);
    }
  });
  app.addContentTypeParser('*', (_req, payload, done) => done(null, payload));

  app.get(SYNC_FILES_PATH, async (req, reply) => {
    try {
      return svcOf(req).list();
    } catch (err) {
      return sendError(reply, err);
    }
  });

  app.get(`${SYNC_FILES_PATH}/:id`, async (req, reply) => {
    try {
      return svcOf(req).get(await fileIdFromRequest(req));
    } catch (err) {
      return sendError(reply, err);
    }
  });

  app.delete(`${SYNC_FILES_PATH}/:id`, async (req, reply) => {
    try {
      await svcOf(req).delete(await fileIdFromRequest(req));
      return reply.code(200).send();
    } catch (err) {
      return sendError(reply, err);
    }
  });

  const download = async (req: FastifyRequest, reply: FastifyReply) => {
    try {
      const q = req.query as Query;
      const h = await svcOf(req).openDownload(await fileIdFromRequest(req));
      reply.header('Content-Type', 'application/octet-stream');
      if (q['forV2Creation'] === 'true') {
        reply.header('Content-Length', String(h.size));
        if (req.method === 'HEAD') return reply.send();
        return reply.send(h.open());
      }
      // Longhorn truncated the name at its first '-' (quirk §10-8): the whole backing-image name is used here.
      reply.header('Content-Disposition', `attachment; filename=${h.fileName}.gz`);
      if (req.method === 'HEAD') return reply.send();
      const gz = createGzip({ level: 1 });
      const src = h.open();
      src.on('error', (e) => gz.destroy(e));
      return reply.send(src.pipe(gz));
    } catch (err) {
      return sendError(reply, err);
    }
  };
  app.get(`${SYNC_FILES_PATH}/:id/download`, { exposeHeadRoute: false }, download);
  app.head(`${SYNC_FILES_PATH}/:id/download`, download);

  app.post(`${SYNC_FILES_PATH}/:id`, async (req, reply) => {
    try {
      const q = req.query as Query;
      const id = await fileIdFromRequest(req);
      switch (q['action']) {
        case SyncFileAction.Forget:
          await svcOf(req).forget(id);
          break;
        case SyncFileAction.SendToPeer:
          await svcOf(req).sendToPeer(id, str(q, 'to-address'));
          break;
        default:
          throw new SyncServiceError(`unknown action ${q['action'] ?? ''} for a file`, 400);
      }
      return reply.code(200).send();
    } catch (err) {
      return sendError(reply, err);
    }
  });

  app.post(SYNC_FILES_PATH, async (req, reply) => {
    try {
      const q = req.query as Query;
      const base = {
        filePath: str(q, 'file-path'),
        uuid: str(q, 'uuid'),
        diskUUID: str(q, 'disk-uuid'),
        expectedChecksum: str(q, 'expected-checksum'),
      };
      const svc = svcOf(req);
      switch (q['action']) {
        case SyncFilesAction.Fetch:
          await svc.fetch({
            ...base,
            filePath: str(q, 'dst-file-path'),
            srcFilePath: str(q, 'src-file-path'),
            size: int(q, 'size', true),
          });
          break;
        case SyncFilesAction.DownloadFromURL:
          await svc.downloadFromURL({ ...base, url: str(q, 'url'), dataEngine: dataEngine(q) });
          break;
        case SyncFilesAction.ReceiveFromPeer:
          await svc.receiveFromPeer({
            ...base,
            fileType: str(q, 'file-type'),
            size: int(q, 'size', true),
            port: int(q, 'port', true),
            dataEngine: dataEngine(q),
          });
          break;
        case SyncFilesAction.RestoreFromBackupURL:
          await svc.restoreFromBackupURL({
            ...base,
            backupUrl: str(q, 'backup-url'),
            concurrentLimit: int(q, 'concurrent-limit', true),
            credential: credential(req.body),
            dataEngine: dataEngine(q),
          });
          break;
        case SyncFilesAction.CloneFromBackingImage:
          await svc.cloneFromBackingImage({
            ...base,
            backingImage: str(q, 'backing-image'),
            backingImageUUID: str(q, 'backing-image-uuid'),
            encryption: str(q, 'encryption'),
            credential: credential(req.body),
            dataEngine: dataEngine(q),
          });
          break;
        case SyncFilesAction.Upload: {
          const size = int(q, 'size', true);
          const body = await uploadBody(req);
          await svc.upload({ ...base, size, body, dataEngine: dataEngine(q) });
          break;
        }
        default:
          throw new SyncServiceError(`unknown action ${q['action'] ?? ''}`, 400);
      }
      return reply.code(200).send();
    } catch (err) {
      return sendError(reply, err);
    }
  });
};

/**
 * The upload's bytes: the first multipart file part named `chunk` (parts before it are read and skipped, as Longhorn
 * does), or a raw body.
 */
async function uploadBody(req: FastifyRequest): Promise<Readable> {
  if (req.isMultipart()) {
    const files = req.files();
    for (;;) {
      const next = await files.next();
      if (next.done || !next.value) throw new SyncServiceError('no file part named chunk in the multipart upload');
      const part = next.value;
      if (part.fieldname === 'chunk') return part.file;
      part.file.resume();
    }
  }
  if (req.body instanceof Readable) return req.body;
  throw new SyncServiceError('no upload body');
}
