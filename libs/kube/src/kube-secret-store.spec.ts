import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { SecretKind, backupTargetCredential, encodeSecretData } from '@bis/controllers';
import { ApiAccess, API_RESOURCE_USES, rbacRules } from './api-access.js';
import { kubeConfigFor } from './kube-datastore.js';
import { KubeSecretStore } from './kube-secret-store.js';
import { KubeApiDouble } from './test-support/kube-api-double.js';

const NS = 'longhorn-system';

describe('KubeSecretStore (against the Kubernetes API double)', () => {
  let api: KubeApiDouble;
  beforeEach(async () => {
    api = await KubeApiDouble.start({ kinds: [SecretKind] });
  });
  afterEach(async () => {
    await api.stop();
  });

  it('reads and decodes a Secret of the system namespace with one get, and feeds a backup target credential', async () => {
    const data = { AWS_ACCESS_KEY_ID: 'AKIDEXAMPLE', AWS_SECRET_ACCESS_KEY: 'wJalrXUtnFEMI/K7MDENG', AWS_ENDPOINTS: 'http://127.0.0.1:9000', OTHER: 'x' };
    await api.store.create(SecretKind, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 's3-secret', namespace: NS }, type: 'Opaque', data: encodeSecretData(data) });
    await api.store.create(SecretKind, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 's3-secret', namespace: 'elsewhere' }, data: encodeSecretData({ AWS_ACCESS_KEY_ID: 'wrong' }) });
    const secrets = new KubeSecretStore({ kubeConfig: kubeConfigFor(api.url, api.token), namespace: NS });
    expect(await secrets.get('s3-secret')).toEqual(data);
    const cred = await backupTargetCredential(secrets, { spec: { backupTargetURL: 's3://b@us-east-1/', credentialSecret: 's3-secret', pollInterval: '5m0s' } });
    expect(cred).toEqual({ AWS_ACCESS_KEY_ID: 'AKIDEXAMPLE', AWS_SECRET_ACCESS_KEY: 'wJalrXUtnFEMI/K7MDENG', AWS_ENDPOINTS: 'http://127.0.0.1:9000' });
    expect(api.calls.filter((c) => c.resource === 'secrets')).toEqual([
      { verb: 'get', group: '', resource: 'secrets', namespace: NS, name: 's3-secret' },
      { verb: 'get', group: '', resource: 'secrets', namespace: NS, name: 's3-secret' },
    ]);
  });

  it('a missing secret is a clear error naming it', async () => {
    const secrets = new KubeSecretStore({ kubeConfig: kubeConfigFor(api.url, api.token), namespace: NS });
    await expect(secrets.get('nope')).rejects.toThrow('secret nope not found in namespace longhorn-system');
  });

  it('the RBAC table grants get on secrets in the namespace (plus create for the internal token and the data sources\' credentials), nothing cluster-wide', () => {
    expect(API_RESOURCE_USES.filter((u) => u.resource === 'secrets')).toEqual([
      { group: '', version: 'v1', resource: 'secrets', verbs: ['get'], usedBy: 'KubeSecretStore' },
      { group: '', version: 'v1', resource: 'secrets', verbs: ['create'], usedBy: 'ensureInternalTokenSecret' },
      { group: '', version: 'v1', resource: 'secrets', verbs: ['create', 'update', 'delete'], usedBy: 'KubePodRuntime' },
    ]);
    const rules = rbacRules().filter((r) => r.resources.includes('secrets'));
    expect(rules.map((r) => ({ apiGroups: r.apiGroups, verbs: r.verbs }))).toEqual([{ apiGroups: [''], verbs: ['get', 'create', 'update', 'delete'] }]);
    expect(rbacRules(undefined, 'cluster').some((r) => r.resources.includes('secrets'))).toBe(false);
    expect(new ApiAccess().allows('', 'secrets', 'list')).toBe(false);
  });
});
