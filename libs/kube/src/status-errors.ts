import {
  AlreadyExistsError,
  ConflictError,
  GoneError,
  InvalidError,
  NotFoundError,
  StatusError,
  type ResourceKind,
  type StatusReason,
} from '@bis/datastore';

/** The parts of a Kubernetes `Status` body this code reads. */
interface StatusBody {
  kind?: string;
  message?: string;
  reason?: string;
  code?: number;
  details?: { name?: string; causes?: { field?: string; message?: string }[] };
}

function parseBody(body: unknown): StatusBody | undefined {
  if (typeof body === 'string') {
    try {
      return JSON.parse(body) as StatusBody;
    } catch {
      return { message: body };
    }
  }
  if (body && typeof body === 'object') return body as StatusBody;
  return undefined;
}

/**
 * Turns a Kubernetes `Status` (HTTP code + body) into the datastore's typed errors, so callers test
 * `isNotFound(err)` / `isConflict(err)` the same way for the embedded store and the API server.
 */
export function statusToError(kind: ResourceKind, name: string, code: number, body: unknown): StatusError {
  const st = parseBody(body) ?? {};
  const message = st.message ?? `HTTP ${code}`;
  const reason = st.reason as StatusReason | 'Expired' | undefined;
  if (code === 404) return new NotFoundError(kind, st.details?.name ?? name);
  if (code === 409 && reason === 'AlreadyExists') return new AlreadyExistsError(kind, st.details?.name ?? name);
  if (code === 409) {
    const marker = `"${name}": `;
    const i = message.indexOf(marker);
    return new ConflictError(kind, name, i >= 0 ? message.slice(i + marker.length) : message);
  }
  if (code === 410) {
    const m = /too old resource version: (\S+) \((\S+)\)/.exec(message);
    return new GoneError(m?.[1] ?? '?', m?.[2] ?? '?');
  }
  if (code === 422) {
    const causes = (st.details?.causes ?? []).map((c) => ({ field: c.field ?? '', message: c.message ?? '' }));
    return new InvalidError(kind, st.details?.name ?? name, causes.length ? causes : [{ field: '', message }]);
  }
  if (code === 400) return new StatusError('BadRequest', 400, message);
  return new StatusError('InternalError', code || 500, `${message}`);
}

/** Error thrown by @kubernetes/client-node 1.x (`ApiException`): `code` and `body`. */
export function isApiException(err: unknown): err is { code: number; body: unknown } {
  return !!err && typeof err === 'object' && typeof (err as { code?: unknown }).code === 'number' && 'body' in (err as object);
}

/**
 * client-node's `ApiException` reads "HTTP-Code: 403 Message: Unknown API Status Code! Body: ..." for most codes.
 * This gives an Error whose message is the API server's own (`<what>: pods is forbidden: User ... cannot create ...`),
 * keeping `code` and `body` so `isApiException` checks still hold. Anything else is returned unchanged.
 */
export function withApiMessage(what: string, err: unknown): unknown {
  if (!isApiException(err)) return err;
  const st = parseBody(err.body);
  const e = new Error(`${what}: ${st?.message ?? `HTTP ${err.code}`}`) as Error & { code: number; body: unknown };
  e.code = err.code;
  e.body = err.body;
  return e;
}
