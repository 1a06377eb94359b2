import { STATUS_CODES } from 'node:http';
import { isNotFound } from '@bis/datastore';

/** An error with an explicit HTTP status (404 for missing things; everything else answers 500 like Longhorn). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'ApiError';
  }
}

export const notFound = (message: string): ApiError => new ApiError(404, message);

/** The cattle error body: `{type:"error", status, code:<status text>, message, detail:"", links, actions}`. */
export interface ErrorBody {
  type: 'error';
  status: number;
  code: string;
  message: string;
  detail: string;
  links: Record<string, string>;
  actions: Record<string, string>;
}

/**
 * Longhorn's rule: 404 when the error chain holds a NotFound, otherwise 500. A request the HTTP framework itself
 * refuses (fastify's errors with a 4xx `statusCode`: body too large, malformed headers, …) keeps its 4xx: it is the
 * client's input, not a failure of the server.
 */
export function statusOf(err: unknown): number {
  if (err instanceof ApiError) return err.status;
  if (isNotFound(err)) return 404;
  const code = (err as { statusCode?: unknown } | null)?.statusCode;
  if (typeof code === 'number' && code >= 400 && code < 500 && typeof (err as { code?: unknown }).code === 'string' && (err as { code: string }).code.startsWith('FST_')) return code;
  return 500;
}

/** The message chain (`outer: cause: cause`), like Go's wrapped errors. */
export function messageChain(err: unknown): string {
  const parts: string[] = [];
  for (let e: unknown = err, i = 0; e && i < 10; e = (e as { cause?: unknown }).cause, i++) {
    const m = e instanceof Error ? e.message : String(e);
    if (!parts.length || !parts[parts.length - 1].endsWith(m)) parts.push(m);
  }
  return parts.join(': ');
}

export function errorBody(err: unknown, selfUrl: string): ErrorBody {
  const status = statusOf(err);
  return { type: 'error', status, code: STATUS_CODES[status] ?? 'Error', message: messageChain(err), detail: '', links: { self: selfUrl }, actions: {} };
}
