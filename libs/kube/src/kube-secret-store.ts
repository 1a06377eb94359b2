import { CoreV1Api, type KubeConfig } from '@kubernetes/client-node';
import { decodeSecretData, SecretNotFoundError, type SecretStore } from '@bis/controllers';
import { ApiAccess } from './api-access.js';
import { isApiException } from './status-errors.js';

export interface KubeSecretStoreOptions {
  kubeConfig: KubeConfig;
  /** The system's namespace: the only one secrets are read from. */
  namespace: string;
  access?: ApiAccess;
}

/**
 * Credential secrets from the Kubernetes API (`get secrets` in the system's namespace, `CoreV1Api.readNamespacedSecret`).
 * Values are decoded from base64; errors name the secret, never a value.
 */
export class KubeSecretStore implements SecretStore {
  private readonly core: CoreV1Api;
  private readonly access: ApiAccess;

  constructor(private readonly opts: KubeSecretStoreOptions) {
    this.core = opts.kubeConfig.makeApiClient(CoreV1Api);
    this.access = opts.access ?? new ApiAccess();
  }

  async get(name: string): Promise<Record<string, string>> {
    this.access.require('', 'secrets', 'get');
    try {
      const s = await this.core.readNamespacedSecret({ name, namespace: this.opts.namespace });
      return decodeSecretData(s.data);
    } catch (err) {
      if (isApiException(err) && err.code === 404) throw new SecretNotFoundError(name, this.opts.namespace);
      const code = isApiException(err) ? ` (HTTP ${err.code})` : '';
      throw new Error(`failed to get secret ${name} in namespace ${this.opts.namespace}${code}`);
    }
  }
}
