import { CoreV1Api, type KubeConfig, type V1Secret } from '@kubernetes/client-node';
import { MIN_TOKEN_LENGTH, generateToken } from '@bis/internal-auth';
import { ApiAccess } from './api-access.js';
import { isApiException } from './status-errors.js';

/** The Secret holding the system's internal token in its namespace (key `token`). */
export const INTERNAL_TOKEN_SECRET = 'backing-image-system-internal-token';
/** The key of the token in that Secret (and the file name in the pods' secret volume). */
export const INTERNAL_TOKEN_KEY = 'token';

export interface InternalTokenSecretOptions {
  kubeConfig: KubeConfig;
  namespace: string;
  /** Secret name (default `INTERNAL_TOKEN_SECRET`). */
  name?: string;
  access?: ApiAccess;
}

export interface InternalTokenSecret {
  token: string;
  /** Whether this call created the Secret (false: it existed, or another instance created it first). */
  created: boolean;
}

function tokenOf(secret: V1Secret, where: string): string {
  const raw = secret.data?.[INTERNAL_TOKEN_KEY];
  if (raw === undefined) throw new Error(`${where} has no key "${INTERNAL_TOKEN_KEY}"`);
  const token = Buffer.from(raw, 'base64').toString('utf8').trim();
  if (token.length < MIN_TOKEN_LENGTH) throw new Error(`${where}: the token must have at least ${MIN_TOKEN_LENGTH} characters`);
  if (/\s/.test(token)) throw new Error(`${where}: the token must not contain white space`);
  return token;
}

/**
 * The internal token of the system, from the Secret `name` in the system's namespace; the Secret is created with a
 * new random token (32 bytes, base64url) when it does not exist. Every controller-manager instance (one per node)
 * calls this at start: when several create it at once, the API server accepts one create and the others read the
 * winner's token (409 AlreadyExists → get). Errors name the Secret, never the token.
 */
export async function ensureInternalTokenSecret(opts: InternalTokenSecretOptions): Promise<InternalTokenSecret> {
  const core = opts.kubeConfig.makeApiClient(CoreV1Api);
  const access = opts.access ?? new ApiAccess();
  const name = opts.name ?? INTERNAL_TOKEN_SECRET;
  const where = `secret ${name} in namespace ${opts.namespace}`;
  const read = async (): Promise<V1Secret | undefined> => {
    access.require('', 'secrets', 'get');
    try {
      return await core.readNamespacedSecret({ name, namespace: opts.namespace });
    } catch (err) {
      if (isApiException(err) && err.code === 404) return undefined;
      throw new Error(`failed to get ${where}${isApiException(err) ? ` (HTTP ${err.code})` : `: ${(err as Error).message}`}`);
    }
  };
  const existing = await read();
  if (existing) return { token: tokenOf(existing, where), created: false };
  const token = generateToken();
  access.require('', 'secrets', 'create');
  try {
    await core.createNamespacedSecret({
      namespace: opts.namespace,
      body: {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name, namespace: opts.namespace, labels: { 'app.kubernetes.io/name': 'backing-image-system', 'app.kubernetes.io/component': 'internal-auth' } },
        type: 'Opaque',
        data: { [INTERNAL_TOKEN_KEY]: Buffer.from(token, 'utf8').toString('base64') },
      },
    });
    return { token, created: true };
  } catch (err) {
    if (!(isApiException(err) && err.code === 409)) {
      throw new Error(`failed to create ${where}${isApiException(err) ? ` (HTTP ${err.code})` : `: ${(err as Error).message}`}`);
    }
  }
  // Another instance created it between our get and our create: use its token.
  const winner = await read();
  if (!winner) throw new Error(`${where} was reported as existing but cannot be read`);
  return { token: tokenOf(winner, where), created: false };
}
