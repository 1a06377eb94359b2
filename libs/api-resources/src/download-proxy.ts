import { pipeline } from 'node:stream/promises';
import { SyncClient, SyncClientError, type SyncDownload } from '@bis/sync-service';
import { BackingImageManagerKind, describeImageCopies, diskNamesByUUID, SettingName } from '@bis/controllers';
import { LabelKey } from '@bis/crd-types';
import { ApiError, baseUrlOf, errorBody } from '@bis/rest-api';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { BackingImageService } from './backing-images.js';
import type { BackingImageApiDeps } from './deps.js';
import { ByteCounter } from './upload-proxy.js';

/** Where a download of an image is served from: the sync service of a ready copy's manager (§2.6). */
export interface DownloadSource {
  /** `host:port` of the manager's sync service. */
  syncAddress: string;
  /** The file's path on the manager's disk. */
  srcFilePath: string;
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
  return { syncAddress: prepared.address, srcFilePath: prepared.srcFilePath };
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
  const abort = new AbortController();
  const onClose = (): void => abort.abort(new Error('the client went away during the download'));
  reply.raw.once('close', onClose);
  const sync = new SyncClient(source.syncAddress, { token: deps.internalToken });
  let upstream: SyncDownload;
  try {
    upstream = await sync.download(source.srcFilePath, { raw, signal: abort.signal });
  } catch (err) {
    reply.raw.off('close', onClose);
    sync.close();
    if (err instanceof SyncClientError) {
      throw new ApiError(500, `download of backing image ${name} failed: the sync service answered ${err.statusCode}: ${err.body.trim().slice(0, 500)}`);
    }
    throw new ApiError(500, `cannot reach the sync service ${source.syncAddress} for the download of backing image ${name}: ${(err as Error).message}`, { cause: err });
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
    await pipeline(upstream.body, counter, res);
    deps.observer?.transferFinished('download', name, 'succeeded', counter.bytes);
  } catch (err) {
    deps.observer?.transferFinished('download', name, abort.signal.aborted ? 'cancelled' : 'failed', counter.bytes);
    req.log.warn({ err }, `download of backing image ${name} ended early`);
    res.destroy();
  } finally {
    reply.raw.off('close', onClose);
    sync.close();
  }
}

/** A cattle error for a failure before the download started (used by the route). */
export function downloadErrorBody(err: unknown, req: FastifyRequest): ReturnType<typeof errorBody> {
  return errorBody(err, `${baseUrlOf(req)}${req.url}`);
}
