import type { IncomingHttpHeaders } from 'node:http';
import { Transform } from 'node:stream';
import { DataSourceClient, DataSourceHttpError, parseUploadProgress, type DataSourceAnswer } from '@bis/data-source-api';
import { SettingName, type StoredBIDS } from '@bis/controllers';
import { ApiError, type ApiContext } from '@bis/rest-api';
import type { BackingImageService } from './backing-images.js';
import type { BackingImageApiDeps } from './deps.js';
import { refused } from './errors.js';

/** Counts the bytes flowing through; with `max`, fails (with `tooMany()`) once more than `max` bytes came. */
export class ByteCounter extends Transform {
  bytes = 0;
  constructor(
    private readonly max = Infinity,
    private readonly tooMany: () => Error = () => new Error('too many bytes'),
  ) {
    super();
  }
  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null, data?: Buffer) => void): void {
    this.bytes += chunk.length;
    if (this.bytes > this.max) cb(this.tooMany());
    else cb(null, chunk);
  }
}

/** Room for a multipart body's framing (boundaries, part headers, earlier skipped fields) beyond its declared size. */
export const MULTIPART_SLACK_BYTES = 1 << 20;

/** Forwards requests to the copy of the request's body headers that matter for the data source. */
function bodyHeaders(h: IncomingHttpHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  if (h['content-type']) out['content-type'] = h['content-type'];
  if (h['content-length']) out['content-length'] = h['content-length'];
  else out['transfer-encoding'] = 'chunked';
  return out;
}

const UPLOADING_STATES = new Set(['pending', 'starting', 'in-progress']);

/**
 * The upload proxy (§2.6): the request body is streamed to the data source of the image (`/v1/file`), keeping the
 * original query (`size`, `offset`). Only while the data source waits for the upload (`pending`) for the whole
 * upload; the resumable-upload parts are accepted while the upload is under way.
 */
export class UploadProxy {
  constructor(
    private readonly service: BackingImageService,
    private readonly deps: BackingImageApiDeps,
  ) {}

  private async target(name: string, states: ReadonlySet<string>): Promise<{ address: string; bids: StoredBIDS }> {
    await this.service.mustGet(name);
    const bids = await this.service.dataSource(name);
    if (!bids) throw refused(`cannot find pod for backing image data source ${name}`);
    const address = this.deps.endpoints.dataSourceAddress(bids);
    if (!address) throw refused('backing image data source pod is not ready for uploading');
    if (bids.spec?.sourceType && bids.spec.sourceType !== 'upload') throw refused(`cannot upload to backing image ${name}: its source type is ${bids.spec.sourceType}, not upload`);
    if (!states.has(bids.status?.currentState ?? '')) throw refused(`upload server for backing image ${name} has not been initiated`);
    return { address, bids };
  }

  private client(address: string): DataSourceClient {
    return new DataSourceClient(address, { token: this.deps.internalToken });
  }

  private query(ctx: ApiContext): string {
    const u = ctx.request.url;
    const i = u.indexOf('?');
    return i < 0 ? '' : u.slice(i);
  }

  /**
   * The most body bytes this request may carry: its declared `size` (less `offset` for a part), refused with 413
   * when above the `backing-image-max-size` setting; a multipart body gets room for its framing. The data source
   * checks the size against its disk's free space itself (and answers 413 too).
   */
  private async bodyLimit(ctx: ApiContext): Promise<number> {
    const q = ctx.request.query as Record<string, string | undefined>;
    const size = /^\d+$/.test(q['size'] ?? '') ? Number(q['size']) : undefined;
    if (size === undefined) return Infinity; // the data source names the missing or bad parameter
    const max = await this.deps.settings.int(SettingName.BackingImageMaxSize);
    if (size > max) {
      throw new ApiError(413, `the upload's declared size of ${size} bytes is larger than the limit of ${max} bytes (the backing-image-max-size setting)`);
    }
    const offset = /^\d+$/.test(q['offset'] ?? '') ? Number(q['offset']) : 0;
    const multipart = (ctx.request.headers['content-type'] ?? '').startsWith('multipart/');
    const allowed = Math.max(0, size - offset) + (multipart ? MULTIPART_SLACK_BYTES : 0);
    const declared = Number(ctx.request.headers['content-length'] ?? NaN);
    if (declared > allowed) throw new ApiError(413, bodyTooLarge(size, offset));
    return allowed;
  }

  private async send(ctx: ApiContext, name: string, states: ReadonlySet<string>): Promise<DataSourceAnswer> {
    const limit = await this.bodyLimit(ctx);
    const { address } = await this.target(name, states);
    const q = ctx.request.query as Record<string, string | undefined>;
    let overflow: ApiError | undefined;
    const counter = new ByteCounter(limit, () => (overflow = new ApiError(413, bodyTooLarge(Number(q['size']), Number(q['offset'] ?? 0)))));
    const raw = ctx.request.raw;
    const observer = this.deps.observer;
    observer?.transferStarted('upload', name);
    const abort = new AbortController();
    const onClose = (): void => {
      if (!raw.complete) abort.abort(new Error('the client went away during the upload'));
    };
    raw.once('close', onClose);
    let res: DataSourceAnswer;
    try {
      res = await this.client(address).postFile(this.query(ctx), raw.pipe(counter), bodyHeaders(raw.headers), abort.signal);
    } catch (err) {
      observer?.transferFinished('upload', name, abort.signal.aborted ? 'cancelled' : 'failed', counter.bytes);
      if (overflow) throw overflow;
      throw new ApiError(500, `upload to the data source of backing image ${name} failed: ${(err as Error).message}`, { cause: err });
    } finally {
      raw.off('close', onClose);
    }
    const ok = res.statusCode >= 200 && res.statusCode < 300;
    observer?.transferFinished('upload', name, ok ? 'succeeded' : 'failed', counter.bytes);
    if (!ok) throw upstreamError(name, res);
    return res;
  }

  /** `?action=upload&size=N`: Longhorn's single-request upload (multipart part `chunk`, or an octet-stream body). */
  async upload(ctx: ApiContext, name: string): Promise<void> {
    await this.send(ctx, name, new Set(['pending']));
  }

  /** `?action=uploadPart&size=S&offset=N`: appends an octet-stream body at N. */
  async part(ctx: ApiContext, name: string): Promise<{ size: number; offset: number }> {
    return progressOf(await this.send(ctx, name, UPLOADING_STATES));
  }

  /** `?action=uploadOffset`: where a resumable upload continues. */
  async offset(ctx: ApiContext, name: string): Promise<{ size: number; offset: number }> {
    const { address } = await this.target(name, UPLOADING_STATES);
    try {
      return await this.client(address).uploadOffset(ctx.signal);
    } catch (err) {
      if (err instanceof DataSourceHttpError) throw upstreamError(name, { statusCode: err.statusCode, body: err.body });
      throw new ApiError(500, `cannot read the upload offset from the data source of backing image ${name}: ${(err as Error).message}`, { cause: err });
    }
  }
}

function bodyTooLarge(size: number, offset: number): string {
  return offset > 0
    ? `the upload body is larger than its declared size: more than the ${size - offset} bytes left of ${size} after offset ${offset}`
    : `the upload body is larger than its declared size of ${size} bytes`;
}

function progressOf(res: DataSourceAnswer): { size: number; offset: number } {
  try {
    return parseUploadProgress(res.body);
  } catch {
    throw new ApiError(500, `unexpected answer from the data source: ${res.body.slice(0, 200)}`);
  }
}

/** The data source's answer as a cattle error with the same status (Longhorn's reverse proxy passes it through). */
function upstreamError(name: string, res: DataSourceAnswer): ApiError {
  const text = res.body.slice(0, 64 << 10).trim() || `status ${res.statusCode}`;
  return new ApiError(res.statusCode >= 400 ? res.statusCode : 500, `data source of backing image ${name}: ${text}`);
}
