import type { ApiErrorBody } from './types.js';

/** Why a request failed, in terms a caller (the CLI's exit codes, the UI's messages) can act on. */
export type ApiFailureKind = 'not-found' | 'rejected' | 'conflict' | 'server' | 'network' | 'aborted' | 'timeout';

/** A failed API request: the HTTP status and the server's message (cattle error body), or a transport failure. */
export class ApiClientError extends Error {
  readonly kind: ApiFailureKind;
  /** HTTP status, or 0 when no response was received. */
  readonly status: number;
  /** The request, e.g. `POST /v1/backingimages`. */
  readonly request: string;

  constructor(kind: ApiFailureKind, status: number, request: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ApiClientError';
    this.kind = kind;
    this.status = status;
    this.request = request;
  }
}

/** Whether the API refused the request for a missing or wrong bearer token (HTTP 401). */
export function isUnauthorized(err: unknown): boolean {
  return err instanceof ApiClientError && err.status === 401;
}

export function isNotFound(err: unknown): boolean {
  return err instanceof ApiClientError && err.kind === 'not-found';
}

function kindOfStatus(status: number): ApiFailureKind {
  if (status === 404) return 'not-found';
  if (status === 409) return 'conflict';
  if (status >= 400 && status < 500) return 'rejected';
  return 'server';
}

/** Builds the error for a non-2xx response, taking the message from a cattle error body when there is one. */
export async function errorFromResponse(res: Response, request: string): Promise<ApiClientError> {
  let message = `${request}: HTTP ${res.status}${res.statusText ? ` ${res.statusText}` : ''}`;
  const text = await res.text().catch(() => '');
  if (text) {
    try {
      const body = JSON.parse(text) as Partial<ApiErrorBody> & { error?: string };
      if (typeof body.message === 'string' && body.message) message = body.message;
      else if (typeof body.error === 'string' && body.error) message = body.error;
    } catch {
      message = `${message}: ${text.slice(0, 500)}`;
    }
  }
  return new ApiClientError(kindOfStatus(res.status), res.status, request, message);
}

/** Wraps a fetch rejection (network failure or abort). */
export function transportError(err: unknown, request: string, signal?: AbortSignal): ApiClientError {
  if (signal?.aborted || (err instanceof Error && err.name === 'AbortError')) {
    return new ApiClientError('aborted', 0, request, `${request}: cancelled`, { cause: err });
  }
  const cause = err instanceof Error && err.cause instanceof Error ? `: ${err.cause.message}` : '';
  const msg = err instanceof Error ? err.message : String(err);
  return new ApiClientError('network', 0, request, `${request}: ${msg}${cause}`, { cause: err });
}
