/**
 * The ssync fast paths and their conservative twins, and the environment variables that force one. Each variable is
 * read here and nowhere else; an unknown value is an error that names the variable and the values it takes.
 *
 * - `BIS_SSYNC_RECEIVER_SERVER=own|node-http` (default `own`): the receiver's HTTP server. `own` is
 *   `ReceiverHttpServer` (receiver-http.ts), which reads request bodies straight into the receive slabs; `node-http`
 *   is `NodeHttpReceiverServer` (receiver-node-http.ts), Node's `http` module, which copies each body chunk into them.
 * - `BIS_SSYNC_SENDFILE=0|1` (default: when the block-mapping addon has sendfile): how the sender sends `writeData`
 *   bodies. `1` uses sendfile(2) from the page cache to the socket; `0` reads each chunk with a positioned read and
 *   writes it.
 */

/** Implementations of the ssync receiver's HTTP server. */
export type ReceiverServerKind = 'own' | 'node-http';
export const RECEIVER_SERVER_KINDS: readonly ReceiverServerKind[] = ['own', 'node-http'];
/** Forces the receiver's HTTP server: `own` or `node-http`. */
export const RECEIVER_SERVER_ENV = 'BIS_SSYNC_RECEIVER_SERVER';
/** Forces how the sender sends bodies: `1` sendfile(2), `0` positioned read + write. */
export const SENDFILE_ENV = 'BIS_SSYNC_SENDFILE';

/** The receiver's HTTP server: `explicit` when given, else `BIS_SSYNC_RECEIVER_SERVER`, else `own`. */
export function receiverServerKind(explicit?: ReceiverServerKind, env: NodeJS.ProcessEnv = process.env): ReceiverServerKind {
  const value = explicit ?? env[RECEIVER_SERVER_ENV];
  if (value === undefined || value === '') return 'own';
  if ((RECEIVER_SERVER_KINDS as readonly string[]).includes(value)) return value as ReceiverServerKind;
  const source = explicit !== undefined ? 'httpServer option' : RECEIVER_SERVER_ENV;
  throw new Error(`${source}=${JSON.stringify(value)} is not a receiver HTTP server: use ${RECEIVER_SERVER_KINDS.join(' or ')}`);
}

/**
 * Whether the sender uses sendfile(2): `BIS_SSYNC_SENDFILE=1` forces it (an error where the addon lacks it), `0` turns
 * it off, unset leaves it to `available`.
 */
export function sendfileSetting(available: boolean, env: NodeJS.ProcessEnv = process.env): boolean {
  const value = env[SENDFILE_ENV];
  if (value === undefined || value === '') return available;
  if (value === '0') return false;
  if (value === '1') {
    if (!available) {
      throw new Error(`${SENDFILE_ENV}=1 but the block-mapping addon is not built with sendfile support (node libs/block-mapping/native/build.mjs)`);
    }
    return true;
  }
  throw new Error(`${SENDFILE_ENV}=${JSON.stringify(value)} is not valid: use 1 (sendfile) or 0 (read + write)`);
}
