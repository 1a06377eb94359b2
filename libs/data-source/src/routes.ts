import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import multipart from '@fastify/multipart';
import { Readable } from 'node:stream';
// the contract alone: the data source process does not load the HTTP client (got)
import { DATA_SOURCE_FILE_PATH, DATA_SOURCE_MAX_WAIT_SECONDS, DATA_SOURCE_WAITS_HEADER, DataSourceAction } from '@bis/data-source-api/contract';
import { FILE_STATES, type FileState } from '@bis/state-machine';
import { DataSource, DataSourceError } from './data-source.js';

/**
 * `dataSource`: the one data source every request goes to; or `dataSourceOf`: the data source of each request, for one
 * set of routes shared by the servers of several data sources (a data-source host: `SharedInstanceServers`);
 * undefined when it is gone (404).
 */
export type DataSourceRoutesOptions = { dataSource: DataSource } | { dataSourceOf: (req: FastifyRequest) => DataSource | undefined };

function statusOf(err: unknown): number {
  // DataSourceError carries statusCode; a refused path (`@bis/disk-path` DiskPathError) carries httpStatus 400
  const e = err as { statusCode?: unknown; httpStatus?: unknown };
  const code = e.statusCode ?? e.httpStatus;
  return typeof code === 'number' && code >= 400 && code < 600 ? code : 500;
}

function sendError(reply: FastifyReply, err: unknown): FastifyReply {
  const msg = err instanceof Error ? err.message : String(err);
  const status = statusOf(err);
  // A refused upload's body may still be on its way: close the connection instead of reading it.
  if (status === 413) reply.header('connection', 'close');
  return reply.code(status).type('text/plain; charset=utf-8').send(`${msg}\n`);
}

function intParam(q: Record<string, string | undefined>, key: string): number {
  const v = q[key];
  if (v === undefined || !/^\d+$/.test(v)) throw new DataSourceError(`invalid or missing query parameter ${key}: ${v ?? '(none)'}`, 400);
  return Number(v);
}

async function uploadBody(req: FastifyRequest): Promise<Readable> {
  if (req.isMultipart()) {
    // Longhorn: parts before the first part named `chunk` are skipped; only that part's bytes are used.
    for await (const part of req.parts()) {
      if (part.type === 'file' && part.fieldname === 'chunk') return part.file;
      if (part.type === 'file') part.file.resume();
    }
    throw new DataSourceError('no multipart part named chunk in the upload', 400);
  }
  if (req.body instanceof Readable) return req.body;
  throw new DataSourceError('no upload body', 400);
}

/**
 * Longhorn's data-source API: `GET /v1/file`, `POST /v1/file?action=upload|transfer`, plus the resumable upload
 * (`GET /v1/file?action=uploadOffset`, `POST /v1/file?action=uploadPart&size=&offset=`) and `DELETE /v1/file`.
 */
export const dataSourceRoutes: FastifyPluginAsync<DataSourceRoutesOptions> = async (app: FastifyInstance, opts) => {
  const dataSourceOf = 'dataSource' in opts ? () => opts.dataSource : opts.dataSourceOf;
  const dsOf = (req: FastifyRequest): DataSource => {
    const ds = dataSourceOf(req);
    if (!ds) throw new DataSourceError('no data source listens here any more', 404);
    return ds;
  };
  await app.register(multipart, { limits: { fileSize: Number.MAX_SAFE_INTEGER, files: 1, parts: 100 } });
  app.addContentTypeParser('application/octet-stream', (_req, payload, done) => done(null, payload));

  app.get(DATA_SOURCE_FILE_PATH, async (req, reply) => {
    try {
      const q = req.query as Record<string, string | undefined>;
      const ds = dsOf(req);
      if (q['action'] === DataSourceAction.UploadOffset) return reply.send(ds.uploadOffset());
      const waitWhile = q['waitWhile'];
      if (waitWhile !== undefined) {
        const wait = Number(q['wait'] ?? 0);
        if (!(FILE_STATES as readonly string[]).includes(waitWhile) || !Number.isFinite(wait) || wait < 0 || wait > DATA_SOURCE_MAX_WAIT_SECONDS) {
          throw new DataSourceError(`waitWhile must be a file state and wait 0 to ${DATA_SOURCE_MAX_WAIT_SECONDS} seconds`, 400);
        }
        // the wait ends with the state's change, the wait's time, or the caller going away
        const ac = new AbortController();
        const timer = setTimeout(() => ac.abort(), wait * 1000);
        const gone = (): void => ac.abort();
        reply.raw.once('close', gone);
        try {
          await ds.whenStateIsNot(waitWhile as FileState, ac.signal);
        } finally {
          clearTimeout(timer);
          reply.raw.off('close', gone);
        }
        reply.header(DATA_SOURCE_WAITS_HEADER, 'state');
      }
      return reply.type('application/json').send(ds.info());
    } catch (e) {
      return sendError(reply, e);
    }
  });

  app.post(DATA_SOURCE_FILE_PATH, async (req, reply) => {
    const q = req.query as Record<string, string | undefined>;
    try {
      const ds = dsOf(req);
      switch (q['action']) {
        case DataSourceAction.Upload: {
          const size = intParam(q, 'size');
          await ds.checkDeclaredSize(size);
          await ds.upload(size, await uploadBody(req));
          return reply.code(200).send();
        }
        case DataSourceAction.UploadPart: {
          const size = intParam(q, 'size');
          const offset = intParam(q, 'offset');
          if (!(req.body instanceof Readable)) throw new DataSourceError('uploadPart needs an application/octet-stream body', 400);
          return reply.send(await ds.uploadPart(size, offset, req.body));
        }
        case DataSourceAction.Transfer:
          await ds.transfer();
          return reply.code(200).send();
        default:
          throw new DataSourceError(`unknown action ${q['action'] ?? ''}`, 400);
      }
    } catch (e) {
      return sendError(reply, e);
    }
  });

  app.delete(DATA_SOURCE_FILE_PATH, async (req, reply) => {
    try {
      await dsOf(req).close();
      return reply.code(200).send();
    } catch (e) {
      return sendError(reply, e);
    }
  });
};
