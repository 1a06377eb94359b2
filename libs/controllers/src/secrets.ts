import { defineKind, isNotFound, type Datastore, type ObjectMeta } from '@bis/datastore';
import type { BackupTarget } from './kinds.js';

/**
 * A Kubernetes-style Secret (core `v1`). `data` values are base64, as in Kubernetes. Standalone keeps these objects
 * in the embedded store; Kubernetes mode reads the real Secret through the API server.
 */
export interface Secret {
  apiVersion: 'v1';
  kind: 'Secret';
  metadata: ObjectMeta;
  type?: string;
  data?: Record<string, string>;
}

export const SecretKind = defineKind<Secret>({ apiVersion: 'v1', kind: 'Secret', plural: 'secrets', namespaced: true, statusSubresource: false });

/** Keys of a backup target's credential secret that the backup engine reads (Longhorn's `SetupCredential`). */
export const BACKUP_TARGET_CREDENTIAL_KEYS = [
  'AWS_ACCESS_KEY_ID',
  'AWS_SECRET_ACCESS_KEY',
  'AWS_SESSION_TOKEN',
  'AWS_ENDPOINTS',
  'AWS_CERT',
  'VIRTUAL_HOSTED_STYLE',
  'HTTP_PROXY',
  'HTTPS_PROXY',
  'NO_PROXY',
  'AWS_SIGN_ACCEPT_ENCODING',
] as const;

/** Thrown when a named secret does not exist. The message names the secret, never a value. */
export class SecretNotFoundError extends Error {
  constructor(name: string, namespace: string) {
    super(`secret ${name} not found in namespace ${namespace}`);
    this.name = 'SecretNotFoundError';
  }
}

/** Reads secrets (decoded values) by name from the system's namespace. Implemented by each datastore mode. */
export interface SecretStore {
  /** The decoded key/value pairs of a secret; throws {@link SecretNotFoundError} when it does not exist. */
  get(name: string): Promise<Record<string, string>>;
}

/** Decodes a Secret's base64 `data`. */
export function decodeSecretData(data: Record<string, string> | undefined): Record<string, string> {
  return Object.fromEntries(Object.entries(data ?? {}).map(([k, v]) => [k, Buffer.from(v, 'base64').toString('utf8')]));
}

/** Encodes values as a Secret's base64 `data`. */
export function encodeSecretData(values: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(values).map(([k, v]) => [k, Buffer.from(v, 'utf8').toString('base64')]));
}

/** Secrets kept as `Secret` objects in a datastore (the embedded store of standalone). */
export class DatastoreSecretStore implements SecretStore {
  constructor(
    private readonly store: Datastore,
    private readonly namespace: string,
  ) {}

  async get(name: string): Promise<Record<string, string>> {
    try {
      return decodeSecretData((await this.store.get(SecretKind, name, this.namespace)).data);
    } catch (err) {
      if (isNotFound(err)) throw new SecretNotFoundError(name, this.namespace);
      throw err;
    }
  }
}

/**
 * The credential of a backup target: the values of its `credentialSecret` (empty when it names none). Longhorn's keys
 * are passed on; other keys of the secret are ignored.
 */
export async function backupTargetCredential(secrets: SecretStore, target: Pick<BackupTarget, 'spec'> | undefined): Promise<Record<string, string>> {
  const name = target?.spec?.credentialSecret ?? '';
  if (!name) return {};
  const all = await secrets.get(name);
  const out: Record<string, string> = {};
  for (const k of BACKUP_TARGET_CREDENTIAL_KEYS) if (all[k] !== undefined) out[k] = all[k];
  return out;
}

/**
 * Replaces every occurrence of a secret value (of 4 or more characters) in a text with `***`: errors from remote
 * services may echo what they were sent, and statuses, events and logs must never carry a credential.
 */
export function redactSecrets(text: string, credential: Record<string, string>): string {
  let out = text;
  for (const v of Object.values(credential)) {
    if (v.length < 4) continue;
    out = out.split(v).join('***');
  }
  return out;
}
