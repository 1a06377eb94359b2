import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { promises as fsp, constants as fsConstants } from 'node:fs';
import path from 'node:path';

/**
 * How the internal servers of the system (manager gRPC and sync HTTP, ssync receivers, data-source HTTP) check their
 * callers, and what internal clients send: `authorization: Bearer <token>` in HTTP headers and in gRPC metadata.
 *
 * - `token` unset: nothing is checked (a daemon started without `--internal-token-file`) and clients send nothing.
 * - `token` set: a caller without the exact token is refused (HTTP 401, gRPC `UNAUTHENTICATED`).
 * - `token` set and `allowUnauthenticated`: a caller that sends no `authorization` at all is admitted (Longhorn's Go
 *   components send none); a caller that sends a wrong token is still refused.
 */
export interface InternalAuth {
  token?: string;
  allowUnauthenticated?: boolean;
}

/** The header (and gRPC metadata key) carrying the token. */
export const AUTHORIZATION_HEADER = 'authorization';

/** Shortest token accepted from a file (a generated token has 43 characters). */
export const MIN_TOKEN_LENGTH = 16;

/** The `authorization` value for `token`. */
export function bearer(token: string): string {
  return `Bearer ${token}`;
}

/** The `authorization` header to add to an internal request (none when there is no token). */
export function authHeaders(token: string | undefined): Record<string, string> {
  return token ? { [AUTHORIZATION_HEADER]: bearer(token) } : {};
}

const digest = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

/** Whether `header` is `Bearer <token>`, compared in constant time (over SHA-256 digests, so lengths leak nothing). */
export function bearerMatches(header: string | readonly string[] | undefined, token: string): boolean {
  const value = Array.isArray(header) ? (header.length === 1 ? header[0] : undefined) : (header as string | undefined);
  if (typeof value !== 'string') return false;
  const m = /^Bearer[ ]+(\S+)\s*$/i.exec(value);
  const presented = m ? m[1]! : '';
  // always compare, so a malformed header takes as long as a wrong token
  const equal = timingSafeEqual(digest(presented), digest(token));
  return m !== null && equal;
}

export type AuthDecision = { ok: true } | { ok: false; reason: string };

/** The decision of an internal server about a caller that sent `header` (`undefined` when it sent none). */
export function checkInternalCaller(auth: InternalAuth | undefined, header: string | readonly string[] | undefined): AuthDecision {
  if (!auth?.token) return { ok: true };
  const absent = header === undefined || (Array.isArray(header) && header.length === 0);
  if (absent) {
    return auth.allowUnauthenticated ? { ok: true } : { ok: false, reason: 'missing bearer token (authorization header)' };
  }
  return bearerMatches(header, auth.token) ? { ok: true } : { ok: false, reason: 'invalid bearer token' };
}

/** Reads a token file: its content without surrounding white space; refuses an empty or too short token. */
export async function readTokenFile(file: string): Promise<string> {
  const token = (await fsp.readFile(file, 'utf8')).trim();
  if (token.length < MIN_TOKEN_LENGTH) {
    throw new Error(`token file ${file}: the token must have at least ${MIN_TOKEN_LENGTH} characters`);
  }
  if (/\s/.test(token)) throw new Error(`token file ${file}: the token must not contain white space`);
  return token;
}

/** A new random token (32 bytes, base64url). */
export function generateToken(): string {
  return randomBytes(32).toString('base64url');
}

/**
 * The token in `file`, created (mode 0600, exclusively) with a new random token when it does not exist.
 * An existing file readable by group or others is narrowed to 0600.
 */
export async function ensureTokenFile(file: string): Promise<string> {
  await fsp.mkdir(path.dirname(file), { recursive: true });
  try {
    const fh = await fsp.open(file, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL, 0o600);
    try {
      await fh.writeFile(`${generateToken()}\n`);
      await fh.sync();
    } finally {
      await fh.close();
    }
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    const st = await fsp.stat(file);
    if ((st.mode & 0o077) !== 0) await fsp.chmod(file, 0o600);
  }
  return readTokenFile(file);
}

/** The parts of an HTTP framework's request and reply (fastify's) the hook uses. */
export interface AuthRequestLike {
  url: string;
  headers: Record<string, string | string[] | undefined>;
}
export interface AuthReplyLike {
  code(statusCode: number): AuthReplyLike;
  header(key: string, value: string): AuthReplyLike;
  send(payload?: unknown): unknown;
}

export interface HttpAuthHookOptions {
  /** Paths (without query) answered without a token, e.g. health probes. */
  openPaths?: readonly string[];
  /** Builds the 401 body (default `{ message }`). */
  body?: (reason: string) => unknown;
  /** Called for each refusal (a log line). */
  onRefused?: (req: AuthRequestLike, reason: string) => void;
}

/**
 * A fastify `onRequest` hook refusing callers without the token with 401 and `www-authenticate: Bearer`
 * (does nothing when `auth` has no token).
 */
export function httpAuthHook(
  auth: InternalAuth | undefined,
  opts: HttpAuthHookOptions = {},
): (req: AuthRequestLike, reply: AuthReplyLike) => Promise<void> {
  const open = new Set(opts.openPaths ?? []);
  return async (req, reply) => {
    if (!auth?.token) return;
    const q = req.url.indexOf('?');
    if (open.has(q < 0 ? req.url : req.url.slice(0, q))) return;
    const d = checkInternalCaller(auth, req.headers[AUTHORIZATION_HEADER]);
    if (d.ok) return;
    opts.onRefused?.(req, d.reason);
    await reply
      .code(401)
      .header('www-authenticate', 'Bearer')
      .send(opts.body ? opts.body(d.reason) : { message: `unauthorized: ${d.reason}` });
  };
}
