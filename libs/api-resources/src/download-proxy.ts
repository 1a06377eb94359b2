import { authHeaders } from '@bis/internal-auth';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { pipeline } from 'node:stream/promises';
import { BackingImageManagerKind, describeImageCopies, diskNamesByUUID, SettingName } from '@bis/controllers';
import { LabelKey } from '@bis/crd-types';
import { ApiError, baseUrlOf, errorBody } from '@bis/rest-api';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { BackingImageService } from './backing-images.js';
import type { BackingImageApiDeps } from './deps.js';
import { ByteCounter, splitAddress } from './upload-proxy.js';

/** Where a download of an image is served from: the sync service of a ready copy's manager (§2.6). */
export interface DownloadSource {
  /** `host:port` of the manager's sync service. */
  syncAddress: string;
  /** `/v1/files/<escaped file path>/download` */
  path: string;
}

/**
 * Resolves the download source (§2.6): the first `ready` disk of `status.diskFileStatusMap`, the manager on that disk
 * running the default manager image, and its `PrepareDownload`.
 */
export async function resolveDownload(service: BackingImageService, deps: BackingImageApiDeps, name: string): Promise<DownloadSource> {
  const bi = await service.mustGet(name);
  const disk = Object.entries(bi.status?.diskFileStatusMap ?? {}).find(([, s]) => s.state === 'ready')?.[0];
  if (!disk) throw new ApiError(500, `backing image ${name} has no ready copy to download yet (copies: ${await describeImageCopies(deps.store, deps.namespace, bi)})`);
  const fail = async (): Promise<ApiError> => {
    const where = (await diskNamesByUUID(deps.store, deps.namespace)).get(disk) ?? `disk ${disk}`;
    return new ApiError(500, `no backing image manager is running on ${where}, which holds the ready copy of backing image ${name}; check that disk (bictl node ls) and its manager's state and log`);
  };
  const image = await deps.settings.get(SettingName.DefaultBackingImageManagerImage);
  const { items } = await deps.store.list(BackingImageManagerKind, { namespace: deps.namespace, labelSelector: { matchLabels: { [LabelKey.DiskUUID]: disk } } });
  const bim = items.find((m) => m.spec?.image === image && m.spec?.diskUUID === disk && !m.metadata.deletionTimestamp);
  const address = bim ? deps.endpoints.managerAddress(bim) : undefined;
  if (!bim || !address) throw await fail();
  let prepared: { srcFilePath: string; address: string };
  try {
    prepared = await deps.endpoints.managerClient(address).prepareDownload(name, bi.status?.uuid ?? '');
  } catch (err) {
    const details = (err as { details?: string }).details ?? (err as Error).message;
    throw new ApiError(500, `failed to prepare the download of backing image ${name} on disk ${disk}: ${details}`, { cause: err });
  }
  if (!prepared.address) throw new ApiError(500, `the manager of disk ${disk} did not report its sync service address`);
  return { syncAddress: prepared.address, path: `/v1/files/${encodeURIComponent(prepared.srcFilePath)}/download` };
}

const PASSED_HEADERS = ['content-type', 'content-length', 'content-disposition', 'content-encoding'] as const;

/**
 * `GET /v1/backingimages/<name>/download`: streams the file from the sync service of a ready copy. By default the
 * sync service sends it gzip-compressed (`<name>.gz`, no Content-Length), as Longhorn's UI download; with `?raw=true`
 * (or Longhorn's `forV2Creation=true`) the raw bytes with a Content-Length.
 */
export async function handleDownload(
  service: BackingImageService,
  deps: BackingImageApiDeps,
  req: FastifyRequest<{ Params: { id: string }; Querystring: Record<string, string | undefined> }>,
  reply: FastifyReply,
): Promise<void> {
  const name = req.params.id;
  const source = await resolveDownload(service, deps, name);
  const raw = req.query['raw'] === 'true' || req.query['forV2Creation'] === 'true';
  const [host, port] = splitAddress(source.syncAddress);
  const abort = new AbortController();
  const onClose = (): void => abort.abort(new Error('the client went away during the download'));
  reply.raw.once('close', onClose);
  const upstream = await new Promise<IncomingMessage>((resolve, reject) => {
    const r = httpRequest({ host, port, method: 'GET', path: `${source.path}${raw ? '?forV2Creation=true' : ''}`, headers: authHeaders(deps.internalToken), signal: abort.signal }, resolve);
    r.on('error', reject);
    r.end();
  }).catch((err: Error) => {
    reply.raw.off('close', onClose);
    throw new ApiError(500, `cannot reach the sync service ${source.syncAddress} for the download of backing image ${name}: ${err.message}`, { cause: err });
  });
  if (upstream.statusCode !== 200) {
    reply.raw.off('close', onClose);
    const chunks: Buffer[] = [];
    for await (const c of upstream) chunks.push(c as Buffer);
    throw new ApiError(500, `download of backing image ${name} failed: the sync service answered ${upstream.statusCode}: ${Buffer.concat(chunks).toString('utf8').trim().slice(0, 500)}`);
  }
  const counter = new ByteCounter();
  deps.observer?.transferStarted('download', name);
  reply.hijack();
  const res = reply.raw;
  const headers: Record<string, string> = { 'x-api-schemas': `${baseUrlOf(req)}/v1/schemas` };
  for (const h of PASSED_HEADERS) {
    const v = upstream.headers[h];
    if (typeof v === 'string') headers[h] = v;
  }
  res.writeHead(200, headers);
  try {
    await pipeline(upstream, counter, res);
    deps.observer?.transferFinished('download', name, 'succeeded', counter.bytes);
  } catch (err) {
    deps.observer?.transferFinished('download', name, abort.signal.aborted ? 'cancelled' : 'failed', counter.bytes);
    req.log.warn({ err }, `download of backing image ${name} ended early`);
    res.destroy();
  } finally {
    reply.raw.off('close', onClose);
  }
}

/** A cattle error for a failure before the download started (used by the route). */
export function downloadErrorBody(err: unknown, req: FastifyRequest): ReturnType<typeof errorBody> {
  return errorBody(err, `${baseUrlOf(req)}${req.url}`);
}
