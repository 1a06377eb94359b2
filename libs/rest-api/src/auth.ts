import { AUTHORIZATION_HEADER, bearerMatches } from '@bis/internal-auth';

/** Where the REST token is required: the API (`/v1`, `/v1/…`, including proxies and websocket streams) and `/metrics`. */
function isProtected(pathname: string): boolean {
  return pathname === '/v1' || pathname.startsWith('/v1/') || pathname === '/metrics';
}

/** Paths answered without a token (health probes). */
export const REST_OPEN_PATHS: readonly string[] = ['/healthz', '/v1/healthz'];

/** The query parameter a websocket list stream (`/v1/ws/…`) may carry the token in (browsers cannot set its headers). */
export const WEBSOCKET_TOKEN_PARAM = 'access_token';

interface RequestLike {
  url: string;
  headers: Record<string, string | string[] | undefined>;
}
interface ReplyLike {
  code(statusCode: number): ReplyLike;
  header(key: string, value: string): ReplyLike;
  type(contentType: string): ReplyLike;
  send(payload?: unknown): unknown;
}

/**
 * A fastify `onRequest` hook for the REST API and the UI: with a token, every request to the API without
 * `authorization: Bearer <token>` (or, on a websocket stream, `?access_token=<token>`) is answered 401 with a
 * Longhorn-style error body. The web UI's static files stay public (they hold no data); so do the health paths.
 */
export function restAuthHook(token: string | undefined): (req: RequestLike, reply: ReplyLike) => Promise<void> {
  return async (req, reply) => {
    if (!token) return;
    const q = req.url.indexOf('?');
    const pathname = q < 0 ? req.url : req.url.slice(0, q);
    if (!isProtected(pathname) || REST_OPEN_PATHS.includes(pathname)) return;
    const header = req.headers[AUTHORIZATION_HEADER];
    let ok = header !== undefined && bearerMatches(header, token);
    if (!ok && header === undefined && pathname.startsWith('/v1/ws/') && q >= 0) {
      const t = new URLSearchParams(req.url.slice(q + 1)).get(WEBSOCKET_TOKEN_PARAM);
      ok = t !== null && bearerMatches(`Bearer ${t}`, token);
    }
    if (ok) return;
    const message = header === undefined ? 'authentication required: send authorization: Bearer <token>' : 'invalid bearer token';
    await reply
      .code(401)
      .header('www-authenticate', 'Bearer realm="backing-image-system"')
      .type('application/json; charset=utf-8')
      .send({ type: 'error', status: 401, code: 'Unauthorized', message });
  };
}

/** Whether `host` (of a listen address) is a loopback address, reachable only from this machine. */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  return h === 'localhost' || h === '::1' || /^127\.\d+\.\d+\.\d+$/.test(h) || h === '::ffff:127.0.0.1';
}
